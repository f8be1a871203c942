//! Slots: whether an update of a manifest in place may be written now, and
//! what this node tells the others, as the machine sees it. Pure: what is
//! to be asked of the coordinator (an async task that holds the Leases,
//! [`crate::daemon::coordinator`]) is queued as [`Ask`]s that the machine
//! turns into effects, in order; the answers come back as
//! [`crate::daemon::inbox::Input::Fleet`], which renders the template again.
//!
//! Invariants:
//! * Only an update of a manifest in place is gated; a first install, a
//!   deletion and an unchanged manifest never are.
//! * A target that failed on any node is not written by this one (halted)
//!   until the template renders another target; nor is another target of
//!   a change that failed on another node ([`Halts`]: what the coordinator
//!   sends), until the template or the chain changes, or that node
//!   confirms a target of the change.
//! * A slot is held from before the write until the rollout's verdict; it
//!   is never released while rollouts cannot be followed (the pods watch has
//!   not listed): a node that cannot confirm must not let the next one go.
//! * This node's record is reported before its slot is released, in that
//!   order: the asks keep the order they were made in, and a node that
//!   takes the slot next has already seen the failure (both objects come
//!   through one watch, in order).

use std::collections::{BTreeMap, BTreeSet};

use super::tracker;
use crate::daemon::inbox::{Answer, Ask};
use crate::fleet::policy::Policy;
use crate::fleet::{Halts, Phase, TemplateStatus, now_rfc3339};

/// What to do with a rendered update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Write,
    /// Asked for one of `slots` slots; the manifest in place stays
    /// meanwhile.
    Wait {
        slots: u32,
    },
    /// The target failed on a node: the manifest in place stays; the text
    /// says where and why.
    Halted(String),
}

/// This node's slots, owned by the rollout machine.
#[derive(Default)]
pub struct Slots {
    /// Asks not yet handed to the machine, in the order made.
    outbox: Vec<Ask>,
    /// Templates whose slot this node holds → the target it was taken for.
    held: BTreeMap<String, String>,
    /// Asked, not granted: template → target.
    asked: BTreeMap<String, String>,
    /// … and of how many slots.
    asked_slots: BTreeMap<String, u32>,
    /// The nodes each label selector selects, as last counted (for shares,
    /// [`Policy::Percent`]); empty selector: every node.
    counts: BTreeMap<String, u32>,
    /// Counts asked for, not answered yet → the templates waiting on them.
    counting: BTreeMap<String, BTreeSet<String>>,
    /// What halts each template here, as the coordinator last sent it.
    failed: BTreeMap<String, Halts>,
    /// Templates that are members of a quorum ([`Policy::Quorum`]), as
    /// they last rendered: their slot is kept through a failure
    /// until the revision rolled back to is Ready again.
    quorum: BTreeSet<String>,
    /// The last record sent per template: only changes are sent.
    /// Boxed, as every per-template map of the daemon's that holds large
    /// values (a map's nodes are half full when keys come in order).
    reported: BTreeMap<String, Box<TemplateStatus>>,
    /// Per template, the target and the change of each revision written
    /// or found here lately (the last few), to name a failed revision's.
    targets: BTreeMap<String, Vec<Remembered>>,
}

/// A revision written or found here, and what it was rendered for.
#[derive(Debug, Clone)]
struct Remembered {
    revision: String,
    target: String,
    change: Option<String>,
}

/// How many revisions' targets are remembered per template.
const TARGETS_KEPT: usize = 8;

impl Slots {
    fn send(&mut self, ask: Ask) {
        self.outbox.push(ask);
    }

    /// The asks made since the last call, in order.
    pub fn take_asks(&mut self) -> Vec<Ask> {
        std::mem::take(&mut self.outbox)
    }

