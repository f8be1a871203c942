//! End-to-end tests against a real kubelet: the harness API server, a node
//! (containerd + the kubelet, `podstamp-node`) and `podstamp run` writing
//! into the kubelet's staticPodPath. What counts is what the kubelet runs
//! (through the CRI) and the mirror pod it reports in the API.
//!
//! Needs `bash tests/harness/build.sh`, `bash plugins/build.sh` and the
//! Debian packages containerd, runc and busybox-static (`bash tests/run.sh`
//! installs them). Runs as root. The tests share one node at a time.

mod common;
// Shared with tests/daemon.rs, which uses all of it.
#[path = "kubelet/support.rs"]
mod node;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, PodTemplate};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use node::{Node, leftovers, serial};
use support::*;

/// From a manifest written to a container running, and to its mirror pod:
/// well under a second each on a warm node, ten times that is generous.
const CONVERGE: Duration = Duration::from_secs(30);

/// The directory of the node `name` (short: containerd's socket is in it),
/// with symlinks resolved as in the mount table (target/ may be a symlink).
/// Fixed per test, so that a run whose node was SIGKILLed is cleaned up by
/// the next one (podstamp-node sweeps its directory and cgroups at start).
fn node_dir(name: &str) -> PathBuf {
    let dir = common::repo().join("target/kubelet-tests").join(name);
    fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

/// Synchronous API access for the tests.
struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    ns: String,
}

impl Kube {
    fn new(server: &ApiServer, ns: &str) -> Kube {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(client(&server.kubeconfig("admin")));
        Kube {
            rt,
            client,
            ns: ns.to_string(),
        }
    }

    fn create_namespace(&self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": self.ns}})).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &ns))
            .unwrap();
    }

    fn templates(&self) -> Api<PodTemplate> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn create_template(&self, template: Value) {
        let template = serde_json::from_value(template).unwrap();
        self.rt
            .block_on(self.templates().create(&PostParams::default(), &template))
            .unwrap();
    }

    fn patch_template(&self, name: &str, patch: Value) {
        self.rt
            .block_on(self.templates().patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            ))
            .unwrap();
    }

    fn delete_template(&self, name: &str) {
        self.rt
            .block_on(self.templates().delete(name, &DeleteParams::default()))
            .unwrap();
    }

    fn pod(&self, name: &str) -> Option<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        self.rt.block_on(api.get_opt(name)).unwrap()
    }
}

/// A PodTemplate for a host-network busybox that sleeps; `VERSION` is what
/// an update changes, `NODE` comes through `substitute`, `HOST` through
/// `node-env` from the label the kubelet put on its Node.
fn template(name: &str, version: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "labels": {"podstamp.io/enabled": "true"}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": "podstamp.test/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "env": [
                        {"name": "VERSION", "value": version},
                        {"name": "NODE", "value": "${node.name}"}
                    ]
                }]
            }
        }
    })
}

fn write_config(dir: &Path) -> PathBuf {
    use common::plugin;
    let path = dir.join("podstamp.yaml");
    let text = format!(
        "plugins:\n  substitute:\n    path: {}\n  node-env:\n    path: {}\n    settings: {{nodeIP: \"\", labels: {{HOST: kubernetes.io/hostname}}}}\nchain: [substitute, node-env]\n",
        plugin("substitute").display(),
        plugin("node-env").display(),
    );
    fs::write(&path, text).unwrap();
    path
}

/// Waits for `probe`, and on a timeout shows what the node and podstamp say.
fn converge<T>(
    what: &str,
    node: &Node,
    daemon: &Daemon,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, CONVERGE, || {
            daemon.assert_running();
            probe()
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}\ncontainers: {:#?}\n{}\npodstamp's log:\n{}",
            node.containers(),
            node.logs(),
            daemon.logs()
        )
    })
}

