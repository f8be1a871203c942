//! The ConfigMaps a catalog names (the catalog's own, and those holding
//! plugin components), as this daemon last saw them in the API.
//!
//! Invariants:
//! * Each ConfigMap is watched on its own, with a field selector on its
//!   name, so that RBAC can grant exactly the names the catalog uses
//!   (`resourceNames`) and nothing else in the namespace.
//! * What is known of a ConfigMap only ever moves forward: an outage or a
//!   watch restart leaves the last seen object in place (never "absent"),
//!   and the change callback fires only when the object really changed
//!   (another resourceVersion, created, deleted) or the watch's failure
//!   changed, never at each renewal of the watch.
//! * A reader waits for the first answer about a name it just asked for,
//!   for a bounded time, and then gets an error saying what is missing;
//!   it never blocks the render thread (it is called by the catalog loader).
//! * No ConfigMap's content is logged.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, Resource};
use serde_json::Value;

use super::backoff::Backoff;
use super::metrics::Metrics;
use super::raw::Raw;
use super::watch::{self, Event, Spec, WatchError};

/// How long [`ConfigMapWatches::get`] waits for the first answer about a
/// ConfigMap it was not watching yet.
pub const FIRST_ANSWER: Duration = Duration::from_secs(10);

/// What is known of one ConfigMap.
#[derive(Debug, Clone, PartialEq)]
pub enum Known {
    /// Asked for; the API server has not answered yet.
    Pending,
    /// The API server said it does not exist.
    Absent,
    /// The object as last seen, and its resourceVersion.
    Present { object: Arc<Value>, version: String },
}

/// Why a ConfigMap cannot be read now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigMapError {
    /// The API server refused to show it; the message names the permission.
    #[error("ConfigMap {namespace}/{name}: {message}")]
    Refused {
        namespace: String,
        name: String,
        message: String,
    },
    /// No answer yet (the API server is unreachable, or slow).
    #[error(
        "ConfigMap {namespace}/{name}: no answer from the API server within {waited:?} (it may be unreachable); the catalog in use stays"
    )]
    NoAnswer {
        namespace: String,
        name: String,
        waited: Duration,
    },
}

