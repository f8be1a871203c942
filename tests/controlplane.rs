//! A self-hosted control plane against the real kubelet: the harness's API
//! server run by the kubelet of `podstamp-node` as a static pod, its
//! PodTemplate stored in itself, rendered for the node by `podstamp run`
//! (see tests/controlplane/support.rs for how it comes up, kubelet first).
//!
//! What counts: the container the kubelet runs (through the CRI), the API
//! server answering again with every object made before a change, and what
//! podstamp reports once it is back (`podstamp status`, Events). The API
//! downtime of a change made through podstamp is printed next to the same
//! change made by hand (the rendered manifest copied into place), in one
//! run; nothing timed is asserted.
//!
//! Needs `bash tests/harness/build.sh`, `bash plugins/build.sh` and the
//! Debian packages containerd, runc and busybox-static (`bash tests/run.sh`
//! installs them). Runs as root, holding the machine's kubelet lock.

mod common;
#[path = "controlplane/support.rs"]
mod controlplane;
#[path = "kubelet/support.rs"]
mod node;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::{Value, json};

use controlplane::{COME_UP, Downtime, NS, SelfHosted, TEMPLATE, apiserver_template, render};
use node::{leftovers, serial};
use support::{Daemon, Kube, wait_for};

/// A rollout: the kubelet's restart of a changed static pod (10–15 s), the
/// server's start, then 10 s of Ready before podstamp calls it a success.
const ROLLOUT: Duration = Duration::from_secs(180);

/// The node's directory, fixed per test so that the next run sweeps what a
/// killed one left (symlinks resolved, as in the mount table).
fn node_dir(name: &str) -> PathBuf {
    let dir = common::repo().join("target/kubelet-tests").join(name);
    fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

fn create_configmap(kube: &Kube, name: &str) {
    let api: Api<ConfigMap> = Api::namespaced(kube.client.clone(), NS);
    let cm = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"made": name}}))
        .unwrap();
    kube.rt
        .block_on(api.create(&Default::default(), &cm))
        .unwrap();
}

fn configmaps(kube: &Kube) -> Vec<String> {
    let api: Api<ConfigMap> = Api::namespaced(kube.client.clone(), NS);
    let mut names: Vec<String> = kube
        .rt
        .block_on(api.list(&Default::default()))
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("made-"))
        .collect();
    names.sort();
    names
}

/// The command of the template with podstamp-apiserver `flags`.
fn command(control: &SelfHosted, flags: &[&str]) -> Value {
    apiserver_template(&control.state, control.port, flags)["template"]["spec"]["containers"][0]
        ["command"]
        .clone()
}

/// Waits until the kubelet runs the API server with `flag` (the node's
/// name filled in) and it answers again, Ready in its mirror pod; how long
/// after `since` it answered, and its mirror pod was Ready.
fn wait_running_with(
    control: &SelfHosted,
    flag: &str,
    daemon: Option<&Daemon>,
    since: Instant,
) -> (Duration, Duration) {
    let external = format!("--external-hostname={}", control.node.name);
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("the API server running with {flag}"),
            COME_UP,
            || {
                if let Some(daemon) = daemon {
                    daemon.assert_running();
                }
                let args = control.running_args()?;
                (args.iter().any(|a| a == flag) && args.contains(&external)).then_some(())
            },
        )
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "containers: {:#?}\n{}\npodstamp's log:\n{}",
            control.node.containers(),
            control.node.logs(),
            daemon.map(Daemon::logs).unwrap_or_default()
        )
    });
    control.wait_answering(COME_UP);
    let answering = since.elapsed();
    control.wait_registered();
    (answering, since.elapsed())
}

/// The revision of the manifest podstamp wrote.
fn revision(control: &SelfHosted) -> Option<String> {
    let text =
        fs::read_to_string(control.node.manifests().join(format!("{TEMPLATE}.yaml"))).ok()?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
        .map(|v| v.trim_matches('"').to_string())
}

/// Waits for an Event `reason` on the template that names `revision`.
fn wait_event(control: &SelfHosted, daemon: &Daemon, reason: &str, revision: &str) -> String {
    use k8s_openapi::api::events::v1::Event;
    let kube = control.admin();
    let api: Api<Event> = Api::namespaced(kube.client.clone(), NS);
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("Event {reason} of {revision}"), ROLLOUT, || {
            daemon.assert_running();
            let events = kube.rt.block_on(api.list(&Default::default())).ok()?.items;
            events.into_iter().find_map(|e| {
                let note = e.note.clone().unwrap_or_default();
                (e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(TEMPLATE)
                    && note.contains(revision))
                .then_some(note)
            })
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "containers: {:#?}\n{}\npodstamp's log:\n{}",
            control.node.containers(),
            control.node.logs(),
            daemon.logs()
        )
    })
}

/// Waits until `podstamp status` shows the node `phase` on `revision`.
fn wait_status(control: &SelfHosted, daemon: &Daemon, phase: &str, revision: &str) -> Value {
    let mut last = Value::Null;
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("podstamp status: {phase} on {revision}"),
            ROLLOUT,
            || {
                daemon.assert_running();
                last = control.status();
                (last["phase"] == phase && last["revision"] == revision).then(|| last.clone())
            },
        )
    }));
    found.unwrap_or_else(|_| panic!("last status: {last:#}\npodstamp's log:\n{}", daemon.logs()))
}

