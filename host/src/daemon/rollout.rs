//! Rollouts: per template, the revision in the manifest directory and how
//! far the kubelet got with it: written → running → ready, or failed with
//! the kubelet's reason, or not Ready within the progress deadline.
//!
//! Pure bookkeeping, fed by the reconciler (what it wrote or found in
//! place) and by the mirror pods ([`super::mirror`]); the reconciler acts on
//! the [`Verdict`]s (metrics, logs, Events, rollback).
//!
//! Invariants:
//! * Only the mirror pod of the revision in place counts: the old pod's
//!   status, still reported while it stops, never confirms or fails a new
//!   revision.
//! * A rollout gets one verdict, the first: Ready within its deadline is a
//!   success; a failing reason, or no Ready by the deadline, a failure.
//!   Later statuses still update its phase (for the metrics).
//! * A revision found in place at start (not written by this run) is
//!   followed the same way, but its success is not announced again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::mirror::{Observation, PodState};

/// The PodTemplate annotation that sets how long a new revision has to
/// become Ready.
pub const DEADLINE_ANNOTATION: &str = "podstamp.io/progress-deadline";
/// Five minutes: a changed static pod alone takes 10–15 s to restart (the
/// kubelet's fixed back-off), and a real image pull can take minutes.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);
/// The reason of a revision not Ready within its deadline.
pub const DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Written,
    Running,
    Ready,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Written => "written",
            Phase::Running => "running",
            Phase::Ready => "ready",
            Phase::Failed => "failed",
        }
    }
}

/// How a rollout ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Failed { reason: String, message: String },
}

#[derive(Debug, Clone)]
pub struct Rollout {
    pub revision: String,
    pub phase: Phase,
    /// Written by this run (its success is announced), or found in place.
    pub written: bool,
    pub started: Instant,
    pub deadline: Instant,
    /// The revision to go back to should this one fail; None when there is
    /// none (a first revision, or a rollback itself).
    pub previous: Option<String>,
    pub verdict: Option<Verdict>,
}

#[derive(Default)]
pub struct Tracker {
    rollouts: BTreeMap<String, Rollout>,
    /// Per template, the last revision seen Ready.
    good: BTreeMap<String, String>,
}

impl Tracker {
    /// `revision` is now template `id`'s manifest. Nothing changes if it
    /// already was. The revision to fall back to is the last one seen Ready,
    /// or else `fallback` (what the revision history holds).
    pub fn start(
        &mut self,
        id: &str,
        revision: &str,
        written: bool,
        deadline: Duration,
        fallback: Option<String>,
        now: Instant,
    ) -> bool {
        if self
            .rollouts
            .get(id)
            .is_some_and(|r| r.revision == revision)
        {
            return false;
        }
        let previous = self
            .good
            .get(id)
            .cloned()
            .or(fallback)
            .filter(|p| p != revision);
        self.rollouts.insert(
            id.to_string(),
            Rollout {
                revision: revision.to_string(),
                phase: Phase::Written,
                written,
                started: now,
                deadline: now + deadline,
                previous,
                verdict: None,
            },
        );
        true
    }

    /// A rollback: `revision` is written back and has nothing to fall back
    /// to itself.
    pub fn start_rollback(&mut self, id: &str, revision: &str, deadline: Duration, now: Instant) {
        self.rollouts.remove(id);
        self.start(id, revision, true, deadline, None, now);
        if let Some(r) = self.rollouts.get_mut(id) {
            r.previous = None;
        }
    }

    pub fn get(&self, id: &str) -> Option<&Rollout> {
        self.rollouts.get(id)
    }

    pub fn forget(&mut self, id: &str) {
        self.rollouts.remove(id);
        self.good.remove(id);
    }

