//! `kubelet`: a template change until the real kubelet runs the new
//! container, side by side in the same run with the kubelet's own floor: the
//! same change made by hand, a manifest renamed into the kubelet's
//! directory.
//!
//! One node (`podstamp-node` from tests/harness: containerd and the kubelet,
//! registered with the bench's API server), held under the machine-wide node
//! lock of the kubelet tests while it runs and torn down by its `Drop` (by
//! PID). Two pods run on it at once: `agent`, from a PodTemplate through
//! podstamp (the 3-plugin chain), and `floor`, a manifest the bench writes
//! itself (podstamp never touches a file without its source annotation).
//! The two are updated in turn, so both see the same machine.
//!
//! "Running" is the moment the new container's process starts: its command
//! creates a file named after its `VERSION` in a hostPath directory that the
//! bench watches with inotify, in the same loop as the renames into the
//! manifest directory. That splits podstamp's figure into its own share
//! (change → manifest renamed into place) and the kubelet's (renamed →
//! running), the latter to compare with the floor.
//!
//! Two shapes of change: an update of a pod that runs (the kubelet stops the
//! old instance and starts the new one only at its next pod-worker retry,
//! about 10–15 s later: that back-off is in both figures), and a new pod (a
//! template created, against a new manifest file), which has no back-off,
//! so a few ms stand out against the kubelet's ~0.3–0.5 s.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inotify::WatchMask;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::bench::Bench;
use crate::node::{Node, Serial, leftovers, serial};
use crate::observe::{Renames, time_to_ready};
use crate::report::{Samples, ms, verdict};
use crate::support::Daemon;
use crate::{READY_LIMIT, common};

/// How long one change may take until its container runs before it counts
/// as lost: the kubelet's retry of a changed static pod is 10–15 s.
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// How long a removed pod's container may take to stop.
const STOP_LIMIT: Duration = Duration::from_secs(60);
const NODE: &str = "bench-kubelet";

impl Bench {
    /// `updates` of each shape, podstamp and the floor in turn.
    pub fn kubelet(&mut self, updates: usize) {
        println!(
            "\n== template change -> new container running, real kubelet ({updates} changes each) =="
        );
        let Some((node_dir, lock)) = node_bench(NODE) else {
            return;
        };
        let ns = self.namespace("kubelet");
        let node = Node::start(&node_dir, &self.server.kubeconfig("admin"), NODE);
        let manifests = node.manifests();
        let started = self.dir("kubelet/started").canonicalize().unwrap();
        let config = kubelet_config(&self.root.join("kubelet"));
        let kubeconfig = self.server.kubeconfig("admin");
        let daemon = Daemon::start_binary(
            &self.binary,
            &[
                "--config",
                config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &ns,
                "--node-name",
                NODE,
                "--manifest-dir",
                manifests.to_str().unwrap(),
                "--cache-dir",
                self.cache.to_str().unwrap(),
            ],
            self.root.join("logs").join(format!("{NODE}.log")),
            "warn",
        );
        if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            return;
        }
        let mut run = Run {
            bench: self,
            ns: &ns,
            node: &node,
            manifests: &manifests,
            started: &started,
            events: Renames::watch_for(
                &[manifests.clone(), started.clone()],
                WatchMask::MOVED_TO | WatchMask::CREATE,
            ),
        };
        let new = run.new_pods(updates);
        let update = run.updates(updates);
        drop(daemon);

        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        for (title, shape) in [
            ("a new pod (template created / new manifest file)", &new),
            (
                "an update of a running pod (the kubelet's retry included)",
                &update,
            ),
        ] {
            println!("  {title}:");
            shape.podstamp.row("podstamp: change -> running");
            shape.written.row("  of which change -> manifest");
            shape.kubelet.row("  of which manifest -> running");
            shape.floor.row("floor: rename by hand -> running");
            shape.verdicts();
        }
        println!(
            "  \"running\": the new container's process has started (it creates a file named after its VERSION in a hostPath directory, seen with inotify)"
        );
        println!(
            "  load average after: {}",
            fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        let mut node = node;
        let status = node.stop();
        let left = leftovers(&node_dir, &node.cgroup_root);
        println!(
            "  node torn down: {}{}",
            status.map_or("?".into(), |s| s.to_string()),
            if left.is_empty() {
                String::new()
            } else {
                format!(", LEFT BEHIND: {left:?}")
            }
        );
        drop(lock);
    }
}

