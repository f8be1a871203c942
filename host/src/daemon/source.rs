//! Where templates and the node come from: the Kubernetes API (watches with
//! kube-runtime), or a directory of PodTemplate files (inotify).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PodTemplate};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde_json::Value;

use super::metrics::Metrics;
use super::reconcile::{Incoming, Input};
use crate::node::NodeContext;
use crate::template::{Template, parse_document};

/// Exponential backoff with jitter between watch restarts.
struct Backoff {
    next: Duration,
}

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);

impl Backoff {
    fn new() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
    fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
    /// A delay in [next/2, next), then doubles next (up to the maximum).
    fn delay(&mut self) -> Duration {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let fraction = 0.5 + f64::from(nanos % 1000) / 2000.0;
        let delay = self.next.mul_f64(fraction);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

/// Turns a PodTemplate from the API into what the reconciler takes.
pub fn incoming_from_api(object: &PodTemplate) -> Incoming {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let id = format!("{namespace}/{name}");
    let template = serde_json::to_value(object)
        .map_err(|e| e.to_string())
        .and_then(|value| {
            Template::from_value(&value).map_err(|e| format!("PodTemplate {id}: {e}"))
        });
    Incoming {
        key: id.clone(),
        id: Some(id),
        template,
        reference: Some(object.object_ref(&())),
    }
}

/// Logs a watch error; a forbidden one says which permission is missing
/// (the API server's message names the verb, the resource and the namespace).
fn log_watch_error(watch: &str, error: &watcher::Error) {
    let source = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Some(e),
        _ => None,
    };
    if let watcher::Error::WatchError(status) = error
        && status.code == 410
    {
        tracing::warn!(
            watch,
            "watch history expired (410 Gone: {}); listing again (manifests on disk are kept)",
            status.message
        );
        return;
    }
    match source {
        Some(kube::Error::Api(status)) if status.code == 401 => tracing::error!(
            watch,
            "unauthorized: the API server does not accept podstamp's credentials ({}); check the bearer token or client certificate of the kubeconfig (--kubeconfig) or the ServiceAccount token",
            status.message
        ),
        Some(kube::Error::Api(status)) if status.is_forbidden() => tracing::error!(
            watch,
            "permission denied: {}; grant it to podstamp's ServiceAccount (see deploy/rbac.yaml)",
            status.message
        ),
        _ => tracing::warn!(
            watch,
            "watch failed, the API server may be unreachable (manifests on disk are kept): {error}"
        ),
    }
}

/// Watches the PodTemplates in `namespace` that match `selector`. After an
/// error the watch starts over with a fresh list, after a backoff with jitter.
pub async fn watch_templates(
    client: Client,
    namespace: String,
    selector: String,
    watch_timeout: Option<u32>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let api: Api<PodTemplate> = Api::namespaced(client, &namespace);
    let mut config = watcher::Config::default().labels(&selector);
    if let Some(secs) = watch_timeout {
        config = config.timeout(secs);
    }
    let mut backoff = Backoff::new();
    loop {
        let mut stream = std::pin::pin!(watcher::watcher(api.clone(), config.clone()));
        while let Some(event) = stream.next().await {
            let input = match event {
                Ok(Event::Init) => Input::ListStarted,
                Ok(Event::InitApply(t)) => Input::Listed(incoming_from_api(&t)),
                Ok(Event::InitDone) => {
                    backoff.reset();
                    Input::ListDone
                }
                Ok(Event::Apply(t)) => Input::Applied(incoming_from_api(&t)),
                Ok(Event::Delete(t)) => Input::Deleted {
                    key: incoming_from_api(&t).key,
                },
                Err(e) => {
                    log_watch_error("podtemplates", &e);
                    break;
                }
            };
            if inputs.send(input).is_err() {
                return;
            }
        }
        metrics.watch_restart("podtemplates");
        tokio::time::sleep(backoff.delay()).await;
    }
}

/// Watches this node's own Node object (a field selector on its name, so
/// that RBAC need grant no more than reading nodes).
pub async fn watch_node(
    client: Client,
    node_name: String,
    watch_timeout: Option<u32>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let api: Api<Node> = Api::all(client);
    let mut config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    if let Some(secs) = watch_timeout {
        config = config.timeout(secs);
    }
    let mut backoff = Backoff::new();
    loop {
        let mut stream = std::pin::pin!(watcher::watcher(api.clone(), config.clone()));
        let mut seen = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Init) => seen = false,
                Ok(Event::InitApply(node) | Event::Apply(node)) => {
                    seen = true;
                    match NodeContext::from_node(&node) {
                        Ok(context) => {
                            if inputs.send(Input::Node(context)).is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::error!(node = %node_name, "unusable Node: {e}"),
                    }
                }
                Ok(Event::InitDone) => {
                    backoff.reset();
                    if !seen {
                        tracing::warn!(node = %node_name,
                            "the Node does not exist (yet); templates are rendered once it does");
                    }
                }
                Ok(Event::Delete(_)) => tracing::warn!(node = %node_name,
                    "the Node was deleted; rendering goes on with what was last known of it"),
                Err(e) => {
                    log_watch_error("node", &e);
                    break;
                }
            }
        }
        metrics.watch_restart("node");
        tokio::time::sleep(backoff.delay()).await;
    }
}

