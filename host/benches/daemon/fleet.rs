//! `fleet`: a fleet of N simulated nodes in this one process, rolling one
//! template update at `max-unavailable` 10 % (rounded up), for N = 100, 500
//! and 2,000 (PODSTAMP_BENCH_FLEET, a comma-separated list).
//!
//! What is simulated and what is real: each node is podstamp's own rollout
//! [`Machine`] (the gate, the slots, the tracker, the phases it reports)
//! and its own coordinator task ([`coordinator::run`]: the Lease watch,
//! the slot writes, the status record), with its own kube client
//! authenticated by its own token of deploy/'s ServiceAccount bound to its
//! own Node (tests/common/deploy.rs: deploy/'s RBAC and admission policies
//! in force), so its own watches, exactly as N daemons would have. What is
//! played is what the other nodes' daemons leave out here: the render
//! (the revision is given) and the kubelet, as tests/rollouts.rs plays
//! it: the mirror pod is Running when the manifest is written and Ready
//! [`KUBELET_READY`] later; the confirmation window ([`STABLE`], 10 s of
//! Ready) is passed on the machine's clock, not waited for, so that a step
//! is the kubelet's second plus the coordination.
//!
//! Counted per node per rollout, from the API server's own metrics (the
//! only counter that sees every node; the bench's own requests in the
//! window are none): Lease requests by verb (`apiserver_request_total`,
//! the 409s apart: lost races), watch events of Leases sent
//! (`apiserver_watch_events_total`), the API server's CPU seconds
//! (`process_cpu_seconds_total`) and resident memory. The wall time of the
//! rollout is set against the ideal: ⌈N / max-unavailable⌉ steps × the
//! median time a node held its slot in the same run (grant to verdict),
//! and step by step (when each m nodes were done), so that the time lost
//! at every hand-over tells itself from a tail of late nodes.
//! Then 10 s with nothing rolling: the Lease writes (expected none).
//!
//! Where the writes come from: the Lease requests by verb and response
//! code, and podstamp's own count of its writes by what each was for
//! (status record, halt marker, take, renew, release) and how it ended
//! (ok, conflict, a call unanswered within the coordinator's timeout and
//! read back), summed over the fleet ([`Metrics::fleet_writes_by_kind`]).
//!
//! The API server runs (unless PODSTAMP_BENCH_FLEET_APF=0) with API
//! Priority and Fairness on and
//! deploy/flowcontrol.yaml applied (its subject moved to the fleet's
//! ServiceAccount): the requests APF rejected or queued, by priority level
//! and FlowSchema (`apiserver_flowcontrol_*`), are reported.
//!
//! Bounded: every wait has a limit (PODSTAMP_BENCH_FLEET_LIMIT seconds a
//! rollout may take, default 900); a rollout that does not end within it
//! is reported as such, with how far it got, and the next N is skipped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, PostParams};
use podstamp::daemon::coordinator::{self, Settings};
use podstamp::daemon::inbox::{Ask, Input, Observation, PodState};
use podstamp::daemon::metrics::Metrics;
use podstamp::daemon::rollout::{Effect, InPlace, Machine, STABLE};
use podstamp::fleet::policy::Policy;
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;

use crate::apimetrics::Sample;
use crate::bench::Bench;
use crate::common::deploy::Deploy;

/// The played kubelet: Ready this long after the manifest is written.
const KUBELET_READY: Duration = Duration::from_secs(1);
/// The slot Lease duration of every node (the daemon's default is 30 s).
const LEASE_DURATION: Duration = Duration::from_secs(30);
/// How long the Leases may take to settle (no more writes) after a change.
const SETTLE_LIMIT: Duration = Duration::from_secs(300);
/// How long nothing rolls while the Lease writes are counted.
const IDLE: Duration = Duration::from_secs(10);
/// Token requests and Node creations in flight at once.
const SETUP_CONCURRENCY: usize = 16;
/// The template every node rolls.
const TEMPLATE: &str = "web";
const OLD_TARGET: &str = "0000000000";
const NEW_TARGET: &str = "1111111111";

