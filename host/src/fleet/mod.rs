//! Rollouts across nodes, without a controller: the objects the daemons of
//! every node share through the API server, and what they mean.
//!
//! Every daemon renders its own node's manifests; what they coordinate is
//! *when* an update is written. Both kinds of object are Leases
//! (`coordination.k8s.io/v1`) in one namespace (the daemon's
//! `daemon.rollouts.namespace`), told apart by the label [`ROLE_LABEL`]:
//!
//! * **Slots** ([`slot_name`]): a template may be updating on at most
//!   `max-unavailable` nodes at once ([`policy`]). A node holds a slot
//!   (`holderIdentity` = the node's name, renewed every third of
//!   `leaseDurationSeconds`) from before it writes a changed manifest until
//!   the kubelet's mirror pod of the new revision is Ready, or the revision
//!   failed and was rolled back. A slot whose holder stops renewing it is
//!   free once `leaseDurationSeconds` passed without a change seen by the
//!   others: a crashed daemon or a vanished node delays a rollout by at most
//!   that, never forever.
//! * **Node statuses** ([`status_name`]): one per node, its templates'
//!   [`TemplateStatus`] as JSON in the annotation [`STATUS_ANNOTATION`]:
//!   revision in place, target, phase, and the last failed target and why.
//!   Written only when it changes, never on a timer: an idle cluster makes
//!   no writes. A target that failed on any node is not started by any
//!   other node until the template changes (a new target).
//!
//! * **Halt markers** ([`halt_name`]): one per node and template, written
//!   by a node whose update of the template failed, naming the failed
//!   target and its change ([`CHANGE_ANNOTATION`]; none once that node
//!   confirmed a fixed target of the change). The daemons watch these and the slots of their own lanes
//!   ([`lanes`]), never the node statuses: what a node receives per
//!   rollout does not grow with the fleet (docs/daemon.md, "Fleets").
//!
//! A **target** ([`target`]) names one version of a template's inputs, the
//! same on every node: the PodTemplate as podstamp reads it and the
//! fingerprint of its plugin chain. The *revision* of a manifest
//! (`podstamp.io/revision`) is node-specific (plugins apply node-specific
//! transforms); the target is what a rollout rolls. A **change**
//! ([`change`]) is the same without the chain's settings, which may differ
//! per node (a control-plane member's address in its `vars`): what a halt
//! stops on every node ([`Halts`]), where nodes whose settings differ roll
//! different targets of one change.
//!
//! Invariants: another node's record counts only as what that node may
//! have written ([`trust`]: name ↔ holder ↔ node); objects are only ever read leniently ([`NodeStatus::parse`]
//! never fails on content: a record podstamp cannot read is an empty one,
//! reported); names are valid object names whatever the template's name.

pub mod lanes;
pub mod policy;
pub mod trust;
pub mod view;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The label on every Lease podstamp writes, with [`ROLE_SLOT`] or
/// [`ROLE_STATUS`]: what the daemons and `podstamp status` list.
pub const ROLE_LABEL: &str = "podstamp.io/lease";
pub const ROLE_SLOT: &str = "slot";
pub const ROLE_STATUS: &str = "node-status";
pub const ROLE_HALT: &str = "halt";
/// The label that puts a slot in its lane ([`lanes::lane`] of its name) and
/// a halt marker in [`HALT_LANE`]: a daemon watches the Leases of the
/// lanes it waits in, and the halts.
pub const LANE_LABEL: &str = "podstamp.io/lane";
pub const HALT_LANE: &str = "halt";
/// A halt marker's failure: [`Failed`] as JSON.
pub const FAILURE_ANNOTATION: &str = "podstamp.io/failure";
/// A slot's template, `namespace/name`.
pub const TEMPLATE_ANNOTATION: &str = "podstamp.io/template";
/// The target a slot's holder is writing, or a halt marker's failed one.
pub const TARGET_ANNOTATION: &str = "podstamp.io/target";
/// A halt marker's failed change ([`change`]): absent on a marker of a
/// daemon that predates it (it halts by target only), and once its node
/// confirmed another target of the same change (the change is not what
/// failed there: its own settings were, and are fixed).
pub const CHANGE_ANNOTATION: &str = "podstamp.io/change";
/// A node status Lease's record, JSON.
pub const STATUS_ANNOTATION: &str = "podstamp.io/status";
/// The record format's version; a newer one is read as far as it goes.
pub const STATUS_VERSION: u32 = 1;

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The target of a template's inputs: the same on every node that reads the
/// same PodTemplate with the same chain. 10 hex digits, like revisions.
pub fn target(template_fingerprint: &[u8; 32], chain_fingerprint: &[u8; 32]) -> String {
    short_digest(
        b"podstamp target v1\0",
        template_fingerprint,
        chain_fingerprint,
    )
}

