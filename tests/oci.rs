//! Plugins as OCI artifacts, end to end, against a real registry (Debian's
//! `docker-registry`, TLS from the harness CA, basic auth; see
//! tests/oci/registry.rs): `podstamp plugin push|pull`, and the daemon
//! running a catalog whose plugins are `oci:` references.
//!
//! Needs `bash tests/harness/registry-deps.sh`, `bash tests/harness/build.sh`
//! and `bash plugins/build.sh` first.

mod common;
#[path = "oci/hostile.rs"]
mod hostile;
#[path = "oci/registry.rs"]
mod registry;
#[path = "daemon/support.rs"]
#[allow(unused_imports)]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{podstamp, stderr, stdout};
use registry::{PASSWORD, TestRegistry};
use support::*;

const CONVERGE: Duration = Duration::from_secs(30);

/// A registry under `dir`, with the harness CA of the shared API server.
fn start_registry(dir: &Path) -> TestRegistry {
    TestRegistry::start(&dir.join("registry"), &shared_server().dir)
}

/// A test directory, a registry in it, and a docker config file with the
/// registry's password.
fn scene() -> (tempfile::TempDir, TestRegistry, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let registry = start_registry(tmp.path());
    let config = registry.docker_config(&tmp.path().join("auth.json"), PASSWORD);
    (tmp, registry, config)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `podstamp plugin push FILE REF` with the registry's CA and `config`.
fn push(registry: &TestRegistry, config: &Path, file: &Path, target: &str) -> Output {
    podstamp(&[
        "plugin",
        "push",
        file.to_str().unwrap(),
        &format!("{}/{target}", registry.host),
        "--registry-config",
        config.to_str().unwrap(),
        "--registry-ca",
        registry.ca.to_str().unwrap(),
    ])
}

fn pull(registry: &TestRegistry, config: &Path, reference: &str, out: &Path) -> Output {
    pull_with(&registry.ca, config, reference, out, &[])
}

/// `podstamp plugin pull REF -o OUT` trusting `ca`, with `config` and
/// `extra` arguments.
fn pull_with(ca: &Path, config: &Path, reference: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "plugin",
        "pull",
        reference,
        "-o",
        out.to_str().unwrap(),
        "--registry-config",
        config.to_str().unwrap(),
        "--registry-ca",
        ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    podstamp(&args)
}

/// Pushes the example plugin `name`; returns its pinned reference.
fn pushed(registry: &TestRegistry, config: &Path, name: &str) -> String {
    let out = push(
        registry,
        config,
        &common::plugin(name),
        &format!("plugins/{name}:v1"),
    );
    assert!(out.status.success(), "push: {}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn push_then_pull_round_trips_through_a_registry_with_tls_and_auth() {
    let (tmp, registry, config) = scene();
    let file = common::plugin("identity");
    let original = fs::read(&file).unwrap();

    let out = push(&registry, &config, &file, "plugins/identity:v1");
    assert!(out.status.success(), "push: {}", stderr(&out));
    let reference = stdout(&out).trim().to_string();
    let prefix = format!("{}/plugins/identity@sha256:", registry.host);
    let digest = reference
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{reference:?} is not {prefix}HEX"));
    assert_eq!(digest.len(), 64, "{reference}");
    // The same component pushed again: the same digest (no timestamp).
    let again = push(&registry, &config, &file, "plugins/identity:v2");
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(stdout(&again).trim(), reference);

    // The registry holds the manifest under that digest, in the Wasm
    // artifact layout, and the component as its one layer.
    let manifest = fs::read(registry.blob_file(digest)).unwrap();
    assert_eq!(sha256_hex(&manifest), digest);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(
        manifest["layers"][0]["digest"],
        format!("sha256:{}", sha256_hex(&original))
    );

    let pulled = tmp.path().join("pulled.wasm");
    let out = pull(&registry, &config, &reference, &pulled);
    assert!(out.status.success(), "pull: {}", stderr(&out));
    assert_eq!(fs::read(&pulled).unwrap(), original);

    // A tag alone is refused, saying to pin it.
    let out = pull(
        &registry,
        &config,
        &format!("{}/plugins/identity:v1", registry.host),
        &pulled,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pin it by digest"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn wrong_credentials_are_a_401_naming_the_registry_and_where_they_came_from() {
    let (tmp, registry, good) = scene();
    let reference = pushed(&registry, &good, "identity");
    let bad = registry.docker_config(&tmp.path().join("wrong.json"), "not-the-password");
    let out = pull(&registry, &bad, &reference, &tmp.path().join("x.wasm"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = stderr(&out);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains(&format!(
            "registry {} refuses the credentials (401 Unauthorized; credentials from file {})",
            registry.host,
            bad.display()
        )),
        "{line}"
    );
    let out = push(
        &registry,
        &bad,
        &common::plugin("identity"),
        "plugins/identity:v3",
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("401 Unauthorized"),
        "{}",
        stderr(&out)
    );
}

/// The rules of deploy/rbac.yaml's Role in `default` (Events on Nodes).
fn node_event_rules() -> serde_json::Value {
    use serde::Deserialize;
    let text = fs::read_to_string(common::repo().join("deploy/rbac.yaml")).unwrap();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(document).unwrap();
        if value["kind"] == "Role" && value["metadata"]["namespace"] == "default" {
            return value["rules"].clone();
        }
    }
    panic!("deploy/rbac.yaml has no Role in the namespace default");
}

/// The rules of `kind` (Role or ClusterRole) in deploy/rbac.yaml: every
/// rule of the Roles of the daemon's own namespaces (kube-system's, the
/// registry Secret's included, and podstamp-rollouts'), granted here in
/// the test's one namespace (its Leases go there too: `start_daemon`).
fn deploy_rules(kind: &str) -> serde_json::Value {
    use serde::Deserialize;
    let text = fs::read_to_string(common::repo().join("deploy/rbac.yaml")).unwrap();
    let mut rules = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(document).unwrap();
        if value["kind"] == kind && value["metadata"]["namespace"] != "default" {
            rules.extend(value["rules"].as_array().unwrap().iter().cloned());
        }
    }
    assert!(!rules.is_empty(), "deploy/rbac.yaml has no {kind}");
    serde_json::Value::Array(rules)
}

impl Kube {
    fn create_value(&self, object: serde_json::Value) {
        let gvk: kube::api::GroupVersionKind = {
            let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (
                    String::new(),
                    object["apiVersion"].as_str().unwrap().to_string(),
                ),
            };
            kube::api::GroupVersionKind::gvk(&group, &version, object["kind"].as_str().unwrap())
        };
        let resource = kube::api::ApiResource::from_gvk(&gvk);
        let object: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        let cluster = matches!(
            gvk.kind.as_str(),
            "Node" | "ClusterRole" | "ClusterRoleBinding"
        );
        let ns = object.metadata.namespace.clone().unwrap_or(self.ns.clone());
        let api: kube::Api<kube::api::DynamicObject> = if cluster {
            kube::Api::all_with(self.client.clone(), &resource)
        } else {
            kube::Api::namespaced_with(self.client.clone(), &ns, &resource)
        };
        self.rt
            .block_on(api.create(&Default::default(), &object))
            .unwrap();
    }
}

/// A namespace with the deploy/ RBAC bound to the harness's `podstamp`
/// user, a Node, a template `a` saying `${var.greeting}`, and the registry
/// Secret `podstamp-registry` holding `docker_config`.
fn namespace_with_template(docker_config: &Path) -> (Kube, String) {
    use serde_json::json;
    let server = shared_server();
    let ns = unique("oci");
    let node = unique("node");
    let kube = Kube::admin(server, &ns);
    let cluster_role = format!("podstamp-{ns}");
    // The status records' namespace (`ns` is the rollout namespace too).
    let status_ns = podstamp::config::default_status_namespace(&ns);
    for object in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "podstamp", "namespace": status_ns}, "rules": deploy_rules("Role")}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "podstamp", "namespace": status_ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podstamp"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "podstamp"}, "rules": deploy_rules("Role")}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "podstamp"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podstamp"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_role}, "rules": common::for_namespace(deploy_rules("ClusterRole"), &ns)}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}),
        // Events on the Node (a refused catalog no ConfigMap caused) go to
        // the namespace `default`, as the kubelet's own.
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": format!("podstamp-node-events-{ns}"), "namespace": "default"},
            "rules": node_event_rules()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("podstamp-node-events-{ns}"), "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("podstamp-node-events-{ns}")},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "podstamp-registry"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": k8s_openapi::ByteString(fs::read(docker_config).unwrap())}}),
        json!({"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "a", "labels": {"podstamp.io/enabled": "true"}},
            "template": {"spec": {"containers": [{"name": "main", "image": "a:1",
                "command": ["serve", "--say=${var.greeting}"]}]}}}),
    ] {
        kube.create_value(object);
    }
    // The grants in effect before the daemon's first read.
    let podstamp = kube.rt.block_on(client(&server.kubeconfig("podstamp")));
    let limit = std::time::Duration::from_secs(30);
    kube.rt.block_on(async {
        common::wait_for_grants(&podstamp, &ns, &deploy_rules("Role"), limit).await;
        common::wait_for_grants(
            &podstamp,
            "",
            &common::for_namespace(deploy_rules("ClusterRole"), &ns),
            limit,
        )
        .await;
        common::wait_for_grants(&podstamp, "default", &node_event_rules(), limit).await;
    });
    (kube, node)
}

