//! Rollouts across nodes against the real kube-apiserver of the harness:
//! three `podstamp run` daemons, each for a node of its own, coordinating
//! through Leases, and `podstamp status` reading what they report.
//!
//! The kubelets here are played by the test: it writes each node's mirror
//! pod (`<pod>-<node>`, with the kubelet's annotations and the revision
//! label copied from the manifest) and its status, Ready or crashing, the
//! way the kubelet reports them. That makes every step of a rollout the
//! test's to decide, so each check is of a state (who wrote what, who
//! waits), never of a timing. tests/kubelet.rs runs real kubelets.
//!
//! Each daemon runs as a node of a cluster podstamp is deployed to:
//! deploy/'s RBAC and admission policies applied (tests/common/deploy.rs,
//! for the test's namespace, with the Leases in `<namespace>-rollouts`),
//! with a token of deploy/'s ServiceAccount bound to its own Node.

mod common;
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::deploy::Deploy;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use support::*;

/// A revision must stay Ready this long on a node to succeed (10 s),
/// then the slot goes to the next node.
const STEP: Duration = Duration::from_secs(60);

impl Kube {
    fn create_node(&self, name: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = serde_json::from_value(json!({"metadata": {"name": name,
                // `scene`: what a template of this test's alone selects.
                "labels": {"zone": "z1", "scene": self.ns}}}))
        .unwrap();
        self.rt
            .block_on(nodes.create(&PostParams::default(), &node))
            .unwrap();
    }

    fn create_template(&self, image: &str, max_unavailable: &str) {
        let template = serde_json::from_value(json!({
            "metadata": {"name": "web", "labels": {"podstamp.io/enabled": "true"},
                "annotations": {"podstamp.io/max-unavailable": max_unavailable, "podstamp.io/progress-deadline": "5m"}},
            "template": {"spec": {"containers": [{"name": "main", "image": image}]}}
        }))
        .unwrap();
        self.rt
            .block_on(self.templates().create(&PostParams::default(), &template))
            .unwrap();
    }

    fn set_image(&self, image: &str) {
        let patch =
            json!({"template": {"spec": {"containers": [{"name": "main", "image": image}]}}});
        self.rt
            .block_on(self.templates().patch(
                "web",
                &PatchParams::default(),
                &Patch::Strategic(patch),
            ))
            .unwrap();
    }

    fn annotate(&self, key: &str, value: &str) {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.rt
            .block_on(
                self.templates()
                    .patch("web", &PatchParams::default(), &Patch::Merge(patch)),
            )
            .unwrap();
    }

    /// Plays node `node`'s kubelet: its mirror pod of `revision`, Ready or
    /// crashing (CrashLoopBackOff, last exit code 1).
    fn kubelet_reports(&self, node: &str, revision: &str, ready: bool) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let name = format!("web-{node}");
        // A changed static pod is a new mirror pod, as the kubelet makes it.
        let _ = self
            .rt
            .block_on(pods.delete(&name, &DeleteParams::default().grace_period(0)));
        wait_for("the old mirror pod gone", STEP, || {
            self.rt
                .block_on(pods.get_opt(&name))
                .unwrap()
                .is_none()
                .then_some(())
        });
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name,
                "labels": {"podstamp.io/revision": revision},
                "annotations": {"kubernetes.io/config.mirror": revision,
                    "podstamp.io/source": format!("{}/web", self.ns)}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "web"}]}
        }))
        .unwrap();
        self.rt
            .block_on(pods.create(&PostParams::default(), &pod))
            .unwrap();
        let status = if ready {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        } else {
            json!({"phase": "Running", "containerStatuses": [{"name": "main", "ready": false,
                "restartCount": 2, "image": "web", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
                "lastState": {"terminated": {"exitCode": 1}}}]})
        };
        self.rt
            .block_on(pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            ))
            .unwrap();
    }
}

struct NodeUnderTest {
    name: String,
    dir: PathBuf,
    daemon: Daemon,
}

impl NodeUnderTest {
    fn manifest(&self) -> String {
        fs::read_to_string(self.dir.join("web.yaml")).unwrap_or_default()
    }

    /// Writes this node's daemon sent to the API server (any resource),
    /// from its own count, `podstamp_api_requests_total`.
    fn api_writes(&self) -> f64 {
        ["create", "update", "patch", "delete"]
            .iter()
            .flat_map(|verb| {
                ["leases", "events"].map(|resource| {
                    self.daemon.metric(&format!(
                        "podstamp_api_requests_total{{resource=\"{resource}\",verb=\"{verb}\"}}"
                    ))
                })
            })
            .sum()
    }

    fn revision(&self) -> String {
        let text = self.manifest();
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("podstamp.io/revision:"))
            .unwrap_or_else(|| panic!("no revision in {text}"));
        line.split(':')
            .nth(1)
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_string()
    }
}

/// Where a scene's rollout Leases are.
fn rollouts(ns: &str) -> String {
    format!("{ns}-rollouts")
}

/// `podstamp status -o json`, parsed.
fn status(server: &ApiServer, ns: &str) -> Value {
    status_json(server, ns, &rollouts(ns))
}

