//! The node's own evidence of the revisions in place: every
//! [`PERIOD`], each podstamp manifest in the kubelet's directory is looked
//! up in the container runtime (over its CRI socket, [`super::cri`]) and its
//! probes are run ([`super::probes`]); what that shows, judged by
//! [`super::rollout::local::judge`], goes to the reconciler, whose rollout
//! machine takes it only while the mirror pod cannot be followed.
//!
//! Invariants:
//! * Read only: the manifest directory and the runtime are only read.
//! * The runtime reachable or not is told to the reconciler when it changes
//!   (`LocalAvailable`); an error of a call drops the connection (it is
//!   made anew at the next poll) and counts as not reachable, said once in
//!   the log, not at every poll.
//! * A revision's probes start anew when another revision is in place.
//! * An observation is sent only when it changed (and once more when the
//!   mirror pods start or stop being followed): the machine's clock (the
//!   progress deadline, the 10 s of a stable Ready) runs on its own.
//! * The pods' probes run only while the mirror pods are not followed:
//!   while they are, the kubelet runs the same probes and its verdict
//!   decides, so running them again would only double the load on the
//!   pod; the runtime's word alone is then the cross-check (the machine's
//!   disagreement check). They start anew, fresh records, when the mirror
//!   pods stop being followed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;

use super::cri::{self, Cri};
use super::inbox::{Input, Observation};
use super::probes::Prober;
use super::rollout::local::{LocalPodState, judge};
use crate::manifest::{REVISION_LABEL, SOURCE_ANNOTATION};

/// How often the node is looked at: a second, as OpenShift's startup
/// monitor probes its API server.
pub const PERIOD: Duration = Duration::from_secs(1);

/// A manifest of podstamp's in the kubelet's directory.
struct InPlace {
    source: String,
    revision: String,
    pod: Value,
}

/// Reads the podstamp manifests of `dir` (those with
/// `podstamp.io/source` and `podstamp.io/revision`); a file that cannot be
/// read or parsed is not one (the reconciler reports its own).
fn in_place(dir: &Path) -> Vec<InPlace> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".yaml") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(pod) = serde_norway::from_str::<Value>(&text) else {
            continue;
        };
        let text = |pointer: &str| {
            pod.pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let source = text(&format!(
            "/metadata/annotations/{}",
            SOURCE_ANNOTATION.replace('/', "~1")
        ));
        let revision = text(&format!(
            "/metadata/labels/{}",
            REVISION_LABEL.replace('/', "~1")
        ));
        if let (Some(source), Some(revision)) = (source, revision) {
            out.push(InPlace {
                source,
                revision,
                pod,
            });
        }
    }
    out
}

/// What is kept per template between polls.
struct Followed {
    revision: String,
    prober: Prober,
    /// Its probes are being run (the mirror pods not followed).
    probing: bool,
    sent: Option<LocalPodState>,
}

/// Polls the node until the reconciler is gone; `mirror_followed`: the
/// mirror pods are followed now (the probes are then the kubelet's alone).
pub async fn watch(
    socket: PathBuf,
    manifest_dir: PathBuf,
    inputs: Sender<Input>,
    mirror_followed: Arc<AtomicBool>,
) {
    let mut cri: Option<Cri> = None;
    let mut available = false;
    let mut said: Option<String> = None;
    let mut followed: BTreeMap<String, Followed> = BTreeMap::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let result = match cri.as_mut() {
            Some(_) => Ok(()),
            None => Cri::connect(&socket).await.map(|c| cri = Some(c)),
        };
        // Available before the first observations: the reconciler takes
        // them only then.
        let result = match (result, cri.as_mut()) {
            (Ok(()), Some(client)) => {
                if !available {
                    available = true;
                    if inputs.send(Input::LocalAvailable(true)).is_err() {
                        return;
                    }
                }
                let probing = !mirror_followed.load(Ordering::Relaxed);
                poll(client, &manifest_dir, &mut followed, probing, &inputs).await
            }
            (Err(e), _) => Err(e),
            (Ok(()), None) => continue,
        };
        match result {
            Ok(()) => {
                if said.take().is_some() {
                    tracing::info!(socket = %socket.display(), "the container runtime answers: rollouts can be judged from the node itself");
                }
            }
            Err(e) => {
                cri = None;
                let text = e.to_string();
                if said.as_deref() != Some(text.as_str()) {
                    tracing::warn!("no local evidence of rollouts: {text}");
                    said = Some(text);
                }
                if available {
                    available = false;
                    if inputs.send(Input::LocalAvailable(false)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// One look at the node.
async fn poll(
    client: &mut Cri,
    manifest_dir: &Path,
    followed: &mut BTreeMap<String, Followed>,
    probing: bool,
    inputs: &Sender<Input>,
) -> Result<(), cri::CriError> {
    let manifests = in_place(manifest_dir);
    followed.retain(|id, _| manifests.iter().any(|m| &m.source == id));
    for m in manifests {
        let f = followed
            .entry(m.source.clone())
            .or_insert_with(|| Followed {
                revision: m.revision.clone(),
                prober: Prober::new(&m.pod),
                probing,
                sent: None,
            });
        if f.revision != m.revision || f.probing != probing {
            // Another revision, or the probes taken up or left to the
            // kubelet: fresh records, and the state sent again.
            *f = Followed {
                revision: m.revision.clone(),
                prober: Prober::new(&m.pod),
                probing,
                sent: None,
            };
        }
        let seen = client
            .seen(&m.source, &m.revision, &cri::read::images(&m.pod))
            .await?;
        let containers = cri::containers(&m.pod, &seen);
        let now = Instant::now();
        if probing {
            f.prober.containers(&containers, now);
            f.prober.run_due(now).await;
        }
        let state = LocalPodState {
            // A sandbox the runtime no longer calls ready is one the kubelet
            // stopped: this revision's pod from before another replaced it
            // (its sandbox is kept, not removed), not the kubelet acting on
            // the file now. Seen with a kubelet restarted while its API
            // server was down: the revision rolled back to had only its
            // old, stopped sandbox (kubernetes/kubernetes#105543).
            sandbox: seen.sandbox.as_ref().is_some_and(|s| s.ready),
            containers,
            probes: if probing {
                f.prober.local()
            } else {
                Vec::new()
            },
        };
        if f.sent.as_ref() == Some(&state) {
            continue;
        }
        tracing::debug!(template = %m.source, revision = %m.revision, state = ?judge(&state), "seen on the node");
        let observation = Observation {
            source: m.source.clone(),
            revision: m.revision.clone(),
            state: judge(&state),
            pod: ObjectReference::default(),
        };
        f.sent = Some(state);
        if inputs.send(Input::Local(observation)).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_podstamps_manifests_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let ours = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations:\n    {SOURCE_ANNOTATION}: ns/web\n  labels:\n    {REVISION_LABEL}: \"0123456789\"\nspec:\n  hostNetwork: true\n"
        );
        std::fs::write(dir.path().join("web.yaml"), &ours).unwrap();
        // A temp file of a write in progress, a foreign manifest, a file
        // that does not parse: none is followed.
        std::fs::write(dir.path().join(".web.yaml.tmp"), &ours).unwrap();
        std::fs::write(
            dir.path().join("etcd.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("bad.yaml"), ": : :\n\t-").unwrap();
        let found = in_place(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].source.as_str(), found[0].revision.as_str()),
            ("ns/web", "0123456789")
        );
        assert_eq!(found[0].pod["spec"]["hostNetwork"], true);
        assert!(in_place(&dir.path().join("missing")).is_empty());
    }
}
