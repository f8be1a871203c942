use std::collections::BTreeMap;

/// What the host knows about the node a pod is rendered for.
///
/// In tests, build one with the `with_*` helpers:
///
/// ```
/// use podstamp_plugin::Node;
///
/// let node = Node::new("worker-1")
///     .with_architecture("arm64")
///     .with_label("zone", "a")
///     .with_address("InternalIP", "10.0.0.12");
/// assert_eq!(node.label("zone"), Some("a"));
/// assert_eq!(node.address("InternalIP"), Some("10.0.0.12"));
/// assert_eq!(node.address("ExternalIP"), None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// The Node's `metadata.name`.
    pub name: String,
    /// The Node's `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// The Node's `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The Node's `status.addresses`, in the Node's order.
    pub addresses: Vec<NodeAddress>,
    /// The CPU architecture in Go's naming: `amd64`, `arm64`, `ppc64le`...
    pub architecture: String,
    /// The operating system: `linux`, `windows`.
    pub operating_system: String,
    /// The kubelet's version, e.g. `v1.34.2`, when the host knows it.
    pub kubelet_version: Option<String>,
}

/// One of the node's addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`.
    pub kind: String,
    /// The address itself, e.g. `10.0.0.12`.
    pub address: String,
}

impl Node {
    /// A node with this name and nothing else (empty architecture and
    /// operating system, no labels, annotations or addresses).
    pub fn new(name: impl Into<String>) -> Self {
        Node {
            name: name.into(),
            ..Node::default()
        }
    }

    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The value of an annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// The first address of this kind, e.g. `address("InternalIP")`.
    pub fn address(&self, kind: &str) -> Option<&str> {
        self.addresses
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| a.address.as_str())
    }

    /// Adds a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Appends an address.
    pub fn with_address(mut self, kind: impl Into<String>, address: impl Into<String>) -> Self {
        self.addresses.push(NodeAddress {
            kind: kind.into(),
            address: address.into(),
        });
        self
    }

    /// Sets the architecture.
    pub fn with_architecture(mut self, architecture: impl Into<String>) -> Self {
        self.architecture = architecture.into();
        self
    }

    /// Sets the operating system.
    pub fn with_operating_system(mut self, os: impl Into<String>) -> Self {
        self.operating_system = os.into();
        self
    }

    /// Sets the kubelet version.
    pub fn with_kubelet_version(mut self, version: impl Into<String>) -> Self {
        self.kubelet_version = Some(version.into());
        self
    }
}

impl From<crate::bindings::podstamp::plugin::types::NodeContext> for Node {
    fn from(node: crate::bindings::podstamp::plugin::types::NodeContext) -> Self {
        Node {
            name: node.name,
            labels: node.labels.into_iter().collect(),
            annotations: node.annotations.into_iter().collect(),
            addresses: node
                .addresses
                .into_iter()
                .map(|a| NodeAddress {
                    kind: a.kind,
                    address: a.address,
                })
                .collect(),
            architecture: node.architecture,
            operating_system: node.operating_system,
            kubelet_version: node.kubelet_version,
        }
    }
}
