//! `rollout`: a template update rolled node by node (max-unavailable 1, the
//! default) across three real kubelets, side by side in the same run with
//! the floor: the same update made by hand, one node after the other, each
//! manifest renamed into place once the previous node's pod is Ready. Then
//! the API requests a rollout costs each node, and the Lease writes of
//! daemons that have nothing to roll (the target: none).
//!
//! Three nodes (`podstamp-node`: containerd and the kubelet), one at a time
//! on the machine is the kubelet tests' rule, but three at once is what the
//! tests' `three_kubelets_roll…` also runs: they hold the machine-wide node
//! lock together. Each runs two pods: `web` (a PodTemplate through podstamp)
//! and `floor` (a manifest the bench writes itself).
//!
//! "Ready" is the mirror pod of the new content (its `VERSION` env) with
//! its Ready condition True, seen by listing the namespace's pods every
//! 50 ms. The API requests are the daemons' own count
//! (`podstamp_api_requests_total`): the API server's cannot tell them from
//! the kubelets' and the bench's. podstamp frees a node's slot only after the pod stayed Ready for
//! 10 s (its confirmation: docs/daemon.md), so that window is part of each
//! node's step and is printed apart.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::apimetrics::{parse_metrics, request_delta_of};
use crate::bench::Bench;
use crate::kubelet::{kubelet_config, missing_node_tools, pod_spec};
use crate::node::{Node, leftovers, serial};
use crate::observe::time_to_ready;
use crate::report::{Samples, ms, verdict};
use crate::support::Daemon;
use crate::{READY_LIMIT, common};

const NODES: [&str; 3] = ["bench-roll-1", "bench-roll-2", "bench-roll-3"];
/// How long a whole rollout (or the floor's three steps) may take.
const ROLLOUT_LIMIT: Duration = Duration::from_secs(300);
/// podstamp's confirmation window: Ready this long before a slot is freed.
const CONFIRM: Duration = Duration::from_secs(10);

/// Requests counted by (resource, verb).
type Requests = BTreeMap<(String, String), f64>;

/// podstamp_api_requests_total of these daemons, summed: (resource, verb) → n.
fn requests(daemons: &[Daemon]) -> Requests {
    let mut out = BTreeMap::new();
    for daemon in daemons {
        let text = daemon
            .get("/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        for s in parse_metrics(&text) {
            if s.name == "podstamp_api_requests_total" {
                *out.entry((s.label("resource").to_string(), s.label("verb").to_string()))
                    .or_default() += s.value;
            }
        }
    }
    out
}