#[test]
fn the_kubelet_runs_what_podstamp_writes_and_follows_updates_and_deletes() {
    let _serial = serial();
    let server = shared_server();
    let ns = unique("kubelet");
    let kube = Kube::new(server, &ns);
    kube.create_namespace();
    let node_name = "kl-life";
    let dir = node_dir(node_name);
    let mut node = Node::start(&dir, &server.kubeconfig("admin"), node_name);

    let config = write_config(&dir);
    let manifests = node.manifests();
    kube.create_template(template("web", "1"));
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            server.kubeconfig("admin").to_str().unwrap(),
            "--namespace",
            &ns,
            "--node-name",
            node_name,
            "--manifest-dir",
            manifests.to_str().unwrap(),
        ],
        dir.join("podstamp.log"),
    );
    let mirror = format!("web-{node_name}");
    let node_env = format!("NODE={node_name}");
    let host_env = format!("HOST={node_name}");

    // Written, run by the kubelet with what the plugins added, reported.
    let first = converge("the first container running", &node, &daemon, || {
        node.running(&mirror).into_iter().next()
    });
    assert_eq!(first.pod_namespace, ns);
    assert_eq!(first.name, "main");
    assert_eq!(
        first.args.as_deref(),
        Some(&["sleep".to_string(), "3600".to_string()][..])
    );
    assert!(first.has_env("VERSION=1"), "{first:?}");
    assert!(first.has_env(&node_env), "{first:?}");
    assert!(first.has_env(&host_env), "{first:?}");
    let hash = |pod: &Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.hash").cloned())
    };
    let running_mirror = |kube: &Kube| {
        kube.pod(&mirror)
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    };
    let first_mirror = converge("the mirror pod Running", &node, &daemon, || {
        running_mirror(&kube)
    });
    let first_hash = hash(&first_mirror).expect("a mirror pod has the config hash");
    assert_eq!(
        first_mirror
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.mirror")),
        Some(&first_hash)
    );
    assert_eq!(
        first_mirror
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref()),
        Some(node_name)
    );

    // An update: a new container with the new content replaces the old one.
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "env": [{"name": "VERSION", "value": "2"}]}]}}}),
    );
    let second = converge(
        "a running container with VERSION=2, and none with VERSION=1",
        &node,
        &daemon,
        || {
            let running = node.running(&mirror);
            let old = running.iter().any(|c| c.has_env("VERSION=1"));
            let new = running.iter().find(|c| c.has_env("VERSION=2")).cloned();
            new.filter(|_| !old)
        },
    );
    assert_ne!(second.id, first.id);
    assert!(
        second.has_env(&node_env) && second.has_env(&host_env),
        "{second:?}"
    );
    converge(
        "the mirror pod Running with the new config hash",
        &node,
        &daemon,
        || running_mirror(&kube).filter(|p| hash(p).is_some_and(|h| h != first_hash)),
    );

    // A delete: the manifest goes, the container stops, the mirror pod goes.
    kube.delete_template("web");
    converge("web's containers to stop", &node, &daemon, || {
        node.running(&mirror).is_empty().then_some(())
    });
    converge("the mirror pod to go", &node, &daemon, || {
        kube.pod(&mirror).is_none().then_some(())
    });
    assert!(!manifests.join("web.yaml").exists());

    assert!(daemon.stop().success());
    let status = node.stop().unwrap();
    assert!(status.success(), "teardown: {status}\n{}", node.logs());
    assert_eq!(leftovers(&dir, &node.cgroup_root), Vec::<String>::new());
    let _ = fs::remove_dir_all(&dir);
}

