//! The container runtime's CRI over its local unix socket, read only:
//! the sandboxes and containers of one revision of a template's static
//! pod, and whether its images are present.
//!
//! Invariants: only `Version`, `ListPodSandbox`, `ListContainers`,
//! `ContainerStatus` and `ImageStatus` are called (see [`super`]); each
//! call has [`CALL_TIMEOUT`]; errors name the socket and the call, and keep
//! the runtime's status as their source.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerFilter, ContainerState as CriState, ContainerStatusRequest, ImageSpec,
    ImageStatusRequest, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, VersionRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::read::{Seen, SeenContainer, SeenSandbox};
use crate::daemon::rollout::local::ContainerState;
use crate::manifest::{REVISION_LABEL, SOURCE_ANNOTATION};

/// How long one call may take: a local runtime answers in milliseconds; one
/// that does not within this is reported, not waited for.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The kubelet's annotation on a container: how many times it restarted the
/// pod's container of this name before this one.
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// The kubelet's label on a container: its name in the pod spec.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// The kubelet's annotation on a static pod (and its sandbox): the hash of
/// the file's content.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error(
        "cannot reach the container runtime's CRI socket {path}: {source}; set daemon.criSocket (--cri-socket, PODSTAMP_CRI_SOCKET) to the runtime's socket and mount it into podstamp's pod"
    )]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CRI {call} on {path}: {source}")]
    Call {
        call: &'static str,
        path: String,
        #[source]
        source: Box<tonic::Status>,
    },
}

/// A connection to the runtime's CRI.
#[derive(Clone)]
pub struct Cri {
    path: PathBuf,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI socket at `path` and asks the runtime its
    /// version, so that a socket that is not a CRI runtime's is an error
    /// here.
    pub async fn connect(path: &Path) -> Result<Cri, CriError> {
        let socket = path.to_path_buf();
        // The URI is not used: every connection goes to the socket.
        let channel =
            Endpoint::from_static("http://cri.invalid")
                .connect_timeout(CALL_TIMEOUT)
                .timeout(CALL_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .map_err(|source| CriError::Connect {
                    path: path.display().to_string(),
                    source,
                })?;
        let mut cri = Cri {
            path: path.to_path_buf(),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        };
        let version = cri.runtime.version(VersionRequest::default()).await;
        cri.check("Version", version)?;
        Ok(cri)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check<T>(
        &self,
        call: &'static str,
        result: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, CriError> {
        result
            .map(tonic::Response::into_inner)
            .map_err(|source| CriError::Call {
                call,
                path: self.path.display().to_string(),
                source: Box::new(source),
            })
    }

    /// What the runtime runs of `revision` of template `source` (the pod's
    /// `podstamp.io/source`), and which of `images` it does not have.
    pub async fn seen(
        &mut self,
        source: &str,
        revision: &str,
        images: &[String],
    ) -> Result<Seen, CriError> {
        let filter = PodSandboxFilter {
            label_selector: HashMap::from([(REVISION_LABEL.to_string(), revision.to_string())]),
            ..PodSandboxFilter::default()
        };
        let listed = self
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await;
        let sandboxes = self.check("ListPodSandbox", listed)?.items;
        // The revision label is the kubelet's copy of the pod's; the source
        // annotation tells two templates' pods apart should they share a
        // revision (they would not, but a foreign pod could carry the label).
        let sandbox = sandboxes
            .into_iter()
            .filter(|s| s.annotations.get(SOURCE_ANNOTATION).map(String::as_str) == Some(source))
            .max_by_key(|s| s.created_at);
        let Some(sandbox) = sandbox else {
            return Ok(Seen {
                absent_images: self.absent(images).await?,
                ..Seen::default()
            });
        };
        let listed = self
            .runtime
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    pod_sandbox_id: sandbox.id.clone(),
                    ..ContainerFilter::default()
                }),
            })
            .await;
        let mut containers = Vec::new();
        for c in self.check("ListContainers", listed)?.containers {
            let name = c
                .labels
                .get(CONTAINER_NAME_LABEL)
                .cloned()
                .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
                .unwrap_or_default();
            let restart_count = c
                .annotations
                .get(RESTART_COUNT_ANNOTATION)
                .and_then(|n| n.parse().ok())
                .or_else(|| c.metadata.as_ref().map(|m| m.attempt))
                .unwrap_or(0);
            // The list has no exit code: the container's status has.
            let status = self
                .runtime
                .container_status(ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: false,
                })
                .await;
            let status = self.check("ContainerStatus", status)?.status;
            let (state, reason) = match status {
                Some(s) => (state_of(s.state, s.exit_code), s.reason),
                None => (state_of(c.state, 0), String::new()),
            };
            containers.push(SeenContainer {
                name,
                state,
                restart_count,
                created_at: c.created_at,
                reason,
            });
        }
        Ok(Seen {
            sandbox: Some(SeenSandbox {
                ready: sandbox.state == PodSandboxState::SandboxReady as i32,
                config_hash: sandbox.annotations.get(CONFIG_HASH_ANNOTATION).cloned(),
                id: sandbox.id,
            }),
            containers,
            absent_images: self.absent(images).await?,
        })
    }

    /// Which of `images` the runtime does not have.
    async fn absent(&mut self, images: &[String]) -> Result<Vec<String>, CriError> {
        let mut absent = Vec::new();
        for image in images {
            let status = self
                .images
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: image.clone(),
                        ..ImageSpec::default()
                    }),
                    verbose: false,
                })
                .await;
            if self.check("ImageStatus", status)?.image.is_none() {
                absent.push(image.clone());
            }
        }
        Ok(absent)
    }
}

/// A CRI container state as local evidence: unknown is not judged (it is
/// read as starting).
fn state_of(state: i32, exit_code: i32) -> ContainerState {
    match CriState::try_from(state) {
        Ok(CriState::ContainerRunning) => ContainerState::Running,
        Ok(CriState::ContainerExited) => ContainerState::Exited { code: exit_code },
        _ => ContainerState::Created,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_named_with_the_setting_that_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("containerd.sock");
        let e = Cri::connect(&path).await.err().expect("no socket");
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("set daemon.criSocket"), "{text}");
    }

    #[tokio::test]
    async fn a_socket_that_is_not_a_runtimes_is_an_error_of_its_first_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-cri.sock");
        // Accepts and closes at once, at most a few connections (bounded).
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            for _ in 0..8 {
                match listener.accept().await {
                    Ok((stream, _)) => drop(stream),
                    Err(_) => return,
                }
            }
        });
        let e = Cri::connect(&path).await.err().expect("not a CRI runtime");
        let text = e.to_string();
        assert!(
            text.contains("CRI Version on") || text.contains("cannot reach"),
            "{text}"
        );
        assert!(text.contains("not-cri.sock"), "{text}");
    }
}
