//! A self-hosted control plane on a real node: the harness's API server
//! (`podstamp-apiserver`, embedded etcd, linked against libc only) packaged
//! as the local image [`IMAGE`] by `podstamp-node --image`, and run by that
//! node's real kubelet as a static pod whose PodTemplate is stored in the
//! same API server and rendered by podstamp for the node.
//!
//! How it comes up ([`SelfHosted::bootstrap`]), as kubeadm's `init` does
//! it, with the kubelet first:
//! 1. The API server runs once as a process on its state directory: that
//!    fixes its ports, PKI and tokens (kept in the directory and reused by
//!    every later start) and stores what the cluster needs before the node
//!    exists: the namespaces, deploy/'s RBAC for podstamp, the PodTemplate.
//!    The process is then stopped; its etcd data stays.
//! 2. `podstamp render` renders the template for the node, offline: the
//!    bootstrap manifest, a file podstamp later recognises as its own.
//! 3. `podstamp-node --standalone` starts containerd and the kubelet with a
//!    kubeconfig of that API server, which nothing serves yet: the kubelet
//!    runs static pods without it. The manifest is copied in; the kubelet
//!    runs the API server (its state directory a hostPath, probed on
//!    `/readyz`), then registers the Node and creates the mirror pod.
//!
//! Invariants: the state directory is inside the node's directory, so
//! [`crate::node::leftovers`] covers its mount; everything is stopped by
//! its handle's `Drop` (the node's ordered teardown stops the static pod),
//! pass or fail; the caller holds [`crate::node::serial`].
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{deploy::Deploy, harness_bin, plugin, repo};
use crate::node::Node;
use crate::support::{ApiServer, Daemon, Kube, wait_for};

/// The API server's image, built by podstamp-node from the harness binary.
pub const IMAGE: &str = "podstamp.test/apiserver:1";
/// Where the control plane's template and podstamp's account are.
pub const NS: &str = "control-plane";
/// Where podstamp's rollout Leases are.
pub const ROLLOUTS: &str = "control-plane-rollouts";
/// The template's name, so the pod's and the manifest's (`apiserver.yaml`).
pub const TEMPLATE: &str = "apiserver";

/// From the manifest in place to the API server answering: the kubelet's
/// start of a pod (well under a second) and the server's own start (3–5 s
/// on 2 cores); on a change, also the kubelet's 10–15 s wait before it
/// starts the new instance of a static pod. Generous.
pub const COME_UP: Duration = Duration::from_secs(120);

/// The PodTemplate of the self-hosted API server on state directory
/// `state` and `port`, with `flags` given to podstamp-apiserver (before
/// `--`). `${node.name}` goes through the substitute plugin into
/// kube-apiserver's `--external-hostname`: the node-specific part.
pub fn apiserver_template(state: &Path, port: u16, flags: &[&str]) -> Value {
    apiserver_on(state.to_str().unwrap(), "127.0.0.1", port, flags)
}

/// The API server's PodTemplate with its state in `state` (a path, or one
/// with placeholders the render fills in), serving on `host:port`, where
/// the kubelet probes it; `flags` follow `--dir`.
pub fn apiserver_on(state: &str, host: &str, port: u16, flags: &[&str]) -> Value {
    // The kubelet probes it on the host's network, as a client would.
    let probe = |failures: u32| {
        json!({
            "httpGet": {"scheme": "HTTPS", "host": host, "port": port, "path": "/readyz"},
            "periodSeconds": 1,
            "failureThreshold": failures
        })
    };
    let mut command = vec!["/bin/podstamp-apiserver", "--dir", state];
    command.extend_from_slice(flags);
    // Without a watch drain limit, a SIGTERMed kube-apiserver waits up to
    // 60 s for open watches (the kubelet's, podstamp's) and the kubelet
    // SIGKILLs it after the grace period: 30 s more downtime per restart.
    command.extend_from_slice(&[
        "--",
        "--external-hostname=${node.name}",
        "--shutdown-watch-termination-grace-period=2s",
    ]);
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NS,
                     "labels": {"podstamp.io/enabled": "true"}},
        "template": {
            "metadata": {"labels": {"component": TEMPLATE, "tier": "control-plane"}},
            "spec": {
                "hostNetwork": true,
                "priorityClassName": "system-node-critical",
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": TEMPLATE,
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "volumeMounts": [{"name": "state", "mountPath": state}],
                    // Up to 60 s to start; then Ready while /readyz says ok.
                    "startupProbe": probe(60),
                    "readinessProbe": probe(3)
                }],
                // Its etcd data: the same directory on the host, across restarts.
                "volumes": [{"name": "state", "hostPath": {"path": state, "type": "Directory"}}]
            }
        }
    })
}

