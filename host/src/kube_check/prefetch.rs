//! Many questions asked of the helper at once, their verdicts memoized.
//!
//! A pass that writes many manifests asks the helper once per manifest; one
//! request at a time, each waits for the round trip (two pipes, four thread
//! hand-offs) and the helper's work, while the render thread does nothing.
//! A [`Prefetch`] sends each question as soon as it is known, up to
//! [`MAX_IN_FLIGHT`] unanswered, so the helper works on one manifest while
//! the caller renders the next; it memoizes each verdict under the key its
//! own request would have. The caller's [`KubeCheck::check`] /
//! [`KubeCheck::check_held`] then answer from the memo, with the same
//! messages, warnings and counts of newer fields.
//!
//! Invariants:
//! - It only fills the memo: the decision, the warning or refusal, stays with
//!   the check asked for the manifest before its write (no check, no write).
//!   A helper that cannot be asked leaves the memo as it was, and that check
//!   then asks again, or fails, exactly as without the prefetch.
//! - Each verdict is the answer to the request the check would have sent for
//!   the same bytes (the kubelet request, or the combined one for a pod held
//!   to a level when the helper knows it), memoized under the same key(s):
//!   a prefetched verdict counts as the helper's (a miss), its use later as a
//!   memo hit.
//! - A session holds the check's lock from [`KubeCheck::prefetch`] to
//!   [`Prefetch::finish`] (or its drop): no other request can be sent in
//!   between and read an answer meant for the session. Whatever runs meanwhile
//!   (the renders) must not ask this check anything.
//! - A question already memoized, over the kubelet's size limit, or asked
//!   twice in one session is not sent (again).

use std::collections::{HashSet, VecDeque};
use std::sync::MutexGuard;

use super::pod_security::{self, Policy};
use super::{
    KUBELET_MAX_FILE, KubeCheck, State, Unavailable, both_request, memo, split_both, verdict,
};

/// The most requests sent and not yet answered: enough that the helper
/// never waits for the next one, few enough that the frames queued for it
/// stay a few hundred KiB.
pub const MAX_IN_FLIGHT: usize = 32;

/// One manifest about to be checked for a write.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    pub node: &'a str,
    /// The node's kubelet version, when known.
    pub kubelet: Option<&'a str>,
    pub manifest: &'a [u8],
    /// The Pod Security level the pod is held to, if any.
    pub policy: Option<&'a Policy>,
}

/// What one request sent is the answer to.
enum Asked {
    Kubelet {
        key: memo::Key,
    },
    Both {
        key: memo::Key,
        security_key: memo::Key,
        policy: Policy,
    },
}

/// Questions sent ahead of their checks (see the module header).
pub struct Prefetch<'c> {
    check: &'c KubeCheck,
    state: MutexGuard<'c, State>,
    /// The helper answers the combined request; None: no helper, nothing
    /// is sent (any more).
    both: Option<bool>,
    seen: HashSet<memo::Key>,
    in_flight: VecDeque<Asked>,
    answered: usize,
}

impl KubeCheck {
    /// Starts a prefetch session, the helper started if it is not running
    /// (a helper that cannot start makes a session that sends nothing).
    pub fn prefetch(&self) -> Prefetch<'_> {
        let mut state = self.lock();
        let both = match self.running(&mut state) {
            Ok(helper) => Some(helper.both()),
            Err(e) => {
                tracing::debug!("not prefetching the pod checks: {e}");
                None
            }
        };
        Prefetch {
            check: self,
            state,
            both,
            seen: HashSet::new(),
            in_flight: VecDeque::new(),
            answered: 0,
        }
    }
}

