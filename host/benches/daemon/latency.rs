//! `latency`: update a PodTemplate, time until the new manifest is renamed
//! into place (inotify), for podstamp and for the poller, one update at a
//! time.

use std::time::{Duration, Instant};

use crate::bench::Bench;
use crate::observe::{Renames, time_to_ready};
use crate::report::{Samples, ms, verdict};
use crate::{CHANGE_LIMIT, READY_LIMIT};

impl Bench {
    /// Sets a new marker on the template `agent`, `updates` times, one at a
    /// time, and times each until `file` holding it is renamed into place;
    /// `pause`, when given, waits a random part of it before each update.
    fn time_updates(
        &mut self,
        ns: &str,
        file: &str,
        renames: &mut Renames,
        prefix: char,
        pause: Option<Duration>,
    ) -> Samples {
        let mut samples = Samples::default();
        for i in 1..=self.updates {
            if let Some(period) = pause {
                let pause = self.random_pause(period);
                std::thread::sleep(pause);
            }
            let marker = format!("{prefix}{i:06}");
            let t0 = Instant::now();
            if let Err(e) = self.set_marker(ns, "agent", &marker) {
                samples.errors.push(e);
                continue;
            }
            samples.push(renames.wait_marker(file, &marker, t0, t0 + CHANGE_LIMIT)[0]);
        }
        samples
    }

    pub fn latency(&mut self) {
        println!(
            "\n== change -> manifest latency ({} updates each) ==",
            self.updates
        );
        let ns = self.namespace("latency");
        let node = "bench-latency-node";
        self.node(node);
        let file = "agent.yaml";
        self.create_template(&ns, "agent", "S000000");

        let dir = self.dir("latency/podstamp");
        let daemon = self.daemon(&ns, node, &dir, &self.cache);
        let podstamp = if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            None
        } else {
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            Some(self.time_updates(&ns, file, &mut renames, 'P', None))
        };
        drop(daemon);

        let poller = if self.has_poller {
            let dir = self.dir("latency/poller");
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            let poller = self.poller(&ns, &dir, "poller-latency.log");
            let first = renames.wait_marker(
                file,
                "value",
                Instant::now(),
                Instant::now() + Duration::from_secs(30),
            )[0];
            if first.is_none() {
                println!(
                    "  the poller wrote nothing in 30 s: see {}",
                    self.root.join("logs/poller-latency.log").display()
                );
            }
            // The poller's latency depends on where in its 1 s period a
            // change lands: a random pause spreads the changes over it
            // instead of always landing just after a sweep.
            let samples =
                self.time_updates(&ns, file, &mut renames, 'K', Some(Duration::from_secs(1)));
            drop(poller);
            Some(samples)
        } else {
            None
        };

        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        for (name, samples) in [
            ("podstamp (watch, 3 plugins)", &podstamp),
            ("kubectl poller (1 s, no plugins)", &poller),
        ] {
            match samples {
                Some(s) => s.row(name),
                None => println!("  {name:<34} (not measured)"),
            }
        }
        if let (Some(p), Some(k)) = (&podstamp, &poller)
            && let (Some(pp), Some(kp)) = (p.percentile(0.5), k.percentile(0.5))
        {
            let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64().max(1e-9);
            println!(
                "  poller / podstamp: p50 {:.0}x, p99 {:.0}x",
                ratio(pp, kp),
                ratio(
                    p.percentile(0.99).unwrap_or(pp),
                    k.percentile(0.99).unwrap_or(kp)
                )
            );
        }
        if let Some(p99) = podstamp.as_ref().and_then(|s| s.percentile(0.99)) {
            let lost = podstamp.as_ref().map_or(0, |s| s.lost + s.errors.len());
            println!(
                "  target: podstamp p99 < 100 ms: {} ({}){}",
                ms(p99),
                verdict(p99 < Duration::from_millis(100) && lost == 0),
                if lost > 0 {
                    format!(", {lost} updates lost or failed")
                } else {
                    String::new()
                }
            );
        }
        for (name, samples) in [("podstamp", &podstamp), ("poller", &poller)] {
            if let Some(e) = samples.as_ref().and_then(|s| s.errors.first()) {
                println!("  {name}: first failed update: {e}");
            }
        }
    }
}