/// A test that fails with a node up still tears it all down (the node's
/// Drop): nothing stays running, mounted or in the cgroup tree.
#[test]
fn a_failing_test_leaves_nothing_running_or_mounted() {
    let _serial = serial();
    let server = shared_server();
    let node_name = "kl-fail";
    let dir = node_dir(node_name);
    let cgroup_root = format!("/podstamp-node-{node_name}");
    let panicked = std::panic::catch_unwind(|| {
        let node = Node::start(&dir, &server.kubeconfig("admin"), node_name);
        // A pod by hand, in a namespace that always exists.
        fs::write(
            node.manifests().join("sleeper.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper, namespace: kube-system}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: main, image: podstamp.test/busybox:1, imagePullPolicy: Never, command: [sleep, '3600']}\n",
        )
        .unwrap();
        let pod = format!("sleeper-{node_name}");
        wait_for("the sleeper running", CONVERGE, || {
            (!node.running(&pod).is_empty()).then_some(())
        });
        let found = leftovers(&dir, &cgroup_root);
        assert!(
            found.iter().any(|l| l.starts_with("mounted: "))
                && found.iter().any(|l| l.contains("containerd-shim"))
                && found.iter().any(|l| l.contains("sleep 3600"))
                && found.iter().any(|l| l.starts_with("cgroup: ")),
            "a running node is seen: {found:#?}"
        );
        panic!("the test fails with its node up");
    });
    // Only the deliberate failure: an assertion above would be another one.
    let payload = panicked.expect_err("the closure panics");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"the test fails with its node up"),
        "{:?}",
        payload.downcast_ref::<String>()
    );
    assert_eq!(leftovers(&dir, &cgroup_root), Vec::<String>::new());
    let _ = fs::remove_dir_all(&dir);
}

/// A changed static pod restarts after the kubelet's fixed 10 s back-off;
/// a crash loop or a rollback adds one more of those: generous.
const ROLLOUT: Duration = Duration::from_secs(150);

/// `podstamp run` for `node`, with the test's configuration and `extra` flags.
fn start_podstamp(dir: &Path, server: &ApiServer, ns: &str, node: &Node, extra: &[&str]) -> Daemon {
    let config = write_config(dir);
    let kubeconfig = server.kubeconfig("admin");
    let manifests = node.manifests();
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        ns,
        "--node-name",
        &node.name,
        "--manifest-dir",
        manifests.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Daemon::start(&args, dir.join("podstamp.log"))
}

/// The `podstamp.io/revision` label of a manifest's text.
fn revision_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
        .map(|v| v.trim_matches('"').to_string())
}

/// The revision of `web.yaml` in the manifest directory, once it is not `old`.
fn new_revision(node: &Node, daemon: &Daemon, old: Option<&str>) -> String {
    converge("a new revision in the manifest", node, daemon, || {
        let text = fs::read_to_string(node.manifests().join("web.yaml")).ok()?;
        revision_of(&text).filter(|r| Some(r.as_str()) != old)
    })
}

fn mirror_revision(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get("podstamp.io/revision")
        .map(String::as_str)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits for an Event `reason` on PodTemplate web whose note has every one of `words`.
fn wait_event(kube: &Kube, node: &Node, daemon: &Daemon, reason: &str, words: &[&str]) -> String {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::namespaced(kube.client.clone(), &kube.ns);
    let what = format!("Event {reason} with {words:?}");
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, ROLLOUT, || {
            daemon.assert_running();
            let events = kube
                .rt
                .block_on(api.list(&Default::default()))
                .unwrap()
                .items;
            events.into_iter().find_map(|e| {
                let note = e.note.clone().unwrap_or_default();
                (e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                    && words.iter().all(|w| note.contains(w)))
                .then_some(note)
            })
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}\ncontainers: {:#?}\n{}\npodstamp's log:\n{}",
            node.containers(),
            node.logs(),
            daemon.logs()
        )
    })
}