/// podstamp's configuration for the control plane: substitute fills the
/// node's name in; the pod needs the host's network and a host path, which
/// only the privileged Pod Security level allows (as deploy/static-pod-render.yaml
/// grants podstamp's own static pod).
pub fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("podstamp.yaml");
    let text = format!(
        "plugins:\n  substitute:\n    path: {}\n    scope: [metadata, spec]\nchain: [substitute]\npodSecurity: privileged\n",
        plugin("substitute").display(),
    );
    fs::write(&path, text).unwrap();
    path
}

/// `podstamp render` of `template` for node `node` with `config`, offline,
/// into `out`, in the template's namespace: the manifest the daemon itself
/// writes for it when `template` is as the API server stored it.
pub fn render(dir: &Path, template: &Value, node: &str, config: &Path, out: &Path) {
    render_with(dir, template, node, &[], config, out)
}

/// [`render`] with more of the node given (`--node-label K=V`...).
pub fn render_with(
    dir: &Path,
    template: &Value,
    node: &str,
    node_args: &[&str],
    config: &Path,
    out: &Path,
) {
    let namespace = template["metadata"]["namespace"].as_str().unwrap_or(NS);
    let input = dir.join("template.json");
    fs::write(&input, serde_json::to_vec_pretty(template).unwrap()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .arg("render")
        .arg(&input)
        .args(["--node-name", node, "--namespace", namespace])
        .args(node_args)
        .arg("--config")
        .arg(config)
        .arg("-o")
        .arg(out)
        .env(
            "PODSTAMP_CACHE_DIR",
            repo().join("target/test-plugin-cache"),
        )
        .output()
        .expect("run podstamp render");
    assert!(
        output.status.success(),
        "podstamp render: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The control plane of one test: its node, and the API server the node
/// runs as a static pod.
pub struct SelfHosted {
    /// The node's directory (the API server's state is in `state`, inside it).
    pub dir: PathBuf,
    pub state: PathBuf,
    pub port: u16,
    pub config: PathBuf,
    /// The running node. Dropped last: its teardown stops the static pod.
    pub node: Node,
    /// A handle on the API server the node runs: never killed through it.
    pub api: ApiServer,
}

impl SelfHosted {
    /// Brings the control plane up in `dir` (see the module's steps) for
    /// node `name`, its API server started with `flags`; `seed` runs
    /// against the API server while it runs as a process, before the node
    /// exists (to create objects that must survive what follows).
    pub fn bootstrap(
        dir: &Path,
        name: &str,
        flags: &[&str],
        seed: impl FnOnce(&Kube),
    ) -> SelfHosted {
        let state = dir.join("api");
        let _ = fs::remove_dir_all(&state);
        let config = write_config(dir);
        let template;
        {
            // 1. Once as a process: ports, PKI, the objects.
            let process = ApiServer::start(&state);
            let port: u16 = process.url.rsplit(':').next().unwrap().parse().unwrap();
            let kube = Kube::new(&process.kubeconfig("admin"), NS);
            kube.create_namespace();
            let deploy = Deploy::new(&process.kubeconfig("admin"), NS, ROLLOUTS);
            kube.rt.block_on(deploy.create_all(&kube.client));
            // Rendered as the API server stores it (with its defaults),
            // which is what the daemon reads.
            let created = kube
                .rt
                .block_on(kube.templates().create(
                    &Default::default(),
                    &serde_json::from_value(apiserver_template(&state, port, flags)).unwrap(),
                ))
                .unwrap();
            template = serde_json::to_value(created).unwrap();
            seed(&kube);
            // SIGKILL: its etcd data survives it (see the harness README).
        }
        // 2. The bootstrap manifest, rendered as podstamp renders it.
        let bootstrap = dir.join("bootstrap.yaml");
        render(dir, &template, name, &config, &bootstrap);
        // 3. The kubelet first, then the manifest.
        let image = format!("{IMAGE}={}", harness_bin("podstamp-apiserver").display());
        let node = Node::start_with(
            dir,
            &state.join("admin.kubeconfig"),
            name,
            &["--standalone", "--image", &image],
        );
        let api = ApiServer::existing(&state);
        // The kubelet runs, and nothing serves its API server yet.
        assert!(
            !readyz(&Kube::new(&api.kubeconfig("admin"), NS)),
            "an API server answers on {} before its static pod exists",
            api.url
        );
        fs::copy(
            &bootstrap,
            node.manifests().join(format!("{TEMPLATE}.yaml")),
        )
        .unwrap();
        let port = api.url.rsplit(':').next().unwrap().parse().unwrap();
        let control = SelfHosted {
            dir: dir.to_path_buf(),
            state,
            port,
            config,
            node,
            api,
        };
        control.wait_answering(COME_UP);
        control.wait_registered();
        control
    }

    /// The mirror pod's name.
    pub fn mirror(&self) -> String {
        format!("{TEMPLATE}-{}", self.node.name)
    }

    /// The admin's client in the control plane's namespace.
    pub fn admin(&self) -> Kube {
        Kube::new(&self.api.kubeconfig("admin"), NS)
    }

    /// Whether `/readyz` answers ok now (within a second).
    pub fn answering(kube: &Kube) -> bool {
        readyz(kube)
    }

    /// Waits until the API server answers `/readyz` with ok.
    pub fn wait_answering(&self, limit: Duration) {
        let kube = self.admin();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for("the self-hosted API server's /readyz", limit, || {
                readyz(&kube).then_some(())
            })
        }));
        found.unwrap_or_else(|_| {
            panic!(
                "the API server did not answer\ncontainers: {:#?}\n{}",
                self.node.containers(),
                self.node.logs()
            )
        })
    }

    /// Waits until the kubelet has registered its Node (it does once the
    /// API server it runs answers) and the mirror pod is Ready.
    pub fn wait_registered(&self) {
        use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
        let kube = self.admin();
        let nodes: kube::Api<NodeObject> = kube::Api::all(kube.client.clone());
        let pods: kube::Api<Pod> = kube::Api::namespaced(kube.client.clone(), NS);
        let mirror = self.mirror();
        wait_for("the Node and a Ready mirror pod", COME_UP, || {
            kube.rt.block_on(nodes.get_opt(&self.node.name)).ok()??;
            let pod = kube.rt.block_on(pods.get_opt(&mirror)).ok()??;
            ready(&pod).then_some(())
        });
    }

    /// A kubeconfig for podstamp on this node as deploy/ gives it: a token
    /// of its ServiceAccount bound to the Node.
    pub fn podstamp_kubeconfig(&self) -> PathBuf {
        let kube = self.admin();
        let deploy = Deploy::new(&self.api.kubeconfig("admin"), NS, ROLLOUTS);
        kube.rt
            .block_on(deploy.wait_in_effect(&kube.client, &self.node.name));
        let token = kube
            .rt
            .block_on(deploy.token(&kube.client, &self.node.name));
        let path = self.dir.join("podstamp.kubeconfig");
        deploy.kubeconfig(&token, &path);
        path
    }

    /// `podstamp run` for this node, keeping its revisions in `history`.
    pub fn start_podstamp(&self, history: &Path, log: &str) -> Daemon {
        let kubeconfig = self.podstamp_kubeconfig();
        self.run_podstamp(&kubeconfig, history, log)
    }

    /// `podstamp run` started again with the kubeconfig an earlier
    /// [`SelfHosted::start_podstamp`] made: it needs no API server, which
    /// may be the one down.
    pub fn restart_podstamp(&self, history: &Path, log: &str) -> Daemon {
        let kubeconfig = self.dir.join("podstamp.kubeconfig");
        assert!(
            kubeconfig.exists(),
            "restart_podstamp before start_podstamp"
        );
        self.run_podstamp(&kubeconfig, history, log)
    }

    /// The daemon with the node's CRI socket (mounted into podstamp's pod
    /// in deploy/): its local evidence while the API server is down.
    fn run_podstamp(&self, kubeconfig: &Path, history: &Path, log: &str) -> Daemon {
        let manifests = self.node.manifests();
        let socket = self.node.dir.join("run/containerd.sock");
        Daemon::start(
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                NS,
                "--rollout-namespace",
                ROLLOUTS,
                "--node-name",
                &self.node.name,
                "--manifest-dir",
                manifests.to_str().unwrap(),
                "--revisions-dir",
                history.to_str().unwrap(),
                "--cri-socket",
                socket.to_str().unwrap(),
            ],
            self.dir.join(log),
        )
    }

    /// The template's row of `podstamp status -o json` for this node;
    /// Null while the API server does not answer (it is the one restarted).
    pub fn status(&self) -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_podstamp"))
            .args(["status", "-n", NS, "--rollout-namespace", ROLLOUTS])
            .args(["-o", "json", "--kubeconfig"])
            .arg(self.api.kubeconfig("admin"))
            .output()
            .unwrap();
        if !out.status.success() {
            return Value::Null;
        }
        let view: Value = serde_json::from_slice(&out.stdout).unwrap();
        view["templates"]
            .as_array()
            .and_then(|t| {
                t.iter()
                    .find(|t| t["template"] == format!("{NS}/{TEMPLATE}"))
            })
            .and_then(|t| t["nodes"].as_array())
            .and_then(|n| n.iter().find(|n| n["node"] == self.node.name.as_str()))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// The stored template with `patch` (strategic merge) applied, as the
    /// API server would store it (a dry run: nothing is stored).
    pub fn patched_template(&self, patch: Value) -> Value {
        let kube = self.admin();
        let params = kube::api::PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let patched = kube
            .rt
            .block_on(kube.templates().patch(
                TEMPLATE,
                &params,
                &kube::api::Patch::Strategic(patch),
            ))
            .unwrap();
        serde_json::to_value(patched).unwrap()
    }

    /// The args of the API server's running container.
    pub fn running_args(&self) -> Option<Vec<String>> {
        let running = self.node.running(&self.mirror());
        (running.len() == 1).then(|| running[0].args.clone().unwrap_or_default())
    }
}

