//! Why a template's manifest (or a new catalog) was not used: one closed list, the same
//! words in the log (`reason=`), the metrics
//! (`podstamp_render_failures_total{reason}`) and the Events' reason, so
//! that an alert, a dashboard and `kubectl get events` agree. Adding a
//! reason is adding a variant here (and a row to docs/daemon.md's table).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The template does not parse, or is not a valid PodTemplate.
    InvalidTemplate,
    /// The template could not be read (an I/O error); not its fault.
    ReadFailed,
    /// `podstamp.io/plugins` names a plugin the catalog does not have.
    UnknownPlugin,
    /// `podstamp.io/plugins` repeats a plugin or is longer than the catalog.
    InvalidChain,
    /// `podstamp.io/settings` is not settings the template may give.
    InvalidSettings,
    /// A plugin failed, the rendered pod is invalid or too large.
    RenderFailed,
    /// Another template already produces this pod name.
    NameConflict,
    /// The manifest's file exists and is not podstamp's.
    ForeignFile,
    /// The manifest could not be written.
    WriteFailed,
    /// A new plugin catalog from the API was refused whole (an Event on the
    /// ConfigMap at fault); the catalog in use keeps serving.
    CatalogRefused,
    /// Not a render failure: a revision written became Ready on this node
    /// (a Normal Event; never counted in `podstamp_render_failures_total`).
    RolloutSucceeded,
    /// A revision written failed on this node (the kubelet's reason, or not
    /// Ready within its progress deadline).
    RolloutFailed,
    /// An update not written on this node: its target failed on a node
    /// (this one or another) and the rollout stopped there.
    RolloutHalted,
    /// Not a render failure: the kubelet has not started the revision in
    /// place (no sandbox on the node) by its progress deadline, and there
    /// is nothing to fall back to (kubernetes/kubernetes#105543).
    KubeletNotStarted,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidTemplate => "InvalidTemplate",
            Reason::ReadFailed => "ReadFailed",
            Reason::UnknownPlugin => "UnknownPlugin",
            Reason::InvalidChain => "InvalidChain",
            Reason::InvalidSettings => "InvalidSettings",
            Reason::RenderFailed => "RenderFailed",
            Reason::NameConflict => "NameConflict",
            Reason::ForeignFile => "ForeignFile",
            Reason::WriteFailed => "WriteFailed",
            Reason::CatalogRefused => "CatalogRefused",
            Reason::RolloutSucceeded => "RolloutSucceeded",
            Reason::RolloutFailed => "RolloutFailed",
            Reason::RolloutHalted => "RolloutHalted",
            Reason::KubeletNotStarted => "KubeletNotStarted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
