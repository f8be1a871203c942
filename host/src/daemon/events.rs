//! Kubernetes Events (events.k8s.io/v1) about templates (failed renders,
//! rollouts) and about catalog ConfigMaps whose new catalog is refused.
//!
//! The reconciler reports each distinct failure once; a task publishes them
//! with kube-runtime's recorder, which turns a repeat of the same event into
//! a series (count) instead of a new object.
//!
//! [`EventSink::report`] never blocks the render thread and the queue between
//! them is bounded ([`QUEUE`] reports, each note cut to [`MAX_NOTE_BYTES`]):
//! when the API server is slower than the failures, new reports are dropped,
//! counted in `podstamp_events_dropped_total` and warned about at most once a
//! [`DROP_WARNING_EVERY`]. The log line and the metrics of each failure are
//! not affected.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::metrics::Metrics;
use crate::reason::Reason;

/// The controller name on podstamp's Events.
pub const REPORTING_CONTROLLER: &str = "podstamp.io/podstamp";
/// events.k8s.io/v1 rejects a longer note.
const MAX_NOTE_BYTES: usize = 1024;
/// Reports queued for the API server at most: each is a distinct failure of
/// a template, so this is far more than a healthy API server lets pile up.
const QUEUE: usize = 256;
/// The least time between two warnings about dropped reports.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(60);

/// One failure to report on a PodTemplate.
#[derive(Debug, Clone)]
pub struct Report {
    pub reference: ObjectReference,
    /// `RenderFailed`, `InvalidTemplate`, `UnknownPlugin`, `NameConflict`, ...
    pub reason: Reason,
    /// Names the node, the plugin and the error.
    pub note: String,
    /// Another object the Event is about (a rollout's mirror pod). Events
    /// differing in it are distinct Events, not a series of one.
    pub related: Option<ObjectReference>,
}

#[derive(Clone)]
pub struct EventSink {
    queue: Sender<Report>,
    metrics: Arc<Metrics>,
    drops: Arc<Mutex<Drops>>,
}

/// Reports dropped since the last warning about them.
#[derive(Default)]
struct Drops {
    warned_at: Option<Instant>,
    unwarned: u64,
}

impl EventSink {
    /// [`EventSink::report`], with the Event's `related` object: a failure
    /// on `report.reference` caused by `related` (a refused catalog, on the
    /// catalog ConfigMap, because of a plugin ConfigMap).
    pub fn report_related(&self, mut report: Report, related: ObjectReference) {
        report.related = Some(related);
        self.report(report);
    }

    /// Queues `report` for the API server, or drops it if the queue is full.
    pub fn report(&self, mut report: Report) {
        report.note = truncate(&report.note, MAX_NOTE_BYTES);
        match self.queue.try_send(report) {
            Ok(()) => {}
            Err(TrySendError::Full(report)) => self.dropped(&report),
            // The publisher is gone: the daemon is stopping.
            Err(TrySendError::Closed(_)) => {}
        }
    }

    fn dropped(&self, report: &Report) {
        self.metrics.event_dropped();
        let mut drops = self.drops.lock().unwrap_or_else(|e| e.into_inner());
        drops.unwarned += 1;
        if drops
            .warned_at
            .is_some_and(|t| t.elapsed() < DROP_WARNING_EVERY)
        {
            return;
        }
        tracing::warn!(
            reason = report.reason.as_str(),
            dropped = drops.unwarned,
            "the queue of Events to the API server is full ({QUEUE}); dropping new ones (see podstamp_events_dropped_total); the log still has every failure"
        );
        drops.warned_at = Some(Instant::now());
        drops.unwarned = 0;
    }
}

/// A sink and the queue it feeds.
fn sink(metrics: Arc<Metrics>) -> (EventSink, Receiver<Report>) {
    let (queue, rx) = channel(QUEUE);
    let sink = EventSink {
        queue,
        metrics,
        drops: Arc::default(),
    };
    (sink, rx)
}

/// The sink, and the task that publishes what it is sent.
pub fn recorder(
    client: kube::Client,
    node_name: &str,
    metrics: Arc<Metrics>,
) -> (EventSink, impl Future<Output = ()> + Send + 'static) {
    let (tx, rx) = sink(metrics);
    let reporter = Reporter {
        controller: REPORTING_CONTROLLER.to_string(),
        instance: Some(format!("podstamp-{node_name}")),
    };
    let recorder = Recorder::new(client, reporter);
    (tx, publish(recorder, rx))
}

async fn publish(recorder: Recorder, mut rx: Receiver<Report>) {
    while let Some(report) = rx.recv().await {
        let (type_, action) = match report.reason {
            Reason::RolloutSucceeded => (EventType::Normal, "Rollout"),
            Reason::RolloutFailed => (EventType::Warning, "Rollout"),
            Reason::RolloutHalted => (EventType::Warning, "Rollout"),
            // What podstamp was doing with the object the Event is on.
            Reason::CatalogRefused => (EventType::Warning, "Reload"),
            _ => (EventType::Warning, "Render"),
        };
        let event = Event {
            type_,
            reason: report.reason.to_string(),
            note: Some(report.note),
            action: action.to_string(),
            secondary: report.related,
        };
        if let Err(e) = recorder.publish(&event, &report.reference).await {
            tracing::warn!(
                template = %format!("{}/{}", report.reference.namespace.as_deref().unwrap_or(""), report.reference.name.as_deref().unwrap_or("")),
                reason = report.reason.as_str(),
                "cannot publish Event: {e}"
            );
        }
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    format!("{}...", &text[..text.floor_char_boundary(max - 3)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(note: String) -> Report {
        Report {
            reference: ObjectReference::default(),
            reason: Reason::RenderFailed,
            note,
            related: None,
        }
    }

    #[test]
    fn a_full_queue_drops_new_reports_counts_them_and_never_blocks() {
        let metrics = Arc::new(Metrics::default());
        let (sink, mut rx) = super::sink(metrics.clone());
        // Nothing publishes: the queue fills, then every report is dropped
        // (this test would hang if reporting could block).
        for i in 0..QUEUE + 3 {
            sink.report(report(format!("failure {i}: {}", "x".repeat(8 << 10))));
        }
        assert!(
            metrics
                .exposition()
                .contains("\npodstamp_events_dropped_total 3\n"),
            "{}",
            metrics.exposition()
        );
        let first = rx.try_recv().unwrap();
        assert!(
            first.note.starts_with("failure 0: "),
            "{}",
            &first.note[..20]
        );
        assert!(first.note.len() <= MAX_NOTE_BYTES, "{}", first.note.len());
        let mut queued = 1;
        while let Ok(r) = rx.try_recv() {
            assert!(r.note.len() <= MAX_NOTE_BYTES);
            queued += 1;
        }
        assert_eq!(queued, QUEUE, "the oldest are kept, the newest dropped");
        // Room again: reports are queued again.
        sink.report(report("later".into()));
        assert_eq!(rx.try_recv().unwrap().note, "later");
    }

    #[test]
    fn notes_are_cut_on_a_char_boundary() {
        let long = "é".repeat(600);
        let cut = super::truncate(&long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."), "{}", cut.len());
        assert_eq!(super::truncate("short", 1024), "short");
    }
}
