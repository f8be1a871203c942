//! What a template's rollouts leave for the next start of the daemon (kept
//! on disk by [`crate::daemon::rollout_file`]): the last revision that
//! succeeded on this node, the failed revision that is held, the
//! revision this daemon wrote whose rollout has no verdict yet, and the
//! last failure the other nodes were told of.
//!
//! Invariant: the machine changes it only through effects
//! ([`super::Effect::SaveState`]), so that what is on disk is what the
//! machine last decided; a failed save leaves the change in force for this
//! run only.

// Fields a later podstamp adds are ignored, not refused: a file that
// cannot be read is read as empty, and an empty state forgets the held
// revision, so refusing them would make a downgrade write a failed revision
// once more. Every field is optional and additive.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutState {
    /// The last revision whose rollout succeeded (Ready, and stayed so):
    /// what a failed revision is rolled back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub good: Option<String>,
    /// A revision that failed and was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The revision this daemon wrote last, while its rollout has no
    /// verdict: found in place after a restart, it is still followed as
    /// this daemon's own rollout (its outcome announced). Its progress
    /// deadline counts anew from the restart, as whenever rollouts are
    /// followed again (see [`super::tracker`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// The `pending` revision's progress deadline in seconds, as its
    /// template said at the write: a daemon restarted while the API server
    /// is down cannot read the template's annotation, and would otherwise
    /// judge it by the default (5 min) instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// The last failure here, as the other nodes were told (the node's
    /// record and halt marker): a restarted daemon still reports it, and
    /// still stops naming its change once it confirms a fixed target of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<crate::fleet::Failed>,
}

impl RolloutState {
    /// `revision` has its verdict: it is no longer pending.
    pub fn settle(&mut self, revision: &str) {
        if self.pending.as_deref() == Some(revision) {
            self.pending = None;
            self.deadline = None;
        }
    }

    /// The progress deadline recorded for `revision`, when it is the
    /// pending one.
    pub fn deadline_of(&self, revision: &str) -> Option<std::time::Duration> {
        (self.pending.as_deref() == Some(revision))
            .then_some(self.deadline)
            .flatten()
            .map(std::time::Duration::from_secs)
    }
}
