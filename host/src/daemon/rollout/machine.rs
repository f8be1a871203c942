//! The rollout machine: every decision about a revision once it is
//! rendered — may it be written now, is it followed, did it succeed, is it
//! rolled back, what do the other nodes hear — taken without I/O.
//!
//! It is fed what happened (a render's outcome, a mirror pod's status, the
//! coordinator's answer, the clock) and queues [`Effect`]s that its shell,
//! the reconciler, carries out in order ([`Machine::take_effects`]). Time is
//! an argument (`now`), never read here, except the wall-clock stamp of a
//! failure record that the other nodes read ([`Machine::with_clock`]).
//!
//! Invariants (each has a table test below):
//! * A rollout is followed only while the pods watch follows (it listed and
//!   has not failed since), or while local evidence is available
//!   ([`Machine::local_available`], [`super::local`]): without either no
//!   deadline runs and nothing is rolled back; a revision written meanwhile
//!   is followed as this daemon's own once it can be (not as one found in
//!   place). Local evidence judges only while the mirror pod cannot be
//!   followed: when it can, the mirror pod decides.
//! * One verdict per rollout ([`super::tracker`]); a failed revision with a
//!   revision to fall back to is rolled back ([`Effect::RollBack`]) and, once
//!   the good one is back in place, held: not written again while the
//!   template renders it. A first revision has nothing to fall back to: it
//!   stays. A revision the kubelet never made a sandbox for, seen on the
//!   node, is reported as the kubelet's stall (kubernetes/kubernetes#105543:
//!   the log, a `KubeletNotStarted` Event, [`Effect::Stalled`], the node's
//!   status message), never as that revision's failure when there is
//!   nothing to fall back to.
//! * What a restart must know ([`RolloutState`]: good, held, pending) is
//!   saved ([`Effect::SaveState`]) whenever it changes, and a revision is
//!   marked pending before its file is written.
//! * Across nodes ([`Slots`]): a verdict's failure is reported before the
//!   slot is released; a slot is never released while rollouts cannot be
//!   followed; a target that failed anywhere is not written here, nor a
//!   target of a change that failed on another node (its settings may
//!   differ from this node's: the change is what failed). A failure here
//!   names its change until this node confirms a written update to
//!   another target of the same change, rendered while nothing is held:
//!   then the change is not what failed (this node's settings were), and
//!   its halt is lifted on the others; a rollback confirmed never lifts
//!   it. A quorum
//!   member's slot ([`Policy::Quorum`]) is released only once the revision
//!   in place is Ready: after a failure, the one rolled back to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use super::effect::Effect;
use super::local::{LocalPodState, judge};
use super::slots::{Decision, Slots, phase_of};
use super::state::RolloutState;
use super::tracker::{KUBELET_ISSUE, Phase, Rollout, Tracker, Verdict, not_started};
use crate::daemon::inbox::{Answer, Observation};
use crate::fleet::{self, TemplateStatus, policy::Policy};
use crate::reason::Reason;

/// How long the mirror pod and the node itself may disagree before it is
/// said: a few polls (the node is looked at every second), since either
/// side sees a change a moment before the other.
pub const DISAGREE_AFTER: Duration = Duration::from_secs(5);

/// The mirror pod and the node disagreeing about template `id`'s revision
/// in place (see [`Machine::cross_check`]).
struct Disagreement {
    since: Instant,
    said: bool,
    what: String,
}

/// Why an update of a manifest in place is not written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// Waiting for a slot to write `target`.
    Waiting { target: String, slots: u32 },
    /// `target` failed on a node.
    Halted { target: String, why: String },
}

/// A render that ended with its template's manifest in place (written,
/// unchanged, held back or gated), as the shell tells the machine.
#[derive(Debug, Clone)]
pub struct InPlace {
    /// `namespace/name` of the template (`podstamp.io/source`).
    pub id: String,
    /// The revision the template renders.
    pub revision: String,
    /// The file was written by this render (not found already holding it).
    pub written: bool,
    /// The template's progress deadline.
    pub deadline: Duration,
    /// The revision rendered is held (it failed); the file keeps another.
    pub held: bool,
    /// The update is not written for now; the file keeps another revision.
    pub gated: Option<Gated>,
    /// The rollout target rendered (only when rollouts are coordinated).
    pub target: Option<String>,
    /// The target's change ([`fleet::change`]), beside it.
    pub change: Option<String>,
    /// The template's `metadata.generation`, for the node's record.
    pub generation: Option<i64>,
    /// The template is a member of a quorum ([`Policy::Quorum`]): known at
    /// every render, so that a restarted daemon keeps a slot it adopted
    /// until its revision in place is Ready.
    pub quorum: bool,
}