/// A rollout through podstamp: the kubelet's restart of a changed static
/// pod (10–15 s), the server's start, the mirror pod Ready again (25–65 s
/// after the API answers), then 10 s of Ready before podstamp calls it a
/// success.
pub const ROLLOUT: Duration = Duration::from_secs(180);

/// One change of the API server's flags, measured from the change itself
/// (the rename into place, or the PATCH of the template).
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// The longest time between two ok `/readyz` answers: the last of the
    /// old server to the first of the new one.
    pub downtime: Duration,
    /// How many times the API went down (1 for a clean restart).
    pub outages: usize,
    /// The new manifest in place (zero by hand: the change is the rename).
    pub written: Duration,
    /// The API answering again with the new flags.
    pub answering: Duration,
    /// Its mirror pod Ready again.
    pub mirror_ready: Duration,
}

impl SelfHosted {
    /// A strategic merge patch of the template giving podstamp-apiserver
    /// `flags` (the command list is replaced whole).
    pub fn flags_patch(&self, flags: &[&str]) -> Value {
        let command =
            apiserver_template(&self.state, self.port, flags)["template"]["spec"]["containers"][0]
                ["command"]
                .clone();
        json!({"template": {"spec": {"containers": [{"name": TEMPLATE, "command": command}]}}})
    }