/// Each node's phase of template web, by node name.
fn phases(view: &Value) -> Vec<(String, String)> {
    view["templates"][0]["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|n| {
                    (
                        n["node"].as_str().unwrap().to_string(),
                        n["phase"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn start(server: &ApiServer, ns: &str, tmp: &Path, config: &Path, name: &str) -> NodeUnderTest {
    let dir = tmp.join(format!("manifests-{name}"));
    fs::create_dir(&dir).unwrap();
    start_again(server, ns, tmp, config, name, dir)
}

/// Waits until exactly `n` nodes have `image` in their manifest, checking
/// on the way that no node writes it while another one is updating.
fn wait_written(nodes: &[NodeUnderTest], image: &str, n: usize) -> Vec<usize> {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| written(nodes, image, n)));
    found.unwrap_or_else(|_| {
        let logs: Vec<String> = nodes
            .iter()
            .map(|n| format!("{}:\n{}", n.name, n.daemon.logs()))
            .collect();
        panic!("{n} node(s) with {image}: timed out\n{}", logs.join("\n"))
    })
}

/// Plays `node`'s kubelet reporting its revision in place crashing, and
/// waits until its daemon has rolled it back to `image` (the change was
/// web:3); the daemon's log in the panic if it never does.
fn crash_until_rolled_back(kube: &Kube, node: &NodeUnderTest, image: &str) {
    kube.kubelet_reports(&node.name, &node.revision(), false);
    let rolled_back = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("web:3 rolled back on the first node", STEP, || {
            node.manifest()
                .contains(&format!("image: {image}"))
                .then_some(())
        })
    }));
    if rolled_back.is_err() {
        panic!("not rolled back:\n{}", node.daemon.logs());
    }
}

fn written(nodes: &[NodeUnderTest], image: &str, n: usize) -> Vec<usize> {
    wait_for(&format!("{n} node(s) with {image}"), STEP, || {
        for node in nodes {
            node.daemon.assert_running();
        }
        let with: Vec<usize> = (0..nodes.len())
            .filter(|i| nodes[*i].manifest().contains(&format!("image: {image}")))
            .collect();
        assert!(
            with.len() <= n,
            "{image} written on {with:?}, expected at most {n}"
        );
        (with.len() == n).then_some(with)
    })
}

/// Three (or `n`) nodes with their daemons, template web on `image`
/// installed on each (first installs are not held back: every node writes
/// at once) and reported Ready by its kubelet.
struct Scene {
    kube: Kube,
    ns: String,
    tmp: tempfile::TempDir,
    config: PathBuf,
    nodes: Vec<NodeUnderTest>,
}

fn scene(server: &ApiServer, prefix: &str, n: usize, max_unavailable: &str) -> Scene {
    scene_with(server, prefix, n, max_unavailable, |tmp, _| {
        write_config(tmp)
    })
}

/// [`scene`], node `i`'s daemon configured by `config_of(tmp, i)` (the
/// scene's `config` is node 0's).
fn scene_with(
    server: &ApiServer,
    prefix: &str,
    n: usize,
    max_unavailable: &str,
    config_of: impl Fn(&Path, usize) -> PathBuf,
) -> Scene {
    let ns = unique(prefix);
    let kube = Kube::admin(server, &ns);
    let tmp = tempfile::tempdir().unwrap();
    // Every file written before any daemon starts: a daemon reading its
    // configuration while another node's is written would see it half
    // written.
    let configs: Vec<PathBuf> = (0..n).map(|i| config_of(tmp.path(), i)).collect();
    let config = configs[0].clone();
    kube.create_template("web:1", max_unavailable);
    let names: Vec<String> = (1..=n).map(|i| unique(&format!("{prefix}{i}"))).collect();
    for name in &names {
        kube.create_node(name);
    }
    let deploy = Deploy::new(&server.kubeconfig("admin"), &ns, &rollouts(&ns));
    kube.rt.block_on(deploy.apply(&kube.client, &names[0]));
    let mut nodes = Vec::new();
    for (name, config) in names.iter().zip(&configs) {
        let token = kube.rt.block_on(deploy.token(&kube.client, name));
        deploy.kubeconfig(&token, &node_kubeconfig(tmp.path(), name));
        nodes.push(start(server, &ns, tmp.path(), config, name));
    }
    wait_written(&nodes, "web:1", n);
    for node in &nodes {
        kubelet_accepts(&[&node.dir], &node.name);
        kube.kubelet_reports(&node.name, &node.revision(), true);
    }
    // Each node's own phase: with per-node settings the nodes' targets
    // differ, and the summary counts the nodes on one of them.
    wait_for("every node ready on web:1", STEP, || {
        let phases = phases(&status(server, &ns));
        (phases.len() == n && phases.iter().all(|(_, p)| p == "ready")).then_some(())
    });
    Scene {
        kube,
        ns,
        tmp,
        config,
        nodes,
    }
}

