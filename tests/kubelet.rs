//! End-to-end tests against a real kubelet: the harness API server, a node
//! (containerd + the kubelet, `podstamp-node`) and `podstamp run` writing
//! into the kubelet's staticPodPath. What counts is what the kubelet runs
//! (through the CRI) and the mirror pod it reports in the API.
//!
//! Needs `bash tests/harness/build.sh`, `bash plugins/build.sh` and the
//! Debian packages containerd, runc and busybox-static (`bash tests/run.sh`
//! installs them). Runs as root. The tests share one node at a time.
//!
//! podstamp runs as on a cluster it is deployed to: deploy/'s RBAC and
//! admission policies applied for the test's namespace (Leases in
//! `<namespace>-rollouts`), with a token of deploy/'s ServiceAccount bound
//! to the kubelet's own Node ([`node_kubeconfig`]).

mod common;
// Shared with tests/daemon.rs, which uses all of it.
#[path = "kubelet/support.rs"]
mod node;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;
#[path = "faults/wat.rs"]
mod wat;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use common::deploy::Deploy;
use node::{Node, leftovers, serial};
use support::*;

/// From a manifest written to a container running, and to its mirror pod:
/// well under a second each on a warm node, ten times that is generous.
const CONVERGE: Duration = Duration::from_secs(30);

/// Node `node`'s credentials as a cluster podstamp is deployed to gives
/// them: deploy/ applied for `ns` (once per namespace), and a kubeconfig in
/// `dir` with a token of its ServiceAccount bound to the Node (which must
/// exist: the kubelet has registered it).
fn node_kubeconfig(dir: &Path, server: &ApiServer, ns: &str, node: &str) -> PathBuf {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let kube = Kube::new(&server.kubeconfig("admin"), ns);
    let deploy = Deploy::new(&server.kubeconfig("admin"), ns, &rollouts(ns));
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.client.clone(), ns);
    if kube
        .rt
        .block_on(accounts.get_opt("podstamp"))
        .unwrap()
        .is_none()
    {
        kube.rt.block_on(deploy.create_all(&kube.client));
    }
    kube.rt.block_on(deploy.wait_in_effect(&kube.client, node));
    let token = kube.rt.block_on(deploy.token(&kube.client, node));
    let path = dir.join(format!("{node}.kubeconfig"));
    deploy.kubeconfig(&token, &path);
    path
}

/// Where the rollout Leases of the test's namespace `ns` are.
fn rollouts(ns: &str) -> String {
    format!("{ns}-rollouts")
}

