//! The Leases of podstamp as the coordinator reads and writes them: a slot
//! (who may update a template now) and a node's status record.
//!
//! Invariants:
//! * Objects are read leniently (as JSON): none can stop the watch; a field
//!   that is missing or of the wrong type reads as absent.
//! * What is kept of a Lease is bounded whatever its writer put in it: a
//!   status record over [`MAX_RECORD_BYTES`] is not parsed (read as empty,
//!   said so); the ledger keeps of another node's record only its failures
//!   ([`Seen::failures_only`]); of a halt marker, its failure, cut.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde_json::Value;

use crate::fleet::{
    CHANGE_ANNOTATION, FAILURE_ANNOTATION, Failed, HALT_LANE, LANE_LABEL, NodeStatus, ROLE_HALT,
    ROLE_LABEL, ROLE_SLOT, ROLE_STATUS, STATUS_ANNOTATION, TARGET_ANNOTATION, TEMPLATE_ANNOTATION,
    TemplateStatus, lanes::lane,
};

/// A Lease of ours, as last seen.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Seen {
    pub(super) role: String,
    pub(super) holder: Option<String>,
    pub(super) duration: Duration,
    pub(super) template: Option<String>,
    pub(super) target: Option<String>,
    /// A status Lease's record, parsed once when read (empty for a slot, a
    /// record that is missing or does not parse: rewritten then); a halt
    /// marker's failure, as a record of its one template.
    pub(super) record: NodeStatus,
    /// The node a status record speaks for, when it may be taken at its
    /// word ([`crate::fleet::trust::status_owner`]); None for a slot, or a
    /// record its own node cannot have written.
    pub(super) owner: Option<String>,
    pub(super) transitions: i32,
    /// `spec.acquireTime`, as it was read: kept by renewals.
    pub(super) acquired: Option<MicroTime>,
    pub(super) resource_version: String,
    /// When this node saw this version first.
    pub(super) observed: Instant,
}

/// The largest status record parsed: a node's own record of a few hundred
/// templates is far below it; a larger one is forged or broken, and reading
/// it would let any writer of Leases grow every daemon's memory.
pub(super) const MAX_RECORD_BYTES: usize = 256 << 10;
/// Of another node's record, at most this many failed templates are kept.
pub(super) const MAX_FAILURES_KEPT: usize = 16;
/// And each failure's message cut to this (the halt only names it).
const MAX_FAILURE_TEXT: usize = 256;
/// The largest halt marker failure parsed (an honest one is a few hundred
/// bytes).
const MAX_FAILURE_BYTES: usize = 4 << 10;

impl Seen {
    /// Another node's record, reduced to what this node decides from:
    /// which template targets failed there (bounded in count and text).
    pub(super) fn failures_only(&mut self) {
        let templates = std::mem::take(&mut self.record.templates);
        self.record.templates = templates
            .into_iter()
            .filter_map(|(id, status)| Some((id, failure_only(status.failed?))))
            .take(MAX_FAILURES_KEPT)
            .collect();
    }
}

pub(super) fn read_lease(
    value: &Value,
    now: Instant,
    default_duration: Duration,
) -> Option<(String, Seen)> {
    let metadata = value.get("metadata")?;
    let name = metadata.get("name")?.as_str()?.to_string();
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let annotations = metadata.get("annotations");
    let spec = value.get("spec");
    let role = text(metadata.pointer(&format!("/labels/{}", ROLE_LABEL.replace('/', "~1"))))
        .unwrap_or_default();
    let template = text(annotations.and_then(|a| a.get(TEMPLATE_ANNOTATION)));
    let record = if role == ROLE_HALT {
        halt_record(template.as_deref(), annotations)
    } else {
        NodeStatus::parse(
            annotations
                .and_then(|a| a.get(STATUS_ANNOTATION))
                .and_then(Value::as_str)
                .filter(|text| text.len() <= MAX_RECORD_BYTES),
        )
        .0
    };
    let seconds = spec
        .and_then(|s| s.get("leaseDurationSeconds"))
        .and_then(Value::as_u64)
        .filter(|s| *s > 0);
    Some((
        name,
        Seen {
            role,
            holder: text(spec.and_then(|s| s.get("holderIdentity"))).filter(|h| !h.is_empty()),
            duration: seconds.map_or(default_duration, Duration::from_secs),
            template,
            target: text(annotations.and_then(|a| a.get(TARGET_ANNOTATION))),
            record,
            owner: None,
            transitions: spec
                .and_then(|s| s.get("leaseTransitions"))
                .and_then(Value::as_i64)
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(0),
            acquired: spec
                .and_then(|s| s.get("acquireTime"))
                .and_then(|t| serde_json::from_value(t.clone()).ok()),
            resource_version: text(metadata.get("resourceVersion")).unwrap_or_default(),
            observed: now,
        },
    ))
}