/// Waits for the mirror pod Ready with `revision`, and its container with
/// `env` running.
fn wait_ready_revision(kube: &Kube, node: &Node, daemon: &Daemon, revision: &str, env: &str) {
    let mirror = format!("web-{}", node.name);
    let what = format!("the mirror pod Ready with revision {revision} and {env} running");
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, ROLLOUT, || {
            daemon.assert_running();
            let pod = kube.pod(&mirror)?;
            let running = node.running(&mirror);
            (mirror_revision(&pod) == Some(revision)
                && is_ready(&pod)
                && running.len() == 1
                && running[0].has_env(env))
            .then_some(())
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}\nmirror pod: {:#?}\ncontainers: {:#?}\n{}\npodstamp's log:\n{}",
            kube.pod(&mirror).map(|p| (p.metadata.labels, p.status)),
            node.containers(),
            node.logs(),
            daemon.logs()
        )
    })
}

/// The files the kubelet reads in its manifest directory.
/// Stops the daemon and the node, each of which must exit cleanly, and
/// removes the node's directory.
fn stop_all(daemon: Daemon, mut node: Node, dir: &Path) {
    assert!(daemon.stop().success());
    let status = node.stop().unwrap();
    assert!(status.success(), "teardown: {status}\n{}", node.logs());
    let _ = fs::remove_dir_all(dir);
}

fn kubelet_files(node: &Node) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(node.manifests())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

#[test]
fn a_good_update_is_confirmed_ready_with_its_revision_and_the_history_stays_bounded() {
    let _serial = serial();
    let server = shared_server();
    let ns = unique("klrev");
    let kube = Kube::new(server, &ns);
    kube.create_namespace();
    let dir = node_dir("kl-rev");
    let node = Node::start(&dir, &server.kubeconfig("admin"), "kl-rev");
    let history = dir.join("history");
    let _ = fs::remove_dir_all(&history);
    kube.create_template(template("web", "1"));
    let daemon = start_podstamp(
        &dir,
        server,
        &ns,
        &node,
        &[
            "--revisions-dir",
            history.to_str().unwrap(),
            "--revision-history",
            "2",
        ],
    );
    let kept_dir = history.join(format!("{ns}_web"));
    let mut revisions: Vec<String> = Vec::new();
    for version in ["1", "2", "3"] {
        if version != "1" {
            kube.patch_template(
                "web",
                json!({"template": {"spec": {"containers": [{"name": "main", "env": [{"name": "VERSION", "value": version}]}]}}}),
            );
        }
        let revision = new_revision(&node, &daemon, revisions.last().map(String::as_str));
        // Confirmed: the mirror pod shows the revision, Ready; an Event and
        // the metrics say so.
        wait_ready_revision(
            &kube,
            &node,
            &daemon,
            &revision,
            &format!("VERSION={version}"),
        );
        let note = wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&revision]);
        assert!(note.contains("node kl-rev"), "{note}");
        let sample = format!(
            "podstamp_template_revision{{template=\"{ns}/web\",revision=\"{revision}\",phase=\"ready\"}}"
        );
        assert_eq!(daemon.metric(&sample), 1.0, "{sample}");
        revisions.push(revision);
        // The history: at most 2, the newest the revision in place, each
        // the manifest that was written; never a file the kubelet reads.
        let mut kept: Vec<String> = fs::read_dir(&kept_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        let start = revisions.len().saturating_sub(2);
        let expected: Vec<String> = revisions[start..]
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{:08}-{r}.yaml", start + i + 1))
            .collect();
        assert_eq!(kept, expected);
        assert_eq!(
            fs::read(kept_dir.join(expected.last().unwrap())).unwrap(),
            fs::read(node.manifests().join("web.yaml")).unwrap()
        );
        assert_eq!(kubelet_files(&node), ["web.yaml"]);
    }
    assert_eq!(
        daemon.metric("podstamp_rollouts_total{result=\"succeeded\"}"),
        3.0
    );
    assert_eq!(
        daemon.metric("podstamp_rollouts_total{result=\"failed\"}"),
        0.0
    );

    stop_all(daemon, node, &dir);
}

