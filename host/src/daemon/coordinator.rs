//! The coordinator of rollouts across nodes: this node's side of the slots
//! and node statuses of [`crate::fleet`], kept through the API server.
//!
//! An async task. It watches the Leases of podstamp in the rollout
//! namespace (label [`ROLE_LABEL`]), takes a slot when the reconciler asks
//! for one ([`Ask::Acquire`]) and one is free, renews the slots it holds,
//! frees them when told, and writes this node's status record when it
//! changes. It tells the reconciler what it got ([`Answer`]).
//!
//! Invariants:
//! * Every write is conditional on the resourceVersion last seen (or a
//!   create): of two nodes taking one slot, one wins and the other sees a
//!   conflict and waits for the watch. No write is retried blindly.
//! * A slot is free when it has no holder, or when its Lease has not
//!   changed for its `leaseDurationSeconds`, judged on this node's clock
//!   from when this node saw it change (never by comparing clocks across
//!   nodes, as client-go's leader election does).
//! * Nothing is written before the first complete list: a restarted node
//!   first learns which slots it holds (adopted) and what the others say.
//! * Nothing is written while nothing rolls: the status is written when it
//!   changes, slots are renewed only while held.
//! * Asks are handled in the order sent: a status report sent before a
//!   release is written before the release.
//! * Objects are read leniently (as JSON): none can stop the watch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use std::ops::ControlFlow;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::backoff::Backoff;
use super::gate::{Answer, Ask};
use super::metrics::Metrics;
use super::raw::Raw;
use super::reconcile::Input;
use super::watch::{self, Event, Spec};
use crate::fleet::{
    NodeStatus, ROLE_LABEL, ROLE_SLOT, ROLE_STATUS, STATUS_ANNOTATION, STATUS_VERSION,
    TARGET_ANNOTATION, TEMPLATE_ANNOTATION, slot_name, status_name,
};

/// The default `leaseDurationSeconds` of a slot.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(30);
/// The longest one API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often pending asks and held slots are looked at without an event.
const TICK: Duration = Duration::from_millis(500);

/// What the coordinator needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the Leases are.
    pub namespace: String,
    /// This node: the holder identity.
    pub node: String,
    pub lease_duration: Duration,
    pub watch_timeout: Option<u32>,
}

/// A Lease of ours, as last seen.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    role: String,
    holder: Option<String>,
    duration: Duration,
    template: Option<String>,
    target: Option<String>,
    /// A status Lease's record, parsed once when read (empty for a slot, a
    /// record that is missing or does not parse: rewritten then).
    record: NodeStatus,
    transitions: i32,
    /// `spec.acquireTime`, as it was read: kept by renewals.
    acquired: Option<MicroTime>,
    resource_version: String,
    /// When this node saw this version first.
    observed: Instant,
}