/// A halt marker's failure as a record of its one template (empty when
/// it names no template or its failure does not parse). Its change is the
/// one [`CHANGE_ANNOTATION`] names, and none without it (a marker of a
/// daemon that predates changes halts by target only).
fn halt_record(template: Option<&str>, annotations: Option<&Value>) -> NodeStatus {
    let failed: Option<Failed> = annotations
        .and_then(|a| a.get(FAILURE_ANNOTATION))
        .and_then(Value::as_str)
        .filter(|text| text.len() <= MAX_FAILURE_BYTES)
        .and_then(|text| serde_json::from_str(text).ok());
    let mut record = NodeStatus::default();
    if let (Some(id), Some(mut failed)) = (template, failed) {
        failed.change = annotations
            .and_then(|a| a.get(CHANGE_ANNOTATION))
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(|c| crate::text::cut(c.to_string(), MAX_FAILURE_TEXT));
        record
            .templates
            .insert(id.to_string(), failure_only(failed));
    }
    record
}

/// A template's status that says only `failed`, its texts cut to
/// [`MAX_FAILURE_TEXT`]: what this node keeps of another's failure.
fn failure_only(mut failed: Failed) -> Box<TemplateStatus> {
    failed.message = crate::text::cut(failed.message, MAX_FAILURE_TEXT);
    failed.reason = crate::text::cut(failed.reason, MAX_FAILURE_TEXT);
    Box::new(TemplateStatus {
        failed: Some(failed),
        ..TemplateStatus::default()
    })
}

pub(super) fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn labels(role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ROLE_LABEL.to_string(), role.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "podstamp".to_string(),
        ),
    ])
}

/// The labels of a Lease in lane `lane`.
fn in_lane(role: &str, lane: String) -> BTreeMap<String, String> {
    let mut labels = labels(role);
    labels.insert(LANE_LABEL.to_string(), lane);
    labels
}

/// Which slot, of which template, for which target.
pub(super) struct Slot<'a> {
    pub(super) name: &'a str,
    pub(super) id: &'a str,
    pub(super) target: &'a str,
}

/// The slot Lease held by `holder` (None: free).
pub(super) fn slot_lease(
    slot: Slot<'_>,
    namespace: &str,
    holder: Option<&str>,
    duration: Duration,
    transitions: i32,
    resource_version: Option<String>,
) -> Lease {
    let Slot { name, id, target } = slot;
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(in_lane(ROLE_SLOT, lane(name))),
            annotations: Some(BTreeMap::from([
                (TEMPLATE_ANNOTATION.to_string(), id.to_string()),
                (TARGET_ANNOTATION.to_string(), target.to_string()),
            ])),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(duration.as_secs().max(1).try_into().unwrap_or(i32::MAX)),
            acquire_time: holder.map(|_| micro_now()),
            renew_time: holder.map(|_| micro_now()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// This node's status record, `me` holding it, `record` its JSON.
pub(super) fn status_lease(
    name: String,
    me: &str,
    record: String,
    namespace: &str,
    resource_version: Option<String>,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(labels(ROLE_STATUS)),
            annotations: Some(BTreeMap::from([(STATUS_ANNOTATION.to_string(), record)])),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(me.to_string()),
            renew_time: Some(micro_now()),
            ..LeaseSpec::default()
        }),
    }
}

/// This node's halt marker `name` for template `id`: `failed` is what
/// failed here.
pub(super) fn halt_lease(
    name: String,
    me: &str,
    id: &str,
    failed: &Failed,
    namespace: &str,
    resource_version: Option<String>,
) -> Lease {
    let mut annotations = BTreeMap::from([
        (TEMPLATE_ANNOTATION.to_string(), id.to_string()),
        (TARGET_ANNOTATION.to_string(), failed.target.clone()),
        (
            FAILURE_ANNOTATION.to_string(),
            serde_json::to_string(failed).expect("plain data serializes"),
        ),
    ]);
    // Left out once the change no longer halts (an update replaces the
    // annotations whole: the old one goes).
    if let Some(change) = &failed.change {
        annotations.insert(CHANGE_ANNOTATION.to_string(), change.clone());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(in_lane(ROLE_HALT, HALT_LANE.to_string())),
            annotations: Some(annotations),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(me.to_string()),
            renew_time: Some(micro_now()),
            ..LeaseSpec::default()
        }),
    }
}
