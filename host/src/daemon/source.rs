//! Where templates and the node come from: the Kubernetes API (watches,
//! [`super::watch`]), or a directory of PodTemplate files (inotify).
//!
//! Invariants:
//! * One object cannot stop a watch: objects are received as [`Raw`] JSON
//!   and each is parsed on its own, so a template the typed model cannot
//!   decode is an `InvalidTemplate` of that template alone, and a Node field
//!   podstamp does not use cannot stop rendering.
//! * No object's content is ever logged: errors name the object and the
//!   field.
//! * A template file that cannot be read (an I/O error) is `ReadFailed`, not
//!   `InvalidTemplate`, and is read again with backoff until it can be.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PodTemplate};
use kube::{Api, Client, Resource};
use serde_json::Value;

use super::backoff::{self, Backoff};
use super::inbox::{Incoming, Input, SourceError};
use super::metrics::Metrics;
use super::poll::wait_readable;
use super::raw::Raw;
use super::watch::{self, Event, Spec};
use crate::node::NodeContext;
use crate::template::{Template, parse_document};

/// A PodTemplate's key: `namespace/name`.
fn api_key(object: &Raw<PodTemplate>) -> String {
    format!("{}/{}", object.namespace(), object.name())
}

/// Turns a PodTemplate from the API into what the reconciler takes. The
/// template's own parse reports what is wrong with it, naming the field.
pub fn incoming_from_api(object: &Raw<PodTemplate>) -> Incoming {
    let id = api_key(object);
    let template = Template::from_value(object.value())
        .map_err(|e| SourceError::Invalid(format!("PodTemplate {id}: {e}")));
    Incoming {
        key: id.clone(),
        id: Some(id),
        template,
        reference: Some(object.object_ref(&())),
    }
}

