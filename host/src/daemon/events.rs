//! Kubernetes Events (events.k8s.io/v1) about templates that fail to render.
//!
//! The reconciler reports each distinct failure once ([`EventSink::report`]
//! never blocks); a task publishes them with kube-runtime's recorder, which
//! turns a repeat of the same event into a series (count) instead of a new
//! object.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// The controller name on podstamp's Events.
pub const REPORTING_CONTROLLER: &str = "podstamp.io/podstamp";
/// events.k8s.io/v1 rejects a longer note.
const MAX_NOTE_BYTES: usize = 1024;

/// One failure to report on a PodTemplate.
#[derive(Debug, Clone)]
pub struct Report {
    pub reference: ObjectReference,
    /// `RenderFailed`, `InvalidTemplate`, `UnknownPlugin`, `NameConflict`, ...
    pub reason: &'static str,
    /// Names the node, the plugin and the error.
    pub note: String,
}

#[derive(Clone)]
pub struct EventSink(UnboundedSender<Report>);

impl EventSink {
    pub fn report(&self, report: Report) {
        let _ = self.0.send(report);
    }
}

/// The sink, and the task that publishes what it is sent.
pub fn recorder(
    client: kube::Client,
    node_name: &str,
) -> (EventSink, impl Future<Output = ()> + Send + 'static) {
    let (tx, rx) = unbounded_channel();
    let reporter = Reporter {
        controller: REPORTING_CONTROLLER.to_string(),
        instance: Some(format!("podstamp-{node_name}")),
    };
    let recorder = Recorder::new(client, reporter);
    (EventSink(tx), publish(recorder, rx))
}

async fn publish(recorder: Recorder, mut rx: UnboundedReceiver<Report>) {
    while let Some(report) = rx.recv().await {
        let event = Event {
            type_: EventType::Warning,
            reason: report.reason.to_string(),
            note: Some(truncate(&report.note, MAX_NOTE_BYTES)),
            action: "Render".to_string(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &report.reference).await {
            tracing::warn!(
                template = %format!("{}/{}", report.reference.namespace.as_deref().unwrap_or(""), report.reference.name.as_deref().unwrap_or("")),
                reason = report.reason,
                "cannot publish Event: {e}"
            );
        }
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn notes_are_cut_on_a_char_boundary() {
        let long = "é".repeat(600);
        let cut = super::truncate(&long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."), "{}", cut.len());
        assert_eq!(super::truncate("short", 1024), "short");
    }
}