#[test]
fn an_update_rolls_one_node_at_a_time_and_a_failure_halts_it_everywhere() {
    let server = shared_server();
    // `tmp` holds every node's directories: bound, not dropped here.
    let Scene {
        kube,
        ns,
        nodes,
        tmp: _tmp,
        ..
    } = scene(server, "roll", 3, "1");

    // A good update: one node at a time.
    kube.set_image("web:2");
    let mut done: Vec<usize> = Vec::new();
    for step in 1..=3 {
        let with = wait_written(&nodes, "web:2", step);
        let new: Vec<usize> = with.iter().copied().filter(|i| !done.contains(i)).collect();
        assert_eq!(new.len(), 1, "{with:?} after {done:?}");
        let updating = &nodes[new[0]];
        // The others that have not written it wait for the slot.
        let view = wait_for("the others waiting", STEP, || {
            let view = status(server, &ns);
            let phases = phases(&view);
            let waiting = phases.iter().filter(|(_, p)| p == "waiting").count();
            (waiting == 3 - step).then_some(view)
        });
        assert_eq!(view["templates"][0]["updated"], step, "{view:#}");
        kube.kubelet_reports(&updating.name, &updating.revision(), true);
        done.push(new[0]);
    }
    let view = wait_for("every node ready on web:2", STEP, || {
        let view = status(server, &ns);
        (view["templates"][0]["ready"] == 3).then_some(view)
    });
    assert_eq!(view["templates"][0]["pending"], 0, "{view:#}");

    // Nothing rolls now: no node writes to the API server. Each did while
    // it rolled (its slot, its status, its Events), as its own count says;
    // a slot still held would be renewed within a third of its 5 s lease.
    std::thread::sleep(Duration::from_secs(1));
    let writes: Vec<f64> = nodes.iter().map(NodeUnderTest::api_writes).collect();
    assert!(writes.iter().all(|n| *n > 0.0), "{writes:?}");
    std::thread::sleep(Duration::from_secs(4));
    let idle: Vec<f64> = nodes.iter().map(NodeUnderTest::api_writes).collect();
    assert_eq!(idle, writes, "API writes while nothing rolls");

    // A bad update: the first node's container crashes; it is rolled back
    // there and no other node writes it.
    kube.set_image("web:3");
    let with = wait_written(&nodes, "web:3", 1);
    let first = &nodes[with[0]];
    crash_until_rolled_back(&kube, first, "web:2");
    let view = wait_for("the others halted", STEP, || {
        let view = status(server, &ns);
        let phases = phases(&view);
        let halted = phases.iter().filter(|(_, p)| p == "halted").count();
        (halted == 2).then_some(view)
    });
    assert_eq!(view["templates"][0]["failed"], 1, "{view:#}");
    for node in &nodes {
        assert!(
            node.manifest().contains("image: web:2"),
            "{}: {}",
            node.name,
            node.manifest()
        );
    }
    let table = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args([
            "status",
            "-n",
            &ns,
            "web",
            "--rollout-namespace",
            &rollouts(&ns),
        ])
        .args(["--kubeconfig"])
        .arg(server.kubeconfig("admin"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("CrashLoopBackOff") && table.contains("halted"),
        "{table}"
    );

    // A newer update rolls again.
    kube.set_image("web:4");
    let with = wait_written(&nodes, "web:4", 1);
    let node = &nodes[with[0]];
    kube.kubelet_reports(&node.name, &node.revision(), true);
    wait_written(&nodes, "web:4", 2);
}

/// Node `i`'s configuration: write_config's, with a `vars` of its own
/// in the substitute plugin's settings (as each control-plane member's
/// address would be), so each node's chain, and target, is its own.
fn per_node_config(tmp: &Path, i: usize) -> PathBuf {
    let common = fs::read_to_string(write_config(tmp)).unwrap();
    let own = common.replace(
        "vars: {greeting: hello}",
        &format!("vars: {{greeting: hello-{i}}}"),
    );
    assert_ne!(own, common, "write_config's settings changed: {common}");
    let path = tmp.join(format!("podstamp-{i}.yaml"));
    fs::write(&path, own).unwrap();
    path
}

/// The defect of issue 27/28: nodes whose plugin settings differ roll
/// different targets of one change, and a halt keyed on the target alone
/// let the second node write the change that had failed on the first,
/// once the first was back. The halt is of the change too: a bad change
/// that fails on one node is never written on the other; a fixed change
/// then rolls on both.
#[test]
fn a_change_that_failed_on_one_node_is_never_written_on_one_whose_settings_differ() {
    let server = shared_server();
    let Scene {
        kube,
        ns,
        nodes,
        tmp,
        ..
    } = scene_with(server, "perset", 2, "1", per_node_config);
    let view = status(server, &ns);
    let targets: Vec<&str> = (0..2)
        .map(|i| view["templates"][0]["nodes"][i]["target"].as_str().unwrap())
        .collect();
    assert_ne!(
        targets[0], targets[1],
        "settings differ, targets too: {view:#}"
    );

    // The bad change: written on one node, crashes, rolled back there.
    kube.set_image("web:3");
    let with = wait_written(&nodes, "web:3", 1);
    let (first, second) = (&nodes[with[0]], &nodes[1 - with[0]]);
    crash_until_rolled_back(&kube, first, "web:1");
    // The first node is back, Ready on its good revision: the slot is
    // free, and what keeps the second node from the change is the halt.
    kube.kubelet_reports(&first.name, &first.revision(), true);
    let view = wait_for("the second node halted", STEP, || {
        let view = status(server, &ns);
        let halted = phases(&view)
            .into_iter()
            .any(|(node, phase)| node == second.name && phase == "halted");
        halted.then_some(view)
    });
    let row_of = |node: &str| -> Value {
        view["templates"][0]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == node)
            .cloned()
            .unwrap_or_else(|| panic!("{node} not in {view:#}"))
    };
    let (failed_row, halted_row) = (row_of(&first.name), row_of(&second.name));
    let message = halted_row["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("change ")
            && message.contains(&format!("failed on node {}", first.name)),
        "{halted_row:#}"
    );
    // Not the target that failed: another target of the same change.
    assert_ne!(
        halted_row["wanted"], failed_row["failed"]["target"],
        "{view:#}"
    );
    assert_eq!(view["templates"][0]["failed"], 1, "{view:#}");
    assert!(
        second.daemon.logs().contains("update halted: change "),
        "{}",
        second.daemon.logs()
    );
    // Held there for good: a whole slot lease (5 s) and more after the
    // first node is Ready again, the second has not written it, ever.
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        second.manifest().contains("image: web:1"),
        "{}",
        second.manifest()
    );
    assert!(
        !kept_images(tmp.path(), &second.name).contains("web:3"),
        "the second node wrote the failed change"
    );

    // A fixed change rolls on both.
    kube.set_image("web:4");
    roll_through(&kube, &[&nodes[0], &nodes[1]], "web:4");
    wait_for("both nodes ready on web:4", STEP, || {
        let phases = phases(&status(server, &ns));
        (phases.len() == 2 && phases.iter().all(|(_, p)| p == "ready")).then_some(())
    });
    for node in &nodes {
        assert!(
            node.manifest().contains("image: web:4"),
            "{}",
            node.manifest()
        );
    }
    // The summary counts both, each on its own target of the change.
    let view = wait_for("both counted updated and ready", STEP, || {
        let view = status(server, &ns);
        let t = &view["templates"][0];
        (t["updated"] == 2 && t["ready"] == 2).then_some(view)
    });
    assert_eq!(view["templates"][0]["pending"], 0, "{view:#}");
}