/// The directory of the node `name` (short: containerd's socket is in it),
/// with symlinks resolved as in the mount table (target/ may be a symlink).
/// Fixed per test, so that a run whose node was SIGKILLed is cleaned up by
/// the next one (podstamp-node sweeps its directory and cgroups at start).
fn node_dir(name: &str) -> PathBuf {
    let dir = common::repo().join("target/kubelet-tests").join(name);
    fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

/// A test's own corner of the shared API server: the server, a fresh
/// namespace named after `prefix` and its client, and the node `name`
/// (its directory, and the node started and registered).
fn on_node(prefix: &str, name: &str) -> (&'static ApiServer, String, Kube, PathBuf, Node) {
    let server = shared_server();
    let ns = unique(prefix);
    let kube = Kube::new(&server.kubeconfig("admin"), &ns);
    kube.create_namespace();
    let dir = node_dir(name);
    let node = Node::start(&dir, &server.kubeconfig("admin"), name);
    (server, ns, kube, dir, node)
}

/// The node's revision history directory, emptied: a run killed before its
/// end must not hand its revisions to the next one.
fn fresh_history(dir: &Path) -> PathBuf {
    let history = dir.join("history");
    let _ = fs::remove_dir_all(&history);
    history
}

impl Kube {
    fn create_template(&self, template: Value) {
        let template = serde_json::from_value(template).unwrap();
        self.rt
            .block_on(self.templates().create(&PostParams::default(), &template))
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

/// The harness's kubelets have no pod network: every pod here runs on the
/// host's (`hostNetwork`), which Pod Security baseline refuses, so the
/// configuration grants level privileged, deliberately.
fn write_config(dir: &Path) -> PathBuf {
    use common::plugin;
    let path = dir.join("podstamp.yaml");
    let text = format!(
        "plugins:\n  substitute:\n    path: {}\n    scope: [metadata, spec]\n  node-env:\n    path: {}\n    settings: {{nodeIP: \"\", labels: {{HOST: kubernetes.io/hostname}}}}\nchain: [substitute, node-env]\npodSecurity: privileged\n",
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
    let node_name = "kl-life";
    let (server, ns, kube, dir, mut node) = on_node("kubelet", node_name);

    let config = write_config(&dir);
    let manifests = node.manifests();
    kube.create_template(template("web", "1"));
    let kubeconfig = node_kubeconfig(&dir, server, &ns, node_name);
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &ns,
            "--rollout-namespace",
            &rollouts(&ns),
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
    start_podstamp_logged(dir, server, ns, node, extra, "podstamp.log")
}

/// [`start_podstamp`] logging to `log` in `dir`: one log per run of a
/// daemon that is restarted (which then needs its `--revisions-dir`: the
/// tests' default one is named after the log).
fn start_podstamp_logged(
    dir: &Path,
    server: &ApiServer,
    ns: &str,
    node: &Node,
    extra: &[&str],
    log: &str,
) -> Daemon {
    write_config(dir);
    node_kubeconfig(dir, server, ns, &node.name);
    restart_podstamp(dir, ns, node, extra, log)
}

/// podstamp started again with the files a [`start_podstamp_logged`] wrote
/// (its configuration and kubeconfig in `dir`): needs no API server, as a
/// daemon restarted while it is down.
fn restart_podstamp(dir: &Path, ns: &str, node: &Node, extra: &[&str], log: &str) -> Daemon {
    let config = dir.join("podstamp.yaml");
    let kubeconfig = dir.join(format!("{}.kubeconfig", node.name));
    let manifests = node.manifests();
    let leases = rollouts(ns);
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        ns,
        "--rollout-namespace",
        &leases,
        "--node-name",
        &node.name,
        "--manifest-dir",
        manifests.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Daemon::start(&args, dir.join(log))
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

/// Stops the daemon and the node, each of which must exit cleanly, and
/// removes the node's directory.
fn stop_all(daemon: Daemon, mut node: Node, dir: &Path) {
    assert!(daemon.stop().success());
    let status = node.stop().unwrap();
    assert!(status.success(), "teardown: {status}\n{}", node.logs());
    let _ = fs::remove_dir_all(dir);
}

/// The files the kubelet reads in its manifest directory.
fn kubelet_files(node: &Node) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(node.manifests())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// The revision files kept in a template's history directory, sorted.
fn kept_revisions(dir: &Path) -> Vec<String> {
    let mut kept: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    kept.sort();
    kept
}

/// A template's rollout state, kept in the revisions directory that holds
/// `dir`, the template's own (`<namespace>_<name>`).
fn rollout_state(dir: &Path) -> Value {
    let id = dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .replacen('_', "/", 1);
    common::rollout_state(dir.parent().unwrap(), &id)
}

#[test]
fn a_good_update_is_confirmed_ready_with_its_revision_and_the_history_stays_bounded() {
    let _serial = serial();
    let (server, ns, kube, dir, node) = on_node("klrev", "kl-rev");
    let history = fresh_history(&dir);
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
        let kept = kept_revisions(&kept_dir);
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
        // Next to them, what a restart needs: the revision that succeeded.
        let state = rollout_state(&kept_dir);
        assert_eq!(state["good"], json!(revisions.last()), "{state}");
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
    let (server, ns, kube, dir, node) = on_node("klback", "kl-back");
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
    let (server, ns, kube, dir, node) = on_node("klfirst", "kl-first");
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

/// A plugin whose output the kubelet would refuse (a liveness probe with
/// `successThreshold: 5`, which the API server never sees: the template is
/// valid) is refused by podstamp: the running manifest stays as it was, the
/// kubelet keeps the same container running past several of its re-listings
/// of the directory (1 s here; the kubelet stops the pod of a file it cannot
/// read), and the refusal is an Event on the template and a counted failure.
#[test]
fn a_plugin_output_the_kubelet_would_refuse_leaves_the_running_pod_alone() {
    let _serial = serial();
    let scene = Settled::start("klrefuse", "kl-refuse", |dir| {
        // A plugin that returns the template's pod with a probe the kubelet refuses.
        let refused = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": "podstamp.test/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "env": [{"name": "VERSION", "value": "2"}],
                    "livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 5}
                }]
            }
        });
        let (body, extra) = wat::returning(refused.to_string().as_bytes());
        let plugin = wat::write(
            dir,
            "refuse",
            &wat::componentize(&wat::core_module("", &body, &extra), &[wat::WIT]),
        );
        // The test's configuration, with that plugin in the catalog.
        let text = fs::read_to_string(write_config(dir)).unwrap().replace(
            "plugins:\n",
            &format!(
                "plugins:\n  refuse:\n    path: {}\n    scope: [metadata, spec]\n",
                plugin.display()
            ),
        );
        let config = dir.join("podstamp-refuse.yaml");
        fs::write(&config, text).unwrap();
        config
    });
    scene.kube.patch_template(
        "web",
        json!({"metadata": {"annotations": {"podstamp.io/plugins": "refuse"}}}),
    );
    let note = scene.wait_event(
        "RenderFailed",
        &[
            "spec.containers[0].livenessProbe.successThreshold: 5 is invalid: must be 1",
            "would refuse it",
        ],
    );
    assert!(note.contains("plugin"), "{note}");
    assert!(
        scene
            .daemon
            .metric("podstamp_render_failures_total{reason=\"RenderFailed\"}")
            >= 1.0
    );
    scene.assert_untouched_and_stop();
}

/// A reload of the configuration that brings a plugin overstepping its
/// scope (the attacker of issue 26, built from source, in the default chain
/// with the default scope) is refused at render: the running manifest stays
/// as it was, the kubelet keeps the same container running, and the refusal
/// is an Event on the template naming the plugin, its digest and the field,
/// counted by plugin in `podstamp_plugin_scope_refusals_total`.
#[test]
fn a_reload_bringing_a_plugin_that_oversteps_its_scope_leaves_the_running_pod_alone() {
    let fault = "spec.hostPID: added, outside the plugin's scope";
    let attacker = common::fixture_plugin("attacker");
    let _serial = serial();
    let scene = Settled::start("klscope", "kl-scope", write_config);
    // The new catalog: the attacker, no scope given, at the end of the
    // default chain; written beside and renamed into place.
    let text = fs::read_to_string(&scene.config)
        .unwrap()
        .replace(
            "plugins:\n",
            &format!(
                "plugins:\n  evil:\n    path: {}\n    settings: {{only: [hostPID]}}\n",
                attacker.display()
            ),
        )
        .replace(
            "chain: [substitute, node-env]",
            "chain: [substitute, node-env, evil]",
        );
    let next = scene.dir.join(".podstamp.yaml.next");
    fs::write(&next, text).unwrap();
    fs::rename(&next, &scene.config).unwrap();
    let note = scene.wait_event(
        "RenderFailed",
        &[
            "plugin 3 of 3 `evil` (attacker 0.1.0)",
            fault,
            "plugin sha256 ",
        ],
    );
    assert!(note.contains("scope: [spec.hostPID]"), "{note}");
    assert!(
        scene
            .daemon
            .metric("podstamp_plugin_scope_refusals_total{plugin=\"evil\"}")
            >= 1.0
    );
    scene.assert_untouched_and_stop();
}

/// A reload of the configuration that brings a plugin within its scope but
/// over the template's Pod Security level (the attacker of issue 26, built
/// from source, granted `spec.hostPID`) is refused at render like an
/// invalid pod. The pod runs at level privileged (the configuration's; the
/// harness's pods need the host network), then the namespace is labelled
/// `enforce: baseline`: the running pod, already in place, is left alone
/// (as Pod Security Admission leaves running pods alone), and the plugin's
/// output is held to the label. The running manifest stays as it was, the
/// kubelet keeps the same container running, and the refusal is an Event on
/// the template naming the level, the label it came from and the checks.
#[test]
fn a_reload_bringing_a_plugin_over_the_pod_security_level_leaves_the_running_pod_alone() {
    let attacker = common::fixture_plugin("attacker");
    let _serial = serial();
    let scene = Settled::start("klpsa", "kl-psa", write_config);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
        Api::all(scene.kube.client.clone());
    let label = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}});
    scene
        .kube
        .rt
        .block_on(namespaces.patch(
            &scene.kube.ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(label),
        ))
        .unwrap();
    // The label is in force before the reload, or the plugin's output
    // would be held to the configuration's level.
    converge("the label in force", &scene.node, &scene.daemon, || {
        scene
            .daemon
            .logs()
            .contains("labels={\"pod-security.kubernetes.io/enforce\": \"baseline\"}")
            .then_some(())
    });
    let text = fs::read_to_string(&scene.config)
        .unwrap()
        .replace(
            "plugins:\n",
            &format!(
                "plugins:\n  evil:\n    path: {}\n    scope: [spec.hostPID]\n    settings: {{only: [hostPID]}}\n",
                attacker.display()
            ),
        )
        .replace(
            "chain: [substitute, node-env]",
            "chain: [substitute, node-env, evil]",
        );
    let next = scene.dir.join(".podstamp.yaml.next");
    fs::write(&next, text).unwrap();
    fs::rename(&next, &scene.config).unwrap();
    let note = scene.wait_event(
        "RenderFailed",
        &[
            &format!(
                "the pod returned by the plugin chain does not meet Pod Security level baseline:latest (from the namespace {}'s label pod-security.kubernetes.io/enforce)",
                scene.kube.ns
            ),
            "host namespaces (hostNetwork=true, hostPID=true)",
        ],
    );
    assert!(!note.contains("outside the plugin's scope"), "{note}");
    assert!(
        scene
            .daemon
            .metric("podstamp_render_failures_total{reason=\"RenderFailed\"}")
            >= 1.0
    );
    scene.assert_untouched_and_stop();
}

