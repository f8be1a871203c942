//! Two control-plane nodes on one machine, kubeadm's external-etcd
//! topology: one etcd outside both nodes (`podstamp-apiserver --etcd-only`,
//! a process of the test), and on each node (`podstamp-node --standalone`,
//! its own directory, name, cgroup root, containerd and kubelet) an API
//! server member run as a host-network static pod on that etcd, rendered by
//! that node's podstamp from the one PodTemplate, marked
//! `podstamp.io/quorum: "true"`, stored in the cluster they serve.
//!
//! Why one external etcd rather than an etcd member per node: the quorum
//! rule is about the members that serve the cluster; with the store outside
//! both nodes, a member's restart takes down only that node's API server
//! (the HA picture: the other one answers meanwhile), and what the test
//! judges is exactly podstamp's part, never two members restarting at once.
//! Two etcd members would make a two-member etcd quorum, which loses its
//! quorum when either is down: a cluster no rollout order could keep up.
//!
//! The members differ only by node, as on real nodes: one port, each on its
//! own node's address. Here the address is a loopback one per node
//! (`127.0.0.2`, `127.0.0.3`), the Node's label [`HOST_LABEL`] (set by the
//! test once the kubelet registered it; given to the bootstrap render with
//! `--node-label`), so `${node.label[…]}` in `--host` and in the probes'
//! `host` (an `httpGet`'s port is an integer no placeholder fills in, and
//! podstamp runs no exec probe: it would judge such a member ready once it
//! runs, before it answers). Not a per-node plugin setting: the chain's
//! settings are part of a rollout's target, so nodes with different
//! settings roll different targets, and a failure on one halts nothing on
//! the other. `${node.name}` is in the state
//! directory's path (`<base>/<node>/api`, a `hostPath`). Both directories
//! hold the same CA, service-account key and port (copied before the second
//! member's first start), so a token one member issues is valid on the
//! other. Each node's kubelet and podstamp talk to their own node's member
//! (kubeadm's `--apiserver-advertise-address`): while it restarts, the node
//! judges from its own evidence (the runtime, and the probes podstamp runs).
//!
//! Invariants: every directory is inside `target/kubelet-tests`, the nodes
//! are torn down before the etcd, everything is stopped by its handle
//! (PID), pass or fail; the caller holds [`crate::node::serial`].
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::common::{deploy::Deploy, harness_bin};
use crate::controlplane::{
    COME_UP, IMAGE, NS, ROLLOUTS, SelfHosted, TEMPLATE, apiserver_on, render_with, write_config,
};
use crate::node::Node;
use crate::support::{ApiServer, Kube, wait_for};

/// The etcd both members store in: `podstamp-apiserver --etcd-only` on its
/// own directory, a process of the test; SIGTERM then SIGKILL on drop.
pub struct Etcd {
    pub dir: PathBuf,
    pub url: String,
    child: Child,
}

impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).unwrap();
        let log = fs::File::create(dir.join("etcd.log")).unwrap();
        let mut child = Command::new(harness_bin("podstamp-apiserver"))
            .arg("--dir")
            .arg(dir)
            .arg("--etcd-only")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start podstamp-apiserver --etcd-only");
        let pid = u64::from(child.id());
        let url = wait_for("the etcd's ready file", Duration::from_secs(60), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "podstamp-apiserver --etcd-only exited with {status}: {}",
                    fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
                );
            }
            let value: Value =
                serde_json::from_str(&fs::read_to_string(dir.join("ready")).ok()?).ok()?;
            (value["pid"].as_u64() == Some(pid)).then(|| value["url"].as_str().unwrap().to_string())
        });
        Etcd {
            dir: dir.to_path_buf(),
            url,
            child,
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // By its PID: SIGTERM (a clean close), SIGKILL if it has not gone in 10 s.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The member's state directory for the node its path is rendered for.
fn member_state(base: &Path) -> String {
    format!("{}/${{node.name}}/api", base.display())
}

/// The API server members' PodTemplate: `podstamp-apiserver` on the etcd
/// at `etcd` with `flags`, on `port` of its node's address, its state in
/// `<base>/<node>/api`, a quorum member. The same for both nodes.
pub fn member_template(base: &Path, etcd: &str, port: u16, flags: &[&str]) -> Value {
    let state = member_state(base);
    let mut args = vec!["--etcd-servers", etcd, "--host", HOST];
    args.extend_from_slice(flags);
    let mut template = apiserver_on(&state, HOST, port, &args);
    template["metadata"]["annotations"] = json!({"podstamp.io/quorum": "true"});
    template
}

/// The Node label that says its member's address.
pub const HOST_LABEL: &str = "podstamp.test/host";
/// The member's address in the template.
const HOST: &str = "${node.label[podstamp.test/host]}";

/// Each node's address: its member's `--host`.
pub const HOSTS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];