/// The other way a change halt ends: the change was fine, the failing
/// node's own settings were not. Fixed there (its configuration reloaded,
/// no restart), it writes its new target of the change, and once that is
/// confirmed its marker no longer names the change: the other node goes
/// on with the same change.
#[test]
fn a_change_halt_lifts_once_the_failing_node_confirms_it_with_its_own_settings_fixed() {
    let server = shared_server();
    let Scene {
        kube,
        ns,
        nodes,
        tmp,
        ..
    } = scene_with(server, "perfix", 2, "1", per_node_config);
    // The bad change puts the node's own setting in the pod, as a
    // member's address would be: a fix of the setting is a new revision.
    let patch = json!({"template": {"spec": {"containers": [{"name": "main", "image": "web:3",
        "env": [{"name": "GREETING", "value": "${var.greeting}"}]}]}}});
    kube.rt
        .block_on(
            kube.templates()
                .patch("web", &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .unwrap();
    let with = wait_written(&nodes, "web:3", 1);
    let (first, second) = (&nodes[with[0]], &nodes[1 - with[0]]);
    crash_until_rolled_back(&kube, first, "web:1");
    kube.kubelet_reports(&first.name, &first.revision(), true);
    wait_for("the second node halted on the change", STEP, || {
        second
            .daemon
            .logs()
            .contains("update halted: change ")
            .then_some(())
    });
    assert!(second.manifest().contains("image: web:1"));

    // The first node's settings fixed: reloaded, it renders another target
    // of the change, writes it (its own failed target alone is held).
    let config = tmp.path().join(format!("podstamp-{}.yaml", with[0]));
    let text = fs::read_to_string(&config).unwrap();
    let fixed = text.replace(
        &format!("greeting: hello-{}", with[0]),
        &format!("greeting: fixed-{}", with[0]),
    );
    assert_ne!(fixed, text);
    fs::write(&config, fixed).unwrap();
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the fixed target written on the first node", STEP, || {
            first.manifest().contains("image: web:3").then_some(())
        })
    }));
    if written.is_err() {
        panic!("not written:\n{}", first.daemon.logs());
    }
    assert!(second.manifest().contains("image: web:1"), "still halted");
    kube.kubelet_reports(&first.name, &first.revision(), true);
    // Confirmed there (Ready for 10 s): the halt of the change lifts.
    wait_for("the second node writing the change", STEP, || {
        second.manifest().contains("image: web:3").then_some(())
    });
    assert!(
        first
            .daemon
            .logs()
            .contains("the change halts the other nodes no more"),
        "{}",
        first.daemon.logs()
    );
    kube.kubelet_reports(&second.name, &second.revision(), true);
    wait_for("both counted updated and ready on web:3", STEP, || {
        let t = &status(server, &ns)["templates"][0];
        (t["updated"] == 2 && t["ready"] == 2).then_some(())
    });
}

/// Reports Ready for every node that has `image` and was not reported yet,
/// until all of `expected` have it: the rollout walks through them.
fn roll_through(kube: &Kube, nodes: &[&NodeUnderTest], image: &str) {
    let mut reported: Vec<String> = Vec::new();
    while reported.len() < nodes.len() {
        let next = wait_for(&format!("another node writing {image}"), STEP, || {
            for node in nodes {
                node.daemon.assert_running();
            }
            nodes
                .iter()
                .find(|n| {
                    !reported.contains(&n.name) && n.manifest().contains(&format!("image: {image}"))
                })
                .copied()
        });
        kube.kubelet_reports(&next.name, &next.revision(), true);
        reported.push(next.name.clone());
    }
}

