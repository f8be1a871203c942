//! Property-based: honest nodes' ledgers sharing one simulated API server
//! (writes conditional on the resourceVersion, every change delivered to
//! every node's watch at once) while an attacker writes any Lease contents
//! it likes — any name, role label, holder (or none), duration, record —
//! without conditions: slots, status records and halt markers. Whatever it
//! writes:
//! * at most `max-unavailable` honest nodes hold a slot of the template at
//!   any time;
//! * no honest node is halted by a failure that an honest node did not
//!   report: only the attacker's own record (its name, itself as holder)
//!   may say a target failed.
//!
//! Left out on purpose: a record that impersonates an honest node whole
//! (its name and it as holder). Its contents cannot tell it from the real
//! one; the admission policy refuses its write (tests/node_identity.rs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::daemon::coordinator::lease::Seen;
use crate::fleet::{Failed, TemplateStatus};

const D: Duration = Duration::from_secs(30);
const ID: &str = "ns/web";
const ATTACKER: &str = "evil";

/// What the attacker writes.
#[derive(Debug, Clone)]
struct Forged {
    /// 0, 1: a slot of the template; 2: an honest node's record name; 3:
    /// its own record name; 4: another name; 5: an honest node's halt
    /// marker name; 6: its own halt marker name.
    name: u8,
    node: usize,
    /// 0: none; 1: an honest node; 2: itself; 3: a stranger.
    holder: u8,
    holder_node: usize,
    role: u8,
    seconds: u64,
    failing: bool,
}

#[derive(Debug, Clone)]
enum Step {
    /// Honest node `n` makes its next write, if any.
    Write(usize),
    Forge(Forged),
    /// Time passes.
    Wait(u64),
}

fn forged() -> impl Strategy<Value = Forged> {
    (
        0u8..7,
        0usize..4,
        0u8..4,
        0usize..4,
        0u8..4,
        prop_oneof![Just(1u64), Just(30), Just(i32::MAX as u64), 0u64..100_000],
        any::<bool>(),
    )
        .prop_map(
            |(name, node, holder, holder_node, role, seconds, failing)| Forged {
                name,
                node,
                holder,
                holder_node,
                role,
                seconds,
                failing,
            },
        )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..4).prop_map(Step::Write),
        2 => forged().prop_map(Step::Forge),
        1 => (0u64..40_000).prop_map(Step::Wait),
    ]
}

fn node(i: usize) -> String {
    format!("n{i}")
}

/// A Lease as the API holds it, as a node's watch would read it.
fn object(
    role: &str,
    holder: Option<&str>,
    duration: Duration,
    record: NodeStatus,
    rv: u64,
    now: Instant,
) -> Seen {
    Seen {
        role: role.into(),
        holder: holder.map(str::to_string),
        duration,
        template: Some(ID.into()),
        target: Some("t1".into()),
        record,
        owner: None,
        transitions: 0,
        acquired: None,
        resource_version: rv.to_string(),
        observed: now,
    }
}

struct World {
    nodes: Vec<Ledger>,
    api: BTreeMap<String, Seen>,
    rv: u64,
    now: Instant,
    max_unavailable: u32,
}