/// What the machine keeps of a template that rendered.
#[derive(Debug, Default)]
struct Known {
    gated: Option<Gated>,
    /// The revision in place, as last written or found.
    in_place: Option<String>,
    generation: Option<i64>,
    /// The change of the target the template renders, as last rendered.
    change: Option<String>,
}

/// A failed rollout whose rollback the shell is carrying out.
struct RollingBack {
    failed: Rollout,
    reason: String,
    message: String,
}

pub struct Machine {
    /// This node's name, for the Events' notes.
    node: String,
    tracker: Tracker,
    /// The pods watch has listed and not failed since.
    confirming: bool,
    /// Local evidence of what the kubelet runs can be read
    /// ([`Machine::local`]): rollouts are followed without the pods watch.
    local: bool,
    /// Revisions this daemon wrote while it could not follow rollouts, per
    /// template: once it can, they are followed as its own writes. Which
    /// comes first, the first render or the pods watch's list, is a race the
    /// outcome must not depend on.
    written_unfollowed: BTreeMap<String, String>,
    /// Rollouts across nodes; None when nothing coordinates (a `dir:`
    /// source).
    slots: Option<Slots>,
    /// Per template, what a restart must know, as loaded by the shell
    /// ([`Machine::load_state`]) and changed here; its `failed` is also
    /// the last failure this node reports to the others.
    /// Boxed: see [`super::slots`]'s `reported`.
    states: BTreeMap<String, Box<RolloutState>>,
    known: BTreeMap<String, Known>,
    rolling_back: BTreeMap<String, RollingBack>,
    /// What the node itself showed last, per template (judged without the
    /// probes while the mirror pod is followed: the kubelet runs them).
    local_seen: BTreeMap<String, Observation>,
    disagreements: BTreeMap<String, Disagreement>,
    effects: Vec<Effect>,
    /// The wall clock of a failure record (RFC 3339).
    clock: fn() -> String,
}

impl Machine {
    /// A machine for node `node`; `coordinated`: rollouts go across nodes
    /// through slots (the API source).
    pub fn new(node: &str, coordinated: bool) -> Machine {
        Machine {
            node: node.to_string(),
            tracker: Tracker::default(),
            confirming: false,
            local: false,
            written_unfollowed: BTreeMap::new(),
            slots: coordinated.then(Slots::default),
            states: BTreeMap::new(),
            known: BTreeMap::new(),
            rolling_back: BTreeMap::new(),
            local_seen: BTreeMap::new(),
            disagreements: BTreeMap::new(),
            effects: Vec::new(),
            clock: fleet::now_rfc3339,
        }
    }

    /// The same, its failure records stamped by `clock` (tests).
    pub fn with_clock(mut self, clock: fn() -> String) -> Machine {
        self.clock = clock;
        self
    }