    /// Whether template `id` may replace its manifest in place with one of
    /// `target` (of `change`, None: not known) now. `nodes`: the label
    /// selector of the nodes the template is for
    /// (`podstamp.io/node-selector` as the API reads one; empty: every
    /// node), what a share ([`Policy::Percent`]) is of.
    pub fn decide(
        &mut self,
        id: &str,
        target: &str,
        change: Option<&str>,
        policy: Policy,
        nodes: &str,
    ) -> Decision {
        if let Some(why) = self.failed.get(id).and_then(|h| h.halts(target, change)) {
            self.cancel(id);
            return Decision::Halted(why);
        }
        if policy == Policy::AllAtOnce {
            return Decision::Write;
        }
        if self.held.contains_key(id) {
            // A newer target while this node updates: it goes on with the
            // slot it holds, and no node ends on the older one.
            self.held.insert(id.to_string(), target.to_string());
            return Decision::Write;
        }
        let new_target = self.asked.get(id).map(String::as_str) != Some(target);
        let count = match policy {
            Policy::Percent { .. } => self.count(id, nodes, new_target),
            _ => None,
        };
        let slots = policy.slots(count);
        if new_target || self.asked_slots.get(id) != Some(&slots) {
            self.asked.insert(id.to_string(), target.to_string());
            self.asked_slots.insert(id.to_string(), slots);
            self.send(Ask::Acquire {
                id: id.to_string(),
                target: target.to_string(),
                slots,
                expires: policy.expires(),
            });
        }
        Decision::Wait { slots }
    }

    /// The count of the nodes `nodes` selects, as last counted (None: not
    /// yet). Counted once per target a node waits for (a rollout), never
    /// on a timer; meanwhile the share is of the last count, or one node.
    fn count(&mut self, id: &str, nodes: &str, new_target: bool) -> Option<u32> {
        if new_target && !self.counting.contains_key(nodes) {
            self.send(Ask::Count {
                selector: nodes.to_string(),
            });
            self.counting.insert(nodes.to_string(), BTreeSet::new());
        }
        if let Some(waiting) = self.counting.get_mut(nodes) {
            waiting.insert(id.to_string());
        }
        self.counts.get(nodes).copied()
    }

    /// Nothing to write for `id` any more: a pending ask is withdrawn.
    pub fn cancel(&mut self, id: &str) {
        self.asked_slots.remove(id);
        if self.asked.remove(id).is_some() {
            self.send(Ask::Cancel { id: id.to_string() });
        }
    }

    /// Applies an answer; returns the templates to render again.
    pub fn answer(&mut self, answer: Answer) -> Vec<String> {
        match answer {
            Answer::Granted { id, target } => {
                self.asked.remove(&id);
                self.asked_slots.remove(&id);
                self.held.insert(id.clone(), target);
                vec![id]
            }
            Answer::Lost { id } => {
                self.held.remove(&id);
                Vec::new()
            }
            Answer::Failed(failed) => {
                let mut changed: Vec<String> = failed
                    .iter()
                    .filter(|(id, t)| self.failed.get(*id) != Some(t))
                    .map(|(id, _)| id.clone())
                    .collect();
                changed.extend(
                    self.failed
                        .keys()
                        .filter(|id| !failed.contains_key(*id))
                        .cloned(),
                );
                self.failed = failed;
                changed
            }
            Answer::Nodes { selector, count } => {
                let waiting = self.counting.remove(&selector).unwrap_or_default();
                let Some(count) = count else {
                    // Not counted (logged by the coordinator): the share
                    // stays of the last count, or of one node.
                    return Vec::new();
                };
                if self.counts.insert(selector, count) == Some(count) {
                    return Vec::new();
                }
                waiting
                    .into_iter()
                    .filter(|id| self.asked.contains_key(id))
                    .collect()
            }
        }
    }

    pub fn held(&self) -> impl Iterator<Item = &String> {
        self.held.keys()
    }

    /// Frees the slot of `id`, after reporting (the caller reports first).
    pub fn release(&mut self, id: &str) {
        if self.held.remove(id).is_some() {
            self.send(Ask::Release { id: id.to_string() });
        }
    }

    /// `revision` of template `id` is in place (written or found) for
    /// `target`, of `change`.
    pub fn remember(&mut self, id: &str, revision: &str, target: &str, change: Option<&str>) {
        let kept = self.targets.entry(id.to_string()).or_default();
        if kept.last().is_some_and(|r| r.revision == revision) {
            return;
        }
        kept.retain(|r| r.revision != revision);
        kept.push(Remembered {
            revision: revision.to_string(),
            target: target.to_string(),
            change: change.map(str::to_string),
        });
        if kept.len() > TARGETS_KEPT {
            kept.remove(0);
        }
    }

