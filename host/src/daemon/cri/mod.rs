//! What the container runtime runs for podstamp's static pods, read over
//! its CRI socket: the node's own evidence of a revision's pod for when its
//! mirror pod cannot be followed (the API server down; see
//! [`super::rollout::local`]).
//!
//! One concern per file: `client` (the socket and the read-only calls),
//! `read` (what the runtime's answers and the pod's own spec say of one
//! revision, as [`super::rollout::local::LocalContainer`]s; pure).
//!
//! Invariants:
//! * Read only: List and Status calls (`ListPodSandbox`, `ListContainers`,
//!   `ContainerStatus`, `ImageStatus`, `Version`), never a call that
//!   creates, stops or removes anything. The socket itself cannot be
//!   mounted read-only in any meaningful way (a unix socket is written to
//!   by every call), so this module is what confines podstamp to reading.
//! * A sandbox is tied to a revision by the labels the kubelet copies from
//!   the static pod's own `metadata.labels` (`podstamp.io/revision`) and
//!   the annotations it copies from `metadata.annotations`
//!   (`podstamp.io/source`): the kubelet puts the pod's labels on its
//!   sandbox, and its `io.kubernetes.pod.*` labels beside them. The
//!   kubelet's `kubernetes.io/config.hash` (a hash of the file's content,
//!   also the static pod's UID) is on the sandbox's annotations too, but
//!   says nothing podstamp cannot read from its own label.
//! * Every call has a deadline ([`client::CALL_TIMEOUT`]): a runtime that
//!   does not answer is an error, never a hang of the rollout's shell.

pub mod client;
pub mod read;

pub use client::{Cri, CriError};
pub use read::{Seen, SeenContainer, SeenSandbox, containers};
