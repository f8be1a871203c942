//! Rollouts: per template, the revision in the manifest directory and how
//! far the kubelet got with it: written → running → ready, or failed with
//! the kubelet's reason, or not Ready within the progress deadline.
//!
//! Pure bookkeeping, fed by the machine ([`super::Machine`]: what was
//! written or found in place, and what the mirror pods say); the machine
//! decides what the [`Verdict`]s call for (metrics, logs, Events, rollback).
//!
//! Invariants:
//! * Only the mirror pod of the revision in place counts: the old pod's
//!   status, still reported while it stops, never confirms or fails a new
//!   revision.
//! * A rollout gets one verdict, the first: Ready for [`STABLE`] without a
//!   break, within its deadline, is a success; a failing reason before that,
//!   or no such Ready by the deadline, a failure. Later statuses still
//!   update its phase (for the metrics).
//! * A revision found in place at start (not written by this run) is
//!   followed the same way, but its success is not announced again.
//! * The last status of each template's mirror pod is kept, and applies to
//!   a rollout that starts after it (a pod Ready before the daemon started,
//!   whose status never changes again, is still seen Ready).
//! * A revision the node itself shows no sandbox of (the kubelet has not
//!   acted on the file) when its deadline passes is the kubelet's fault,
//!   not the revision's (kubernetes/kubernetes#105543: a kubelet restarted
//!   while its API source is not ready starts no changed static pod): one
//!   with a revision to fall back to still fails, as [`KUBELET_NOT_STARTED`];
//!   one without (a first revision, or the one rolled back to) gets no
//!   verdict but a stall ([`Tracker::stalls`], once), and is judged anew,
//!   its deadline counted again, once the kubelet starts it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::daemon::inbox::{Observation, PodState};

/// The PodTemplate annotation that sets how long a new revision has to
/// become Ready.
pub const DEADLINE_ANNOTATION: &str = "podstamp.io/progress-deadline";
/// Five minutes: a changed static pod alone takes 10–15 s to restart (the
/// kubelet's fixed back-off), and a real image pull can take minutes.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);
/// The reason of a revision not Ready within its deadline.
pub const DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
/// The reason of a revision the kubelet never made a sandbox for.
pub const KUBELET_NOT_STARTED: &str = "KubeletNotStarted";
/// The kubelet issue that explains it, named wherever it is reported.
pub const KUBELET_ISSUE: &str = "kubernetes/kubernetes#105543";

/// What is said of a revision the kubelet has not started `after` its
/// write: the same words in the log, the Event and `podstamp status`.
pub fn not_started(revision: &str, after: Duration) -> String {
    format!(
        "the kubelet has not started revision {revision}: no sandbox after {} s; {KUBELET_ISSUE}",
        after.as_secs()
    )
}

/// How long a revision must stay Ready, without a break, to succeed: a
/// container that exits at once is reported Ready for a moment first (seen
/// with the real kubelet), and its crash shows within a second or two.
pub const STABLE: Duration = Duration::from_secs(10);

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
    /// Since when its mirror pod is Ready, without a break.
    pub ready_since: Option<Instant>,
    /// Its mirror pod, once seen.
    pub pod: Option<ObjectReference>,
    /// The node's own evidence showed no sandbox of it last (the kubelet
    /// has not acted on the file).
    pub no_sandbox: bool,
    /// Its last status came from the node's own evidence, not the mirror
    /// pod ([`Rollout::evidence`]).
    pub local: bool,
    /// Its stall, once reported ([`Tracker::stalls`]): how long after its
    /// write the kubelet still had not started it.
    pub stalled: Option<Duration>,
}

impl Rollout {
    /// What its last status came from, as the log says which evidence
    /// decided its verdict.
    pub fn evidence(&self) -> &'static str {
        if self.local {
            "the node itself (the container runtime and the pod's probes; the mirror pod could not be followed)"
        } else {
            "the mirror pod"
        }
    }
}

