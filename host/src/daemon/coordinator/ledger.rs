//! What the coordinator knows of the Leases and of this node's asks, and
//! every decision it takes from that: which write comes next
//! ([`Ledger::next`] → [`Action`]), and what a write that went through
//! changes ([`after`]). No I/O: the async task in `mod.rs` reads the watch,
//! makes the writes and feeds the results back.
//!
//! What it is fed: this node's own record (read by name), the halt markers
//! and the slots of the lanes it waits in ([`Ledger::lanes`]); never the
//! other nodes' records. A target halts when this node's own record, or a
//! halt marker its own node may have written, says it failed; a change
//! ([`crate::fleet::change`]) halts when another node's marker names it,
//! unless this node's own record names it too (this node tried the change
//! and holds its own failed target: a fix of its own settings may be tried
//! here, and once confirmed lifts the halt it put on the others). A slot seen
//! free is tried after this node's turn ([`lanes::turn`] × its spread), so
//! that of the waiters for one freed slot the first tries alone. The
//! spread is [`SPREAD`] narrowed by the times this waiter's lanes went to
//! other nodes while it waited (each is one waiter fewer there: with
//! fewer waiters the first turn comes later, and a whole second's spread
//! cost each late step of a rollout up to a second), down to
//! [`MIN_SPREAD`], and widened in proportion to how slowly this node's
//! writes were answered lately, past [`REACH`] (a loaded API server shows
//! every node a take late: close turns would race). A waiter that lost a
//! race widens its own spread (×2 per
//! race lost, up to [`MAX_BACKOFF`] × [`SPREAD`], however narrowed it
//! was): where the winner's take is slow to be seen, fewer of the same
//! waiters race again. A waiter that waited
//! longer than [`Ledger::starved_after`] tries ahead of every other's
//! turn, yet in its own turn among the starved (in the first quarter of
//! its spread: [`STARVED_SPREAD`] at first), never at once: waiters
//! starved together would otherwise all race.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::lease::Seen;
use super::record::Pace;
use crate::daemon::inbox::{Answer, Ask};
use crate::fleet::{
    Halts, NodeStatus, ROLE_HALT, ROLE_SLOT, ROLE_STATUS, STATUS_VERSION, halt_name, lanes,
    slot_name, status_name, trust,
};

/// Waiters for a freed slot try it within this, each at its turn, until
/// other nodes were seen to take their lanes.
pub(super) const SPREAD: Duration = Duration::from_millis(1000);
/// The answer time of this node's writes up to which [`SPREAD`] stands.
/// Slower answers (a loaded API server, APF's queues) widen the spread in
/// proportion: there a take is seen late, and turns as close as before
/// only make races. At 50 ms the spread widened already at N = 100 on the
/// fleet bench's 2 cores, where its rollouts took 1.30× the ideal against
/// 1.20–1.23× (docs/performance.md §10.11).
pub(super) const REACH: Duration = Duration::from_millis(100);
/// The narrowest spread, however often a waiter was passed over: the
/// time a take takes to be seen is a few to a few hundred milliseconds.
pub(super) const MIN_SPREAD: Duration = Duration::from_millis(50);
/// A waiter's spread grows at most this many times over by races lost.
pub(super) const MAX_BACKOFF: u32 = 8;
/// Starved waiters try within this, each at its turn: ahead of the others.
pub(super) const STARVED_SPREAD: Duration = Duration::from_millis(250);
/// The most halt markers kept, and of one node: a node can write markers
/// for every template in its own name, and must not push out the others'.
pub(super) const MAX_HALTS: usize = 4096;
pub(super) const MAX_HALTS_PER_NODE: usize = 16;

/// A slot asked for, not granted.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pending {
    pub(super) target: String,
    pub(super) slots: u32,
    /// A slot whose holder stopped renewing it may be taken once its
    /// duration passed; false for a quorum member's
    /// ([`crate::fleet::policy::Policy::expires`]).
    pub(super) expires: bool,
    /// When it was asked: a waiter past [`Ledger::starved_after`] goes first.
    pub(super) since: Instant,
    pub(super) starved_logged: bool,
    /// Races for a slot lost while waiting (409 on a take): each doubles
    /// this waiter's spread, up to [`MAX_BACKOFF`].
    pub(super) lost: u32,
    /// Times one of this waiter's lanes went to another node while it
    /// waited: each narrows its spread (one waiter fewer there).
    pub(super) passed: u32,
}

/// One write the state calls for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// This node's record.
    Status { resource_version: Option<String> },
    /// Free a slot this node held.
    Release { name: String },
    /// Renew a slot held for template `id`.
    Renew { id: String, name: String },
    /// This node's halt marker for template `id`: its record says a target
    /// failed here, the marker does not say so yet.
    Halt {
        id: String,
        name: String,
        resource_version: Option<String>,
    },
    /// Take slot `name` for template `id`: a create when there is no
    /// resourceVersion.
    Take {
        id: String,
        name: String,
        target: String,
        resource_version: Option<String>,
    },
}

impl Action {
    /// What the write is for, as the metrics name it.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Action::Status { .. } => "status",
            Action::Release { .. } => "release",
            Action::Renew { .. } => "renew",
            Action::Halt { .. } => "halt",
            Action::Take { .. } => "take",
        }
    }
}

/// What the coordinator knows; every decision is made here, without I/O.
pub(super) struct Ledger {
    pub(super) me: String,
    pub(super) duration: Duration,
    pub(super) leases: BTreeMap<String, Seen>,
    /// A relist under way: what it has seen so far.
    pub(super) relisting: Option<BTreeMap<String, Seen>>,
    pub(super) synced: bool,
    /// Asked, not granted: template → what.
    pub(super) pending: BTreeMap<String, Pending>,
    /// When the watch of the lanes last listed: a slot missing then is
    /// free from then on.
    pub(super) listed_at: Option<Instant>,
    /// Halt markers ignored for the cap (logged once).
    pub(super) halts_capped: bool,
    /// Template → the slot this node holds for it.
    pub(super) held: BTreeMap<String, String>,
    pub(super) last_renew: BTreeMap<String, Instant>,
    /// Slots to free.
    pub(super) releasing: BTreeSet<String>,
    /// This node's record as it should be.
    pub(super) mine: NodeStatus,
    /// The API's copy of this node's record (the last one read or
    /// written) says what `mine` says. Once synced, that copy is compared
    /// with `mine` when it is seen and then kept without its templates: a
    /// second copy of a record of every template on the node, and a
    /// comparison of the two at every [`Ledger::next`], bought nothing
    /// (docs/performance.md §3.6).
    pub(super) mine_in_api: bool,
    /// The changes of `mine` held back, to be written together.
    pub(super) pace: Pace,
    /// Writes that lost a race, by object name, at the resourceVersion
    /// they were tried against: not tried again until it changes.
    pub(super) conflicted: BTreeMap<String, String>,
    /// The halts last sent to the reconciler.
    pub(super) failed_sent: Option<BTreeMap<String, Halts>>,
    /// The Lease watch is following (listed or resumed, not failed since):
    /// only then can a slot be judged unrenewed, and taken.
    pub(super) watching: bool,
    /// Status records said to be ignored (once each).
    pub(super) untrusted_logged: BTreeSet<String>,
    /// How long this node's writes took to be answered lately (a moving
    /// average): about how late another node's take is seen here.
    pub(super) reach: Option<Duration>,
}

