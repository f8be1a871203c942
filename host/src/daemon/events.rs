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
//!
//! A rollout Event (`RolloutSucceeded`, `RolloutFailed`, `RolloutHalted`,
//! `KubeletNotStarted`)
//! that the API server does not take is kept on disk ([`super::outbox`])
//! and published, in order, once it answers again (tried every
//! [`RETRY`]); while some are kept, new rollout Events go after them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::metrics::Metrics;
use super::outbox::{Kept, Outbox};
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
/// How often rollout Events kept on disk are tried again.
pub const RETRY: Duration = Duration::from_secs(2);

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
        // A verdict from the node's own evidence has no mirror pod: no
        // related object rather than an empty one.
        report.related = report.related.filter(|r| r.name.is_some());
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
    outbox: Option<Outbox>,
) -> (EventSink, impl Future<Output = ()> + Send + 'static) {
    let (tx, rx) = sink(metrics);
    let reporter = Reporter {
        controller: REPORTING_CONTROLLER.to_string(),
        instance: Some(format!("podstamp-{node_name}")),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    (tx, publish(recorder, (client, reporter), rx, outbox))
}

fn is_rollout(reason: &Reason) -> bool {
    matches!(
        reason,
        Reason::RolloutSucceeded
            | Reason::RolloutFailed
            | Reason::RolloutHalted
            | Reason::KubeletNotStarted
    )
}

/// `fresh`: what a recorder of its own for each Event kept on disk is made
/// of (see [`flush`]).
async fn publish(
    recorder: Recorder,
    fresh: (kube::Client, Reporter),
    mut rx: Receiver<Report>,
    outbox: Option<Outbox>,
) {
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Events kept by an earlier run are published first.
    let mut waiting = outbox.as_ref().is_some_and(|o| !o.pending().is_empty());
    loop {
        tokio::select! {
            report = rx.recv() => {
                let Some(report) = report else { return };
                let rollout = is_rollout(&report.reason);
                if let (true, true, Some(outbox)) = (rollout, waiting, &outbox) {
                    keep(outbox, &report);
                    continue;
                }
                if let Err(e) = publish_one(&recorder, &report).await {
                    let what = format!(
                        "{}/{}",
                        report.reference.namespace.as_deref().unwrap_or(""),
                        report.reference.name.as_deref().unwrap_or("")
                    );
                    match (rollout, &outbox) {
                        (true, Some(outbox)) => {
                            tracing::warn!(template = %what, reason = report.reason.as_str(),
                                "cannot publish Event: {e}; kept on disk, published once the API server answers");
                            keep(outbox, &report);
                            waiting = true;
                        }
                        _ => tracing::warn!(template = %what, reason = report.reason.as_str(),
                            "cannot publish Event: {e}"),
                    }
                }
            }
            _ = retry.tick(), if waiting => {
                if let Some(outbox) = &outbox {
                    waiting = !flush(&fresh, outbox).await;
                }
            }
        }
    }
}

async fn publish_one(recorder: &Recorder, report: &Report) -> Result<(), kube::Error> {
    let (type_, action) = match report.reason {
        Reason::RolloutSucceeded => (EventType::Normal, "Rollout"),
        Reason::RolloutFailed => (EventType::Warning, "Rollout"),
        Reason::RolloutHalted => (EventType::Warning, "Rollout"),
        Reason::KubeletNotStarted => (EventType::Warning, "Rollout"),
        // What podstamp was doing with the object the Event is on.
        Reason::CatalogRefused => (EventType::Warning, "Reload"),
        _ => (EventType::Warning, "Render"),
    };
    let event = Event {
        type_,
        reason: report.reason.to_string(),
        note: Some(report.note.clone()),
        action: action.to_string(),
        secondary: report.related.clone(),
    };
    recorder.publish(&event, &report.reference).await
}

/// Keeps a rollout Event for later, saying when it happened.
fn keep(outbox: &Outbox, report: &Report) {
    let r = &report.reference;
    let kept = Kept {
        namespace: r.namespace.clone().unwrap_or_default(),
        name: r.name.clone().unwrap_or_default(),
        uid: r.uid.clone(),
        reason: report.reason.to_string(),
        note: report.note.clone(),
        at: crate::fleet::now_rfc3339(),
    };
    if let Err(e) = outbox.keep(kept) {
        tracing::error!(template = %format!("{}/{}", r.namespace.as_deref().unwrap_or(""), r.name.as_deref().unwrap_or("")),
            "cannot keep the Event {} on disk: {e}; it is lost", report.reason);
    }
}

/// Publishes the Events kept on disk, in order; true when none is left.
/// Each through a recorder of its own: a kept Event has no mirror pod to
/// tell it apart (the `related` object of a live one), so the recorder's
/// cache would take a second rollout's `RolloutFailed` for a repeat of the
/// first and only count it, keeping the first one's note.
async fn flush((client, reporter): &(kube::Client, Reporter), outbox: &Outbox) -> bool {
    let mut all = true;
    for (dir, kept) in outbox.pending() {
        let mut published = 0;
        for k in &kept {
            let reason = [
                Reason::RolloutSucceeded,
                Reason::RolloutFailed,
                Reason::RolloutHalted,
                Reason::KubeletNotStarted,
            ]
            .into_iter()
            .find(|r| r.as_str() == k.reason);
            // Not one podstamp keeps: dropped.
            let Some(reason) = reason else {
                published += 1;
                continue;
            };
            let report = Report {
                reference: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PodTemplate".into()),
                    namespace: Some(k.namespace.clone()),
                    name: Some(k.name.clone()),
                    uid: k.uid.clone(),
                    ..ObjectReference::default()
                },
                reason,
                note: truncate(
                    &format!(
                        "{} (at {}; reported once the API server answered again)",
                        k.note, k.at
                    ),
                    MAX_NOTE_BYTES,
                ),
                related: None,
            };
            let recorder = Recorder::new(client.clone(), reporter.clone());
            if publish_one(&recorder, &report).await.is_err() {
                all = false;
                break;
            }
            published += 1;
        }
        if published > 0 {
            tracing::info!(dir = %dir.display(), published,
                "published rollout Events kept while the API server did not answer");
        }
        if let Err(e) = outbox.published(&dir, published) {
            tracing::error!(dir = %dir.display(),
                "cannot update the Events kept on disk: {e}; some may be published twice");
        }
    }
    all
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