#[derive(Default)]
pub struct Tracker {
    /// Boxed: see [`super::slots`]'s `reported`.
    rollouts: BTreeMap<String, Box<Rollout>>,
    /// Per template, the last revision seen Ready.
    good: BTreeMap<String, String>,
    /// Per template, what its mirror pod said last.
    seen: BTreeMap<String, Observation>,
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
            Box::new(Rollout {
                revision: revision.to_string(),
                phase: Phase::Written,
                written,
                started: now,
                deadline: now + deadline,
                previous,
                verdict: None,
                ready_since: None,
                pod: None,
                no_sandbox: false,
                local: false,
                stalled: None,
            }),
        );
        true
    }

    /// A rollback: `revision` is written back and has nothing to fall back
    /// to itself.
    pub fn start_rollback(&mut self, id: &str, revision: &str, deadline: Duration, now: Instant) {
        self.rollouts.remove(id);
        // What was seen of this revision is of its pod before the failed
        // one replaced it: the kubelet starts it anew.
        self.seen.remove(id);
        self.start(id, revision, true, deadline, None, now);
        if let Some(r) = self.rollouts.get_mut(id) {
            r.previous = None;
        }
    }

    /// Forgets the rollouts without a verdict: nothing can be known of them
    /// for now; they are followed anew (as found in place) later. Returns
    /// those this daemon wrote (template, revision), so that following them
    /// anew still reports them as its own.
    pub fn drop_pending(&mut self) -> Vec<(String, String)> {
        let mut written = Vec::new();
        self.rollouts.retain(|id, r| {
            if r.verdict.is_none() && r.written {
                written.push((id.clone(), r.revision.clone()));
            }
            r.verdict.is_some()
        });
        written
    }

    pub fn get(&self, id: &str) -> Option<&Rollout> {
        self.rollouts.get(id).map(|rollout| &**rollout)
    }

    pub fn forget(&mut self, id: &str) {
        self.rollouts.remove(id);
        self.good.remove(id);
        self.seen.remove(id);
    }

    /// What template `id`'s mirror pod said last, if it is of the revision
    /// in place: to apply to a rollout that just started.
    pub fn seen_in_place(&self, id: &str) -> Option<Observation> {
        let seen = self.seen.get(id)?;
        (self.rollouts.get(id)?.revision == seen.revision).then(|| seen.clone())
    }

    /// Applies what a mirror pod says; the verdict, if this gives the
    /// rollout its first, and the phase when it changed. None also when the
    /// pod is not of the revision in place.
    #[cfg(test)]
    pub fn observe(&mut self, o: &Observation, now: Instant) -> Option<(Phase, Option<Verdict>)> {
        self.observe_from(o, false, now)
    }

    /// [`Tracker::observe`], `local`: what the node itself shows (where
    /// `Pending` means no sandbox), not a mirror pod.
    pub fn observe_from(
        &mut self,
        o: &Observation,
        local: bool,
        now: Instant,
    ) -> Option<(Phase, Option<Verdict>)> {
        if self.seen.get(&o.source) != Some(o) {
            self.seen.insert(o.source.clone(), o.clone());
        }
        let rollout = self.rollouts.get_mut(&o.source)?;
        if rollout.revision != o.revision {
            return None;
        }
        rollout.local = local;
        rollout.no_sandbox = local && o.state == PodState::Pending;
        if !rollout.no_sandbox
            && rollout.verdict.is_none()
            && rollout.stalled.is_some()
            && now >= rollout.deadline
        {
            // Started at last: judged from now, as if just written.
            let deadline = rollout.deadline - rollout.started;
            rollout.started = now;
            rollout.deadline = now + deadline;
        }
        rollout.pod = Some(o.pod.clone());
        let phase = match &o.state {
            PodState::Pending => Phase::Written,
            PodState::Running => Phase::Running,
            PodState::Ready => Phase::Ready,
            PodState::Failed { .. } => Phase::Failed,
        };
        let changed = rollout.phase != phase;
        rollout.phase = phase;
        if rollout.verdict.is_some() {
            return changed.then_some((phase, None));
        }
        match &o.state {
            PodState::Failed { reason, message } => {
                let verdict = Verdict::Failed {
                    reason: reason.clone(),
                    message: message.clone(),
                };
                rollout.verdict = Some(verdict.clone());
                return Some((phase, Some(verdict)));
            }
            PodState::Ready => {
                rollout.ready_since.get_or_insert(now);
            }
            // A container that exits at once is Ready for a moment first.
            PodState::Pending | PodState::Running => rollout.ready_since = None,
        }
        changed.then_some((phase, None))
    }

    /// The rollouts found stalled at `now`, each once: past its deadline,
    /// no sandbox of it on the node, and nothing to fall back to (see the
    /// module's invariants); (template, revision, since its write).
    pub fn stalls(&mut self, now: Instant) -> Vec<(String, String, Duration)> {
        let mut found = Vec::new();
        for (id, r) in &mut self.rollouts {
            if r.verdict.is_none()
                && r.stalled.is_none()
                && r.no_sandbox
                && r.previous.is_none()
                && now >= r.deadline
            {
                let after = now.saturating_duration_since(r.started);
                r.stalled = Some(after);
                found.push((id.clone(), r.revision.clone(), after));
            }
        }
        found
    }

    /// The verdicts due at `now`: a success for a rollout Ready for
    /// [`STABLE`] without a break, a failure for one past its deadline.
    /// A stalled rollout ([`Tracker::stalls`]) waits for the kubelet.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, Verdict)> {
        let mut due = Vec::new();
        for (id, r) in &mut self.rollouts {
            if r.verdict.is_some() || (r.no_sandbox && r.previous.is_none()) {
                continue;
            }
            let verdict = if r.ready_since.is_some_and(|t| now >= t + STABLE) {
                self.good.insert(id.clone(), r.revision.clone());
                Verdict::Succeeded
            } else if now >= r.deadline && r.no_sandbox {
                r.phase = Phase::Failed;
                Verdict::Failed {
                    reason: KUBELET_NOT_STARTED.into(),
                    message: not_started(&r.revision, now.saturating_duration_since(r.started)),
                }
            } else if now >= r.deadline {
                r.phase = Phase::Failed;
                Verdict::Failed {
                    reason: DEADLINE_EXCEEDED.into(),
                    message: format!(
                        "not Ready for {STABLE:?} within its progress deadline of {:?} ({DEADLINE_ANNOTATION})",
                        r.deadline - r.started,
                    ),
                }
            } else {
                continue;
            };
            r.verdict = Some(verdict.clone());
            due.push((id.clone(), verdict));
        }
        due
    }

    /// When [`Tracker::expire`] next has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.rollouts
            .values()
            .filter(|r| r.verdict.is_none() && !(r.stalled.is_some() && r.no_sandbox))
            .map(|r| match r.ready_since {
                Some(t) => r.deadline.min(t + STABLE),
                None => r.deadline,
            })
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
            pod: ObjectReference::default(),
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    fn crash() -> PodState {
        PodState::Failed {
            reason: "CrashLoopBackOff".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn ready_for_a_while_succeeds_and_only_the_revision_in_place_counts() {
        let mut t = Tracker::default();
        let now = Instant::now();
        assert!(t.start("ns/web", "r1", true, MINUTE, None, now));
        assert!(!t.start("ns/web", "r1", true, MINUTE, None, now));
        assert_eq!(t.observe(&seen("r0", PodState::Ready), now), None);
        assert_eq!(
            t.observe(&seen("r1", PodState::Running), now),
            Some((Phase::Running, None))
        );
        assert_eq!(
            t.observe(&seen("r1", PodState::Ready), now),
            Some((Phase::Ready, None))
        );
        assert_eq!(t.next_deadline(), Some(now + STABLE));
        assert!(t.expire(now + STABLE / 2).is_empty());
        assert_eq!(
            t.expire(now + STABLE),
            vec![("ns/web".to_string(), Verdict::Succeeded)]
        );
        assert_eq!(t.next_deadline(), None);
        // The next revision falls back to the one that succeeded.
        t.start("ns/web", "r2", true, MINUTE, Some("r0".into()), now);
        assert_eq!(t.get("ns/web").unwrap().previous.as_deref(), Some("r1"));
    }

    #[test]
    fn a_moment_ready_then_a_crash_is_a_failure() {
        let mut t = Tracker::default();
        let now = Instant::now();
        t.start("ns/web", "r2", true, MINUTE, Some("r1".into()), now);
        t.observe(&seen("r2", PodState::Ready), now);
        t.observe(&seen("r2", PodState::Running), now + STABLE / 2);
        // The break restarts the count.
        assert!(t.expire(now + STABLE).is_empty());
        let (phase, verdict) = t.observe(&seen("r2", crash()), now + STABLE).unwrap();
        assert_eq!(phase, Phase::Failed);
        assert!(
            matches!(verdict, Some(Verdict::Failed { reason, .. }) if reason == "CrashLoopBackOff")
        );
        // One verdict only; later changes of phase are still told.
        assert_eq!(t.observe(&seen("r2", crash()), now), None);
        assert_eq!(
            t.observe(&seen("r2", PodState::Running), now),
            Some((Phase::Running, None))
        );
        assert!(t.expire(now + MINUTE * 2).is_empty());
    }

    #[test]
    fn a_first_revision_has_nothing_to_fall_back_to_and_deadlines_expire() {
        let mut t = Tracker::default();
        let now = Instant::now();
        t.start("ns/web", "r1", true, MINUTE, None, now);
        assert_eq!(t.get("ns/web").unwrap().previous, None);
        assert_eq!(t.next_deadline(), Some(now + MINUTE));
        assert!(t.expire(now).is_empty());
        t.observe(&seen("r1", PodState::Running), now);
        let failed = t.expire(now + MINUTE);
        assert!(matches!(&failed[..], [(id, Verdict::Failed { reason, .. })]
            if id == "ns/web" && reason == DEADLINE_EXCEEDED));
        assert_eq!(t.get("ns/web").unwrap().phase, Phase::Failed);
        assert!(t.expire(now + MINUTE * 2).is_empty());
    }

    #[test]
    fn the_evidence_that_decided_is_the_last_status_s() {
        let mut t = Tracker::default();
        let now = Instant::now();
        t.start("ns/web", "r1", true, MINUTE, None, now);
        assert_eq!(t.get("ns/web").unwrap().evidence(), "the mirror pod");
        t.observe_from(&seen("r1", PodState::Ready), true, now);
        assert!(
            t.get("ns/web")
                .unwrap()
                .evidence()
                .starts_with("the node itself")
        );
        t.observe_from(&seen("r1", PodState::Running), false, now);
        assert_eq!(t.get("ns/web").unwrap().evidence(), "the mirror pod");
    }

    #[test]
    fn a_status_seen_before_the_rollout_applies_to_it() {
        let mut t = Tracker::default();
        let now = Instant::now();
        t.observe(&seen("r1", PodState::Ready), now);
        t.start("ns/web", "r1", false, MINUTE, None, now);
        assert_eq!(t.seen_in_place("ns/web"), Some(seen("r1", PodState::Ready)));
        t.start_rollback("ns/web", "r0", MINUTE, now);
        assert_eq!(t.seen_in_place("ns/web"), None);
    }
}
