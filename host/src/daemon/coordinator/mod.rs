//! The coordinator of rollouts across nodes: this node's side of the slots
//! and node statuses of [`crate::fleet`], kept through the API server.
//!
//! An async task. It watches the halt markers of the rollout namespace and
//! the slots of the lanes it waits in (label [`LANE_LABEL`]; at start, for
//! its first list, every slot: the ones it held before a restart are its
//! own), never the other nodes' status records, and nothing while nothing
//! rolls here and no halt is known; it reads its own record by name. The
//! records are in a namespace of their own (`status_namespace`): the API
//! server hands every write of a namespace to every watch of it, so
//! records written beside the slots would reach every busy node's watch,
//! 2·N² hand-overs a rollout. It takes a slot when the reconciler asks for one
//! ([`Ask::Acquire`]), one of its lanes is free and its turn has come,
//! renews the slots it holds, frees them when told, writes this node's
//! status record when it changes and its halt marker when a target failed
//! here. It tells the reconciler what it got ([`Answer`]).
//!
//! Invariants:
//! * Every write is conditional on the resourceVersion last seen (or a
//!   create): of two nodes taking one slot, one wins and the other sees a
//!   conflict and waits for the watch (a refused create reads the slot by
//!   name: its watch may not select it). No write is retried blindly.
//! * What a node receives does not grow with the fleet: the halts, and
//!   the writes to the few slots it waits for (docs/daemon.md, "Fleets").
//!   The watch is restarted when the lanes it needs are not all selected,
//!   and when nothing rolls (then it selects the halts only, or stops when
//!   no halt is known: the API server hands every watch of the namespace
//!   every Lease write there, selected or not).
//! * A slot is free when it has no holder, or when its Lease has not
//!   changed for its `leaseDurationSeconds` (never longer than this node's
//!   own), judged on this node's clock from when this node saw it change
//!   (never by comparing clocks across nodes, as client-go's leader
//!   election does).
//! * Another node's status record counts only as what that node may have
//!   written (name ↔ holder), and only its failures are kept, bounded.
//! * A conflict on this node's own record (changed, deleted or re-created
//!   by someone else) is read back by name and replaced after a backoff:
//!   the node is never silenced.
//! * Nothing is written before the first complete list and this node's own
//!   record is read: a restarted node first learns which slots it holds
//!   (adopted) and what failed where.
//! * Nothing is written while nothing rolls: the status is written when it
//!   changes (within `record::HOLD`, a failure at once), slots are renewed
//!   only while held.
//! * Asks are handled in the order sent: a status report sent before a
//!   release is written before the release.
//! * Objects are read leniently (as JSON): none can stop the watch.
//!
//! One concern per file: this one (the task: the watch, the writes),
//! `ledger` (what it knows and decides, without I/O), `lease` (the Lease
//! objects as read and written), `nodes` (how many nodes a share is of),
//! `record` (when this node's record is written).

mod lease;
mod ledger;
mod nodes;
mod record;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use lease::{Seen, Slot, halt_lease, read_lease, slot_lease, status_lease};
use ledger::{Action, Ledger, after};

use super::backoff::Backoff;
use super::inbox::{Answer, Ask, Input};
use super::lease_namespace::Setting;
use super::metrics::Metrics;
use super::raw::Raw;
use super::watch::{self, Event, Spec};
use crate::fleet::{HALT_LANE, LANE_LABEL, ROLE_LABEL, ROLE_STATUS, status_name};

/// The longest one API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Leases per list page. Any writer of Leases in the rollout namespace can
/// make each one as large as the API server allows (256 KiB of
/// annotations), and a page is read whole before its records are cut down
/// ([`reduce`]): at 500 a page (the default of the other watches) a page
/// can be 125 MiB of text. At 32 it is at most 8 MiB; an honest record is
/// a few hundred bytes, so a fleet of 5,000 nodes lists in 157 small
/// pages. Measured (tests/rollouts.rs, 1,000 records of 236 KiB listed at
/// start): peak RSS 545 MiB with pages of 500 and records queued whole,
/// 178 MiB with pages of 1 and records queued whole, 89 MiB with pages of
/// 32 and records cut before they are queued.
const LEASE_PAGE: u32 = 32;
/// How often pending asks and held slots are looked at without an event.
const TICK: Duration = Duration::from_millis(500);