/// A node running template `web` at VERSION=1, written by a daemon on the
/// configuration `config` makes, and what was running then: for the tests
/// of renders that must leave it alone.
struct Settled {
    kube: Kube,
    node: Node,
    daemon: Daemon,
    dir: PathBuf,
    config: PathBuf,
    revision: String,
    manifest: PathBuf,
    written: Vec<u8>,
    mirror: String,
    containers: Vec<String>,
}

impl Settled {
    fn start(ns: &str, node: &str, config: impl FnOnce(&Path) -> PathBuf) -> Settled {
        let (server, ns, kube, dir, node) = on_node(ns, node);
        let config = config(&dir);
        kube.create_template(template("web", "1"));
        let kubeconfig = server.kubeconfig("admin");
        let manifests = node.manifests();
        let daemon = Daemon::start(
            &[
                "--config",
                config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &ns,
                "--node-name",
                &node.name,
                "--manifest-dir",
                manifests.to_str().unwrap(),
            ],
            dir.join("podstamp.log"),
        );
        let revision = new_revision(&node, &daemon, None);
        wait_ready_revision(&kube, &node, &daemon, &revision, "VERSION=1");
        let manifest = node.manifests().join("web.yaml");
        let written = fs::read(&manifest).unwrap();
        let mirror = format!("web-{}", node.name);
        let containers: Vec<String> = node.running(&mirror).into_iter().map(|c| c.id).collect();
        assert_eq!(containers.len(), 1, "{:#?}", node.containers());
        Settled {
            kube,
            node,
            daemon,
            dir,
            config,
            revision,
            manifest,
            written,
            mirror,
            containers,
        }
    }

    fn wait_event(&self, reason: &str, words: &[&str]) -> String {
        wait_event(&self.kube, &self.node, &self.daemon, reason, words)
    }

    /// Five of the kubelet's re-listings later: the same file, the same
    /// container, the mirror pod Ready on the same revision.
    fn assert_untouched_and_stop(self) {
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(
            fs::read(&self.manifest).unwrap(),
            self.written,
            "the running manifest was touched"
        );
        let after: Vec<String> = self
            .node
            .running(&self.mirror)
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(
            after,
            self.containers,
            "the kubelet's container changed: {:#?}",
            self.node.containers()
        );
        let pod = self.kube.pod(&self.mirror).expect("the mirror pod");
        assert!(is_ready(&pod), "{:?}", pod.status);
        assert_eq!(mirror_revision(&pod), Some(self.revision.as_str()));
        stop_all(self.daemon, self.node, &self.dir);
    }
}

/// Sets the VERSION of template web's container (and its command back to a
/// sleep).
fn set_version(kube: &Kube, version: &str) {
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "podstamp.test/busybox:1", "command": ["sleep", "3600"], "env": [{"name": "VERSION", "value": version}]}]}}}),
    );
}

/// Waits for `renders` more renders that left the manifest as it was.
fn wait_renders(node: &Node, daemon: &Daemon, renders: f64) {
    let sample = "podstamp_renders_total{result=\"unchanged\"}";
    let start = daemon.metric(sample);
    converge(&format!("{renders} more renders"), node, daemon, || {
        (daemon.metric(sample) >= start + renders).then_some(())
    });
}

