//! Plugins written in JavaScript (plugins/js/), built from source by
//! plugins/js/build.sh when the tests run (up to date ones are not rebuilt),
//! through the binary: `node-env-js` gives the same bytes as the Rust
//! `node-env` for each of its golden cases, through `podstamp render` and
//! through the daemon against the real API server; its errors are the Rust
//! plugin's; and a plugin that reads the clock and the random sources
//! renders the same bytes on every run.
//!
//! Renders use the daemon tests' code cache (target/test-plugin-cache):
//! compiling a 12 MB componentize-js component takes a debug build tens of
//! seconds, once.

mod common;
#[path = "daemon/support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::{build_refused, declares_shown, plugin, podstamp, repo, stderr, stdout};
use serde_json::json;
use support::*;

const CHECKPOINTER: &str = "examples/pod-checkpointer.yaml";
const NODE: &str = "examples/node.yaml";
/// Loading and compiling a JavaScript component in a debug build is slow.
const CONVERGE: Duration = Duration::from_secs(240);

/// Runs `bash plugins/js/build.sh ARGS`, panicking with its output on failure.
fn build_js(args: &[&Path]) {
    let out = Command::new("bash")
        .arg(repo().join("plugins/js/build.sh"))
        .args(args)
        .output()
        .expect("run plugins/js/build.sh");
    assert!(
        out.status.success(),
        "plugins/js/build.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// target/plugins/node-env-js.wasm, built from plugins/js once per run.
fn node_env_js() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| build_js(&[]));
    plugin("node-env-js")
}

/// tests/fixtures/js-clock built into target/plugins/test-js-clock.wasm.
fn js_clock() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = repo().join("target/plugins/test-js-clock.wasm");
            build_js(&[&repo().join("tests/fixtures/js-clock"), &out]);
            out
        })
        .clone()
}

fn cache_dir() -> String {
    repo()
        .join("target/test-plugin-cache")
        .display()
        .to_string()
}

/// `podstamp render` of the checkpointer with `node_args` and these
/// `--plugin` specs, as it ran.
fn render_output(node_args: &[&str], plugins: &[String]) -> Output {
    let cache = cache_dir();
    // The checkpointer is a control-plane pod (host network, host paths):
    // granted Pod Security level privileged, deliberately.
    let mut args = vec![
        "render",
        CHECKPOINTER,
        "--cache-dir",
        &cache,
        "--pod-security",
        "privileged",
    ];
    args.extend_from_slice(node_args);
    for p in plugins {
        args.extend(["--plugin", p]);
    }
    podstamp(&args)
}

/// `podstamp render` of the checkpointer with `node_args` and these
/// `--plugin` specs; the output, or the stderr when it fails.
fn render(node_args: &[&str], plugins: &[String]) -> Result<String, String> {
    let out = render_output(node_args, plugins);
    if out.status.success() {
        assert_eq!(
            stderr(&out),
            "podstamp: checked against Pod Security level privileged:latest (from --pod-security)\n",
            "a successful render prints nothing on stderr but the level it checked against"
        );
        Ok(stdout(&out))
    } else {
        // 1: the render failed; 2: settings refused when the plugin loaded.
        let code = out.status.code().unwrap_or(-1);
        assert!(matches!(code, 1 | 2), "{}", stderr(&out));
        Err(format!("exit {code}: {}", stderr(&out)))
    }
}

fn spec(path: &Path, settings: Option<&str>) -> String {
    match settings {
        Some(file) => format!("{},settings={file}", path.display()),
        None => path.display().to_string(),
    }
}

/// tests/cases/js: `node-env-js` alone and in the example chain, each
/// case's expected manifest a link to the Rust `node-env`'s
/// (tests/cases/rust), so passing is being byte-identical to it.
#[test]
fn node_env_js_renders_the_golden_manifests_of_node_env() {
    node_env_js();
    for name in ["arch-image", "substitute"] {
        plugin(name);
    }
    assert_eq!(
        common::pass_cases("js", &["--cache-dir", &cache_dir()]),
        "ok      example-chain\n\
         ok      node-env\n\
         2 case(s) in tests/cases/js: 2 passed, 0 failed\n"
    );
}