/// What the coordinator needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the Leases are.
    pub namespace: String,
    /// Where this node's status record is: apart from the slots and halts,
    /// so that no node's watch of them is handed the records (see the
    /// module header).
    pub status_namespace: String,
    /// This node: the holder identity.
    pub node: String,
    pub lease_duration: Duration,
    pub watch_timeout: Option<u32>,
}

/// How a write ended.
enum Written {
    Ok(Box<Lease>),
    /// Another writer was first (409), or the object is gone (404 on a
    /// replace): the watch says what is there now.
    Conflict,
    /// No answer within [`CALL_TIMEOUT`]: the write may have gone through
    /// all the same (a loaded API server answers late), so the object is
    /// read back before it is tried again.
    TimedOut,
    /// Timed out, and read back: the object says what was written.
    Landed,
    Failed(String),
}

/// One of the two namespaces the coordinator writes in: the rollout one
/// (slots, halt markers) or the status one (this node's record).
struct Place<'a> {
    api: &'a Api<Lease>,
    namespace: &'a str,
    setting: Setting,
}

/// Both places, and which one a Lease of a given name is in.
struct Places<'a> {
    leases: Place<'a>,
    records: Place<'a>,
    /// This node's record's name: the one Lease in `records`.
    own: String,
}

impl Places<'_> {
    fn of(&self, name: &str) -> &Place<'_> {
        if name == self.own {
            &self.records
        } else {
            &self.leases
        }
    }
}

/// Writes `lease` in `place`; a failure's message names what to grant or
/// create there, and the setting that names it.
async fn write(place: &Place<'_>, lease: Lease, create: bool) -> Written {
    let (api, grant, setting) = (place.api, place.setting.grant(), place.setting.name());
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
            "permission denied: {}; grant leases (coordination.k8s.io) {grant} in this namespace (see deploy/rbac.yaml)",
            status.message
        )),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Written::Failed(format!(
            "{}; create the namespace (deploy/namespace.yaml), or name another with {setting}",
            status.message
        )),
        Ok(Err(e)) => Written::Failed(e.to_string()),
        Err(_) => Written::TimedOut,
    }
}

/// What the Lease watch tells the coordinator, tagged with the watch it
/// came from (a restarted watch's old events are dropped).
struct Tagged(u64, LeaseEvent);