    /// Applies what a mirror pod says; the verdict, if this gives the
    /// rollout its first. None also when the pod is not of the revision in
    /// place.
    pub fn observe(&mut self, o: &Observation) -> Option<(Phase, Option<Verdict>)> {
        let rollout = self.rollouts.get_mut(&o.source)?;
        if rollout.revision != o.revision {
            return None;
        }
        let (phase, verdict) = match &o.state {
            PodState::Pending => (Phase::Written, None),
            PodState::Running => (Phase::Running, None),
            PodState::Ready => (Phase::Ready, Some(Verdict::Succeeded)),
            PodState::Failed { reason, message } => (
                Phase::Failed,
                Some(Verdict::Failed {
                    reason: reason.clone(),
                    message: message.clone(),
                }),
            ),
        };
        // Before a verdict the phase only moves forward (a late status of
        // a pod starting again says nothing new); after it, it follows.
        if rollout.verdict.is_none() && phase == Phase::Written {
            return None;
        }
        let changed = rollout.phase != phase;
        rollout.phase = phase;
        if phase == Phase::Ready {
            self.good.insert(o.source.clone(), o.revision.clone());
        }
        if rollout.verdict.is_some() {
            return changed.then_some((phase, None));
        }
        if !changed && verdict.is_none() {
            return None;
        }
        rollout.verdict = verdict.clone();
        Some((phase, verdict))
    }

    /// Fails the rollouts past their deadline without a verdict.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, Verdict)> {
        let mut failed = Vec::new();
        for (id, r) in &mut self.rollouts {
            if r.verdict.is_none() && now >= r.deadline {
                let verdict = Verdict::Failed {
                    reason: DEADLINE_EXCEEDED.into(),
                    message: format!(
                        "not Ready within its progress deadline of {:?} ({DEADLINE_ANNOTATION}); last phase {}",
                        r.deadline - r.started,
                        r.phase.as_str()
                    ),
                };
                r.phase = Phase::Failed;
                r.verdict = Some(verdict.clone());
                failed.push((id.clone(), verdict));
            }
        }
        failed
    }

    /// The next deadline of a rollout without a verdict.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.rollouts
            .values()
            .filter(|r| r.verdict.is_none())
            .map(|r| r.deadline)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(revision: &str, state: PodState) -> Observation {
        Observation {
            source: "ns/web".into(),
            revision: revision.into(),
            state,
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn written_running_ready_and_only_the_revision_in_place_counts() {
        let mut t = Tracker::default();
        let now = Instant::now();
        assert!(t.start("ns/web", "r1", true, MINUTE, None, now));
        assert!(!t.start("ns/web", "r1", true, MINUTE, None, now));
        assert_eq!(t.observe(&seen("r0", PodState::Ready)), None);
        assert_eq!(
            t.observe(&seen("r1", PodState::Running)),
            Some((Phase::Running, None))
        );
        assert_eq!(
            t.observe(&seen("r1", PodState::Ready)),
            Some((Phase::Ready, Some(Verdict::Succeeded)))
        );
        assert_eq!(t.next_deadline(), None);
        // The next revision falls back to the one seen Ready.
        t.start("ns/web", "r2", true, MINUTE, Some("r0".into()), now);
        assert_eq!(t.get("ns/web").unwrap().previous.as_deref(), Some("r1"));
        let failed = PodState::Failed {
            reason: "CrashLoopBackOff".into(),
            message: "m".into(),
        };
        let (phase, verdict) = t.observe(&seen("r2", failed.clone())).unwrap();
        assert_eq!(phase, Phase::Failed);
        assert!(
            matches!(verdict, Some(Verdict::Failed { reason, .. }) if reason == "CrashLoopBackOff")
        );
        // One verdict only; later changes of phase are still told.
        assert_eq!(t.observe(&seen("r2", failed)), None);
        assert_eq!(
            t.observe(&seen("r2", PodState::Running)),
            Some((Phase::Running, None))
        );
    }

    #[test]
    fn a_first_revision_has_nothing_to_fall_back_to_and_deadlines_expire() {
        let mut t = Tracker::default();
        let now = Instant::now();
        t.start("ns/web", "r1", true, MINUTE, None, now);
        assert_eq!(t.get("ns/web").unwrap().previous, None);
        assert_eq!(t.next_deadline(), Some(now + MINUTE));
        assert!(t.expire(now).is_empty());
        t.observe(&seen("r1", PodState::Running));
        let failed = t.expire(now + MINUTE);
        assert!(
            matches!(&failed[..], [(id, Verdict::Failed { reason, message })]
            if id == "ns/web" && reason == DEADLINE_EXCEEDED && message.contains("last phase running"))
        );
        assert_eq!(t.get("ns/web").unwrap().phase, Phase::Failed);
        assert!(t.expire(now + MINUTE * 2).is_empty());
    }
}
