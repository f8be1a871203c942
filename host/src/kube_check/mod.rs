//! The kubelet's own decision on a manifest, asked before it is written.
//!
//! podstamp never writes a manifest that the node's kubelet refuses: a
//! refused file makes the kubelet stop the pod that ran from it (it drops
//! static pods whose files it cannot read at its next listing). Whether the
//! kubelet accepts a file is decided by Kubernetes' own code, not by rules
//! written again here: `podstamp-kubecheck` (tests/harness/cmd/podstamp-kubecheck),
//! a Go program built from the Kubernetes release the tests' kubelet is built
//! from, runs the kubelet's file decoder (`tryDecodeSinglePod`: decode,
//! defaults, `ValidatePodCreate`, the static-pod checks) on the manifest's
//! exact bytes. podstamp's own checks (validate.rs) run first and keep their
//! messages; this is the check after them, on what would be written.
//!
//! Invariants:
//! - A verdict is for the exact bytes and node name asked about: it is
//!   memoized by the sha256 of both (`memo`), never by anything coarser.
//! - No check, no write: when the helper cannot be found, started or does not
//!   answer, the check fails ([`Unavailable`]) and the caller writes nothing.
//! - The helper is a child of this process, confined (`helper`): no
//!   environment but its Go settings, no files but its pipes, nobody's uid
//!   when podstamp runs as root, one call at a time, each bounded in time; it
//!   is stopped by its pid after [`Settings::linger`] without a call, so an
//!   idle podstamp holds no helper.
//! - The helper is found once per process (`locate`, looked for again while
//!   it is missing): in a place only root or this user can write.
//! - Version skew is reported, never guessed: for a node whose kubelet is
//!   older than the release the helper speaks for, the helper lists the
//!   fields that kubelet would not honour (Kubernetes' own
//!   `DropDisabledPodFields` with the feature gates as they were in that
//!   release); each write of such a manifest is a warning naming them and
//!   counts in [`KubeCheck::newer_counts`], and with
//!   `PODSTAMP_REFUSE_NEWER_FIELDS=true` a refusal.
//! - The same helper answers the Pod Security request ([`pod_security`],
//!   [`KubeCheck::pod_security`]): Kubernetes' own Pod Security checks at a
//!   level and version, memoized by the sha256 of both and the bytes. A
//!   helper that predates the request (its hello has no `podSecurity`) is
//!   never sent one: the check is [`Unavailable`], nothing is written.
//! - A write held to a level asks both in one request when neither verdict
//!   is memoized ([`KubeCheck::check_held`]): one round trip and one decode
//!   instead of two; each verdict is memoized under its own key, exactly as
//!   if asked alone, and the Pod Security verdict counts only for a pod the
//!   kubelet accepts. A helper whose hello lacks `both` is asked in turn.
//!
//! One concern per file: `locate` (where the helper is), `helper` (the child
//! process and its protocol), `verdict` (its answer → podstamp's messages),
//! `pod_security` (the Pod Security request and verdict), `memo` (verdicts
//! by digest), `prefetch` (many questions asked at once, for a pass).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod helper;
mod locate;
mod memo;
pub mod pod_security;
mod prefetch;
mod verdict;

pub use locate::{ENV_VAR, HELPER_NAME, IMAGE_PATH};
pub use pod_security::{Level, Policy, Violation};
pub use prefetch::{MAX_IN_FLIGHT, Prefetch, Question};
pub use verdict::Refusal;

use helper::Helper;
use memo::Memo;

/// The largest manifest the kubelet reads (pkg/kubelet/config maxConfigLength).
pub const KUBELET_MAX_FILE: usize = 10 << 20;
/// Set to `true` to refuse a manifest with fields newer than the node's
/// kubelet (default: a warning).
pub const REFUSE_NEWER_ENV: &str = "PODSTAMP_REFUSE_NEWER_FIELDS";
/// The most nodes [`KubeCheck::newer_counts`] tells apart (a daemon has one;
/// `render` one per call).
const MAX_NODES_COUNTED: usize = 64;