/// The two control-plane nodes of one test, and the etcd they share.
/// Fields drop in order: the nodes (their teardown stops the members)
/// before the etcd.
pub struct TwoMembers {
    pub members: [SelfHosted; 2],
    pub etcd: Etcd,
    pub base: PathBuf,
    /// The members' one port.
    pub port: u16,
}

/// What the second member takes from the first: the CA (clients trust
/// both), the service-account key (tokens valid on both), the port.
const SHARED: [&str; 4] = ["ca.crt", "ca.key", "sa.key", "state.json"];

impl TwoMembers {
    /// Brings up the etcd, then each member once as a process (the first
    /// stores the namespaces, deploy/'s RBAC, the template and what `seed`
    /// makes; the second gets the first's PKI and makes its own port and
    /// kubeconfigs), then each node with its member's bootstrap manifest,
    /// rendered from the stored template for that node (as in
    /// [`SelfHosted::bootstrap`]); returns once both answer and both Nodes
    /// and mirror pods are there.
    pub fn bootstrap(
        base: &Path,
        names: [&str; 2],
        flags: &[&str],
        seed: impl FnOnce(&Kube),
    ) -> TwoMembers {
        // Not under a node's directory (whose leftovers name every process
        // with that path in its command line): the etcd outlives the nodes.
        let etcd = Etcd::start(&base.join(format!("etcd-{}", names[0])));
        let flags_of = |i: usize| ["--etcd-servers", etcd.url.as_str(), "--host", HOSTS[i]];
        let dirs = names.map(|n| base.join(n));
        let states = dirs.clone().map(|d| d.join("api"));
        for (dir, state) in dirs.iter().zip(&states) {
            fs::create_dir_all(dir).unwrap();
            let _ = fs::remove_dir_all(state);
        }
        let template: Value;
        let port: u16;
        {
            let first = ApiServer::start_with(&states[0], &flags_of(0));
            port = first.url.rsplit(':').next().unwrap().parse().unwrap();
            let kube = Kube::new(&first.kubeconfig("admin"), NS);
            kube.create_namespace();
            let deploy = Deploy::new(&first.kubeconfig("admin"), NS, ROLLOUTS);
            kube.rt.block_on(deploy.create_all(&kube.client));
            let created = kube
                .rt
                .block_on(kube.templates().create(
                    &Default::default(),
                    &serde_json::from_value(member_template(base, &etcd.url, port, flags)).unwrap(),
                ))
                .unwrap();
            template = serde_json::to_value(created).unwrap();
            seed(&kube);
        }
        fs::create_dir_all(&states[1]).unwrap();
        for file in SHARED {
            fs::copy(states[0].join(file), states[1].join(file)).unwrap();
        }
        {
            // Its certificate and kubeconfigs; and the same store: it
            // serves the template.
            let second = ApiServer::start_with(&states[1], &flags_of(1));
            let kube = Kube::new(&second.kubeconfig("admin"), NS);
            kube.rt
                .block_on(kube.templates().get(TEMPLATE))
                .expect("the second member serves what the first stored");
        }
        let image = format!("{IMAGE}={}", harness_bin("podstamp-apiserver").display());
        let mut started = Vec::new();
        for (i, ((dir, state), name)) in dirs.iter().zip(&states).zip(names).enumerate() {
            let config = write_config(dir);
            let bootstrap = dir.join("bootstrap.yaml");
            let label = format!("{HOST_LABEL}={}", HOSTS[i]);
            render_with(
                dir,
                &template,
                name,
                &["--node-label", &label],
                &config,
                &bootstrap,
            );
            let node = Node::start_with(
                dir,
                &state.join("admin.kubeconfig"),
                name,
                &["--standalone", "--image", &image],
            );
            fs::copy(
                &bootstrap,
                node.manifests().join(format!("{TEMPLATE}.yaml")),
            )
            .unwrap();
            // The state file says the port; the address is the node's.
            let mut api = ApiServer::existing(state);
            api.url = format!("https://{}:{port}", HOSTS[i]);
            started.push(SelfHosted {
                dir: dir.clone(),
                state: state.clone(),
                port,
                config,
                node,
                api,
            });
        }
        let members: [SelfHosted; 2] = started.try_into().ok().unwrap();
        for member in &members {
            member.wait_answering(COME_UP);
        }
        for (member, host) in members.iter().zip(HOSTS) {
            member.wait_registered();
            // Before any podstamp reads the Node: what the bootstrap
            // manifest was rendered with.
            let kube = member.admin();
            let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(kube.client.clone());
            let patch = json!({"metadata": {"labels": {HOST_LABEL: host}}});
            kube.rt
                .block_on(nodes.patch(
                    &member.node.name,
                    &Default::default(),
                    &kube::api::Patch::Merge(patch),
                ))
                .unwrap();
        }
        TwoMembers {
            members,
            etcd,
            base: base.to_path_buf(),
            port,
        }
    }

