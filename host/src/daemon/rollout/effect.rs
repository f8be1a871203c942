//! What the rollout machine asks its shell (the reconciler) to do.
//!
//! Every effect is an instruction, never a question: the machine has
//! already decided. Effects are carried out in the order given; the one
//! effect with a result the machine needs ([`Effect::RollBack`]) is
//! answered by a call of [`super::Machine::rolled_back`], whose effects
//! follow.

use k8s_openapi::api::core::v1::ObjectReference;

use super::RolloutState;
use crate::daemon::inbox::Ask;
use crate::reason::Reason;

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send to the coordinator of rollouts across nodes.
    Ask(Ask),
    /// Keep template `id`'s rollout state on disk (it changed).
    SaveState { id: String, state: RolloutState },
    /// Remove template `id`'s rollout state from disk (the template is gone).
    ForgetState { id: String },
    /// Write `revision` of template `id` back from the revision history in
    /// place of the failed `failed`; answer with
    /// [`super::Machine::rolled_back`].
    RollBack {
        id: String,
        revision: String,
        failed: String,
    },
    /// An Event on template `id`'s PodTemplate (when it came from the API).
    Event {
        id: String,
        reason: Reason,
        note: String,
        related: Option<ObjectReference>,
    },
    /// `podstamp_rollout_phase` of template `id` is now `phase`.
    Phase {
        id: String,
        revision: String,
        phase: &'static str,
    },
    /// The kubelet has (true) or no longer has (false) not started the
    /// revision of template `id` in place past its deadline
    /// (`podstamp_kubelet_not_started{template}`).
    Stalled { id: String, stalled: bool },
    /// The mirror pod and the node itself disagreed about template `id`'s
    /// revision in place for a while
    /// (`podstamp_evidence_disagreements_total{template}`).
    Disagreed { id: String },
    /// Count a rollout's result (`podstamp_rollouts_total{result}`).
    Result(&'static str),
    /// Template `id`'s rollout metrics go (the template is gone).
    ForgetMetrics { id: String },
    /// Render template `id` again (a slot was granted, or a failure seen
    /// elsewhere changed what may be written).
    Render { id: String },
}