/// What one shape of change measured.
#[derive(Default)]
struct Shape {
    /// podstamp: API request → new container running.
    podstamp: Samples,
    /// podstamp: API request → manifest renamed into place.
    written: Samples,
    /// podstamp: manifest renamed into place → new container running.
    kubelet: Samples,
    /// The floor: manifest renamed into place by hand → container running.
    floor: Samples,
}

impl Shape {
    fn verdicts(&self) {
        let pair = |q| self.podstamp.percentile(q).zip(self.floor.percentile(q));
        let diff = |(p, f): (Duration, Duration)| {
            let d = p.as_secs_f64() - f.as_secs_f64();
            format!("{:+.1} ms", d * 1e3)
        };
        if let (Some(p50), Some(p99)) = (pair(0.5), pair(0.99)) {
            println!("    podstamp - floor: p50 {}, p99 {}", diff(p50), diff(p99));
        }
        if let Some(own) = self.written.percentile(0.99) {
            let lost = self.podstamp.lost + self.podstamp.errors.len();
            println!(
                "    target: podstamp adds < 50 ms at p99 over the floor: its own share (change -> manifest) p99 {} ({})",
                ms(own),
                verdict(own < Duration::from_millis(50) && lost == 0)
            );
        }
        for (name, samples) in [("podstamp", &self.podstamp), ("floor", &self.floor)] {
            if let Some(e) = samples.errors.first() {
                println!("    {name}: first failed change: {e}");
            }
        }
    }
}

/// One node, one daemon, and the inotify watch on its manifest directory
/// (index 0) and on the containers' start files (index 1).
struct Run<'a> {
    bench: &'a Bench,
    ns: &'a str,
    node: &'a Node,
    manifests: &'a Path,
    started: &'a Path,
    events: Renames,
}