    /// A strategic merge patch of the template giving the members `flags`.
    pub fn flags_patch(&self, flags: &[&str]) -> Value {
        let command =
            member_template(&self.base, &self.etcd.url, self.port, flags)["template"]["spec"]["containers"][0]
                ["command"]
                .clone();
        json!({"template": {"spec": {"containers": [{"name": TEMPLATE, "command": command}]}}})
    }
}

/// One sample of a member: when, whether its `/readyz` said ok, and the
/// revision of its node's manifest in place.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub wall: SystemTime,
    pub ok: bool,
    pub revision: Option<String>,
}

/// Samples one member every 100 ms from its own thread, from
/// [`Timeline::watch`] to [`Timeline::stop`] (bounded by `limit`).
pub struct Timeline {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl Timeline {
    pub fn watch(member: &SelfHosted, limit: Duration) -> Timeline {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let kubeconfig = member.api.kubeconfig("admin");
        let manifest = member.node.manifests().join(format!("{TEMPLATE}.yaml"));
        let thread = std::thread::spawn(move || {
            let kube = Kube::new(&kubeconfig, NS);
            let until = Instant::now() + limit;
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                let ok = SelfHosted::answering(&kube);
                let revision = fs::read_to_string(&manifest).ok().and_then(|text| {
                    text.lines()
                        .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
                        .map(|v| v.trim_matches('"').to_string())
                });
                samples.push(Sample {
                    at: Instant::now(),
                    wall: SystemTime::now(),
                    ok,
                    revision,
                });
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        Timeline {
            stop,
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The member's outages in `samples`: from its last ok answer before to
/// its first ok answer after (so an interval covers every moment it may
/// have been down); one still open at the end runs to the last sample.
pub fn outages(samples: &[Sample]) -> Vec<(Instant, Instant)> {
    let mut out = Vec::new();
    let mut last_ok: Option<Instant> = None;
    let mut down_since: Option<Instant> = None;
    for s in samples {
        if s.ok {
            if let Some(since) = down_since.take() {
                out.push((since, s.at));
            }
            last_ok = Some(s.at);
        } else if down_since.is_none() {
            down_since = Some(last_ok.unwrap_or(s.at));
        }
    }
    if let (Some(since), Some(last)) = (down_since, samples.last()) {
        out.push((since, last.at));
    }
    out
}

/// When `revision` was first seen in place in `samples`.
pub fn written_at<'a>(samples: &'a [Sample], revision: &str) -> Option<&'a Sample> {
    samples
        .iter()
        .find(|s| s.revision.as_deref() == Some(revision))
}