#[test]
fn a_failing_update_is_rolled_back_with_the_kubelets_reason() {
    let _serial = serial();
    let server = shared_server();
    let ns = unique("klback");
    let kube = Kube::new(server, &ns);
    kube.create_namespace();
    let dir = node_dir("kl-back");
    let node = Node::start(&dir, &server.kubeconfig("admin"), "kl-back");
    kube.create_template(template("web", "1"));
    let daemon = start_podstamp(&dir, server, &ns, &node, &["--resync", "1s"]);
    let good = new_revision(&node, &daemon, None);
    wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
    wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&good]);

    // A container that exits 1: the kubelet's CrashLoopBackOff, rolled back.
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "command": ["sh", "-c", "exit 1"]}]}}}),
    );
    let crashing = new_revision(&node, &daemon, Some(&good));
    let note = wait_event(
        &kube,
        &node,
        &daemon,
        "RolloutFailed",
        &[
            &crashing,
            "CrashLoopBackOff",
            &format!("rolled back to revision {good}"),
        ],
    );
    assert!(note.contains("last exit code 1"), "{note}");
    wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
    let text = fs::read_to_string(node.manifests().join("web.yaml")).unwrap();
    assert_eq!(revision_of(&text).as_deref(), Some(good.as_str()));
    // Held: every resync renders the failed revision again and writes
    // nothing (two more renders, the manifest unchanged).
    let unchanged = daemon.metric("podstamp_renders_total{result=\"unchanged\"}");
    converge("two more renders", &node, &daemon, || {
        (daemon.metric("podstamp_renders_total{result=\"unchanged\"}") >= unchanged + 2.0)
            .then_some(())
    });
    assert_eq!(
        fs::read_to_string(node.manifests().join("web.yaml")).unwrap(),
        text
    );

    // An image that is not there: ErrImageNeverPull, rolled back.
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "podstamp.test/missing:1", "command": ["sleep", "3600"]}]}}}),
    );
    let missing = new_revision(&node, &daemon, Some(&good));
    assert_ne!(missing, crashing);
    wait_event(
        &kube,
        &node,
        &daemon,
        "RolloutFailed",
        &[
            &missing,
            "ErrImageNeverPull",
            &format!("rolled back to revision {good}"),
        ],
    );
    wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
    assert_eq!(
        daemon.metric("podstamp_rollouts_total{result=\"rolled_back\"}"),
        2.0
    );
    assert_eq!(kubelet_files(&node), ["web.yaml"]);

    stop_all(daemon, node, &dir);
}

#[test]
fn a_first_revision_that_fails_stays_and_is_reported() {
    let _serial = serial();
    let server = shared_server();
    let ns = unique("klfirst");
    let kube = Kube::new(server, &ns);
    kube.create_namespace();
    let dir = node_dir("kl-first");
    let node = Node::start(&dir, &server.kubeconfig("admin"), "kl-first");
    let mut missing = template("web", "1");
    missing["template"]["spec"]["containers"][0]["image"] = json!("podstamp.test/missing:1");
    kube.create_template(missing);
    let daemon = start_podstamp(&dir, server, &ns, &node, &[]);
    let revision = new_revision(&node, &daemon, None);
    let note = wait_event(
        &kube,
        &node,
        &daemon,
        "RolloutFailed",
        &[
            &revision,
            "ErrImageNeverPull",
            "nothing to fall back to: it stays",
        ],
    );
    assert!(note.contains("node kl-first"), "{note}");
    let text = fs::read_to_string(node.manifests().join("web.yaml")).unwrap();
    assert_eq!(revision_of(&text).as_deref(), Some(revision.as_str()));
    let sample = format!(
        "podstamp_template_revision{{template=\"{ns}/web\",revision=\"{revision}\",phase=\"failed\"}}"
    );
    assert_eq!(daemon.metric(&sample), 1.0, "{sample}");
    assert_eq!(
        daemon.metric("podstamp_rollouts_total{result=\"rolled_back\"}"),
        0.0
    );

    stop_all(daemon, node, &dir);
}