impl Run<'_> {
    /// A template created against a new manifest file, each removed again
    /// (and its container gone) before the next.
    fn new_pods(&mut self, n: usize) -> Shape {
        let mut shape = Shape::default();
        for i in 1..=n {
            let name = format!("new-{i:03}");
            let version = format!("NP{i:06}");
            let t0 = Instant::now();
            match self.create_template(&name, &version) {
                Err(e) => shape.podstamp.errors.push(e),
                Ok(()) => {
                    let (written, running) = self.wait(&format!("{name}.yaml"), &version, t0);
                    shape.record(written, running);
                }
            }
            if let Err(e) = self.delete_template(&name) {
                shape.podstamp.errors.push(e);
            }
            self.wait_stopped(&name);

            let name = format!("floor-new-{i:03}");
            let version = format!("NF{i:06}");
            let file = format!("{name}.yaml");
            let t0 = self.write_floor(&name, &file, &version);
            shape.floor.push(self.wait(&file, &version, t0).1);
            let _ = fs::remove_file(self.manifests.join(&file));
            self.wait_stopped(&name);
        }
        shape
    }

    /// `agent` (podstamp) and `floor` (by hand), both running, updated in
    /// turn: each update waits for its new container.
    fn updates(&mut self, n: usize) -> Shape {
        let mut shape = Shape::default();
        let (agent, floor) = ("agent", "floor");
        let t0 = Instant::now();
        let first = self
            .create_template(agent, "P000000")
            .map(|()| self.wait("agent.yaml", "P000000", t0).1);
        let t0 = self.write_floor(floor, "floor.yaml", "F000000");
        let floor_first = self.wait("floor.yaml", "F000000", t0).1;
        if !matches!(first, Ok(Some(_))) || floor_first.is_none() {
            println!(
                "  the first agent or floor container did not run ({first:?}, {floor_first:?}): see {}",
                self.node.dir.display()
            );
            return shape;
        }
        for i in 1..=n {
            let version = format!("P{i:06}");
            let patch = json!({"template": {"spec": {"containers": [
                {"name": "main", "env": [{"name": "VERSION", "value": version}]}]}}});
            let t0 = Instant::now();
            match self.bench.rt.block_on(self.templates().patch(
                agent,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )) {
                Err(e) => shape.podstamp.errors.push(e.to_string()),
                Ok(_) => {
                    let (written, running) = self.wait("agent.yaml", &version, t0);
                    shape.record(written, running);
                }
            }
            let version = format!("F{i:06}");
            let t0 = self.write_floor(floor, "floor.yaml", &version);
            shape.floor.push(self.wait("floor.yaml", &version, t0).1);
        }
        shape
    }

    fn templates(&self) -> Api<k8s_openapi::api::core::v1::PodTemplate> {
        self.bench.templates(self.ns)
    }

    fn create_template(&self, name: &str, version: &str) -> Result<(), String> {
        let object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "labels": {"podstamp.io/enabled": "true"}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(self.started, version, "set-by-arch-image", None)},
        }))
        .unwrap();
        self.bench
            .rt
            .block_on(self.templates().create(&PostParams::default(), &object))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn delete_template(&self, name: &str) -> Result<(), String> {
        self.bench
            .rt
            .block_on(self.templates().delete(name, &DeleteParams::default()))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Writes the floor's manifest for pod `name` into a temporary file of
    /// the manifest directory (the kubelet skips dot files) and renames it
    /// to `file`: the moment just before the rename.
    fn write_floor(&self, name: &str, file: &str, version: &str) -> Instant {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, "labels": {"app": name}},
            "spec": pod_spec(self.started, version, "podstamp.test/busybox:1", Some(NODE)),
        });
        let temp = self.manifests.join(format!(".{file}.bench"));
        fs::write(&temp, serde_norway::to_string(&pod).unwrap()).unwrap();
        let t0 = Instant::now();
        fs::rename(&temp, self.manifests.join(file)).unwrap();
        t0
    }

    /// Waits until the container of `version` starts: since `t0`, when
    /// `file` holding `version` was renamed into the manifest directory and
    /// when the container started (None: not by RUN_LIMIT).
    fn wait(
        &mut self,
        file: &str,
        version: &str,
        t0: Instant,
    ) -> (Option<Duration>, Option<Duration>) {
        let deadline = t0 + RUN_LIMIT;
        let (mut written, mut running) = (None, None);
        while running.is_none() {
            let batch = self.events.next(deadline);
            if batch.is_empty() {
                break;
            }
            for (dir, name, when) in batch {
                if dir == 0
                    && name == file
                    && written.is_none()
                    && fs::read_to_string(self.manifests.join(&name))
                        .is_ok_and(|text| text.contains(version))
                {
                    written = Some(when - t0);
                }
                if dir == 1 && name == version {
                    running = Some(when - t0);
                }
            }
        }
        (written, running)
    }

    /// Until the static pod `name` has no running container, at most
    /// STOP_LIMIT (through the CRI: a few calls of `podstamp-node
    /// containers`, outside any timing).
    fn wait_stopped(&self, name: &str) {
        let mirror = format!("{name}-{NODE}");
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline {
            if self.node.running(&mirror).is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        println!("  {mirror} still runs after {}", ms(STOP_LIMIT));
    }
}

impl Shape {
    fn record(&mut self, written: Option<Duration>, running: Option<Duration>) {
        self.podstamp.push(running);
        self.written.push(written);
        self.kubelet
            .push(written.zip(running).map(|(w, r)| r.saturating_sub(w)));
    }
}