    /// The effects decided since the last call, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    pub fn set_node(&mut self, node: &str) {
        self.node = node.to_string();
    }

    /// Whether rollouts go across nodes (and a render needs its target).
    pub fn coordinated(&self) -> bool {
        self.slots.is_some()
    }

    /// Whether template `id`'s rollout state was loaded.
    pub fn knows_state(&self, id: &str) -> bool {
        self.states.contains_key(id)
    }

    /// Template `id`'s rollout state as kept on disk (read by the shell
    /// once per template and run).
    pub fn load_state(&mut self, id: &str, state: RolloutState) {
        self.states.insert(id.to_string(), Box::new(state));
    }

    /// The rollout followed for template `id`: its revision, and whether
    /// this daemon wrote it (rather than found it in place).
    pub fn following(&self, id: &str) -> Option<(&str, bool)> {
        self.tracker
            .get(id)
            .map(|r| (r.revision.as_str(), r.written))
    }

    /// The next time [`Machine::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let disagreement = self
            .disagreements
            .values()
            .filter(|d| !d.said)
            .map(|d| d.since + DISAGREE_AFTER)
            .min();
        match (self.tracker.next_deadline(), disagreement) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `revision` of template `id` is held: it failed here and was
    /// rolled back.
    pub fn is_held(&self, id: &str, revision: &str) -> bool {
        self.states.get(id).and_then(|s| s.held.as_deref()) == Some(revision)
    }

    /// Whether template `id` is a quorum member, as it last rendered.
    pub fn is_quorum(&self, id: &str) -> bool {
        self.slots.as_ref().is_some_and(|s| s.is_quorum(id))
    }

    /// Template `id` holds no revision any more; the one it held, if any.
    pub fn unhold(&mut self, id: &str) -> Option<String> {
        let mut released = None;
        self.change_state(id, |s| released = s.held.take());
        released
    }

    /// Whether template `id` may replace its manifest in place with one of
    /// `target`, of `change`, now (None: yes). Only an update in place is
    /// asked about. `nodes`: the label selector of the nodes the template
    /// is for (empty: every node), what a share ([`Policy::Percent`]) is
    /// of.
    pub fn gate(
        &mut self,
        id: &str,
        target: &str,
        change: Option<&str>,
        policy: Policy,
        nodes: &str,
    ) -> Option<Gated> {
        let decision = self.with_slots(|slots| slots.decide(id, target, change, policy, nodes))?;
        match decision {
            Decision::Write => None,
            Decision::Wait { slots } => Some(Gated::Waiting {
                target: target.to_string(),
                slots,
            }),
            Decision::Halted(why) => Some(Gated::Halted {
                target: target.to_string(),
                why,
            }),
        }
    }

    /// Template `id`'s manifest already holds what it renders: nothing to
    /// write, a slot asked for is not needed.
    pub fn unchanged(&mut self, id: &str) {
        self.with_slots(|slots| slots.cancel(id));
    }

    /// `revision` of template `id`, whose progress deadline is `deadline`,
    /// is about to be written: a daemon killed right after the rename still
    /// follows it as its own after a restart, by the same deadline.
    pub fn writing(&mut self, id: &str, revision: &str, deadline: Duration) {
        self.change_state(id, |s| {
            s.pending = Some(revision.to_string());
            s.deadline = Some(deadline.as_secs());
        });
    }

    /// The progress deadline recorded at the write of `revision` of
    /// template `id`, while it is pending (for a daemon that cannot read
    /// the template).
    pub fn recorded_deadline(&self, id: &str, revision: &str) -> Option<Duration> {
        self.states.get(id)?.deadline_of(revision)
    }

    /// A render ended with its manifest in place. `history` gives, when
    /// asked, the newest other revision the revision history keeps (the
    /// fallback of a history kept before the rollout state was).
    pub fn in_place(
        &mut self,
        done: InPlace,
        history: impl FnOnce() -> Option<String>,
        now: Instant,
    ) {
        let id = done.id.as_str();
        let quorum = done.quorum;
        self.with_slots(|slots| slots.set_quorum(id, quorum));
        let known = self.known.entry(id.to_string()).or_default();
        known.generation = done.generation;
        if done.change.is_some() {
            known.change = done.change.clone();
        }
        if done.gated.is_none() && !done.held {
            known.in_place = Some(done.revision.clone());
        }
        if known.gated != done.gated {
            known.gated = done.gated.clone();
            match &done.gated {
                Some(Gated::Waiting { target, slots }) => {
                    tracing::info!(template = %id, target = %target,
                    "update waits for a rollout slot (at most {slots} node(s) updating at once); the manifest in place stays")
                }
                Some(Gated::Halted { why, .. }) => {
                    tracing::warn!(template = %id,
                        "update halted: {why}; the manifest in place stays until the template changes");
                    self.effects.push(Effect::Event {
                        id: id.to_string(),
                        reason: Reason::RolloutHalted,
                        note: format!(
                            "node {}: {why}; not written here until the template changes",
                            self.node
                        ),
                        related: None,
                    });
                }
                None => {}
            }
        }
        let moving = done.gated.is_none() && !done.held;
        if let Some(target) = &done.target
            && moving
        {
            let change = done.change.as_deref();
            self.with_slots(|slots| slots.remember(id, &done.revision, target, change));
        }
        if !done.held
            && let Some(held) = self.unhold(id)
        {
            tracing::info!(template = %id, revision = %done.revision, held = %held,
                "the template renders another revision; the failed one is no longer held");
        }
        if moving {
            self.track(&done, history, now);
        }
        self.report(id);
    }

    /// Whether rollouts are followed: through the mirror pods, or the
    /// node's own evidence.
    fn judging(&self) -> bool {
        self.confirming || self.local
    }

    /// Follows the revision now in place for `done`'s template.
    fn track(&mut self, done: &InPlace, history: impl FnOnce() -> Option<String>, now: Instant) {
        let id = done.id.as_str();
        if !self.judging() {
            if done.written {
                self.written_unfollowed
                    .insert(id.to_string(), done.revision.clone());
            }
            return;
        }
        if self
            .tracker
            .get(id)
            .is_some_and(|r| r.revision == done.revision)
        {
            return;
        }
        let written_before = self.written_unfollowed.remove(id);
        let state = self.states.get(id).cloned().unwrap_or_default();
        // Written by this daemon before a restart, and not judged yet.
        let pending = state.pending.as_deref() == Some(done.revision.as_str());
        let written =
            done.written || written_before.as_deref() == Some(done.revision.as_str()) || pending;
        // What to go back to when no revision was seen Ready in this run:
        // the last one that succeeded on this node (none, when that is this
        // one), or else the newest other revision the history keeps.
        let fallback = state.good.or_else(history);
        self.tracker
            .start(id, &done.revision, written, done.deadline, fallback, now);
        self.phase(id, &done.revision, Phase::Written);
        if written {
            tracing::info!(template = %id, revision = %done.revision, deadline = ?done.deadline,
                "rollout started: waiting for it to be Ready (the mirror pod says; the node itself while the mirror pod cannot be followed)");
        }
        if let Some(seen) = self.tracker.seen_in_place(id) {
            self.observe(seen, now);
        }
    }

    /// What a mirror pod of ours says.
    pub fn observe(&mut self, observation: Observation, now: Instant) {
        let id = observation.source.clone();
        self.observe_from(observation, false, now);
        self.cross_check(&id, now);
    }

    /// While both the mirror pod and the node itself can be read: do they
    /// agree on the revision in place? They disagree when the mirror pod
    /// says Ready and the node shows its containers not all running, or
    /// when the node shows them all running and the mirror pod says the
    /// pod failed. Said (a warning, [`Effect::Disagreed`]) once it lasted
    /// [`DISAGREE_AFTER`]; the mirror pod still decides: it is the
    /// kubelet's own word, covering what podstamp cannot see (`exec` and
    /// `grpc` probes, another network's probes, the pod's conditions).
    fn cross_check(&mut self, id: &str, now: Instant) {
        let mirror = self.tracker.seen_in_place(id);
        let node = self.local_seen.get(id);
        let what = match (self.confirming && self.local, mirror, node) {
            (true, Some(mirror), Some(node)) if mirror.revision == node.revision => {
                use crate::daemon::inbox::PodState;
                match (&mirror.state, &node.state) {
                    (
                        PodState::Ready,
                        PodState::Pending | PodState::Running | PodState::Failed { .. },
                    ) => Some(format!(
                        "the mirror pod of revision {} is Ready, and the node shows its containers not all running ({:?})",
                        mirror.revision, node.state
                    )),
                    (PodState::Failed { reason, .. }, PodState::Ready) => Some(format!(
                        "the mirror pod of revision {} says {reason}, and the node shows all its containers running",
                        mirror.revision
                    )),
                    _ => None,
                }
            }
            _ => None,
        };
        match what {
            None => {
                if self.disagreements.remove(id).is_some_and(|d| d.said) {
                    tracing::info!(template = %id, "the mirror pod and the node agree again");
                }
            }
            Some(what) => {
                let d = self
                    .disagreements
                    .entry(id.to_string())
                    .or_insert(Disagreement {
                        since: now,
                        said: false,
                        what: what.clone(),
                    });
                d.what = what;
            }
        }
    }

    /// Says the disagreements that lasted [`DISAGREE_AFTER`] by `now`, once.
    fn disagreements_due(&mut self, now: Instant) {
        for (id, d) in &mut self.disagreements {
            if d.said || now < d.since + DISAGREE_AFTER {
                continue;
            }
            d.said = true;
            tracing::warn!(template = %id, "the mirror pod and the node itself disagree for {}s: {}; the mirror pod decides",
                (now - d.since).as_secs(), d.what);
            self.effects.push(Effect::Disagreed { id: id.clone() });
        }
    }

    /// What a mirror pod, or (`local`) the node itself, says.
    fn observe_from(&mut self, observation: Observation, local: bool, now: Instant) {
        let id = observation.source.as_str();
        let stalled = |t: &Tracker| {
            t.get(id)
                .is_some_and(|r| r.stalled.is_some() && r.no_sandbox)
        };
        let was_stalled = stalled(&self.tracker);
        let observed = self.tracker.observe_from(&observation, local, now);
        if was_stalled && !stalled(&self.tracker) {
            tracing::info!(template = %id, revision = %observation.revision,
                "the kubelet started the revision after all ({KUBELET_ISSUE}); judged from now");
            self.effects.push(Effect::Stalled {
                id: id.to_string(),
                stalled: false,
            });
            self.report(id);
        }
        let Some((phase, verdict)) = observed else {
            return;
        };
        self.phase(id, &observation.revision, phase);
        tracing::info!(template = %id, revision = %observation.revision, phase = phase.as_str(), "rollout phase");
        if let Some(verdict) = verdict {
            self.verdict(id, verdict, now);
        }
        self.report(id);
    }

    /// The pods watch listed (or resumed): rollouts are followed from now
    /// on. True when that is news (every template's revision in place is
    /// to be followed: the shell renders them all again).
    pub fn mirror_synced(&mut self) -> bool {
        !std::mem::replace(&mut self.confirming, true)
    }

    /// The pods watch failed: nothing is judged until it follows again (or,
    /// with local evidence, the rollouts go on, judged by it); the rollouts
    /// without a verdict are followed anew then.
    pub fn mirror_lost(&mut self) {
        if std::mem::replace(&mut self.confirming, false) && !self.local {
            self.written_unfollowed.extend(self.tracker.drop_pending());
        }
    }

    /// Whether local evidence can be read now ([`super::local`]); true when
    /// that is news and rollouts are followed from now on (every template's
    /// revision in place is to be followed: the shell renders them all
    /// again). Without it, and without the pods watch, the rollouts without
    /// a verdict are followed anew once either is back.
    pub fn local_available(&mut self, available: bool) -> bool {
        let was = self.judging();
        self.local = available;
        if was && !self.judging() {
            self.written_unfollowed.extend(self.tracker.drop_pending());
        }
        !was && self.judging()
    }

    /// What the node itself shows of `revision` of template `id`, judged by
    /// [`super::local::judge`]. Taken only while the mirror pod cannot be
    /// followed: when it can, it decides.
    pub fn local(&mut self, id: &str, revision: &str, pod: &LocalPodState, now: Instant) {
        self.local_observed(
            Observation {
                source: id.to_string(),
                revision: revision.to_string(),
                state: judge(pod),
                pod: ObjectReference::default(),
            },
            now,
        );
    }

    /// The same, already judged (by the shell that read the node).
    pub fn local_observed(&mut self, observation: Observation, now: Instant) {
        let id = observation.source.clone();
        self.local_seen.insert(id.clone(), observation.clone());
        if self.confirming || !self.local {
            self.cross_check(&id, now);
            return;
        }
        self.observe_from(observation, true, now);
    }

    /// The coordinator answers; the templates it concerns render again.
    pub fn fleet(&mut self, answer: Answer) {
        let Some(ids) = self.with_slots(|slots| slots.answer(answer)) else {
            return;
        };
        self.effects
            .extend(ids.into_iter().map(|id| Effect::Render { id }));
    }

    /// The verdicts due at `now` (Ready long enough, or a deadline passed).
    pub fn tick(&mut self, now: Instant) {
        self.disagreements_due(now);
        for (id, revision, after) in self.tracker.stalls(now) {
            let said = not_started(&revision, after);
            tracing::warn!(template = %id, revision = %revision, node = %self.node,
                "{said}: nothing to fall back to, so it stays and is judged once the kubelet starts it");
            self.effects.push(Effect::Stalled {
                id: id.clone(),
                stalled: true,
            });
            self.effects.push(Effect::Event {
                id: id.clone(),
                reason: Reason::KubeletNotStarted,
                note: format!("node {}: {said}", self.node),
                related: None,
            });
            self.report(&id);
        }
        for (id, verdict) in self.tracker.expire(now) {
            if let Some(r) = self.tracker.get(&id) {
                let (revision, phase) = (r.revision.clone(), r.phase);
                self.phase(&id, &revision, phase);
            }
            self.verdict(&id, verdict, now);
        }
    }

    /// After a pass: frees the slots no longer needed (held for a template
    /// whose rollout here has its verdict, or that has nothing to write).
    /// Never while rollouts cannot be followed.
    pub fn after_pass(&mut self) {
        if !self.confirming {
            return;
        }
        let Some(slots) = &self.slots else { return };
        let unneeded: Vec<String> = slots
            .held()
            .filter(|id| {
                let rollout = self.tracker.get(id);
                let pending = rollout.is_some_and(|r| r.verdict.is_none());
                // A quorum member's slot is kept until the revision in
                // place is Ready: after a failure, the one rolled back to
                // (a rollback that fails too keeps it for good, and says so).
                let unconfirmed = slots.is_quorum(id)
                    && rollout.is_some_and(|r| !matches!(r.verdict, Some(Verdict::Succeeded)));
                let waiting = self
                    .known
                    .get(id.as_str())
                    .is_some_and(|k| matches!(k.gated, Some(Gated::Waiting { .. })));
                !pending && !waiting && !unconfirmed
            })
            .cloned()
            .collect();
        for id in unneeded {
            tracing::info!(template = %id, "rollout slot released: nothing of this template is rolling out here");
            self.report(&id);
            self.with_slots(|slots| slots.release(&id));
        }
    }

    /// Template `id` is gone: everything of its rollouts goes.
    pub fn forget(&mut self, id: &str) {
        self.tracker.forget(id);
        self.written_unfollowed.remove(id);
        self.with_slots(|slots| slots.forget(id));
        self.states.remove(id);
        self.known.remove(id);
        self.rolling_back.remove(id);
        self.local_seen.remove(id);
        self.disagreements.remove(id);
        self.effects
            .push(Effect::ForgetState { id: id.to_string() });
        self.effects
            .push(Effect::ForgetMetrics { id: id.to_string() });
    }

    /// Reports a rollout's verdict; a failed one with a revision to fall
    /// back to is rolled back first ([`Effect::RollBack`], then
    /// [`Machine::rolled_back`]).
    fn verdict(&mut self, id: &str, verdict: Verdict, now: Instant) {
        let Some(rollout) = self.tracker.get(id).cloned() else {
            return;
        };
        match verdict {
            Verdict::Succeeded => {
                self.effects.push(Effect::Result("succeeded"));
                self.fleet_verdict(id, &rollout, None);
                self.change_state(id, |s| {
                    s.good = Some(rollout.revision.clone());
                    s.settle(&rollout.revision);
                });
                let evidence = rollout.evidence();
                if !rollout.written {
                    tracing::debug!(template = %id, revision = %rollout.revision, "revision in place is Ready, as {evidence} shows");
                    return;
                }
                let took = now.saturating_duration_since(rollout.started);
                tracing::info!(template = %id, revision = %rollout.revision, took_ms = took.as_millis() as u64,
                    "rollout succeeded: Ready, as {evidence} shows");
                self.effects.push(Effect::Event {
                    id: id.to_string(),
                    reason: Reason::RolloutSucceeded,
                    note: format!(
                        "node {}: revision {} Ready after {:.1}s",
                        self.node,
                        rollout.revision,
                        took.as_secs_f64()
                    ),
                    related: rollout.pod.clone(),
                });
            }
            Verdict::Failed { reason, message } => {
                self.effects.push(Effect::Result("failed"));
                match rollout.previous.clone() {
                    None => {
                        let outcome = "it is the first revision on this node, with nothing to fall back to: it stays".to_string();
                        self.failed(id, &rollout, &reason, &message, &outcome);
                    }
                    Some(previous) => {
                        self.effects.push(Effect::RollBack {
                            id: id.to_string(),
                            revision: previous,
                            failed: rollout.revision.clone(),
                        });
                        self.rolling_back.insert(
                            id.to_string(),
                            RollingBack {
                                failed: rollout,
                                reason,
                                message,
                            },
                        );
                    }
                }
            }
        }
    }

    /// The shell wrote `revision` of template `id` back (Ok) or could not
    /// (the reason), as [`Effect::RollBack`] asked.
    pub fn rolled_back(
        &mut self,
        id: &str,
        revision: &str,
        result: Result<(), String>,
        now: Instant,
    ) {
        let Some(RollingBack {
            failed,
            reason,
            message,
        }) = self.rolling_back.remove(id)
        else {
            return;
        };
        let outcome = match result {
            Ok(()) => {
                // Held only once the good revision is in place: a daemon
                // killed in between writes the failed one again and rolls it
                // back again, rather than keep it for good.
                self.change_state(id, |s| s.held = Some(failed.revision.clone()));
                let deadline = failed.deadline - failed.started;
                self.tracker.start_rollback(id, revision, deadline, now);
                self.phase(id, revision, Phase::Written);
                self.effects.push(Effect::Result("rolled_back"));
                format!(
                    "rolled back to revision {revision}; revision {} is not written again until the template changes",
                    failed.revision
                )
            }
            Err(e) => format!("cannot roll back to revision {revision}: {e}; it stays"),
        };
        self.failed(id, &failed, &reason, &message, &outcome);
    }

    /// The rest of a failed verdict, once its rollback (if any) is done.
    fn failed(&mut self, id: &str, rollout: &Rollout, reason: &str, message: &str, outcome: &str) {
        self.change_state(id, |s| s.settle(&rollout.revision));
        tracing::warn!(template = %id, revision = %rollout.revision, node = %self.node, reason = %reason,
            "rollout failed: {message}; {outcome}");
        self.fleet_verdict(id, rollout, Some((reason, message)));
        self.effects.push(Effect::Event {
            id: id.to_string(),
            reason: Reason::RolloutFailed,
            note: format!(
                "node {}: revision {}: {reason}: {message}; {outcome}",
                self.node, rollout.revision
            ),
            related: rollout.pod.clone(),
        });
    }

    /// Tells the other nodes how template `id`'s rollout ended here — a
    /// failure first, so that no node takes the slot without knowing it —
    /// and frees its slot.
    fn fleet_verdict(&mut self, id: &str, rollout: &Rollout, failure: Option<(&str, &str)>) {
        let Some(slots) = &self.slots else { return };
        if let Some((reason, message)) = failure {
            let failed = fleet::Failed {
                target: slots
                    .target_of(id, &rollout.revision)
                    .unwrap_or_default()
                    .to_string(),
                change: slots.change_of(id, &rollout.revision).map(str::to_string),
                revision: rollout.revision.clone(),
                reason: reason.to_string(),
                message: crate::text::cut(message.to_string(), 1024),
                at: (self.clock)(),
            };
            self.change_state(id, |s| s.failed = Some(failed));
        } else {
            self.lift_change(id, rollout);
        }
        self.report(id);
        // A quorum member's slot waits for the revision rolled back to
        // ([`Machine::after_pass`]): the member is still down until then.
        let keep = failure.is_some() && self.slots.as_ref().is_some_and(|s| s.is_quorum(id));
        if !keep {
            self.with_slots(|slots| slots.release(id));
        }
    }

    /// `rollout` of template `id` succeeded: when it is a written update to
    /// another target of the change that last failed here, rendered while
    /// no revision is held (not the rollback, which is confirmed while the
    /// failed one is held), the change is not what failed — this node's
    /// own settings were, and are fixed — and its failure stops naming it:
    /// the halt marker is rewritten with the target only, and the other
    /// nodes go on.
    fn lift_change(&mut self, id: &str, rollout: &Rollout) {
        let Some(slots) = &self.slots else { return };
        let Some(state) = self.states.get(id) else {
            return;
        };
        let held = state.held.is_some();
        let Some(failed) = &state.failed else { return };
        let (target, change) = (
            slots.target_of(id, &rollout.revision),
            slots.change_of(id, &rollout.revision),
        );
        if !rollout.written
            || held
            || failed.change.is_none()
            || change != failed.change.as_deref()
            || target.is_none_or(|t| t == failed.target)
        {
            return;
        }
        tracing::info!(template = %id, revision = %rollout.revision, change = ?failed.change,
            failed = %failed.target,
            "target {} of the change that failed here is Ready: the change halts the other nodes no more (target {} stays held)",
            target.unwrap_or_default(), failed.target);
        let failed = fleet::Failed {
            change: None,
            ..failed.clone()
        };
        self.change_state(id, |s| s.failed = Some(failed));
    }

    /// Sends this node's state of template `id` to the other nodes (when it
    /// changed).
    fn report(&mut self, id: &str) {
        let (Some(slots), Some(known)) = (&self.slots, self.known.get(id)) else {
            return;
        };
        let rollout = self.tracker.get(id);
        let revision = rollout
            .map(|r| r.revision.clone())
            .or_else(|| known.in_place.clone());
        let (phase, message) = match &known.gated {
            Some(Gated::Waiting { target, slots }) => (
                fleet::Phase::Waiting,
                Some(format!(
                    "waiting for a slot to write target {target} (at most {slots} node(s) at once)"
                )),
            ),
            Some(Gated::Halted { why, .. }) => (fleet::Phase::Halted, Some(why.clone())),
            None => (
                rollout.map_or(fleet::Phase::Written, |r| {
                    // Ready is a success only once it lasted.
                    match (phase_of(r.phase), &r.verdict) {
                        (fleet::Phase::Ready, None) => fleet::Phase::Confirming,
                        (phase, _) => phase,
                    }
                }),
                // A stall of the kubelet's (kept for this rollout's life,
                // so that it is still seen once the API answers again).
                rollout.and_then(|r| {
                    let after = r.stalled?;
                    Some(if r.no_sandbox {
                        not_started(&r.revision, after)
                    } else {
                        format!(
                            "the kubelet started revision {} only after more than {} s; {KUBELET_ISSUE}",
                            r.revision,
                            after.as_secs()
                        )
                    })
                }),
            ),
        };
        let target = revision
            .as_deref()
            .and_then(|r| slots.target_of(id, r))
            .map(str::to_string);
        let wanted = match &known.gated {
            Some(Gated::Waiting { target, .. } | Gated::Halted { target, .. }) => {
                Some(target.clone())
            }
            None => target.clone(),
        };
        let status = TemplateStatus {
            target,
            wanted,
            revision,
            generation: known.generation,
            change: known.change.clone(),
            phase: phase.as_str().to_string(),
            since: String::new(),
            message,
            failed: self.states.get(id).and_then(|s| s.failed.clone()),
        };
        self.with_slots(|slots| slots.report(id, status));
    }

    /// Runs `f` on the slots, if rollouts are coordinated, and queues what
    /// it asked of the coordinator, in order.
    fn with_slots<R>(&mut self, f: impl FnOnce(&mut Slots) -> R) -> Option<R> {
        let slots = self.slots.as_mut()?;
        let result = f(slots);
        self.effects
            .extend(slots.take_asks().into_iter().map(Effect::Ask));
        Some(result)
    }

    fn phase(&mut self, id: &str, revision: &str, phase: Phase) {
        self.effects.push(Effect::Phase {
            id: id.to_string(),
            revision: revision.to_string(),
            phase: phase.as_str(),
        });
    }

    /// Applies `change` to template `id`'s rollout state, and saves it if
    /// it changed.
    fn change_state(&mut self, id: &str, change: impl FnOnce(&mut RolloutState)) {
        let state = self.states.entry(id.to_string()).or_default();
        let before = state.clone();
        change(state);
        if *state != before {
            self.effects.push(Effect::SaveState {
                id: id.to_string(),
                state: RolloutState::clone(state),
            });
        }
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