/// How the helper is run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The helper binary; None: found by [`locate::find`].
    pub path: Option<PathBuf>,
    /// The longest one call may take, the helper's start included.
    pub call_timeout: Duration,
    /// How long the helper stays after its last call.
    pub linger: Duration,
    /// Refuse, rather than warn about, fields newer than the node's kubelet.
    pub refuse_newer: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            path: None,
            call_timeout: Duration::from_secs(5),
            linger: Duration::from_secs(10),
            refuse_newer: false,
        }
    }
}

impl Settings {
    /// The defaults, with [`REFUSE_NEWER_ENV`] from the environment.
    pub fn from_env() -> Settings {
        let refuse_newer = std::env::var(REFUSE_NEWER_ENV)
            .is_ok_and(|v| matches!(v.as_str(), "true" | "1" | "yes"));
        Settings {
            refuse_newer,
            ..Settings::default()
        }
    }
}

/// Why no verdict could be had: nothing is written then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("podstamp cannot check the pod as the kubelet would, so it is not written: {0}")]
    Unavailable(#[from] Unavailable),
}

/// What a Pod Security check found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodSecurityError {
    #[error(transparent)]
    Violated(#[from] Violation),
    #[error(
        "podstamp cannot check the pod against its Pod Security level, so it is not written: {0}"
    )]
    Unavailable(#[from] Unavailable),
}

/// Which request a call makes (a helper is sent only the ones it knows).
#[derive(Debug, Clone, Copy)]
enum Request {
    Kubelet,
    PodSecurity,
    Both,
}

/// The combined request's parts (see the helper's protocol).
fn both_request<'a>(
    node: &'a str,
    kubelet: &'a str,
    policy: &'a Policy,
    manifest: &'a [u8],
) -> [&'a [u8]; 6] {
    [
        b"\x02both",
        node.as_bytes(),
        kubelet.as_bytes(),
        policy.level.as_str().as_bytes(),
        policy.version().as_bytes(),
        manifest,
    ]
}

/// The combined answer's two verdicts, each as its own request's answer.
fn split_both(answer: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    #[derive(serde::Deserialize)]
    struct Both {
        kubelet: serde_json::Value,
        #[serde(rename = "podSecurity")]
        pod_security: serde_json::Value,
    }
    let both: Both = serde_json::from_slice(answer)
        .map_err(|e| format!("the pod check answered something that is not both verdicts: {e}"))?;
    let text = |v: &serde_json::Value| serde_json::to_vec(v).map_err(|e| e.to_string());
    Ok((text(&both.kubelet)?, text(&both.pod_security)?))
}

/// The check, shared by every render of a process.
pub struct KubeCheck {
    settings: Settings,
    state: Arc<Mutex<State>>,
    /// Manifests with fields newer than their node's kubelet, by node.
    newer: Mutex<BTreeMap<String, u64>>,
}

struct State {
    /// The helper's path, once found (or why it was not, the last time).
    path: Option<Result<PathBuf, Unavailable>>,
    helper: Option<Helper>,
    /// Counts helpers started, so that a reaper stops only its own.
    generation: u64,
    memo: Memo<Result<Vec<String>, Refusal>>,
    /// Pod Security verdicts, by [`memo::pod_security_key`].
    pod_security_memo: Memo<Result<(), Violation>>,
    /// The Kubernetes release the last helper said it checks for.
    kubernetes: Option<String>,
}

impl KubeCheck {
    pub fn new(settings: Settings) -> KubeCheck {
        KubeCheck {
            settings,
            state: Arc::new(Mutex::new(State {
                path: None,
                helper: None,
                generation: 0,
                memo: Memo::default(),
                pod_security_memo: Memo::default(),
                kubernetes: None,
            })),
            newer: Mutex::new(BTreeMap::new()),
        }
    }