#[test]
fn a_good_change_of_the_self_hosted_api_server_is_rolled_out_confirmed_and_keeps_its_objects() {
    let _serial = serial();
    let name = "cp-good";
    let dir = node_dir(name);
    let control = SelfHosted::bootstrap(&dir, name, &["--v=0"], |kube| {
        create_configmap(kube, "made-before-the-node")
    });
    // The kubelet runs it, with the node's name rendered in.
    wait_running_with(&control, "--v=0", None, Instant::now());
    let admin = control.admin();
    create_configmap(&admin, "made-before-by-hand");

    // By hand: the manifest podstamp would write for --v=1 (rendered from
    // the template as the API server would store it), copied into place
    // (renamed in, as an operator's `install` does).
    let to_v1 = json!({"template": {"spec": {"containers": [{"name": TEMPLATE, "command": command(&control, &["--v=1"])}]}}});
    let by_hand_template = control.patched_template(to_v1.clone());
    let by_hand_file = dir.join("by-hand.yaml");
    render(
        &dir,
        &by_hand_template,
        name,
        &control.config,
        &by_hand_file,
    );
    let watch = Downtime::watch(&control.api.kubeconfig("admin"));
    std::thread::sleep(Duration::from_millis(500));
    let manifest = control.node.manifests().join(format!("{TEMPLATE}.yaml"));
    let copied = control.node.manifests().join(".by-hand.tmp");
    fs::copy(&by_hand_file, &copied).unwrap();
    let by_hand_start = Instant::now();
    fs::rename(&copied, &manifest).unwrap();
    let by_hand_back = wait_running_with(&control, "--v=1", None, by_hand_start);
    let (by_hand, by_hand_outages) = watch.stop();

    // The stored template says the same now, and podstamp starts: the file
    // in place is its own and unchanged, so the API server keeps running.
    admin.patch_template(TEMPLATE, to_v1);
    let before = control.node.running(&control.mirror())[0].id.clone();
    let history = dir.join("history");
    let _ = fs::remove_dir_all(&history);
    let daemon = control.start_podstamp(&history, "podstamp.log");
    let first = revision(&control).expect("the bootstrap manifest has a revision");
    wait_status(&control, &daemon, "ready", &first);
    assert_eq!(
        control.node.running(&control.mirror())[0].id,
        before,
        "podstamp restarted the API server it found up to date\n{}",
        daemon.logs()
    );
    create_configmap(&admin, "made-before-podstamp");

    // Through podstamp: --v=2 in the stored template.
    let watch = Downtime::watch(&control.api.kubeconfig("admin"));
    std::thread::sleep(Duration::from_millis(500));
    let podstamp_start = Instant::now();
    admin.patch_template(
        TEMPLATE,
        json!({"template": {"spec": {"containers": [{"name": TEMPLATE, "command": command(&control, &["--v=2"])}]}}}),
    );
    // podstamp takes the rollout slot (the API is up) and writes.
    wait_for("podstamp's new revision in place", ROLLOUT, || {
        daemon.assert_running();
        revision(&control).filter(|r| *r != first)
    });
    let written = podstamp_start.elapsed();
    let podstamp_back = wait_running_with(&control, "--v=2", Some(&daemon), podstamp_start);
    let (through_podstamp, podstamp_outages) = watch.stop();
    let second = revision(&control).unwrap();
    assert_ne!(second, first);
    // Confirmed through the mirror pod once the API is back.
    let note = wait_event(&control, &daemon, "RolloutSucceeded", &second);
    assert!(note.contains(name), "{note}");
    let status = wait_status(&control, &daemon, "ready", &second);
    assert!(status["failed"].is_null(), "{status:#}");
    // Nothing made before either change is lost.
    assert_eq!(
        configmaps(&admin),
        [
            "made-before-by-hand",
            "made-before-podstamp",
            "made-before-the-node"
        ]
    );
    assert_eq!((by_hand_outages, podstamp_outages), (1, 1));

    let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
    println!(
        "self-hosted API server, a harmless flag changed (--v): API downtime = last ok /readyz of the old server -> first of the new (polled every 50 ms)\n\
         {:<32} {:>9} {:>16} {:>18} {:>18}\n\
         {:<32} {:>9} {:>16} {:>18} {:>18}\n\
         {:<32} {:>9} {:>16} {:>18} {:>18}\n\
         downtime ratio podstamp / by hand: {:.2}",
        "change",
        "downtime",
        "change->written",
        "change->answering",
        "change->mirror Ready",
        "by hand (manifest copied in)",
        secs(by_hand),
        "0.00s",
        secs(by_hand_back.0),
        secs(by_hand_back.1),
        "podstamp (PodTemplate patched)",
        secs(through_podstamp),
        secs(written),
        secs(podstamp_back.0),
        secs(podstamp_back.1),
        through_podstamp.as_secs_f64() / by_hand.as_secs_f64()
    );

    assert!(daemon.stop().success());
    let SelfHosted { mut node, .. } = control;
    let cgroup_root = node.cgroup_root.clone();
    let status = node.stop().unwrap();
    assert!(status.success(), "teardown: {status}\n{}", node.logs());
    assert_eq!(leftovers(&dir, &cgroup_root), Vec::<String>::new());
    let _ = fs::remove_dir_all(&dir);
}