/// `podstamp run` against the shared API server with `config` and `extra` flags.
fn start_daemon(
    dir: &Path,
    ns: &str,
    node: &str,
    config: &Path,
    extra: &[&str],
    log: &str,
) -> Daemon {
    let kubeconfig = shared_server().kubeconfig("podstamp");
    let manifests = dir.join("manifests");
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        ns,
        "--rollout-namespace",
        ns,
        "--node-name",
        node,
        "--manifest-dir",
        manifests.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Daemon::start(&args, dir.join(log))
}

fn wait_content(daemon: &Daemon, path: &Path, needle: &str) {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("{} to say {needle}", path.display()),
            CONVERGE,
            || {
                daemon.assert_running();
                fs::read_to_string(path)
                    .ok()
                    .filter(|t| t.contains(needle))
                    .map(|_| ())
            },
        )
    }));
    if found.is_err() {
        panic!(
            "{} never said {needle}; podstamp's log:\n{}",
            path.display(),
            daemon.logs()
        );
    }
}

/// The configuration file: one `oci:` plugin, `substitute`, saying `greeting`.
fn oci_config(path: &Path, reference: &str, greeting: &str, registry: &str) -> PathBuf {
    fs::write(
        path,
        format!(
            "plugins:\n  substitute:\n    oci: {reference}\n    settings: {{vars: {{greeting: {greeting}}}}}\n    scope: [metadata, spec]\nchain: [substitute]\nlimits: {{timeout: 2s}}\ndaemon: {{registry: {registry}}}\n"
        ),
    )
    .unwrap();
    path.to_path_buf()
}