/// The change of a template's inputs: its target ([`target`]) without the
/// settings of the chain's steps (`chain_shape`: each step's name, plugin
/// digest and scope, [`crate::chain::Chain::shape`]), so that nodes whose
/// plugin settings differ, rolling different targets, roll one change.
/// 10 hex digits, hashed apart from targets.
pub fn change(template_fingerprint: &[u8; 32], chain_shape: &[u8; 32]) -> String {
    short_digest(b"podstamp change v1\0", template_fingerprint, chain_shape)
}

/// The first 10 hex digits of the sha256 of `domain` (which keeps targets
/// and changes apart), the template's fingerprint and the chain's.
fn short_digest(domain: &[u8], template: &[u8; 32], chain: &[u8; 32]) -> String {
    let mut hash = Sha256::new();
    hash.update(domain);
    hash.update(template);
    hash.update(chain);
    hex::encode(hash.finalize())[..10].to_string()
}

/// What halts the updates of one template on a node: the targets, and the
/// changes, that failed on some node, each → which node and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Halts {
    pub targets: BTreeMap<String, String>,
    pub changes: BTreeMap<String, String>,
}

impl Halts {
    /// Why an update to `target` of `change` is not written, if it is not:
    /// the target failed somewhere, or another target of its change did.
    pub fn halts(&self, target: &str, change: Option<&str>) -> Option<String> {
        if let Some(why) = self.targets.get(target) {
            return Some(format!("target {target} failed on {why}"));
        }
        let change = change?;
        self.changes
            .get(change)
            .map(|why| format!("change {change} (target {target} here) failed on {why}"))
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty() && self.changes.is_empty()
    }
}

/// The name of slot `index` of template `id` (`namespace/name`). Too long a
/// name is cut and made unique again with a hash of the whole.
pub fn slot_name(id: &str, index: u32) -> String {
    bounded(format!("podstamp-slot.{}.{index}", id.replace('/', ".")))
}

/// The name of node `node`'s halt marker for template `id`.
pub fn halt_name(node: &str, id: &str) -> String {
    bounded(format!("podstamp-halt.{node}.{}", id.replace('/', ".")))
}

/// The name of node `node`'s status Lease.
pub fn status_name(node: &str) -> String {
    bounded(format!("podstamp-node.{node}"))
}

fn bounded(name: String) -> String {
    let name = name.to_ascii_lowercase();
    if name.len() <= MAX_NAME {
        return name;
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    // The hash is a part of its own: no part grows past 63 characters.
    let mut cut = name[..MAX_NAME - 17]
        .trim_end_matches(['.', '-'])
        .to_string();
    cut.push('.');
    cut.push_str(&digest[..16]);
    cut
}

/// One node's record: its templates' rollout state. Written whole by its
/// node only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub version: u32,
    /// `namespace/name` → state.
    #[serde(default)]
    /// Boxed: a status is over 300 bytes, and a map's nodes are about half
    /// full when keys come in order (docs/performance.md §3.6).
    pub templates: BTreeMap<String, Box<TemplateStatus>>,
}

/// A template's rollout state on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStatus {
    /// The manifest's revision in place (`podstamp.io/revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The target of the manifest in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The target the node renders now: the one in place, or the one it
    /// waits to write (or was halted on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<String>,
    /// The change ([`change`]) of `wanted`: nodes whose plugin settings
    /// differ want different targets of one change, and `podstamp status`
    /// counts a node up to date on it as updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
    /// The template's `metadata.generation` the target was rendered from:
    /// orders targets for people (`podstamp status`), never for decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// [`Phase`] as text: a newer daemon's phase is shown as it is.
    #[serde(default)]
    pub phase: String,
    /// When the phase last changed, RFC 3339.
    #[serde(default)]
    pub since: String,
    /// Why the node is waiting or halted, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last target that failed on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failed>,
}

/// A target that failed on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    pub target: String,
    /// The target's change ([`change`]), while it halts the change on the
    /// other nodes: None from a daemon that predates changes, and once this
    /// node confirmed another target of the same change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
    #[serde(default)]
    pub revision: String,
    /// The kubelet's reason (CrashLoopBackOff, ErrImageNeverPull…) or
    /// ProgressDeadlineExceeded.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339.
    #[serde(default)]
    pub at: String,
}

