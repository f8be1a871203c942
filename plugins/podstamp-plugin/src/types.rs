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
//! Invariant: every struct has `other` (flattened), so that
//! `parse → serialize` keeps every field of the input.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A v1 Pod: `metadata` and `spec` typed, the rest (`status`, …) in `other`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// `v1` when the input has none.
    #[serde(default = "v1")]
    pub api_version: String,
    /// `Pod` when the input has none.
    #[serde(default = "pod_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    /// Every other field, as it came.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

fn v1() -> String {
    "v1".into()
}

fn pod_kind() -> String {
    "Pod".into()
}

/// `metadata`: name, namespace, labels and annotations typed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
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
    pub other: Map<String, Value>,
}

/// `spec`: the containers, the node and the host network typed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
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
    pub other: Map<String, Value>,
}

/// A container: name, image, command, arguments and environment typed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
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
    pub other: Map<String, Value>,
}

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
        assert_eq!(pod.spec.unwrap().containers[0].image.as_deref(), Some("i"));
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