#[test]
fn the_daemon_renders_an_oci_plugin_and_starts_again_with_the_registry_down() {
    let (tmp, mut registry, auth) = scene();
    let reference = pushed(&registry, &auth, "substitute");
    let (kube, node) = namespace_with_template(&auth);
    // Credentials from the Secret (deploy/rbac.yaml grants get on it), the CA from a file.
    let config = oci_config(
        &tmp.path().join("podstamp.yaml"),
        &reference,
        "hello",
        &format!(
            "{{secret: podstamp-registry, ca: {}}}",
            registry.ca.display()
        ),
    );
    let cache = tmp.path().join("cache");
    let cache_flag = ["--cache-dir", cache.to_str().unwrap()];
    let a = tmp.path().join("manifests/a.yaml");
    let daemon = start_daemon(
        tmp.path(),
        &kube.ns,
        &node,
        &config,
        &cache_flag,
        "first.log",
    );
    wait_content(&daemon, &a, "--say=hello");
    let pulls = |daemon: &Daemon, result: &str| {
        daemon.metric(&format!("podstamp_oci_pulls_total{{result=\"{result}\"}}"))
    };
    assert_eq!(
        (pulls(&daemon, "pulled"), pulls(&daemon, "cached")),
        (1.0, 0.0)
    );
    assert!(daemon.stop().success());
    assert!(
        registry
            .log()
            .contains("/v2/plugins/substitute/manifests/sha256:"),
        "the daemon pulled from the registry:\n{}",
        registry.log()
    );

    // The registry is down; the cache is kept: the node starts and renders.
    registry.stop();
    fs::remove_file(&a).unwrap();
    let daemon = start_daemon(
        tmp.path(),
        &kube.ns,
        &node,
        &config,
        &cache_flag,
        "again.log",
    );
    wait_content(&daemon, &a, "--say=hello");
    assert_eq!(
        (pulls(&daemon, "pulled"), pulls(&daemon, "cached")),
        (0.0, 1.0),
        "from the cache, the registry not asked"
    );
    drop(daemon);

    // Without the cache, the same start cannot have the plugin: it says
    // which registry does not answer, and writes nothing.
    fs::remove_file(&a).unwrap();
    let empty = tmp.path().join("empty-cache");
    let daemon = start_daemon(
        tmp.path(),
        &kube.ns,
        &node,
        &config,
        &["--cache-dir", empty.to_str().unwrap()],
        "no-cache.log",
    );
    let line = wait_for("the refusal", CONVERGE, || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains(&format!("registry {} does not answer", registry.host)))
            .map(str::to_string)
    });
    assert!(line.contains("plugins.substitute: oci "), "{line}");
    assert!(!a.exists(), "nothing rendered without the plugin");
}

