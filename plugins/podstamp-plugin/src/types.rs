//! The typed pod of the SDK: the fields plugins change, typed, and every
//! other field kept as JSON, untouched, in `other`.
//!
//! Why not k8s-openapi's `Pod`: a plugin carries the whole Kubernetes model
//! into its component (1.3 MB, and a parse of every field on each call),
//! where a transform touches a handful of fields. These types name those
//! fields as the Kubernetes API does (so code written against k8s-openapi
//! reads the same: `pod.metadata.labels`, `container.image`, `container.env`)
//! and carry the rest through as it came. Nothing is lost, nothing is
//! reordered in a way the host cares about (the host parses the result and
//! writes the manifest itself), and an unknown or newer field passes through.
//! The feature `k8s-openapi` adds k8s-openapi's `Pod` as a `PodDocument` for
//! plugins that want every field typed.
//!
//! Invariant: every struct but `EnvVar` has `other`, so that `parse →
//! serialize` keeps every field of the input. `other` holds each field's
//! JSON text as it came ([`Other`]), not a parsed `Value`: most of a pod is
//! fields no transform touches, and keeping their text is what makes a
//! typed call cheap (a `Value` map per object, built and written back, was
//! most of its time). Hence `Deserialize` is written out for these structs
//! (`typed_object!`): serde's `flatten` buffers the whole input first and
//! cannot hold raw text.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// The fields of an object that its struct does not type: each one's JSON
/// text, as it came, by name.
#[derive(Clone, Debug, Default)]
pub struct Other(BTreeMap<String, Box<RawValue>>);

impl Other {
    /// The field `key`, parsed as `T`; None when there is no such field.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Option<Result<T, serde_json::Error>> {
        self.0.get(key).map(|raw| serde_json::from_str(raw.get()))
    }

    /// The field `key`'s JSON text.
    pub fn get_raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|raw| raw.get())
    }

    /// Sets the field `key` to `value`, written as JSON.
    pub fn insert<T: Serialize>(
        &mut self,
        key: impl Into<String>,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        let raw = serde_json::value::to_raw_value(value)?;
        self.0.insert(key.into(), raw);
        Ok(())
    }

    /// Removes the field `key`; true if there was one.
    pub fn remove(&mut self, key: &str) -> bool {
        self.0.remove(key).is_some()
    }

    /// The names of the fields, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Equal when every field's JSON text is.
impl PartialEq for Other {
    fn eq(&self, other: &Other) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((k, v), (k2, v2))| k == k2 && v.get() == v2.get())
    }
}

/// Written as a map, so that `#[serde(flatten)]` puts its fields next to
/// the typed ones.
impl Serialize for Other {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A key of a JSON object, borrowed from the text when it has no escape:
/// a typed field's key is only compared, so only the keys kept in `other`
/// are copied.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// `Deserialize` for a struct whose typed fields are listed (JSON name =>
/// field) and whose other fields go into its `other`, starting from its
/// `Default`.
macro_rules! typed_object {
    ($ty:ident, $what:literal, { $($key:literal => $field:ident),* $(,)? }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Fields;
                impl<'de> Visitor<'de> for Fields {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty, A::Error> {
                        let mut out = $ty::default();
                        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                            match key.as_ref() {
                                $($key => out.$field = map.next_value()?,)*
                                _ => {
                                    let raw: Box<RawValue> = map.next_value()?;
                                    out.other.0.insert(key.into_owned(), raw);
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                deserializer.deserialize_map(Fields)
            }
        }
    };
}

/// A v1 Pod: `metadata` and `spec` typed, the rest (`status`, …) in `other`.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// `v1` when the input has none.
    pub api_version: String,
    /// `Pod` when the input has none.
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    /// Every other field, as it came.
    #[serde(flatten)]
    pub other: Other,
}

impl Default for Pod {
    fn default() -> Pod {
        Pod {
            api_version: "v1".into(),
            kind: "Pod".into(),
            metadata: ObjectMeta::default(),
            spec: None,
            other: Other::default(),
        }
    }
}

typed_object!(Pod, "a pod (a JSON object)", {
    "apiVersion" => api_version,
    "kind" => kind,
    "metadata" => metadata,
    "spec" => spec,
});

/// `metadata`: name, namespace, labels and annotations typed.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(flatten)]
    pub other: Other,
}

typed_object!(ObjectMeta, "metadata (a JSON object)", {
    "annotations" => annotations,
    "labels" => labels,
    "name" => name,
    "namespace" => namespace,
});

/// `spec`: the containers, the node and the host network typed.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(flatten)]
    pub other: Other,
}

typed_object!(PodSpec, "a pod spec (a JSON object)", {
    "containers" => containers,
    "hostNetwork" => host_network,
    "initContainers" => init_containers,
    "nodeName" => node_name,
    "nodeSelector" => node_selector,
});

/// A container: name, image, command, arguments and environment typed.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    pub name: String,
    #[serde(flatten)]
    pub other: Other,
}

typed_object!(Container, "a container (a JSON object)", {
    "args" => args,
    "command" => command,
    "env" => env,
    "image" => image,
    "imagePullPolicy" => image_pull_policy,
    "name" => name,
});

/// An environment variable: `value`, or `valueFrom` (kept as JSON).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_survives_a_round_trip() {
        let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":"u","labels":{"a":"b"}},
            "spec":{"priority":5,"containers":[{"name":"c","image":"i","ports":[{"containerPort":80}],
            "env":[{"name":"X","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]}],
            "volumes":[{"name":"v","emptyDir":{}}]},"status":{"phase":"Running"}}"#;
        let pod: Pod = serde_json::from_str(text).unwrap();
        let back: Value = serde_json::to_value(&pod).unwrap();
        let want: Value = serde_json::from_str(text).unwrap();
        assert_eq!(back, want);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.containers[0].image.as_deref(), Some("i"));
        assert_eq!(spec.other.get::<i64>("priority").unwrap().unwrap(), 5);
        assert_eq!(
            spec.other.get_raw("volumes"),
            Some(r#"[{"name":"v","emptyDir":{}}]"#)
        );
    }

    #[test]
    fn other_fields_can_be_read_set_and_removed() {
        let mut pod: Pod = serde_json::from_str(
            r#"{"metadata":{"name":"p"},"spec":{"containers":[],"priority":5}}"#,
        )
        .unwrap();
        let spec = pod.spec.as_mut().unwrap();
        spec.other.insert("priority", &7).unwrap();
        spec.other.insert("restartPolicy", &"Always").unwrap();
        assert!(spec.other.remove("priority"));
        assert_eq!(spec.other.keys().collect::<Vec<_>>(), ["restartPolicy"]);
        assert_eq!(
            serde_json::to_string(&pod).unwrap(),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[],"restartPolicy":"Always"}}"#
        );
    }

    #[test]
    fn a_field_of_the_wrong_type_is_an_error_at_its_path() {
        let err =
            crate::pod::PodDocument::from_json(r#"{"metadata":{"labels":{"a":1}}}"#.to_string())
                .map(|_: Pod| ())
                .unwrap_err();
        assert_eq!(err.field(), Some("metadata.labels.a"));
    }

    #[test]
    fn api_version_and_kind_are_filled_in() {
        let pod: Pod = serde_json::from_str(r#"{"metadata":{"name":"p"}}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&pod).unwrap(),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}"#
        );
    }
}