    /// The `podstamp.io/revision` of the manifest in place.
    pub fn revision(&self) -> Option<String> {
        let text =
            fs::read_to_string(self.node.manifests().join(format!("{TEMPLATE}.yaml"))).ok()?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
            .map(|v| v.trim_matches('"').to_string())
    }

    /// Waits until the kubelet runs the API server with `flag` (and the
    /// node's name filled in), it answers again and its mirror pod is
    /// Ready; how long after `since` it answered, and the mirror pod was
    /// Ready. `daemon`, when given, must keep running meanwhile.
    pub fn wait_running_with(
        &self,
        flag: &str,
        daemon: Option<&Daemon>,
        since: Instant,
    ) -> (Duration, Duration) {
        let external = format!("--external-hostname={}", self.node.name);
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(
                &format!("the API server running with {flag}"),
                COME_UP,
                || {
                    if let Some(daemon) = daemon {
                        daemon.assert_running();
                    }
                    let args = self.running_args()?;
                    (args.iter().any(|a| a == flag) && args.contains(&external)).then_some(())
                },
            )
        }));
        found.unwrap_or_else(|_| {
            panic!(
                "containers: {:#?}\n{}\npodstamp's log:\n{}",
                self.node.containers(),
                self.node.logs(),
                daemon.map(Daemon::logs).unwrap_or_default()
            )
        });
        self.wait_answering(COME_UP);
        let answering = since.elapsed();
        self.wait_registered();
        (answering, since.elapsed())
    }

    /// Changes the API server's flags to `flags` by hand, with no podstamp
    /// running: the manifest podstamp would write for the template with that
    /// change (applied as a dry run, so rendered as the API server would
    /// store it), copied to a dot file of the kubelet's directory and
    /// renamed into place, as an operator's `install` does. `flag` is the
    /// one to see in the new container. The template itself is unchanged.
    pub fn change_by_hand(&self, flags: &[&str], flag: &str) -> Measured {
        let template = self.patched_template(self.flags_patch(flags));
        let file = self.dir.join("by-hand.yaml");
        render(&self.dir, &template, &self.node.name, &self.config, &file);
        let copied = self.node.manifests().join(".by-hand.tmp");
        fs::copy(&file, &copied).unwrap();
        let watch = Downtime::watch(&self.api.kubeconfig("admin"));
        std::thread::sleep(Duration::from_millis(500));
        let start = Instant::now();
        fs::rename(
            &copied,
            self.node.manifests().join(format!("{TEMPLATE}.yaml")),
        )
        .unwrap();
        let (answering, mirror_ready) = self.wait_running_with(flag, None, start);
        let (downtime, outages) = watch.stop();
        Measured {
            downtime,
            outages,
            written: Duration::ZERO,
            answering,
            mirror_ready,
        }
    }

    /// Changes the API server's flags to `flags` in the stored template,
    /// with `daemon` (podstamp run for this node) rolling it out; returns
    /// once the new server answers and its mirror pod is Ready (podstamp's
    /// verdict comes later: [`SelfHosted::wait_event`]).
    pub fn change_through_podstamp(&self, daemon: &Daemon, flags: &[&str], flag: &str) -> Measured {
        let old = self.revision();
        let admin = self.admin();
        let watch = Downtime::watch(&self.api.kubeconfig("admin"));
        std::thread::sleep(Duration::from_millis(500));
        let start = Instant::now();
        admin.patch_template(TEMPLATE, self.flags_patch(flags));
        // podstamp takes the rollout slot (the API is up) and writes.
        wait_for("podstamp's new revision in place", ROLLOUT, || {
            daemon.assert_running();
            self.revision().filter(|r| Some(r) != old.as_ref())
        });
        let written = start.elapsed();
        let (answering, mirror_ready) = self.wait_running_with(flag, Some(daemon), start);
        let (downtime, outages) = watch.stop();
        Measured {
            downtime,
            outages,
            written,
            answering,
            mirror_ready,
        }
    }

    /// Waits for an Event `reason` on the template whose note names
    /// `revision` (podstamp reports once the API answers).
    pub fn wait_event(&self, daemon: &Daemon, reason: &str, revision: &str) -> String {
        use k8s_openapi::api::events::v1::Event;
        let kube = self.admin();
        let api: kube::Api<Event> = kube::Api::namespaced(kube.client.clone(), NS);
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
                self.node.containers(),
                self.node.logs(),
                daemon.logs()
            )
        })
    }

    /// Waits until `podstamp status` shows this node `phase` on `revision`;
    /// its row.
    pub fn wait_status(&self, daemon: &Daemon, phase: &str, revision: &str) -> Value {
        let mut last = Value::Null;
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(
                &format!("podstamp status: {phase} on {revision}"),
                ROLLOUT,
                || {
                    daemon.assert_running();
                    last = self.status();
                    (last["phase"] == phase && last["revision"] == revision).then(|| last.clone())
                },
            )
        }));
        found
            .unwrap_or_else(|_| panic!("last status: {last:#}\npodstamp's log:\n{}", daemon.logs()))
    }
}