/// A running daemon whose catalog changes to an `oci:` component the
/// registry does not have keeps the catalog in use and its manifest, and
/// says so in its log, its reload metric and an Event on its Node (no
/// ConfigMap is at fault: the catalog is the configuration file's).
#[test]
fn a_catalog_the_registry_refuses_on_reload_keeps_the_one_in_use_and_says_so_on_the_node() {
    let (tmp, registry, auth) = scene();
    let reference = pushed(&registry, &auth, "substitute");
    let (kube, node) = namespace_with_template(&auth);
    let registry_settings = format!(
        "{{config: {}, ca: {}}}",
        auth.display(),
        registry.ca.display()
    );
    let path = tmp.path().join("podstamp.yaml");
    let config = oci_config(&path, &reference, "hello", &registry_settings);
    let a = tmp.path().join("manifests/a.yaml");
    let daemon = start_daemon(
        tmp.path(),
        &kube.ns,
        &node,
        &config,
        &["--no-cache"],
        "podstamp.log",
    );
    wait_content(&daemon, &a, "--say=hello");
    let manifest = identity(&a);

    let unknown = format!(
        "{}/plugins/substitute@sha256:{}",
        registry.host,
        "0".repeat(64)
    );
    oci_config(&path, &unknown, "bonjour", &registry_settings);
    wait_for("the refused reload", CONVERGE, || {
        (daemon.metric("podstamp_config_reloads_total{result=\"refused\"}") >= 1.0).then_some(())
    });
    assert!(
        daemon
            .logs()
            .lines()
            .any(|l| l.contains("the new plugin catalog is refused")
                && l.contains(&format!("oci {unknown}: "))),
        "{}",
        daemon.logs()
    );
    // No ConfigMap is at fault (the catalog is the file's): the Event is on
    // the Node, where the kubelet's own Events are.
    let note = wait_for("the CatalogRefused Event on the Node", CONVERGE, || {
        let api: kube::Api<k8s_openapi::api::events::v1::Event> =
            kube::Api::namespaced(kube.client.clone(), "default");
        kube.rt
            .block_on(api.list(&Default::default()))
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("CatalogRefused")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str())
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node")
            })
            .and_then(|e| e.note)
    });
    assert!(
        note.starts_with("the new plugin catalog is refused: ")
            && note.contains(&format!("oci {unknown}: ")),
        "{note}"
    );
    assert_eq!(identity(&a), manifest, "the manifest is kept");
    daemon.assert_running();
}