/// One simulated node: its rollout machine, and the channels of its
/// coordinator task.
struct SimNode {
    machine: Machine,
    asks: UnboundedSender<Ask>,
    inputs: Receiver<Input>,
    /// The revision written, and when.
    written: Option<(String, Instant)>,
    /// The played mirror pod of the new revision is Ready.
    ready: bool,
    granted_at: Option<Instant>,
    /// When the new revision's verdict came (the node is done).
    done_at: Option<Instant>,
}

/// The rollout step by step: when the nodes of each step of the ideal
/// (`m` at a time) were done, against the ideal's `k` holds, and how long
/// a node waited from the start for its grant. Where a rollout loses its
/// time: evenly at every hand-over, or in a tail of a few late nodes.
fn timeline(fleet: &[SimNode], start: Instant, m: usize, hold: Duration) -> String {
    let mut done: Vec<f64> = fleet
        .iter()
        .filter_map(|f| Some((f.done_at? - start).as_secs_f64()))
        .collect();
    done.sort_by(f64::total_cmp);
    let steps: Vec<String> = done
        .chunks(m.max(1))
        .enumerate()
        .map(|(k, c)| {
            let at = c.last().copied().unwrap_or_default();
            format!(
                "{}:{at:.1}s({:.1})",
                k + 1,
                at - (k + 1) as f64 * hold.as_secs_f64()
            )
        })
        .collect();
    let mut grants: Vec<f64> = fleet
        .iter()
        .filter_map(|f| Some((f.granted_at? - start).as_secs_f64()))
        .collect();
    grants.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    format!(
        "steps done at (beyond k holds): {}; grants at p50 {:.1}s, p90 {:.1}s, last {:.1}s",
        steps.join(" "),
        q(&grants, 0.5),
        q(&grants, 0.9),
        q(&grants, 1.0)
    )
}

/// What one N measured.
struct Figures {
    nodes: usize,
    max_unavailable: u32,
    wall: Option<Duration>,
    done: usize,
    ideal: Duration,
    hold_median: Duration,
    requests: BTreeMap<(String, String), f64>,
    conflicts: f64,
    watch_events: f64,
    cpu_seconds: f64,
    rss_mib: f64,
    idle_writes: f64,
    setup: Duration,
    /// podstamp's writes by (kind, result), over the fleet.
    kinds: BTreeMap<(&'static str, &'static str), u64>,
    /// This process's CPU seconds over the rollout (the simulated nodes).
    own_cpu: f64,
}

impl SimNode {
    /// Carries out the machine's effects: asks go to the coordinator, a
    /// render is made (the one the slot was granted for), the rest is the
    /// shell's disk and metrics, which a simulated node has none of.
    fn effects(&mut self, id: &str, policy: Policy) {
        loop {
            let effects = self.machine.take_effects();
            if effects.is_empty() {
                break;
            }
            for effect in effects {
                match effect {
                    Effect::Ask(ask) => {
                        let _ = self.asks.send(ask);
                    }
                    Effect::Render { .. } => self.render(id, NEW_TARGET, policy),
                    _ => {}
                }
            }
        }
        self.machine.after_pass();
        for effect in self.machine.take_effects() {
            if let Effect::Ask(ask) = effect {
                let _ = self.asks.send(ask);
            }
        }
    }

    /// A render of `target` (revision = target here): gated, or written.
    fn render(&mut self, id: &str, target: &str, policy: Policy) {
        if self.written.as_ref().is_some_and(|(r, _)| r == target) {
            return;
        }
        // The template selects every node: a share would be of them all.
        // Every node has the same settings here: one target per change.
        let gated = self.machine.gate(id, target, Some(target), policy, "");
        let now = Instant::now();
        if gated.is_none() {
            if self.granted_at.is_none() {
                self.granted_at = Some(now);
            }
            self.machine.writing(id, target, DEADLINE);
            self.written = Some((target.to_string(), now));
            // The kubelet starts the new revision's pod at once.
            self.machine
                .in_place(in_place(id, target, true, None), || None, now);
            self.machine
                .observe(observation(id, target, PodState::Running), now);
        } else {
            self.machine
                .in_place(in_place(id, target, false, gated), || None, now);
        }
    }