impl Ledger {
    pub(super) fn new(me: String, duration: Duration) -> Ledger {
        Ledger {
            me,
            duration,
            leases: BTreeMap::new(),
            relisting: None,
            synced: false,
            pending: BTreeMap::new(),
            listed_at: None,
            halts_capped: false,
            held: BTreeMap::new(),
            last_renew: BTreeMap::new(),
            releasing: BTreeSet::new(),
            mine: NodeStatus {
                version: STATUS_VERSION,
                ..NodeStatus::default()
            },
            mine_in_api: false,
            pace: Pace::default(),
            conflicted: BTreeMap::new(),
            failed_sent: None,
            watching: false,
            untrusted_logged: BTreeSet::new(),
            reach: None,
        }
    }

    /// A write of this node's was answered (written or refused) after
    /// `took`.
    pub(super) fn answered(&mut self, took: Duration) {
        self.reach = Some(match self.reach {
            None => took,
            Some(reach) => (reach * 3 + took) / 4,
        });
    }

    pub(super) fn status_name(&self) -> String {
        status_name(&self.me)
    }

    /// This node's record as the API has it was read or written: `same`,
    /// it says what this node says, and nothing is held back any more.
    fn own_record_in_api(&mut self, same: bool) {
        self.mine_in_api = same;
        if same {
            self.pace.written();
        }
    }

    /// A Lease seen (listed or changed); a new version is observed now.
    /// Another node's status record is kept only as what its own node may
    /// have written (name ↔ holder, [`trust::status_owner`]: the rule the
    /// admission policy holds writers to, applied here too so that a
    /// cluster without the policy is not trusted more), and only its
    /// failures.
    pub(super) fn seen(&mut self, name: String, mut lease: Seen) {
        if lease.role == ROLE_HALT && !self.keep_halt(&name, &mut lease) {
            return;
        }
        if lease.role == ROLE_STATUS && name != self.status_name() {
            match trust::status_owner(&name, lease.holder.as_deref(), None) {
                Ok(owner) => {
                    lease.owner = Some(owner.to_string());
                    lease.failures_only();
                }
                Err(why) => {
                    if self.untrusted_logged.insert(name.clone()) {
                        tracing::warn!(lease = %name, "status record ignored: {why}");
                    }
                    lease.record = NodeStatus::default();
                }
            }
        }
        // This node's own record is read by name and written here, never
        // listed: what is read or written of it counts at once, relist or
        // not. Put in the relisting map instead, a write made during a
        // relist left [`Ledger::next`] with the old resourceVersion, so
        // every status write until the list ended was refused (409), and
        // a list started again dropped the new one for good
        // (docs/performance.md §10.1, run 8).
        let own = name == self.status_name();
        if own && self.synced {
            self.own_record_in_api(lease.record == self.mine);
            lease.record = NodeStatus::default();
        }
        // A relist follows a gap in what this node saw: every Lease in it
        // is observed from now (see [`Ledger::reobserve`]).
        // A slot newly held by another node: a waiter for it, passed over.
        let changed_hands = lease.role == ROLE_SLOT
            && lease.holder.as_deref().is_some_and(|holder| {
                holder != self.me
                    && self.leases.get(&name).is_none_or(|old| {
                        old.resource_version != lease.resource_version
                            && old.holder.as_deref() != Some(holder)
                    })
            });
        let known = match &self.relisting {
            Some(listing) if !own => listing.get(&name),
            _ => self.leases.get(&name),
        };
        if let Some(old) = known
            && old.resource_version == lease.resource_version
        {
            lease.observed = old.observed;
        }
        if changed_hands {
            self.passed_over(&name, &lease);
        }
        let map = match self.relisting.as_mut() {
            Some(listing) if !own => listing,
            _ => &mut self.leases,
        };
        map.insert(name, lease);
    }

    /// Slot `name`, now held by another node: once more passed over, if
    /// this node waits for it (one of its lanes for the target it asks).
    fn passed_over(&mut self, name: &str, lease: &Seen) {
        let me = self.me.as_str();
        if let Some(id) = lease.template.as_deref()
            && let Some(p) = self.pending.get_mut(id)
            && lanes::lanes(me, id, &p.target, p.slots)
                .into_iter()
                .any(|i| slot_name(id, i) == name)
        {
            p.passed = p.passed.saturating_add(1);
        }
    }

    /// Whether a halt marker is kept, and as what (its owner, or nothing
    /// when its own node cannot have written it): at most
    /// [`MAX_HALTS_PER_NODE`] per node and [`MAX_HALTS`] in all.
    fn keep_halt(&mut self, name: &str, lease: &mut Seen) -> bool {
        match trust::halt_owner(name, lease.holder.as_deref(), lease.template.as_deref()) {
            Ok(owner) => lease.owner = Some(owner.to_string()),
            Err(why) => {
                if self.untrusted_logged.insert(name.to_string()) {
                    tracing::warn!(lease = %name, "halt marker ignored: {why}");
                }
                lease.record = NodeStatus::default();
                return true;
            }
        }
        let map = self.relisting.as_ref().unwrap_or(&self.leases);
        if map.contains_key(name) {
            return true;
        }
        let halts = map.values().filter(|l| l.role == ROLE_HALT);
        let (all, of_owner) = halts.fold((0, 0), |(all, own), l| {
            (all + 1, own + usize::from(l.owner == lease.owner))
        });
        if all >= MAX_HALTS || of_owner >= MAX_HALTS_PER_NODE {
            if !self.halts_capped {
                self.halts_capped = true;
                tracing::warn!(lease = %name, "halt markers over the cap ({MAX_HALTS} in all, {MAX_HALTS_PER_NODE} per node): the rest are ignored");
            }
            return false;
        }
        true
    }

    /// The watch was cut and resumed: nothing was seen meanwhile, so no
    /// Lease counts as unrenewed for that time. A holder that could not
    /// renew during an API outage is not taken over the moment it ends:
    /// others wait a whole duration of watching first.
    pub(super) fn reobserve(&mut self, now: Instant) {
        self.watching = true;
        for lease in self.leases.values_mut() {
            lease.observed = now;
        }
    }

    /// The Lease watch failed: until it follows again, what this node
    /// knows of the slots may be stale, and none is taken.
    pub(super) fn watch_failed(&mut self) {
        self.watching = false;
    }

