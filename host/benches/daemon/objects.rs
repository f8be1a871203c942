//! The objects the parts make: the Node, the agent's PodTemplate, the
//! 3-plugin configuration, and the code cache warmed once for every part.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::PodTemplate;
use serde_json::json;

use crate::common;

pub fn node_json(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/arch": podstamp::node::host_architecture(),
        "topology.kubernetes.io/zone": "zone-a"}}})
}

/// A small agent pod. Each plugin of the chain has work to do: arch-image
/// sets the image, node-env adds env vars, substitute fills the placeholders.
/// MARKER is what the latency parts change.
pub fn template(name: &str, marker: &str, selected: bool) -> PodTemplate {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "labels": {"podstamp.io/enabled": selected.to_string()}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "agent", "image": "set-by-arch-image",
                "command": ["agent", "--node=${node.name}", "--zone=${node.label[topology.kubernetes.io/zone]}"],
                "env": [{"name": "MARKER", "value": marker}]
            }]}
        }
    }))
    .unwrap()
}

/// The example chain (arch-image → node-env → substitute, as in
/// examples/podstamp.yaml) with settings for the bench's template.
pub fn write_bench_config(root: &Path) -> PathBuf {
    let plugin = |name: &str| common::plugin(name).display().to_string();
    let arch = podstamp::node::host_architecture();
    let text = format!(
        "plugins:\n\
         \x20 arch-image:\n    path: {}\n    settings: {{images: {{agent: {{{arch}: example.invalid/agent:1-{arch}, arm64: example.invalid/agent:1-arm64}}}}}}\n    scope: [metadata, spec]\n\
         \x20 node-env:\n    path: {}\n    settings: {{containers: [agent], nodeIP: \"\", labels: {{NODE_ZONE: topology.kubernetes.io/zone}}}}\n\
         \x20 substitute:\n    path: {}\n    scope: [metadata, spec]\n\
         chain: [arch-image, node-env, substitute]\n\
         limits: {{timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi}}\n",
        plugin("arch-image"),
        plugin("node-env"),
        plugin("substitute"),
    );
    let path = root.join("podstamp.yaml");
    fs::write(&path, text).unwrap();
    path
}

/// Compiles the chain's plugins into `cache` with one offline render, so
/// that every part that says "warm code cache" has one, whichever parts run.
pub fn warm_cache(binary: &Path, config: &Path, cache: &Path) {
    let template = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: warm}\n\
                    template:\n  spec:\n    containers: [{name: agent, image: x}]\n";
    let mut render = Command::new(binary)
        .args(["render", "-", "--node-name", "warm", "--node-label"])
        .arg("topology.kubernetes.io/zone=a")
        .arg("--config")
        .arg(config)
        .arg("--cache-dir")
        .arg(cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run podstamp render");
    use std::io::Write as _;
    render
        .stdin
        .take()
        .unwrap()
        .write_all(template.as_bytes())
        .unwrap();
    let status = render.wait().unwrap();
    assert!(status.success(), "warming the code cache failed: {status}");
}

/// A directory only its owner may write, as the code cache must be.
pub fn private_dir(path: &Path) {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .unwrap();
}