/// Prints a change by hand and the same change through podstamp side by
/// side, and the ratio of their downtimes. Asserts nothing.
pub fn print_side_by_side(by_hand: &Measured, through_podstamp: &Measured) {
    let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
    println!(
        "self-hosted API server, a harmless flag changed (--v): API downtime = last ok /readyz of the old server -> first of the new (polled every 50 ms)"
    );
    println!(
        "{:<32} {:>9} {:>16} {:>18} {:>21}",
        "change", "downtime", "change->written", "change->answering", "change->mirror Ready"
    );
    for (what, m) in [
        ("by hand (manifest copied in)", by_hand),
        ("podstamp (PodTemplate patched)", through_podstamp),
    ] {
        println!(
            "{:<32} {:>9} {:>16} {:>18} {:>21}",
            what,
            secs(m.downtime),
            secs(m.written),
            secs(m.answering),
            secs(m.mirror_ready)
        );
    }
    println!(
        "downtime ratio podstamp / by hand: {:.2}",
        through_podstamp.downtime.as_secs_f64() / by_hand.downtime.as_secs_f64()
    );
}

/// GET /readyz within a second: true when it says ok.
fn readyz(kube: &Kube) -> bool {
    let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
    kube.rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(1), kube.client.request_text(request)).await
        })
        .is_ok_and(|r| r.is_ok_and(|body| body.trim() == "ok"))
}