#[test]
fn a_hand_edit_of_the_manifest_is_restored_and_the_kubelet_runs_it_again() {
    let _serial = serial();
    let (server, ns, kube, dir, node) = on_node("kledit", "kl-edit");
    let history = fresh_history(&dir);
    let flags = [
        "--resync",
        "1s",
        "--revisions-dir",
        history.to_str().unwrap(),
    ];
    kube.create_template(template("web", "1"));
    let daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-1.log");
    let revision = new_revision(&node, &daemon, None);
    wait_ready_revision(&kube, &node, &daemon, &revision, "VERSION=1");
    let manifest = node.manifests().join("web.yaml");
    let written = fs::read_to_string(&manifest).unwrap();
    // Another command, the same revision label: as a hand edit would.
    let edited: String = written
        .lines()
        .map(|l| match l.trim_start().strip_prefix("- ") {
            Some(item) if item.trim_matches(['\'', '"']) == "3600" => l.replace("3600", "7200"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    assert_ne!(edited, written, "the edit applies: {written}");
    let args_are = |c: &node::Container, seconds: &str| {
        c.args.as_deref() == Some(&["sleep".to_string(), seconds.to_string()][..])
    };

    // Edited while no podstamp runs: the kubelet runs the edit; a
    // podstamp that starts restores it at once, and the kubelet runs that.
    assert!(daemon.stop().success());
    fs::write(&manifest, &edited).unwrap();
    let edit_running = wait_ready_revision_with(&kube, &node, &revision, |c| args_are(c, "7200"));
    let daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-2.log");
    let restored = wait_ready_revision_with(&kube, &node, &revision, |c| {
        args_are(c, "3600") && c.has_env("VERSION=1")
    });
    assert_ne!(restored, edit_running);
    assert_eq!(fs::read_to_string(&manifest).unwrap(), written);
    assert!(
        daemon.logs().contains("edited by hand"),
        "{}",
        daemon.logs()
    );

    // Edited under a running podstamp: restored at its next pass, and the
    // kubelet runs the manifest podstamp wrote.
    fs::write(&manifest, &edited).unwrap();
    converge("the manifest restored", &node, &daemon, || {
        (fs::read_to_string(&manifest).ok()? == written).then_some(())
    });
    wait_ready_revision_with(&kube, &node, &revision, |c| {
        args_are(c, "3600") && c.has_env("VERSION=1")
    });
    assert_eq!(fs::read_to_string(&manifest).unwrap(), written);
    assert_eq!(kubelet_files(&node), ["web.yaml"]);

    stop_all(daemon, node, &dir);
}

/// Waits for the mirror pod Ready with `revision` and one running
/// container for which `matches` holds; that container's id.
fn wait_ready_revision_with(
    kube: &Kube,
    node: &Node,
    revision: &str,
    matches: impl Fn(&node::Container) -> bool,
) -> String {
    let mirror = format!("web-{}", node.name);
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            "the mirror pod Ready, running the expected container",
            ROLLOUT,
            || {
                let pod = kube.pod(&mirror)?;
                let running = node.running(&mirror);
                (mirror_revision(&pod) == Some(revision)
                    && is_ready(&pod)
                    && running.len() == 1
                    && matches(&running[0]))
                .then(|| running[0].id.clone())
            },
        )
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for the mirror pod Ready with revision {revision} and the expected container\nmirror pod: {:#?}\ncontainers: {:#?}\n{}",
            kube.pod(&mirror).map(|p| (p.metadata.labels, p.status)),
            node.containers(),
            node.logs(),
        )
    })
}

#[test]
fn an_api_outage_leaves_the_node_running_and_podstamp_catches_up() {
    let _serial = serial();
    // A server of its own: the shared one must stay up for other tests.
    let api_dir = common::repo().join("target/kubelet-tests/kl-outage-api");
    let _ = fs::remove_dir_all(&api_dir);
    let mut server = ApiServer::start(&api_dir);
    let ns = unique("kloutage");
    let kube = Kube::new(&server.kubeconfig("admin"), &ns);
    kube.create_namespace();
    let dir = node_dir("kl-outage");
    let node = Node::start(&dir, &server.kubeconfig("admin"), "kl-outage");
    let history = fresh_history(&dir);
    kube.create_template(template("web", "1"));
    let daemon = start_podstamp(
        &dir,
        &server,
        &ns,
        &node,
        &[
            "--resync",
            "1s",
            "--revisions-dir",
            history.to_str().unwrap(),
        ],
    );
    let first = new_revision(&node, &daemon, None);
    wait_ready_revision(&kube, &node, &daemon, &first, "VERSION=1");
    wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&first]);
    let mirror = format!("web-{}", node.name);
    let manifest = node.manifests().join("web.yaml");
    let kept_dir = history.join(format!("{ns}_web"));
    let running = node.running(&mirror);
    let on_disk = || {
        let mut files = vec![identity(&manifest)];
        files.extend(
            kept_revisions(&kept_dir)
                .iter()
                .map(|f| identity(&kept_dir.join(f))),
        );
        files.push(identity(&history.join("rollout-states.jsonl")));
        files
    };
    let before = on_disk();

    // The control plane goes away under the node and the daemon.
    server.kill();
    converge("both watches restarted", &node, &daemon, || {
        (daemon.metric("podstamp_watch_restarts_total{watch=\"podtemplates\"}") >= 1.0
            && daemon.metric("podstamp_watch_restarts_total{watch=\"pods\"}") >= 1.0)
            .then_some(())
    });
    // Every template rendered again, several times, without the API.
    wait_renders(&node, &daemon, 3.0);
    daemon.assert_running();
    assert_eq!(daemon.get("/healthz").unwrap().0, 200);
    assert_eq!(on_disk(), before, "nothing on disk changes");
    let still: Vec<String> = node.running(&mirror).into_iter().map(|c| c.id).collect();
    assert_eq!(
        still,
        running.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        "the same container keeps running"
    );
    let log = daemon.logs();
    assert!(log.contains("the API server may be unreachable"), "{log}");
    assert!(
        !log.contains("rollout failed"),
        "no verdict for want of a status:\n{log}"
    );

    // Back: the daemon follows the mirror pods again and updates flow.
    server = ApiServer::start(&api_dir);
    let kube = Kube::new(&server.kubeconfig("admin"), &ns);
    set_version(&kube, "2");
    let second = new_revision(&node, &daemon, Some(&first));
    wait_ready_revision(&kube, &node, &daemon, &second, "VERSION=2");
    wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&second]);
    assert_eq!(kubelet_files(&node), ["web.yaml"]);

    stop_all(daemon, node, &dir);
    server.kill();
    let _ = fs::remove_dir_all(&api_dir);
}