/// `podstamp render --config` pulls an `oci:` entry as the daemon would:
/// credentials and CA from the configuration's `daemon.registry`.
#[test]
fn podstamp_render_pulls_an_oci_plugin_with_the_configurations_registry_settings() {
    let (tmp, registry, auth) = scene();
    let reference = pushed(&registry, &auth, "substitute");
    let template = tmp.path().join("a.yaml");
    fs::write(
        &template,
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: a}\ntemplate: {spec: {containers: [{name: main, image: a:1, command: [serve, \"--say=${var.greeting}\"]}]}}\n",
    )
    .unwrap();
    let settings = format!(
        "{{config: {}, ca: {}}}",
        auth.display(),
        registry.ca.display()
    );
    let config = oci_config(
        &tmp.path().join("podstamp.yaml"),
        &reference,
        "hello",
        &settings,
    );
    let cache = tmp.path().join("cache");
    let out = render(
        &template,
        &config,
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("--say=hello"), "{}", stdout(&out));

    // Without the CA, the registry's certificate is not trusted: one line.
    let config = oci_config(
        &tmp.path().join("no-ca.yaml"),
        &reference,
        "hello",
        &format!("{{config: {}}}", auth.display()),
    );
    let err = render_fails(&template, &config, 1);
    assert!(
        err.starts_with("podstamp: error: plugins.substitute: oci ")
            && err.contains("UnknownIssuer"),
        "{err}"
    );
}

/// The JavaScript example (12 MB: a registry is the only way it reaches a
/// node; a ConfigMap holds 1 MiB), built from source, pushed and pulled by
/// digest: it renders node-env's golden manifest.
#[test]
fn a_javascript_plugin_from_the_registry_renders_its_golden_manifest() {
    common::run_ok(
        std::process::Command::new("bash").arg(common::repo().join("plugins/js/build.sh")),
        "plugins/js/build.sh",
    );
    let (tmp, registry, auth) = scene();
    let reference = pushed(&registry, &auth, "node-env-js");
    let config = tmp.path().join("podstamp.yaml");
    fs::write(
        &config,
        format!(
            // The checkpointer (host network, host paths): granted Pod
            // Security level privileged, deliberately.
            "plugins:\n  node-env:\n    oci: {reference}\n    settingsFile: {}\nchain: [node-env]\nlimits: {{timeout: 10s}}\ndaemon: {{registry: {{config: {}, ca: {}}}}}\npodSecurity: privileged\n",
            common::repo().join("tests/fixtures/node-env.yaml").display(),
            auth.display(),
            registry.ca.display()
        ),
    )
    .unwrap();
    // A fresh cache, so the component is pulled and compiled here (a debug
    // build takes 15-20 s for it).
    let cache = tmp.path().join("cache");
    let out = podstamp(&[
        "render",
        "examples/pod-checkpointer.yaml",
        "--node",
        "examples/node.yaml",
        "--config",
        config.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), common::expected("rust/node-env"));
    assert!(
        registry
            .log()
            .contains("/v2/plugins/node-env-js/blobs/sha256:"),
        "pulled from the registry:\n{}",
        registry.log()
    );
}

#[test]
fn wrong_registry_credentials_refuse_the_catalog_with_a_401_line() {
    let (tmp, registry, auth) = scene();
    let reference = pushed(&registry, &auth, "substitute");
    let (kube, node) = namespace_with_template(&auth);
    let wrong = registry.docker_config(&tmp.path().join("wrong.json"), "not-the-password");
    let config = oci_config(
        &tmp.path().join("podstamp.yaml"),
        &reference,
        "hello",
        &format!(
            "{{config: {}, ca: {}}}",
            wrong.display(),
            registry.ca.display()
        ),
    );
    let daemon = start_daemon(
        tmp.path(),
        &kube.ns,
        &node,
        &config,
        &["--no-cache"],
        "podstamp.log",
    );
    let line = wait_for("the 401 line", CONVERGE, || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains("401 Unauthorized"))
            .map(str::to_string)
    });
    assert!(
        line.contains(&format!(
            "plugins.substitute: oci {reference}: registry {} refuses the credentials (401 Unauthorized; credentials from file {})",
            registry.host,
            wrong.display()
        )),
        "{line}"
    );
    assert!(!tmp.path().join("manifests/a.yaml").exists());
}

#[test]
fn a_tag_without_a_digest_is_refused_in_the_catalog() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("podstamp.yaml");
    fs::write(
        &config,
        "plugins:\n  greet:\n    oci: 127.0.0.1:5000/plugins/greet:v1\nchain: [greet]\n",
    )
    .unwrap();
    let template = tmp.path().join("t.yaml");
    fs::write(
        &template,
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: t}\ntemplate: {spec: {containers: [{name: c, image: i}]}}\n",
    )
    .unwrap();
    let line = render_fails(&template, &config, 2);
    assert!(
        line.contains("plugins.greet.oci: \"127.0.0.1:5000/plugins/greet:v1\" names a tag, which can be moved to another component: pin it by digest"),
        "{line}"
    );
}

/// `podstamp render TEMPLATE --config CONFIG` for a node `n`, with `extra`.
fn render(template: &Path, config: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "render",
        template.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--node-name",
        "n",
    ];
    args.extend_from_slice(extra);
    podstamp(&args)
}

/// [`render`] without a code cache, expecting exit `code` and one line on
/// stderr: that line.
fn render_fails(template: &Path, config: &Path, code: i32) -> String {
    let out = render(template, config, &["--no-cache"]);
    assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
    let line = stderr(&out);
    assert_eq!(line.lines().count(), 1, "one line: {line}");
    line
}

