//! Whether the rollout namespace is shared with the control plane: the
//! start-up check made before the coordinator writes its first Lease.
//!
//! A Lease write granted in a namespace reaches every Lease there: where
//! kube-scheduler or kube-controller-manager keep their leader election,
//! one node's token could take it over and stall the cluster. The settings
//! refuse the namespaces known for it by name
//! ([`crate::settings::CONTROL_PLANE_NAMESPACES`]); this looks in the one
//! given for the control plane's leader-election Leases
//! ([`LEADER_ELECTION_LEASES`]), as an operator may run the control plane's
//! election in a namespace of their own.
//!
//! Invariants:
//! * Decided before the coordinator starts: no rollout Lease is written in
//!   a shared namespace unless `daemon.rollouts.allowControlPlaneNamespace`
//!   allows it, and then the start-up log says so in one line.
//! * What cannot be read cannot be told: a Lease the daemon may not `get`
//!   (403) counts as absent (its writes there fail anyway, naming the
//!   permission). Only an answer decides; while the API server does not
//!   answer, the check is asked again with backoff and the coordinator
//!   waits (updates wait for a slot, nothing else does).

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::backoff::Backoff;
use crate::config::DEFAULT_ROLLOUT_NAMESPACE;
use crate::settings::CONTROL_PLANE_NAMESPACES;

/// The leader-election Leases of the control plane's components, by their
/// default names (`--leader-elect-resource-name`).
pub const LEADER_ELECTION_LEASES: [&str; 3] = [
    "kube-scheduler",
    "kube-controller-manager",
    "cloud-controller-manager",
];

/// The rollout namespace holds the control plane's Leases.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{setting} {namespace}: {why}, so the rollouts' Lease permission there reaches the control plane's leader election; give the rollout Leases a namespace of their own (default {default}, deploy/namespace.yaml), or say --allow-control-plane-namespace (daemon.rollouts.allowControlPlaneNamespace: true)",
    setting = setting.name(),
    default = setting.default()
)]
pub struct SharedNamespace {
    pub setting: Setting,
    pub namespace: String,
    /// What is shared: the namespace's role, or the Lease found.
    pub why: String,
}

/// Which of podstamp's Lease namespaces is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// The slots' and halt markers' (`daemon.rollouts.namespace`).
    Rollouts,
    /// The nodes' status records' (`daemon.rollouts.statusNamespace`).
    Status,
}

impl Setting {
    /// The setting, as its messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Rollouts => "daemon.rollouts.namespace (--rollout-namespace)",
            Setting::Status => "daemon.rollouts.statusNamespace (--status-namespace)",
        }
    }

    fn default(self) -> String {
        match self {
            Setting::Rollouts => DEFAULT_ROLLOUT_NAMESPACE.to_string(),
            Setting::Status => crate::config::default_status_namespace(DEFAULT_ROLLOUT_NAMESPACE),
        }
    }

    /// What the daemons are granted on `leases` there (deploy/rbac.yaml).
    pub fn grant(self) -> &'static str {
        match self {
            Setting::Rollouts => "get, list, watch, create and update",
            Setting::Status => "get, create and update",
        }
    }
}

/// Why `namespace` (the one of `setting`) is shared with the control
/// plane, judging by its name and by the leader-election Leases found in it
/// (`found`); None: it is not, as far as can be told.
pub fn judge(setting: Setting, namespace: &str, found: Option<&str>) -> Option<SharedNamespace> {
    let why = if CONTROL_PLANE_NAMESPACES.contains(&namespace) {
        "the control plane keeps its own Leases there".to_string()
    } else {
        format!("it holds Lease {namespace}/{}", found?)
    };
    Some(SharedNamespace {
        setting,
        namespace: namespace.to_string(),
        why,
    })
}

/// The first leader-election Lease of the control plane in `namespace`,
/// asked until the API server answers for each.
async fn leader_lease(client: &kube::Client, namespace: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let mut backoff = Backoff::new();
    // Said once: the watches already report an API server that is away.
    let mut said = false;
    for name in LEADER_ELECTION_LEASES {
        loop {
            match api.get_metadata_opt(name).await {
                Ok(Some(_)) => return Some(name.to_string()),
                Ok(None) => break,
                Err(kube::Error::Api(status)) if status.is_forbidden() => break,
                Err(e) => {
                    if !said {
                        tracing::warn!(
                            namespace,
                            lease = name,
                            "cannot tell yet whether the rollout namespace holds the control plane's Leases: {e}; rollouts wait until it can be told"
                        );
                        said = true;
                    }
                    tokio::time::sleep(backoff.delay()).await;
                }
            }
        }
    }
    None
}

/// Ok when the coordinator may write in `namespace` (the one of
/// `setting`): not shared with the control plane, or shared and `allowed`
/// (said once, at warn).
pub async fn check(
    client: &kube::Client,
    setting: Setting,
    namespace: &str,
    allowed: bool,
) -> Result<(), SharedNamespace> {
    let found = if CONTROL_PLANE_NAMESPACES.contains(&namespace) {
        None
    } else {
        leader_lease(client, namespace).await
    };
    match judge(setting, namespace, found.as_deref()) {
        None => Ok(()),
        Some(shared) if allowed => {
            tracing::warn!(
                "rollout Leases shared with the control plane, as allowed (daemon.rollouts.allowControlPlaneNamespace): {shared}"
            );
            Ok(())
        }
        Some(shared) => Err(shared),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_shared_by_its_name_or_a_leader_lease_in_it() {
        assert_eq!(judge(Setting::Rollouts, "podstamp-rollouts", None), None);
        let by_name = judge(Setting::Rollouts, "kube-system", None)
            .unwrap()
            .to_string();
        assert!(
            by_name.contains("kube-system: the control plane keeps"),
            "{by_name}"
        );
        let by_lease = judge(Setting::Rollouts, "infra", Some("kube-scheduler"))
            .unwrap()
            .to_string();
        assert!(
            by_lease.starts_with(
                "daemon.rollouts.namespace (--rollout-namespace) infra: it holds Lease infra/kube-scheduler"
            ),
            "{by_lease}"
        );
        assert!(
            by_lease.contains("--allow-control-plane-namespace"),
            "{by_lease}"
        );
        assert_eq!(by_lease.lines().count(), 1);
        let status = judge(Setting::Status, "kube-system", None)
            .unwrap()
            .to_string();
        assert!(
            status.starts_with("daemon.rollouts.statusNamespace (--status-namespace) kube-system: the control plane keeps")
                && status.contains("(default podstamp-rollouts-status, deploy/namespace.yaml)"),
            "{status}"
        );
    }
}