#[test]
fn podstamp_killed_mid_update_leaves_whole_manifests_and_converges_after_restart() {
    let _serial = serial();
    let (server, ns, kube, dir, node) = on_node("klkill", "kl-kill");
    let history = fresh_history(&dir);
    let flags = [
        "--revisions-dir",
        history.to_str().unwrap(),
        "--revision-history",
        "2",
    ];
    kube.create_template(template("web", "1"));
    let mut daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-1.log");
    let mut revision = new_revision(&node, &daemon, None);
    wait_ready_revision(&kube, &node, &daemon, &revision, "VERSION=1");
    let mirror = format!("web-{}", node.name);
    let manifest = node.manifests().join("web.yaml");
    let kept_dir = history.join(format!("{ns}_web"));
    let torn = ".podstamp-web.yaml.999999.0.tmp";
    for version in ["2", "3", "4"] {
        set_version(&kube, version);
        if version == "3" {
            // Killed with the new revision in place, before its verdict.
            let written = new_revision(&node, &daemon, Some(&revision));
            let log = daemon.logs();
            drop(daemon);
            assert!(
                !log.lines()
                    .any(|l| l.contains("rollout succeeded") && l.contains(&written)),
                "killed before the verdict:\n{log}"
            );
        } else {
            // Killed as the change arrives: before, while or after it writes.
            drop(daemon);
        }
        // Only whole manifests where the kubelet reads.
        assert_eq!(kubelet_files(&node), ["web.yaml"]);
        kubelet_accepts(&[&manifest], &node.name);
        if version == "4" {
            // What a kill in the middle of a write leaves: a torn temp
            // file, in the kubelet's directory and in the history.
            let text = fs::read(&manifest).unwrap();
            let half = &text[..text.len() / 2];
            fs::write(node.manifests().join(torn), half).unwrap();
            fs::write(
                kept_dir.join(".podstamp-00000009-torn.yaml.999999.0.tmp"),
                half,
            )
            .unwrap();
        }
        daemon = start_podstamp_logged(
            &dir,
            server,
            &ns,
            &node,
            &flags,
            &format!("podstamp-{version}.log"),
        );
        let next = new_revision(&node, &daemon, Some(&revision));
        wait_ready_revision(&kube, &node, &daemon, &next, &format!("VERSION={version}"));
        // Confirmed, and announced as podstamp's own rollout, also when the
        // killed daemon wrote it.
        wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&next]);
        if version == "4" {
            assert!(
                daemon.logs().contains("removed stale temporary files"),
                "{}",
                daemon.logs()
            );
        }
        revision = next;
    }

    // The torn files were never read, and are gone.
    let all: Vec<String> = fs::read_dir(node.manifests())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(all, ["web.yaml"], "only the manifest, no temp file");
    let kubelet_log = fs::read_to_string(dir.join("kubelet.log")).unwrap();
    assert!(
        !kubelet_log.contains("Could not process manifest file"),
        "the kubelet read a file that is not a whole manifest:\n{}",
        node.logs()
    );
    // Every container the kubelet ran for it came from a whole manifest.
    for c in node.containers().iter().filter(|c| c.pod_name == mirror) {
        let version = ["1", "2", "3", "4"]
            .iter()
            .filter(|v| c.has_env(&format!("VERSION={v}")))
            .count();
        assert!(
            version == 1 && c.has_env("NODE=kl-kill") && c.has_env("HOST=kl-kill"),
            "{c:?}"
        );
    }
    // The history: at most 2, the newest the manifest in place, each file
    // the revision its name says, no temp file; the rollout state says the
    // latest revision succeeded and nothing is pending or held.
    let kept = kept_revisions(&kept_dir);
    assert!(!kept.is_empty() && kept.len() <= 2, "{kept:?}");
    assert!(kept.last().unwrap().ends_with(&format!("-{revision}.yaml")));
    assert_eq!(
        fs::read(kept_dir.join(kept.last().unwrap())).unwrap(),
        fs::read(&manifest).unwrap()
    );
    for file in &kept {
        let text = fs::read_to_string(kept_dir.join(file)).unwrap();
        let named = revision_of(&text).unwrap();
        assert!(file.ends_with(&format!("-{named}.yaml")), "{file}: {named}");
    }
    let mut others: Vec<String> = fs::read_dir(&kept_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !kept.contains(n))
        .collect();
    others.sort();
    assert!(others.is_empty(), "only revisions: {others:?}");
    assert_eq!(rollout_state(&kept_dir), json!({"good": revision}));

    // The check above can see a torn manifest: one without the dot is
    // reported by the kubelet.
    let text = fs::read(&manifest).unwrap();
    fs::write(node.manifests().join("torn.yaml"), &text[..text.len() / 2]).unwrap();
    converge("the kubelet to refuse torn.yaml", &node, &daemon, || {
        let log = fs::read_to_string(dir.join("kubelet.log")).ok()?;
        log.lines()
            .any(|l| l.contains("Could not process manifest file") && l.contains("torn.yaml"))
            .then_some(())
    });
    fs::remove_file(node.manifests().join("torn.yaml")).unwrap();

    stop_all(daemon, node, &dir);
}

#[test]
fn a_restart_mid_rollout_still_rolls_back_and_a_held_revision_stays_held() {
    let _serial = serial();
    let (server, ns, kube, dir, node) = on_node("klresume", "kl-resume");
    let history = fresh_history(&dir);
    let flags = [
        "--revisions-dir",
        history.to_str().unwrap(),
        "--resync",
        "1s",
    ];
    kube.create_template(template("web", "1"));
    let daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-1.log");
    let good = new_revision(&node, &daemon, None);
    wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
    wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&good]);
    let kept_dir = history.join(format!("{ns}_web"));
    let manifest = node.manifests().join("web.yaml");
    let mirror = format!("web-{}", node.name);

    // A container that exits 1, written; podstamp killed before the verdict.
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "command": ["sh", "-c", "exit 1"]}]}}}),
    );
    let crashing = new_revision(&node, &daemon, Some(&good));
    let log = daemon.logs();
    drop(daemon);
    assert!(
        !log.contains("rollout failed"),
        "killed before the verdict:\n{log}"
    );

    // Restarted: it resumes from the manifest in place, the history and the
    // mirror pod, and rolls back.
    let daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-2.log");
    wait_event(
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
    wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
    let state = rollout_state(&kept_dir);
    assert_eq!(
        (&state["good"], &state["held"], &state["failed"]["revision"]),
        (&json!(good), &json!(crashing), &json!(crashing)),
        "the failure the other nodes were told of is kept too: {state:#}"
    );
    assert!(daemon.stop().success());

    // Restarted again: the failed revision, still what the template
    // renders, is not written again.
    let in_place = identity(&manifest);
    let container = node.running(&mirror)[0].id.clone();
    let daemon = start_podstamp_logged(&dir, server, &ns, &node, &flags, "podstamp-3.log");
    wait_renders(&node, &daemon, 3.0);
    assert_eq!(
        identity(&manifest),
        in_place,
        "the held revision was written"
    );
    assert_eq!(
        daemon.metric("podstamp_renders_total{result=\"written\"}"),
        0.0
    );
    let running: Vec<String> = node.running(&mirror).into_iter().map(|c| c.id).collect();
    assert_eq!(running, [container]);

    // Until the template changes.
    set_version(&kube, "2");
    let next = new_revision(&node, &daemon, Some(&good));
    assert_ne!(next, crashing);
    wait_ready_revision(&kube, &node, &daemon, &next, "VERSION=2");
    wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&next]);
    let state = rollout_state(&kept_dir);
    assert_eq!(
        (&state["good"], &state["held"], &state["failed"]["revision"]),
        (&json!(next), &Value::Null, &json!(crashing)),
        "nothing held; the last failure is still the one told: {state:#}"
    );
    assert_eq!(kubelet_files(&node), ["web.yaml"]);

    stop_all(daemon, node, &dir);
}

