//! One declared probe's record, kept as the kubelet keeps it: results
//! counted against the probe's own `successThreshold` and
//! `failureThreshold`, run every `periodSeconds` once `initialDelaySeconds`
//! passed since its container started. Pure: the shell runs the probe
//! ([`super::run`]) and gives the result.
//!
//! Invariants:
//! * A probe runs only while its container runs (as the runtime shows it),
//!   and its record starts anew with each container start: the results of
//!   a container that exited never count against the next.
//! * Not passing until `successThreshold` successes in a row; failed once
//!   `failureThreshold` failures in a row; a startup probe that passed is
//!   done (it runs no more for that container, as with the kubelet).

use std::time::{Duration, Instant};

use super::spec::{Kind, Probe};
use crate::daemon::rollout::local::LocalProbe;

#[derive(Debug, Clone)]
pub struct Record {
    pub probe: Probe,
    /// The container start it counts for (its restart count), and when it
    /// was first seen running; None while the container does not run.
    started: Option<(u32, Instant)>,
    next: Option<Instant>,
    passing: bool,
    successes: u32,
    failures: u32,
    message: String,
}

impl Record {
    pub fn new(probe: Probe) -> Record {
        Record {
            probe,
            started: None,
            next: None,
            passing: false,
            successes: 0,
            failures: 0,
            message: "not run yet".into(),
        }
    }

    /// The container runs (`Some(restart count)`) or not (`None`), as seen
    /// at `now`.
    pub fn container(&mut self, running: Option<u32>, now: Instant) {
        match running {
            Some(restarts) if self.started.map(|(r, _)| r) == Some(restarts) => {}
            Some(restarts) => {
                *self = Record::new(self.probe.clone());
                self.started = Some((restarts, now));
                self.next = Some(now + self.probe.initial_delay);
            }
            None => {
                if self.started.is_some() {
                    *self = Record::new(self.probe.clone());
                    self.message = "its container does not run".into();
                }
            }
        }
    }

    /// Whether the probe is to run at `now` (`gate`: the container's startup
    /// probe, if any, passed, for a readiness probe).
    pub fn due(&self, now: Instant, gate: bool) -> bool {
        let done = self.probe.kind == Kind::Startup && self.passing;
        gate && !done && self.next.is_some_and(|t| now >= t)
    }

    /// When it is next due, if it runs.
    pub fn next(&self) -> Option<Instant> {
        self.next
    }

    /// A result of the probe run at `now`: Ok, or what failed.
    pub fn result(&mut self, result: Result<(), String>, now: Instant) {
        if self.started.is_none() {
            return;
        }
        self.next = Some(now + self.probe.period.max(Duration::from_secs(1)));
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                if self.successes >= self.probe.success_threshold {
                    self.passing = true;
                }
                self.message.clear();
            }
            Err(message) => {
                self.successes = 0;
                self.failures = self.failures.saturating_add(1);
                if self.failures >= self.probe.failure_threshold {
                    self.passing = false;
                }
                self.message = message;
            }
        }
    }

    pub fn passing(&self) -> bool {
        self.passing
    }

    /// The record as local evidence.
    pub fn local(&self) -> LocalProbe {
        LocalProbe {
            what: self.probe.what(),
            passing: self.passing,
            failures: self.failures,
            failure_threshold: self.probe.failure_threshold,
            message: self.message.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::probes::spec::Action;

    fn probe(kind: Kind, success: u32, failure: u32) -> Probe {
        Probe {
            container: "c".into(),
            kind,
            action: Action::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
            },
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn thresholds_count_in_a_row_and_a_restart_starts_anew() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = Record::new(probe(Kind::Readiness, 2, 3));
        assert!(!r.due(t0, true), "not while the container does not run");
        r.container(Some(0), t0);
        assert!(!r.due(t0, true), "initialDelaySeconds first");
        assert!(r.due(t0 + 5 * s, true));
        assert!(!r.due(t0 + 5 * s, false), "gated by the startup probe");
        r.result(Ok(()), t0 + 5 * s);
        assert!(!r.passing(), "successThreshold 2");
        assert!(!r.due(t0 + 6 * s, true), "periodSeconds 2");
        r.result(Ok(()), t0 + 7 * s);
        assert!(r.passing());
        r.result(Err("refused".into()), t0 + 9 * s);
        r.result(Err("refused".into()), t0 + 11 * s);
        assert!(r.passing(), "two failures of three");
        r.result(Err("refused".into()), t0 + 13 * s);
        let local = r.local();
        assert!(!local.passing);
        assert_eq!((local.failures, local.failure_threshold), (3, 3));
        assert_eq!(local.message, "refused");
        // Seen again with the same restart count: the same record.
        r.container(Some(0), t0 + 14 * s);
        assert_eq!(r.local().failures, 3);
        // Restarted: anew.
        r.container(Some(1), t0 + 15 * s);
        assert_eq!(r.local().failures, 0);
        assert!(!r.due(t0 + 15 * s, true));
        r.container(None, t0 + 16 * s);
        r.result(Err("late".into()), t0 + 16 * s);
        assert_eq!(r.local().failures, 0, "a result for a stopped container");
    }

    #[test]
    fn a_startup_probe_that_passed_is_done() {
        let t0 = Instant::now();
        let mut r = Record::new(probe(Kind::Startup, 1, 3));
        r.container(Some(0), t0);
        r.result(Ok(()), t0 + Duration::from_secs(5));
        assert!(r.passing());
        assert!(!r.due(t0 + Duration::from_secs(60), true));
    }
}