/// The images of every revision a node kept (its revision history).
fn kept_images(tmp: &Path, node: &str) -> String {
    let mut all = String::new();
    for entry in fs::read_dir(tmp.join(format!("revisions-{node}"))).unwrap() {
        // The templates' directories; beside them, their rollout states.
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for file in fs::read_dir(dir).unwrap() {
            all.push_str(&fs::read_to_string(file.unwrap().path()).unwrap());
        }
    }
    all
}

#[test]
fn a_killed_slot_holder_delays_the_rollout_by_its_lease_and_a_newer_target_supersedes() {
    let server = shared_server();
    let Scene {
        kube,
        ns,
        tmp,
        config,
        mut nodes,
    } = scene(server, "rollkill", 3, "1");

    // The first node to write web:2 is killed while it holds the slot.
    kube.set_image("web:2");
    let first = wait_written(&nodes, "web:2", 1)[0];
    let killed = nodes.remove(first);
    let (killed_name, killed_dir) = (killed.name.clone(), killed.dir.clone());
    drop(killed.daemon);
    // Its slot expires (5 s without renewal): the next node writes.
    let second = wait_written(&nodes, "web:2", 1)[0];
    assert!(
        nodes[second].daemon.logs().contains("took a rollout slot"),
        "{}",
        nodes[second].daemon.logs()
    );
    // A newer target while the second holds the slot: written with it at
    // once, and the third node never writes web:2.
    kube.set_image("web:3");
    let holder = &nodes[second];
    wait_for("the slot holder on web:3", STEP, || {
        holder.manifest().contains("image: web:3").then_some(())
    });
    let third = &nodes[1 - second];
    assert!(
        third.manifest().contains("image: web:1"),
        "{}",
        third.manifest()
    );
    roll_through(&kube, &[&nodes[0], &nodes[1]], "web:3");
    assert!(
        !kept_images(tmp.path(), &third.name).contains("image: web:2"),
        "{} wrote web:2",
        third.name
    );
    // The killed node, back, catches up to web:3; its web:2 is gone.
    let back = start_again(server, &ns, tmp.path(), &config, &killed_name, killed_dir);
    roll_through(&kube, &[&back], "web:3");
    let view = wait_for("every node ready on web:3", STEP, || {
        let view = status(server, &ns);
        (view["templates"][0]["ready"] == 3).then_some(view)
    });
    assert_eq!(view["templates"][0]["pending"], 0, "{view:#}");

    // Nothing rolls now: no node writes to the API server. Each did while
    // it rolled (its slot, its status, its Events), as its own count says;
    // a slot still held would be renewed within a third of its 5 s lease.
    std::thread::sleep(Duration::from_secs(1));
    let writes: Vec<f64> = nodes.iter().map(NodeUnderTest::api_writes).collect();
    assert!(writes.iter().all(|n| *n > 0.0), "{writes:?}");
    std::thread::sleep(Duration::from_secs(4));
    let idle: Vec<f64> = nodes.iter().map(NodeUnderTest::api_writes).collect();
    assert_eq!(idle, writes, "API writes while nothing rolls");
}

/// Node `name`'s kubeconfig: its token, bound to its Node.
fn node_kubeconfig(tmp: &Path, name: &str) -> PathBuf {
    tmp.join(format!("{name}.kubeconfig"))
}

/// A node's daemon, started (again) on its directories, with its token
/// (on `server`, whose own address the token's kubeconfig names).
fn start_again(
    server: &ApiServer,
    ns: &str,
    tmp: &Path,
    config: &Path,
    name: &str,
    dir: PathBuf,
) -> NodeUnderTest {
    let _ = server;
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            node_kubeconfig(tmp, name).to_str().unwrap(),
            "--namespace",
            ns,
            "--rollout-namespace",
            &rollouts(ns),
            "--node-name",
            name,
            "--manifest-dir",
            dir.to_str().unwrap(),
            "--revisions-dir",
            tmp.join(format!("revisions-{name}")).to_str().unwrap(),
            "--slot-lease-duration",
            "5s",
        ],
        tmp.join(format!("podstamp-{name}-{}.log", unique("log"))),
    );
    NodeUnderTest {
        name: name.to_string(),
        dir,
        daemon,
    }
}

