//! What the runtime's answers and the pod's own spec say of one revision's
//! containers: the [`LocalContainer`]s that [`crate::daemon::rollout::local`]
//! judges. Pure: the answers are read by [`super::client`].
//!
//! Invariants:
//! * Every container the spec declares is reported, created or not: a
//!   container the runtime has not created yet is `Created` (starting),
//!   so that "every container running" means every declared one.
//! * Of a container's runtime containers (the kubelet keeps the last one
//!   that exited beside the one it started after it), the newest counts.
//! * An image is missing only when it is absent from the runtime and the
//!   container's `imagePullPolicy` is `Never`: the kubelet will never pull
//!   it, so the pod cannot start. An absent image that may be pulled is
//!   starting (a pull can take minutes; the progress deadline judges it).
//! * An init container counts only once it failed (exited non-zero): one
//!   that ran to completion is not expected to keep running.

use serde_json::Value;

use crate::daemon::rollout::local::{ContainerState, LocalContainer};

/// What the runtime shows of one revision's pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The newest sandbox of the revision; None when the kubelet has not
    /// made one (it has not acted on the file).
    pub sandbox: Option<SeenSandbox>,
    /// The sandbox's containers, every attempt.
    pub containers: Vec<SeenContainer>,
    /// The spec's images the runtime does not have.
    pub absent_images: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenSandbox {
    pub id: String,
    /// The runtime calls it ready (its network namespace is up).
    pub ready: bool,
    /// The kubelet's `kubernetes.io/config.hash` of the file it runs.
    pub config_hash: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenContainer {
    /// The container's name in the pod spec.
    pub name: String,
    pub state: ContainerState,
    /// The kubelet's `io.kubernetes.container.restartCount`.
    pub restart_count: u32,
    /// When the runtime created it (ns), to find the newest attempt.
    pub created_at: i64,
    /// The runtime's reason and message for its state (`Error`, `OOMKilled`).
    pub reason: String,
}

/// The declared containers of `pod` (a static pod manifest as JSON) as the
/// runtime shows them.
pub fn containers(pod: &Value, seen: &Seen) -> Vec<LocalContainer> {
    let declared = |field: &str| {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for (init, spec) in declared("initContainers")
        .iter()
        .map(|c| (true, c))
        .chain(declared("containers").iter().map(|c| (false, c)))
    {
        let text = |field: &str| spec.get(field).and_then(Value::as_str).unwrap_or_default();
        let name = text("name");
        let newest = seen
            .containers
            .iter()
            .filter(|c| c.name == name)
            .max_by_key(|c| c.created_at);
        let image = text("image");
        let image_missing = (text("imagePullPolicy") == "Never"
            && seen.absent_images.iter().any(|i| i == image))
        .then(|| format!("image {image} is not present on the node and imagePullPolicy is Never"));
        let container = LocalContainer {
            name: name.to_string(),
            state: newest.map_or(ContainerState::Created, |c| c.state),
            restart_count: newest.map_or(0, |c| c.restart_count),
            image_missing,
        };
        let failed = matches!(container.state, ContainerState::Exited { code } if code != 0);
        if !init || failed || container.image_missing.is_some() {
            out.push(container);
        }
    }
    out
}

/// The images `pod` declares, each once (to ask the runtime about).
pub fn images(pod: &Value) -> Vec<String> {
    let mut images: Vec<String> = ["initContainers", "containers"]
        .iter()
        .filter_map(|f| pod.pointer(&format!("/spec/{f}")).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("image").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    images.sort();
    images.dedup();
    images
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"spec": {
            "initContainers": [{"name": "init", "image": "busybox:1"}],
            "containers": [
                {"name": "main", "image": "app:1", "imagePullPolicy": "Never"},
                {"name": "side", "image": "side:1"}]}})
    }

    fn seen(name: &str, state: ContainerState, restarts: u32, at: i64) -> SeenContainer {
        SeenContainer {
            name: name.into(),
            state,
            restart_count: restarts,
            created_at: at,
            reason: String::new(),
        }
    }

    #[test]
    fn every_declared_container_is_reported_and_the_newest_attempt_counts() {
        let s = Seen {
            sandbox: None,
            containers: vec![
                seen("init", ContainerState::Exited { code: 0 }, 0, 1),
                seen("main", ContainerState::Exited { code: 1 }, 0, 2),
                seen("main", ContainerState::Running, 1, 3),
            ],
            absent_images: vec![],
        };
        let got = containers(&pod(), &s);
        // The init container that completed is not expected to run.
        let names: Vec<_> = got.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["main", "side"]);
        assert_eq!(
            (got[0].state, got[0].restart_count),
            (ContainerState::Running, 1)
        );
        // Not created yet: starting.
        assert_eq!(got[1].state, ContainerState::Created);
        assert_eq!(got[1].image_missing, None);
    }

    #[test]
    fn an_absent_image_is_missing_only_when_it_is_never_pulled() {
        let s = Seen {
            absent_images: vec!["app:1".into(), "side:1".into()],
            ..Seen::default()
        };
        let got = containers(&pod(), &s);
        assert!(got[0].image_missing.as_deref().unwrap().contains("app:1"));
        assert_eq!(got[1].image_missing, None, "side:1 may still be pulled");
        assert_eq!(images(&pod()), ["app:1", "busybox:1", "side:1"]);
    }

    #[test]
    fn a_failed_init_container_counts() {
        let s = Seen {
            containers: vec![seen("init", ContainerState::Exited { code: 2 }, 3, 1)],
            ..Seen::default()
        };
        let got = containers(&pod(), &s);
        assert_eq!(got[0].name, "init");
        assert_eq!(got[0].state, ContainerState::Exited { code: 2 });
    }
}