fn read_lease(value: &Value, now: Instant, default_duration: Duration) -> Option<(String, Seen)> {
    let metadata = value.get("metadata")?;
    let name = metadata.get("name")?.as_str()?.to_string();
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let annotations = metadata.get("annotations");
    let spec = value.get("spec");
    let seconds = spec
        .and_then(|s| s.get("leaseDurationSeconds"))
        .and_then(Value::as_u64)
        .filter(|s| *s > 0);
    Some((
        name,
        Seen {
            role: text(metadata.pointer(&format!("/labels/{}", ROLE_LABEL.replace('/', "~1"))))
                .unwrap_or_default(),
            holder: text(spec.and_then(|s| s.get("holderIdentity"))).filter(|h| !h.is_empty()),
            duration: seconds.map_or(default_duration, Duration::from_secs),
            template: text(annotations.and_then(|a| a.get(TEMPLATE_ANNOTATION))),
            target: text(annotations.and_then(|a| a.get(TARGET_ANNOTATION))),
            record: NodeStatus::parse(
                annotations
                    .and_then(|a| a.get(STATUS_ANNOTATION))
                    .and_then(Value::as_str),
            )
            .0,
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

/// One write the state calls for.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    /// This node's record.
    Status { resource_version: Option<String> },
    /// Free a slot this node held.
    Release { name: String },
    /// Renew a slot held for template `id`.
    Renew { id: String, name: String },
    /// Take slot `name` for template `id`: a create when there is no
    /// resourceVersion.
    Take {
        id: String,
        name: String,
        target: String,
        resource_version: Option<String>,
    },
}

/// What the coordinator knows; every decision is made here, without I/O.
struct State {
    me: String,
    duration: Duration,
    leases: BTreeMap<String, Seen>,
    /// A relist under way: what it has seen so far.
    relisting: Option<BTreeMap<String, Seen>>,
    synced: bool,
    /// Asked, not granted: template → (target, slots).
    pending: BTreeMap<String, (String, u32)>,
    /// Template → the slot this node holds for it.
    held: BTreeMap<String, String>,
    last_renew: BTreeMap<String, Instant>,
    /// Slots to free.
    releasing: BTreeSet<String>,
    /// This node's record as it should be.
    mine: NodeStatus,
    /// Writes that lost a race, by object name, at the resourceVersion
    /// they were tried against: not tried again until it changes.
    conflicted: BTreeMap<String, String>,
    /// The failed targets last sent to the reconciler.
    failed_sent: Option<BTreeMap<String, BTreeMap<String, String>>>,
    /// The Lease watch is following (listed or resumed, not failed since):
    /// only then can a slot be judged unrenewed, and taken.
    watching: bool,
}

impl State {
    fn new(me: String, duration: Duration) -> State {
        State {
            me,
            duration,
            leases: BTreeMap::new(),
            relisting: None,
            synced: false,
            pending: BTreeMap::new(),
            held: BTreeMap::new(),
            last_renew: BTreeMap::new(),
            releasing: BTreeSet::new(),
            mine: NodeStatus {
                version: STATUS_VERSION,
                ..NodeStatus::default()
            },
            conflicted: BTreeMap::new(),
            failed_sent: None,
            watching: false,
        }
    }

    fn status_name(&self) -> String {
        status_name(&self.me)
    }

    /// A Lease seen (listed or changed); a new version is observed now.
    fn seen(&mut self, name: String, mut lease: Seen) {
        // A relist follows a gap in what this node saw: every Lease in it
        // is observed from now (see [`State::reobserve`]).
        let known = match &self.relisting {
            Some(listing) => listing.get(&name),
            None => self.leases.get(&name),
        };
        if let Some(old) = known
            && old.resource_version == lease.resource_version
        {
            lease.observed = old.observed;
        }
        let map = self.relisting.as_mut().unwrap_or(&mut self.leases);
        map.insert(name, lease);
    }

    /// The watch was cut and resumed: nothing was seen meanwhile, so no
    /// Lease counts as unrenewed for that time. A holder that could not
    /// renew during an API outage is not taken over the moment it ends:
    /// others wait a whole duration of watching first.
    fn reobserve(&mut self, now: Instant) {
        self.watching = true;
        for lease in self.leases.values_mut() {
            lease.observed = now;
        }
    }

    /// The Lease watch failed: until it follows again, what this node
    /// knows of the slots may be stale, and none is taken.
    fn watch_failed(&mut self) {
        self.watching = false;
    }

    fn list_done(&mut self) -> Vec<Answer> {
        if let Some(listed) = self.relisting.take() {
            self.leases = listed;
        }
        self.watching = true;
        let mut answers = Vec::new();
        if !self.synced {
            self.synced = true;
            // Slots held by this node before a restart are its own.
            for (name, lease) in &self.leases {
                if lease.role == ROLE_SLOT
                    && lease.holder.as_deref() == Some(self.me.as_str())
                    && let Some(id) = &lease.template
                {
                    self.held.insert(id.clone(), name.clone());
                    answers.push(Answer::Granted {
                        id: id.clone(),
                        target: lease.target.clone().unwrap_or_default(),
                    });
                }
            }
            // This node's record as the API has it is where it goes on.
            if let Some(lease) = self.leases.get(&self.status_name()) {
                for (id, status) in &lease.record.templates {
                    self.mine
                        .templates
                        .entry(id.clone())
                        .or_insert_with(|| status.clone());
                }
            }
        }
        answers
    }

    fn ask(&mut self, ask: Ask) {
        match ask {
            Ask::Acquire { id, target, slots } => {
                self.pending.insert(id, (target, slots));
            }
            Ask::Cancel { id } => {
                self.pending.remove(&id);
            }
            Ask::Release { id } => {
                self.pending.remove(&id);
                self.last_renew.remove(&id);
                if let Some(name) = self.held.remove(&id) {
                    self.releasing.insert(name);
                }
            }
            Ask::Report { id, status: None } => {
                self.mine.templates.remove(&id);
            }
            Ask::Report {
                id,
                status: Some(status),
            } => {
                let mut status = *status;
                // The time a phase began is kept from the record in the API
                // (a restarted node reports its phases anew).
                if let Some(old) = self.mine.templates.get(&id)
                    && old.phase == status.phase
                {
                    status.since = old.since.clone();
                }
                self.mine.templates.insert(id, status);
            }
        }
    }

    /// Slots this node held that another node took, or that are gone.
    fn lost(&mut self) -> Vec<Answer> {
        let lost: Vec<String> = self
            .held
            .iter()
            .filter(|(_, name)| {
                self.leases
                    .get(*name)
                    .is_none_or(|l| l.holder.as_deref() != Some(self.me.as_str()))
            })
            .map(|(id, _)| id.clone())
            .collect();
        lost.into_iter()
            .map(|id| {
                self.held.remove(&id);
                self.last_renew.remove(&id);
                Answer::Lost { id }
            })
            .collect()
    }

    /// Every target that failed on some node, when it changed since last
    /// sent.
    fn failed(&mut self) -> Option<Answer> {
        let mut failed: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let records = self.leases.iter().filter(|(_, l)| l.role == ROLE_STATUS);
        for (name, lease) in records {
            let node = lease.holder.clone().unwrap_or_else(|| name.clone());
            let record = if *name == self.status_name() {
                &self.mine
            } else {
                &lease.record
            };
            for (id, status) in &record.templates {
                if let Some(f) = status.failed.as_ref().filter(|f| !f.target.is_empty()) {
                    failed.entry(id.clone()).or_default().insert(
                        f.target.clone(),
                        format!("node {node}: {}: {}", f.reason, f.message),
                    );
                }
            }
        }
        if self.failed_sent.as_ref() == Some(&failed) {
            return None;
        }
        self.failed_sent = Some(failed.clone());
        Some(Answer::Failed(failed))
    }

    fn conflicted(&self, name: &str, resource_version: Option<&str>) -> bool {
        self.conflicted.get(name).map(String::as_str) == Some(resource_version.unwrap_or(""))
    }

    /// The next write to make, if any.
    fn next(&self, now: Instant) -> Option<Action> {
        if !self.synced {
            return None;
        }
        // The record first: a failure is known before the slot is free.
        let name = self.status_name();
        let in_api = self.leases.get(&name);
        let rv = in_api.map(|l| l.resource_version.clone());
        if (in_api.is_none_or(|l| l.record != self.mine)) && !self.conflicted(&name, rv.as_deref())
        {
            // No record and nothing to say: nothing to write.
            if !(in_api.is_none() && self.mine.templates.is_empty()) {
                return Some(Action::Status {
                    resource_version: rv,
                });
            }
        }
        for name in &self.releasing {
            match self.leases.get(name) {
                Some(l)
                    if l.holder.as_deref() == Some(self.me.as_str())
                        && !self.conflicted(name, Some(&l.resource_version)) =>
                {
                    return Some(Action::Release { name: name.clone() });
                }
                _ => {}
            }
        }
        let renew_every = self.duration / 3;
        for (id, name) in &self.held {
            let due = self
                .last_renew
                .get(id)
                .is_none_or(|t| now.duration_since(*t) >= renew_every);
            if due
                && let Some(l) = self.leases.get(name)
                && !self.conflicted(name, Some(&l.resource_version))
            {
                return Some(Action::Renew {
                    id: id.clone(),
                    name: name.clone(),
                });
            }
        }
        // A slot is judged free only from a watch that follows: after an
        // outage, the holder could not renew, and others could not see.
        let pending = self.pending.iter().filter(|_| self.watching);
        for (id, (target, slots)) in pending {
            // A target that failed on a node is not started (the reconciler
            // withdraws the ask when it hears of it).
            let failed = self
                .failed_sent
                .as_ref()
                .and_then(|f| f.get(id))
                .is_some_and(|t| t.contains_key(target));
            if self.held.contains_key(id) || failed {
                continue;
            }
            for index in 0..*slots {
                let name = slot_name(id, index);
                let take = |resource_version: Option<String>| Action::Take {
                    id: id.clone(),
                    name: name.clone(),
                    target: target.clone(),
                    resource_version,
                };
                match self.leases.get(&name) {
                    None if !self.conflicted(&name, None) => return Some(take(None)),
                    None => {}
                    Some(l) => {
                        let free = match l.holder.as_deref() {
                            None => true,
                            Some(h) if h == self.me => true,
                            Some(_) => now.duration_since(l.observed) >= l.duration,
                        };
                        if free && !self.conflicted(&name, Some(&l.resource_version)) {
                            return Some(take(Some(l.resource_version.clone())));
                        }
                    }
                }
            }
        }
        None
    }

    /// Whether anything waits on time (expiry, renewal).
    fn busy(&self) -> bool {
        !self.pending.is_empty() || !self.held.is_empty() || !self.releasing.is_empty()
    }
}

fn micro_now() -> MicroTime {
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

/// Which slot, of which template, for which target.
struct Slot<'a> {
    name: &'a str,
    id: &'a str,
    target: &'a str,
}

/// The slot Lease held by `holder` (None: free).
fn slot_lease(
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
            labels: Some(labels(ROLE_SLOT)),
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

fn status_lease(state: &State, namespace: &str, resource_version: Option<String>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(state.status_name()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels(ROLE_STATUS)),
            annotations: Some(BTreeMap::from([(
                STATUS_ANNOTATION.to_string(),
                state.mine.to_json(),
            )])),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(state.me.clone()),
            renew_time: Some(micro_now()),
            ..LeaseSpec::default()
        }),
    }
}

/// How a write ended.
enum Written {
    Ok(Box<Lease>),
    /// Another writer was first (409), or the object is gone (404 on a
    /// replace): the watch says what is there now.
    Conflict,
    Failed(String),
}

async fn write(api: &Api<Lease>, lease: Lease, create: bool) -> Written {
    let name = lease.metadata.name.clone().unwrap_or_default();
    let call = async {
        if create {
            api.create(&PostParams::default(), &lease).await
        } else {
            api.replace(&name, &PostParams::default(), &lease).await
        }
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(lease)) => Written::Ok(Box::new(lease)),
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Written::Conflict,
        Ok(Err(kube::Error::Api(status))) if status.code == 404 && !create => Written::Conflict,
        Ok(Err(kube::Error::Api(status))) if status.is_forbidden() => Written::Failed(format!(
            "permission denied: {}; grant leases (coordination.k8s.io) get, list, watch, create and update in this namespace (see deploy/rbac.yaml)",
            status.message
        )),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Written::Failed(format!(
            "{}; create the namespace, or name another with daemon.rollouts.namespace (--rollout-namespace)",
            status.message
        )),
        Ok(Err(e)) => Written::Failed(e.to_string()),
        Err(_) => Written::Failed(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// What the Lease watch tells the coordinator.
enum LeaseEvent {
    Listing,
    Resumed,
    Failed,
    Object(Value),
    ListDone,
    Deleted(String),
}

/// Coordinates this node's rollouts with the other nodes until the
/// reconciler is gone.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    mut asks: UnboundedReceiver<Ask>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let raw: Api<Raw<Lease>> = Api::namespaced(client.clone(), &settings.namespace);
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    // The watch runs on a task of its own (the shared loop: resume, relist
    // on 410, backoff) and hands its events over.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let spec = Spec::new("leases", "leases", settings.watch_timeout).labels(ROLE_LABEL);
    let watching = tokio::spawn(watch::run(
        raw,
        spec,
        metrics.clone(),
        Backoff::new(),
        move |event| {
            let message = match event {
                Event::Listing => LeaseEvent::Listing,
                Event::Listed(lease) | Event::Applied(lease) => {
                    LeaseEvent::Object(lease.value().clone())
                }
                Event::ListDone => LeaseEvent::ListDone,
                Event::Deleted(lease) => LeaseEvent::Deleted(lease.name().to_string()),
                Event::Resumed => LeaseEvent::Resumed,
                Event::Failed(_) => LeaseEvent::Failed,
            };
            match seen_tx.send(message) {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        },
    ));
    let mut state = State::new(settings.node.clone(), settings.lease_duration);
    let mut write_backoff = Backoff::new();
    let mut write_retry: Option<tokio::time::Instant> = None;
    let mut last_error: Option<String> = None;
    tracing::info!(namespace = %settings.namespace, lease_duration = ?settings.lease_duration,
        "coordinating rollouts with the other nodes through Leases");
    loop {
        let tick = if state.busy() {
            TICK
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(ask) => {
                    state.ask(ask);
                    while let Ok(ask) = asks.try_recv() {
                        state.ask(ask);
                    }
                }
                None => {
                    watching.abort();
                    return;
                }
            },
            message = seen.recv() => {
                let now = Instant::now();
                match message {
                    Some(LeaseEvent::Listing) => state.relisting = Some(BTreeMap::new()),
                    Some(LeaseEvent::Resumed) => state.reobserve(now),
                    Some(LeaseEvent::Failed) => state.watch_failed(),
                    Some(LeaseEvent::Object(value)) => {
                        if let Some((name, lease)) = read_lease(&value, now, settings.lease_duration) {
                            state.seen(name, lease);
                        }
                    }
                    Some(LeaseEvent::Deleted(name)) => {
                        state.leases.remove(&name);
                    }
                    Some(LeaseEvent::ListDone) => {
                        for answer in state.list_done() {
                            if inputs.send(Input::Fleet(answer)).is_err() {
                                return;
                            }
                        }
                    }
                    None => return,
                }
            },
            _ = tokio::time::sleep(tick) => {},
        }
        for answer in state.lost() {
            tracing::warn!(
                "a rollout slot this node held was taken by another node: it was not renewed in time"
            );
            if inputs.send(Input::Fleet(answer)).is_err() {
                return;
            }
        }
        if let Some(answer) = state.failed()
            && inputs.send(Input::Fleet(answer)).is_err()
        {
            return;
        }
        if write_retry.is_some_and(|t| tokio::time::Instant::now() < t) {
            continue;
        }
        write_retry = None;
        // The writes due now, one at a time, each answered before the next.
        while let Some(action) = state.next(Instant::now()) {
            let (object, name, outcome) = perform(&api, &settings, &mut state, &action).await;
            match outcome {
                Written::Ok(lease) => {
                    metrics.fleet_write(object, "ok");
                    last_error = None;
                    write_backoff.reset();
                    if let Ok(value) = serde_json::to_value(&*lease)
                        && let Some((name, seen)) =
                            read_lease(&value, Instant::now(), settings.lease_duration)
                    {
                        state.seen(name, seen);
                    }
                    if let Some(answer) = after(&mut state, &action)
                        && inputs.send(Input::Fleet(answer)).is_err()
                    {
                        return;
                    }
                }
                Written::Conflict => {
                    metrics.fleet_write(object, "conflict");
                    let rv = state
                        .leases
                        .get(&name)
                        .map(|l| l.resource_version.clone())
                        .unwrap_or_default();
                    state.conflicted.insert(name, rv);
                }
                Written::Failed(message) => {
                    metrics.fleet_write(object, "error");
                    if last_error.as_deref() != Some(message.as_str()) {
                        tracing::error!(lease = %name, namespace = %settings.namespace,
                            "cannot write a rollout Lease: {message}; updates that need a slot wait (manifests in place are kept)");
                        last_error = Some(message);
                    }
                    write_retry = Some(tokio::time::Instant::now() + write_backoff.delay());
                    break;
                }
            }
        }
        metrics.set_slots_held(state.held.len());
    }
}

/// Makes the write `action` calls for.
async fn perform(
    api: &Api<Lease>,
    settings: &Settings,
    state: &mut State,
    action: &Action,
) -> (&'static str, String, Written) {
    let ns = settings.namespace.as_str();
    match action {
        Action::Status { resource_version } => {
            let create = resource_version.is_none();
            let lease = status_lease(state, ns, resource_version.clone());
            (
                "status",
                state.status_name(),
                write(api, lease, create).await,
            )
        }
        Action::Release { name } => {
            let l = state.leases[name].clone();
            let slot = Slot {
                name,
                id: l.template.as_deref().unwrap_or_default(),
                target: l.target.as_deref().unwrap_or_default(),
            };
            let lease = slot_lease(
                slot,
                ns,
                None,
                l.duration,
                l.transitions,
                Some(l.resource_version),
            );
            ("slot", name.clone(), write(api, lease, false).await)
        }
        Action::Renew { id, name } => {
            let l = state.leases[name].clone();
            let slot = Slot {
                name,
                id,
                target: l.target.as_deref().unwrap_or_default(),
            };
            let mut lease = slot_lease(
                slot,
                ns,
                Some(&state.me),
                state.duration,
                l.transitions,
                Some(l.resource_version),
            );
            if let Some(spec) = lease.spec.as_mut() {
                // Renewing keeps the time the slot was taken.
                spec.acquire_time = l.acquired.clone();
            }
            ("slot", name.clone(), write(api, lease, false).await)
        }
        Action::Take {
            id,
            name,
            target,
            resource_version,
        } => {
            let transitions = state.leases.get(name).map_or(0, |l| {
                l.transitions + i32::from(l.holder.as_deref() != Some(state.me.as_str()))
            });
            let lease = slot_lease(
                Slot { name, id, target },
                ns,
                Some(&state.me),
                state.duration,
                transitions,
                resource_version.clone(),
            );
            let create = resource_version.is_none();
            ("slot", name.clone(), write(api, lease, create).await)
        }
    }
}

/// What a successful write changes in the state, and tells the reconciler.
fn after(state: &mut State, action: &Action) -> Option<Answer> {
    match action {
        Action::Status { .. } => None,
        Action::Release { name } => {
            state.releasing.remove(name);
            None
        }
        Action::Renew { id, .. } => {
            state.last_renew.insert(id.clone(), Instant::now());
            None
        }
        Action::Take {
            id, name, target, ..
        } => {
            state.pending.remove(id);
            state.held.insert(id.clone(), name.clone());
            state.last_renew.insert(id.clone(), Instant::now());
            tracing::info!(template = %id, slot = %name, target = %target, "took a rollout slot");
            Some(Answer::Granted {
                id: id.clone(),
                target: target.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Failed, TemplateStatus};

    const D: Duration = Duration::from_secs(30);

    fn lease(role: &str, holder: Option<&str>, rv: &str, observed: Instant) -> Seen {
        Seen {
            role: role.into(),
            holder: holder.map(str::to_string),
            duration: D,
            template: Some("ns/web".into()),
            target: Some("t1".into()),
            record: NodeStatus::default(),
            transitions: 0,
            acquired: None,
            resource_version: rv.into(),
            observed,
        }
    }

    fn synced(me: &str) -> State {
        let mut s = State::new(me.into(), D);
        s.list_done();
        s
    }

    fn acquire(s: &mut State, slots: u32) {
        s.ask(Ask::Acquire {
            id: "ns/web".into(),
            target: "t1".into(),
            slots,
        });
    }

    #[test]
    fn nothing_is_written_before_the_first_list_or_while_idle() {
        let mut s = State::new("n1".into(), D);
        acquire(&mut s, 1);
        assert_eq!(s.next(Instant::now()), None);
        let mut s = synced("n1");
        assert_eq!(s.next(Instant::now()), None, "idle: no writes");
        assert!(!s.busy());
        acquire(&mut s, 1);
        assert!(matches!(
            s.next(Instant::now()),
            Some(Action::Take {
                resource_version: None,
                ..
            })
        ));
    }

    #[test]
    fn a_held_slot_is_taken_only_once_it_expired_on_this_nodes_clock() {
        let now = Instant::now();
        let mut s = synced("n1");
        let name = slot_name("ns/web", 0);
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "5", now));
        acquire(&mut s, 1);
        assert_eq!(s.next(now + D / 2), None);
        // The holder renewed: a new version, observed anew.
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "6", now + D / 2));
        assert_eq!(s.next(now + D), None);
        // The same version seen again keeps its first observation.
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "6", now + D));
        assert!(matches!(
            s.next(now + D / 2 + D),
            Some(Action::Take { resource_version: Some(rv), .. }) if rv == "6"
        ));
        // With two slots, the second is taken at once.
        acquire(&mut s, 2);
        assert!(matches!(
            s.next(now + D / 2),
            Some(Action::Take { name: n, resource_version: None, .. }) if n == slot_name("ns/web", 1)
        ));
    }

    #[test]
    fn after_a_gap_in_the_watch_a_holder_gets_a_whole_duration_again() {
        let now = Instant::now();
        let mut s = synced("n1");
        let name = slot_name("ns/web", 0);
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "5", now));
        acquire(&mut s, 1);
        // The API server goes away for longer than the lease: nothing is
        // taken while the watch does not follow, nor at once when it does.
        s.watch_failed();
        assert_eq!(s.next(now + 2 * D), None, "not taken blind");
        s.reobserve(now + 2 * D);
        assert_eq!(s.next(now + 2 * D), None, "not taken at once");
        assert!(matches!(s.next(now + 3 * D), Some(Action::Take { .. })));
        // A relist too observes every Lease anew.
        s.relisting = Some(BTreeMap::new());
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "5", now + 3 * D));
        s.list_done();
        assert_eq!(s.next(now + 3 * D), None);
    }

    #[test]
    fn a_lost_race_waits_for_the_watch() {
        let now = Instant::now();
        let mut s = synced("n1");
        acquire(&mut s, 1);
        let name = slot_name("ns/web", 0);
        s.conflicted.insert(name.clone(), String::new());
        assert_eq!(s.next(now), None);
        s.seen(name.clone(), lease(ROLE_SLOT, None, "7", now));
        assert!(matches!(s.next(now), Some(Action::Take { .. })));
    }

    #[test]
    fn a_restarted_node_adopts_its_slots_and_keeps_its_record() {
        let now = Instant::now();
        let mut s = State::new("n1".into(), D);
        s.relisting = Some(BTreeMap::new());
        s.seen(
            slot_name("ns/web", 0),
            lease(ROLE_SLOT, Some("n1"), "3", now),
        );
        let mut record = NodeStatus {
            version: 1,
            ..NodeStatus::default()
        };
        record.templates.insert(
            "ns/web".into(),
            TemplateStatus {
                phase: "ready".into(),
                since: "2026-01-01T00:00:00Z".into(),
                ..TemplateStatus::default()
            },
        );
        let mut mine = lease(ROLE_STATUS, Some("n1"), "4", now);
        mine.record = record;
        s.seen(status_name("n1"), mine);
        let answers = s.list_done();
        assert_eq!(
            answers,
            vec![Answer::Granted {
                id: "ns/web".into(),
                target: "t1".into()
            }]
        );
        // The same phase reported again keeps its time: nothing to write.
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: Some(Box::new(TemplateStatus {
                phase: "ready".into(),
                since: "2026-12-03T00:00:00Z".into(),
                ..TemplateStatus::default()
            })),
        });
        assert!(
            !matches!(s.next(now), Some(Action::Status { .. })),
            "{:?}",
            s.next(now)
        );
    }

    #[test]
    fn the_record_is_written_before_the_release_and_failures_are_shared() {
        let now = Instant::now();
        let mut s = synced("n1");
        let name = slot_name("ns/web", 0);
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n1"), "3", now));
        s.held.insert("ns/web".into(), name.clone());
        s.last_renew.insert("ns/web".into(), now);
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: Some(Box::new(TemplateStatus {
                phase: "failed".into(),
                failed: Some(Failed {
                    target: "t1".into(),
                    reason: "CrashLoopBackOff".into(),
                    ..Failed::default()
                }),
                ..TemplateStatus::default()
            })),
        });
        s.ask(Ask::Release {
            id: "ns/web".into(),
        });
        assert_eq!(
            s.next(now),
            Some(Action::Status {
                resource_version: None
            })
        );
        // Once written (seen back), the release.
        let mut mine = lease(ROLE_STATUS, Some("n1"), "8", now);
        mine.record = s.mine.clone();
        s.seen(status_name("n1"), mine);
        assert_eq!(s.next(now), Some(Action::Release { name }));
        // Another node's failure reaches the reconciler, once.
        let mut other = lease(ROLE_STATUS, Some("n2"), "9", now);
        let mut record = NodeStatus::default();
        record.templates.insert(
            "ns/db".into(),
            TemplateStatus {
                failed: Some(Failed {
                    target: "t9".into(),
                    reason: "ErrImageNeverPull".into(),
                    ..Failed::default()
                }),
                ..TemplateStatus::default()
            },
        );
        other.record = record;
        s.seen(status_name("n2"), other);
        match s.failed() {
            Some(Answer::Failed(f)) => {
                assert!(f["ns/web"]["t1"].contains("node n1: CrashLoopBackOff"));
                assert!(f["ns/db"]["t9"].contains("node n2: ErrImageNeverPull"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.failed(), None);
    }
}