/// An API server outage longer than the slot's lease, mid-rollout: its
/// holder could not renew it meanwhile, and keeps it when the API server is
/// back (the others wait a whole lease of watching first); the rollout goes
/// on once the holder's revision is Ready.
#[test]
fn an_api_server_outage_mid_rollout_takes_no_slot_from_its_holder() {
    let state = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(&state.path().join("apiserver"));
    // `tmp` holds every node's directories: bound, not dropped here.
    let Scene {
        kube,
        ns,
        nodes,
        tmp: _tmp,
        ..
    } = scene(&server, "rollapi", 2, "1");
    kube.set_image("web:2");
    let holder = &nodes[wait_written(&nodes, "web:2", 1)[0]];
    let other = nodes.iter().find(|n| n.name != holder.name).unwrap();
    let renewals = |node: &NodeUnderTest| {
        node.daemon
            .metric("podstamp_rollout_api_writes_total{object=\"slot\",result=\"ok\"}")
    };

    // Away for longer than the lease (5 s): nobody can renew or read it.
    server.kill();
    std::thread::sleep(Duration::from_secs(8));
    let before = renewals(holder);
    server = ApiServer::start(&state.path().join("apiserver"));
    let renewed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the holder renewing its slot again", STEP, || {
            holder.daemon.assert_running();
            (renewals(holder) > before).then_some(())
        })
    }));
    if renewed.is_err() {
        panic!("no renewal by {}:\n{}", holder.name, holder.daemon.logs());
    }
    // More than a lease later, the slot is still the holder's.
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        other.manifest().contains("image: web:1"),
        "{} wrote web:2 while {} held the slot:\n{}",
        other.name,
        holder.name,
        other.daemon.logs()
    );
    let view = status(&server, &ns);
    let phases = phases(&view);
    assert!(
        phases.contains(&(other.name.clone(), "waiting".to_string())),
        "{view:#}"
    );
    // The holder's revision Ready: the other node goes on.
    let kube = Kube::new(&server.kubeconfig("admin"), &ns);
    kube.kubelet_reports(&holder.name, &holder.revision(), true);
    wait_written(&nodes, "web:2", 2);
}

#[test]
fn with_two_slots_two_nodes_update_at_once_and_the_third_waits() {
    let server = shared_server();
    // `tmp` holds every node's directories: bound, not dropped here.
    let Scene {
        kube,
        ns,
        nodes,
        tmp: _tmp,
        ..
    } = scene(server, "roll2", 3, "2");
    // `status --watch` follows the rollout: it prints again on each change.
    let mut watching = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args(["status", "-n", &ns, "--rollout-namespace", &rollouts(&ns)])
        .args(["--watch", "--kubeconfig"])
        .arg(server.kubeconfig("admin"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let printed = printed.clone();
        let mut stdout = watching.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                printed
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    kube.set_image("web:2");
    // Two write it with no Ready in between; the third waits.
    let two = wait_written(&nodes, "web:2", 2);
    let third = (0..3).find(|i| !two.contains(i)).unwrap();
    wait_for("the third waiting", STEP, || {
        phases(&status(server, &ns))
            .contains(&(nodes[third].name.clone(), "waiting".to_string()))
            .then_some(())
    });
    kube.kubelet_reports(&nodes[two[0]].name, &nodes[two[0]].revision(), true);
    wait_written(&nodes, "web:2", 3);
    // It shows the third node waiting (for 10 s at least: the Ready
    // report must last), then every node updated.
    wait_for("status --watch showing every node updated", STEP, || {
        printed
            .lock()
            .unwrap()
            .lines()
            .any(|l| l.starts_with(&format!("{ns}/web")) && l.contains(" 3/3 "))
            .then_some(())
    });
    let _ = watching.kill();
    let _ = watching.wait();
    reader.join().unwrap();
    let text = printed.lock().unwrap().clone();
    let tables: Vec<&str> = text.split("\n\n").collect();
    assert!(tables.len() >= 2, "status --watch printed once:\n{text}");
    assert!(tables.iter().any(|t| t.contains("waiting")), "{text}");
    assert!(tables[0].starts_with("TEMPLATE"), "{text}");
}

/// Finding 9 of the second security review, against the real API server:
/// node status Leases written by someone other than their node (a
/// generation of i64::MAX in a node's own record; a record in another
/// node's name) are shown by `podstamp status` as untrusted, and the
/// template's target and generation stay the honest node's.
#[test]
fn status_shows_records_it_cannot_trust_as_such_not_as_the_newest() {
    use k8s_openapi::api::coordination::v1::Lease;
    let server = shared_server();
    let ns = unique("forged");
    let kube = Kube::admin(server, &ns);
    // Where `podstamp status --rollout-namespace <ns>` reads the records.
    let leases: Api<Lease> = Api::namespaced(
        kube.client.clone(),
        &podstamp::config::default_status_namespace(&ns),
    );
    let record = |target: &str, generation: i64| {
        json!({"version": 1, "templates": {format!("{ns}/web"): {
            "revision": format!("rev-{target}"), "target": target, "wanted": target,
            "generation": generation, "phase": "ready", "since": "2026-12-06T00:00:00Z"}}})
        .to_string()
    };
    let create = |name: &str, holder: &str, record: String| {
        let lease = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"podstamp.io/lease": "node-status"},
                "annotations": {"podstamp.io/status": record}},
            "spec": {"holderIdentity": holder}}))
        .unwrap();
        kube.rt
            .block_on(leases.create(&PostParams::default(), &lease))
            .unwrap();
    };
    create("podstamp-node.n1", "n1", record("t2", 2));
    create("podstamp-node.n2", "n2", record("evil", i64::MAX));
    create("podstamp-node.n3", "n1", record("evil", 3));

    let view = status_json(server, &ns, &ns);
    let t = &view["templates"][0];
    assert_eq!(
        (
            &t["target"],
            &t["generation"],
            &t["updated"],
            &t["untrusted"]
        ),
        (&json!("t2"), &json!(2), &json!(1), &json!(2)),
        "{view:#}"
    );
    let untrusted = |node: &str| {
        t["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == node)
            .and_then(|n| n["untrusted"].as_str())
            .unwrap_or_else(|| panic!("{node} is not listed as untrusted: {view:#}"))
            .to_string()
    };
    assert!(
        untrusted("n2").contains("claims generation 9223372036854775807"),
        "{view:#}"
    );
    assert!(
        untrusted("podstamp-node.n3").contains("is held by n1, whose record is podstamp-node.n1"),
        "{view:#}"
    );
    let table = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args([
            "status",
            "-n",
            &ns,
            "--rollout-namespace",
            &ns,
            "--kubeconfig",
        ])
        .arg(server.kubeconfig("admin"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("UNTRUSTED: node n2 claims generation 9223372036854775807"),
        "{table}"
    );
}

/// A node whose status record was deleted and made again by someone else
/// (without the label the daemons' watch selects, with another holder)
/// gets a conflict on its own create: it reads the record back by name and
/// replaces it, rather than fall silent for good.
#[test]
fn a_node_whose_record_was_remade_by_someone_else_writes_its_own_again() {
    use k8s_openapi::api::coordination::v1::Lease;
    let server = shared_server();
    let scene = scene(server, "remade", 1, "1");
    let node = &scene.nodes[0];
    // The records' namespace, beside the rollout one.
    let records = podstamp::config::default_status_namespace(&rollouts(&scene.ns));
    let leases: Api<Lease> = Api::namespaced(scene.kube.client.clone(), &records);
    let name = format!("podstamp-node.{}", node.name);
    let rt = &scene.kube.rt;
    let forged: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "someone-else"}}))
    .unwrap();
    // The daemon may make its record again between the two calls: then
    // both are tried again (a bounded number of times).
    let remade = (0..20).any(|_| {
        let _ = rt.block_on(leases.delete(&name, &DeleteParams::default()));
        rt.block_on(leases.create(&PostParams::default(), &forged))
            .is_ok()
    });
    assert!(remade, "could not make {name} in the daemon's place");
    scene.kube.set_image("web:2");
    wait_written(&scene.nodes, "web:2", 1);
    wait_for("the node's own record again", STEP, || {
        let lease = rt.block_on(leases.get(&name)).ok()?;
        let holder = lease.spec.as_ref()?.holder_identity.clone()?;
        let labelled =
            lease.metadata.labels.as_ref().is_some_and(|l| {
                l.get("podstamp.io/lease").map(String::as_str) == Some("node-status")
            });
        let record = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("podstamp.io/status"))
            .cloned()
            .unwrap_or_default();
        (holder == node.name && labelled && record.contains(&node.revision())).then_some(())
    });
}

