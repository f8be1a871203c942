use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{Container, Pod};

use crate::error::parse_json;
use crate::{Error, FieldPath};

/// How a plugin sees the pod: parsed from the JSON text the host passes in,
/// written back to JSON text afterwards.
///
/// Implemented for the SDK's typed [`Pod`] (the fields plugins change typed,
/// the rest kept as JSON), for [`serde_json::Value`], for [`RawPod`] (the
/// text, untouched) and, with the feature `k8s-openapi`, for
/// `k8s_openapi::api::core::v1::Pod`.
pub trait PodDocument: Sized {
    /// Parses the pod. An error names the pod and, when it can, the field.
    fn from_json(json: String) -> Result<Self, Error>;
    /// Writes the pod back as JSON.
    fn into_json(self) -> Result<String, Error>;

    /// [`PodDocument::into_json`] into a buffer of `capacity` bytes to start
    /// with: the SDK passes the input's length, as a pod comes back about as
    /// long as it came, so the text is not copied into ever larger buffers
    /// (each one fresh memory, which in a plugin's new instance is a page
    /// fault per page).
    #[doc(hidden)]
    fn into_json_with_capacity(self, capacity: usize) -> Result<String, Error> {
        let _ = capacity;
        self.into_json()
    }
}

/// The pod as the JSON text the host passed in, not parsed at all: for a
/// plugin that only looks at the node, or does its own parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawPod(pub String);

impl RawPod {
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl PodDocument for RawPod {
    fn from_json(json: String) -> Result<Self, Error> {
        Ok(RawPod(json))
    }

    fn into_json(self) -> Result<String, Error> {
        Ok(self.0)
    }
}

impl PodDocument for serde_json::Value {
    fn from_json(json: String) -> Result<Self, Error> {
        let value: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| Error::new(format!("invalid pod: not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(Error::new("invalid pod: not a JSON object"));
        }
        Ok(value)
    }

    fn into_json(self) -> Result<String, Error> {
        write_out(self, 0)
    }

    fn into_json_with_capacity(self, capacity: usize) -> Result<String, Error> {
        write_out(self, capacity)
    }
}

/// A typed pod parsed with the field of an error named.
fn typed_from_json<T: DeserializeOwned>(json: &str) -> Result<T, Error> {
    parse_json(json).map_err(|(path, message)| match path {
        Some(path) => Error::at(path, format!("invalid pod: {message}")),
        None => Error::new(format!("invalid pod: {message}")),
    })
}

/// Writes `pod` out as JSON into a buffer with [`room`] for `capacity`
/// bytes, then [`discard`]s it.
fn write_out<T: Serialize>(pod: T, capacity: usize) -> Result<String, Error> {
    let mut json = Vec::with_capacity(room(capacity));
    let written = serde_json::to_writer(&mut json, &pod);
    discard(pod);
    written.map_err(|e| Error::new(format!("cannot write the pod as JSON: {e}")))?;
    String::from_utf8(json).map_err(|e| Error::new(format!("cannot write the pod as JSON: {e}")))
}

/// Room for a pod written back: its input's length and an eighth more.
fn room(capacity: usize) -> usize {
    capacity + capacity / 8 + 64
}

/// Lets go of a pod that has been written out. In a plugin, the host throws
/// the instance away after the call, its memory with it: freeing a pod block
/// by block just before that is time lost on every call. Natively (the
/// plugin's unit tests) it is dropped as usual.
fn discard<T>(pod: T) {
    #[cfg(target_family = "wasm")]
    std::mem::forget(pod);
    #[cfg(not(target_family = "wasm"))]
    drop(pod);
}

impl PodDocument for Pod {
    fn from_json(json: String) -> Result<Self, Error> {
        typed_from_json(&json)
    }

    fn into_json(self) -> Result<String, Error> {
        write_out(self, 0)
    }

    fn into_json_with_capacity(self, capacity: usize) -> Result<String, Error> {
        write_out(self, capacity)
    }
}

#[cfg(feature = "k8s-openapi")]
impl PodDocument for k8s_openapi::api::core::v1::Pod {
    fn from_json(json: String) -> Result<Self, Error> {
        typed_from_json(&json)
    }

