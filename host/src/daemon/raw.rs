//! Objects as the API server sent them, decoded so that no single object can
//! fail a list or a watch.
//!
//! A list page is decoded at once (`Api::list`, in [`super::watch`]). With a typed
//! k8s-openapi object, one item that the API server stores but the typed
//! model cannot hold (a timestamp past the time library's range, say) fails
//! the whole list, and the watch relists forever: nothing is applied for
//! any template. [`Raw`] keeps the object as JSON and reads only the
//! identifying metadata the watcher and Events need; each object is then
//! parsed on its own ([`crate::template::Template::from_value`],
//! [`crate::node::NodeContext::from_value`]), so a bad one is that object's
//! error alone.
//!
//! Invariants:
//! * Decoding a `Raw` fails only when the JSON text itself is malformed, or
//!   nested deeper than serde_json's recursion limit (128), which objects of
//!   the PodTemplate and Node schemas cannot reach: the API server prunes
//!   unknown fields, and neither schema is recursive. No field's value can
//!   fail it.
//! * Its `Debug` shows the kind, namespace, name and resourceVersion, never
//!   the object's content: content can hold secrets, and libraries may log
//!   what they hold.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// An object of kind `K`, as JSON.
pub struct Raw<K> {
    /// Only name, namespace, uid and resourceVersion, when they are strings.
    meta: ObjectMeta,
    value: Value,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource<DynamicType = ()>> Raw<K> {
    /// Reads the object. The items of a list come without `apiVersion` and
    /// `kind`; they are filled in from `K`, as the typed model does.
    pub fn from_value(mut value: Value) -> Self {
        if let Some(object) = value.as_object_mut() {
            for (field, known) in [("apiVersion", K::api_version(&())), ("kind", K::kind(&()))] {
                object
                    .entry(field)
                    .or_insert_with(|| Value::String(known.into_owned()));
            }
        }
        let text = |field: &str| {
            value
                .get("metadata")
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let meta = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        Raw {
            meta,
            value,
            kind: PhantomData,
        }
    }
}

impl<K> Raw<K> {
    /// The whole object.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// `metadata.name`, or "" when it has none.
    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace`, or "" (cluster objects).
    pub fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }
}

impl<K> Clone for Raw<K> {
    fn clone(&self) -> Self {
        Raw {
            meta: self.meta.clone(),
            value: self.value.clone(),
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for Raw<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Raw")
            .field("kind", &K::kind(&()))
            .field("namespace", &self.meta.namespace)
            .field("name", &self.meta.name)
            .field("resource_version", &self.meta.resource_version)
            .finish_non_exhaustive()
    }
}

impl<'de, K: Resource<DynamicType = ()>> Deserialize<'de> for Raw<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Raw::from_value)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Raw<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodTemplate;
    use kube::core::ObjectList;
    use serde_json::json;

    #[test]
    fn an_item_the_typed_model_refuses_does_not_fail_the_list() {
        let list = json!({
            "apiVersion": "v1", "kind": "PodTemplateList", "metadata": {"resourceVersion": "7"},
            "items": [
                {"metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "5", "uid": "u"},
                 "template": {"metadata": {"creationTimestamp": "9999-12-31T23:59:59Z"}}},
                {"metadata": {"name": "odd", "labels": 3, "creationTimestamp": []}},
            ]
        });
        assert!(
            serde_json::from_value::<ObjectList<PodTemplate>>(list.clone()).is_err(),
            "the typed model refuses it (the premise)"
        );
        let raw: ObjectList<Raw<PodTemplate>> = serde_json::from_value(list).unwrap();
        assert_eq!(raw.items.len(), 2);
        let bad = &raw.items[0];
        assert_eq!((bad.namespace(), bad.name()), ("ns", "bad"));
        assert_eq!(bad.meta().resource_version.as_deref(), Some("5"));
        let reference = bad.object_ref(&());
        assert_eq!(reference.kind.as_deref(), Some("PodTemplate"));
        assert_eq!(reference.api_version.as_deref(), Some("v1"));
        assert_eq!(reference.uid.as_deref(), Some("u"));
        assert!(
            !format!("{bad:?}").contains("9999"),
            "Debug shows no content"
        );
        assert_eq!(raw.items[1].name(), "odd");
        assert_eq!(raw.items[1].value()["apiVersion"], "v1", "filled in");
        assert_eq!(raw.items[1].value()["kind"], "PodTemplate");
    }
}
