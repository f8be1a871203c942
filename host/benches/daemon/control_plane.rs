//! `control-plane`: a self-hosted API server (the harness's, run by the
//! real kubelet of `podstamp-node` as a static pod, its PodTemplate stored
//! in itself: tests/controlplane/support.rs) changed by hand and through
//! podstamp in turn, the same harmless change (a new `--v` level) each
//! time: the API's downtime side by side.
//!
//! By hand, podstamp is not running (it would restore its file): the
//! manifest podstamp would write is renamed into the kubelet's directory,
//! and the stored template is then patched to match. Through podstamp, it
//! starts (and leaves the file as it is), the template is patched, and it
//! is stopped once `RolloutSucceeded` is reported. The two sides alternate
//! which goes first, pair by pair. Held under the
//! machine-wide node lock of the kubelet tests; the node is torn down by
//! its `Drop` (by PID), its directory swept at the next start.

use std::fs;
use std::time::{Duration, Instant};

use crate::bench::Bench;
use crate::controlplane::{Measured, SelfHosted, print_side_by_side};
use crate::kubelet::node_bench;
use crate::node::leftovers;
use crate::report::Samples;

const NODE: &str = "bench-cp";

impl Bench {
    /// `changes` of each kind, alternating by hand and through podstamp.
    pub fn control_plane(&mut self, changes: usize) {
        println!(
            "\n== self-hosted API server: a harmless flag changed, API downtime by hand vs through podstamp ({changes} changes each) =="
        );
        let Some((dir, lock)) = node_bench(NODE) else {
            return;
        };
        let control = SelfHosted::bootstrap(&dir, NODE, &["--v=0"], |_| {});
        control.wait_running_with("--v=0", None, Instant::now());
        let history = dir.join("history");
        let _ = fs::remove_dir_all(&history);
        let mut level = 0;
        let mut by_hand: Vec<Measured> = Vec::new();
        let mut through_podstamp: Vec<Measured> = Vec::new();
        // The order alternates pair by pair (by hand first, then podstamp
        // first): a change made soon after the other may find the kubelet
        // still backing off from the outage before it, and the side that
        // always came second would pay for it.
        for change in 0..changes {
            let podstamp_first = change % 2 == 1;
            for side in 0..2 {
                level += 1;
                let flag = format!("--v={level}");
                if (side == 0) != podstamp_first {
                    by_hand.push(control.change_by_hand(&[&flag], &flag));
                    // podstamp's template made to match what now runs.
                    control.admin().patch_template(
                        crate::controlplane::TEMPLATE,
                        control.flags_patch(&[&flag]),
                    );
                    continue;
                }
                let daemon = control.start_podstamp(&history, &format!("podstamp-{change}.log"));
                let before = control.revision().unwrap();
                control.wait_status(&daemon, "ready", &before);
                let m = control.change_through_podstamp(&daemon, &[&flag], &flag);
                let after = control.revision().unwrap();
                let confirmed = Instant::now();
                control.wait_event(&daemon, "RolloutSucceeded", &after);
                println!(
                    "  change {} ({} first): through podstamp {:.2}s down (RolloutSucceeded {:.1}s after its mirror pod was Ready)",
                    change + 1,
                    if podstamp_first {
                        "podstamp"
                    } else {
                        "by hand"
                    },
                    m.downtime.as_secs_f64(),
                    confirmed.elapsed().as_secs_f64()
                );
                through_podstamp.push(m);
                daemon.stop();
            }
            println!(
                "  change {}: by hand {:.2}s down",
                change + 1,
                by_hand.last().unwrap().downtime.as_secs_f64(),
            );
        }
        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "API downtime", "p50", "p90", "p99", "max", "mean", "lost"
        );
        let samples = |ms: &[Measured], f: fn(&Measured) -> Duration| Samples {
            took: ms.iter().map(f).collect(),
            ..Default::default()
        };
        let hand = samples(&by_hand, |m| m.downtime);
        let podstamp = samples(&through_podstamp, |m| m.downtime);
        hand.row("by hand (manifest renamed in)");
        podstamp.row("through podstamp (template patched)");
        samples(&through_podstamp, |m| m.written).row("  of which patched -> written");
        samples(&through_podstamp, |m| m.mirror_ready).row("through podstamp: -> mirror Ready");
        samples(&by_hand, |m| m.mirror_ready).row("by hand: -> mirror Ready");
        if let (Some(p), Some(h)) = (podstamp.percentile(0.5), hand.percentile(0.5)) {
            let ratio = p.as_secs_f64() / h.as_secs_f64();
            println!(
                "  downtime p50 podstamp / by hand: {ratio:.2} (target <= 1.2: {})",
                crate::report::verdict(ratio <= 1.2)
            );
        }
        if let (Some(h), Some(p)) = (by_hand.last(), through_podstamp.last()) {
            print_side_by_side(h, p);
        }
        let SelfHosted { mut node, .. } = control;
        let cgroup_root = node.cgroup_root.clone();
        let status = node.stop();
        let left = leftovers(&dir, &cgroup_root);
        println!(
            "  node torn down: {}; left running or mounted: {}",
            status.map_or("?".into(), |s| s.to_string()),
            if left.is_empty() {
                "nothing".into()
            } else {
                left.join(", ")
            }
        );
        drop(lock);
        let _ = fs::remove_dir_all(&dir);
    }
}