/// The pod of both sides: a busybox that creates `started/VERSION` when it
/// starts and then sleeps, leaving at once on SIGTERM. The template's
/// image is set by arch-image, `NODE` by substitute and `HOST` by node-env;
/// the floor has them written out (`node`).
pub(crate) fn pod_spec(started: &Path, version: &str, image: &str, node: Option<&str>) -> Value {
    let mut env = vec![
        json!({"name": "VERSION", "value": version}),
        json!({"name": "NODE", "value": node.unwrap_or("${node.name}")}),
    ];
    if let Some(node) = node {
        env.push(json!({"name": "HOST", "value": node}));
    }
    json!({
        "hostNetwork": true,
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "started", "hostPath": {"path": started, "type": "Directory"}}],
        "containers": [{
            "name": "main",
            "image": image,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "trap 'exit 0' TERM; : > \"/started/$VERSION\"; sleep 3600 & wait"],
            "env": env,
            "volumeMounts": [{"name": "started", "mountPath": "/started"}],
        }],
    })
}

/// The 3-plugin chain for the node's pods: arch-image picks the harness's
/// busybox image, node-env adds `HOST` from the label the kubelet puts on
/// its Node, substitute fills `${node.name}`.
pub(crate) fn kubelet_config(dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let plugin = |name: &str| common::plugin(name).display().to_string();
    let arch = podstamp::node::host_architecture();
    let path = dir.join("podstamp.yaml");
    fs::write(
        &path,
        format!(
            "plugins:\n\
             \x20 arch-image:\n    path: {}\n    settings: {{images: {{main: {{{arch}: podstamp.test/busybox:1}}}}}}\n    scope: [metadata, spec]\n\
             \x20 node-env:\n    path: {}\n    settings: {{containers: [main], nodeName: \"\", nodeIP: \"\", labels: {{HOST: kubernetes.io/hostname}}}}\n\
             \x20 substitute:\n    path: {}\n    scope: [metadata, spec]\n\
             chain: [arch-image, node-env, substitute]\n\
             limits: {{timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi}}\n",
            plugin("arch-image"),
            plugin("node-env"),
            plugin("substitute"),
        ),
    )
    .unwrap();
    path
}

/// What a part on a real node starts with: none if the node cannot run
/// here (said), else the node's directory and the machine's node lock,
/// waited for. The directory is fixed, outside target/bench-daemon (emptied
/// at start): a node that was SIGKILLed is swept by podstamp-node when it
/// starts on the same directory and name again.
pub(crate) fn node_bench(node: &str) -> Option<(PathBuf, Serial)> {
    if let Some(missing) = missing_node_tools() {
        println!("  left out: {missing}");
        return None;
    }
    println!(
        "  load average before: {}",
        fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let dir = common::repo().join("target/kubelet-bench").join(node);
    fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let waited = Instant::now();
    let lock = serial();
    if waited.elapsed() > Duration::from_secs(1) {
        println!(
            "  waited {} for the machine's node lock (a kubelet test was running)",
            ms(waited.elapsed())
        );
    }
    Some((dir, lock))
}

/// Why a node cannot run here, if it cannot: podstamp-node needs root, the
/// harness build and containerd, runc and busybox-static.
pub(crate) fn missing_node_tools() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the node needs root".into());
    }
    // common::harness_bin, without its assertion.
    let node = std::env::var_os("PODSTAMP_HARNESS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo().join("target/harness"))
        .join("podstamp-node");
    if !node.is_file() {
        return Some(format!(
            "{} is missing: bash tests/harness/build.sh",
            node.display()
        ));
    }
    let missing: Vec<&str> = ["containerd", "runc", "busybox"]
        .into_iter()
        .filter(|tool| {
            !std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not installed: bash tests/harness/node-deps.sh",
            missing.join(", ")
        )
    })
}