    fn remembered(&self, id: &str, revision: &str) -> Option<&Remembered> {
        self.targets
            .get(id)?
            .iter()
            .find(|r| r.revision == revision)
    }

    pub fn target_of(&self, id: &str, revision: &str) -> Option<&str> {
        self.remembered(id, revision).map(|r| r.target.as_str())
    }

    /// The change `revision` of template `id` was rendered for, if known.
    pub fn change_of(&self, id: &str, revision: &str) -> Option<&str> {
        self.remembered(id, revision)?.change.as_deref()
    }

    /// Sends this node's state of `id` if it changed (the time of the
    /// phase aside).
    pub fn report(&mut self, id: &str, mut status: TemplateStatus) {
        let last = self.reported.get(id);
        if let Some(last) = last {
            let mut same = status.clone();
            same.since = last.since.clone();
            if same == **last {
                return;
            }
            if last.phase == status.phase {
                status.since = last.since.clone();
            }
        }
        if status.since.is_empty() {
            status.since = now_rfc3339();
        }
        self.reported
            .insert(id.to_string(), Box::new(status.clone()));
        self.send(Ask::Report {
            id: id.to_string(),
            status: Some(Box::new(status)),
        });
    }

    /// Template `id` is (or is not) a member of a quorum, as it renders now.
    pub fn set_quorum(&mut self, id: &str, quorum: bool) {
        if quorum {
            self.quorum.insert(id.to_string());
        } else {
            self.quorum.remove(id);
        }
    }

    /// Whether template `id` is a member of a quorum, as it last rendered.
    pub fn is_quorum(&self, id: &str) -> bool {
        self.quorum.contains(id)
    }

    /// Template `id` is gone: its ask, slot and record go too.
    pub fn forget(&mut self, id: &str) {
        self.cancel(id);
        self.release(id);
        self.quorum.remove(id);
        self.targets.remove(id);
        if self.reported.remove(id).is_some() {
            self.send(Ask::Report {
                id: id.to_string(),
                status: None,
            });
        }
    }
}

