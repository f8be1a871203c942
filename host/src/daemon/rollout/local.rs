//! Local evidence: what the node itself shows of a revision's pod, for
//! when its mirror pod cannot be followed (the API server down, which is
//! the rule when the template is the API server or its etcd), and the
//! rules that turn it into the phase the rollout tracker takes
//! ([`judge`]).
//!
//! Sans-IO: no runtime is read here. A shell not built yet (the container
//! runtime's CRI over its local socket, read-only, and the pod's own
//! probes run as the kubelet would) fills [`LocalPodState`]; the machine
//! takes it through [`super::Machine::local`].
//!
//! The rules, in order (the first that applies):
//! 1. No ready sandbox for the revision (none, or only one the kubelet
//!    stopped: the revision's pod from before another replaced it):
//!    `written` (the kubelet has not acted on the file yet; the progress
//!    deadline judges it, and the tracker tells the kubelet's stall from a
//!    failure: [`super::tracker::KUBELET_NOT_STARTED`]).
//! 2. A container whose image is not present (a pull that failed, or
//!    `imagePullPolicy: Never` without it): `failed`, `ImageNotPresent`.
//! 3. A container that exited non-zero and was restarted at least
//!    [`CRASH_LOOP_RESTARTS`] times: `failed`, `CrashLoopBackOff`, with its
//!    exit code and restart count.
//! 4. A declared probe (startup or readiness) that failed its own
//!    `failureThreshold` times in a row: `failed`, `ProbeFailed`.
//! 5. Every container running, and every declared probe passing (or none
//!    declared, as the kubelet calls a pod without probes Ready once it
//!    runs): `ready` (a success once it stays so for the tracker's STABLE).
//! 6. Otherwise (created, starting, exited and not yet restarted enough,
//!    probes not yet passing): `running`, and the progress deadline judges
//!    it (`ProgressDeadlineExceeded`).
//!
//! Invariant: evidence of another revision than the one in place never
//! judges it (the tracker's rule), and evidence is only an input while the
//! mirror pod cannot be followed: the mirror pod, when followed, decides.

use crate::daemon::inbox::PodState;

/// Restarts after which a container exiting non-zero is a crash loop: the
/// kubelet's own `CrashLoopBackOff` starts after the first restart's
/// back-off; two is one crash more, so one unlucky exit does not roll back.
pub const CRASH_LOOP_RESTARTS: u32 = 2;

/// What the node shows of one revision's pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalPodState {
    /// The runtime has a ready sandbox for the revision (the kubelet acted
    /// on the file).
    pub sandbox: bool,
    pub containers: Vec<LocalContainer>,
    /// The pod's declared startup and readiness probes, as run locally.
    pub probes: Vec<LocalProbe>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalContainer {
    pub name: String,
    pub state: ContainerState,
    pub restart_count: u32,
    /// Its image is not present and cannot be (the runtime's reason and
    /// message); None when it is, or is still being pulled.
    pub image_missing: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Created (or being created), not started.
    Created,
    Running,
    Exited {
        code: i32,
    },
}

/// One declared probe's record, run as the kubelet would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProbe {
    /// `startup` or `readiness`, and the container's name.
    pub what: String,
    /// Its last result passed.
    pub passing: bool,
    /// Failures in a row, and the probe's own `failureThreshold`.
    pub failures: u32,
    pub failure_threshold: u32,
    /// What the last failure said (status code, refused connection).
    pub message: String,
}

/// The phase local evidence shows ([`PodState`], as a mirror pod's status
/// would say it). See the module's rules.
pub fn judge(pod: &LocalPodState) -> PodState {
    if !pod.sandbox {
        return PodState::Pending;
    }
    if let Some(c) = pod.containers.iter().find(|c| c.image_missing.is_some()) {
        return PodState::Failed {
            reason: "ImageNotPresent".into(),
            message: format!(
                "container {}: {}",
                c.name,
                c.image_missing.as_deref().unwrap_or_default()
            ),
        };
    }
    if let Some((c, code)) = pod.containers.iter().find_map(|c| match c.state {
        ContainerState::Exited { code } if code != 0 && c.restart_count >= CRASH_LOOP_RESTARTS => {
            Some((c, code))
        }
        _ => None,
    }) {
        return PodState::Failed {
            reason: "CrashLoopBackOff".into(),
            message: format!(
                "container {} exited with code {code}, restarted {} times (seen on the node)",
                c.name, c.restart_count
            ),
        };
    }
    if let Some(p) = pod
        .probes
        .iter()
        .find(|p| !p.passing && p.failures >= p.failure_threshold.max(1))
    {
        return PodState::Failed {
            reason: "ProbeFailed".into(),
            message: format!(
                "{} probe failed {} times in a row (failureThreshold {}): {}",
                p.what, p.failures, p.failure_threshold, p.message
            ),
        };
    }
    let running = !pod.containers.is_empty()
        && pod
            .containers
            .iter()
            .all(|c| c.state == ContainerState::Running);
    if running && pod.probes.iter().all(|p| p.passing) {
        PodState::Ready
    } else {
        PodState::Running
    }
}