/// Finding 5 of the second security review, against a real API server of
/// its own: a thousand status Leases of 200 KiB each, written by someone
/// who may write Leases in the rollout namespace (named and held as honest
/// nodes' records, each listing hundreds of failed templates of other
/// namespaces), are listed by a daemon that starts among them. The list is
/// read in small pages and each record cut to what the halt rule needs,
/// so the daemon's peak memory stays far under the DaemonSet's 256 MiB
/// limit, and its rollout goes on (none of the forged failures is for its
/// template).
#[test]
fn a_thousand_forged_records_leave_a_starting_daemon_within_its_memory() {
    use futures::{StreamExt, stream};
    use k8s_openapi::api::coordination::v1::Lease;
    const RECORDS: usize = 1000;
    const FAILURES: usize = 700;
    const LIMIT_MIB: u64 = 256;

    let state = tempfile::tempdir().unwrap();
    let server = ApiServer::start(&state.path().join("apiserver"));
    let mut scene = scene(&server, "flood", 1, "1");
    let node = scene.nodes.remove(0);
    let (name, dir) = (node.name.clone(), node.dir.clone());
    let baseline = peak_rss_mib(node.daemon.pid());

    let failure = |i: usize| {
        json!({"target": format!("t{i}"), "revision": format!("r{i}"), "reason": "CrashLoopBackOff",
            "message": "x".repeat(200), "at": "2026-12-06T00:00:00Z"})
    };
    let record = json!({"version": 1, "templates": (0..FAILURES)
        .map(|i| (format!("other/t{i}"), json!({"phase": "halted", "failed": failure(i)})))
        .collect::<serde_json::Map<_, _>>()})
    .to_string();
    assert!(
        (200 << 10..256 << 10).contains(&record.len()),
        "{}",
        record.len()
    );
    let leases: Api<Lease> = Api::namespaced(scene.kube.client.clone(), &rollouts(&scene.ns));
    let made: Vec<bool> = scene.kube.rt.block_on(
        stream::iter(0..RECORDS)
            .map(|i| {
                let (leases, record) = (leases.clone(), record.clone());
                async move {
                    let holder = format!("forged-{i}");
                    let lease: Lease = serde_json::from_value(json!({
                        "metadata": {"name": format!("podstamp-node.{holder}"),
                            "labels": {"podstamp.io/lease": "node-status"},
                            "annotations": {"podstamp.io/status": record}},
                        "spec": {"holderIdentity": holder}}))
                    .unwrap();
                    leases.create(&PostParams::default(), &lease).await.is_ok()
                }
            })
            .buffer_unordered(8)
            .collect(),
    );
    assert!(made.iter().all(|ok| *ok), "not every forged Lease was made");

    // Started among them: its first list reads them all.
    node.daemon.stop();
    let node = start_again(
        &server,
        &scene.ns,
        scene.tmp.path(),
        &scene.config,
        &name,
        dir,
    );
    scene.kube.set_image("web:2");
    // A slot is taken only after the first complete list of the Leases.
    let nodes = [node];
    wait_written(&nodes, "web:2", 1);
    let peak = peak_rss_mib(nodes[0].daemon.pid());
    println!(
        "peak RSS: {baseline} MiB before the forged records, {peak} MiB after listing {RECORDS} of {} KiB",
        record.len() >> 10
    );
    assert!(
        peak < LIMIT_MIB / 2,
        "the daemon peaked at {peak} MiB listing {RECORDS} forged records (limit {LIMIT_MIB} MiB; {baseline} MiB before)"
    );
}