impl Prefetch<'_> {
    /// Sends `q` unless its verdict is known or it was sent already; reads
    /// the oldest answer first when [`MAX_IN_FLIGHT`] are unanswered.
    pub fn ask(&mut self, q: Question<'_>) {
        let Some(both) = self.both else { return };
        if q.manifest.len() > KUBELET_MAX_FILE {
            return;
        }
        let kubelet = q.kubelet.unwrap_or_default();
        let key = memo::key(q.node, kubelet, q.manifest);
        if self.state.memo.peek(&key).is_some() || !self.seen.insert(key) {
            return;
        }
        let kubelet_request = [q.node.as_bytes(), kubelet.as_bytes(), q.manifest];
        let (asked, sent) = match q.policy {
            Some(policy) if both => {
                let security_key =
                    memo::pod_security_key(policy.level.as_str(), policy.version(), q.manifest);
                if self.state.pod_security_memo.peek(&security_key).is_some() {
                    // check_held then asks the kubelet's question alone.
                    (Asked::Kubelet { key }, self.send(&kubelet_request))
                } else {
                    let parts = both_request(q.node, kubelet, policy, q.manifest);
                    let asked = Asked::Both {
                        key,
                        security_key,
                        policy: policy.clone(),
                    };
                    (asked, self.send(&parts))
                }
            }
            // Without the combined request, check_held asks the Pod
            // Security question itself, once the kubelet accepts the pod.
            _ => (Asked::Kubelet { key }, self.send(&kubelet_request)),
        };
        if sent.is_err() {
            return;
        }
        self.in_flight.push_back(asked);
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            self.read_one();
        }
    }

    /// Reads every answer still in flight; how many requests the helper
    /// answered in the session.
    pub fn finish(mut self) -> usize {
        while !self.in_flight.is_empty() && self.both.is_some() {
            self.read_one();
        }
        self.answered
    }

    fn send(&mut self, parts: &[&[u8]]) -> Result<(), Unavailable> {
        let timeout = self.check.settings.call_timeout;
        let sent = match self.state.helper.as_mut() {
            Some(helper) => helper.send(parts, timeout),
            None => Err(Unavailable("the pod check's process has stopped".into())),
        };
        if let Err(e) = &sent {
            self.give_up(e);
        }
        sent
    }

    /// The oldest answer in flight, memoized.
    fn read_one(&mut self) {
        let Some(asked) = self.in_flight.pop_front() else {
            return;
        };
        let timeout = self.check.settings.call_timeout;
        let answer = match self.state.helper.as_mut() {
            Some(helper) => helper.answer(timeout),
            None => Err(Unavailable("the pod check's process has stopped".into())),
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => return self.give_up(&e),
        };
        self.answered += 1;
        let kubernetes = self.state.kubernetes.clone().unwrap_or_default();
        let state = &mut *self.state;
        // An answer that does not parse is not memoized: the check asks
        // again and reports it.
        match asked {
            Asked::Kubelet { key } => {
                if let Ok(verdict) = verdict::parse(&answer, &kubernetes) {
                    state.memo.record_miss(key, verdict);
                }
            }
            Asked::Both {
                key,
                security_key,
                policy,
            } => {
                let Ok((kubelet_answer, security_answer)) = split_both(&answer) else {
                    return;
                };
                if let (Ok(verdict), Ok(security)) = (
                    verdict::parse(&kubelet_answer, &kubernetes),
                    pod_security::parse(&security_answer, &policy),
                ) {
                    state.memo.record_miss(key, verdict);
                    state.pod_security_memo.record_miss(security_key, security);
                }
            }
        }
    }

    /// The helper failed mid-session: answers may be left in its pipe, so
    /// it is stopped (the next check starts another) and nothing more is
    /// sent.
    fn give_up(&mut self, e: &Unavailable) {
        tracing::debug!("the prefetch of the pod checks stopped: {e}");
        if let Some(helper) = self.state.helper.take() {
            helper.stop();
        }
        self.both = None;
        self.in_flight.clear();
    }
}

impl Drop for Prefetch<'_> {
    /// A session dropped unfinished still reads its answers: a later
    /// request must not read one of them as its own.
    fn drop(&mut self) {
        while !self.in_flight.is_empty() && self.both.is_some() {
            self.read_one();
        }
    }
}