/// Three real kubelets on one machine, each with its podstamp: an update
/// rolls through them one at a time (each node's new container Ready, for
/// the 10 s that make a success, before the next node writes: checked from
/// the times each step was seen), and an update whose container crashes
/// stops at the first node, is rolled back there, and is never written on
/// the other two.
#[test]
fn three_kubelets_roll_an_update_one_node_at_a_time_and_stop_on_a_crash() {
    let _serial = serial();
    let server = shared_server();
    let ns = unique("kl3");
    let kube = Kube::new(&server.kubeconfig("admin"), &ns);
    kube.create_namespace();
    kube.create_template(template("web", "1"));
    let mut nodes = Vec::new();
    for name in ["kl-r1", "kl-r2", "kl-r3"] {
        let dir = node_dir(name);
        let node = Node::start(&dir, &server.kubeconfig("admin"), name);
        let daemon = start_podstamp(&dir, server, &ns, &node, &["--slot-lease-duration", "5s"]);
        nodes.push((dir, node, daemon));
    }
    let mut good = Vec::new();
    for (_, node, daemon) in &nodes {
        let revision = new_revision(node, daemon, None);
        wait_ready_revision(&kube, node, daemon, &revision, "VERSION=1");
        good.push(revision);
    }

    // VERSION=2: when each node wrote it, and when its mirror pod was Ready
    // with it, as seen by polling every 50 ms.
    set_version(&kube, "2");
    let started = std::time::Instant::now();
    let mut written: Vec<Option<Duration>> = vec![None; 3];
    let mut ready: Vec<Option<Duration>> = vec![None; 3];
    wait_for(
        "VERSION=2 Ready on the three nodes",
        Duration::from_secs(300),
        || {
            for (i, (_, node, daemon)) in nodes.iter().enumerate() {
                daemon.assert_running();
                let text =
                    fs::read_to_string(node.manifests().join("web.yaml")).unwrap_or_default();
                if written[i].is_none() && revision_of(&text).is_some_and(|r| r != good[i]) {
                    written[i] = Some(started.elapsed());
                }
                let mirror = kube.pod(&format!("web-{}", node.name));
                let on_new = revision_of(&text).filter(|r| *r != good[i]);
                if ready[i].is_none()
                    && let (Some(pod), Some(revision)) = (&mirror, &on_new)
                    && mirror_revision(pod) == Some(revision.as_str())
                    && is_ready(pod)
                {
                    ready[i] = Some(started.elapsed());
                }
            }
            ready.iter().all(Option::is_some).then_some(())
        },
    );
    let mut steps: Vec<(Duration, Duration)> = written
        .iter()
        .zip(&ready)
        .map(|(w, r)| (w.unwrap(), r.unwrap()))
        .collect();
    steps.sort();
    for pair in steps.windows(2) {
        // The next node wrote only after the previous one was Ready (and,
        // 10 s later, freed its slot).
        assert!(
            pair[1].0 > pair[0].1,
            "two nodes updating at once: {steps:?}"
        );
    }
    let updated: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, node, daemon))| new_revision(node, daemon, Some(&good[i])))
        .collect();
    for (i, (_, node, daemon)) in nodes.iter().enumerate() {
        wait_event(&kube, node, daemon, "RolloutSucceeded", &[&updated[i]]);
    }

    // A container that exits 1: one node writes it, the kubelet's
    // CrashLoopBackOff rolls it back there, and the others never write it.
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "command": ["sh", "-c", "exit 1"]}]}}}),
    );
    let first = wait_for("a node writing the crashing revision", CONVERGE, || {
        nodes.iter().position(|(_, node, _)| {
            fs::read_to_string(node.manifests().join("web.yaml"))
                .unwrap_or_default()
                .contains("exit 1")
        })
    });
    let (_, node, daemon) = &nodes[first];
    wait_event(
        &kube,
        node,
        daemon,
        "RolloutFailed",
        &["CrashLoopBackOff", "rolled back"],
    );
    wait_ready_revision(&kube, node, daemon, &updated[first], "VERSION=2");
    for (i, (_, node, daemon)) in nodes.iter().enumerate() {
        if i == first {
            continue;
        }
        wait_event(&kube, node, daemon, "RolloutHalted", &[&node.name]);
        let text = fs::read_to_string(node.manifests().join("web.yaml")).unwrap();
        assert_eq!(
            revision_of(&text).as_deref(),
            Some(updated[i].as_str()),
            "{text}"
        );
    }
    for (dir, node, daemon) in nodes {
        stop_all(daemon, node, &dir);
    }
}

