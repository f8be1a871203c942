//! `footprint`: the daemon's RSS and CPU while idle, against the poller's
//! (with its kubectl and jq), and start to ready with a cold and a warm code
//! cache.

use std::time::{Duration, Instant};

use crate::READY_LIMIT;
use crate::bench::Bench;
use crate::objects::private_dir;
use crate::observe::{Renames, time_to_ready};
use crate::procfs::{
    children_rss_kib, clock_ticks, group_rss_kib, observe, proc_status_kib, proc_ticks,
};
use crate::report::{mib, ms, verdict};

impl Bench {
    pub fn footprint(&mut self) {
        println!("\n== footprint ==");
        let ns = self.namespace("footprint");
        let node = "bench-footprint-node";
        self.node(node);
        self.create_template(&ns, "agent", "F000000");
        let ticks = clock_ticks();

        let dir = self.dir("footprint/podstamp");
        let daemon = self.daemon(&ns, node, &dir, &self.cache);
        let ready = time_to_ready(&daemon, Instant::now(), READY_LIMIT);
        std::thread::sleep(Duration::from_secs(2));
        let pid = daemon.pid();
        let idle = (proc_status_kib(pid, "VmRSS"), proc_status_kib(pid, "VmHWM"));
        // The pod check's helper, a child while renders need it.
        let helper_at_ready = children_rss_kib(pid);
        let (podstamp_cpu, podstamp_peak) = observe(
            Duration::from_secs(10),
            || proc_ticks(pid, false),
            || proc_status_kib(pid, "VmRSS").unwrap_or(0),
        );
        // Past its 10 s without a call (the reaper looks every 5 s).
        std::thread::sleep(Duration::from_secs(4));
        let helper_idle = children_rss_kib(pid);
        println!(
            "  the pod check (podstamp-kubecheck, a child of podstamp): 2 s after ready {} process(es), RSS {:.1} MiB; 16 s after {} process(es), RSS {:.1} MiB",
            helper_at_ready.1,
            helper_at_ready.0 as f64 / 1024.0,
            helper_idle.1,
            helper_idle.0 as f64 / 1024.0
        );
        drop(daemon);

        let poller = if self.has_poller {
            let dir = self.dir("footprint/poller");
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            let poller = self.poller(&ns, &dir, "poller-footprint.log");
            renames.wait_marker(
                "agent.yaml",
                "F000000",
                Instant::now(),
                Instant::now() + Duration::from_secs(30),
            );
            let pid = poller.child.id();
            let usage = observe(
                Duration::from_secs(10),
                // bash's own time plus that of the kubectl and jq it waited for.
                || proc_ticks(pid, true),
                || group_rss_kib(pid),
            );
            drop(poller);
            Some(usage)
        } else {
            None
        };

        // Cold (empty code cache) and warm starts, to /readyz 200.
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for i in 0..5 {
            let cache = self.root.join(format!("footprint/cold-cache-{i}"));
            private_dir(&cache);
            for (cache, into) in [(&cache, &mut cold), (&self.cache, &mut warm)] {
                let dir = self.dir("footprint/start");
                let spawned = Instant::now();
                let daemon = self.daemon(&ns, node, &dir, cache);
                into.push(time_to_ready(&daemon, spawned, READY_LIMIT));
            }
        }

        let cpu = |t: Option<u64>| {
            t.map_or("?".to_string(), |t| {
                format!("{:.0} ms", t as f64 * 1000.0 / ticks as f64)
            })
        };
        println!("  {:<44} {:>14} {:>14}", "", "podstamp", "kubectl poller");
        println!(
            "  {:<44} {:>14} {:>14}   target < 40 MiB: {}",
            "RSS idle, 3 plugins, 1 template",
            idle.0.map_or("?".into(), mib),
            "-",
            idle.0.map_or("unknown", |k| verdict(k < 40 * 1024))
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "  peak so far (VmHWM)",
            idle.1.map_or("?".into(), mib),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "RSS after the 1,000-template sync",
            self.after_sync_rss
                .map_or("(run `sync`)".into(), |(rss, _)| mib(rss)),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "  peak during the sync (VmHWM)",
            self.after_sync_rss
                .map_or("(run `sync`)".into(), |(_, hwm)| mib(hwm)),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "peak RSS, 10 s idle (poller: +kubectl, jq)",
            mib(podstamp_peak),
            poller.map_or("-".into(), |(_, peak)| mib(peak))
        );
        println!(
            "  {:<44} {:>14} {:>14}   podstamp should be ~0 (no polling)",
            "CPU used over 10 s idle",
            cpu(podstamp_cpu),
            poller.map_or("-".into(), |(t, _)| cpu(t))
        );
        println!(
            "  {:<44} {:>14}",
            "first start to ready (warm cache)",
            ready.map_or("timed out".into(), ms)
        );
        let summary = |v: &[Option<Duration>]| {
            let mut ok: Vec<Duration> = v.iter().flatten().copied().collect();
            ok.sort();
            if ok.is_empty() {
                return ("timed out".to_string(), None);
            }
            let median = ok[ok.len() / 2];
            (
                format!(
                    "{} (min {}, max {}{})",
                    ms(median),
                    ms(ok[0]),
                    ms(ok[ok.len() - 1]),
                    if ok.len() < v.len() {
                        format!(", {} timed out", v.len() - ok.len())
                    } else {
                        String::new()
                    }
                ),
                Some(median),
            )
        };
        let (text, _) = summary(&cold);
        println!(
            "  start -> /readyz 200, empty code cache, median of {}: {text}",
            cold.len()
        );
        let (text, median) = summary(&warm);
        println!(
            "  start -> /readyz 200, warm code cache,  median of {}: {text}   target < 150 ms: {}",
            warm.len(),
            median.map_or("unknown", |m| verdict(m < Duration::from_millis(150)))
        );
    }
}
