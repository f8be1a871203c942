//! Every message between the daemon's threads and tasks, in one place.
//!
//! The reconciler's thread receives [`Input`]s from the sources (templates,
//! the Node, catalogs, mirror pods, the coordinator's [`Answer`]s); it sends
//! the coordinator [`Ask`]s; the catalog loader receives [`Trigger`]s.
//! docs/daemon.md draws who sends what to whom.
//!
//! Invariant: this module imports no other module of the daemon. Senders and
//! receivers depend on it, never on each other, so that a source never needs
//! the reconciler's types (and an import circle cannot start here).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;

use crate::catalog::Catalog;
use crate::fleet::{Halts, TemplateStatus};
use crate::node::NodeContext;
use crate::reason::Reason;
use crate::template::Template;

/// What the sources tell the reconciler.
#[derive(Debug)]
pub enum Input {
    /// A complete list of the templates begins; until [`Input::ListDone`] the
    /// templates seen so far stay as they are.
    ListStarted,
    /// One template of the list.
    Listed(Incoming),
    /// The list is complete: templates not in it are gone.
    ListDone,
    /// A template was added or changed.
    Applied(Incoming),
    /// A template was deleted (or no longer matches the selector).
    Deleted { key: String },
    /// The node the daemon renders for, as now known.
    Node(NodeContext),
    /// The labels of the daemon's namespace that decide its Pod Security
    /// level (`pod-security.kubernetes.io/enforce` and `enforce-version`,
    /// only those; empty: none, or no such Namespace), once read and at
    /// each change. With the API source nothing renders before the first.
    Namespace(BTreeMap<String, String>),
    /// A whole, loaded catalog to use from the next pass on. Shared with the
    /// loader, which keeps it to compare (and reuse) at the next reload.
    Catalog(Arc<Catalog>),
    /// What a mirror pod of ours says.
    Mirror(Observation),
    /// The watch on this node's pods listed them all (or, after a failure,
    /// resumed where it stopped): rollouts can be judged from now on.
    MirrorSynced,
    /// The watch on this node's pods failed (say, no permission): no
    /// rollout is judged until it lists or resumes again, so that no
    /// deadline passes for want of a status nobody could read.
    MirrorLost,
    /// What the node itself shows of a revision in place (the container
    /// runtime and the pod's own probes, judged): taken only while the
    /// mirror pod cannot be followed.
    Local(Observation),
    /// Whether the node's own evidence can be read (the container
    /// runtime's CRI answers), when that changes.
    LocalAvailable(bool),
    /// The coordinator of rollouts across nodes answers ([`Gate`]).
    Fleet(Answer),
}

/// A template as a source delivers it.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// Unique within the source: `namespace/name` from the API, the file name
    /// from a directory.
    pub key: String,
    /// `namespace/name`, when it could be read even if the template is invalid.
    pub id: Option<String>,
    pub template: Result<Template, SourceError>,
    /// The PodTemplate object, for Events; None from a directory.
    pub reference: Option<ObjectReference>,
}

/// Why a source could not deliver a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The template is wrong (it does not parse, or is not a valid
    /// PodTemplate): only an edit fixes it. Reason `InvalidTemplate`.
    #[error("{0}")]
    Invalid(String),
    /// The template could not be read (an I/O error such as "Too many open
    /// files"): not the template's fault. The source reads it again, with
    /// backoff; until then nothing is garbage-collected on its account.
    /// Reason `ReadFailed`.
    #[error("{0}")]
    Unreadable(String),
}

impl SourceError {
    /// The failure reason reported for it.
    pub fn reason(&self) -> Reason {
        match self {
            SourceError::Invalid(_) => Reason::InvalidTemplate,
            SourceError::Unreadable(_) => Reason::ReadFailed,
        }
    }
}

/// What a mirror pod says about one revision of a template's pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// `namespace/name` of the PodTemplate (`podstamp.io/source`).
    pub source: String,
    /// `podstamp.io/revision`.
    pub revision: String,
    pub state: PodState,
    /// The mirror pod (name, namespace, uid): the Events' related object.
    pub pod: ObjectReference,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Not running yet.
    Pending,
    /// Running, not Ready.
    Running,
    /// Its Ready condition is True.
    Ready,
    /// The kubelet's reason (a container's waiting reason, or the pod's
    /// when it ended), and its message.
    Failed { reason: String, message: String },
}

/// What the reconciler asks of the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// A slot of template `id` (one of `slots`), to write `target`.
    /// `expires`: whether a slot whose holder stopped renewing it is free
    /// once its duration passed (not for a quorum member's,
    /// [`crate::fleet::policy::Policy::expires`]).
    Acquire {
        id: String,
        target: String,
        slots: u32,
        expires: bool,
    },
    /// No slot is needed any more for `id` (asked, not granted).
    Cancel { id: String },
    /// How many nodes the label selector `selector` selects (empty: every
    /// node), for a share of them ([`crate::fleet::policy::Policy::Percent`]).
    Count { selector: String },
    /// The slot held for `id` is free for the next node.
    Release { id: String },
    /// This node's state for `id`; None: the template is gone.
    Report {
        id: String,
        status: Option<Box<TemplateStatus>>,
    },
}

/// What the coordinator tells the reconciler.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// This node holds a slot of `id` (asked for, or found held by it at
    /// start).
    Granted { id: String, target: String },
    /// The slot of `id` was taken over by another node (this one did not
    /// renew it in time).
    Lost { id: String },
    /// Every target, and every change, that failed on some node and halts
    /// this one: template → what halts it. Sent whole, when it changes.
    Failed(BTreeMap<String, Halts>),
    /// How many nodes `selector` selects ([`Ask::Count`]); None: they could
    /// not be counted.
    Nodes {
        selector: String,
        count: Option<u32>,
    },
}

/// Why the loader should load the catalog again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The source changed: what changed, for the log.
    Changed(String),
    /// A periodic re-read, in case a change was missed (or happened in a
    /// file no watch covers, such as a `settingsFile`).
    Periodic,
}