fn ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How long a stopping [`Downtime`] polls for the server's ok.
const SETTLE: Duration = Duration::from_secs(10);

/// Polls the API server's `/readyz` every 50 ms from its own thread, from
/// [`Downtime::watch`] to [`Downtime::stop`]: what an API client sees of
/// an upgrade. Once stopping, it polls on until an answer is ok (at most
/// [`SETTLE`]): the caller stops it after seeing the new server answer, and
/// a poll sent before that (one may wait up to 1 s) must not be the last.
pub struct Downtime {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, bool)>>>,
}

impl Downtime {
    pub fn watch(kubeconfig: &Path) -> Downtime {
        let stop = Arc::new(AtomicBool::new(false));
        let kubeconfig = kubeconfig.to_path_buf();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let kube = Kube::new(&kubeconfig, NS);
            let mut samples = Vec::new();
            let mut stopping: Option<Instant> = None;
            loop {
                if stopping.is_none() && flag.load(Ordering::Relaxed) {
                    stopping = Some(Instant::now());
                }
                let ok = readyz(&kube);
                samples.push((Instant::now(), ok));
                if stopping.is_some_and(|since| ok || since.elapsed() > SETTLE) {
                    return samples;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Downtime {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops polling; the longest time between two ok answers (the last of
    /// the old server and the first of the new one), and how many outages
    /// there were.
    pub fn stop(mut self) -> (Duration, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self.thread.take().unwrap().join().unwrap();
        let mut longest = Duration::ZERO;
        let mut outages = 0;
        let mut last_ok: Option<Instant> = None;
        let mut down = false;
        for (at, ok) in samples {
            if ok {
                if let Some(last) = last_ok {
                    longest = longest.max(at - last);
                }
                if down {
                    outages += 1;
                }
                last_ok = Some(at);
                down = false;
            } else if last_ok.is_some() {
                down = true;
            }
        }
        assert!(
            !down,
            "the API server was still down when the watch stopped"
        );
        (longest, outages)
    }
}

impl Drop for Downtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