struct Watched {
    known: Known,
    /// The last failure of this watch, when the API server refused it.
    refused: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

struct Watches {
    watched: BTreeMap<String, Watched>,
}

struct Shared {
    client: Client,
    namespace: String,
    watch_timeout: Option<u32>,
    runtime: tokio::runtime::Handle,
    state: Mutex<Watches>,
    answered: Condvar,
    on_change: Box<dyn Fn(&str) + Send + Sync>,
    metrics: Arc<Metrics>,
}

/// The watched ConfigMaps of one namespace. Cheap to clone.
#[derive(Clone)]
pub struct ConfigMapWatches {
    shared: Arc<Shared>,
}

impl ConfigMapWatches {
    /// Watches nothing yet; `on_change(name)` is called (from the async
    /// runtime: it must not block) whenever what is known of a watched
    /// ConfigMap changes.
    pub fn new(
        client: Client,
        namespace: String,
        watch_timeout: Option<u32>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
        on_change: impl Fn(&str) + Send + Sync + 'static,
    ) -> ConfigMapWatches {
        ConfigMapWatches {
            shared: Arc::new(Shared {
                client,
                namespace,
                watch_timeout,
                runtime,
                state: Mutex::new(Watches {
                    watched: BTreeMap::new(),
                }),
                answered: Condvar::new(),
                on_change: Box::new(on_change),
                metrics,
            }),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// Watches exactly `names` from now on: starts the watches that are
    /// new, stops those no longer named.
    pub fn keep<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let wanted: std::collections::BTreeSet<&str> = names.into_iter().collect();
        let mut state = self.shared.lock();
        state.watched.retain(|name, watched| {
            let keep = wanted.contains(name.as_str());
            if !keep {
                watched.task.abort();
            }
            keep
        });
        for name in wanted {
            self.start(&mut state, name);
        }
    }

    fn start(&self, state: &mut MutexGuard<'_, Watches>, name: &str) {
        if state.watched.contains_key(name) {
            return;
        }
        let task = self
            .shared
            .runtime
            .spawn(watch(Arc::downgrade(&self.shared), name.to_string()));
        state.watched.insert(
            name.to_string(),
            Watched {
                known: Known::Pending,
                refused: None,
                task,
            },
        );
    }

    /// The ConfigMap `name` as last seen (None: it does not exist), watching
    /// it from now on if it was not watched. Blocks up to `wait` for the
    /// first answer about a name not seen yet; call it off the async
    /// runtime's threads.
    pub fn get(&self, name: &str, wait: Duration) -> Result<Option<Arc<Value>>, ConfigMapError> {
        let shared = &self.shared;
        let until = Instant::now() + wait;
        let mut state = shared.lock();
        self.start(&mut state, name);
        loop {
            let watched = &state.watched[name];
            match &watched.known {
                Known::Present { object, .. } => return Ok(Some(object.clone())),
                Known::Absent => return Ok(None),
                Known::Pending => {}
            }
            if let Some(message) = &watched.refused {
                return Err(ConfigMapError::Refused {
                    namespace: shared.namespace.clone(),
                    name: name.to_string(),
                    message: message.clone(),
                });
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConfigMapError::NoAnswer {
                    namespace: shared.namespace.clone(),
                    name: name.to_string(),
                    waited: wait,
                });
            }
            state = shared
                .answered
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Watches> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what the watch of `name` learnt; tells `on_change` when it
    /// is news.
    fn learn(&self, name: &str, known: Option<Known>, refused: Option<Option<String>>) {
        let changed = {
            let mut state = self.lock();
            let Some(watched) = state.watched.get_mut(name) else {
                return;
            };
            let mut changed = false;
            if let Some(known) = known {
                let same = match (&watched.known, &known) {
                    (Known::Present { version: a, .. }, Known::Present { version: b, .. }) => {
                        a == b
                    }
                    (a, b) => a == b,
                };
                if !same {
                    watched.known = known;
                    changed = true;
                }
            }
            if let Some(refused) = refused
                && watched.refused != refused
            {
                watched.refused = refused;
                changed = true;
            }
            changed
        };
        if changed {
            self.answered.notify_all();
            (self.on_change)(name);
        }
    }
}

/// One ConfigMap's watch, until the watches are dropped or it is no
/// longer wanted (the task is aborted).
async fn watch(shared: std::sync::Weak<Shared>, name: String) {
    let Some(strong) = shared.upgrade() else {
        return;
    };
    let api: Api<Raw<ConfigMap>> = Api::namespaced(strong.client.clone(), &strong.namespace);
    let spec = Spec::new(
        format!("configmap {}/{name}", strong.namespace),
        "configmaps",
        strong.watch_timeout,
    )
    .fields(&format!("metadata.name={name}"));
    let metrics = strong.metrics.clone();
    drop(strong);
    // Whether the list being read holds the ConfigMap.
    let mut seen = false;
    watch::run(api, spec, metrics, Backoff::new(), |event| {
        let Some(shared) = shared.upgrade() else {
            return ControlFlow::Break(());
        };
        let present = |object: &Raw<ConfigMap>| Known::Present {
            version: object.meta().resource_version.clone().unwrap_or_default(),
            object: Arc::new(object.value().clone()),
        };
        match event {
            Event::Listing => seen = false,
            Event::Listed(object) | Event::Applied(object) => {
                seen = true;
                shared.learn(&name, Some(present(&object)), Some(None));
            }
            Event::ListDone if !seen => shared.learn(&name, Some(Known::Absent), Some(None)),
            // Answered: whatever refused it before no longer does.
            Event::ListDone | Event::Resumed => shared.learn(&name, None, Some(None)),
            Event::Deleted(_) => shared.learn(&name, Some(Known::Absent), Some(None)),
            Event::Failed(e) => {
                if let Some(message) = refusal(e) {
                    shared.learn(&name, None, Some(Some(message)));
                }
            }
        }
        ControlFlow::Continue(())
    })
    .await;
}

/// The API server's refusal in a watch error, worded with what to do.
fn refusal(error: &WatchError) -> Option<String> {
    match error.client()? {
        kube::Error::Api(status) if status.is_forbidden() => Some(format!(
            "permission denied: {}; grant podstamp get, list and watch on this ConfigMap (its name in the resourceNames of the Role podstamp, deploy/rbac.yaml)",
            status.message
        )),
        kube::Error::Api(status) if status.code == 401 => Some(format!(
            "unauthorized: {}; check podstamp's credentials",
            status.message
        )),
        _ => None,
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for watched in state.watched.values() {
            watched.task.abort();
        }
    }
}

/// The object reference of a ConfigMap, for Events about it.
pub fn reference(object: &Value) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
    let raw: Raw<ConfigMap> = Raw::from_value(object.clone());
    (!raw.name().is_empty()).then(|| raw.object_ref(&()))
}
