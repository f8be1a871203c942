//! The Kubernetes client's configuration, as every podstamp command finds
//! it: `--kubeconfig` when given, else kube-rs's inference (`KUBECONFIG`,
//! `~/.kube/config`, in-cluster). A leaf: the daemon adds its request
//! counting on top ([`crate::daemon::client`]); `podstamp status` and the
//! registry's pull Secrets use it as it is.

use std::path::{Path, PathBuf};

/// Why there is no Kubernetes client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes credentials (give --kubeconfig, or run in a pod): {0}")]
    NoCredentials(#[source] kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// The configuration of a client from `kubeconfig`, else inferred.
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    match kubeconfig {
        Some(path) => {
            let at = |source| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(at)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(at)
        }
        None => kube::Config::infer()
            .await
            .map_err(ClientError::NoCredentials),
    }
}

/// A client without request counting.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    kube::Client::try_from(config(kubeconfig).await?).map_err(ClientError::Client)
}