    fn into_json(self) -> Result<String, Error> {
        write_out(self, 0)
    }

    fn into_json_with_capacity(self, capacity: usize) -> Result<String, Error> {
        write_out(self, capacity)
    }
}

/// Which list of the pod spec a container is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    /// `spec.initContainers`.
    Init,
    /// `spec.containers`.
    Container,
}

impl ContainerKind {
    /// Both kinds, init containers first (the order the kubelet starts them).
    pub const ALL: [ContainerKind; 2] = [ContainerKind::Init, ContainerKind::Container];

    /// The field's name in the pod spec: `initContainers` or `containers`.
    pub fn field_name(self) -> &'static str {
        match self {
            ContainerKind::Init => "initContainers",
            ContainerKind::Container => "containers",
        }
    }

    /// The path of the list: `spec.containers` or `spec.initContainers`.
    pub fn list_path(self) -> FieldPath {
        FieldPath::new().key("spec").key(self.field_name())
    }

    /// The path of one container: `spec.containers[0]`, `spec.initContainers[1]`.
    pub fn path(self, index: usize) -> FieldPath {
        self.list_path().index(index)
    }
}

/// The pod's containers of one kind (empty when the pod has no spec).
pub fn containers(pod: &Pod, kind: ContainerKind) -> &[Container] {
    let Some(spec) = pod.spec.as_ref() else {
        return &[];
    };
    match kind {
        ContainerKind::Init => spec.init_containers.as_deref().unwrap_or_default(),
        ContainerKind::Container => &spec.containers,
    }
}

/// The pod's containers of one kind, to change them.
///
/// ```
/// use podstamp_plugin::{containers_mut, ContainerKind, Pod};
///
/// fn set_pull_policy(pod: &mut Pod) {
///     for kind in ContainerKind::ALL {
///         for container in containers_mut(pod, kind) {
///             container.image_pull_policy = Some("IfNotPresent".into());
///         }
///     }
/// }
/// ```
pub fn containers_mut(pod: &mut Pod, kind: ContainerKind) -> &mut [Container] {
    let Some(spec) = pod.spec.as_mut() else {
        return &mut [];
    };
    match kind {
        ContainerKind::Init => spec.init_containers.as_deref_mut().unwrap_or_default(),
        ContainerKind::Container => &mut spec.containers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_pod_errors_name_the_field() {
        let json =
            r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"a","image":7}]}}"#;
        let err = Pod::from_json(json.into()).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers[0].image"));
        assert_eq!(
            err.message(),
            "invalid pod: invalid type: integer `7`, expected a string"
        );
        let err = Pod::from_json("{".into()).unwrap_err();
        assert_eq!(err.field(), None);
        assert!(err.message().starts_with("invalid pod: EOF"), "{err}");
        let err = Pod::from_json("{} x".into()).unwrap_err();
        assert!(err.message().starts_with("invalid pod: trailing"), "{err}");
    }

    #[test]
    fn value_pod_must_be_an_object() {
        assert!(serde_json::Value::from_json("[1]".into()).is_err());
        let err = serde_json::Value::from_json("nope".into()).unwrap_err();
        assert!(
            err.message().starts_with("invalid pod: not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn containers_of_each_kind() {
        let json = r#"{"spec":{"containers":[{"name":"a"}],"initContainers":[{"name":"i"}]}}"#;
        let mut pod = Pod::from_json(json.into()).unwrap();
        assert_eq!(containers(&pod, ContainerKind::Init)[0].name, "i");
        containers_mut(&mut pod, ContainerKind::Container)[0].name = "b".into();
        assert_eq!(containers(&pod, ContainerKind::Container)[0].name, "b");
        assert!(containers_mut(&mut Pod::default(), ContainerKind::Init).is_empty());
        assert_eq!(
            ContainerKind::Init.path(1).as_str(),
            "spec.initContainers[1]"
        );
    }

    #[test]
    fn raw_pod_is_untouched() {
        let text = " {\"kind\":  \"Pod\"} ";
        assert_eq!(
            RawPod::from_json(text.into()).unwrap().into_json().unwrap(),
            text
        );
    }
}
