//! A pass's writes, put in place together: what makes the initial sync of
//! a thousand templates cost a few disk flushes rather than thousands.
//!
//! During a pass ([`super::Reconciler::reconcile`]) each template's new
//! manifest is only staged ([`crate::write::stage`]: its dot-temp file
//! written beside the target, not synced), and each rollout state the
//! machine asks to save ([`super::Effect::SaveState`]) is only kept here.
//! [`super::Reconciler::commit_pass`] then, in this order:
//! 1. saves the rollout states, in one write of their one file
//!    ([`crate::daemon::rollout_file`]) — every state that marks a revision
//!    `pending` is durable before any manifest is renamed, as when each was
//!    written alone;
//! 2. fsyncs every staged manifest, in parallel threads;
//! 3. renames each synced manifest over its target, in the pass's order, and
//!    fsyncs the manifest directory once;
//! 4. records the revisions written ([`super::super::revisions::Store::record_many`]),
//!    queued to the history's writer thread, which stages them, fsyncs them
//!    in parallel, renames them and fsyncs their directories behind the
//!    pass (the revision of a manifest was always kept after the manifest
//!    was in place);
//! 5. ends each template's render as it would have ended alone (metrics, log,
//!    the rollout machine told), in the pass's order.
//!
//! Why it is still crash-safe: a manifest is renamed only after its own
//! fsync returned, so a crash at any point leaves each manifest either old or
//! new, whole; the kubelet ignores the dot-temp files and the next start
//! removes them (a crash between steps 2 and 3 leaves every old manifest as
//! it was). Identical bytes are never staged. Nothing outside the manifest
//! directory is staged inside it.
//!
//! A pass of many templates commits every [`MAX_STAGED`] staged files, so
//! that it never holds more files open than that (a staged file is open
//! until its fsync) and a low open-file limit is not met halfway.
//!
//! Invariants: nothing staged outlives the pass (a write that cannot be
//! committed is a `WriteFailed` render failure and its temp file is
//! removed); a rollback ([`super::Effect::RollBack`]) commits the pass
//! first, so that it is never overwritten by a staged write of the same
//! pass.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::daemon::rollout::RolloutState;
use crate::manifest::Manifest;
use crate::write::{self, Staged};

use super::Reconciler;
use super::outcome::{Done, write_failed};
use super::timing::Part;

/// The most manifests a pass holds staged before it commits them
/// ([`write::MAX_STAGED`]). (Rollout states are not files of their own:
/// one write carries however many a commit holds.)
pub(super) const MAX_STAGED: usize = write::MAX_STAGED;

/// A manifest staged in this pass.
pub(super) struct PendingWrite {
    pub(super) key: String,
    /// `namespace/name`, for the failure's message.
    pub(super) template_id: String,
    pub(super) staged: Staged,
    pub(super) manifest: Manifest,
    /// The file the entry claimed before this pass; claimed again if the
    /// write fails.
    pub(super) previous_claim: Option<String>,
    /// How the render ends once the file is in place.
    pub(super) done: Done,
}

/// What a pass holds back until it commits.
#[derive(Default)]
pub(super) struct Pass {
    /// Whether a pass is under way: rollout states are held back meanwhile.
    pub(super) open: bool,
    /// Rollout states to save, one (the latest) per template.
    pub(super) states: BTreeMap<String, RolloutState>,
    pub(super) writes: Vec<PendingWrite>,
}

impl Pass {
    /// Holds back `state` of template `id` (replacing one held before).
    pub(super) fn save_state(&mut self, id: String, state: RolloutState) {
        self.states.insert(id, state);
    }

    /// Template `id`'s state is removed: a state held back for it is moot.
    pub(super) fn forget_state(&mut self, id: &str) {
        self.states.remove(id);
    }
}

impl Reconciler {
    /// Opens a pass: manifests are staged and rollout states held back
    /// until [`Reconciler::commit_pass`].
    pub(super) fn open_pass(&mut self) {
        self.pass.open = true;
    }

    /// Puts in place everything staged in this pass (see the module
    /// header for the order, and why it is crash-safe), and ends each
    /// staged render; the effects this has the machine ask for are left to
    /// the caller's [`Reconciler::run_effects`]. The pass stays open (or
    /// closed) as it was.
    pub(super) fn commit_pass(&mut self) {
        let started = Instant::now();
        let states: Vec<(String, RolloutState)> =
            std::mem::take(&mut self.pass.states).into_iter().collect();
        if let Some(store) = &mut self.revisions
            && !states.is_empty()
            && let Err(e) = store.save_states(&states)
        {
            tracing::error!(templates = states.len(), dir = %store.dir().display(),
                "cannot keep the rollout states: {e}; a restart would not know them");
        }
        self.timing.add(Part::CommitStates, started);
        let writes = std::mem::take(&mut self.pass.writes);
        if writes.is_empty() {
            return;
        }
        let started = Instant::now();
        let mut staged = Vec::with_capacity(writes.len());
        let mut rest = Vec::with_capacity(writes.len());
        for w in writes {
            staged.push(w.staged);
            rest.push((w.key, w.template_id, w.manifest, w.previous_claim, w.done));
        }
        let synced = write::sync_staged(&mut staged);
        let mut results = Vec::with_capacity(rest.len());
        for (file, synced) in staged.into_iter().zip(synced) {
            results.push(synced.and_then(|()| file.commit()));
        }
        if results.iter().any(Result::is_ok) {
            self.dir_unsynced = true;
            self.sync_dir();
        }
        self.timing.add(Part::CommitManifests, started);
        let started = Instant::now();
        if let Some(store) = &mut self.revisions {
            let items: Vec<(&str, &str, &[u8])> = rest
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|((_, _, m, _, _), _)| (m.source.as_str(), m.revision.as_str(), &m.bytes[..]))
                .collect();
            // Written behind, by the history's writer; a failure is logged
            // there (or by the store, if it could not be decided).
            store.record_many(&items);
        }
        self.timing.add(Part::CommitRevisions, started);
        let node = self.node.clone().expect("a pass renders only with a node");
        for ((key, template_id, _, previous, done), result) in rest.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    self.owned.insert(done.file.clone(), done.source.clone());
                    self.placed(&key, done);
                }
                Err(e) => {
                    let failure = write_failed(&template_id, &done.file, e);
                    if let Some(entry) = self.entries.get(&key) {
                        self.claims.set(&key, entry.seq, previous);
                    }
                    self.failed(&key, &node, failure);
                }
            }
        }
    }

    /// Whether the pass holds as much as it may ([`MAX_STAGED`]): time to
    /// commit.
    pub(super) fn pass_full(&self) -> bool {
        self.pass.writes.len() >= MAX_STAGED
    }

    /// Closes the pass, committing what it holds; from here on rollout
    /// states are saved as they are asked for.
    pub(super) fn close_pass(&mut self) {
        self.commit_pass();
        self.pass.open = false;
    }
}
