//! This node's mirror pods: what the kubelet reports about the static pods
//! podstamp wrote, read to confirm each rollout.
//!
//! One watch, on pods of the daemon's namespace with the field selector
//! `spec.nodeName=<node>` (read only: podstamp never writes pods). Only
//! mirror pods (`kubernetes.io/config.mirror`) of podstamp's manifests
//! (`podstamp.io/source`, `podstamp.io/revision`, copied by the kubelet from
//! the manifest) become [`Observation`]s for the reconciler.
//!
//! Invariants:
//! * Pods are decoded leniently, as [`Raw`] JSON (see [`super::raw`]): no
//!   pod's content can stop the watch, and a field podstamp cannot read is
//!   read as absent.
//! * No pod's content is logged.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{Api, Client};
use serde_json::Value;

use super::backoff::Backoff;
use super::inbox::{Input, Observation, PodState};
use super::metrics::Metrics;
use super::raw::Raw;
use super::watch::{self, Event, Spec};
use crate::manifest::{REVISION_LABEL, SOURCE_ANNOTATION};

/// The kubelet's annotation on a mirror pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Waiting reasons of a container that say its pod will not become Ready
/// without a change: the kubelet's own words, reported as they are.
const FAILING: [&str; 8] = [
    "CrashLoopBackOff",
    "ErrImageNeverPull",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Reads a pod; None unless it is a mirror pod of one of podstamp's
/// manifests.
pub fn observe(pod: &Value) -> Option<Observation> {
    let metadata = pod.get("metadata")?;
    let annotations = metadata.get("annotations")?;
    annotations.get(MIRROR_ANNOTATION)?;
    let source = annotations.get(SOURCE_ANNOTATION)?.as_str()?.to_string();
    let revision = metadata
        .get("labels")?
        .get(REVISION_LABEL)?
        .as_str()?
        .to_string();
    let text = |field: &str| {
        metadata
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(Observation {
        source,
        revision,
        state: state(pod.get("status").unwrap_or(&Value::Null)),
        pod: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            ..ObjectReference::default()
        },
    })
}

fn state(status: &Value) -> PodState {
    let text = |v: &Value, field: &str| {
        v.get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let containers = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .filter_map(|f| status.get(*f).and_then(Value::as_array))
        .flatten();
    for container in containers {
        let Some(waiting) = container.pointer("/state/waiting") else {
            continue;
        };
        let reason = text(waiting, "reason");
        if FAILING.contains(&reason.as_str()) {
            let mut message = text(waiting, "message");
            if let Some(exit) = container
                .pointer("/lastState/terminated/exitCode")
                .and_then(Value::as_i64)
            {
                message = format!("last exit code {exit}; {message}");
            }
            let name = text(container, "name");
            return PodState::Failed {
                reason,
                message: format!("container {name}: {message}"),
            };
        }
    }
    let phase = text(status, "phase");
    if phase == "Failed" {
        return PodState::Failed {
            reason: Some(text(status, "reason"))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "PodFailed".into()),
            message: text(status, "message"),
        };
    }
    let ready = status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| text(c, "type") == "Ready" && text(c, "status") == "True");
    if ready {
        PodState::Ready
    } else if phase == "Running" {
        PodState::Running
    } else {
        PodState::Pending
    }
}

/// Watches this node's pods in `namespace` and sends what their mirror pods
/// say to the reconciler, until it is gone: `MirrorSynced` once listed (or,
/// after a failure, once the watch resumed where it stopped), `MirrorLost`
/// at each failure; `followed` says the same to the local evidence poller
/// (which then leaves the pods' probes to the kubelet).
pub async fn watch(
    client: Client,
    namespace: String,
    node_name: String,
    watch_timeout: Option<u32>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
    followed: Arc<std::sync::atomic::AtomicBool>,
) {
    let api: Api<Raw<Pod>> = Api::namespaced(client, &namespace);
    let spec =
        Spec::new("pods", "pods", watch_timeout).fields(&format!("spec.nodeName={node_name}"));
    watch::run(api, spec, metrics, Backoff::new(), |event| {
        let input = match event {
            Event::Listed(pod) | Event::Applied(pod) => match observe(pod.value()) {
                Some(observation) => Input::Mirror(observation),
                None => return ControlFlow::Continue(()),
            },
            Event::ListDone | Event::Resumed => {
                followed.store(true, std::sync::atomic::Ordering::Relaxed);
                Input::MirrorSynced
            }
            Event::Failed(_) => {
                followed.store(false, std::sync::atomic::Ordering::Relaxed);
                Input::MirrorLost
            }
            // A pod gone says nothing about the revision now in place:
            // its successor, if any, is another pod.
            Event::Listing | Event::Deleted(_) => return ControlFlow::Continue(()),
        };
        match inputs.send(input) {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: Value) -> Value {
        json!({"metadata": {"name": "web-n1",
            "labels": {REVISION_LABEL: "0123456789"},
            "annotations": {MIRROR_ANNOTATION: "h", SOURCE_ANNOTATION: "kube-system/web"}},
            "status": status})
    }

    #[test]
    fn reads_the_kubelets_words() {
        let o = observe(&pod(json!({"phase": "Pending"}))).unwrap();
        assert_eq!(
            (o.source.as_str(), o.revision.as_str(), o.state),
            ("kube-system/web", "0123456789", PodState::Pending)
        );
        let running = pod(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}]}));
        assert_eq!(observe(&running).unwrap().state, PodState::Running);
        let ready = pod(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}));
        assert_eq!(observe(&ready).unwrap().state, PodState::Ready);
        let crashing = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "main",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
            "lastState": {"terminated": {"exitCode": 1}}}]}),
        );
        assert_eq!(
            observe(&crashing).unwrap().state,
            PodState::Failed {
                reason: "CrashLoopBackOff".into(),
                message: "container main: last exit code 1; back-off 10s".into()
            }
        );
        let never = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "main",
            "state": {"waiting": {"reason": "ErrImageNeverPull"}}}]}),
        );
        assert!(matches!(observe(&never).unwrap().state,
            PodState::Failed { reason, .. } if reason == "ErrImageNeverPull"));
        // Starting is not failing.
        let creating = pod(json!({"containerStatuses": [{"name": "main",
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(observe(&creating).unwrap().state, PodState::Pending);
    }

    #[test]
    fn only_mirror_pods_of_ours_are_observed_and_odd_fields_are_absent() {
        let mut not_mirror = pod(json!({}));
        not_mirror["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(MIRROR_ANNOTATION);
        assert_eq!(observe(&not_mirror), None);
        let mut foreign = pod(json!({}));
        foreign["metadata"]["labels"] = json!({});
        assert_eq!(observe(&foreign), None);
        let odd = pod(json!({"phase": 7, "conditions": "x", "containerStatuses": {"a": 1}}));
        assert_eq!(observe(&odd).unwrap().state, PodState::Pending);
    }
}