/// The error line of the Rust plugin, as the JavaScript one names itself.
fn as_js(rust: String) -> String {
    rust.replace(
        "`node-env` (node-env 0.1.0)",
        "`node-env-js` (node-env-js 0.1.0)",
    )
    .replace(
        "the plugin node-env 0.1.0's validate-settings",
        "the plugin node-env-js 0.1.0's validate-settings",
    )
    // The `--plugin` spec a load-time refusal repeats.
    .replace("/node-env.wasm,", "/node-env-js.wasm,")
}

#[test]
fn node_env_js_fails_as_node_env_does() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // Golden: the node lacks the label the settings want.
        (
            vec![
                "--node-name",
                "bare",
                "--node-address",
                "InternalIP=10.0.0.9",
            ],
            "containers: [pod-checkpointer]\nlabels: {NODE_ZONE: topology.kubernetes.io/zone}\n",
        ),
        // No address for NODE_IP.
        (vec!["--node-name", "bare"], "{}"),
        // A container the pod does not have.
        (vec!["--node", NODE], "containers: [web]\n"),
        // Settings of the wrong type or unknown: the SDK's schema words them
        // as serde does, refused when the plugin loads (validate-settings).
        (vec!["--node", NODE], "labels: {A: 1}\n"),
        (vec!["--node", NODE], "nodeIp: X\n"),
        (vec!["--node", NODE], "initContainers: yes\n"),
        (vec!["--node", NODE], "containers: pod-checkpointer\n"),
        (vec!["--node", NODE], "containers: [1]\n"),
        (vec!["--node", NODE], "labels: {A: null}\n"),
        (vec!["--node", NODE], "nodeName: 1.5\n"),
    ];
    for (i, (node_args, settings)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("s{i}.yaml"));
        std::fs::write(&file, settings).unwrap();
        let file = file.to_str().unwrap();
        let rust = render(node_args, &[spec(&plugin("node-env"), Some(file))]).unwrap_err();
        let js = render(node_args, &[spec(&node_env_js(), Some(file))]).unwrap_err();
        assert_eq!(js, as_js(rust), "settings {settings:?}");
    }
}

#[test]
fn a_js_plugin_renders_the_same_bytes_on_every_run() {
    let clock = spec(&js_clock(), None);
    let first = render(&["--node", NODE], std::slice::from_ref(&clock)).unwrap();
    assert!(
        first.contains("example.com/now: \"1970-01-01T00:00:00.000Z\""),
        "the wall clock is the epoch:\n{first}"
    );
    // Once more from the cache, once more compiled anew: the same bytes.
    assert_eq!(
        render(&["--node", NODE], std::slice::from_ref(&clock)).unwrap(),
        first
    );
    let out = podstamp(&[
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--no-cache",
        "--pod-security",
        "privileged",
        "--plugin",
        &clock,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), first);
}

