//! `fanout`: N daemons with distinct node names against one API server,
//! one template update at a time: time until all N manifests are written,
//! and the API server's count of open watches (one per daemon per resource).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::apimetrics::{Sample, print_requests};
use crate::bench::Bench;
use crate::observe::{Renames, time_to_ready};
use crate::procfs::proc_status_kib;
use crate::report::{mib, ms};
use crate::support::Daemon;
use crate::{CHANGE_LIMIT, READY_LIMIT};

impl Bench {
    pub fn fanout(&mut self) {
        let n = self.daemons;
        println!("\n== fan-out: {n} daemons, one API server on loopback ==");
        let ns = self.namespace("fanout");
        self.create_template(&ns, "agent", "N000000");
        // What this part measures is an update reaching every node at once:
        // without a kubelet no node could confirm a node-by-node rollout.
        self.annotate(&ns, "agent", "podstamp.io/rollout", "all-at-once");
        let names: Vec<String> = (0..n).map(|i| format!("bench-fan-{i:03}")).collect();
        for name in &names {
            self.node(name);
        }
        let before = self.api_metrics();
        let dirs: Vec<PathBuf> = names
            .iter()
            .map(|name| self.dir(&format!("fanout/{name}")))
            .collect();
        let spawned = Instant::now();
        let daemons: Vec<Daemon> = names
            .iter()
            .zip(&dirs)
            .map(|(name, dir)| self.daemon(&ns, name, dir, &self.cache))
            .collect();
        let ready: Vec<Option<Duration>> = daemons
            .iter()
            .map(|d| time_to_ready(d, spawned, READY_LIMIT.saturating_sub(spawned.elapsed())))
            .collect();
        let all_ready = ready.iter().all(Option::is_some);
        println!(
            "  {} of {n} ready; the last {} after they were all spawned",
            ready.iter().flatten().count(),
            ready.iter().flatten().max().map_or("-".into(), |d| ms(*d))
        );
        std::thread::sleep(Duration::from_millis(500));
        let after = self.api_metrics();

        let mut renames = Renames::watch(&dirs);
        let mut rows = Vec::new();
        for u in 1..=5 {
            std::thread::sleep(Duration::from_millis(500));
            let marker = format!("N{u:06}");
            let t0 = Instant::now();
            if let Err(e) = self.set_marker(&ns, "agent", &marker) {
                println!("  update {u}: failed: {e}");
                continue;
            }
            let took = renames.wait_marker("agent.yaml", &marker, t0, t0 + CHANGE_LIMIT);
            let mut done: Vec<Duration> = took.iter().flatten().copied().collect();
            done.sort();
            rows.push((u, done, took.len()));
        }
        println!(
            "  {:<8} {:>10} {:>10} {:>14} {:>8}",
            "update", "first", "median", "all N written", "missing"
        );
        let mut alls = Vec::new();
        for (u, done, total) in &rows {
            let missing = total - done.len();
            let all = (missing == 0).then(|| done[done.len() - 1]);
            if let Some(a) = all {
                alls.push(a);
            }
            println!(
                "  {u:<8} {:>10} {:>10} {:>14} {missing:>8}",
                done.first().map_or("-".into(), |d| ms(*d)),
                done.get(done.len() / 2).map_or("-".into(), |d| ms(*d)),
                all.map_or("timed out".into(), ms),
            );
        }
        alls.sort();
        if !alls.is_empty() {
            println!(
                "  time until all {n} manifests are written: p50 {}, max {} (over {} updates)",
                ms(alls[alls.len() / 2]),
                ms(alls[alls.len() - 1]),
                alls.len()
            );
        }
        let watches = |samples: &[Sample], resource: &str| {
            samples
                .iter()
                .filter(|s| {
                    s.name == "apiserver_longrunning_requests"
                        && s.label("verb") == "WATCH"
                        && s.label("resource") == resource
                })
                .map(|s| s.value)
                .sum::<f64>()
        };
        println!(
            "  open watches (apiserver_longrunning_requests{{verb=\"WATCH\"}}), before -> with the daemons{}:",
            if all_ready { "" } else { " (not all ready)" }
        );
        for resource in ["podtemplates", "nodes"] {
            let (b, a) = (watches(&before, resource), watches(&after, resource));
            println!(
                "    {resource:<13} {b:>5} -> {a:>5}: {:+} ({:.2} per daemon; expected 1)",
                a - b,
                (a - b) / n.max(1) as f64
            );
        }
        let registered: Vec<String> = after
            .iter()
            .filter(|s| {
                s.name == "apiserver_registered_watchers"
                    && ["PodTemplate", "Node"].contains(&s.label("kind"))
            })
            .map(|s| format!("{} {}", s.label("kind"), s.value))
            .collect();
        if !registered.is_empty() {
            println!(
                "    apiserver_registered_watchers: {}",
                registered.join(", ")
            );
        }
        println!("  API requests of the {n} daemons' start (apiserver_request_total, by verb):");
        print_requests(&before, &after, "    ");
        let mut rss: Vec<u64> = daemons
            .iter()
            .filter_map(|d| proc_status_kib(d.pid(), "VmRSS"))
            .collect();
        rss.sort();
        if !rss.is_empty() {
            println!(
                "  RSS per daemon: median {}, max {}; all {}: {}",
                mib(rss[rss.len() / 2]),
                mib(rss[rss.len() - 1]),
                rss.len(),
                mib(rss.iter().sum())
            );
        }
        drop(daemons);
    }
}