/// The peak resident memory of process `pid` (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"));
    kib >> 10
}

/// A quorum member (`podstamp.io/quorum: "true"`, etcd or the API servers)
/// is never down on two nodes at once: a slot holder that stops renewing
/// keeps its slot (it may be the member that is down), and a holder whose
/// revision failed keeps it until the revision rolled back to is Ready,
/// even when a newer target comes meanwhile.
#[test]
fn a_quorum_member_is_never_replaced_on_a_second_node_while_one_is_unconfirmed() {
    let server = shared_server();
    let Scene {
        kube,
        ns,
        tmp,
        config,
        mut nodes,
    } = scene(server, "rollquorum", 3, "1");
    kube.annotate("podstamp.io/quorum", "true");

    // The first node to write web:2 is killed while it holds the slot:
    // three lease durations later (5 s each) no other node wrote it.
    kube.set_image("web:2");
    let first = wait_written(&nodes, "web:2", 1)[0];
    let killed = nodes.remove(first);
    let (killed_name, killed_dir) = (killed.name.clone(), killed.dir.clone());
    drop(killed.daemon);
    std::thread::sleep(Duration::from_secs(15));
    for node in &nodes {
        node.daemon.assert_running();
        assert!(
            node.manifest().contains("image: web:1"),
            "{} wrote web:2 while {killed_name} was unconfirmed:\n{}",
            node.name,
            node.daemon.logs()
        );
    }
    // Back, it keeps its slot; its revision Ready, the others follow.
    let back = start_again(server, &ns, tmp.path(), &config, &killed_name, killed_dir);
    wait_for("the restarted holder on web:2", STEP, || {
        back.manifest().contains("image: web:2").then_some(())
    });
    kube.kubelet_reports(&back.name, &back.revision(), true);
    roll_through(&kube, &[&nodes[0], &nodes[1]], "web:2");
    nodes.push(back);
    wait_for("every node ready on web:2", STEP, || {
        (status(server, &ns)["templates"][0]["ready"] == 3).then_some(())
    });

    // web:3 fails on the first node to write it: rolled back to web:2, and
    // its slot is kept until web:2 is Ready there again. A newer target
    // (web:4) meanwhile is written by that node alone.
    kube.set_image("web:3");
    let first = &nodes[wait_written(&nodes, "web:3", 1)[0]];
    crash_until_rolled_back(&kube, first, "web:2");
    kube.set_image("web:4");
    wait_for("the slot holder on web:4", STEP, || {
        first.manifest().contains("image: web:4").then_some(())
    });
    std::thread::sleep(Duration::from_secs(10));
    for node in nodes.iter().filter(|n| n.name != first.name) {
        assert!(
            node.manifest().contains("image: web:2"),
            "{} wrote web:4 while {} was unconfirmed:\n{}",
            node.name,
            first.name,
            node.daemon.logs()
        );
    }
    kube.kubelet_reports(&first.name, &first.revision(), true);
    let others: Vec<&NodeUnderTest> = nodes.iter().filter(|n| n.name != first.name).collect();
    roll_through(&kube, &others, "web:4");
}

/// `podstamp.io/max-unavailable: 50%` of the four nodes the template's
/// `podstamp.io/node-selector` selects (the shared API server has many
/// more): two at once, rounded up as the DaemonSet controller does, and
/// the others wait.
#[test]
fn a_percentage_is_of_the_nodes_the_template_is_for() {
    let server = shared_server();
    let Scene {
        kube,
        ns,
        nodes,
        tmp: _tmp,
        ..
    } = scene(server, "rollpct", 4, "1");
    kube.annotate("podstamp.io/node-selector", &format!("scene={ns}"));
    kube.annotate("podstamp.io/max-unavailable", "50%");
    kube.set_image("web:2");
    let two = wait_written(&nodes, "web:2", 2);
    wait_for("the other two waiting for one of 2 slots", STEP, || {
        let view = status(server, &ns);
        let waiting = phases(&view)
            .into_iter()
            .filter(|(_, p)| p == "waiting")
            .count();
        (waiting == 2).then_some(())
    });
    for node in nodes
        .iter()
        .filter(|n| !two.iter().any(|i| nodes[*i].name == n.name))
    {
        let logs = node.daemon.logs();
        assert!(
            logs.contains("at most 2 node(s) updating at once"),
            "{}:\n{logs}",
            node.name
        );
    }
    roll_through(&kube, &nodes.iter().collect::<Vec<_>>(), "web:2");
    wait_written(&nodes, "web:2", 4);
}