    /// The played kubelet: the pod of the written revision is Ready
    /// [`KUBELET_READY`] after the write; its confirmation window is passed
    /// on the machine's clock.
    fn kubelet(&mut self, id: &str) -> bool {
        let Some((revision, at)) = self.written.clone() else {
            return false;
        };
        if self.ready || at.elapsed() < KUBELET_READY || revision != NEW_TARGET {
            return false;
        }
        self.ready = true;
        let now = Instant::now();
        self.machine
            .observe(observation(id, &revision, PodState::Ready), now);
        self.machine.tick(now + STABLE);
        self.done_at = Some(Instant::now());
        true
    }

    /// The coordinator's answers so far; whether there were any.
    fn answers(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.inputs.try_recv() {
                Ok(Input::Fleet(answer)) => {
                    any = true;
                    self.machine.fleet(answer);
                }
                Ok(_) => {}
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return any,
            }
        }
    }
}

/// The progress deadline of the fleet's template: the default's.
const DEADLINE: Duration = Duration::from_secs(300);

fn in_place(
    id: &str,
    revision: &str,
    written: bool,
    gated: Option<podstamp::daemon::rollout::Gated>,
) -> InPlace {
    InPlace {
        id: id.to_string(),
        revision: revision.to_string(),
        written,
        deadline: DEADLINE,
        held: false,
        gated,
        target: Some(revision.to_string()),
        change: Some(revision.to_string()),
        generation: Some(if revision == NEW_TARGET { 2 } else { 1 }),
        quorum: false,
    }
}

fn observation(id: &str, revision: &str, state: PodState) -> Observation {
    Observation {
        source: id.to_string(),
        revision: revision.to_string(),
        state,
        pod: Default::default(),
    }
}

/// How often APF's queue gauge is sampled while the fleet rolls.
const INQUEUE_EVERY: Duration = Duration::from_secs(5);