impl World {
    fn new(n: usize, max_unavailable: u32) -> World {
        let now = Instant::now();
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut l = Ledger::new(node(i), D);
            l.list_done(Instant::now());
            l.ask(Ask::Acquire {
                id: ID.into(),
                target: "t1".into(),
                slots: max_unavailable,
                expires: true,
            });
            nodes.push(l);
        }
        World {
            nodes,
            api: BTreeMap::new(),
            rv: 0,
            now,
            max_unavailable,
        }
    }

    /// Stores `lease` under `name` and delivers it to every watch.
    fn put(&mut self, name: &str, mut lease: Seen) {
        self.rv += 1;
        lease.resource_version = self.rv.to_string();
        lease.observed = self.now;
        self.api.insert(name.to_string(), lease.clone());
        for l in &mut self.nodes {
            l.seen(name.to_string(), lease.clone());
            l.lost();
        }
    }

    fn forge(&mut self, f: &Forged) {
        let n = self.nodes.len();
        let name = match f.name {
            0 => slot_name(ID, 0),
            1 => slot_name(ID, 1),
            2 => status_name(&node(f.node % n)),
            3 => status_name(ATTACKER),
            5 => halt_name(&node(f.node % n), ID),
            6 => halt_name(ATTACKER, ID),
            _ => format!("podstamp-other.{}", f.node),
        };
        let holder = match f.holder {
            0 => None,
            1 => Some(node(f.holder_node % n)),
            2 => Some(ATTACKER.to_string()),
            _ => Some("stranger".to_string()),
        };
        // The whole impersonation is the policy's to refuse (see above).
        if (f.name == 2 || f.name == 5) && holder.as_deref() == Some(node(f.node % n).as_str()) {
            return;
        }
        let role = [ROLE_SLOT, ROLE_STATUS, ROLE_HALT, ""][f.role as usize];
        let mut record = NodeStatus::default();
        if f.failing {
            record.templates.insert(
                ID.into(),
                Box::new(TemplateStatus {
                    phase: "failed".into(),
                    failed: Some(Failed {
                        target: "t1".into(),
                        reason: "Forged".into(),
                        ..Failed::default()
                    }),
                    ..TemplateStatus::default()
                }),
            );
        }
        let lease = object(
            role,
            holder.as_deref(),
            Duration::from_secs(f.seconds),
            record,
            0,
            self.now,
        );
        self.put(&name, lease);
    }

    /// Node `i`'s next write, made as the API server makes it: refused
    /// (409) unless the resourceVersion it was read at is the current one.
    fn write(&mut self, i: usize) {
        let Some(action) = self.nodes[i].next(self.now) else {
            return;
        };
        let me = self.nodes[i].me.clone();
        let current = |api: &BTreeMap<String, Seen>, name: &str| {
            api.get(name).map(|l| l.resource_version.clone())
        };
        let (name, expected, lease) = match &action {
            Action::Status { resource_version } => {
                let name = self.nodes[i].status_name();
                let record = self.nodes[i].mine.clone();
                let lease = object(ROLE_STATUS, Some(&me), D, record, 0, self.now);
                (name, resource_version.clone(), lease)
            }
            Action::Halt {
                name,
                resource_version,
                ..
            } => {
                let record = self.nodes[i].mine.clone();
                let lease = object(ROLE_HALT, Some(&me), D, record, 0, self.now);
                (name.clone(), resource_version.clone(), lease)
            }
            Action::Release { name } => {
                let rv = self.nodes[i]
                    .leases
                    .get(name)
                    .map(|l| l.resource_version.clone());
                let lease = object(ROLE_SLOT, None, D, NodeStatus::default(), 0, self.now);
                (name.clone(), rv, lease)
            }
            Action::Renew { name, .. } => {
                let rv = self.nodes[i]
                    .leases
                    .get(name)
                    .map(|l| l.resource_version.clone());
                let lease = object(ROLE_SLOT, Some(&me), D, NodeStatus::default(), 0, self.now);
                (name.clone(), rv, lease)
            }
            Action::Take {
                name,
                resource_version,
                ..
            } => {
                let lease = object(ROLE_SLOT, Some(&me), D, NodeStatus::default(), 0, self.now);
                (name.clone(), resource_version.clone(), lease)
            }
        };
        if current(&self.api, &name) == expected {
            self.put(&name, lease);
            after(&mut self.nodes[i], &action);
        } else if name == self.nodes[i].status_name() {
            // As the task does: its own record is read back by name.
            if let Some(lease) = self.api.get(&name).cloned() {
                self.nodes[i].seen(name.clone(), lease);
            } else {
                self.nodes[i].leases.remove(&name);
            }
            self.nodes[i].conflicted.remove(&name);
        } else {
            let rv = self.nodes[i]
                .leases
                .get(&name)
                .map(|l| l.resource_version.clone())
                .unwrap_or_default();
            self.nodes[i].conflicted.insert(name, rv);
        }
    }

    fn check(&mut self) -> Result<(), TestCaseError> {
        let holding = self
            .nodes
            .iter()
            .filter(|l| l.held.contains_key(ID))
            .count();
        prop_assert!(
            holding <= self.max_unavailable as usize,
            "{holding} honest nodes hold a slot, max-unavailable {}",
            self.max_unavailable
        );
        for l in &mut self.nodes {
            l.failed_sent = None;
            if let Some(Answer::Failed(failed)) = l.failed() {
                for (id, halts) in &failed {
                    for why in halts.targets.values().chain(halts.changes.values()) {
                        prop_assert!(
                            why.starts_with(&format!("node {ATTACKER}:"))
                                || why.starts_with(&format!("node {ATTACKER} (")),
                            "{} halted {id} on a record no honest node wrote: {why}",
                            l.me
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn forged_leases_neither_widen_a_rollout_nor_halt_it_in_an_honest_nodes_name(
        max_unavailable in 1u32..3,
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let mut world = World::new(4, max_unavailable);
        for step in &steps {
            match step {
                Step::Write(i) => world.write(*i),
                Step::Forge(f) => world.forge(f),
                Step::Wait(ms) => world.now += Duration::from_millis(*ms),
            }
            world.check()?;
        }
    }
}
