//! What a template's rollouts leave for the next start of the daemon (kept
//! on disk by [`crate::daemon::rollout_file`]): the last revision that
//! succeeded on this node, the failed revision that is held, and the
//! revision this daemon wrote whose rollout has no verdict yet.
//!
//! Invariant: the machine changes it only through effects
//! ([`super::Effect::SaveState`]), so that what is on disk is what the
//! machine last decided; a failed save leaves the change in force for this
//! run only.

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
}