    /// The process's check, with the default [`Settings`] (the helper from
    /// `$PODSTAMP_KUBECHECK` or found beside the binary).
    pub fn shared() -> &'static KubeCheck {
        static SHARED: OnceLock<KubeCheck> = OnceLock::new();
        SHARED.get_or_init(|| KubeCheck::new(Settings::from_env()))
    }

    /// The Kubernetes release the helper checks for, once it has run.
    pub fn kubernetes_version(&self) -> Option<String> {
        self.lock().kubernetes.clone()
    }

    /// Manifests checked for writing that have fields newer than their
    /// node's kubelet, by node name (`podstamp_kubelet_newer_fields_total`).
    pub fn newer_counts(&self) -> BTreeMap<String, u64> {
        self.newer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many verdicts came from the memo, and how many from the helper.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.memo.hits(), state.memo.misses())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst a helper to restart.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Would the kubelet of node `node` (its version `kubelet`, when known)
    /// accept `manifest` as a static pod file? Fields newer than that
    /// kubelet are a warning (counted), or a refusal with
    /// [`Settings::refuse_newer`].
    pub fn check(
        &self,
        node: &str,
        kubelet: Option<&str>,
        manifest: &[u8],
    ) -> Result<(), CheckError> {
        if manifest.len() > KUBELET_MAX_FILE {
            return Err(Refusal::too_large(manifest.len(), KUBELET_MAX_FILE).into());
        }
        let kubelet = kubelet.unwrap_or_default();
        let (verdict, kubernetes) = {
            let mut state = self.lock();
            let verdict = self.kubelet_verdict(&mut state, node, kubelet, manifest)?;
            (verdict, state.kubernetes.clone().unwrap_or_default())
        };
        self.conclude(node, kubelet, verdict, &kubernetes)
    }

    /// What a write held to `policy` needs: [`KubeCheck::check`], then
    /// [`KubeCheck::pod_security`] when the kubelet accepts the pod; the
    /// outer error is the kubelet check's, the inner the Pod Security one's.
    /// When neither verdict is memoized, the helper answers both in one
    /// request (one round trip, one decode of the manifest), each verdict
    /// then memoized on its own as its own request's would be; a helper
    /// without the combined request is asked each question in turn.
    pub fn check_held(
        &self,
        node: &str,
        kubelet: Option<&str>,
        manifest: &[u8],
        policy: &Policy,
    ) -> Result<Result<(), PodSecurityError>, CheckError> {
        if manifest.len() > KUBELET_MAX_FILE {
            return Err(Refusal::too_large(manifest.len(), KUBELET_MAX_FILE).into());
        }
        let kubelet = kubelet.unwrap_or_default();
        let key = memo::key(node, kubelet, manifest);
        let security_key =
            memo::pod_security_key(policy.level.as_str(), policy.version(), manifest);
        let (verdict, kubernetes, security) = {
            let mut state = self.lock();
            let neither_known = state.memo.peek(&key).is_none()
                && state.pod_security_memo.peek(&security_key).is_none();
            // Both verdicts from one request, or the kubelet's alone (the
            // Pod Security one then asked below, if the kubelet accepts).
            let (verdict, security) = if neither_known && self.helper_answers_both(&mut state)? {
                let parts = both_request(node, kubelet, policy, manifest);
                let answer = self.ask_parts(&mut state, &parts, Request::Both)?;
                let (kubelet_answer, security_answer) = split_both(&answer).map_err(Unavailable)?;
                let kubernetes = state.kubernetes.clone().unwrap_or_default();
                let verdict = verdict::parse(&kubelet_answer, &kubernetes).map_err(Unavailable)?;
                state.memo.record_miss(key, verdict.clone());
                let security = pod_security::parse(&security_answer, policy).inspect(|security| {
                    state
                        .pod_security_memo
                        .record_miss(security_key, security.clone());
                });
                (verdict, Some(security.map_err(Unavailable)))
            } else {
                (
                    self.kubelet_verdict(&mut state, node, kubelet, manifest)?,
                    None,
                )
            };
            // The Pod Security verdict only for a pod the kubelet accepts,
            // as when asked in turn.
            let security = match (&verdict, security) {
                (Err(_), _) => Ok(()),
                (Ok(_), Some(answered)) => answered
                    .map_err(PodSecurityError::from)
                    .and_then(|v| v.map_err(PodSecurityError::from)),
                (Ok(_), None) => self
                    .security_verdict(&mut state, policy, manifest)
                    .map_err(PodSecurityError::from)
                    .and_then(|v| v.map_err(PodSecurityError::from)),
            };
            (
                verdict,
                state.kubernetes.clone().unwrap_or_default(),
                security,
            )
        };
        self.conclude(node, kubelet, verdict, &kubernetes)?;
        Ok(security)
    }

    /// The kubelet's verdict on the question, from the memo or the helper.
    fn kubelet_verdict(
        &self,
        state: &mut State,
        node: &str,
        kubelet: &str,
        manifest: &[u8],
    ) -> Result<Result<Vec<String>, Refusal>, Unavailable> {
        let key = memo::key(node, kubelet, manifest);
        if let Some(known) = state.memo.get(&key) {
            return Ok(known);
        }
        let answer = self.ask_parts(
            state,
            &[node.as_bytes(), kubelet.as_bytes(), manifest],
            Request::Kubelet,
        )?;
        let verdict = verdict::parse(&answer, state.kubernetes.as_deref().unwrap_or("?"))
            .map_err(Unavailable)?;
        state.memo.insert(key, verdict.clone());
        Ok(verdict)
    }

    /// A kubelet verdict to the caller: the newer fields counted, then
    /// warned about or refused.
    fn conclude(
        &self,
        node: &str,
        kubelet: &str,
        verdict: Result<Vec<String>, Refusal>,
        kubernetes: &str,
    ) -> Result<(), CheckError> {
        let newer = verdict?;
        if newer.is_empty() {
            return Ok(());
        }
        {
            let mut counts = self.newer.lock().unwrap_or_else(|e| e.into_inner());
            if counts.len() < MAX_NODES_COUNTED || counts.contains_key(node) {
                *counts.entry(node.to_string()).or_default() += 1;
            }
        }
        if self.settings.refuse_newer {
            return Err(Refusal::newer(&newer, kubelet, kubernetes).into());
        }
        tracing::warn!(
            node,
            kubelet,
            fields = %newer.join(", "),
            "the manifest has fields newer than the node's kubelet, which runs the pod without them (set {REFUSE_NEWER_ENV}=true to refuse it)"
        );
        Ok(())
    }

    /// How many Pod Security verdicts came from the memo, and how many from
    /// the helper.
    pub fn pod_security_counts(&self) -> (u64, u64) {
        let state = self.lock();
        (
            state.pod_security_memo.hits(),
            state.pod_security_memo.misses(),
        )
    }

    /// Does `manifest` meet `policy`? Kubernetes' own Pod Security checks
    /// decide (the helper), once per level, version and bytes.
    pub fn pod_security(&self, policy: &Policy, manifest: &[u8]) -> Result<(), PodSecurityError> {
        if manifest.len() > KUBELET_MAX_FILE {
            // Refused by the kubelet's check first; never sent.
            return Err(Unavailable(format!(
                "the manifest is {} bytes, over the kubelet's {KUBELET_MAX_FILE}",
                manifest.len()
            ))
            .into());
        }
        let mut state = self.lock();
        Ok(self.security_verdict(&mut state, policy, manifest)??)
    }

    /// The Pod Security verdict, from the memo or the helper.
    fn security_verdict(
        &self,
        state: &mut State,
        policy: &Policy,
        manifest: &[u8],
    ) -> Result<Result<(), Violation>, Unavailable> {
        let key = memo::pod_security_key(policy.level.as_str(), policy.version(), manifest);
        if let Some(known) = state.pod_security_memo.get(&key) {
            return Ok(known);
        }
        let parts = pod_security::request(policy, manifest);
        let answer = self.ask_parts(state, &parts, Request::PodSecurity)?;
        let verdict = pod_security::parse(&answer, policy).map_err(Unavailable)?;
        state.pod_security_memo.insert(key, verdict.clone());
        Ok(verdict)
    }

    /// Is the helper (started if it is not running) one that answers the
    /// combined request?
    fn helper_answers_both(&self, state: &mut State) -> Result<bool, Unavailable> {
        Ok(self.running(state)?.both())
    }

    /// The helper, found and started if it is not running.
    fn running<'s>(&self, state: &'s mut State) -> Result<&'s mut Helper, Unavailable> {
        // Found once; a helper not found is looked for again at the next
        // call, so that installing it is enough (no restart).
        let path = match &state.path {
            Some(Ok(path)) => path.clone(),
            _ => {
                let found = locate::find(self.settings.path.as_deref());
                state.path = Some(found.clone());
                found?
            }
        };
        if state.helper.is_none() {
            let helper = Helper::start(&path, self.settings.call_timeout)?;
            state.kubernetes = Some(helper.kubernetes().to_string());
            state.generation += 1;
            state.helper = Some(helper);
            self.reap_when_idle(state.generation);
        }
        Ok(state.helper.as_mut().expect("started above"))
    }

    /// One request to the helper, started if it is not running; a request
    /// the helper does not know is never sent; a helper that fails is
    /// stopped, and the next call starts a new one.
    fn ask_parts(
        &self,
        state: &mut State,
        parts: &[&[u8]],
        request: Request,
    ) -> Result<Vec<u8>, Unavailable> {
        let timeout = self.settings.call_timeout;
        let helper = self.running(state)?;
        let known = match request {
            Request::Kubelet => true,
            Request::PodSecurity => helper.pod_security().is_some(),
            Request::Both => helper.both(),
        };
        if !known {
            let path = state.path.clone().and_then(Result::ok).unwrap_or_default();
            return Err(Unavailable(format!(
                "{} is older than this podstamp and has no Pod Security check: install the one built with it (`bash tests/harness/build-kubecheck.sh`)",
                path.display()
            )));
        }
        match helper.call_parts(parts, timeout) {
            Ok(answer) => Ok(answer),
            Err(e) => {
                if let Some(helper) = state.helper.take() {
                    helper.stop();
                }
                Err(e)
            }
        }
    }

    /// Stops helper `generation` once it has had no call for `linger`.
    fn reap_when_idle(&self, generation: u64) {
        let state = Arc::downgrade(&self.state);
        let linger = self.settings.linger;
        let spawned = std::thread::Builder::new()
            .name("kubecheck-reaper".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(linger / 2);
                    let Some(state) = state.upgrade() else { return };
                    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                    if state.generation != generation {
                        return;
                    }
                    let Some(helper) = &state.helper else { return };
                    if helper.idle_for() >= linger {
                        state.helper.take().expect("checked").stop();
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            // Without a reaper the helper stays until the process ends.
            tracing::warn!("cannot start the thread that stops the idle pod check: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_helper_is_a_check_that_fails() {
        let check = KubeCheck::new(Settings {
            path: Some("/nonexistent/podstamp-kubecheck".into()),
            ..Settings::default()
        });
        let e = check.check("n1", None, b"apiVersion: v1\n").unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CheckError::Unavailable(_)), "{text}");
        assert!(
            text.contains("/nonexistent/podstamp-kubecheck") && text.contains("build-kubecheck.sh"),
            "{text}"
        );
    }

    #[test]
    fn a_manifest_over_the_kubelets_limit_is_refused_without_the_helper() {
        let check = KubeCheck::new(Settings {
            path: Some("/nonexistent/podstamp-kubecheck".into()),
            ..Settings::default()
        });
        let big = vec![b' '; KUBELET_MAX_FILE + 1];
        let e = check.check("n1", None, &big).unwrap_err();
        assert!(matches!(e, CheckError::Refused(_)), "{e}");
    }
}