/// `after` - `before`, the pairs that grew.
fn grew(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

impl Bench {
    /// `rounds` rollouts of podstamp and of the floor, in turn; then
    /// `self.daemons` daemons without kubelets idle for `idle`.
    pub fn rollout(&mut self, rounds: usize, idle: Duration) {
        println!(
            "\n== rollout: one update across 3 real kubelets, max-unavailable 1 ({rounds} rollouts) =="
        );
        match missing_node_tools() {
            Some(missing) => println!("  left out: {missing}"),
            None => self.rollouts(rounds),
        }
        self.idle_leases(idle);
    }

    fn rollouts(&mut self, rounds: usize) {
        let waited = Instant::now();
        let lock = serial();
        if waited.elapsed() > Duration::from_secs(1) {
            println!(
                "  waited {} for the machine's node lock (a kubelet test was running)",
                ms(waited.elapsed())
            );
        }
        let ns = self.namespace("rollout");
        let started = self.dir("rollout/started").canonicalize().unwrap();
        let config = kubelet_config(&self.root.join("rollout"));
        let kubeconfig = self.server.kubeconfig("admin");
        let mut nodes = Vec::new();
        let mut daemons = Vec::new();
        for name in NODES {
            // Fixed, outside target/bench-daemon: a node that was SIGKILLed
            // is swept when podstamp-node starts again on the same directory.
            let dir = common::repo().join("target/kubelet-bench").join(name);
            fs::create_dir_all(&dir).unwrap();
            let node = Node::start(&dir.canonicalize().unwrap(), &kubeconfig, name);
            let manifests = node.manifests();
            daemons.push(Daemon::start_binary(
                &self.binary,
                &[
                    "--config",
                    config.to_str().unwrap(),
                    "--kubeconfig",
                    kubeconfig.to_str().unwrap(),
                    "--namespace",
                    &ns,
                    "--node-name",
                    name,
                    "--manifest-dir",
                    manifests.to_str().unwrap(),
                    "--cache-dir",
                    self.cache.to_str().unwrap(),
                ],
                self.root.join("logs").join(format!("{name}.log")),
                "info,kube=warn",
            ));
            nodes.push(node);
        }
        let since = Instant::now();
        if daemons
            .iter()
            .any(|d| time_to_ready(d, since, READY_LIMIT).is_none())
        {
            println!(
                "  a podstamp did not become ready: see {}",
                self.root.join("logs").display()
            );
            return;
        }
        let run = Run {
            bench: self,
            ns: &ns,
            nodes: &nodes,
            started: &started,
        };
        let mut rows = Vec::new();
        if run.install() {
            for round in 1..=rounds {
                let before = requests(&daemons);
                let ours = run.podstamp(round);
                let after = requests(&daemons);
                let floor = run.floor(round);
                rows.push((ours, floor, grew(&before, &after)));
            }
        }
        run.report(&rows);
        drop(daemons);
        for mut node in nodes {
            let status = node.stop();
            let left = leftovers(&node.dir, &node.cgroup_root);
            println!(
                "  node {} torn down: {}{}",
                node.name,
                status.map_or("?".into(), |s| s.to_string()),
                if left.is_empty() {
                    String::new()
                } else {
                    format!(", LEFT BEHIND: {left:?}")
                }
            );
        }
        drop(lock);
    }

    /// `self.daemons` daemons on Nodes without a kubelet, their template
    /// installed, then `idle` with nothing to roll: the Lease requests the
    /// API server counts (expected: no writes at all).
    fn idle_leases(&mut self, idle: Duration) {
        let n = self.daemons;
        println!(
            "\n== rollout: {n} daemons with nothing to roll, {} idle ==",
            ms(idle)
        );
        // The API server renews Leases of its own (its identity, every
        // 10 s): counted over the same time with no daemon, as the baseline.
        let quiet = self.api_metrics();
        std::thread::sleep(idle);
        let baseline = request_delta_of(&quiet, &self.api_metrics(), &["leases"]);
        let ns = self.namespace("rollout-idle");
        self.create_template(&ns, "agent", "I000000");
        let names: Vec<String> = (0..n).map(|i| format!("bench-idle-{i:03}")).collect();
        let dirs: Vec<PathBuf> = names
            .iter()
            .map(|name| {
                self.node(name);
                self.dir(&format!("rollout-idle/{name}"))
            })
            .collect();
        let spawned = Instant::now();
        let daemons: Vec<Daemon> = names
            .iter()
            .zip(&dirs)
            .map(|(name, dir)| self.daemon(&ns, name, dir, &self.cache))
            .collect();
        let ready = daemons
            .iter()
            .filter(|d| {
                time_to_ready(d, spawned, READY_LIMIT.saturating_sub(spawned.elapsed())).is_some()
            })
            .count();
        let written = dirs
            .iter()
            .filter(|d| d.join("agent.yaml").is_file())
            .count();
        println!("  {ready} of {n} ready, {written} of {n} manifests installed");
        // What the start itself writes (each node's status Lease, once) is
        // done by the time every daemon is ready and has written; a short
        // pause lets the last of them land before counting.
        std::thread::sleep(Duration::from_secs(2));
        let before = self.api_metrics();
        let own_before = requests(&daemons);
        std::thread::sleep(idle);
        let after = self.api_metrics();
        let own = grew(&own_before, &requests(&daemons));
        let delta = request_delta_of(&before, &after, &["leases"]);
        let writes: u64 = own
            .iter()
            .filter(|((resource, verb), _)| {
                resource == "leases"
                    && ["create", "update", "patch", "delete"].contains(&verb.as_str())
            })
            .map(|(_, n)| *n as u64)
            .sum();
        let text = |delta: &BTreeMap<(String, String), f64>| {
            let all: Vec<String> = delta
                .iter()
                .map(|((_, verb), n)| format!("{verb} {n}"))
                .collect();
            if all.is_empty() {
                "none".to_string()
            } else {
                all.join(", ")
            }
        };
        println!(
            "  Lease requests the API server counted in {} (apiserver_request_total): {} with the {n} daemons idle, {} with no daemon (its own Leases)",
            ms(idle),
            text(&delta),
            text(&baseline)
        );
        let own: Vec<String> = own
            .iter()
            .map(|((resource, verb), n)| format!("{resource} {verb} {n}"))
            .collect();
        println!(
            "  the daemons' own requests meanwhile (podstamp_api_requests_total): {}",
            if own.is_empty() {
                "none".to_string()
            } else {
                own.join(", ")
            }
        );
        println!(
            "  target: 0 Lease writes by the daemons while nothing rolls: {writes} ({})",
            verdict(writes == 0 && ready == n)
        );
        drop(daemons);
    }
}

/// One podstamp rollout: when each node wrote the new revision and when its
/// pod was Ready, since the template was changed.
struct Rollout {
    written: Vec<Option<Duration>>,
    ready: Vec<Option<Duration>>,
}

/// The floor's rollout by hand: when each node's pod was Ready, since the
/// first manifest was renamed into place.
struct Floor {
    ready: Vec<Option<Duration>>,
}

struct Run<'a> {
    bench: &'a Bench,
    ns: &'a str,
    nodes: &'a [Node],
    started: &'a Path,
}

