//! How a template's render ends, once its manifest is in place or it
//! failed: the metrics, the log, the Event, and what the rollout machine is
//! told. The same whether the render ended at once or when its pass
//! committed ([`super::batch`]).
//!
//! Invariants: a failure is logged and sent as an Event once per distinct
//! message (each bounded by [`MAX_FAILURE_MESSAGE`]), and the last good
//! manifest stays; every revision in place is told to the machine
//! ([`crate::daemon::rollout::Machine::in_place`]).

use std::time::{Duration, Instant};

use super::Reconciler;
use crate::daemon::events::Report;
use crate::daemon::metrics::RenderResult;
use crate::daemon::revisions::Store;
use crate::daemon::rollout::{Gated, InPlace};
use crate::node::NodeContext;
use crate::reason::Reason;
use crate::write::Outcome;

/// The longest failure message logged and kept per template (to report
/// each distinct failure once). Every part of one is bounded where it is
/// made (a plugin's error text to 4 KiB, its message and field each); this
/// holds whatever a future message holds.
pub(super) const MAX_FAILURE_MESSAGE: usize = 12 << 10;

/// A render that ended with its manifest in place.
pub(super) struct Done {
    pub(super) file: String,
    pub(super) outcome: Outcome,
    /// `namespace/name` of the template, as the manifest says.
    pub(super) source: String,
    pub(super) revision: String,
    pub(super) deadline: Duration,
    /// The revision rendered is held (it failed); the file keeps another.
    pub(super) held: bool,
    /// The update is not written for now; the file keeps another revision.
    pub(super) gated: Option<Gated>,
    /// The rollout target rendered (when rollouts are coordinated).
    pub(super) target: Option<String>,
    /// The target's change ([`crate::fleet::change`]), beside it.
    pub(super) change: Option<String>,
    /// The template is a quorum member (`podstamp.io/quorum`).
    pub(super) quorum: bool,
}

/// A failed render, as reported.
pub(super) struct Failure {
    pub(super) reason: Reason,
    pub(super) plugin: Option<String>,
    pub(super) message: String,
}

impl Reconciler {
    /// Ends the render of `key` with its manifest in place.
    pub(super) fn placed(&mut self, key: &str, done: Done) {
        let entry = self.entries.get_mut(key).expect("dirty keys exist");
        let id = entry.id.clone().unwrap_or_else(|| key.to_string());
        let Done { file, outcome, .. } = &done;
        let (file, outcome) = (file.clone(), *outcome);
        self.claims.set(key, entry.seq, Some(file.clone()));
        self.metrics.render(match outcome {
            Outcome::Written => RenderResult::Written,
            Outcome::Unchanged => RenderResult::Unchanged,
        });
        if outcome == Outcome::Written {
            tracing::info!(template = %id, file = %file, "wrote manifest");
        } else {
            tracing::debug!(template = %id, file = %file, "manifest unchanged");
        }
        if entry.last_error.take().is_some() {
            tracing::info!(template = %id, "renders again");
        }
        let generation = entry
            .incoming
            .template
            .as_ref()
            .ok()
            .and_then(|t| t.generation);
        let store = self.revisions.as_ref();
        let (source, revision) = (done.source.clone(), done.revision.clone());
        self.rollouts.in_place(
            InPlace {
                id: done.source,
                revision: done.revision,
                written: outcome == Outcome::Written,
                deadline: done.deadline,
                held: done.held,
                gated: done.gated,
                target: done.target,
                change: done.change,
                generation,
                quorum: done.quorum,
            },
            || newest_other(store, &source, &revision),
            Instant::now(),
        );
    }

    /// Ends the render of `key` with a failure: reported once per distinct
    /// failure; the last good manifest stays.
    pub(super) fn failed(&mut self, key: &str, node: &NodeContext, mut failure: Failure) {
        let entry = self.entries.get_mut(key).expect("dirty keys exist");
        let id = entry.id.clone().unwrap_or_else(|| key.to_string());
        failure.message = crate::text::cut(failure.message, MAX_FAILURE_MESSAGE);
        self.metrics.render(RenderResult::Failed(failure.reason));
        if entry.last_error.as_deref() == Some(failure.message.as_str()) {
            tracing::debug!(template = %id, reason = failure.reason.as_str(), "still failing: {}", failure.message);
            return;
        }
        tracing::warn!(template = %id, node = %node.name, reason = failure.reason.as_str(),
            plugin = failure.plugin.as_deref().unwrap_or(""),
            "{}; the last good manifest stays", failure.message);
        entry.last_error = Some(failure.message.clone());
        if let (Some(events), Some(reference)) = (&self.events, &entry.incoming.reference) {
            events.report(Report {
                reference: reference.clone(),
                reason: failure.reason,
                note: format!(
                    "node {}: plugin {}: {}",
                    node.name,
                    failure.plugin.as_deref().unwrap_or("none"),
                    failure.message
                ),
                related: None,
            });
        }
    }
}

/// A manifest that could not be put in place, as a render failure.
pub(super) fn write_failed(template_id: &str, file: &str, e: std::io::Error) -> Failure {
    Failure {
        reason: Reason::WriteFailed,
        plugin: None,
        message: format!("PodTemplate {template_id}: {file}: {e}"),
    }
}

/// The newest revision the history keeps for template `id` other than
/// `revision`: the fallback of a history kept before the rollout state was.
pub(super) fn newest_other(store: Option<&Store>, id: &str, revision: &str) -> Option<String> {
    let kept = store?.kept(id).ok()?;
    kept.into_iter()
        .rev()
        .find(|k| k.revision != revision)
        .map(|k| k.revision)
}
