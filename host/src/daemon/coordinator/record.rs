//! When this node's status record is written: the progress of a template
//! on a target is held back for [`HOLD`], so that the phases it passes
//! through within it (written, running, ready: about a second apart where
//! a pod starts fast) cost one write, not one each. A rollout wrote
//! 3.2–3.6 records per node, about half of all its writes
//! (docs/performance.md §10.8).
//!
//! Invariants:
//! * A change of what failed here is written at once: the halt marker
//!   that stops the other nodes follows the record, and a restarted node
//!   learns from its record what failed here.
//! * A new target this node wants (waiting for a slot, or halted) is
//!   written at once: one write per node and rollout, made when the node
//!   hears of the target. Held back, the waiting nodes' records of a
//!   rollout all came due together [`HOLD`] later, in the middle of its
//!   first steps (§10.8).
//! * The record is written before a slot is freed (asks are written in
//!   the order sent): [`Pace::due`] is told when a release is waiting.
//! * A change is held back at most [`HOLD`] after the first one not
//!   written: a stream of changes does not put the write off.
//! * Only this node's own changes are held back: a record the API holds
//!   that differs from this node's (changed by someone else, or read
//!   after a restart) is written at once.

use std::time::{Duration, Instant};

/// How long a change of this node's record may wait for the next one.
pub(super) const HOLD: Duration = Duration::from_secs(2);

/// The record's changes not yet written.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Pace {
    /// When the first change not yet written was made; None: none held
    /// back (a record that differs from the API's is then due at once).
    held_since: Option<Instant>,
    /// A change held back says something new of what failed here, or of
    /// the target wanted.
    urgent: bool,
}

impl Pace {
    /// The record changed at `now`; `in_api`: before this change, the API
    /// held what this node says. `urgent`: what failed here, or the target
    /// wanted, changed.
    pub(super) fn changed(&mut self, now: Instant, in_api: bool, urgent: bool) {
        if in_api || self.held_since.is_none() {
            self.held_since = Some(now);
            self.urgent = false;
        }
        self.urgent |= urgent;
    }

    /// What the record says is in the API: nothing is held back.
    pub(super) fn written(&mut self) {
        *self = Pace::default();
    }

    /// Whether a record that differs from the API's is to be written now;
    /// `releasing`: a slot is waiting to be freed, after the record.
    pub(super) fn due(&self, now: Instant, releasing: bool) -> bool {
        releasing || self.urgent || self.held_since.is_none_or(|t| now >= t + HOLD)
    }

    /// When a held-back change becomes due, if one is held.
    pub(super) fn due_at(&self) -> Option<Instant> {
        self.held_since.map(|t| t + HOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_within_the_hold_make_one_write_at_its_end() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.changed(t0, true, false);
        assert!(!pace.due(t0, false));
        pace.changed(t0 + HOLD / 2, false, false);
        // Not put off by the second change.
        assert_eq!(pace.due_at(), Some(t0 + HOLD));
        assert!(!pace.due(t0 + HOLD - Duration::from_millis(1), false));
        assert!(pace.due(t0 + HOLD, false));
        pace.written();
        assert_eq!(pace.due_at(), None);
        // The next change after a write is held from when it was made.
        pace.changed(t0 + HOLD * 3, true, false);
        assert_eq!(pace.due_at(), Some(t0 + HOLD * 4));
    }

    #[test]
    fn a_failure_or_a_release_waiting_makes_the_record_due_at_once() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.changed(t0, true, false);
        assert!(pace.due(t0, true), "a release waits for the record");
        pace.changed(t0, false, true);
        assert!(pace.due(t0, false), "a failure is written at once");
        pace.written();
        pace.changed(t0, true, false);
        assert!(!pace.due(t0, false), "a write ends the urgency");
    }

    #[test]
    fn a_record_that_differs_without_a_change_here_is_due_at_once() {
        assert!(Pace::default().due(Instant::now(), false));
    }
}