/// Where a template stands on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for a slot before writing the new target.
    Waiting,
    /// Not written: the target failed on a node (this one or another).
    Halted,
    /// The new revision is written; the kubelet has not run it yet.
    Written,
    Running,
    /// Its mirror pod is Ready, not yet for long enough to call it a
    /// success.
    Confirming,
    /// Its mirror pod is Ready and stayed so: up to date.
    Ready,
    /// The revision failed here (and was rolled back when it could be).
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Halted => "halted",
            Phase::Written => "written",
            Phase::Running => "running",
            Phase::Confirming => "confirming",
            Phase::Ready => "ready",
            Phase::Failed => "failed",
        }
    }
}

impl NodeStatus {
    /// Reads a record; never fails: what cannot be read is an empty record
    /// and the reason.
    pub fn parse(text: Option<&str>) -> (NodeStatus, Option<String>) {
        match text {
            None => (NodeStatus::default(), None),
            Some(text) => match serde_json::from_str(text) {
                Ok(status) => (status, None),
                Err(e) => (
                    NodeStatus::default(),
                    Some(format!("{STATUS_ANNOTATION}: {e}")),
                ),
            },
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serializes")
    }
}

/// Now, as the records write it.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_object_names_whatever_the_template() {
        assert_eq!(
            slot_name("kube-system/web", 0),
            "podstamp-slot.kube-system.web.0"
        );
        assert_eq!(status_name("Node-1"), "podstamp-node.node-1");
        let long = format!(
            "ns/{}",
            [
                "a".repeat(60),
                "b".repeat(60),
                "c".repeat(60),
                "d".repeat(60)
            ]
            .join(".")
        );
        let (a, b) = (slot_name(&long, 0), slot_name(&long, 1));
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME, "{a}");
        assert_ne!(a, b);
        crate::validate::check_dns_subdomain(&a).unwrap();
    }

    #[test]
    fn a_record_is_read_leniently_and_round_trips() {
        let mut status = NodeStatus {
            version: STATUS_VERSION,
            ..NodeStatus::default()
        };
        status.templates.insert(
            "ns/web".into(),
            Box::new(TemplateStatus {
                revision: Some("0123456789".into()),
                target: Some("abcdef0123".into()),
                phase: Phase::Ready.as_str().into(),
                since: now_rfc3339(),
                ..TemplateStatus::default()
            }),
        );
        let json = status.to_json();
        assert_eq!(NodeStatus::parse(Some(&json)), (status, None));
        let (empty, why) = NodeStatus::parse(Some("{not json"));
        assert_eq!(empty, NodeStatus::default());
        assert!(why.unwrap().contains(STATUS_ANNOTATION));
        // A newer daemon's fields are ignored, its phases kept as text.
        let newer = r#"{"version": 9, "templates": {"ns/web": {"phase": "paused", "extra": 1}}}"#;
        let (read, why) = NodeStatus::parse(Some(newer));
        assert_eq!(
            (read.templates["ns/web"].phase.as_str(), why),
            ("paused", None)
        );
    }

    #[test]
    fn a_target_depends_on_the_template_and_the_chain_only() {
        let (t1, t2, c1) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        assert_eq!(target(&t1, &c1), target(&t1, &c1));
        assert_ne!(target(&t1, &c1), target(&t2, &c1));
        assert_ne!(target(&t1, &c1), target(&t1, &t2));
        assert_eq!(target(&t1, &c1).len(), 10);
    }

    #[test]
    fn a_change_is_hashed_apart_from_a_target_of_the_same_inputs() {
        let (t1, c1) = ([1u8; 32], [3u8; 32]);
        assert_ne!(change(&t1, &c1), target(&t1, &c1));
        assert_eq!(change(&t1, &c1), change(&t1, &c1));
        assert_eq!(change(&t1, &c1).len(), 10);
    }

    #[test]
    fn a_halt_is_of_a_target_or_of_its_change() {
        let halts = Halts {
            targets: BTreeMap::from([("t1".into(), "node n2: CrashLoopBackOff".into())]),
            changes: BTreeMap::from([("c1".into(), "node n3 (target t9): Boom".into())]),
        };
        assert_eq!(
            halts.halts("t1", None).as_deref(),
            Some("target t1 failed on node n2: CrashLoopBackOff")
        );
        assert_eq!(
            halts.halts("t2", Some("c1")).as_deref(),
            Some("change c1 (target t2 here) failed on node n3 (target t9): Boom")
        );
        assert_eq!(halts.halts("t2", Some("c2")), None);
        assert_eq!(halts.halts("t2", None), None, "no change known: by target");
        // A record without a change (an older daemon's) reads as before.
        let old: Failed = serde_json::from_str(r#"{"target": "t1"}"#).unwrap();
        assert_eq!(old.change, None);
        assert!(!serde_json::to_string(&old).unwrap().contains("change"));
    }
}