/// The phase of a template on this node as the rollout tracker says it.
pub fn phase_of(phase: tracker::Phase) -> Phase {
    match phase {
        tracker::Phase::Written => Phase::Written,
        tracker::Phase::Running => Phase::Running,
        tracker::Phase::Ready => Phase::Ready,
        tracker::Phase::Failed => Phase::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: Policy = Policy::NodeByNode { max_unavailable: 1 };

    #[test]
    fn an_update_waits_for_a_slot_and_is_asked_once() {
        let mut gate = Slots::default();
        assert_eq!(
            gate.decide("ns/web", "t1", None, ONE, ""),
            Decision::Wait { slots: 1 }
        );
        assert_eq!(
            gate.decide("ns/web", "t1", None, ONE, ""),
            Decision::Wait { slots: 1 }
        );
        assert_eq!(
            gate.take_asks(),
            vec![Ask::Acquire {
                id: "ns/web".into(),
                target: "t1".into(),
                slots: 1,
                expires: true,
            }],
            "asked once"
        );
        assert_eq!(
            gate.answer(Answer::Granted {
                id: "ns/web".into(),
                target: "t1".into()
            }),
            vec!["ns/web".to_string()]
        );
        assert_eq!(gate.decide("ns/web", "t1", None, ONE, ""), Decision::Write);
        // A newer target goes on with the slot held.
        assert_eq!(gate.decide("ns/web", "t2", None, ONE, ""), Decision::Write);
        gate.release("ns/web");
        assert_eq!(
            gate.take_asks().remove(0),
            Ask::Release {
                id: "ns/web".into()
            }
        );
        assert_eq!(
            gate.decide("ns/web", "t2", None, Policy::AllAtOnce, ""),
            Decision::Write
        );
    }

    #[test]
    fn a_target_failed_anywhere_halts_and_withdraws_the_ask() {
        let mut gate = Slots::default();
        assert_eq!(
            gate.decide("ns/web", "t1", None, ONE, ""),
            Decision::Wait { slots: 1 }
        );
        gate.take_asks();
        let failed = BTreeMap::from([(
            "ns/web".to_string(),
            Halts {
                targets: BTreeMap::from([(
                    "t1".to_string(),
                    "node n2: CrashLoopBackOff".to_string(),
                )]),
                ..Halts::default()
            },
        )]);
        assert_eq!(
            gate.answer(Answer::Failed(failed.clone())),
            vec!["ns/web".to_string()]
        );
        assert!(gate.answer(Answer::Failed(failed)).is_empty(), "no change");
        match gate.decide("ns/web", "t1", None, Policy::AllAtOnce, "") {
            Decision::Halted(why) => assert!(why.contains("n2"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            gate.take_asks().remove(0),
            Ask::Cancel {
                id: "ns/web".into()
            }
        );
        // Another target rolls.
        assert_eq!(
            gate.decide("ns/web", "t2", None, ONE, ""),
            Decision::Wait { slots: 1 }
        );
    }

    #[test]
    fn only_changes_are_reported() {
        let mut gate = Slots::default();
        let status = |phase: Phase| TemplateStatus {
            revision: Some("r1".into()),
            target: Some("t1".into()),
            phase: phase.as_str().into(),
            ..TemplateStatus::default()
        };
        gate.report("ns/web", status(Phase::Written));
        gate.report("ns/web", status(Phase::Written));
        gate.report("ns/web", status(Phase::Ready));
        let sent = gate.take_asks();
        assert_eq!(sent.len(), 2, "{sent:?}");
        gate.forget("ns/web");
        assert_eq!(
            gate.take_asks().remove(0),
            Ask::Report {
                id: "ns/web".into(),
                status: None
            }
        );
    }

    #[test]
    fn a_share_of_the_nodes_is_counted_once_per_target_and_one_node_until_then() {
        let mut gate = Slots::default();
        let half = Policy::Percent { percent: 50 };
        let acquire = |target: &str, slots| Ask::Acquire {
            id: "ns/web".into(),
            target: target.into(),
            slots,
            expires: true,
        };
        assert_eq!(
            gate.decide("ns/web", "t1", None, half, "zone=a"),
            Decision::Wait { slots: 1 }
        );
        assert_eq!(
            gate.take_asks(),
            vec![
                Ask::Count {
                    selector: "zone=a".into()
                },
                acquire("t1", 1)
            ]
        );
        // Counted: the template renders again and asks for its share.
        let again = gate.answer(Answer::Nodes {
            selector: "zone=a".into(),
            count: Some(3),
        });
        assert_eq!(again, vec!["ns/web".to_string()]);
        assert_eq!(
            gate.decide("ns/web", "t1", None, half, "zone=a"),
            Decision::Wait { slots: 2 }
        );
        assert_eq!(gate.take_asks(), vec![acquire("t1", 2)]);
        assert_eq!(
            gate.decide("ns/web", "t1", None, half, "zone=a"),
            Decision::Wait { slots: 2 }
        );
        assert!(
            gate.take_asks().is_empty(),
            "asked once per target and share"
        );
        // A new target counts again; a count that fails keeps the last one.
        assert_eq!(
            gate.decide("ns/web", "t2", None, half, "zone=a"),
            Decision::Wait { slots: 2 }
        );
        assert_eq!(
            gate.take_asks(),
            vec![
                Ask::Count {
                    selector: "zone=a".into()
                },
                acquire("t2", 2)
            ]
        );
        let again = gate.answer(Answer::Nodes {
            selector: "zone=a".into(),
            count: None,
        });
        assert!(again.is_empty());
        assert_eq!(
            gate.decide("ns/web", "t2", None, half, "zone=a"),
            Decision::Wait { slots: 2 }
        );
        // A count is not asked again while one is under way.
        let mut gate = Slots::default();
        gate.decide("ns/a", "t1", None, half, "");
        gate.decide("ns/b", "t1", None, half, "");
        let counts = gate
            .take_asks()
            .into_iter()
            .filter(|a| matches!(a, Ask::Count { .. }))
            .count();
        assert_eq!(counts, 1);
        let mut again = gate.answer(Answer::Nodes {
            selector: String::new(),
            count: Some(10),
        });
        again.sort();
        assert_eq!(again, vec!["ns/a".to_string(), "ns/b".to_string()]);
    }
}