/// Watches the PodTemplates in `namespace` that match `selector`
/// ([`watch::run`]: a list, then a watch resumed where it stopped, listed
/// again only after 410 Gone).
pub async fn watch_templates(
    client: Client,
    namespace: String,
    selector: String,
    watch_timeout: Option<u32>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let api: Api<Raw<PodTemplate>> = Api::namespaced(client, &namespace);
    let spec = Spec::new("podtemplates", "podtemplates", watch_timeout).labels(&selector);
    watch::run(api, spec, metrics, Backoff::new(), |event| {
        let input = match event {
            Event::Listing => Input::ListStarted,
            Event::Listed(t) => Input::Listed(incoming_from_api(&t)),
            Event::ListDone => Input::ListDone,
            Event::Applied(t) => Input::Applied(incoming_from_api(&t)),
            Event::Deleted(t) => Input::Deleted { key: api_key(&t) },
            Event::Resumed | Event::Failed(_) => return ControlFlow::Continue(()),
        };
        match inputs.send(input) {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    })
    .await;
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
    let api: Api<Raw<Node>> = Api::all(client);
    let spec =
        Spec::new("node", "node", watch_timeout).fields(&format!("metadata.name={node_name}"));
    // Whether the list being read holds the Node.
    let mut seen = false;
    // The last problem reported for the Node, to report each one once (the
    // Node changes with every status update).
    let mut reported = None;
    // The watch failed and has not listed or resumed since: said once per
    // outage, since which templates are for this node now rests on labels
    // that may be stale.
    let mut down = false;
    watch::run(api, spec, metrics, Backoff::new(), |event| {
        match &event {
            Event::Failed(_) if !down => {
                down = true;
                tracing::warn!(node = %node_name,
                    "the Node cannot be watched: its labels as last seen decide which templates are for this node (podstamp.io/node-selector), and nothing is installed or removed for a label change until it is watched again");
            }
            Event::ListDone | Event::Resumed if down => {
                down = false;
                tracing::info!(node = %node_name, "the Node is watched again");
            }
            _ => {}
        }
        match event {
            Event::Listing => seen = false,
            Event::Listed(node) | Event::Applied(node) => {
                seen = true;
                if let Some(context) = node_input(&node_name, &node, &mut reported)
                    && inputs.send(Input::Node(context)).is_err()
                {
                    return ControlFlow::Break(());
                }
            }
            Event::ListDone if !seen => tracing::warn!(node = %node_name,
                "the Node does not exist (yet); templates are rendered once it does"),
            Event::Deleted(_) => tracing::warn!(node = %node_name,
                "the Node was deleted; rendering goes on with what was last known of it"),
            Event::ListDone | Event::Resumed | Event::Failed(_) => {}
        }
        ControlFlow::Continue(())
    })
    .await;
}

/// The node context from a Node as the API server sent it, reporting (once
/// each) a field podstamp needs but cannot read, in which case rendering
/// goes on with what was last known of the node, and a field only the typed
/// model cannot decode, which podstamp does not use.
fn node_input(
    node_name: &str,
    node: &Raw<Node>,
    reported: &mut Option<String>,
) -> Option<NodeContext> {
    let mut report = |problem: String, used: bool| {
        if reported.as_deref() == Some(problem.as_str()) {
            return;
        }
        if used {
            tracing::error!(node = %node_name,
                "{problem}; podstamp needs this field: rendering goes on with what was last known of the Node");
        } else {
            tracing::warn!(node = %node_name,
                "{problem}; podstamp cannot decode this field, but does not use it and goes on rendering (other clients built on the same Kubernetes model may fail on this Node)");
        }
        *reported = Some(problem);
    };
    let context = match NodeContext::from_value(node.value()) {
        Ok(context) => context,
        Err(e) => {
            report(format!("Node {}: {e}", node.name()), true);
            return None;
        }
    };
    match crate::node::undecodable_field(node.value()) {
        Some(e) => report(format!("Node {}: {e}", node.name()), false),
        None => *reported = None,
    }
    Some(context)
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
/// An I/O error is [`SourceError::Unreadable`]; a file too large is the
/// template's fault.
fn read_bounded(path: &Path, limit: u64, origin: &str) -> Result<Vec<u8>, SourceError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))
        .map_err(|e| {
            SourceError::Unreadable(format!(
                "{origin}: cannot read the template file: {e}; this is not the template's fault, it is read again shortly"
            ))
        })?;
    if bytes.len() as u64 > limit {
        return Err(SourceError::Invalid(format!(
            "{origin}: over {} MiB; a template file is at most that large",
            limit >> 20
        )));
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
    let parsed = read_bounded(path, MAX_TEMPLATE_FILE, &origin).and_then(|bytes| {
        parse_document(&bytes, &origin).map_err(|e| SourceError::Invalid(e.to_string()))
    });
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
        Template::from_value(&value).map_err(|e| SourceError::Invalid(format!("{origin}: {e}")))
    });
    Incoming {
        key,
        id,
        template,
        reference: None,
    }
}

/// Files of the directory source that could not be read, read again with
/// exponential backoff (the same as the watches') until they can be.
#[derive(Default)]
struct Unreadable {
    files: BTreeMap<OsString, (Instant, Backoff)>,
}

impl Unreadable {
    /// Notes how reading `name` went.
    fn note(&mut self, name: &OsStr, incoming: &Incoming) {
        if matches!(incoming.template, Err(SourceError::Unreadable(_))) {
            let (due, backoff) = self
                .files
                .entry(name.to_os_string())
                .or_insert_with(|| (Instant::now(), Backoff::new()));
            *due = Instant::now() + backoff.delay();
        } else {
            self.files.remove(name);
        }
    }