/// The daemon's configuration: node-env's settings of the fixture, with
/// the plugin at `path`.
fn daemon_config(dir: &Path, path: &Path) -> PathBuf {
    let config = dir.join("podstamp.yaml");
    let text = format!(
        "plugins:\n  node-env:\n    path: {}\n    settings: {{containers: [main], nodeIP: \"\", labels: {{ZONE: zone}}, annotations: {{RACK: rack}}}}\nchain: [node-env]\nlimits: {{timeout: 2s}}\n",
        path.display()
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn the_daemon_writes_with_node_env_js_what_it_writes_with_node_env() {
    let server = shared_server();
    let ns = unique("js");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(kube.client.clone());
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name, "labels": {"zone": "zone-a"}, "annotations": {"rack": "r7"}},
    });
    kube.rt
        .block_on(nodes.create(&Default::default(), &serde_json::from_value(node).unwrap()))
        .unwrap();
    let template = json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "web", "labels": {"podstamp.io/enabled": "true"}},
        "template": {"spec": {
            "initContainers": [{"name": "setup", "image": "busybox:1"}],
            "containers": [
                {"name": "main", "image": "nginx:1.27", "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
                {"name": "sidecar", "image": "busybox:1"},
            ],
        }},
    });
    kube.rt
        .block_on(kube.templates().create(
            &Default::default(),
            &serde_json::from_value(template).unwrap(),
        ))
        .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig("admin");
    let run = |name: &str, plugin_path: &Path| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let config = daemon_config(&dir, plugin_path);
        let manifests = dir.join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let args = [
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &ns,
            "--node-name",
            &node_name,
            "--manifest-dir",
            manifests.to_str().unwrap(),
        ];
        (
            Daemon::start(&args, dir.join("podstamp.log")),
            manifests.join("web.yaml"),
        )
    };
    let (js_daemon, js_web) = run("js", &node_env_js());
    let (rust_daemon, rust_web) = run("rust", &plugin("node-env"));
    for (daemon, web) in [(&js_daemon, &js_web), (&rust_daemon, &rust_web)] {
        let what = format!("{} to be written", web.display());
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(&what, CONVERGE, || {
                daemon.assert_running();
                std::fs::read_to_string(web).ok()
            })
        }));
        if found.is_err() {
            panic!(
                "timed out waiting for {what}; podstamp's log:\n{}",
                daemon.logs()
            );
        }
    }
    let js = std::fs::read_to_string(&js_web).unwrap();
    assert_eq!(js, std::fs::read_to_string(&rust_web).unwrap());
    for expected in [
        "name: ZONE",
        "value: zone-a",
        "name: RACK",
        "value: r7",
        &format!("value: {node_name}"),
    ] {
        assert!(js.contains(expected), "missing {expected:?} in\n{js}");
    }
    assert!(
        !js.contains("valueFrom"),
        "NODE_NAME was replaced in place:\n{js}"
    );
    kubelet_accepts(&[&js_web], &node_name);
}

/// The `declares:` line `render --explain` shows for this plugin alone.
fn declares_line(plugin: &Path) -> String {
    let out = render_output(&["--node", NODE, "--explain"], &[spec(plugin, None)]);
    let err = stderr(&out);
    assert!(out.status.success(), "render --explain failed:\n{err}");
    declares_shown(&err)
}

/// A JavaScript plugin declares its scope in its package.json
/// (`podstamp.scope`), which plugins/js/build.sh writes into the
/// component: the host reads it as it reads the Rust SDK's `scope!`, and
/// the example declares exactly what its Rust twin declares.
#[test]
fn node_env_js_declares_the_scope_node_env_declares() {
    let line = declares_line(&node_env_js());
    assert_eq!(
        line,
        "  declares: spec.containers[*].env, spec.initContainers[*].env; granted: everything"
    );
    assert_eq!(line, declares_line(&plugin("node-env")));
}

/// A `podstamp.scope` that is not a list of grants is refused by the
/// build, before componentize-js, in one line naming the file, the field
/// and the fix; nothing is written.
#[test]
fn a_js_plugin_whose_declared_scope_is_not_a_list_of_grants_is_refused_by_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("package.json");
    let out = dir.path().join("bad.wasm");
    std::fs::write(
        dir.path().join("plugin.js"),
        "export const transformer = {};\n",
    )
    .unwrap();
    for (scope, says) in [
        (
            "\"spec\"",
            format!(
                "build.mjs: error: {}: podstamp.scope must be a list of grants, e.g. \"podstamp\": {{\"scope\": [\"spec.containers[*].env\"]}}",
                manifest.display()
            ),
        ),
        (
            "[\"spec\", \" metadata\"]",
            format!(
                "scope-section.py: error: {}: podstamp.scope: grant ' metadata' is not a field path: write it as in a catalog entry's scope:",
                manifest.display()
            ),
        ),
    ] {
        std::fs::write(
            &manifest,
            format!("{{\"name\": \"bad\", \"version\": \"0.1.0\", \"podstamp\": {{\"scope\": {scope}}}}}\n"),
        )
        .unwrap();
        build_refused(
            "plugins/js/build.sh",
            dir.path(),
            &out,
            &says,
            &format!("scope {scope}"),
        );
    }
}
