//! A static pod's own probes, run by podstamp against the node while the
//! mirror pod cannot be followed: so that local evidence calls a revision
//! ready when the template's author said it is (its `startupProbe` and
//! `readinessProbe` pass), not when a process exists.
//!
//! One concern per file: `spec` (which probes a pod declares, and which
//! podstamp runs), `record` (one probe's results against its thresholds),
//! `run` (one probe's action, as the kubelet runs it).
//!
//! Invariants:
//! * A [`Prober`] is for one revision's pod: a new revision in place gets a
//!   new one (no result of another revision's container ever counts).
//! * A readiness probe runs only once its container's startup probe (if
//!   declared) passed, as with the kubelet.
//! * Probes are run one after another, each bounded by its own
//!   `timeoutSeconds`: a poll never takes longer than the sum of the due
//!   probes' timeouts.

pub mod record;
pub mod run;
pub mod spec;

use std::time::Instant;

use serde_json::Value;

use crate::daemon::rollout::local::{ContainerState, LocalContainer, LocalProbe};
use record::Record;
use spec::Kind;

/// The probes of one revision's pod, and their records.
#[derive(Debug, Clone)]
pub struct Prober {
    records: Vec<Record>,
    /// The declared probes podstamp does not run, and why (for the log).
    pub not_run: Vec<String>,
}

impl Prober {
    /// The prober of `pod` (a static pod manifest as JSON).
    pub fn new(pod: &Value) -> Prober {
        let declared = spec::declared(pod);
        Prober {
            records: declared.run.into_iter().map(Record::new).collect(),
            not_run: declared.not_run,
        }
    }

    /// The pod's containers as the runtime shows them at `now`.
    pub fn containers(&mut self, containers: &[LocalContainer], now: Instant) {
        for r in &mut self.records {
            let running = containers
                .iter()
                .find(|c| c.name == r.probe.container)
                .filter(|c| c.state == ContainerState::Running)
                .map(|c| c.restart_count);
            r.container(running, now);
        }
    }

    /// Runs the probes due at `now`, one after another.
    pub async fn run_due(&mut self, now: Instant) {
        for i in 0..self.records.len() {
            let gate = self.startup_passed(&self.records[i].probe.container, i);
            if !self.records[i].due(now, gate) {
                continue;
            }
            let probe = &self.records[i].probe;
            let result = run::run(&probe.action, probe.timeout).await;
            if let Err(e) = &result {
                tracing::debug!(probe = %probe.what(), "probe failed: {e}");
            }
            self.records[i].result(result, Instant::now());
        }
    }

    /// Whether the startup probe of `container` passed (or none is
    /// declared), for record `i` (a startup probe is not gated).
    fn startup_passed(&self, container: &str, i: usize) -> bool {
        if self.records[i].probe.kind == Kind::Startup {
            return true;
        }
        self.records
            .iter()
            .filter(|r| r.probe.kind == Kind::Startup && r.probe.container == container)
            .all(Record::passing)
    }

    /// The records as local evidence.
    pub fn local(&self) -> Vec<LocalProbe> {
        self.records.iter().map(Record::local).collect()
    }

    /// The next time a probe may be due.
    pub fn next(&self) -> Option<Instant> {
        self.records.iter().filter_map(Record::next).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[tokio::test]
    async fn readiness_waits_for_startup_and_only_a_running_container_is_probed() {
        // Nothing listens on the port bound then freed.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let pod = json!({"spec": {"hostNetwork": true, "containers": [{"name": "c",
            "startupProbe": {"tcpSocket": {"port": port}, "failureThreshold": 2, "periodSeconds": 1},
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}});
        let mut p = Prober::new(&pod);
        let now = Instant::now();
        p.run_due(now).await;
        assert!(
            p.local().iter().all(|l| l.failures == 0),
            "not running: not probed"
        );
        let running = LocalContainer {
            name: "c".into(),
            state: ContainerState::Running,
            restart_count: 0,
            image_missing: None,
        };
        p.containers(std::slice::from_ref(&running), now);
        p.run_due(now).await;
        let local = p.local();
        assert_eq!(local[0].failures, 1, "{local:?}");
        assert_eq!(local[1].failures, 0, "readiness waits for startup");
        p.run_due(now + Duration::from_secs(2)).await;
        let local = p.local();
        assert_eq!((local[0].failures, local[0].passing), (2, false));
        assert!(local[0].what.starts_with("startup"), "{}", local[0].what);
        assert!(local[0].message.contains("refused"), "{}", local[0].message);
    }
}