/// What the Lease watch tells the coordinator.
enum LeaseEvent {
    Listing,
    Resumed,
    Failed,
    /// A Lease as read, cut down already (see [`reduce`]).
    Object(String, Box<Seen>),
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
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let records: Api<Lease> = Api::namespaced(client.clone(), &settings.status_namespace);
    let places = Places {
        leases: Place {
            api: &api,
            namespace: &settings.namespace,
            setting: Setting::Rollouts,
        },
        records: Place {
            api: &records,
            namespace: &settings.status_namespace,
            setting: Setting::Status,
        },
        own: status_name(&settings.node),
    };
    // The watch runs on a task of its own (the shared loop: resume, relist
    // on 410, backoff) and hands its events over; it is restarted with
    // another selector when the lanes this node needs change.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let watcher = Watcher {
        raw,
        metrics: metrics.clone(),
        mine: status_name(&settings.node),
        duration: settings.lease_duration,
        timeout: settings.watch_timeout,
        tx: seen_tx,
    };
    // The first list: every slot (to adopt the ones held) and the halts.
    let mut generation = 0u64;
    let mut selected: Option<BTreeSet<String>> = None;
    // None: no watch (nothing rolls here and no halt is known).
    let mut watching = Some(watcher.start(generation, None));
    let mut state = Ledger::new(settings.node.clone(), settings.lease_duration);
    let mut write_backoff = Backoff::new();
    let mut write_retry: Option<Instant> = None;
    let mut last_error: Option<String> = None;
    tracing::info!(namespace = %settings.namespace, status_namespace = %settings.status_namespace,
        lease_duration = ?settings.lease_duration,
        "coordinating rollouts with the other nodes through Leases");
    read_own_record(&records, &mut state, &settings).await;
    loop {
        let now = Instant::now();
        let tick = state.sleep_for(now, write_retry, TICK);
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(ask) => {
                    let mut next = Some(ask);
                    while let Some(ask) = next.take().or_else(|| asks.try_recv().ok()) {
                        match ask {
                            // Counted on a task of its own: a slow list
                            // must not hold back renewals.
                            Ask::Count { selector } => {
                                tokio::spawn(count_nodes(client.clone(), selector, inputs.clone()));
                            }
                            ask => state.ask(ask),
                        }
                    }
                }
                None => {
                    if let Some(task) = watching {
                        task.abort();
                    }
                    return;
                }
            },
            message = seen.recv() => {
                let now = Instant::now();
                let message = match message {
                    Some(Tagged(g, _)) if g != generation => continue,
                    Some(Tagged(_, m)) => Some(m),
                    None => None,
                };
                match message {
                    Some(LeaseEvent::Listing) => state.relisting = Some(BTreeMap::new()),
                    Some(LeaseEvent::Resumed) => state.reobserve(now),
                    Some(LeaseEvent::Failed) => state.watch_failed(),
                    Some(LeaseEvent::Object(name, mut lease)) => {
                        // Observed when the ledger learns of it (never
                        // earlier: a slot is judged unrenewed from here).
                        lease.observed = now;
                        state.seen(name, *lease);
                    }
                    Some(LeaseEvent::Deleted(name)) => {
                        state.leases.remove(&name);
                    }
                    Some(LeaseEvent::ListDone) => {
                        for answer in state.list_done(now) {
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
        // The lanes this node needs, selected: restarted when one is
        // missing, or when nothing rolls any more (the halts only then);
        // stopped when nothing rolls and no halt is known.
        if state.synced {
            if !state.needs_watch() {
                if let Some(task) = watching.take() {
                    task.abort();
                    generation += 1;
                    state.watch_failed();
                    selected = Some(BTreeSet::new());
                }
            } else {
                let wanted = state.lanes();
                let restart = watching.is_none()
                    || match &selected {
                        None => true,
                        Some(current) => {
                            !wanted.is_subset(current) || (wanted.is_empty() && !current.is_empty())
                        }
                    };
                if restart {
                    if let Some(task) = watching.take() {
                        task.abort();
                    }
                    generation += 1;
                    // Until the new watch lists, no slot is judged free.
                    state.watch_failed();
                    watching = Some(watcher.start(generation, Some(&wanted)));
                    selected = Some(wanted);
                }
            }
        }
        state.note_starved(Instant::now());
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
        if write_retry.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        write_retry = None;
        // The writes due now, one at a time, each answered before the next.
        while let Some(action) = state.next(Instant::now()) {
            // How long the API server takes to answer: a waiter's spread
            // widens with it (`ledger::REACH`).
            let sent = Instant::now();
            let (object, name, outcome) = perform(&places, &mut state, &action).await;
            if matches!(outcome, Written::Ok(_) | Written::Conflict) {
                state.answered(sent.elapsed());
            }
            let kind = action.kind();
            let outcome = match outcome {
                Written::TimedOut => {
                    metrics.fleet_write_kind(kind, "timeout");
                    // Read back before it is tried again: a write that went
                    // through unanswered, tried again against the version
                    // it replaced, is refused (409) or, for a create, read
                    // again; taken as done, it is neither.
                    let tried = state.leases.get(&name).map(|l| l.resource_version.clone());
                    match read_own(places.of(&name).api, &name).await {
                        Ok(value) => {
                            match value.as_ref().and_then(|v| {
                                read_lease(v, Instant::now(), settings.lease_duration)
                            }) {
                                Some((name, seen)) => state.seen(name, seen),
                                None => {
                                    state.leases.remove(&name);
                                }
                            }
                            if state.landed(&action, tried.as_deref()) {
                                Written::Landed
                            } else {
                                Written::Failed(format!("no answer within {CALL_TIMEOUT:?}"))
                            }
                        }
                        Err(message) => Written::Failed(format!(
                            "no answer within {CALL_TIMEOUT:?}, nor to reading it back: {message}"
                        )),
                    }
                }
                outcome => outcome,
            };
            match outcome {
                Written::TimedOut => unreachable!("read back above"),
                Written::Landed => {
                    metrics.fleet_write(object, "ok");
                    metrics.fleet_write_kind(kind, "landed");
                    last_error = None;
                    write_backoff.reset();
                    if let Some(answer) = after(&mut state, &action)
                        && inputs.send(Input::Fleet(answer)).is_err()
                    {
                        return;
                    }
                }
                Written::Ok(lease) => {
                    metrics.fleet_write(object, "ok");
                    metrics.fleet_write_kind(kind, "ok");
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
                Written::Conflict if name == state.status_name() => {
                    // This node's own record was changed, deleted or made
                    // by someone else (perhaps without the label the watch
                    // selects): read it by name and replace it, after a
                    // backoff. Waiting for the watch could wait for good.
                    metrics.fleet_write(object, "conflict");
                    metrics.fleet_write_kind(kind, "conflict");
                    match read_own(places.of(&name).api, &name).await {
                        Ok(Some(value)) => {
                            if let Some((name, seen)) =
                                read_lease(&value, Instant::now(), settings.lease_duration)
                            {
                                state.seen(name, seen);
                            }
                        }
                        Ok(None) => {
                            state.leases.remove(&name);
                        }
                        Err(message) => tracing::warn!(lease = %name,
                            "cannot read this node's status record after a conflict: {message}"),
                    }
                    state.conflicted.remove(&name);
                    write_retry = Some(Instant::now() + write_backoff.delay());
                    break;
                }
                Written::Conflict => {
                    metrics.fleet_write(object, "conflict");
                    metrics.fleet_write_kind(kind, "conflict");
                    let rv = state
                        .leases
                        .get(&name)
                        .map(|l| l.resource_version.clone())
                        .unwrap_or_default();
                    state.conflicted.insert(name.clone(), rv);
                    // A create refused: the slot exists. It is read by
                    // name: one this node's watch does not select (no lane
                    // label, or a wrong one) is seen all the same, and
                    // judged like any other. A refused update waits for
                    // the watch, which shows what won.
                    // A take refused: another waiter was first; this one
                    // waits longer at the next freed slot.
                    if let Action::Take { id, .. } = &action {
                        state.lost_race(id);
                    }
                    let created = matches!(
                        action,
                        Action::Take {
                            resource_version: None,
                            ..
                        }
                    );
                    if created
                        && let Ok(Some(value)) = read_own(places.of(&name).api, &name).await
                        && let Some((name, seen)) =
                            read_lease(&value, Instant::now(), settings.lease_duration)
                    {
                        state.seen(name, seen);
                    }
                }
                Written::Failed(message) => {
                    metrics.fleet_write(object, "error");
                    metrics.fleet_write_kind(kind, "error");
                    if last_error.as_deref() != Some(message.as_str()) {
                        tracing::error!(lease = %name, namespace = %places.of(&name).namespace,
                            "cannot write a rollout Lease: {message}; updates that need a slot wait (manifests in place are kept)");
                        last_error = Some(message);
                    }
                    write_retry = Some(Instant::now() + write_backoff.delay());
                    break;
                }
            }
        }
        metrics.set_slots_held(state.held.len());
    }
}

/// Counts the nodes `selector` selects and tells the reconciler.
async fn count_nodes(client: kube::Client, selector: String, inputs: Sender<Input>) {
    let count = match nodes::count(client, &selector).await {
        Ok(n) => {
            tracing::debug!(selector = %selector, nodes = n, "counted the nodes a share of them is of");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(selector = %selector,
                "cannot count the nodes for podstamp.io/max-unavailable as a percentage: {e}; the share stays of the last count (or of one node)");
            None
        }
    };
    let _ = inputs.send(Input::Fleet(Answer::Nodes { selector, count }));
}

/// The Lease watch, started for a set of lanes.
struct Watcher {
    raw: Api<Raw<Lease>>,
    metrics: Arc<Metrics>,
    mine: String,
    duration: Duration,
    timeout: Option<u32>,
    tx: tokio::sync::mpsc::UnboundedSender<Tagged>,
}

impl Watcher {
    /// A watch of the halts and the slots of `lanes` (None: of every slot),
    /// its events tagged `generation`.
    fn start(
        &self,
        generation: u64,
        lanes: Option<&BTreeSet<String>>,
    ) -> tokio::task::JoinHandle<()> {
        let selector = match lanes {
            None => format!("{ROLE_LABEL} in (slot,{})", crate::fleet::ROLE_HALT),
            Some(lanes) => {
                let mut values = vec![HALT_LANE.to_string()];
                values.extend(lanes.iter().cloned());
                format!("{LANE_LABEL} in ({})", values.join(","))
            }
        };
        let spec = Spec::new("leases", "leases", self.timeout)
            .labels(&selector)
            .page(LEASE_PAGE);
        let (mine, duration, tx) = (self.mine.clone(), self.duration, self.tx.clone());
        tokio::spawn(watch::run(
            self.raw.clone(),
            spec,
            self.metrics.clone(),
            Backoff::new(),
            move |event| {
                let message = match event {
                    Event::Listing => LeaseEvent::Listing,
                    Event::Listed(lease) | Event::Applied(lease) => {
                        match reduce(lease.value(), &mine, duration) {
                            Some((name, seen)) => LeaseEvent::Object(name, Box::new(seen)),
                            None => return ControlFlow::Continue(()),
                        }
                    }
                    Event::ListDone => LeaseEvent::ListDone,
                    Event::Deleted(lease) => LeaseEvent::Deleted(lease.name().to_string()),
                    Event::Resumed => LeaseEvent::Resumed,
                    Event::Failed(_) => LeaseEvent::Failed,
                };
                match tx.send(Tagged(generation, message)) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(_) => ControlFlow::Break(()),
                }
            },
        ))
    }
}

/// Reads this node's own record by name (it is not watched), again after
/// a backoff until the API answers: nothing is written before.
async fn read_own_record(api: &Api<Lease>, state: &mut Ledger, settings: &Settings) {
    let name = state.status_name();
    let mut backoff = Backoff::new();
    let mut logged = false;
    loop {
        match read_own(api, &name).await {
            Ok(value) => {
                if let Some((name, seen)) = value
                    .as_ref()
                    .and_then(|v| read_lease(v, Instant::now(), settings.lease_duration))
                {
                    state.seen(name, seen);
                }
                return;
            }
            Err(message) => {
                if !logged {
                    logged = true;
                    tracing::warn!(lease = %name, namespace = %settings.status_namespace,
                        "cannot read this node's status record: {message}; trying again (nothing of rollouts is written meanwhile)");
                }
                tokio::time::sleep(backoff.delay()).await;
            }
        }
    }
}

/// A Lease as the watch hands it over, read and cut down on the watch's
/// own task: another node's status record keeps only its failures before
/// it is queued. The list is read faster than the ledger takes it, and
/// the queue between them is not bounded: objects queued whole (up to
/// 256 KiB each, as any writer of Leases may make them) are what took a
/// daemon listing a thousand forged records to 545 MiB.
fn reduce(value: &Value, mine: &str, duration: Duration) -> Option<(String, Seen)> {
    let (name, mut seen) = read_lease(value, Instant::now(), duration)?;
    if seen.role == ROLE_STATUS && name != mine {
        seen.failures_only();
    }
    Some((name, seen))
}

/// Lease `name` as the API has it now (None: there is none).
async fn read_own(api: &Api<Lease>, name: &str) -> Result<Option<Value>, String> {
    match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(lease)) => Ok(lease.and_then(|l| serde_json::to_value(l).ok())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// Makes the write `action` calls for.
async fn perform(
    places: &Places<'_>,
    state: &mut Ledger,
    action: &Action,
) -> (&'static str, String, Written) {
    let ns = places.leases.namespace;
    match action {
        Action::Status { resource_version } => {
            let create = resource_version.is_none();
            let lease = status_lease(
                state.status_name(),
                &state.me,
                state.mine.to_json(),
                places.records.namespace,
                resource_version.clone(),
            );
            (
                "status",
                state.status_name(),
                write(&places.records, lease, create).await,
            )
        }
        Action::Halt {
            id,
            name,
            resource_version,
        } => {
            let failed = state
                .mine
                .templates
                .get(id)
                .and_then(|t| t.failed.clone())
                .unwrap_or_default();
            let lease = halt_lease(
                name.clone(),
                &state.me,
                id,
                &failed,
                ns,
                resource_version.clone(),
            );
            let create = resource_version.is_none();
            (
                "halt",
                name.clone(),
                write(&places.leases, lease, create).await,
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
            (
                "slot",
                name.clone(),
                write(&places.leases, lease, false).await,
            )
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
            (
                "slot",
                name.clone(),
                write(&places.leases, lease, false).await,
            )
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
            (
                "slot",
                name.clone(),
                write(&places.leases, lease, create).await,
            )
        }
    }
}
