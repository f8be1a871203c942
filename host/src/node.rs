//! The node context: what plugins are told about the node a pod is rendered for.
//!
//! It comes from a Node object (the API server's, or a file for offline
//! renders) or from command-line flags.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, ...
    pub kind: String,
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeContext {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub addresses: Vec<NodeAddress>,
    /// Go's architecture names, as the kubelet reports them: `amd64`, `arm64`.
    pub architecture: String,
    pub operating_system: String,
    pub kubelet_version: Option<String>,
}

/// The well-known label the kubelet sets to the node's architecture.
const ARCH_LABEL: &str = "kubernetes.io/arch";
const OS_LABEL: &str = "kubernetes.io/os";

impl NodeContext {
    /// A context with only a name; architecture and OS are this machine's.
    pub fn named(name: impl Into<String>) -> Self {
        NodeContext {
            name: name.into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            addresses: Vec::new(),
            architecture: host_architecture().to_string(),
            operating_system: std::env::consts::OS.to_string(),
            kubelet_version: None,
        }
    }

    /// Reads what plugins need from a Node object. The architecture and OS
    /// come from `status.nodeInfo`, else from the node's well-known labels,
    /// else from this machine.
    pub fn from_node(node: &Node) -> Result<Self, String> {
        let name = node
            .metadata
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or("the Node has no metadata.name")?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let status = node.status.as_ref();
        let info = status.and_then(|s| s.node_info.as_ref());
        let addresses = status
            .and_then(|s| s.addresses.as_ref())
            .map(|list| {
                list.iter()
                    .map(|a| NodeAddress {
                        kind: a.type_.clone(),
                        address: a.address.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let pick = |reported: Option<&String>, label: &str, fallback: &str| {
            reported
                .filter(|v| !v.is_empty())
                .or_else(|| labels.get(label))
                .cloned()
                .unwrap_or_else(|| fallback.to_string())
        };
        Ok(NodeContext {
            architecture: pick(
                info.map(|i| &i.architecture),
                ARCH_LABEL,
                host_architecture(),
            ),
            operating_system: pick(
                info.map(|i| &i.operating_system),
                OS_LABEL,
                std::env::consts::OS,
            ),
            kubelet_version: info
                .map(|i| i.kubelet_version.clone())
                .filter(|v| !v.is_empty()),
            name,
            labels,
            annotations,
            addresses,
        })
    }

    /// Reads what plugins need from a Node object as the API server sent it.
    /// Only those fields (name, labels, annotations, addresses, nodeInfo) are
    /// decoded: another field that the typed model cannot hold (a far-future
    /// heartbeat time, say) must not stop rendering for this node. An error
    /// names the field.
    pub fn from_value(node: &Value) -> Result<Self, String> {
        let pick = |path: &str| node.pointer(path).cloned().unwrap_or(Value::Null);
        let used = json!({
            "metadata": {
                "name": pick("/metadata/name"),
                "labels": pick("/metadata/labels"),
                "annotations": pick("/metadata/annotations"),
            },
            "status": {
                "addresses": pick("/status/addresses"),
                "nodeInfo": pick("/status/nodeInfo"),
            },
        });
        let typed: Node = serde_path_to_error::deserialize(used)
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        NodeContext::from_node(&typed)
    }
}

/// The first field of a Node object that the typed model (k8s-openapi)
/// cannot decode, as `field: error`; None when it decodes whole.
pub fn undecodable_field(node: &Value) -> Option<String> {
    serde_path_to_error::deserialize::<_, Node>(node)
        .err()
        .map(|e| format!("{}: {}", e.path(), e.inner()))
}

/// Why a Node file cannot be used; each message names the file (and the
/// field), the error it comes from stays its source.
#[derive(Debug, thiserror::Error)]
pub enum NodeFileError {
    #[error("{}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Parse(#[from] crate::template::ParseError),
    #[error("{origin}: kind: expected a Node object")]
    NotANode { origin: String },
    #[error("{origin}: {field}: {source}")]
    Field {
        origin: String,
        field: String,
        #[source]
        source: serde_json::Error,
    },
    /// The Node decodes but says too little (e.g. no name).
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// Reads a Node object (YAML or JSON) from a file; errors name the file and field.
pub fn read_node_file(path: &std::path::Path) -> Result<NodeContext, NodeFileError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NodeFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let value = crate::template::parse_document(&bytes, &origin)?;
    if value.get("kind").and_then(|k| k.as_str()) != Some("Node") {
        return Err(NodeFileError::NotANode { origin });
    }
    let node: Node = serde_path_to_error::deserialize(value).map_err(|e| NodeFileError::Field {
        origin: origin.clone(),
        field: e.path().to_string(),
        source: e.into_inner(),
    })?;
    NodeContext::from_node(&node).map_err(|message| NodeFileError::Invalid { origin, message })
}

/// This machine's architecture in Go's naming, which is what Kubernetes uses.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_node_object() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/arch": "arm64", "zone": "a"}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "n1"}],
                "nodeInfo": {"architecture": "", "operatingSystem": "linux", "kubeletVersion": "v1.34.2",
                  "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                  "machineID": "", "osImage": "", "systemUUID": ""}
            }
        }))
        .unwrap();
        let ctx = NodeContext::from_node(&node).unwrap();
        assert_eq!(ctx.name, "n1");
        assert_eq!(
            ctx.architecture, "arm64",
            "falls back to the label when nodeInfo is empty"
        );
        assert_eq!(ctx.operating_system, "linux");
        assert_eq!(ctx.kubelet_version.as_deref(), Some("v1.34.2"));
        assert_eq!(ctx.addresses[0].address, "10.0.0.5");
    }

    #[test]
    fn a_field_podstamp_does_not_use_cannot_stop_it() {
        let node = serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "9999-12-31T23:59:59Z"}]},
        });
        assert_eq!(
            undecodable_field(&node)
                .as_deref()
                .map(|e| e.split(':').next()),
            Some(Some("spec.taints[0].timeAdded"))
        );
        let ctx = NodeContext::from_value(&node).unwrap();
        assert_eq!(ctx.labels["zone"], "a");
        let e = NodeContext::from_value(
            &serde_json::json!({"metadata": {"name": "n1", "labels": {"zone": 1}}}),
        )
        .unwrap_err();
        assert!(e.starts_with("metadata.labels.zone: "), "{e}");
    }

    #[test]
    fn a_node_needs_a_name() {
        assert!(NodeContext::from_node(&Node::default()).is_err());
    }
}
