//! Rollouts on this node, decided as data: a sans-IO [`Machine`] that takes
//! what happened (a render's outcome, a mirror pod's status, the
//! coordinator's answer, the clock) and returns the [`Effect`]s to carry
//! out (write a revision back, save the state a restart needs, ask the
//! coordinator, report an Event or a metric). The reconciler is its shell:
//! it renders and writes, feeds the machine, and does what it says.
//!
//! One concern per file: `machine` (the rules), `effect` (what it asks
//! for), `tracker` (one template's rollout: written → running → ready, or
//! failed, with its deadline), `slots` (rollouts across nodes, as this node
//! sees them), `state` (what a restart must know), `local` (what the node
//! itself shows of a pod, and the rules that judge it, for when the mirror
//! pod cannot be followed).
//!
//! A new source of evidence about what the kubelet runs (say, the container
//! runtime while the API server is down) is one more input method of the
//! machine, tested in `machine_tests.rs` without an API server or files.

mod effect;
pub mod local;
mod machine;
mod slots;
mod state;
mod tracker;

pub use effect::Effect;
pub use machine::{DISAGREE_AFTER, Gated, InPlace, Machine};
pub use state::RolloutState;
pub use tracker::{DEADLINE_ANNOTATION, DEADLINE_EXCEEDED, DEFAULT_DEADLINE, Phase, STABLE};