    pub(super) fn list_done(&mut self, now: Instant) -> Vec<Answer> {
        if let Some(mut listed) = self.relisting.take() {
            // This node's own record is read by name, not watched: the
            // last one read or written (see [`Ledger::seen`]).
            let mine = self.status_name();
            if let Some(own) = self.leases.remove(&mine) {
                listed.insert(mine, own);
            }
            self.leases = listed;
        }
        self.listed_at = Some(now);
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
            let own = self.status_name();
            if let Some(lease) = self.leases.get_mut(&own) {
                let in_api = std::mem::take(&mut lease.record);
                for (id, status) in &in_api.templates {
                    self.mine
                        .templates
                        .entry(id.clone())
                        .or_insert_with(|| status.clone());
                }
                self.own_record_in_api(in_api == self.mine);
            }
        }
        answers
    }

    pub(super) fn ask(&mut self, ask: Ask) {
        match ask {
            Ask::Acquire {
                id,
                target,
                slots,
                expires,
            } => {
                let (since, lost, passed) = match self.pending.get(&id) {
                    Some(p) if p.target == target => (p.since, p.lost, p.passed),
                    Some(p) => (p.since, 0, 0),
                    None => (Instant::now(), 0, 0),
                };
                self.pending.insert(
                    id,
                    Pending {
                        target,
                        slots,
                        expires,
                        since,
                        starved_logged: false,
                        lost,
                        passed,
                    },
                );
            }
            Ask::Cancel { id } => {
                self.pending.remove(&id);
            }
            // Counted by the task (`nodes`), not a Lease.
            Ask::Count { .. } => {}
            Ask::Release { id } => {
                self.pending.remove(&id);
                self.last_renew.remove(&id);
                if let Some(name) = self.held.remove(&id) {
                    self.releasing.insert(name);
                }
            }
            Ask::Report { id, status: None } => {
                if self.mine.templates.remove(&id).is_some() {
                    self.pace.changed(Instant::now(), self.mine_in_api, false);
                    self.mine_in_api = false;
                }
            }
            Ask::Report {
                id,
                status: Some(mut status),
            } => {
                let old = self.mine.templates.get(&id);
                // The time a phase began is kept from the record in the API
                // (a restarted node reports its phases anew).
                if let Some(old) = old
                    && old.phase == status.phase
                {
                    status.since = old.since.clone();
                }
                if old != Some(&status) {
                    // Said at once: what failed here (the halt marker
                    // follows), and a new target heard of (one write per
                    // rollout). Held back: the progress on it.
                    let urgent = old.and_then(|o| o.failed.as_ref()) != status.failed.as_ref()
                        || old.and_then(|o| o.wanted.as_ref()) != status.wanted.as_ref();
                    self.pace.changed(Instant::now(), self.mine_in_api, urgent);
                    self.mine.templates.insert(id, status);
                    self.mine_in_api = false;
                }
            }
        }
    }

    /// Slots this node held that another node took, or that are gone.
    pub(super) fn lost(&mut self) -> Vec<Answer> {
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

    /// Every target and change that failed on some node and halts this
    /// one, when it changed since last sent.
    pub(super) fn failed(&mut self) -> Option<Answer> {
        let mut failed: BTreeMap<String, Halts> = BTreeMap::new();
        let mine = self.status_name();
        // This node's own record, and the halt markers of the others.
        let records = self
            .leases
            .iter()
            .filter(|(name, l)| l.role == ROLE_HALT || (**name == mine && l.role == ROLE_STATUS));
        for (name, lease) in records {
            // Only a record its own node may have written halts anything.
            let (node, record) = if *name == mine {
                (self.me.as_str(), &self.mine)
            } else {
                match &lease.owner {
                    Some(owner) => (owner.as_str(), &lease.record),
                    None => continue,
                }
            };
            for (id, status) in &record.templates {
                if let Some(f) = status.failed.as_ref().filter(|f| !f.target.is_empty()) {
                    let halts = failed.entry(id.clone()).or_default();
                    halts.targets.insert(
                        f.target.clone(),
                        format!("node {node}: {}: {}", f.reason, f.message),
                    );
                    // A change halts the others only: this node's own
                    // failure holds its own target, and one it tried
                    // itself is not halted here by another's.
                    let tried_here = |change: &String| {
                        self.mine
                            .templates
                            .get(id)
                            .and_then(|t| t.failed.as_ref())
                            .and_then(|f| f.change.as_ref())
                            == Some(change)
                    };
                    if let Some(change) = f.change.as_ref().filter(|c| !c.is_empty())
                        && node != self.me
                        && !tried_here(change)
                    {
                        halts.changes.insert(
                            change.clone(),
                            format!(
                                "node {node} (its target {}): {}: {}",
                                f.target, f.reason, f.message
                            ),
                        );
                    }
                }
            }
        }
        if self.failed_sent.as_ref() == Some(&failed) {
            return None;
        }
        self.failed_sent = Some(failed.clone());
        Some(Answer::Failed(failed))
    }

    pub(super) fn conflicted(&self, name: &str, resource_version: Option<&str>) -> bool {
        self.conflicted.get(name).map(String::as_str) == Some(resource_version.unwrap_or(""))
    }

    /// The next write to make, if any.
    pub(super) fn next(&self, now: Instant) -> Option<Action> {
        if !self.synced {
            return None;
        }
        // The record first: a failure is known before the slot is free.
        // Other changes are held back a little, to be written together
        // ([`super::record`]), unless a release waits for them.
        let name = self.status_name();
        let in_api = self.leases.get(&name);
        let rv = in_api.map(|l| l.resource_version.clone());
        if (in_api.is_none() || !self.mine_in_api) && !self.conflicted(&name, rv.as_deref()) {
            // No record and nothing to say: nothing to write.
            if !(in_api.is_none() && self.mine.templates.is_empty())
                && self.pace.due(now, !self.releasing.is_empty())
            {
                return Some(Action::Status {
                    resource_version: rv,
                });
            }
        }
        // Renewals before anything else this node may be kept from
        // writing: a node whose halt marker is refused keeps its slot.
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
        // A failure here is marked before any slot is freed: the node that
        // takes it next has seen the marker (both come through one watch,
        // in order). While the marker cannot be written, no slot is freed.
        if let Some(halt) = self.halt_due() {
            return Some(halt);
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
        self.takes(now).find(|(at, _)| *at <= now).map(|(_, a)| a)
    }

    /// Whether `action`, which got no answer, went through all the same:
    /// the Lease as read back since is a version other than `tried` (the
    /// one it was written against; None: none was there) and says what the
    /// write said. A record or a halt marker needs no such judgement:
    /// [`Ledger::next`] compares what it says with what it should.
    pub(super) fn landed(&self, action: &Action, tried: Option<&str>) -> bool {
        let (name, holder) = match action {
            Action::Take { name, .. } | Action::Renew { name, .. } => {
                (name, Some(self.me.as_str()))
            }
            Action::Release { name } => (name, None),
            Action::Status { .. } | Action::Halt { .. } => return false,
        };
        self.leases.get(name).is_some_and(|l| {
            Some(l.resource_version.as_str()) != tried && l.holder.as_deref() == holder
        })
    }

    /// This node's halt marker that does not say yet what its record says
    /// failed here.
    fn halt_due(&self) -> Option<Action> {
        for (id, status) in &self.mine.templates {
            let Some(failed) = status.failed.as_ref().filter(|f| !f.target.is_empty()) else {
                continue;
            };
            let name = halt_name(&self.me, id);
            let in_api = self.leases.get(&name);
            // The target and its change: a change no longer named (this
            // node confirmed another target of it) is rewritten too.
            let says = in_api
                .and_then(|l| l.record.templates.get(id))
                .and_then(|t| t.failed.as_ref())
                .map(|f| (f.target.as_str(), f.change.as_deref()));
            let should = (failed.target.as_str(), failed.change.as_deref());
            let rv = in_api.map(|l| l.resource_version.clone());
            if says != Some(should) && !self.conflicted(&name, rv.as_deref()) {
                return Some(Action::Halt {
                    id: id.clone(),
                    name,
                    resource_version: rv,
                });
            }
        }
        None
    }

    /// A take for template `id` was refused (409): another waiter was
    /// first. This waiter's spread widens.
    pub(super) fn lost_race(&mut self, id: &str) {
        if let Some(p) = self.pending.get_mut(id) {
            p.lost = p.lost.saturating_add(1);
        }
    }

    /// This waiter's spread: [`SPREAD`], times this node's answer time
    /// over [`REACH`] when that is longer (at most [`MAX_BACKOFF`] ×
    /// [`SPREAD`]), divided by 1 + the times it was
    /// passed over per lane, at least [`MIN_SPREAD`], doubled per race
    /// lost up to [`MAX_BACKOFF`] × [`SPREAD`] (not × the narrowed one: a
    /// race lost again and again says the others' takes are seen late
    /// here, a loaded API server, and only a spread as wide as before
    /// thins those racers out); once starved, a quarter of the narrowed
    /// one, before the races ([`STARVED_SPREAD`] at first).
    fn spread(&self, pending: &Pending, now: Instant) -> Duration {
        let passed = f64::from(pending.passed) / f64::from(lanes::LANES);
        let widen = self
            .reach
            .map_or(1.0, |r| (r.as_secs_f64() / REACH.as_secs_f64()).max(1.0));
        let base = SPREAD
            .mul_f64(widen)
            .div_f64(1.0 + passed)
            .clamp(MIN_SPREAD, SPREAD * MAX_BACKOFF);
        if self.starved(pending, now) {
            base.mul_f64(STARVED_SPREAD.as_secs_f64() / SPREAD.as_secs_f64())
        } else {
            (base * 2u32.saturating_pow(pending.lost.min(16))).min(SPREAD * MAX_BACKOFF)
        }
    }

    /// Whether the waiter for `id` waited past [`Ledger::starved_after`].
    fn starved(&self, pending: &Pending, now: Instant) -> bool {
        now.duration_since(pending.since) >= self.starved_after()
    }

    /// How long a waiter waits its turn at most: then it tries at once.
    pub(super) fn starved_after(&self) -> Duration {
        self.duration * 4
    }

    /// Every slot this node could take, and from when (its turn after the
    /// slot was seen free).
    fn takes(&self, now: Instant) -> impl Iterator<Item = (Instant, Action)> + '_ {
        // A slot is judged free only from a watch that follows: after an
        // outage, the holder could not renew, and others could not see.
        let pending = self.pending.iter().filter(|_| self.watching);
        pending.flat_map(move |(id, p)| {
            // A target that failed on a node is not started (the reconciler
            // withdraws the ask when it hears of it).
            let failed = self
                .failed_sent
                .as_ref()
                .and_then(|f| f.get(id))
                .is_some_and(|h| h.targets.contains_key(&p.target));
            let indexes = if self.held.contains_key(id) || failed {
                Vec::new()
            } else {
                lanes::lanes(&self.me, id, &p.target, p.slots)
            };
            let spread = self.spread(p, now);
            indexes.into_iter().filter_map(move |index| {
                let name = slot_name(id, index);
                let turn = spread.mul_f64(lanes::turn(&self.me, id, &p.target, index));
                let take = |resource_version: Option<String>| Action::Take {
                    id: id.clone(),
                    name: name.clone(),
                    target: p.target.clone(),
                    resource_version,
                };
                match self.leases.get(&name) {
                    None if !self.conflicted(&name, None) => {
                        Some((self.listed_at.unwrap_or(now) + turn, take(None)))
                    }
                    None => None,
                    Some(l) => {
                        let free_since = match l.holder.as_deref() {
                            None => Some(l.observed),
                            Some(h) if h == self.me => Some(l.observed),
                            // Judged by this node's duration, never a longer
                            // one from the object: a writer that sets it to
                            // 2^31-1 s must not hold the slot for good. A
                            // quorum member's never expires: its holder may
                            // be the member that is down.
                            Some(_) if !p.expires => None,
                            Some(_) => Some(l.observed + l.duration.min(self.duration)),
                        };
                        let mine = l.holder.as_deref() == Some(self.me.as_str());
                        free_since
                            .filter(|_| !self.conflicted(&name, Some(&l.resource_version)))
                            .map(|t| {
                                let at = if mine { t } else { t + turn };
                                (at, take(Some(l.resource_version.clone())))
                            })
                    }
                }
            })
        })
    }

    /// When a slot becomes this node's to try, or this node's record is
    /// due, if either will be without news.
    pub(super) fn wake_at(&self, now: Instant) -> Option<Instant> {
        let record = self
            .pace
            .due_at()
            .filter(|_| self.synced && !self.mine_in_api);
        self.takes(now)
            .map(|(at, _)| at)
            .chain(record)
            .filter(|at| *at > now)
            .min()
    }

    /// How long the task may sleep without news: until [`Ledger::wake_at`]
    /// or `retry_at` (a write refused or unanswered, to try again then),
    /// at most `tick` while busy, an hour when idle. A write to try again
    /// bounds it even when idle: a record that failed to be written while
    /// nothing rolled waited for the next ask (an hour, or for good).
    pub(super) fn sleep_for(
        &self,
        now: Instant,
        retry_at: Option<Instant>,
        tick: Duration,
    ) -> Duration {
        let most = if self.busy() {
            tick
        } else {
            Duration::from_secs(3600)
        };
        self.wake_at(now)
            .into_iter()
            .chain(retry_at)
            .map(|at| at.saturating_duration_since(now))
            .fold(most, Duration::min)
    }

    /// Logs, once per ask, a waiter that waited past its turn's bound.
    pub(super) fn note_starved(&mut self, now: Instant) {
        let after = self.starved_after();
        for (id, p) in &mut self.pending {
            if !p.starved_logged && now.duration_since(p.since) >= after {
                p.starved_logged = true;
                tracing::warn!(template = %id, target = %p.target,
                    "waited for a rollout slot longer than {after:?}: trying freed slots ahead of the other waiters' turns");
            }
        }
    }

    /// The lane labels of the slots this node waits for, holds or frees:
    /// what its Lease watch selects (with the halt markers).
    pub(super) fn lanes(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (id, p) in &self.pending {
            for index in lanes::lanes(&self.me, id, &p.target, p.slots) {
                out.insert(lanes::lane(&slot_name(id, index)));
            }
        }
        for name in self.held.values().chain(&self.releasing) {
            out.insert(lanes::lane(name));
        }
        out
    }

    /// Whether this node needs its Lease watch: while it waits for, holds
    /// or frees a slot, and while it knows of any halt (a node held back
    /// by one must hear it lifted). Otherwise nothing the watch could show
    /// changes what this node does, and its next ask lists again; a watch
    /// kept meanwhile would only be handed every Lease write of the
    /// namespace by the API server (docs/performance.md §10.5).
    pub(super) fn needs_watch(&self) -> bool {
        self.busy() || self.failed_sent.as_ref().is_some_and(|f| !f.is_empty())
    }

    /// Whether anything waits on time (expiry, renewal).
    pub(super) fn busy(&self) -> bool {
        !self.pending.is_empty() || !self.held.is_empty() || !self.releasing.is_empty()
    }
}