/// Whether a directory entry is a template file of the directory source.
fn is_template_file(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.ends_with(ext))
}

/// The largest template file the directory source reads (the API server
/// refuses objects of more than a few MiB; this bounds memory, not content).
pub const MAX_TEMPLATE_FILE: u64 = 16 << 20;

/// A file's content, refusing one over `limit` bytes without reading it all.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "over {} MiB; a template file is at most that large",
                limit >> 20
            ),
        ));
    }
    Ok(bytes)
}

/// Reads one template file of the directory source. A template without a
/// namespace is in the daemon's.
pub fn incoming_from_file(path: &Path, namespace: &str) -> Incoming {
    let key = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let origin = path.display().to_string();
    let parsed = read_bounded(path, MAX_TEMPLATE_FILE)
        .map_err(|e| format!("{origin}: {e}"))
        .and_then(|bytes| parse_document(&bytes, &origin).map_err(|e| e.to_string()));
    let mut id = None;
    let template = parsed.and_then(|mut value| {
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
            && !meta.contains_key("namespace")
        {
            meta.insert("namespace".into(), Value::String(namespace.to_string()));
        }
        if let Some(name) = value.pointer("/metadata/name").and_then(Value::as_str) {
            let ns = value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(namespace);
            id = Some(format!("{ns}/{name}"));
        }
        Template::from_value(&value).map_err(|e| format!("{origin}: {e}"))
    });
    Incoming {
        key,
        id,
        template,
        reference: None,
    }
}

/// Watches `dir` for PodTemplate files (`*.yaml`, `*.yml`, `*.json`, not
/// dot-files) with inotify, on the calling thread, until `inputs` closes.
pub fn watch_dir(dir: PathBuf, namespace: String, inputs: Sender<Input>) -> std::io::Result<()> {
    use inotify::{Inotify, WatchMask};
    let mut inotify = Inotify::init()?;
    // Watch before listing, so that no change falls in between.
    inotify.watches().add(
        &dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF,
    )?;
    let send = |input| inputs.send(input).is_ok();
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .filter(|e| is_template_file(&e.file_name()) && e.path().is_file())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    if !send(Input::ListStarted) {
        return Ok(());
    }
    for name in names {
        if !send(Input::Listed(incoming_from_file(
            &dir.join(name),
            &namespace,
        ))) {
            return Ok(());
        }
    }
    if !send(Input::ListDone) {
        return Ok(());
    }
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let mut changed = BTreeSet::new();
        for event in inotify.read_events_blocking(&mut buffer)? {
            if event
                .mask
                .intersects(inotify::EventMask::DELETE_SELF | inotify::EventMask::MOVE_SELF)
            {
                tracing::error!(dir = %dir.display(), "the template directory went away; keeping the manifests as they are");
                return Ok(());
            }
            if let Some(name) = event.name
                && is_template_file(name)
            {
                changed.insert(name.to_os_string());
            }
        }
        for name in changed {
            let path = dir.join(&name);
            let input = if path.is_file() {
                Input::Applied(incoming_from_file(&path, &namespace))
            } else {
                Input::Deleted {
                    key: name.to_string_lossy().into_owned(),
                }
            };
            if !send(input) {
                return Ok(());
            }
        }
    }
}
