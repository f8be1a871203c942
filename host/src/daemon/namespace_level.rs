//! The Pod Security labels of the one Namespace the daemon serves, watched
//! so that every template's pod is held to the level its namespace
//! enforces ([`crate::security_level`], docs/daemon.md "Pod Security").
//!
//! Invariants:
//! * Only that Namespace is ever read: the list and the watch carry the
//!   field selector `metadata.name=<namespace>`, which the API server
//!   authorizes as a request for that name, so the RBAC rule can be bound
//!   by `resourceNames` (deploy/rbac.yaml, ClusterRole
//!   podstamp-namespace). A list or watch without it would be refused by
//!   that rule.
//! * The reconciler hears the two labels that decide the level
//!   ([`ENFORCE_LABEL`], [`ENFORCE_VERSION_LABEL`]) and nothing else of the
//!   Namespace, and hears them again only when they change: any other
//!   label or status update of the Namespace renders nothing.
//! * Until the Namespace was listed once, nothing is sent, and the
//!   reconciler renders nothing ([`Input::Namespace`]): no manifest is ever
//!   written at a level looser than the label's for want of having read
//!   it. A watch that fails later keeps the labels last read in force.
//! * A Namespace that does not exist (or is deleted) has no label: the
//!   configured level holds.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

use super::backoff::Backoff;
use super::inbox::Input;
use super::metrics::Metrics;
use super::raw::Raw;
use super::watch::{self, Event, Spec};
use crate::security_level::{ENFORCE_LABEL, ENFORCE_VERSION_LABEL};

/// The labels of `namespace` that decide its Pod Security level.
pub fn level_labels(namespace: &Raw<Namespace>) -> BTreeMap<String, String> {
    let labels = &namespace.value()["metadata"]["labels"];
    [ENFORCE_LABEL, ENFORCE_VERSION_LABEL]
        .into_iter()
        .filter_map(|key| Some((key.to_string(), labels.get(key)?.as_str()?.to_string())))
        .collect()
}

/// Watches the Namespace `name` (a field selector on its name), sending
/// [`Input::Namespace`] with its level labels once listed and at each
/// change of them.
pub async fn watch(
    client: Client,
    name: String,
    watch_timeout: Option<u32>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let api: Api<Raw<Namespace>> = Api::all(client);
    let spec = Spec::new(format!("namespace {name}"), "namespace", watch_timeout)
        .fields(&format!("metadata.name={name}"));
    // What the reconciler was last told; None: nothing yet.
    let mut sent: Option<BTreeMap<String, String>> = None;
    // What the list being read found.
    let mut listed = BTreeMap::new();
    let mut failed_logged = false;
    watch::run(api, spec, metrics, Backoff::new(), |event| {
        let labels = match event {
            Event::Listing => {
                listed = BTreeMap::new();
                return ControlFlow::Continue(());
            }
            Event::Listed(ns) => {
                listed = level_labels(&ns);
                return ControlFlow::Continue(());
            }
            Event::ListDone => std::mem::take(&mut listed),
            Event::Applied(ns) => level_labels(&ns),
            Event::Deleted(_) => BTreeMap::new(),
            Event::Resumed => return ControlFlow::Continue(()),
            Event::Failed(_) => {
                if !failed_logged {
                    failed_logged = true;
                    match &sent {
                        None => tracing::warn!(namespace = %name,
                            "the Namespace cannot be read: nothing is rendered until its Pod Security labels ({ENFORCE_LABEL}) are known (get, list and watch on namespaces, resourceNames [{name}]: deploy/rbac.yaml)"),
                        Some(_) => tracing::warn!(namespace = %name,
                            "the Namespace cannot be watched: its Pod Security labels as last read hold until it is watched again"),
                    }
                }
                return ControlFlow::Continue(());
            }
        };
        failed_logged = false;
        if sent.as_ref() == Some(&labels) {
            return ControlFlow::Continue(());
        }
        sent = Some(labels.clone());
        match inputs.send(Input::Namespace(labels)) {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    })
    .await;
}