/// What a successful write changes in the state, and tells the reconciler.
pub(super) fn after(state: &mut Ledger, action: &Action) -> Option<Answer> {
    match action {
        Action::Status { .. } | Action::Halt { .. } => None,
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
    use super::super::lease::read_lease;
    use super::super::record::HOLD;
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
            owner: None,
            transitions: 0,
            acquired: None,
            resource_version: rv.into(),
            observed,
        }
    }

    fn synced(me: &str) -> Ledger {
        let mut s = Ledger::new(me.into(), D);
        s.list_done(Instant::now());
        s
    }

    fn acquire(s: &mut Ledger, slots: u32) {
        s.ask(Ask::Acquire {
            id: "ns/web".into(),
            target: "t1".into(),
            slots,
            expires: true,
        });
    }

    #[test]
    fn nothing_is_written_before_the_first_list_or_while_idle() {
        let mut s = Ledger::new("n1".into(), D);
        acquire(&mut s, 1);
        assert_eq!(s.next(Instant::now()), None);
        let mut s = synced("n1");
        assert_eq!(s.next(Instant::now()), None, "idle: no writes");
        assert!(!s.busy());
        acquire(&mut s, 1);
        assert!(matches!(
            s.next(Instant::now() + SPREAD),
            Some(Action::Take {
                resource_version: None,
                ..
            })
        ));
    }

    #[test]
    fn the_watch_is_needed_while_a_slot_is_wanted_or_held_or_a_halt_is_known() {
        let mut s = synced("n1");
        assert!(!s.needs_watch(), "idle, nothing failed anywhere: no watch");
        acquire(&mut s, 1);
        assert!(s.needs_watch(), "waiting for a slot");
        s.ask(Ask::Cancel {
            id: "ns/web".into(),
        });
        assert!(!s.needs_watch(), "the ask withdrawn");
        s.held.insert("ns/web".into(), slot_name("ns/web", 0));
        assert!(s.needs_watch(), "holding a slot");
        s.held.clear();
        // A halt marker seen and told to the reconciler: a node held back
        // by it must hear it lifted, so the watch stays.
        s.seen(
            halt_name("n2", "ns/web"),
            halt(Some("n2"), "ns/web", "t1", "5"),
        );
        assert!(matches!(s.failed(), Some(Answer::Failed(_))));
        assert!(s.needs_watch(), "a halt is known");
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
            s.next(now + D / 2 + D + SPREAD),
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
    fn a_quorum_members_slot_is_never_taken_from_a_holder_that_stopped_renewing() {
        let now = Instant::now();
        let mut s = synced("n1");
        let name = slot_name("ns/web", 0);
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "5", now));
        s.ask(Ask::Acquire {
            id: "ns/web".into(),
            target: "t1".into(),
            slots: 1,
            expires: false,
        });
        // n2 may be the member that is down: ten durations change nothing.
        assert_eq!(s.next(now + D * 10), None);
        // Freed by its holder (or deleted by an operator): taken.
        s.seen(name.clone(), lease(ROLE_SLOT, None, "6", now + D * 10));
        assert!(matches!(
            s.next(now + D * 10 + STARVED_SPREAD),
            Some(Action::Take { resource_version: Some(rv), .. }) if rv == "6"
        ));
    }

    #[test]
    fn a_slot_whose_object_claims_a_longer_duration_expires_by_this_nodes() {
        let now = Instant::now();
        let mut s = synced("n1");
        let name = slot_name("ns/web", 0);
        let mut forever = lease(ROLE_SLOT, Some("n2"), "5", now);
        forever.duration = Duration::from_secs(i32::MAX as u64);
        s.seen(name.clone(), forever);
        acquire(&mut s, 1);
        assert_eq!(s.next(now + D - Duration::from_millis(1)), None);
        assert!(matches!(
            s.next(now + D + SPREAD),
            Some(Action::Take { resource_version: Some(rv), .. }) if rv == "5"
        ));
        // A shorter one is the holder's own promise: it counts.
        let mut short = lease(ROLE_SLOT, Some("n2"), "6", now);
        short.duration = D / 2;
        s.seen(name, short);
        assert!(matches!(
            s.next(now + D / 2 + SPREAD),
            Some(Action::Take { .. })
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
        assert!(matches!(
            s.next(now + 3 * D + SPREAD),
            Some(Action::Take { .. })
        ));
        // A relist too observes every Lease anew.
        s.relisting = Some(BTreeMap::new());
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "5", now + 3 * D));
        s.list_done(Instant::now());
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
        assert!(matches!(s.next(now + SPREAD), Some(Action::Take { .. })));
    }

    #[test]
    fn a_restarted_node_adopts_its_slots_and_keeps_its_record() {
        let now = Instant::now();
        let mut s = Ledger::new("n1".into(), D);
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
            Box::new(TemplateStatus {
                phase: "ready".into(),
                since: "2026-01-01T00:00:00Z".into(),
                ..TemplateStatus::default()
            }),
        );
        let mut mine = lease(ROLE_STATUS, Some("n1"), "4", now);
        mine.record = record;
        s.seen(status_name("n1"), mine);
        let answers = s.list_done(Instant::now());
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
    fn this_nodes_record_written_during_a_relist_is_written_next_on_its_new_version() {
        let now = Instant::now();
        let mut s = synced("n1");
        let mut v4 = lease(ROLE_STATUS, Some("n1"), "4", now);
        v4.record = s.mine.clone();
        s.seen(status_name("n1"), v4);
        // The watch relists (a gap, a 410), and meanwhile this node's
        // phase changes and its record is written: version 5.
        s.relisting = Some(BTreeMap::new());
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: Some(Box::new(TemplateStatus {
                phase: "updating".into(),
                since: "2026-12-06T00:00:00Z".into(),
                ..TemplateStatus::default()
            })),
        });
        assert_eq!(s.next(now), None, "a change held back");
        let later = Instant::now() + HOLD;
        assert!(matches!(
            s.next(later),
            Some(Action::Status { resource_version: Some(rv) }) if rv == "4"
        ));
        let mut v5 = lease(ROLE_STATUS, Some("n1"), "5", now);
        v5.record = s.mine.clone();
        s.seen(status_name("n1"), v5);
        // Nothing more to say: not written again on version 4 (refused).
        assert_eq!(s.next(now), None, "written again during the relist");
        // The list is started again (the first one was refused), then
        // done: version 5 is kept, not the one from before the relist.
        s.relisting = Some(BTreeMap::new());
        s.list_done(now);
        assert_eq!(s.next(now), None, "written again after the relist");
        assert_eq!(s.leases[&status_name("n1")].resource_version, "5");
    }

    #[test]
    fn phases_reported_within_the_hold_are_one_write_and_a_release_takes_the_record_first() {
        let t0 = Instant::now();
        let mut s = synced("n1");
        let report = |s: &mut Ledger, phase: &str| {
            s.ask(Ask::Report {
                id: "ns/web".into(),
                status: Some(Box::new(TemplateStatus {
                    phase: phase.into(),
                    since: "2026-12-07T00:00:00Z".into(),
                    ..TemplateStatus::default()
                })),
            })
        };
        for phase in ["waiting", "written", "running"] {
            report(&mut s, phase);
            assert_eq!(s.next(Instant::now()), None, "{phase}: written at once");
        }
        // Nothing else to do here: the task still wakes for the record.
        assert!(!s.busy());
        let due = s.wake_at(Instant::now()).expect("no wake for the record");
        assert!(due >= t0 + HOLD && due <= Instant::now() + HOLD, "{due:?}");
        assert!(matches!(s.next(due), Some(Action::Status { .. })));
        let mut written = lease(ROLE_STATUS, Some("n1"), "4", t0);
        written.record = s.mine.clone();
        s.seen(status_name("n1"), written);
        assert_eq!(
            s.wake_at(Instant::now()),
            None,
            "woken for a record written"
        );
        // Ready, and the slot freed at once: the record is written first,
        // not held back behind the release.
        let slot = slot_name("ns/web", 0);
        s.seen(slot.clone(), lease(ROLE_SLOT, Some("n1"), "7", t0));
        s.held.insert("ns/web".into(), slot.clone());
        report(&mut s, "ready");
        s.ask(Ask::Release {
            id: "ns/web".into(),
        });
        assert!(matches!(
            s.next(Instant::now()),
            Some(Action::Status { .. })
        ));
        let mut written = lease(ROLE_STATUS, Some("n1"), "5", t0);
        written.record = s.mine.clone();
        s.seen(status_name("n1"), written);
        assert_eq!(s.next(Instant::now()), Some(Action::Release { name: slot }));
        let mut written = lease(ROLE_STATUS, Some("n1"), "6", t0);
        written.record = s.mine.clone();
        s.seen(status_name("n1"), written);
        // A new target heard of is said at once; its progress is not.
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: Some(Box::new(TemplateStatus {
                phase: "waiting".into(),
                wanted: Some("t2".into()),
                since: "2026-12-07T00:00:00Z".into(),
                ..TemplateStatus::default()
            })),
        });
        assert!(
            matches!(s.next(Instant::now()), Some(Action::Status { .. })),
            "a new target not written at once"
        );
    }

    #[test]
    fn an_idle_node_sleeps_until_a_write_it_must_try_again() {
        let now = Instant::now();
        let tick = Duration::from_millis(500);
        let s = synced("n1");
        assert!(!s.busy());
        assert_eq!(s.sleep_for(now, None, tick), Duration::from_secs(3600));
        let retry = Duration::from_millis(1600);
        assert_eq!(
            s.sleep_for(now, Some(now + retry), tick),
            retry,
            "retry left to news"
        );
        let mut busy = synced("n1");
        acquire(&mut busy, 1);
        assert!(busy.sleep_for(now, Some(now + retry), tick) <= tick);
    }

    #[test]
    fn this_nodes_record_in_the_api_is_compared_once_and_not_kept() {
        let now = Instant::now();
        let mut s = synced("n1");
        let ready = || {
            Some(Box::new(TemplateStatus {
                phase: "ready".into(),
                since: "2026-12-07T00:00:00Z".into(),
                ..TemplateStatus::default()
            }))
        };
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: ready(),
        });
        assert_eq!(s.next(now), None, "a change held back");
        assert!(matches!(
            s.next(Instant::now() + HOLD),
            Some(Action::Status { .. })
        ));
        let mut written = lease(ROLE_STATUS, Some("n1"), "4", now);
        written.record = s.mine.clone();
        s.seen(status_name("n1"), written);
        assert_eq!(s.next(now), None, "written again though the API has it");
        assert!(
            s.leases[&status_name("n1")].record.templates.is_empty(),
            "a second copy of this node's record is kept"
        );
        // The same status reported again changes nothing.
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: ready(),
        });
        assert_eq!(s.next(now), None);
        // Changed in the API by someone else: written again over it, at
        // once (nothing of it is this node's change, to be held back).
        let mut changed = lease(ROLE_STATUS, Some("n1"), "5", now);
        changed.record = NodeStatus::default();
        s.seen(status_name("n1"), changed);
        assert!(matches!(
            s.next(now),
            Some(Action::Status { resource_version: Some(rv) }) if rv == "5"
        ));
        // A template gone from this node is a change too.
        let mut rewritten = lease(ROLE_STATUS, Some("n1"), "6", now);
        rewritten.record = s.mine.clone();
        s.seen(status_name("n1"), rewritten);
        assert_eq!(s.next(now), None);
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: None,
        });
        assert!(matches!(
            s.next(Instant::now() + HOLD),
            Some(Action::Status { .. })
        ));
    }

    /// A halt marker held by `holder` for `id`: `target` failed.
    fn halt(holder: Option<&str>, id: &str, target: &str, rv: &str) -> Seen {
        let mut l = lease(ROLE_HALT, holder, rv, Instant::now());
        l.template = Some(id.into());
        l.target = Some(target.into());
        l.record.templates.insert(
            id.into(),
            Box::new(TemplateStatus {
                failed: Some(Failed {
                    target: target.into(),
                    reason: "ErrImageNeverPull".into(),
                    ..Failed::default()
                }),
                ..TemplateStatus::default()
            }),
        );
        l
    }

    #[test]
    fn the_record_and_the_halt_marker_are_written_before_the_release() {
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
        // Once written (seen back), the halt marker: and while it is not
        // written (refused, say), the slot is not freed.
        let mut mine = lease(ROLE_STATUS, Some("n1"), "8", now);
        mine.record = s.mine.clone();
        s.seen(status_name("n1"), mine);
        let marker = halt_name("n1", "ns/web");
        assert_eq!(
            s.next(now),
            Some(Action::Halt {
                id: "ns/web".into(),
                name: marker.clone(),
                resource_version: None
            })
        );
        assert_eq!(s.next(now + D), s.next(now), "no release before the marker");
        s.seen(marker.clone(), halt(Some("n1"), "ns/web", "t1", "9"));
        assert_eq!(s.next(now), Some(Action::Release { name }));
        // Another node's halt marker reaches the reconciler, once; another
        // node's status record is not what halts.
        let theirs = halt_name("n2", "ns/db");
        s.seen(theirs.clone(), halt(Some("n2"), "ns/db", "t9", "10"));
        s.seen(status_name("n3"), failing("n3", 1, "11", now));
        match s.failed() {
            Some(Answer::Failed(f)) => {
                assert!(f["ns/web"].targets["t1"].contains("node n1: CrashLoopBackOff"));
                assert!(f["ns/db"].targets["t9"].contains("node n2: ErrImageNeverPull"));
                assert!(!f.contains_key("ns/t0"), "{f:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.failed(), None);
    }

    #[test]
    fn waiters_for_a_freed_slot_try_it_one_after_the_other_and_a_starved_one_ahead() {
        let now = Instant::now();
        let name = slot_name("ns/web", 0);
        // Ten waiters see the slot freed at `now`: each tries at its own
        // turn, within SPREAD, not all at once.
        let mut firsts = Vec::new();
        for n in 0..10 {
            let mut s = synced(&format!("w{n}"));
            s.seen(name.clone(), lease(ROLE_SLOT, None, "5", now));
            acquire(&mut s, 1);
            let at = s.wake_at(now).unwrap_or(now);
            assert!(at < now + SPREAD, "{at:?}");
            assert!(s.next(at + Duration::from_millis(1)).is_some());
            firsts.push(at);
        }
        firsts.sort();
        firsts.dedup();
        assert_eq!(firsts.len(), 10, "ten turns, none shared");
        // A waiter that waited past starved_after tries within
        // STARVED_SPREAD, at its turn: ahead of the others, not at once.
        let mut s = synced("w0");
        s.seen(name.clone(), lease(ROLE_SLOT, None, "5", now));
        acquire(&mut s, 1);
        let normal = s.wake_at(now).unwrap() - now;
        let late = now + s.starved_after();
        s.pending.get_mut("ns/web").unwrap().since = now;
        s.seen(name.clone(), lease(ROLE_SLOT, None, "6", late));
        let at = s.wake_at(late).map_or(Duration::ZERO, |at| at - late);
        assert!(at < STARVED_SPREAD, "{at:?}");
        let scaled = normal.mul_f64(STARVED_SPREAD.as_secs_f64() / SPREAD.as_secs_f64());
        assert!(
            at.abs_diff(scaled) < Duration::from_micros(5),
            "the same turn, in the starved window: {at:?} against {scaled:?}"
        );
        assert!(s.next(late + at).is_some(), "waited for a rollout slot");
        s.note_starved(late);
        assert!(s.pending["ns/web"].starved_logged);
    }

    #[test]
    fn a_write_unanswered_in_time_counts_as_done_when_read_back_so() {
        let now = Instant::now();
        let name = slot_name("ns/web", 0);
        let mut s = synced("n1");
        acquire(&mut s, 1);
        let take = Action::Take {
            id: "ns/web".into(),
            name: name.clone(),
            target: "t1".into(),
            resource_version: Some("5".into()),
        };
        s.seen(name.clone(), lease(ROLE_SLOT, None, "5", now));
        assert!(
            !s.landed(&take, Some("5")),
            "read back unchanged: not written"
        );
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n2"), "6", now));
        assert!(!s.landed(&take, Some("5")), "another node took it");
        s.seen(name.clone(), lease(ROLE_SLOT, Some("n1"), "6", now));
        assert!(s.landed(&take, Some("5")), "this node's take went through");
        let release = Action::Release { name: name.clone() };
        assert!(!s.landed(&release, Some("6")));
        s.seen(name.clone(), lease(ROLE_SLOT, None, "7", now));
        assert!(s.landed(&release, Some("6")), "the release went through");
        // A record or a marker is compared with what it should say by next().
        assert!(!s.landed(
            &Action::Status {
                resource_version: None
            },
            None
        ));
    }

    /// A node waiting for the one slot of `ns/web`, seen free `now`: the
    /// ledger, the slot's name, and the node's first turn after `now`.
    fn waiting_at_a_free_slot(now: Instant) -> (Ledger, String, Duration) {
        let name = slot_name("ns/web", 0);
        let mut s = synced("w3");
        s.seen(name.clone(), lease(ROLE_SLOT, None, "5", now));
        acquire(&mut s, 1);
        let first = s.wake_at(now).unwrap() - now;
        (s, name, first)
    }

    /// Two turns computed the same way, to within float rounding.
    fn near(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_micros(5)
    }

    /// The same node asks for another target of the template.
    fn ask_for_another_target(s: &mut Ledger) {
        s.ask(Ask::Acquire {
            id: "ns/web".into(),
            target: "t2".into(),
            slots: 1,
            expires: true,
        });
    }

    #[test]
    fn a_waiter_that_lost_races_waits_longer_at_the_next_freed_slot() {
        let now = Instant::now();
        let (mut s, _, first) = waiting_at_a_free_slot(now);
        s.lost_race("ns/web");
        assert!(
            near(s.wake_at(now).unwrap() - now, first * 2),
            "one race lost"
        );
        for _ in 0..10 {
            s.lost_race("ns/web");
        }
        assert!(
            near(s.wake_at(now).unwrap() - now, first * MAX_BACKOFF),
            "at most MAX_BACKOFF times over"
        );
        // Asked again for the same target: the races lost are kept; for
        // another target they start over.
        acquire(&mut s, 1);
        assert_eq!(s.pending["ns/web"].lost, 11);
        ask_for_another_target(&mut s);
        assert_eq!(s.pending["ns/web"].lost, 0);
    }

    #[test]
    fn a_waiter_passed_over_tries_sooner_at_the_next_freed_slot() {
        let now = Instant::now();
        let (mut s, name, first) = waiting_at_a_free_slot(now);
        // Taken by another node, then freed: passed over once (a third of
        // a pass per lane, one lane of three: the spread is 1 / (1 + 1/3)).
        s.seen(name.clone(), lease(ROLE_SLOT, Some("w1"), "6", now));
        // The same version again (a relist): not a second pass.
        s.seen(name.clone(), lease(ROLE_SLOT, Some("w1"), "6", now));
        s.seen(name.clone(), lease(ROLE_SLOT, None, "7", now));
        assert_eq!(s.pending["ns/web"].passed, 1);
        assert!(near(s.wake_at(now).unwrap() - now, first.mul_f64(0.75)));
        // However often passed over, never narrower than MIN_SPREAD.
        for rv in 10..400 {
            let holder = if rv % 2 == 0 { Some("w1") } else { Some("w2") };
            s.seen(name.clone(), lease(ROLE_SLOT, holder, &rv.to_string(), now));
        }
        s.seen(name.clone(), lease(ROLE_SLOT, None, "400", now));
        let floor = first.mul_f64(MIN_SPREAD.as_secs_f64() / SPREAD.as_secs_f64());
        assert!(near(s.wake_at(now).unwrap() - now, floor), "the floor");
        // A race lost doubles it; lost again and again, it widens to what
        // the races alone would make of the whole spread, no further.
        s.lost_race("ns/web");
        assert!(
            near(s.wake_at(now).unwrap() - now, floor * 2),
            "one race lost"
        );
        for _ in 0..20 {
            s.lost_race("ns/web");
        }
        assert!(near(s.wake_at(now).unwrap() - now, first * MAX_BACKOFF));
        // Asked again for another target: passed over starts over.
        ask_for_another_target(&mut s);
        assert_eq!(s.pending["ns/web"].passed, 0);
    }

    #[test]
    fn slow_answers_widen_the_spread_in_proportion() {
        let now = Instant::now();
        let (mut s, _, first) = waiting_at_a_free_slot(now);
        // Answers within REACH change nothing.
        s.answered(REACH / 2);
        assert!(near(s.wake_at(now).unwrap() - now, first));
        // Answered four times as slowly as REACH, lately: four times wider.
        s.reach = None;
        s.answered(REACH * 4);
        assert!(near(s.wake_at(now).unwrap() - now, first * 4));
        // A moving average: one fast answer moves it a quarter of the way.
        s.answered(Duration::ZERO);
        assert!(near(s.wake_at(now).unwrap() - now, first * 3));
        // However slow, never wider than the races alone would make it.
        s.answered(Duration::from_secs(3600));
        assert!(near(s.wake_at(now).unwrap() - now, first * MAX_BACKOFF));
    }

    /// A record naming `failures` failed targets of `template`s, held by
    /// `holder`.
    fn failing(holder: &str, failures: usize, rv: &str, now: Instant) -> Seen {
        let mut l = lease(ROLE_STATUS, Some(holder), rv, now);
        for i in 0..failures {
            l.record.templates.insert(
                format!("ns/t{i}"),
                Box::new(TemplateStatus {
                    phase: "failed".into(),
                    message: Some("x".repeat(10_000)),
                    failed: Some(Failed {
                        target: "t1".into(),
                        reason: "CrashLoopBackOff".into(),
                        message: "y".repeat(10_000),
                        ..Failed::default()
                    }),
                    ..TemplateStatus::default()
                }),
            );
        }
        l
    }

    #[test]
    fn a_record_its_own_node_cannot_have_written_halts_nothing() {
        let now = Instant::now();
        let mut s = synced("n1");
        // Halt markers held by n2 under n3's name, held by nobody, for
        // another template than their name says, or n1's own name taken
        // by n2: each says ns/web's target t1 failed.
        let n3 = halt_name("n3", "ns/web");
        s.seen(n3.clone(), halt(Some("n2"), "ns/web", "t1", "1"));
        let n4 = halt_name("n4", "ns/web");
        s.seen(n4.clone(), halt(None, "ns/web", "t1", "2"));
        let other = halt_name("n2", "ns/db");
        s.seen(other.clone(), halt(Some("n2"), "ns/web", "t1", "3"));
        let n1 = halt_name("n1", "ns/web");
        s.seen(n1.clone(), halt(Some("n2"), "ns/web", "t1", "4"));
        // Another node's status record, even its own, halts nothing.
        s.seen(status_name("n2"), failing("n2", 1, "5", now));
        assert_eq!(s.failed(), Some(Answer::Failed(BTreeMap::new())));
        // The marker under its own node's name counts.
        let n2 = halt_name("n2", "ns/web");
        s.seen(n2.clone(), halt(Some("n2"), "ns/web", "t1", "6"));
        match s.failed() {
            Some(Answer::Failed(f)) => {
                assert_eq!(f.len(), 1, "{f:?}");
                assert!(f["ns/web"].targets["t1"].starts_with("node n2: ErrImageNeverPull"));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A halt marker as the API has it: held by `holder`, named for it,
    /// `target` failed, `change` in its annotation when given.
    fn marker_json(holder: &str, target: &str, change: Option<&str>) -> serde_json::Value {
        let failed = Failed {
            target: target.into(),
            reason: "CrashLoopBackOff".into(),
            ..Failed::default()
        };
        let mut lease = serde_json::to_value(super::super::lease::halt_lease(
            halt_name(holder, "ns/web"),
            holder,
            "ns/web",
            &Failed {
                change: change.map(str::to_string),
                ..failed
            },
            "rollouts",
            None,
        ))
        .unwrap();
        lease["metadata"]["resourceVersion"] = format!("{holder}-{target}").into();
        lease
    }

    /// The change of a target that failed on another node halts this one's
    /// other targets of it; a marker without one (an older daemon's, or
    /// rewritten once its node confirmed a fixed target) halts its own
    /// target only; a forged one halts nothing; and a change this node
    /// itself failed is held here by its own target only.
    #[test]
    fn a_marker_halts_its_change_on_the_others_and_without_one_its_target_only() {
        let now = Instant::now();
        let mut s = synced("n1");
        let see = |s: &mut Ledger, value: serde_json::Value| {
            let (name, seen) = read_lease(&value, now, D).unwrap();
            s.seen(name, seen);
        };
        let json = marker_json("n2", "t2", Some("c2"));
        assert_eq!(
            json["metadata"]["annotations"][crate::fleet::CHANGE_ANNOTATION],
            "c2"
        );
        see(&mut s, json);
        // An older daemon's marker: no change annotation.
        see(&mut s, marker_json("n3", "t3", None));
        // n4's marker, held by n5: forged, whatever change it names.
        let mut forged = marker_json("n4", "t4", Some("c4"));
        forged["spec"]["holderIdentity"] = "n5".into();
        see(&mut s, forged);
        let halts = match s.failed() {
            Some(Answer::Failed(f)) => f["ns/web"].clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            halts.targets.keys().collect::<Vec<_>>(),
            ["t2", "t3"],
            "{halts:?}"
        );
        assert_eq!(
            halts.changes.keys().collect::<Vec<_>>(),
            ["c2"],
            "{halts:?}"
        );
        assert!(halts.changes["c2"].starts_with("node n2 (its target t2): CrashLoopBackOff"));
        assert_eq!(
            halts.halts("t3-n1", None),
            None,
            "no change known: by target"
        );
        assert!(halts.halts("t2-n1", Some("c2")).is_some());
        assert_eq!(halts.halts("t3-n1", Some("c3")), None);

        // This node failed change c2 too (its own target t2-n1): held here
        // by that target, not by n2's change, so a fix of its own settings
        // may be tried.
        s.ask(Ask::Report {
            id: "ns/web".into(),
            status: Some(Box::new(TemplateStatus {
                phase: "failed".into(),
                failed: Some(Failed {
                    target: "t2-n1".into(),
                    change: Some("c2".into()),
                    reason: "CrashLoopBackOff".into(),
                    ..Failed::default()
                }),
                ..TemplateStatus::default()
            })),
        });
        // (Its own record counts once written: seen back.)
        let mut mine = lease(ROLE_STATUS, Some("n1"), "20", now);
        mine.record = s.mine.clone();
        s.seen(status_name("n1"), mine);
        let halts = match s.failed() {
            Some(Answer::Failed(f)) => f["ns/web"].clone(),
            other => panic!("{other:?}"),
        };
        assert!(halts.targets.contains_key("t2-n1"), "{halts:?}");
        assert!(halts.changes.is_empty(), "{halts:?}");
        // Its marker names the change; once its record stops naming it (a
        // fixed target of the change confirmed here), the marker is
        // written again, without it.
        assert!(matches!(s.next(now), Some(Action::Halt { .. })));
        see(&mut s, marker_json("n1", "t2-n1", Some("c2")));
        assert_eq!(s.next(now), None, "the marker says what failed here");
        s.mine
            .templates
            .get_mut("ns/web")
            .unwrap()
            .failed
            .as_mut()
            .unwrap()
            .change = None;
        let mut mine = lease(ROLE_STATUS, Some("n1"), "21", now);
        mine.record = s.mine.clone();
        s.seen(status_name("n1"), mine);
        assert!(
            matches!(
                s.next(now),
                Some(Action::Halt {
                    resource_version: Some(_),
                    ..
                })
            ),
            "rewritten without the change"
        );
        let rewritten = marker_json("n1", "t2-n1", None);
        assert!(
            rewritten["metadata"]["annotations"]
                .get(crate::fleet::CHANGE_ANNOTATION)
                .is_none()
        );
        see(&mut s, rewritten);
        assert_eq!(s.next(now), None);
    }

    #[test]
    fn halt_markers_kept_are_capped_per_node_and_in_all() {
        let mut s = synced("n1");
        for t in 0..(MAX_HALTS_PER_NODE + 10) {
            let id = format!("ns/t{t}");
            let name = halt_name("n2", &id);
            s.seen(name.clone(), halt(Some("n2"), &id, "t1", &t.to_string()));
        }
        let kept = s.leases.values().filter(|l| l.role == ROLE_HALT).count();
        assert_eq!(kept, MAX_HALTS_PER_NODE);
        assert!(s.halts_capped);
        // Another node's still count.
        let name = halt_name("n3", "ns/web");
        s.seen(name.clone(), halt(Some("n3"), "ns/web", "t1", "x"));
        assert!(s.leases.contains_key(&name));
    }

    #[test]
    fn what_is_kept_of_another_nodes_record_is_bounded() {
        let now = Instant::now();
        let mut s = synced("n1");
        s.seen(status_name("n2"), failing("n2", 1_000, "1", now));
        let kept = &s.leases[&status_name("n2")].record;
        assert_eq!(kept.templates.len(), super::super::lease::MAX_FAILURES_KEPT);
        for status in kept.templates.values() {
            let failed = status.failed.as_ref().unwrap();
            assert!(failed.message.len() < 300, "{}", failed.message.len());
            assert_eq!(status.message, None, "only the failure is kept");
        }
        // A record over the size limit is not parsed at all.
        let huge = NodeStatus {
            version: 1,
            templates: failing("n5", 40, "0", now).record.templates,
        }
        .to_json();
        assert!(huge.len() > super::super::lease::MAX_RECORD_BYTES);
        let value = serde_json::json!({
            "metadata": {"name": status_name("n5"), "resourceVersion": "7",
                "labels": {crate::fleet::ROLE_LABEL: ROLE_STATUS},
                "annotations": {crate::fleet::STATUS_ANNOTATION: huge}},
            "spec": {"holderIdentity": "n5"}
        });
        let (name, seen) = read_lease(&value, now, D).unwrap();
        assert!(seen.record.templates.is_empty());
        s.seen(name, seen);
        match s.failed() {
            Some(Answer::Failed(f)) => {
                assert!(
                    !f.values()
                        .any(|t| t.targets.values().any(|w| w.contains("n5")))
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(test)]
#[path = "ledger_props.rs"]
mod props;