/// `podstamp plugin pull REF` that must fail: exit 1, one line on stderr
/// containing `says`, and no file written.
fn pull_refused(ca: &Path, config: &Path, reference: &str, says: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("pulled.wasm");
    let out = pull_with(ca, config, reference, &out_file, extra);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{reference}: {err}");
    assert!(
        err.contains(says),
        "{reference}: expected {says:?} in: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(!out_file.exists(), "{reference}: a file was written");
}

/// The manifest `reference` pins, as the registry stores it.
fn manifest_of(registry: &TestRegistry, reference: &str) -> serde_json::Value {
    let hex = reference.rsplit_once("@sha256:").unwrap().1;
    serde_json::from_slice(&fs::read(registry.blob_file(hex)).unwrap()).unwrap()
}

#[test]
fn an_unknown_digest_is_refused_in_one_line() {
    let (_tmp, registry, config) = scene();
    pushed(&registry, &config, "identity");
    let unknown = format!(
        "{}/plugins/identity@sha256:{}",
        registry.host,
        "0".repeat(64)
    );
    pull_refused(&registry.ca, &config, &unknown, "not in the registry", &[]);
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused() {
    let (_tmp, registry, config) = scene();
    let reference = pushed(&registry, &config, "identity");
    // The registry's storage altered under it: same length, one byte
    // changed, so only the content's digest can tell.
    let layer = manifest_of(&registry, &reference)["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap()
        .to_string();
    let blob = registry.blob_file(&layer);
    let mut bytes = fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).unwrap();
    pull_refused(
        &registry.ca,
        &config,
        &reference,
        "the registry served other bytes",
        &[],
    );
}

#[test]
fn a_manifest_over_the_size_limit_is_refused() {
    let (tmp, registry, config) = scene();
    let reference = pushed(&registry, &config, "identity");
    // The same artifact with 70 KB of annotations: a valid manifest the
    // registry accepts (its blobs are there), over podstamp's 64 KiB limit.
    let mut manifest = manifest_of(&registry, &reference);
    manifest["annotations"] = serde_json::json!({"padding": "x".repeat(70_000)});
    let body = serde_json::to_vec(&manifest).unwrap();
    let digest = sha256_hex(&body);
    let body_file = tmp.path().join("big-manifest.json");
    fs::write(&body_file, &body).unwrap();
    let put = std::process::Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--max-time", "30"])
        .args(["--cacert", registry.ca.to_str().unwrap()])
        .args(["--user", &format!("{}:{PASSWORD}", registry::USER)])
        .args(["--request", "PUT", "--header"])
        .arg("Content-Type: application/vnd.oci.image.manifest.v1+json")
        .arg("--data-binary")
        .arg(format!("@{}", body_file.display()))
        .arg(format!(
            "https://{}/v2/plugins/identity/manifests/sha256:{digest}",
            registry.host
        ))
        .output()
        .expect("curl (apt-get install curl)");
    assert!(put.status.success(), "PUT: {}", stderr(&put));
    let big = format!("{}/plugins/identity@sha256:{digest}", registry.host);
    pull_refused(
        &registry.ca,
        &config,
        &big,
        "over the limit of 65536 bytes",
        &[],
    );
}

#[test]
fn a_registry_that_never_answers_is_bounded_by_the_timeout() {
    // No registry: a listener that accepts connections and never says a
    // byte (not even TLS's).
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("auth.json");
    fs::write(&config, r#"{"auths": {}}"#).unwrap();
    let ca = shared_server().dir.join("ca.crt");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(16) {
            held.push(stream);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    let silent = format!(
        "127.0.0.1:{port}/plugins/identity@sha256:{}",
        "1".repeat(64)
    );
    let started = std::time::Instant::now();
    pull_refused(
        &ca,
        &config,
        &silent,
        "did not finish within 2s (registry timeout)",
        &["--registry-timeout", "2s"],
    );
    // Not a timing assertion on speed: only that the bound is what stops it
    // (well before the default 30 s).
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
}

/// A `podstamp render` that must fail: its exit code, its stderr, and its
/// peak resident set (`ru_maxrss` of wait4, KiB: the kernel's high-water
/// mark of the process, so nothing between two samples is missed). The
/// spawn shares this test process's memory until exec, and the kernel
/// counts that too: [`MEASURABLE_KIB`] says when the figure is podstamp's.
struct Measured {
    code: Option<i32>,
    stderr: String,
    peak_kib: i64,
}

/// A peak below this is podstamp's own (this test process stays far under
/// it); a baseline above it means the figures cannot tell a gigabyte read
/// from none, and the test says so rather than pass.
const MEASURABLE_KIB: i64 = 256 << 10;

impl Measured {
    /// A baseline: refused (exit 1) saying `says`, and measurable.
    fn assert_small_refusal(&self, says: &str) {
        assert!(
            self.peak_kib < MEASURABLE_KIB,
            "the baseline's peak RSS is {} KiB: this test process's own peak swamps the measure",
            self.peak_kib
        );
        assert_eq!(self.code, Some(1), "{}", self.stderr);
        assert!(self.stderr.contains(says), "{}", self.stderr);
    }
}

fn render_measured(template: &Path, config: &Path) -> Measured {
    measured(&[
        "render",
        template.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--node-name",
        "n",
        "--no-cache",
    ])
}

/// `podstamp ARGS…` that must fail, measured (see [`Measured`]).
fn measured(args: &[&str]) -> Measured {
    use std::io::Read;
    // Reaped by wait4 below (for its rusage), which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args(args)
        .current_dir(common::repo())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run podstamp");
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        err.read_to_string(&mut text).unwrap();
        text
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the child's PID, ours to reap (std's Child is not waited on).
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(
        pid,
        child.id() as i32,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Measured {
        code,
        stderr: reader.join().unwrap(),
        peak_kib: usage.ru_maxrss,
    }
}

/// Finding 6 of the second security review: a registry that sends a
/// gigabyte — as a manifest with an honest `Content-Length`, as a chunked
/// manifest without one, as the layer of a pinned manifest declaring 1000
/// bytes, as the body of a 404, as a token realm's answer — is refused in
/// one line after reading at most about the cap, and `podstamp render`'s
/// peak memory stays within a few MiB of a render refused by a small 404.
#[test]
fn a_registry_sending_a_gigabyte_is_refused_at_the_cap_in_the_memory_of_a_small_refusal() {
    use hostile::{Answer, HostileRegistry};
    const GIB: u64 = 1 << 30;
    const SLACK_KIB: i64 = 8 << 10;
    // What the server may write before the client's hang-up is seen: the
    // cap, plus what the kernel's socket buffers and TLS records absorb.
    const WRITTEN_BOUND: u64 = 32 << 20;
    let tmp = tempfile::tempdir().unwrap();
    // A pinned manifest declaring a 1000-byte layer.
    let layer_digest = format!("sha256:{}", sha256_hex(b"the component"));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.wasm.config.v0+json",
            "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{"mediaType": "application/wasm", "digest": layer_digest, "size": 1000}],
    }))
    .unwrap();
    let pinned = sha256_hex(&manifest);
    let registry = {
        let manifest = manifest.clone();
        HostileRegistry::start(&tmp.path().join("hostile"), move |path| {
            let case = path.split('/').nth(3).unwrap_or_default();
            let blob = path.contains("/blobs/");
            match case {
                "small-404" => Answer {
                    status: 404,
                    headers: vec![],
                    body: hostile::Body::Bytes(
                        br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#
                            .to_vec(),
                    ),
                },
                "manifest-with-length" => Answer::filler(200, GIB, false),
                "manifest-chunked" => Answer::filler(200, GIB, true),
                "layer-chunked" if blob => Answer::filler(200, GIB, true),
                "layer-chunked" => Answer::ok(manifest.clone()),
                "error-body-chunked" => Answer::filler(404, GIB, true),
                _ if path.starts_with("/token") => Answer::filler(200, GIB, true),
                "token-chunked" => Answer::filler(401, 0, false).with_header(
                    "WWW-Authenticate",
                    "Bearer realm=\"https://{host}/token\",service=\"hostile\"",
                ),
                _ => Answer::filler(404, 0, false),
            }
        })
    };
    let template = tmp.path().join("a.yaml");
    fs::write(
        &template,
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: a}\ntemplate: {spec: {containers: [{name: main, image: a:1}]}}\n",
    )
    .unwrap();
    let run = |case: &str| {
        let config = tmp.path().join(format!("{case}.yaml"));
        fs::write(
            &config,
            format!(
                "plugins:\n  p:\n    oci: {}/plugins/{case}@sha256:{pinned}\n    scope: [metadata, spec]\nchain: [p]\ndaemon: {{registry: {{ca: {}, timeout: 60s}}}}\n",
                registry.host,
                registry.ca.display()
            ),
        )
        .unwrap();
        registry.clear();
        let measured = render_measured(&template, &config);
        let written: u64 = registry.served().iter().map(|s| s.written).sum();
        (measured, written)
    };

    let (baseline, _) = run("small-404");
    baseline.assert_small_refusal("not in the registry");
    println!(
        "peak RSS of `podstamp render` (ru_maxrss), each refused:\n  {:<52} {:>8} KiB",
        "baseline: a small 404", baseline.peak_kib
    );
    let reference = |case: &str| format!("{}/plugins/{case}@sha256:{pinned}", registry.host);
    let cases = [
        (
            "manifest-with-length",
            format!(
                "{}: the manifest is {GIB} bytes by its Content-Length, over the limit of 65536 bytes",
                reference("manifest-with-length")
            ),
        ),
        (
            "manifest-chunked",
            format!(
                "{}: the manifest is more than 65536 bytes (read up to the limit), over the limit of 65536 bytes",
                reference("manifest-chunked")
            ),
        ),
        (
            "layer-chunked",
            format!(
                "{}: the layer is more than 1000 bytes (read up to the limit), over the 1000 bytes its manifest declares",
                reference("layer-chunked")
            ),
        ),
        (
            "error-body-chunked",
            format!(
                "{}: not in the registry (404 Not Found: xxxx",
                reference("error-body-chunked")
            ),
        ),
        (
            "token-chunked",
            format!(
                "registry {}: its token realm https://{}/token answered more than 65536 bytes",
                registry.host, registry.host
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (case, says) in cases {
        let (measured, written) = run(case);
        println!(
            "  {:<52} {:>8} KiB ({:+} KiB), the registry wrote {} KiB of its {} KiB",
            format!("1 GiB: {case}"),
            measured.peak_kib,
            measured.peak_kib - baseline.peak_kib,
            written >> 10,
            GIB >> 10
        );
        let line = measured.stderr.trim_end();
        if measured.code != Some(1) || line.lines().count() != 1 || !line.contains(&says) {
            // Cut: a line that echoes what the registry sent can be huge.
            let line: String = line.chars().take(600).collect();
            failures.push(format!(
                "{case}: exit {:?}, expected one line containing {says:?}: {line}",
                measured.code
            ));
        }
        if line.len() > 8 << 10 {
            failures.push(format!("{case}: a line of {} bytes", line.len()));
        }
        if measured.peak_kib > baseline.peak_kib + SLACK_KIB {
            failures.push(format!(
                "{case}: peak RSS {} KiB, over the baseline's {} KiB + {SLACK_KIB} KiB",
                measured.peak_kib, baseline.peak_kib
            ));
        }
        if written > WRITTEN_BOUND {
            failures.push(format!(
                "{case}: the registry wrote {written} bytes before podstamp stopped reading"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Finding 6 for pushes: a registry that answers `podstamp plugin push`
/// with a gigabyte (a 500 whose body is 1 GiB; a token realm answering
/// 1 GiB) is refused in one line, in the memory of a push refused by a
/// small 500.
#[test]
fn a_registry_answering_a_push_with_a_gigabyte_is_refused_at_the_cap() {
    use hostile::{Answer, HostileRegistry};
    const GIB: u64 = 1 << 30;
    const SLACK_KIB: i64 = 8 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let registry = HostileRegistry::start(&tmp.path().join("hostile"), |path| {
        let case = path.split('/').nth(3).unwrap_or_default();
        match case {
            "small-500" => Answer {
                status: 500,
                headers: vec![],
                body: hostile::Body::Bytes(b"storage is down".to_vec()),
            },
            "huge-500" => Answer::filler(500, GIB, true),
            "token" => Answer::filler(401, 0, false).with_header(
                "WWW-Authenticate",
                "Bearer realm=\"https://{host}/token\",service=\"hostile\"",
            ),
            _ if path.starts_with("/token") => Answer::filler(200, GIB, true),
            _ => Answer::filler(404, 0, false),
        }
    });
    let component = common::plugin("identity");
    let push = |case: &str| {
        registry.clear();
        let measured = measured(&[
            "plugin",
            "push",
            component.to_str().unwrap(),
            &format!("{}/plugins/{case}:v1", registry.host),
            "--registry-ca",
            registry.ca.to_str().unwrap(),
        ]);
        let written: u64 = registry.served().iter().map(|s| s.written).sum();
        (measured, written)
    };
    let (baseline, _) = push("small-500");
    baseline.assert_small_refusal("storage is down");
    println!(
        "peak RSS of `podstamp plugin push` (ru_maxrss), each refused:\n  {:<30} {:>8} KiB",
        "baseline: a small 500", baseline.peak_kib
    );
    let mut failures = Vec::new();
    for (case, says) in [
        (
            "huge-500",
            format!(
                "registry {}: 500 Internal Server Error: xxxx",
                registry.host
            ),
        ),
        (
            "token",
            format!(
                "registry {}: its token realm https://{}/token answered more than 65536 bytes",
                registry.host, registry.host
            ),
        ),
    ] {
        let (measured, written) = push(case);
        println!(
            "  {:<30} {:>8} KiB ({:+} KiB), the registry wrote {} KiB of its {} KiB",
            format!("1 GiB: {case}"),
            measured.peak_kib,
            measured.peak_kib - baseline.peak_kib,
            written >> 10,
            GIB >> 10
        );
        let line = measured.stderr.trim_end();
        if measured.code != Some(1) || line.lines().count() != 1 || !line.contains(&says) {
            // Cut: a line that echoes what the registry sent can be huge.
            let line: String = line.chars().take(600).collect();
            failures.push(format!(
                "{case}: exit {:?}, expected one line containing {says:?}: {line}",
                measured.code
            ));
        }
        if measured.peak_kib > baseline.peak_kib + SLACK_KIB {
            failures.push(format!(
                "{case}: peak RSS {} KiB, over the baseline's {} KiB + {SLACK_KIB} KiB",
                measured.peak_kib, baseline.peak_kib
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