/// deploy/flowcontrol.yaml applied with its subject, podstamp's
/// ServiceAccount, in `namespace` (the fleet's stand-in for kube-system).
fn apply_flowcontrol(admin: &std::path::Path, namespace: &str) -> Result<(), String> {
    use std::io::Write;
    let path = crate::common::repo().join("deploy/flowcontrol.yaml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .replace("namespace: kube-system", &format!("namespace: {namespace}"));
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(admin)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("kubectl: {e} (install kubectl)"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("kubectl apply: {status}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The change of counter `name` from `before` to `after`, by the values
/// of `labels`, over the samples `filter` keeps (changes of 0 left out).
fn delta_by(
    before: &[Sample],
    after: &[Sample],
    name: &str,
    labels: &[&str],
    filter: &dyn Fn(&Sample) -> bool,
) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for (samples, sign) in [(after, 1.0), (before, -1.0)] {
        for s in samples.iter().filter(|s| s.name == name && filter(s)) {
            let key = labels.iter().map(|l| s.label(l).to_string()).collect();
            *out.entry(key).or_insert(0.0) += sign * s.value;
        }
    }
    out.retain(|_, v| *v > 0.0);
    out
}

/// What API Priority and Fairness did over the rollout: requests rejected
/// and dispatched, and their time waiting in a queue, by priority level
/// and FlowSchema; the most queued at once by priority level.
fn apf_report(before: &[Sample], after: &[Sample], inqueue_max: &BTreeMap<String, f64>) {
    let all = |_: &Sample| true;
    let rejected = delta_by(
        before,
        after,
        "apiserver_flowcontrol_rejected_requests_total",
        &["priority_level", "flow_schema", "reason"],
        &all,
    );
    let dispatched = delta_by(
        before,
        after,
        "apiserver_flowcontrol_dispatched_requests_total",
        &["priority_level", "flow_schema"],
        &all,
    );
    let key = ["priority_level", "flow_schema"];
    let waited = delta_by(
        before,
        after,
        "apiserver_flowcontrol_request_wait_duration_seconds_sum",
        &key,
        &all,
    );
    let waits = delta_by(
        before,
        after,
        "apiserver_flowcontrol_request_wait_duration_seconds_count",
        &key,
        &all,
    );
    println!("    APF (priority level / FlowSchema): dispatched, mean wait in queue, rejected");
    if dispatched.is_empty() {
        println!("      nothing dispatched: is APF on?");
    }
    for (k, n) in &dispatched {
        let mean =
            waited.get(k).copied().unwrap_or(0.0) / waits.get(k).copied().unwrap_or(1.0).max(1.0);
        let refused: f64 = rejected
            .iter()
            .filter(|(r, _)| r[..2] == k[..])
            .map(|(_, v)| v)
            .sum();
        println!(
            "      {:<42} {:>9.0}  {:>8.1} ms  {:>6.0}",
            k.join(" / "),
            n,
            mean * 1000.0,
            refused
        );
    }
    for (k, n) in &rejected {
        println!("      rejected: {} {n:.0}", k.join(" / "));
    }
    let queued: Vec<String> = inqueue_max
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(l, v)| format!("{l} {v:.0}"))
        .collect();
    println!(
        "      most queued at once (sampled every {INQUEUE_EVERY:?}): {}",
        if queued.is_empty() {
            "none".to_string()
        } else {
            queued.join(", ")
        }
    );
}

fn sum(samples: &[Sample], name: &str, filter: impl Fn(&Sample) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && filter(s))
        .map(|s| s.value)
        .sum()
}

fn is_lease(s: &Sample) -> bool {
    s.label("resource") == "leases" || s.label("kind") == "Lease"
}

fn lease_writes(samples: &[Sample]) -> f64 {
    sum(samples, "apiserver_request_total", |s| {
        is_lease(s)
            && [
                "POST", "PUT", "PATCH", "DELETE", "create", "update", "patch",
            ]
            .contains(&s.label("verb"))
    })
}

/// The API server's CPU profile over the next `seconds`, written to `out`
/// (PODSTAMP_BENCH_FLEET_PROFILE; the API server runs with profiling on):
/// `kubectl get --raw` as admin, which returns when the profile is taken.
/// The thread ends with kubectl, bounded by its request timeout.
fn start_profile(
    kubeconfig: &std::path::Path,
    seconds: u64,
    out: std::path::PathBuf,
) -> std::thread::JoinHandle<Result<u64, String>> {
    let kubeconfig = kubeconfig.to_path_buf();
    std::thread::spawn(move || {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let file = std::fs::File::create(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let done = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg(format!("--request-timeout={}s", seconds + 30))
            .args(["get", "--raw"])
            .arg(format!("/debug/pprof/profile?seconds={seconds}"))
            .stdout(file)
            .stderr(std::process::Stdio::piped())
            .output()
            .map_err(|e| format!("kubectl: {e} (install kubectl to take the profile)"))?;
        if done.status.success() {
            Ok(seconds)
        } else {
            Err(format!(
                "kubectl get --raw /debug/pprof/profile: {}: {}",
                done.status,
                String::from_utf8_lossy(&done.stderr).trim()
            ))
        }
    })
}

impl Bench {
    pub fn fleet(&mut self, sizes: &[usize], limit: Duration) {
        println!(
            "\n== fleet: N simulated nodes in one process, one template rolled at max-unavailable 10%"
        );
        println!(
            "  each node: podstamp's rollout machine and coordinator, its own client, token bound to its own Node, its own watches;\n  the kubelet is played (Ready {KUBELET_READY:?} after the write; the {STABLE:?} confirmation passed on the machine's clock)\n  counts: the API server's own metrics, divided by N"
        );
        let mut all = Vec::new();
        for &n in sizes {
            match self.fleet_one(n, limit) {
                Some(f) => {
                    let finished = f.wall.is_some();
                    all.push(f);
                    if !finished {
                        println!("  N = {n} did not finish within {limit:?}: larger N are skipped");
                        break;
                    }
                }
                None => break,
            }
        }
        println!("\n  summary (per node per rollout):");
        println!(
            "  {:>6} {:>5} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9} {:>7} {:>9} {:>8} {:>9} {:>7} {:>7}",
            "N",
            "max",
            "writes",
            "reads",
            "409s",
            "events",
            "wall",
            "ideal",
            "wall/ide",
            "step",
            "apiCPU s",
            "apiRSS",
            "simCPU s",
            "idle wr",
            "setup"
        );
        for f in &all {
            let per = |verbs: &[&str]| {
                f.requests
                    .iter()
                    .filter(|((_, v), _)| verbs.contains(&v.as_str()))
                    .map(|(_, n)| n)
                    .sum::<f64>()
                    / f.nodes as f64
            };
            println!(
                "  {:>6} {:>5} {:>8.2} {:>8.2} {:>8.2} {:>8.1} {:>9} {:>10} {:>9} {:>6.2}s {:>9.1} {:>6.0}Mi {:>9.1} {:>7} {:>6.0}s",
                f.nodes,
                f.max_unavailable,
                per(&["POST", "PUT", "PATCH", "create", "update", "patch"]),
                per(&["GET", "LIST", "get", "list"]),
                f.conflicts / f.nodes as f64,
                f.watch_events / f.nodes as f64,
                f.wall.map_or(
                    format!(">{}s ({}/{})", limit.as_secs(), f.done, f.nodes),
                    |w| format!("{:.1}s", w.as_secs_f64())
                ),
                format!("{:.1}s", f.ideal.as_secs_f64()),
                f.wall.map_or("-".to_string(), |w| format!(
                    "{:.2}x",
                    w.as_secs_f64() / f.ideal.as_secs_f64().max(0.001)
                )),
                f.hold_median.as_secs_f64(),
                f.cpu_seconds,
                f.rss_mib,
                f.own_cpu,
                f.idle_writes,
                f.setup.as_secs_f64(),
            );
        }
        println!(
            "\n  podstamp's writes per node by kind: ok / conflict / timed out (then: landed, read back / error):"
        );
        for f in &all {
            let of = |kind: &str, result: &str| {
                f.kinds.get(&(kind, result)).copied().unwrap_or(0) as f64 / f.nodes as f64
            };
            let cells: Vec<String> = ["status", "take", "renew", "release", "halt"]
                .iter()
                .map(|k| {
                    format!(
                        "{k} {:.2}/{:.2}/{:.2}/{:.2}/{:.2}",
                        of(k, "ok"),
                        of(k, "conflict"),
                        of(k, "timeout"),
                        of(k, "landed"),
                        of(k, "error")
                    )
                })
                .collect();
            println!("  {:>6}  {}", f.nodes, cells.join("  "));
        }
    }

    /// One fleet of `n`; None when it could not be set up.
    fn fleet_one(&mut self, n: usize, limit: Duration) -> Option<Figures> {
        let started = Instant::now();
        let max_unavailable = n.div_ceil(10).max(1) as u32;
        let policy = Policy::NodeByNode { max_unavailable };
        let ns = format!("bench-fleet-{n}");
        let rollouts = format!("bench-fleet-{n}-rollouts");
        let id = format!("{ns}/{TEMPLATE}");
        println!(
            "\n  N = {n}, max-unavailable {max_unavailable}: setting up (Nodes, deploy/, tokens)"
        );
        let admin = self.server.kubeconfig("admin");
        let client = self.client.clone();
        let names: Vec<String> = (0..n).map(|i| format!("fleet{n}-{i:05}")).collect();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        if let Err(e) = self
            .rt
            .block_on(namespaces.create(&PostParams::default(), &object))
        {
            println!("  namespace {ns}: {e}; skipped");
            return None;
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let created: Vec<Result<(), String>> = self.rt.block_on(
            futures::stream::iter(names.iter().map(|name| {
                let nodes = nodes.clone();
                async move {
                    let node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
                    nodes
                        .create(&PostParams::default(), &node)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("Node {name}: {e}"))
                }
            }))
            .buffer_unordered(SETUP_CONCURRENCY)
            .collect(),
        );
        if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
            println!("  {e}; skipped");
            return None;
        }
        let deploy = Deploy::new(&admin, &ns, &rollouts);
        self.rt.block_on(deploy.apply(&client, &names[0]));
        // The status records' namespace, as deploy/ makes it for the rollouts.
        let status_ns = podstamp::config::default_status_namespace(&rollouts);
        if let Err(e) = apply_flowcontrol(&admin, &ns) {
            println!("  deploy/flowcontrol.yaml: {e}; skipped");
            return None;
        }
        // One count of podstamp's own writes for the whole fleet.
        let metrics = Arc::new(Metrics::default());
        let clients: Vec<kube::Client> = self.rt.block_on(
            futures::stream::iter(names.iter().map(|name| {
                let (deploy, client) = (&deploy, &client);
                async move { deploy.client(&deploy.token(client, name).await).await }
            }))
            .buffered(SETUP_CONCURRENCY)
            .collect(),
        );
        let mut fleet: Vec<SimNode> = Vec::with_capacity(n);
        for (name, node_client) in names.iter().zip(clients) {
            let (ask_tx, ask_rx) = tokio::sync::mpsc::unbounded_channel();
            let (input_tx, input_rx) = std::sync::mpsc::channel();
            let settings = Settings {
                namespace: rollouts.clone(),
                status_namespace: status_ns.clone(),
                node: name.clone(),
                lease_duration: LEASE_DURATION,
                watch_timeout: None,
            };
            self.rt.spawn(coordinator::run(
                node_client,
                settings,
                ask_rx,
                input_tx,
                metrics.clone(),
            ));
            let mut machine = Machine::new(name, true);
            machine.mirror_synced();
            fleet.push(SimNode {
                machine,
                asks: ask_tx,
                inputs: input_rx,
                written: None,
                ready: false,
                granted_at: None,
                done_at: None,
            });
        }
        // Every node runs the old target, Ready: the state a rollout starts
        // from (a first install is never gated).
        let now = Instant::now();
        for node in &mut fleet {
            node.machine
                .in_place(in_place(&id, OLD_TARGET, true, None), || None, now);
            node.machine
                .observe(observation(&id, OLD_TARGET, PodState::Ready), now);
            node.machine.tick(now + STABLE);
            node.written = Some((OLD_TARGET.to_string(), now));
            node.effects(&id, policy);
        }
        let leases: Api<Lease> = Api::namespaced(client.clone(), &status_ns);
        // Bounded; a fleet that cannot start within it is reported, not
        // measured (with APF on, 2,000 daemons starting at once on this
        // machine did not).
        let mut records = 0;
        let waited = Instant::now();
        while records < n {
            if waited.elapsed() >= SETTLE_LIMIT {
                println!(
                    "  setup: {records} of {n} status records after {SETTLE_LIMIT:?}; N = {n} not measured"
                );
                return None;
            }
            std::thread::sleep(Duration::from_secs(1));
            records =
                self.rt
                    .block_on(leases.list_metadata(
                        &ListParams::default().labels("podstamp.io/lease=node-status"),
                    ))
                    .map_or(records, |l| l.items.len());
        }
        self.settle();
        let setup = started.elapsed();
        println!("  set up in {:.1}s; rolling", setup.as_secs_f64());

        let before = self.api_metrics();
        let kinds_before = metrics.fleet_writes_by_kind();
        let own_ticks_before = crate::procfs::proc_ticks(std::process::id(), false);
        let lists_before = metrics.watch_lists("leases");
        let restarts_before = metrics.watch_restarts("leases");
        let start = Instant::now();
        let profile = crate::fleet_profile().map(|seconds| {
            let out = self.root.join("profiles").join(format!("fleet-{n}.pb"));
            (out.clone(), start_profile(&admin, seconds, out))
        });
        // APF's queues, sampled while the fleet rolls (a gauge): the most
        // requests waiting at once, by priority level.
        let mut inqueue_max: BTreeMap<String, f64> = BTreeMap::new();
        let mut sampled = Instant::now();
        for node in &mut fleet {
            node.written = Some((OLD_TARGET.to_string(), start));
            node.ready = false;
            node.render(&id, NEW_TARGET, policy);
            node.effects(&id, policy);
        }
        let mut done = 0;
        let mut wall = None;
        while start.elapsed() < limit {
            let mut busy = false;
            for node in &mut fleet {
                if node.answers() {
                    busy = true;
                    node.effects(&id, policy);
                }
                if node.kubelet(&id) {
                    busy = true;
                    node.effects(&id, policy);
                }
            }
            done = fleet.iter().filter(|f| f.done_at.is_some()).count();
            if done == n {
                wall = fleet
                    .iter()
                    .filter_map(|f| f.done_at)
                    .max()
                    .map(|t| t - start);
                break;
            }
            if sampled.elapsed() >= INQUEUE_EVERY {
                sampled = Instant::now();
                for s in self.api_metrics() {
                    if s.name == "apiserver_flowcontrol_current_inqueue_requests" {
                        let max = inqueue_max
                            .entry(s.label("priority_level").to_string())
                            .or_insert(0.0);
                        *max = max.max(s.value);
                    }
                }
            }
            if !busy {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Some((out, profile)) = profile {
            match profile.join() {
                Ok(Ok(seconds)) => println!(
                    "  the API server's CPU profile, the rollout's first {seconds} s: go tool pprof -top {}",
                    out.display()
                ),
                Ok(Err(e)) => println!("  the API server's CPU profile: {e}"),
                Err(_) => println!("  the API server's CPU profile: its thread panicked"),
            }
        }
        match wall {
            Some(w) => println!("  rolled in {:.1}s", w.as_secs_f64()),
            None => {
                println!(
                    "  {done}/{n} nodes done within {limit:?}; of those not done (at most 5):"
                );
                for (i, node) in fleet
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.done_at.is_none())
                    .take(5)
                {
                    println!(
                        "    {}: {}",
                        names[i],
                        match (&node.granted_at, &node.written) {
                            (None, _) => "never granted a slot".to_string(),
                            (Some(_), Some((r, _))) if r == NEW_TARGET =>
                                "written, not Ready".to_string(),
                            (Some(_), _) => "granted, not written".to_string(),
                        }
                    );
                }
            }
        }
        // The last records and releases are written after the verdicts.
        self.settle();
        let after = self.api_metrics();
        // The simulation's own cost: this process's CPU (the N simulated
        // nodes and this loop) beside the API server's.
        let own_cpu = match (
            own_ticks_before,
            crate::procfs::proc_ticks(std::process::id(), false),
        ) {
            (Some(a), Some(b)) => (b - a) as f64 / crate::procfs::clock_ticks() as f64,
            _ => f64::NAN,
        };
        let mut requests = BTreeMap::new();
        for s in after
            .iter()
            .filter(|s| s.name == "apiserver_request_total" && is_lease(s))
        {
            *requests
                .entry((s.label("resource").to_string(), s.label("verb").to_string()))
                .or_insert(0.0) += s.value;
        }
        for s in before
            .iter()
            .filter(|s| s.name == "apiserver_request_total" && is_lease(s))
        {
            *requests
                .entry((s.label("resource").to_string(), s.label("verb").to_string()))
                .or_insert(0.0) -= s.value;
        }
        requests.retain(|(_, verb), n| *n > 0.0 && verb != "WATCH");
        let mut kinds = metrics.fleet_writes_by_kind();
        for (key, n) in kinds_before {
            if let Some(v) = kinds.get_mut(&key) {
                *v -= n;
            }
        }
        kinds.retain(|_, n| *n > 0);
        let delta =
            |name: &str, f: &dyn Fn(&Sample) -> bool| sum(&after, name, f) - sum(&before, name, f);
        let conflicts = delta("apiserver_request_total", &|s| {
            is_lease(s) && s.label("code") == "409"
        });
        let watch_events = delta("apiserver_watch_events_total", &|s| is_lease(s));
        let cpu_seconds = delta("process_cpu_seconds_total", &|_| true);
        let rss_mib = sum(&after, "process_resident_memory_bytes", |_| true) / (1 << 20) as f64;
        let mut holds: Vec<Duration> = fleet
            .iter()
            .filter_map(|f| Some(f.done_at? - f.granted_at?))
            .collect();
        holds.sort();
        let hold_median = holds.get(holds.len() / 2).copied().unwrap_or_default();
        let ideal = hold_median * n.div_ceil(max_unavailable as usize) as u32;
        println!(
            "    {}",
            timeline(&fleet, start, max_unavailable as usize, hold_median)
        );
        // Nothing rolls: the Lease writes meanwhile.
        let quiet = self.api_metrics();
        std::thread::sleep(IDLE);
        let idle_writes = lease_writes(&self.api_metrics()) - lease_writes(&quiet);
        for ((resource, verb), count) in &requests {
            println!(
                "    {resource} {verb:<6} {:>10.0}  {:>7.2} per node",
                count,
                count / n as f64
            );
        }
        println!(
            "    409s {conflicts:.0}, watch events {watch_events:.0} ({:.1} per node), API server CPU {cpu_seconds:.1}s, RSS {rss_mib:.0} MiB; hold median {:.2}s; idle {IDLE:?}: {idle_writes} Lease writes",
            watch_events / n as f64,
            hold_median.as_secs_f64()
        );
        let by_code = delta_by(
            &before,
            &after,
            "apiserver_request_total",
            &["verb", "code"],
            &|s| is_lease(s) && s.label("verb") != "WATCH",
        );
        println!("    Lease requests by verb and code (per node):");
        for (key, count) in &by_code {
            println!(
                "      {:<18} {:>10.0}  {:>7.2}",
                key.join(" "),
                count,
                count / n as f64
            );
        }
        println!("    podstamp's writes by kind and result (per node):");
        for ((kind, result), count) in &kinds {
            println!(
                "      {:<18} {:>10}  {:>7.2}",
                format!("{kind} {result}"),
                count,
                *count as f64 / n as f64
            );
        }
        println!(
            "    the bench's own process (the simulated nodes): {own_cpu:.1} CPU s over the rollout"
        );
        println!(
            "    podstamp's Lease watches: {} lists, {} restarts ({:.2} / {:.2} per node)",
            metrics.watch_lists("leases") - lists_before,
            metrics.watch_restarts("leases") - restarts_before,
            (metrics.watch_lists("leases") - lists_before) as f64 / n as f64,
            (metrics.watch_restarts("leases") - restarts_before) as f64 / n as f64,
        );
        apf_report(&before, &after, &inqueue_max);
        // Ends every node's coordinator (its asks channel closes).
        drop(fleet);
        std::thread::sleep(Duration::from_secs(1));
        Some(Figures {
            nodes: n,
            max_unavailable,
            wall,
            done,
            ideal,
            hold_median,
            requests,
            conflicts,
            watch_events,
            cpu_seconds,
            rss_mib,
            idle_writes,
            setup,
            kinds,
            own_cpu,
        })
    }

    /// Waits (bounded) until the Lease writes stop: no change over 2 s.
    fn settle(&self) {
        let start = Instant::now();
        let mut last = lease_writes(&self.api_metrics());
        while start.elapsed() < SETTLE_LIMIT {
            std::thread::sleep(Duration::from_secs(2));
            let now = lease_writes(&self.api_metrics());
            if now == last {
                return;
            }
            last = now;
        }
        println!("  (Lease writes still going after {SETTLE_LIMIT:?})");
    }
}
