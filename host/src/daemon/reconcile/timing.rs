//! Where the first sync's time goes: the wall time of its renders, its
//! kubelet checks, its commits (states, manifests, revisions) and its garbage collection, summed over the
//! pass(es) from the first complete list to ready, and reported once with
//! `podstamp_initial_sync_seconds` ([`crate::daemon::metrics`]).
//!
//! Why: the initial sync target (docs/performance.md, part 3) cannot be
//! worked toward on guesses; the sync benchmark prints these parts beside
//! the total, and what is left over is the rest of the pass.
//!
//! Invariants: it only measures, never decides; each part is wall time on
//! the reconciler's thread, so the parts never overlap and their sum is at
//! most the pass's time. After the first sync it measures nothing more.

use std::time::{Duration, Instant};

/// A share of the first sync's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// A template's render: its plugin chain, the schema check of its
    /// output, its manifest's YAML and hash.
    Render,
    /// A manifest read back and asked about: the kubelet's decision and the
    /// Pod Security check, through the helper.
    Check,
    /// The questions of a chunk rendered ahead sent to the helper, and its
    /// answers waited for ([`super::ahead`]).
    CheckAhead,
    /// A pass's rollout states saved ([`super::batch`], its step 1).
    CommitStates,
    /// A pass's manifests synced, renamed, their directory synced (steps 2
    /// and 3).
    CommitManifests,
    /// A pass's revisions recorded (step 4).
    CommitRevisions,
    /// Garbage collection of the manifest directory.
    Gc,
}

impl Part {
    const ALL: [Part; 7] = [
        Part::Render,
        Part::Check,
        Part::CheckAhead,
        Part::CommitStates,
        Part::CommitManifests,
        Part::CommitRevisions,
        Part::Gc,
    ];

    fn label(self) -> &'static str {
        match self {
            Part::Render => "render",
            Part::Check => "check",
            Part::CheckAhead => "check_ahead",
            Part::CommitStates => "commit_states",
            Part::CommitManifests => "commit_manifests",
            Part::CommitRevisions => "commit_revisions",
            Part::Gc => "gc",
        }
    }
}

/// The first sync's parts, summed until it is reported.
#[derive(Debug)]
pub(super) struct SyncTiming {
    /// From the reconciler's start to the first complete list applied.
    started: Instant,
    to_list: Option<Duration>,
    parts: [Duration; Part::ALL.len()],
    done: bool,
}

impl Default for SyncTiming {
    fn default() -> Self {
        SyncTiming {
            started: Instant::now(),
            to_list: None,
            parts: [Duration::ZERO; Part::ALL.len()],
            done: false,
        }
    }
}

impl SyncTiming {
    /// Adds the time since `since` to `part`, from the first complete list
    /// until the first sync is done.
    pub(super) fn add(&mut self, part: Part, since: Instant) {
        if !self.done && self.to_list.is_some() {
            self.parts[part as usize] += since.elapsed();
        }
    }

    /// Adds `took` to `part`, as [`SyncTiming::add`].
    pub(super) fn add_duration(&mut self, part: Part, took: Duration) {
        if !self.done && self.to_list.is_some() {
            self.parts[part as usize] += took;
        }
    }

    /// The first complete list was applied now.
    pub(super) fn listed(&mut self) {
        self.to_list.get_or_insert_with(|| self.started.elapsed());
    }

    /// The parts, labelled, and nothing is measured from here on.
    pub(super) fn finish(&mut self) -> Vec<(&'static str, Duration)> {
        self.done = true;
        let mut parts: Vec<_> = Part::ALL
            .iter()
            .map(|p| (p.label(), self.parts[*p as usize]))
            .collect();
        if let Some(to_list) = self.to_list {
            parts.push(("start_to_list", to_list));
        }
        parts
    }
}