    /// How long until the next file is due; None when none is unreadable.
    fn wait(&self) -> Option<Duration> {
        let next = self.files.values().map(|(due, _)| *due).min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// The files due to be read again.
    fn due(&self) -> Vec<OsString> {
        let now = Instant::now();
        self.files
            .iter()
            .filter(|(_, (due, _))| *due <= now)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// Runs the directory source on the calling thread until `inputs` closes.
/// A directory that cannot be watched or listed (it went away, was moved,
/// or the process is out of file descriptors) is tried again with backoff,
/// and meanwhile nothing changes on disk: only a complete listing tells the
/// reconciler which templates are gone.
pub fn run_dir_source(dir: PathBuf, namespace: String, inputs: Sender<Input>) {
    let mut backoff = Backoff::new();
    let mut last_problem = None;
    loop {
        let problem = match watch_dir(&dir, &namespace, &inputs, &mut backoff) {
            Ok(DirEnd::Closed) => return,
            Ok(DirEnd::Gone) => "the template directory went away".to_string(),
            Err(e) => format!("the template directory cannot be watched or listed: {e}"),
        };
        let delay = backoff.delay();
        if last_problem.as_ref() != Some(&problem) {
            tracing::error!(dir = %dir.display(),
                "{problem}; keeping the manifests as they are, and trying again (every {:?} at most)", backoff::MAX);
            last_problem = Some(problem);
        } else {
            tracing::debug!(dir = %dir.display(), "{problem}; trying again in {delay:?}");
        }
        std::thread::sleep(delay);
    }
}

/// Why [`watch_dir`] returned.
enum DirEnd {
    /// The reconciler is gone: the daemon is stopping.
    Closed,
    /// The directory was removed or moved away.
    Gone,
}

/// Watches `dir` for PodTemplate files (`*.yaml`, `*.yml`, `*.json`, not
/// dot-files) with inotify, after one complete listing, until `inputs`
/// closes or the directory goes away. A file that cannot be read is read
/// again with backoff until it can be, with or without a change to it.
fn watch_dir(
    dir: &Path,
    namespace: &str,
    inputs: &Sender<Input>,
    backoff: &mut Backoff,
) -> std::io::Result<DirEnd> {
    use inotify::{Inotify, WatchMask};
    let mut inotify = Inotify::init()?;
    // Watch before listing, so that no change falls in between.
    inotify.watches().add(
        dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF,
    )?;
    let send = |input| inputs.send(input).is_ok();
    let mut unreadable = Unreadable::default();
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| is_template_file(&e.file_name()) && e.path().is_file())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    if !send(Input::ListStarted) {
        return Ok(DirEnd::Closed);
    }
    for name in names {
        let incoming = incoming_from_file(&dir.join(&name), namespace);
        unreadable.note(&name, &incoming);
        if !send(Input::Listed(incoming)) {
            return Ok(DirEnd::Closed);
        }
    }
    if !send(Input::ListDone) {
        return Ok(DirEnd::Closed);
    }
    backoff.reset();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        wait_readable(&inotify, unreadable.wait())?;
        let mut changed: BTreeSet<OsString> = unreadable.due().into_iter().collect();
        let events = match inotify.read_events(&mut buffer) {
            Ok(events) => Some(events),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => return Err(e),
        };
        for event in events.into_iter().flatten() {
            if event
                .mask
                .intersects(inotify::EventMask::DELETE_SELF | inotify::EventMask::MOVE_SELF)
            {
                return Ok(DirEnd::Gone);
            }
            if let Some(name) = event.name
                && is_template_file(name)
            {
                changed.insert(name.to_os_string());
            }
        }
        for name in changed {
            let path = dir.join(&name);
            // Gone only when it is known to be: a file whose status cannot
            // be read is read (and reported) like any other.
            let gone = match std::fs::metadata(&path) {
                Ok(meta) => !meta.is_file(),
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            };
            let input = if gone {
                unreadable.files.remove(&name);
                Input::Deleted {
                    key: name.to_string_lossy().into_owned(),
                }
            } else {
                let incoming = incoming_from_file(&path, namespace);
                unreadable.note(&name, &incoming);
                Input::Applied(incoming)
            };
            if !send(input) {
                return Ok(DirEnd::Closed);
            }
        }
    }
}