/// Waits for the manifest to hold `revision` again and a container of it
/// with `env` to run, as the CRI shows it (the API server may be down).
fn wait_running_on_node(node: &Node, daemon: &Daemon, revision: &str, env: &str) {
    let mirror = format!("web-{}", node.name);
    let what =
        format!("revision {revision} in the manifest and {env} running (seen through the CRI)");
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, ROLLOUT, || {
            daemon.assert_running();
            let text = fs::read_to_string(node.manifests().join("web.yaml")).ok()?;
            let running = node.running(&mirror);
            (revision_of(&text).as_deref() == Some(revision)
                && running.len() == 1
                && running[0].has_env(env))
            .then_some(())
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

/// The opening of the API-down tests: an API server of the test's own
/// (killed and started again by PID; the shared one must stay up for other
/// tests), a node, podstamp with a history directory and the node's CRI
/// socket, and the template `web` at VERSION=1 confirmed Ready
/// (`RolloutSucceeded`): the good revision a bad one is rolled back to.
struct Offline {
    api_dir: PathBuf,
    server: ApiServer,
    ns: String,
    dir: PathBuf,
    node: Node,
    history: PathBuf,
    daemon: Daemon,
    good: String,
}

impl Offline {
    /// `name` names the node, its directory and the API server's; `log` is
    /// podstamp's first log in the node's directory.
    fn start(name: &str, log: &str) -> Offline {
        let api_dir = common::repo().join(format!("target/kubelet-tests/{name}-api"));
        let _ = fs::remove_dir_all(&api_dir);
        let server = ApiServer::start(&api_dir);
        let ns = unique(&name.replace('-', ""));
        let kube = Kube::new(&server.kubeconfig("admin"), &ns);
        kube.create_namespace();
        let dir = node_dir(name);
        let node = Node::start(&dir, &server.kubeconfig("admin"), name);
        let history = fresh_history(&dir);
        kube.create_template(template("web", "1"));
        write_config(&dir);
        node_kubeconfig(&dir, &server, &ns, name);
        let daemon = offline_podstamp(&dir, &ns, &node, &history, log);
        let good = new_revision(&node, &daemon, None);
        wait_ready_revision(&kube, &node, &daemon, &good, "VERSION=1");
        wait_event(&kube, &node, &daemon, "RolloutSucceeded", &[&good]);
        Offline {
            api_dir,
            server,
            ns,
            dir,
            node,
            history,
            daemon,
            good,
        }
    }

    /// The admin's client of the API server as it is now.
    fn kube(&self) -> Kube {
        Kube::new(&self.server.kubeconfig("admin"), &self.ns)
    }

    /// The template's rollout state directory in the history.
    fn kept(&self) -> PathBuf {
        self.history.join(format!("{}_web", self.ns))
    }

    /// The template's container patched to `container` (merged into the
    /// one named main), and the new revision podstamp writes for it.
    fn change(&self, container: Value, old: &str) -> String {
        let mut main = container;
        main["name"] = json!("main");
        self.kube()
            .patch_template("web", json!({"template": {"spec": {"containers": [main]}}}));
        new_revision(&self.node, &self.daemon, Some(old))
    }

    /// The API server stopped (SIGKILL, by its PID).
    fn api_down(&mut self) {
        self.server.kill();
    }

    /// The API server started again on the same directory and URL.
    fn api_up(&mut self) -> Kube {
        self.server = ApiServer::start(&self.api_dir);
        self.kube()
    }

    /// Everything stopped, each cleanly, and the directories removed.
    fn stop(self) {
        let mut server = self.server;
        stop_all(self.daemon, self.node, &self.dir);
        server.kill();
        let _ = fs::remove_dir_all(&self.api_dir);
    }
}

/// podstamp on the files an [`Offline`] scene's first start wrote (needs no
/// API server, as a daemon restarted while it is down): resync every
/// second, the scene's history directory, the node's CRI socket.
fn offline_podstamp(dir: &Path, ns: &str, node: &Node, history: &Path, log: &str) -> Daemon {
    let socket = node.dir.join("run/containerd.sock");
    let flags = [
        "--resync",
        "1s",
        "--revisions-dir",
        history.to_str().unwrap(),
        "--cri-socket",
        socket.to_str().unwrap(),
    ];
    restart_podstamp(dir, ns, node, &flags, log)
}

/// The API server stops (SIGKILL, by its PID) right after a bad revision
/// (a container that exits 1) is written: the mirror pod cannot be followed,
/// so podstamp judges the revision from the node itself (the container
/// runtime's CRI: exited non-zero, restarted by the kubelet), rolls it back
/// and holds it, all with the API down; the good container runs again (seen
/// through the CRI). Once the API server is back (same directory, same
/// URL), the `RolloutFailed` Event kept on disk is published and `podstamp
/// status` shows the failed revision. The same for an image the node does
/// not have (`ImageNotPresent`, from the runtime's ImageStatus).
#[test]
fn with_the_api_server_down_a_bad_revision_is_rolled_back_from_the_node_itself() {
    let _serial = serial();
    let mut scene = Offline::start("kl-local", "podstamp.log");
    let good = scene.good.clone();
    let crashing = scene.change(
        json!({"command": ["sh", "-c", "exit 1"],
            "env": [{"name": "VERSION", "value": "bad"}]}),
        &good,
    );
    scene.api_down();

    let (node, daemon) = (&scene.node, &scene.daemon);
    wait_running_on_node(node, daemon, &good, "VERSION=1");
    let log = daemon.logs();
    assert!(
        log.contains("seen on the node")
            && log.contains(&format!("rolled back to revision {good}")),
        "{log}"
    );
    let kept = scene.kept();
    assert_eq!(
        rollout_state(&kept)["held"].as_str(),
        Some(crashing.as_str())
    );
    assert!(
        kept.join("events.json").exists(),
        "the RolloutFailed Event is kept for later\n{log}"
    );

    // Back: the Event kept on disk is published, and the status shows the
    // failed revision held.
    let kube = scene.api_up();
    let (node, daemon) = (&scene.node, &scene.daemon);
    let note = wait_event(
        &kube,
        node,
        daemon,
        "RolloutFailed",
        &[
            &crashing,
            "CrashLoopBackOff",
            &format!("rolled back to revision {good}"),
            "reported once the API server answered again",
        ],
    );
    assert!(note.contains("exited with code 1"), "{note}");
    converge("the Events kept on disk published", node, daemon, || {
        (!kept.join("events.json").exists()).then_some(())
    });
    let ns = &scene.ns;
    let view = converge(
        "the failed revision in podstamp status",
        node,
        daemon,
        || {
            let view = status_json(&scene.server, ns, &rollouts(ns));
            let failed = view["templates"][0]["nodes"][0]["failed"].clone();
            (failed["revision"].as_str() == Some(crashing.as_str())).then_some(view)
        },
    );
    assert!(view.to_string().contains("CrashLoopBackOff"), "{view:#}");
    wait_ready_revision(&kube, node, daemon, &good, "VERSION=1");

    // An image the node does not have (imagePullPolicy Never): no container
    // is ever created; the runtime's ImageStatus says it is not there.
    let missing = scene.change(
        json!({"image": "podstamp.test/missing:1", "command": ["sleep", "3600"],
            "env": [{"name": "VERSION", "value": "missing"}]}),
        &good,
    );
    assert_ne!(missing, crashing);
    scene.api_down();
    wait_running_on_node(&scene.node, &scene.daemon, &good, "VERSION=1");
    assert_eq!(
        rollout_state(&kept)["held"].as_str(),
        Some(missing.as_str())
    );
    let kube = scene.api_up();
    wait_event(
        &kube,
        &scene.node,
        &scene.daemon,
        "RolloutFailed",
        &[
            &missing,
            "ImageNotPresent",
            "podstamp.test/missing:1",
            &format!("rolled back to revision {good}"),
        ],
    );
    scene.stop();
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The pods' own probes decide while the API server is down: a revision
/// whose readiness probe (tcpSocket, on the node's 127.0.0.1: the pod is
/// hostNetwork) passes is confirmed from the node itself, and one whose
/// readiness probe never passes (nothing listens on its port) fails with
/// `ProbeFailed` and is rolled back to it; each time the API server was
/// stopped (SIGKILL, by its PID) right after the revision was written.
/// Both Events are published once it is back.
#[test]
fn with_the_api_server_down_the_pods_own_probes_confirm_or_fail_a_revision() {
    let _serial = serial();
    let mut scene = Offline::start("kl-probe", "podstamp.log");
    let kept = scene.kept();

    // A server on the node's 127.0.0.1, and a readiness probe on its port.
    let port = free_port();
    let serving = scene.change(
        json!({"command": ["/bin/busybox", "httpd", "-f", "-p", format!("127.0.0.1:{port}"), "-h", "/"],
            "env": [{"name": "VERSION", "value": "2"}],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}),
        &scene.good,
    );
    scene.api_down();
    converge(
        "the serving revision confirmed from the node",
        &scene.node,
        &scene.daemon,
        || (rollout_state(&kept)["good"].as_str() == Some(serving.as_str())).then_some(()),
    );
    wait_running_on_node(&scene.node, &scene.daemon, &serving, "VERSION=2");

    // A readiness probe that never passes: nothing listens on its port.
    scene.api_up();
    let closed = free_port();
    let unready = scene.change(
        json!({"env": [{"name": "VERSION", "value": "3"}],
            "readinessProbe": {"tcpSocket": {"port": closed}, "periodSeconds": 1,
                "failureThreshold": 3}}),
        &serving,
    );
    scene.api_down();
    wait_running_on_node(&scene.node, &scene.daemon, &serving, "VERSION=2");
    assert_eq!(
        rollout_state(&kept)["held"].as_str(),
        Some(unready.as_str())
    );

    let kube = scene.api_up();
    wait_event(
        &kube,
        &scene.node,
        &scene.daemon,
        "RolloutSucceeded",
        &[&serving, "reported once the API server answered again"],
    );
    let note = wait_event(
        &kube,
        &scene.node,
        &scene.daemon,
        "RolloutFailed",
        &[
            &unready,
            "ProbeFailed",
            &format!("127.0.0.1:{closed}"),
            &format!("rolled back to revision {serving}"),
        ],
    );
    assert!(note.contains("readiness"), "{note}");
    scene.stop();
}

/// podstamp killed with -9 while a bad revision (a container that exits 1)
/// is in place and the API server is down, then started again with the API
/// server still down: it follows the revision in place from its rollout
/// state alone (`pending`: its own write), judges it from the node itself
/// and rolls it back, before the API server answers again.
#[test]
fn killed_while_the_api_server_is_down_podstamp_still_rolls_back_after_a_restart() {
    let _serial = serial();
    let mut scene = Offline::start("kl-offline", "podstamp-1.log");
    let good = scene.good.clone();
    let kept = scene.kept();
    let crashing = scene.change(
        json!({"command": ["sh", "-c", "exit 1"],
            "env": [{"name": "VERSION", "value": "bad"}]}),
        &good,
    );
    scene.api_down();
    let log = scene.daemon.logs();
    // SIGKILL (the Daemon's drop), before any verdict.
    drop(scene.daemon);
    assert!(
        !log.contains("rollout failed"),
        "killed before the verdict:\n{log}"
    );
    assert_eq!(
        rollout_state(&kept)["pending"].as_str(),
        Some(crashing.as_str())
    );

    // Started again, the API server still down: the same flags and files
    // as the first start (which made them while the API answered).
    scene.daemon = offline_podstamp(
        &scene.dir,
        &scene.ns,
        &scene.node,
        &scene.history,
        "podstamp-2.log",
    );
    wait_running_on_node(&scene.node, &scene.daemon, &good, "VERSION=1");
    let log = scene.daemon.logs();
    assert!(
        log.contains("seen on the node")
            && log.contains(&format!("rolled back to revision {good}")),
        "{log}"
    );
    assert_eq!(
        rollout_state(&kept)["held"].as_str(),
        Some(crashing.as_str())
    );

    // Back: the Event kept on disk is published, and the failed revision
    // stays held (the template still renders it).
    let kube = scene.api_up();
    wait_event(
        &kube,
        &scene.node,
        &scene.daemon,
        "RolloutFailed",
        &[
            &crashing,
            "CrashLoopBackOff",
            &format!("rolled back to revision {good}"),
            "reported once the API server answered again",
        ],
    );
    wait_ready_revision(&kube, &scene.node, &scene.daemon, &good, "VERSION=1");
    let text = fs::read_to_string(scene.node.manifests().join("web.yaml")).unwrap();
    assert_eq!(revision_of(&text).as_deref(), Some(good.as_str()));
    scene.stop();
}