impl Run<'_> {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.bench.client.clone(), self.ns)
    }

    /// `web` and `floor` first installed on every node, and Ready.
    fn install(&self) -> bool {
        let object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "web", "labels": {"podstamp.io/enabled": "true"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": pod_spec(self.started, "R000", "set-by-arch-image", None)},
        }))
        .unwrap();
        if let Err(e) = self.bench.rt.block_on(
            self.bench
                .templates(self.ns)
                .create(&PostParams::default(), &object),
        ) {
            println!("  cannot create the template: {e}");
            return false;
        }
        for i in 0..self.nodes.len() {
            self.write_floor(i, "F000");
        }
        let t0 = Instant::now();
        let all = |prefix: &str, version: &str| {
            (0..self.nodes.len()).all(|i| self.ready_with(&self.list(), prefix, i, version))
        };
        while t0.elapsed() < ROLLOUT_LIMIT {
            if all("web", "R000") && all("floor", "F000") {
                // podstamp's first install is confirmed 10 s after Ready:
                // the first rollout must not start while it is.
                std::thread::sleep(CONFIRM + Duration::from_secs(2));
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        println!(
            "  web and floor were not Ready on every node within {}: see {}",
            ms(ROLLOUT_LIMIT),
            self.bench.root.join("logs").display()
        );
        false
    }

    fn list(&self) -> Vec<Pod> {
        self.bench
            .rt
            .block_on(self.pods().list(&ListParams::default()))
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Whether the mirror pod `<prefix>-<node i>` runs `version` and is Ready.
    fn ready_with(&self, pods: &[Pod], prefix: &str, i: usize, version: &str) -> bool {
        let name = format!("{prefix}-{}", self.nodes[i].name);
        pods.iter().any(|pod| {
            pod.metadata.name.as_deref() == Some(name.as_str())
                && pod.spec.as_ref().is_some_and(|spec| {
                    spec.containers.iter().any(|c| {
                        c.env
                            .iter()
                            .flatten()
                            .any(|e| e.name == "VERSION" && e.value.as_deref() == Some(version))
                    })
                })
                && pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    }

    /// The template changed; until every node's pod of it is Ready.
    fn podstamp(&self, round: usize) -> Rollout {
        let version = format!("R{round:03}");
        let patch = json!({"template": {"spec": {"containers": [
            {"name": "main", "env": [{"name": "VERSION", "value": version}]}]}}});
        let n = self.nodes.len();
        let mut out = Rollout {
            written: vec![None; n],
            ready: vec![None; n],
        };
        let t0 = Instant::now();
        if let Err(e) = self.bench.rt.block_on(self.bench.templates(self.ns).patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )) {
            println!("  rollout {round}: the update failed: {e}");
            return out;
        }
        while t0.elapsed() < ROLLOUT_LIMIT && out.ready.iter().any(Option::is_none) {
            for (i, node) in self.nodes.iter().enumerate() {
                if out.written[i].is_none()
                    && fs::read_to_string(node.manifests().join("web.yaml"))
                        .is_ok_and(|text| text.contains(&version))
                {
                    out.written[i] = Some(t0.elapsed());
                }
            }
            let pods = self.list();
            for i in 0..n {
                if out.ready[i].is_none() && self.ready_with(&pods, "web", i, &version) {
                    out.ready[i] = Some(t0.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The last node's confirmation window: its slot is freed only then,
        // and the API requests are counted until then.
        std::thread::sleep(CONFIRM + Duration::from_secs(2));
        out
    }

    /// The same update by hand: each node's floor manifest renamed into
    /// place once the previous node's floor pod is Ready.
    fn floor(&self, round: usize) -> Floor {
        let version = format!("F{round:03}");
        let mut out = Floor {
            ready: vec![None; self.nodes.len()],
        };
        let t0 = Instant::now();
        for i in 0..self.nodes.len() {
            self.write_floor(i, &version);
            while t0.elapsed() < ROLLOUT_LIMIT {
                if self.ready_with(&self.list(), "floor", i, &version) {
                    out.ready[i] = Some(t0.elapsed());
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if out.ready[i].is_none() {
                break;
            }
        }
        out
    }

    /// The floor's manifest of node `i`, written to a dot file of its
    /// manifest directory and renamed into place.
    fn write_floor(&self, i: usize, version: &str) {
        let node = &self.nodes[i].name;
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "floor", "namespace": self.ns, "labels": {"app": "floor"}},
            "spec": pod_spec(self.started, version, "podstamp.test/busybox:1", Some(node)),
        });
        let dir = self.nodes[i].manifests();
        let temp = dir.join(".floor.yaml.bench");
        fs::write(&temp, serde_norway::to_string(&pod).unwrap()).unwrap();
        fs::rename(&temp, dir.join("floor.yaml")).unwrap();
    }

    fn report(&self, rows: &[(Rollout, Floor, Requests)]) {
        if rows.is_empty() {
            return;
        }
        let mut wall = Samples::default();
        let mut floor = Samples::default();
        let mut kubelet = Samples::default();
        let mut handoff = Samples::default();
        println!(
            "  {:<6} {:>12} {:>12} {:>7}   per node: written -> Ready (the kubelet), Ready -> next node written",
            "rollout", "podstamp", "floor", "ratio"
        );
        for (round, (ours, by_hand, _)) in rows.iter().enumerate() {
            let last = |v: &[Option<Duration>]| {
                v.iter()
                    .copied()
                    .collect::<Option<Vec<_>>>()
                    .and_then(|v| v.into_iter().max())
            };
            let (w, f) = (last(&ours.ready), last(&by_hand.ready));
            wall.push(w);
            floor.push(f);
            let mut steps: Vec<(Duration, Duration)> = ours
                .written
                .iter()
                .zip(&ours.ready)
                .filter_map(|(w, r)| w.zip(*r))
                .collect();
            steps.sort();
            let mut detail = Vec::new();
            for (k, (written, ready)) in steps.iter().enumerate() {
                kubelet.push(Some(ready.saturating_sub(*written)));
                let mut step = ms(ready.saturating_sub(*written));
                if let Some((next, _)) = steps.get(k + 1) {
                    handoff.push(Some(next.saturating_sub(*ready)));
                    step.push_str(&format!(" + {}", ms(next.saturating_sub(*ready))));
                }
                detail.push(step);
            }
            println!(
                "  {:<6} {:>12} {:>12} {:>7}   {}",
                round + 1,
                w.map_or("lost".into(), ms),
                f.map_or("lost".into(), ms),
                w.zip(f).map_or("-".into(), |(w, f)| format!(
                    "{:.2}x",
                    w.as_secs_f64() / f.as_secs_f64()
                )),
                detail.join(", ")
            );
        }
        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        wall.row("podstamp: update -> 3 nodes Ready");
        floor.row("floor: by hand, node after node");
        kubelet.row("  podstamp: written -> Ready");
        handoff.row("  podstamp: Ready -> next written");
        if let (Some(w), Some(f)) = (wall.percentile(0.5), floor.percentile(0.5)) {
            let ratio = w.as_secs_f64() / f.as_secs_f64();
            println!(
                "  target: a 3-node rollout within 1.5x three per-node floors: p50 {:.2}x ({})",
                ratio,
                verdict(ratio <= 1.5 && wall.lost == 0)
            );
            let windows = CONFIRM * (NODES.len() as u32 - 1);
            println!(
                "  of podstamp's time, {} are its confirmation windows between nodes ({} each: Ready that long before the next node goes); without them {:.2}x",
                ms(windows),
                ms(CONFIRM),
                w.saturating_sub(windows).as_secs_f64() / f.as_secs_f64()
            );
        }
        let mut total: BTreeMap<(String, String), f64> = BTreeMap::new();
        for (_, _, requests) in rows {
            for (key, n) in requests {
                *total.entry(key.clone()).or_default() += n;
            }
        }
        let per = (rows.len() * NODES.len()) as f64;
        println!(
            "  API requests per node per rollout (the daemons' podstamp_api_requests_total over {} rollouts, / {} nodes; from the update until 12 s after the last node was Ready):",
            rows.len(),
            NODES.len()
        );
        let mut sum = 0.0;
        for ((resource, verb), n) in &total {
            sum += n / per;
            println!("    {resource:<13} {verb:<6} {:.1}", n / per);
        }
        println!("    all           {sum:.1}");
    }
}
