//! The reconciler: the desired state (templates and the node) → the manifest
//! directory.
//!
//! It runs on a thread of its own, since plugin calls are synchronous, and is
//! fed [`Input`]s by the sources. A burst of inputs is coalesced: everything
//! queued is applied before anything is rendered, with no added delay.
//!
//! The rules it keeps:
//! * Only files whose `podstamp.io/source` annotation names a template in the
//!   daemon's namespace are podstamp's; every other file is never touched.
//! * A manifest is removed only because a template is gone, and that is known
//!   only after a complete, successful list (or a watch event saying so). An
//!   unreachable API server changes nothing on disk.
//! * A failed render keeps the last good manifest and is reported (log,
//!   metrics, an Event when the template came from the API).
//! * Two templates producing the same pod name: the first one keeps it, the
//!   later one fails.
//! * A template the source could not read (an I/O error) is not the
//!   template's fault (`ReadFailed`, read again by the source); while a file
//!   never read is unreadable, nothing is garbage-collected, since its
//!   manifest could be any of ours.
//! * Nothing renders before a catalog is in use ([`Input::Catalog`]): a
//!   missing catalog is never an empty chain, which would rewrite every
//!   manifest without its plugins.
//! * A new catalog replaces the old one between two passes, whole; only the
//!   templates whose chain changed (its [`Chain::fingerprint`], or the error
//!   naming it) are rendered again: every other manifest is left untouched.
//! * Every revision in place is followed through its mirror pod
//!   ([`super::rollout`]); a new revision that fails within its progress
//!   deadline is replaced by the previous good one from the revision history
//!   ([`super::revisions`]), and is not written again while the template
//!   renders it and the good one is in place, whole, also across restarts
//!   ([`super::rollout_state`]). A first revision has nothing to fall back
//!   to: it stays.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::chain::Chain;
use crate::config::Catalog;
use crate::fleet::{self, TemplateStatus, policy};
use crate::manifest;
use crate::node::NodeContext;
use crate::reason::Reason;
use crate::render::{RenderError, Rendered, Stage, check_size, render_unverified};
use crate::template::Template;
use crate::write::{self, Outcome};

use super::events::{EventSink, Report};
use super::gate::{Answer, Decision, Gate, phase_of};
use super::metrics::{Metrics, RenderResult};
use super::mirror::Observation;
use super::revisions::Store;
use super::rollout::{self, Phase, Tracker, Verdict};
use super::rollout_state::State;

/// Files larger than this in the manifest directory are not read for
/// ownership (no manifest podstamp writes is near it).
const MAX_SCANNED_FILE: u64 = 16 << 20;

/// The longest failure message logged and kept per template (to report
/// each distinct failure once). Every part of one is bounded where it is
/// made (a plugin's error text to 4 KiB, its message and field each); this
/// holds whatever a future message holds.
const MAX_FAILURE_MESSAGE: usize = 12 << 10;

/// What the sources tell the reconciler.
#[derive(Debug)]
pub enum Input {
    /// A complete list of the templates begins; until [`Input::ListDone`] the
    /// templates seen so far stay as they are.
    ListStarted,
    /// One template of the list.
    Listed(Incoming),
    /// The list is complete: templates not in it are gone.
    ListDone,
    /// A template was added or changed.
    Applied(Incoming),
    /// A template was deleted (or no longer matches the selector).
    Deleted { key: String },
    /// The node the daemon renders for, as now known.
    Node(NodeContext),
    /// A whole, loaded catalog to use from the next pass on. Shared with the
    /// loader, which keeps it to compare (and reuse) at the next reload.
    Catalog(Arc<Catalog>),
    /// What a mirror pod of ours says.
    Mirror(Observation),
    /// The watch on this node's pods listed them all (or, after a failure,
    /// resumed where it stopped): rollouts can be judged from now on.
    MirrorSynced,
    /// The watch on this node's pods failed (say, no permission): no
    /// rollout is judged until it lists or resumes again, so that no
    /// deadline passes for want of a status nobody could read.
    MirrorLost,
    /// The coordinator of rollouts across nodes answers ([`Gate`]).
    Fleet(Answer),
}

/// A template as a source delivers it.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// Unique within the source: `namespace/name` from the API, the file name
    /// from a directory.
    pub key: String,
    /// `namespace/name`, when it could be read even if the template is invalid.
    pub id: Option<String>,
    pub template: Result<Template, SourceError>,
    /// The PodTemplate object, for Events; None from a directory.
    pub reference: Option<ObjectReference>,
}

/// Why a source could not deliver a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The template is wrong (it does not parse, or is not a valid
    /// PodTemplate): only an edit fixes it. Reason `InvalidTemplate`.
    #[error("{0}")]
    Invalid(String),
    /// The template could not be read (an I/O error such as "Too many open
    /// files"): not the template's fault. The source reads it again, with
    /// backoff; until then nothing is garbage-collected on its account.
    /// Reason `ReadFailed`.
    #[error("{0}")]
    Unreadable(String),
}

impl SourceError {
    /// The failure reason reported for it.
    pub fn reason(&self) -> Reason {
        match self {
            SourceError::Invalid(_) => Reason::InvalidTemplate,
            SourceError::Unreadable(_) => Reason::ReadFailed,
        }
    }
}

struct Entry {
    incoming: Incoming,
    /// The last known `namespace/name`; kept when the template turns invalid.
    id: Option<String>,
    /// Arrival order: of two templates producing the same pod name, the
    /// earlier keeps it.
    seq: u64,
    /// The manifest file this entry last wrote or confirmed.
    claims: Option<String>,
    /// The last failure reported, to report each distinct failure once.
    last_error: Option<String>,
    /// The chain this entry was last rendered with (its fingerprint, or why
    /// the catalog gave none); None when its render stopped before the chain
    /// mattered. A new catalog renders the entry again only if it differs.
    chain: Option<ChainKey>,
    /// An update not written for now (waiting for a slot, or halted), and
    /// why; None once the manifest holds what the template renders.
    gated: Option<Gated>,
    /// The revision of the manifest in place, as last written or found.
    in_place: Option<String>,
}

/// Why an update of a manifest in place is not written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gated {
    /// Waiting for a slot to write `target`.
    Waiting { target: String, slots: u32 },
    /// `target` failed on a node.
    Halted { target: String, why: String },
}

/// What a template's render depends on in the catalog.
type ChainKey = Result<[u8; 32], String>;

fn chain_key(catalog: &Catalog, template: &Template) -> ChainKey {
    catalog
        .chain_for(&template.annotations)
        .map(|chain| chain.fingerprint())
        .map_err(|e| e.to_string())
}

/// A render that ended with its manifest in place.
struct Done {
    file: String,
    outcome: Outcome,
    /// `namespace/name` of the template, as the manifest says.
    source: String,
    revision: String,
    deadline: Duration,
    /// The revision rendered is held (it failed); the file keeps another.
    held: bool,
    /// The update is not written for now; the file keeps another revision.
    gated: Option<Gated>,
    /// The rollout target rendered (with a gate only).
    target: Option<String>,
}

/// A failed render, as reported.
struct Failure {
    reason: Reason,
    plugin: Option<String>,
    message: String,
}

pub struct Reconciler {
    dir: PathBuf,
    namespace: String,
    /// None until the first [`Input::Catalog`]: nothing renders meanwhile.
    catalog: Option<Arc<Catalog>>,
    metrics: Arc<Metrics>,
    events: Option<EventSink>,
    node: Option<NodeContext>,
    entries: BTreeMap<String, Entry>,
    pending: Option<BTreeMap<String, Incoming>>,
    synced: bool,
    next_seq: u64,
    /// Manifest files of ours on disk: file name → `podstamp.io/source`.
    owned: BTreeMap<String, String>,
    dirty: BTreeSet<String>,
    gc_due: bool,
    waiting_for_node_logged: bool,
    waiting_for_catalog_logged: bool,
    /// When the first complete list arrived, until the first sync is done.
    first_list_at: Option<Instant>,
    /// Files were renamed or removed in the directory since it was last
    /// synced; synced once at the end of a pass, for all of them.
    dir_unsynced: bool,
    /// `limits.maxManifestSize` as resolved ([`crate::settings`]): the
    /// largest manifest written; the plugins' output limit alone would let
    /// a template rendered without plugins through.
    max_manifest_bytes: usize,
    /// The revision history; None keeps none (the library's tests).
    revisions: Option<Store>,
    rollouts: Tracker,
    /// The pods watch has listed and not failed since: only then are
    /// rollouts followed (never without the API, or without the right to
    /// read pods).
    confirming: bool,
    /// Revisions this daemon wrote while it could not follow rollouts (the
    /// pods watch had not listed yet, or failed), per template: once it can,
    /// they are followed as its own writes, with their Events, rather than
    /// as revisions found in place. Which comes first, the first render or
    /// the pods watch's list, is a race the outcome must not depend on.
    written_unfollowed: BTreeMap<String, String>,
    /// Rollouts across nodes; None with a `dir:` source (nothing to
    /// coordinate through).
    gate: Option<Gate>,
    /// The last failed rollout per template on this node, as reported.
    fleet_failed: BTreeMap<String, fleet::Failed>,
    /// Per template, what its rollouts leave for the next start (held,
    /// good, pending), read from the revision history once, written there
    /// when it changes ([`super::rollout_state`]).
    states: BTreeMap<String, State>,
}

impl Reconciler {
    /// Takes over the manifest directory: removes our stray temp files and
    /// finds the manifests that are ours. Nothing is deleted here, and
    /// nothing is rendered before a catalog arrives ([`Input::Catalog`]).
    pub fn new(
        dir: PathBuf,
        namespace: String,
        max_manifest_bytes: usize,
        metrics: Arc<Metrics>,
        events: Option<EventSink>,
    ) -> std::io::Result<Reconciler> {
        let removed = write::remove_stale_temp_files(&dir)?;
        if removed > 0 {
            tracing::info!(dir = %dir.display(), removed, "removed stale temporary files");
        }
        let mut owned = BTreeMap::new();
        let prefix = format!("{namespace}/");
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if name.starts_with('.') || !entry.file_type()?.is_file() {
                continue;
            }
            let Some(bytes) = read_regular(&dir.join(&name)) else {
                continue;
            };
            if let Some(o) = manifest::ownership(&bytes)
                && o.source.starts_with(&prefix)
            {
                if !o.intact {
                    tracing::warn!(file = %name, source = %o.source,
                        "manifest was edited by hand; it will be overwritten when its template is next rendered");
                }
                owned.insert(name, o.source);
            }
        }
        tracing::info!(dir = %dir.display(), managed = owned.len(), "found manifests of ours");
        metrics.set_managed(owned.len());
        Ok(Reconciler {
            dir,
            namespace,
            catalog: None,
            metrics,
            events,
            node: None,
            entries: BTreeMap::new(),
            pending: None,
            synced: false,
            next_seq: 0,
            owned,
            dirty: BTreeSet::new(),
            gc_due: false,
            waiting_for_node_logged: false,
            waiting_for_catalog_logged: false,
            first_list_at: None,
            dir_unsynced: false,
            max_manifest_bytes,
            revisions: None,
            rollouts: Tracker::default(),
            confirming: false,
            written_unfollowed: BTreeMap::new(),
            gate: None,
            fleet_failed: BTreeMap::new(),
            states: BTreeMap::new(),
        })
    }

    /// Applies inputs and reconciles until the channel closes. Every
    /// `resync`, every template is rendered again (which rewrites nothing
    /// that is in step).
    pub fn run(mut self, inputs: Receiver<Input>, resync: Duration) {
        let mut last_full = Instant::now();
        loop {
            let mut timeout = resync.saturating_sub(last_full.elapsed());
            if let Some(deadline) = self.rollouts.next_deadline() {
                timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
            }
            match inputs.recv_timeout(timeout) {
                Ok(input) => {
                    self.apply(input);
                    // Coalesce whatever else is queued.
                    while let Ok(input) = inputs.try_recv() {
                        self.apply(input);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if last_full.elapsed() >= resync {
                self.mark_all_dirty();
                last_full = Instant::now();
            }
            self.reconcile();
        }
    }

    pub fn apply(&mut self, input: Input) {
        match input {
            Input::ListStarted => self.pending = Some(BTreeMap::new()),
            Input::Listed(incoming) => {
                self.pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(incoming.key.clone(), incoming);
            }
            Input::ListDone => {
                let listed = self.pending.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .entries
                    .keys()
                    .filter(|k| !listed.contains_key(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.remove(&key);
                }
                for (_, incoming) in listed {
                    self.upsert(incoming);
                }
                if !self.synced {
                    tracing::info!(templates = self.entries.len(), "first complete list");
                    self.first_list_at = Some(Instant::now());
                }
                self.synced = true;
                self.gc_due = true;
                self.mark_all_dirty();
            }
            Input::Applied(incoming) => self.upsert(incoming),
            Input::Deleted { key } => self.remove(&key),
            Input::Node(node) => {
                if self.node.as_ref() != Some(&node) {
                    tracing::info!(node = %node.name, "node changed; rendering every template again");
                    self.node = Some(node);
                    self.mark_all_dirty();
                }
            }
            Input::Catalog(catalog) => self.swap_catalog(catalog),
            Input::Mirror(observation) => self.observe(observation),
            Input::MirrorSynced => {
                if !self.confirming {
                    tracing::info!(
                        "following this node's mirror pods: every revision in place is confirmed"
                    );
                    self.confirming = true;
                    // Each template's revision in place gets followed.
                    self.mark_all_dirty();
                }
            }
            Input::Fleet(answer) => {
                let Some(gate) = &mut self.gate else { return };
                for id in gate.answer(answer) {
                    let keys: Vec<String> = self
                        .entries
                        .iter()
                        .filter(|(_, e)| e.id.as_deref() == Some(id.as_str()))
                        .map(|(k, _)| k.clone())
                        .collect();
                    self.dirty.extend(keys);
                }
            }
            Input::MirrorLost => {
                if self.confirming {
                    self.confirming = false;
                    self.written_unfollowed.extend(self.rollouts.drop_pending());
                }
            }
        }
    }

    /// Puts `catalog` in use and marks dirty the templates whose chain it
    /// changes. The first catalog renders every template.
    fn swap_catalog(&mut self, catalog: Arc<Catalog>) {
        let digest = catalog.digest().to_string();
        self.metrics.set_catalog(&digest);
        let Some(_old) = self.catalog.replace(catalog) else {
            tracing::info!(catalog = %digest, "catalog in use");
            self.mark_all_dirty();
            return;
        };
        let catalog = self.catalog.as_deref().expect("just set");
        let mut changed = 0;
        for (key, entry) in &self.entries {
            let Some(last) = &entry.chain else { continue };
            let Ok(template) = &entry.incoming.template else {
                continue;
            };
            if chain_key(catalog, template) != *last {
                self.dirty.insert(key.clone());
                changed += 1;
            }
        }
        tracing::info!(catalog = %digest, templates = changed,
            "new catalog in use; rendering again the templates whose chain or settings changed");
    }

    fn upsert(&mut self, incoming: Incoming) {
        let key = incoming.key.clone();
        // Once per template version that drops something new, not at every
        // relist or resync.
        let ignored = |incoming: &Incoming| {
            incoming
                .template
                .as_ref()
                .ok()
                .and_then(|t| t.ignored(&self.namespace))
        };
        if let Some(warning) = ignored(&incoming)
            && self.entries.get(&key).and_then(|e| ignored(&e.incoming)) != Some(warning.clone())
        {
            tracing::warn!(
                template = incoming.id.as_deref().unwrap_or(&key),
                "{warning}"
            );
        }
        match self.entries.get_mut(&key) {
            Some(entry) => {
                if incoming.id.is_some() && incoming.id != entry.id {
                    entry.id = incoming.id.clone();
                    self.gc_due = true;
                }
                entry.incoming = incoming;
            }
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.entries.insert(
                    key.clone(),
                    Entry {
                        id: incoming.id.clone(),
                        incoming,
                        seq,
                        claims: None,
                        last_error: None,
                        chain: None,
                        gated: None,
                        in_place: None,
                    },
                );
            }
        }
        self.dirty.insert(key);
    }

    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            tracing::info!(template = key, "template gone");
            if let Some(id) = &entry.id {
                self.rollouts.forget(id);
                self.written_unfollowed.remove(id);
                if let Some(gate) = &mut self.gate {
                    gate.forget(id);
                }
                self.fleet_failed.remove(id);
                self.states.remove(id);
                if let Some(store) = &self.revisions
                    && let Err(e) = store.forget_state(id)
                {
                    tracing::error!(template = %id, "cannot remove the rollout state: {e}");
                }
                self.metrics.forget_rollout(id);
            }
            self.gc_due = true;
            // A template that lost a pod name to this one may have it now.
            let failing: Vec<String> = self
                .entries
                .iter()
                .filter(|(_, e)| e.last_error.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            self.dirty.extend(failing);
        }
    }

    fn mark_all_dirty(&mut self) {
        self.dirty.extend(self.entries.keys().cloned());
    }

    /// Whether the first complete list was applied (and so garbage collection may run).
    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn reconcile(&mut self) {
        self.metrics.set_templates(self.entries.len());
        for (id, verdict) in self.rollouts.expire(Instant::now()) {
            if let Some(r) = self.rollouts.get(&id) {
                self.metrics.set_rollout(&id, &r.revision, r.phase.as_str());
            }
            self.verdict(&id, verdict);
        }
        if self.gc_due && self.synced {
            self.gc_due = false;
            self.collect_garbage();
        }
        if self.node.is_none() {
            if !self.dirty.is_empty() && !self.waiting_for_node_logged {
                tracing::warn!(
                    "the Node is not known yet; not rendering (manifests on disk are kept)"
                );
                self.waiting_for_node_logged = true;
            }
            self.metrics.set_managed(self.owned.len());
            return;
        }
        if self.catalog.is_none() {
            if !self.dirty.is_empty() && !self.waiting_for_catalog_logged {
                tracing::warn!(
                    "no plugin catalog in use yet; not rendering (manifests on disk are kept)"
                );
                self.waiting_for_catalog_logged = true;
            }
            self.metrics.set_managed(self.owned.len());
            return;
        }
        let mut dirty: Vec<(u64, String)> = std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|k| self.entries.get(&k).map(|e| (e.seq, k)))
            .collect();
        dirty.sort();
        let rendered = !dirty.is_empty();
        for (_, key) in dirty {
            self.render_one(&key);
        }
        if rendered && self.synced {
            self.collect_garbage();
        }
        self.release_unneeded_slots();
        self.sync_dir();
        self.metrics.set_managed(self.owned.len());
        if self.synced {
            self.metrics.synced_now();
            if !self.metrics.is_ready() {
                let took = self.first_list_at.take().map(|t| t.elapsed());
                if let Some(took) = took {
                    self.metrics.set_initial_sync(took);
                }
                tracing::info!(
                    managed = self.owned.len(),
                    templates = self.entries.len(),
                    since_list_ms = took.map_or(0, |t| t.as_millis() as u64),
                    "first sync done; ready"
                );
                self.metrics.set_ready();
            }
        }
    }

    /// Makes this pass's renames and removals durable; tried again on the
    /// next pass if it fails.
    fn sync_dir(&mut self) {
        if !self.dir_unsynced {
            return;
        }
        match write::sync_dir(&self.dir) {
            Ok(()) => self.dir_unsynced = false,
            Err(e) => tracing::error!(dir = %self.dir.display(),
                "cannot sync the manifest directory: {e}; the manifests are in place, but a crash now could undo their latest changes"),
        }
    }

    /// Removes our manifests whose template is gone.
    fn collect_garbage(&mut self) {
        // A template file that could not be read, and was never read, may be
        // any template: removing a manifest now could remove its.
        if self.entries.values().any(|e| {
            e.id.is_none() && matches!(e.incoming.template, Err(SourceError::Unreadable(_)))
        }) {
            tracing::debug!(
                "a template file could not be read yet; garbage collection waits for it"
            );
            self.gc_due = true;
            return;
        }
        let live: BTreeSet<&str> = self
            .entries
            .values()
            .filter_map(|e| e.id.as_deref())
            .collect();
        // (template, file) each template wrote; a template that wrote its
        // manifest makes any other file of ours naming it a stale duplicate
        // (say, one renamed by hand).
        let claimed: BTreeSet<(&str, &str)> = self
            .entries
            .values()
            .filter_map(|e| Some((e.id.as_deref()?, e.claims.as_deref()?)))
            .collect();
        let claiming: BTreeSet<&str> = claimed.iter().map(|(id, _)| *id).collect();
        let stale: Vec<(String, String)> = self
            .owned
            .iter()
            .filter(|(file, source)| {
                !live.contains(source.as_str())
                    || (claiming.contains(source.as_str())
                        && !claimed.contains(&(source.as_str(), file.as_str())))
            })
            .map(|(f, s)| (f.clone(), s.clone()))
            .collect();
        for (file, source) in stale {
            let path = self.dir.join(&file);
            // Only what still is ours, as a regular file, is removed.
            let still_ours = read_regular(&path)
                .and_then(|bytes| manifest::ownership(&bytes))
                .is_some_and(|o| o.source == source);
            if still_ours {
                match fs::remove_file(&path) {
                    Ok(()) => {
                        self.dir_unsynced = true;
                        tracing::info!(file = %file, template = %source, "removed manifest: its template is gone, or wrote its manifest under another name");
                        self.metrics.removed();
                    }
                    Err(e) => {
                        tracing::error!(file = %file, "cannot remove manifest: {e}");
                        continue;
                    }
                }
            }
            self.owned.remove(&file);
            for entry in self.entries.values_mut() {
                if entry.claims.as_deref() == Some(file.as_str()) {
                    entry.claims = None;
                }
            }
        }
    }

    /// Coordinates updates with the other nodes through `gate`.
    pub fn set_gate(&mut self, gate: Gate) {
        self.gate = Some(gate);
    }

    /// Keeps the last manifests of each template in `store`.
    pub fn set_revisions(&mut self, store: Store) {
        self.revisions = Some(store);
    }

    fn render_one(&mut self, key: &str) {
        let node = self.node.clone().expect("checked by reconcile");
        let mut chain_seen = None;
        let result = self.try_render(key, &node, &mut chain_seen);
        let entry = self.entries.get_mut(key).expect("dirty keys exist");
        entry.chain = chain_seen;
        let id = entry.id.clone().unwrap_or_else(|| key.to_string());
        match result {
            Ok(done) => {
                let Done { file, outcome, .. } = &done;
                let (file, outcome) = (file.clone(), *outcome);
                entry.claims = Some(file.clone());
                if done.gated.is_none() && !done.held {
                    entry.in_place = Some(done.revision.clone());
                }
                if entry.gated != done.gated {
                    match &done.gated {
                        Some(Gated::Waiting { target, slots }) => {
                            tracing::info!(template = %id, target = %target,
                            "update waits for a rollout slot (at most {slots} node(s) updating at once); the manifest in place stays")
                        }
                        Some(Gated::Halted { why, .. }) => tracing::warn!(template = %id,
                            "update halted: {why}; the manifest in place stays until the template changes"),
                        None => {}
                    }
                    if let (Some(Gated::Halted { why, .. }), Some(events), Some(reference)) =
                        (&done.gated, &self.events, &entry.incoming.reference)
                    {
                        events.report(Report {
                            reference: reference.clone(),
                            reason: Reason::RolloutHalted,
                            note: format!(
                                "node {}: {why}; not written here until the template changes",
                                node.name
                            ),
                            related: None,
                        });
                    }
                    entry.gated = done.gated.clone();
                }
                if let (Some(gate), Some(target)) = (&mut self.gate, &done.target)
                    && done.gated.is_none()
                    && !done.held
                {
                    gate.remember(&id, &done.revision, target);
                }
                if !done.held {
                    let mut released = None;
                    change_state(
                        &mut self.states,
                        self.revisions.as_ref(),
                        &done.source,
                        |s| released = s.held.take(),
                    );
                    if let Some(held) = released {
                        tracing::info!(template = %id, revision = %done.revision, held = %held,
                            "the template renders another revision; the failed one is no longer held");
                    }
                }
                self.metrics.render(match outcome {
                    Outcome::Written => RenderResult::Written,
                    Outcome::Unchanged => RenderResult::Unchanged,
                });
                if outcome == Outcome::Written {
                    tracing::info!(template = %id, file = %file, "wrote manifest");
                } else {
                    tracing::debug!(template = %id, file = %file, "manifest unchanged");
                }
                if entry.last_error.take().is_some() {
                    tracing::info!(template = %id, "renders again");
                }
                if !done.held && done.gated.is_none() {
                    self.track(&done);
                }
                self.report_fleet(&id);
            }
            Err(mut failure) => {
                failure.message = crate::text::cut(failure.message, MAX_FAILURE_MESSAGE);
                self.metrics.render(RenderResult::Failed(failure.reason));
                if entry.last_error.as_deref() == Some(failure.message.as_str()) {
                    tracing::debug!(template = %id, reason = failure.reason.as_str(), "still failing: {}", failure.message);
                    return;
                }
                tracing::warn!(template = %id, node = %node.name, reason = failure.reason.as_str(),
                    plugin = failure.plugin.as_deref().unwrap_or(""),
                    "{}; the last good manifest stays", failure.message);
                entry.last_error = Some(failure.message.clone());
                if let (Some(events), Some(reference)) = (&self.events, &entry.incoming.reference) {
                    events.report(Report {
                        reference: reference.clone(),
                        reason: failure.reason,
                        note: format!(
                            "node {}: plugin {}: {}",
                            node.name,
                            failure.plugin.as_deref().unwrap_or("none"),
                            failure.message
                        ),
                        related: None,
                    });
                }
            }
        }
    }

    /// Renders and writes one template; `chain_seen` gets the chain it was
    /// rendered with, once the catalog gave one (or refused to).
    fn try_render(
        &mut self,
        key: &str,
        node: &NodeContext,
        chain_seen: &mut Option<ChainKey>,
    ) -> Result<Done, Failure> {
        let entry = &self.entries[key];
        let invalid = |message: String| Failure {
            reason: Reason::InvalidTemplate,
            plugin: None,
            message,
        };
        let template = entry.incoming.template.as_ref().map_err(|e| Failure {
            reason: e.reason(),
            plugin: None,
            message: e.to_string(),
        })?;
        if template.namespace != self.namespace {
            return Err(invalid(format!(
                "PodTemplate {}: metadata.namespace: is {:?}, but this podstamp manages namespace {:?}",
                template.id(),
                template.namespace,
                self.namespace
            )));
        }
        let deadline = match template.annotations.get(rollout::DEADLINE_ANNOTATION) {
            None => rollout::DEFAULT_DEADLINE,
            Some(text) => match crate::config::parse_duration(text) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    return Err(invalid(format!(
                        "PodTemplate {}: metadata.annotations.{}: {text:?} is zero; give a duration such as 5m, or remove it for the default ({:?})",
                        template.id(),
                        rollout::DEADLINE_ANNOTATION,
                        rollout::DEFAULT_DEADLINE
                    )));
                }
                Err(e) => {
                    return Err(invalid(format!(
                        "PodTemplate {}: metadata.annotations.{}: {e}; give a duration such as 5m, or remove it for the default ({:?})",
                        template.id(),
                        rollout::DEADLINE_ANNOTATION,
                        rollout::DEFAULT_DEADLINE
                    )));
                }
            },
        };
        let policy = policy::from_annotations(&template.annotations)
            .map_err(|e| invalid(format!("PodTemplate {}: {e}", template.id())))?;
        let catalog = self.catalog.as_deref().expect("checked by reconcile");
        let chain = catalog.chain_for(&template.annotations);
        *chain_seen = Some(match &chain {
            Ok(chain) => Ok(chain.fingerprint()),
            Err(e) => Err(e.to_string()),
        });
        let chain = chain.map_err(|e| Failure {
            reason: e.reason(),
            plugin: None,
            message: format!("PodTemplate {}: {e}", template.id()),
        })?;
        let target = self
            .gate
            .is_some()
            .then(|| fleet::target(&template.fingerprint(), &chain.fingerprint()));
        let render_failed = |e: RenderError| {
            let plugin = match &e.stage {
                Stage::Plugin(f) => Some(f.step.clone()),
                _ => None,
            };
            Failure {
                reason: Reason::RenderFailed,
                plugin,
                message: e.to_string(),
            }
        };
        let rendered = check_size(template, self.max_manifest_bytes)
            .and_then(|()| render_timed(template, node, &chain, &self.namespace, &self.metrics))
            .map_err(render_failed)?;
        let manifest = rendered.peek();
        if manifest.bytes.len() > self.max_manifest_bytes {
            return Err(Failure {
                reason: Reason::RenderFailed,
                plugin: None,
                message: format!(
                    "PodTemplate {}: the manifest is {} bytes, over the limit of {} (limits.maxManifestSize)",
                    template.id(),
                    manifest.bytes.len(),
                    self.max_manifest_bytes
                ),
            });
        }
        let file = manifest.file_name();
        let conflict = |message: String| Failure {
            reason: Reason::NameConflict,
            plugin: None,
            message,
        };
        if let Some(other) = self.entries.iter().find(|(k, e)| {
            k.as_str() != key && e.seq < entry.seq && e.claims.as_deref() == Some(file.as_str())
        }) {
            return Err(conflict(format!(
                "PodTemplate {}: pod name {:?} is already produced by PodTemplate {}",
                template.id(),
                manifest.pod_name,
                other.1.id.as_deref().unwrap_or(other.0)
            )));
        }
        match self.owned.get(&file) {
            Some(source) if *source != manifest.source => {
                return Err(conflict(format!(
                    "PodTemplate {}: {} belongs to PodTemplate {source}",
                    template.id(),
                    self.dir.join(&file).display()
                )));
            }
            Some(_) => {}
            None => {
                let path = self.dir.join(&file);
                if fs::symlink_metadata(&path).is_ok() {
                    let ours = read_regular(&path)
                        .and_then(|b| manifest::ownership(&b))
                        .is_some_and(|o| o.source == manifest.source);
                    if !ours {
                        return Err(Failure {
                            reason: Reason::ForeignFile,
                            plugin: None,
                            message: format!(
                                "PodTemplate {}: {} exists and is not podstamp's; it is left alone",
                                template.id(),
                                path.display()
                            ),
                        });
                    }
                }
            }
        }
        let source = manifest.source.clone();
        let (done_source, revision) = (source.clone(), manifest.revision.clone());
        let mut held = state_of(&mut self.states, self.revisions.as_ref(), &source)
            .held
            .as_deref()
            == Some(manifest.revision.as_str());
        // Held only while the revision it was rolled back to is in place,
        // whole: a manifest gone or edited (say, a node whose manifest
        // directory was emptied, its revisions directory kept) would
        // otherwise leave the template without a pod until it changes.
        // Written instead, the failed revision fails again and is rolled
        // back again.
        if held
            && !read_regular(&self.dir.join(&file))
                .and_then(|bytes| manifest::ownership(&bytes))
                .is_some_and(|o| o.intact && o.source == source)
        {
            tracing::warn!(template = %source, revision = %revision, file = %file,
                "the held revision's fallback is no longer in place (missing or edited); writing the revision the template renders");
            change_state(&mut self.states, self.revisions.as_ref(), &source, |s| {
                s.held = None
            });
            held = false;
        }
        if held {
            tracing::debug!(template = %source, revision = %revision, "revision held: it failed and was rolled back");
            self.owned.insert(file.clone(), source);
            return Ok(Done {
                file,
                outcome: Outcome::Unchanged,
                source: done_source,
                revision,
                deadline,
                held: true,
                gated: None,
                target,
            });
        }
        // Bytes already on disk were read back when they were written; only
        // new bytes are read back, just before they replace the file.
        let holds = write::already_holds(&self.dir, &file, &manifest.bytes);
        if let (Some(gate), Some(target)) = (&mut self.gate, &target) {
            if holds {
                gate.cancel(&source);
            } else if self.owned.contains_key(&file) && self.dir.join(&file).exists() {
                // An update of a manifest in place: it may have to wait.
                let gated = match gate.decide(&source, target, policy) {
                    Decision::Write => None,
                    Decision::Wait => Some(Gated::Waiting {
                        target: target.clone(),
                        slots: match policy {
                            policy::Policy::NodeByNode { max_unavailable } => max_unavailable,
                            policy::Policy::AllAtOnce => 0,
                        },
                    }),
                    Decision::Halted(why) => Some(Gated::Halted {
                        target: target.clone(),
                        why,
                    }),
                };
                if gated.is_some() {
                    self.owned.insert(file.clone(), source);
                    return Ok(Done {
                        file,
                        outcome: Outcome::Unchanged,
                        source: done_source,
                        revision,
                        deadline,
                        held: false,
                        gated,
                        target: Some(target.clone()),
                    });
                }
            }
        }
        let outcome = if holds {
            record_revision(&mut self.revisions, manifest);
            Outcome::Unchanged
        } else {
            let manifest = rendered.verify().map_err(render_failed)?;
            // Known before the file is in place: a daemon killed right after
            // the rename still follows it as its own after a restart.
            change_state(&mut self.states, self.revisions.as_ref(), &source, |s| {
                s.pending = Some(manifest.revision.clone())
            });
            let outcome =
                write::replace(&self.dir, &file, &manifest.bytes).map_err(|e| Failure {
                    reason: Reason::WriteFailed,
                    plugin: None,
                    message: format!("PodTemplate {}: {}: {e}", template.id(), file),
                })?;
            record_revision(&mut self.revisions, &manifest);
            outcome
        };
        if outcome == Outcome::Written {
            self.dir_unsynced = true;
        }
        self.owned.insert(file.clone(), source);
        Ok(Done {
            file,
            outcome,
            source: done_source,
            revision,
            deadline,
            held: false,
            gated: None,
            target,
        })
    }
}

impl Reconciler {
    /// Follows the revision now in place for `done`'s template.
    fn track(&mut self, done: &Done) {
        let id = done.source.as_str();
        if !self.confirming {
            if done.outcome == Outcome::Written {
                self.written_unfollowed
                    .insert(id.to_string(), done.revision.clone());
            }
            return;
        }
        if self
            .rollouts
            .get(id)
            .is_some_and(|r| r.revision == done.revision)
        {
            return;
        }
        let written_before = self.written_unfollowed.remove(id);
        let state = state_of(&mut self.states, self.revisions.as_ref(), id);
        // Written by this daemon before a restart, and not judged yet.
        let pending = state.pending.as_deref() == Some(done.revision.as_str());
        let good = state.good.clone();
        let written = done.outcome == Outcome::Written
            || written_before.as_deref() == Some(done.revision.as_str())
            || pending;
        // What to go back to when no revision was seen Ready in this run:
        // the last one that succeeded on this node (none, when that is this
        // one), or else, for a history kept before the rollout state was,
        // the newest other revision in it.
        let fallback = good.or_else(|| {
            let store = self.revisions.as_ref()?;
            let kept = store.kept(id).ok()?;
            kept.into_iter()
                .rev()
                .find(|k| k.revision != done.revision)
                .map(|k| k.revision)
        });
        self.rollouts.start(
            id,
            &done.revision,
            written,
            done.deadline,
            fallback,
            Instant::now(),
        );
        self.metrics
            .set_rollout(id, &done.revision, Phase::Written.as_str());
        if written {
            tracing::info!(template = %id, revision = %done.revision, deadline = ?done.deadline,
                "rollout started: waiting for the mirror pod to be Ready");
        }
        if let Some(seen) = self.rollouts.seen_in_place(id) {
            self.observe(seen);
        }
    }

    fn observe(&mut self, observation: Observation) {
        let Some((phase, verdict)) = self.rollouts.observe(&observation, Instant::now()) else {
            return;
        };
        let id = observation.source.as_str();
        self.metrics
            .set_rollout(id, &observation.revision, phase.as_str());
        tracing::info!(template = %id, revision = %observation.revision, phase = phase.as_str(), "rollout phase");
        if let Some(verdict) = verdict {
            self.verdict(id, verdict);
        }
        self.report_fleet(id);
    }

    /// Tells the other nodes how template `id`'s rollout ended here — a
    /// failure first, so that no node takes the slot without knowing it —
    /// and frees its slot.
    fn fleet_verdict(
        &mut self,
        id: &str,
        rollout: &rollout::Rollout,
        failure: Option<(&str, &str)>,
    ) {
        let Some(gate) = &mut self.gate else { return };
        if let Some((reason, message)) = failure {
            let failed = fleet::Failed {
                target: gate
                    .target_of(id, &rollout.revision)
                    .unwrap_or_default()
                    .to_string(),
                revision: rollout.revision.clone(),
                reason: reason.to_string(),
                message: crate::text::cut(message.to_string(), 1024),
                at: fleet::now_rfc3339(),
            };
            self.fleet_failed.insert(id.to_string(), failed);
        }
        self.report_fleet(id);
        if let Some(gate) = &mut self.gate {
            gate.release(id);
        }
    }

    /// Sends this node's state of template `id` to the other nodes (when
    /// it changed).
    fn report_fleet(&mut self, id: &str) {
        if self.gate.is_none() {
            return;
        }
        let Some(entry) = self.entries.values().find(|e| e.id.as_deref() == Some(id)) else {
            return;
        };
        let rollout = self.rollouts.get(id);
        let revision = rollout
            .map(|r| r.revision.clone())
            .or_else(|| entry.in_place.clone());
        let (phase, message) = match &entry.gated {
            Some(Gated::Waiting { target, slots }) => (
                fleet::Phase::Waiting,
                Some(format!(
                    "waiting for a slot to write target {target} (at most {slots} node(s) at once)"
                )),
            ),
            Some(Gated::Halted { why, .. }) => (fleet::Phase::Halted, Some(why.clone())),
            None => (
                rollout.map_or(fleet::Phase::Written, |r| {
                    // Ready is a success only once it lasted.
                    match (phase_of(r.phase), &r.verdict) {
                        (fleet::Phase::Ready, None) => fleet::Phase::Confirming,
                        (phase, _) => phase,
                    }
                }),
                None,
            ),
        };
        let generation = entry
            .incoming
            .template
            .as_ref()
            .ok()
            .and_then(|t| t.generation);
        let gate = self.gate.as_mut().expect("checked");
        let target = revision
            .as_deref()
            .and_then(|r| gate.target_of(id, r))
            .map(str::to_string);
        let wanted = match &entry.gated {
            Some(Gated::Waiting { target, .. } | Gated::Halted { target, .. }) => {
                Some(target.clone())
            }
            None => target.clone(),
        };
        let status = TemplateStatus {
            target,
            wanted,
            revision,
            generation,
            phase: phase.as_str().to_string(),
            since: String::new(),
            message,
            failed: self.fleet_failed.get(id).cloned(),
        };
        gate.report(id, status);
    }

    /// Frees the slots no longer needed: held for a template whose rollout
    /// here has its verdict (or that has nothing to write). Never while
    /// rollouts cannot be followed.
    fn release_unneeded_slots(&mut self) {
        let Some(gate) = &self.gate else { return };
        if !self.confirming {
            return;
        }
        let unneeded: Vec<String> = gate
            .held()
            .filter(|id| {
                let pending = self.rollouts.get(id).is_some_and(|r| r.verdict.is_none());
                let waiting = self.entries.values().any(|e| {
                    e.id.as_deref() == Some(id.as_str())
                        && matches!(e.gated, Some(Gated::Waiting { .. }))
                });
                !pending && !waiting
            })
            .cloned()
            .collect();
        for id in unneeded {
            tracing::info!(template = %id, "rollout slot released: nothing of this template is rolling out here");
            self.report_fleet(&id);
            if let Some(gate) = &mut self.gate {
                gate.release(&id);
            }
        }
    }

    /// Reports a rollout's verdict, and rolls a failed one back.
    fn verdict(&mut self, id: &str, verdict: Verdict) {
        let Some(rollout) = self.rollouts.get(id).cloned() else {
            return;
        };
        let node = self
            .node
            .as_ref()
            .map_or("", |n| n.name.as_str())
            .to_string();
        let took = rollout.started.elapsed();
        let (reason, note) = match verdict {
            Verdict::Succeeded => {
                self.metrics.rollout_result("succeeded");
                self.fleet_verdict(id, &rollout, None);
                change_state(&mut self.states, self.revisions.as_ref(), id, |s| {
                    s.good = Some(rollout.revision.clone());
                    if s.pending.as_ref() == Some(&rollout.revision) {
                        s.pending = None;
                    }
                });
                if !rollout.written {
                    tracing::debug!(template = %id, revision = %rollout.revision, "revision in place is Ready");
                    return;
                }
                tracing::info!(template = %id, revision = %rollout.revision, took_ms = took.as_millis() as u64,
                    "rollout succeeded: the mirror pod is Ready");
                (
                    Reason::RolloutSucceeded,
                    format!(
                        "node {node}: revision {} Ready after {:.1}s",
                        rollout.revision,
                        took.as_secs_f64()
                    ),
                )
            }
            Verdict::Failed { reason, message } => {
                self.metrics.rollout_result("failed");
                let outcome = match &rollout.previous {
                    None => "it is the first revision on this node, with nothing to fall back to: it stays".to_string(),
                    Some(previous) => match self.roll_back(id, previous, &rollout) {
                        Ok(()) => {
                            self.metrics.rollout_result("rolled_back");
                            format!("rolled back to revision {previous}; revision {} is not written again until the template changes", rollout.revision)
                        }
                        Err(e) => format!("cannot roll back to revision {previous}: {e}; it stays"),
                    },
                };
                change_state(&mut self.states, self.revisions.as_ref(), id, |s| {
                    if s.pending.as_ref() == Some(&rollout.revision) {
                        s.pending = None;
                    }
                });
                tracing::warn!(template = %id, revision = %rollout.revision, node = %node, reason = %reason,
                    "rollout failed: {message}; {outcome}");
                self.fleet_verdict(id, &rollout, Some((reason.as_str(), message.as_str())));
                (
                    Reason::RolloutFailed,
                    format!(
                        "node {node}: revision {}: {reason}: {message}; {outcome}",
                        rollout.revision
                    ),
                )
            }
        };
        let reference = self
            .entries
            .values()
            .find(|e| e.id.as_deref() == Some(id))
            .and_then(|e| e.incoming.reference.clone());
        if let (Some(events), Some(reference)) = (&self.events, reference) {
            events.report(Report {
                reference,
                reason,
                note,
                related: rollout.pod.clone(),
            });
        }
    }

    /// Writes `previous` back from the history in place of the failed
    /// rollout's revision, and holds that one.
    fn roll_back(
        &mut self,
        id: &str,
        previous: &str,
        failed: &rollout::Rollout,
    ) -> Result<(), String> {
        let store = self
            .revisions
            .as_mut()
            .ok_or("no revision history is kept")?;
        let kept = store
            .kept(id)
            .map_err(|e| format!("{}: {e}", store.template_dir(id).display()))?
            .into_iter()
            .find(|k| k.revision == previous)
            .ok_or_else(|| format!("it is no longer in {}", store.template_dir(id).display()))?;
        let bytes = store
            .read(id, &kept)
            .map_err(|e| format!("{}: {e}", kept.file))?;
        // Only a manifest of this template, intact, goes back in.
        if !manifest::ownership(&bytes).is_some_and(|o| o.intact && o.source == id) {
            return Err(format!("{} is not an intact manifest of {id}", kept.file));
        }
        let entry = self
            .entries
            .values_mut()
            .find(|e| e.id.as_deref() == Some(id))
            .ok_or("the template is gone")?;
        let file = entry.claims.clone().ok_or("the template has no manifest")?;
        write::write_atomic(&self.dir, &file, &bytes).map_err(|e| format!("{file}: {e}"))?;
        if let Err(e) = store.record(id, previous, &bytes) {
            tracing::error!(template = %id, "cannot mark revision {previous} as the newest in the history: {e}");
        }
        // Held only once the good revision is in place: a daemon killed
        // in between writes the failed one again and rolls it back again,
        // rather than keep it for good.
        change_state(&mut self.states, self.revisions.as_ref(), id, |s| {
            s.held = Some(failed.revision.clone())
        });
        let deadline = failed.deadline - failed.started;
        self.rollouts
            .start_rollback(id, previous, deadline, Instant::now());
        self.metrics
            .set_rollout(id, previous, Phase::Written.as_str());
        Ok(())
    }
}

/// Template `id`'s rollout state, read from `store` the first time (a file
/// that cannot be read is reported and read as empty).
fn state_of<'a>(
    states: &'a mut BTreeMap<String, State>,
    store: Option<&Store>,
    id: &str,
) -> &'a mut State {
    states.entry(id.to_string()).or_insert_with(|| {
        let Some(store) = store else {
            return State::default();
        };
        store.state(id).unwrap_or_else(|e| {
            tracing::error!(template = %id, "cannot read the rollout state: {e}; starting without it");
            State::default()
        })
    })
}

/// Applies `change` to template `id`'s rollout state, and writes it to
/// `store` if it changed. A failed write is logged: the change holds for
/// this run, and a restart sees the state before it.
fn change_state(
    states: &mut BTreeMap<String, State>,
    store: Option<&Store>,
    id: &str,
    change: impl FnOnce(&mut State),
) {
    let state = state_of(states, store, id);
    let before = state.clone();
    change(state);
    if *state == before {
        return;
    }
    if let Some(store) = store
        && let Err(e) = store.save_state(id, state)
    {
        tracing::error!(template = %id, dir = %store.template_dir(id).display(),
            "cannot keep the rollout state: {e}; a restart would not know it");
    }
}

/// Records `manifest` as its template's revision in use. A failure is
/// logged, not the render's: the manifest itself is in place.
fn record_revision(store: &mut Option<Store>, manifest: &manifest::Manifest) {
    let Some(store) = store else { return };
    match store.record(&manifest.source, &manifest.revision, &manifest.bytes) {
        Ok(true) => tracing::info!(template = %manifest.source, revision = %manifest.revision,
            dir = %store.template_dir(&manifest.source).display(), "kept revision"),
        Ok(false) => {}
        Err(e) => tracing::error!(template = %manifest.source, revision = %manifest.revision,
            dir = %store.template_dir(&manifest.source).display(),
            "cannot keep the revision: {e}; the manifest is in place, but it cannot be rolled back to"),
    }
}

/// [`crate::render::render`], with each plugin call timed for the metrics
/// and the read back left to the caller ([`Rendered::verify`]).
pub fn render_timed(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    metrics: &Metrics,
) -> Result<Rendered, RenderError> {
    render_unverified(template, node, chain, namespace, &mut |step, ok, took| {
        metrics.plugin_call(&step.name, ok, took)
    })
}

/// A regular file's content, never through a symlink; None otherwise.
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_SCANNED_FILE {
        return None;
    }
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_SCANNED_FILE)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn incoming(key: &str, name: &str, image: &str) -> Incoming {
        let value = json!({"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": "kube-system"},
            "template": {"spec": {"containers": [{"name": "c", "image": image}]}}});
        Incoming {
            key: key.to_string(),
            id: Some(format!("kube-system/{name}")),
            template: Template::from_value(&value).map_err(|e| SourceError::Invalid(e.to_string())),
            reference: None,
        }
    }

    fn empty_catalog() -> Input {
        Input::Catalog(Arc::new(Catalog::from_steps(Vec::new())))
    }

    /// A reconciler that knows neither the node nor a catalog yet.
    fn bare_reconciler(dir: &Path) -> Reconciler {
        Reconciler::new(
            dir.to_path_buf(),
            "kube-system".into(),
            crate::plugin::Limits::default().max_output_bytes,
            Arc::new(Metrics::default()),
            None,
        )
        .unwrap()
    }

    fn reconciler(dir: &Path) -> Reconciler {
        let mut r = bare_reconciler(dir);
        r.apply(Input::Node(NodeContext::named("n1")));
        r.apply(empty_catalog());
        r
    }

    fn list(r: &mut Reconciler, items: Vec<Incoming>) {
        r.apply(Input::ListStarted);
        for item in items {
            r.apply(Input::Listed(item));
        }
        r.apply(Input::ListDone);
        r.reconcile();
    }

    #[test]
    fn nothing_is_deleted_before_a_complete_list() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        list(
            &mut r,
            vec![incoming("a", "a", "x:1"), incoming("b", "b", "x:1")],
        );
        assert!(dir.path().join("a.yaml").exists() && dir.path().join("b.yaml").exists());

        // A restarted daemon, and a relist that has not finished.
        let mut r = reconciler(dir.path());
        assert_eq!(r.owned.len(), 2);
        r.reconcile();
        r.apply(Input::ListStarted);
        r.apply(Input::Listed(incoming("a", "a", "x:1")));
        r.reconcile();
        assert!(
            dir.path().join("b.yaml").exists(),
            "a partial list deletes nothing"
        );
        r.apply(Input::ListDone);
        r.reconcile();
        assert!(
            !dir.path().join("b.yaml").exists(),
            "gone after the complete list"
        );
        assert!(dir.path().join("a.yaml").exists());
    }

    #[test]
    fn a_file_never_read_holds_garbage_collection() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        list(&mut r, vec![incoming("a.yaml", "a", "x:1")]);
        // A restart, and this time the file cannot be read.
        let mut r = reconciler(dir.path());
        let unreadable = Incoming {
            key: "a.yaml".into(),
            id: None,
            template: Err(SourceError::Unreadable("a.yaml: cannot read".into())),
            reference: None,
        };
        list(&mut r, vec![unreadable]);
        assert!(
            dir.path().join("a.yaml").exists(),
            "the manifest may be that template's"
        );
        assert_eq!(
            r.entries["a.yaml"].last_error.as_deref(),
            Some("a.yaml: cannot read")
        );
        // Read at last.
        r.apply(Input::Applied(incoming("a.yaml", "a", "x:2")));
        r.reconcile();
        let text = fs::read_to_string(dir.path().join("a.yaml")).unwrap();
        assert!(text.contains("x:2"), "{text}");
    }

    #[test]
    fn the_first_template_keeps_a_pod_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        list(&mut r, vec![incoming("1.yaml", "web", "first:1")]);
        r.apply(Input::Applied(incoming("2.yaml", "web", "second:1")));
        r.reconcile();
        let text = fs::read_to_string(dir.path().join("web.yaml")).unwrap();
        assert!(text.contains("first:1"), "{text}");
        assert!(
            r.entries["2.yaml"]
                .last_error
                .as_deref()
                .unwrap()
                .contains("already produced")
        );
        // A change to the first one is still written.
        r.apply(Input::Applied(incoming("1.yaml", "web", "first:2")));
        r.reconcile();
        let text = fs::read_to_string(dir.path().join("web.yaml")).unwrap();
        assert!(text.contains("first:2"), "{text}");
    }

    #[test]
    fn foreign_files_and_symlinks_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("web.yaml"), "apiVersion: v1\nkind: Pod\n").unwrap();
        let outside = dir.path().join(".outside");
        fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("db.yaml")).unwrap();
        let mut r = reconciler(dir.path());
        list(
            &mut r,
            vec![incoming("web", "web", "x:1"), incoming("db", "db", "x:1")],
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("web.yaml")).unwrap(),
            "apiVersion: v1\nkind: Pod\n"
        );
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
        assert!(
            r.entries["web"]
                .last_error
                .as_deref()
                .unwrap()
                .contains("not podstamp's")
        );
        assert!(r.entries["db"].last_error.is_some());
        // Deleting the templates does not delete what was never ours.
        list(&mut r, vec![]);
        assert!(dir.path().join("web.yaml").exists() && dir.path().join("db.yaml").exists());
    }

    #[test]
    fn a_huge_failure_message_is_kept_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        let mut huge = incoming("a", "a", "x:1");
        huge.template = Err(SourceError::Invalid(format!(
            "PodTemplate a: {}",
            "é".repeat(1 << 20)
        )));
        list(&mut r, vec![huge]);
        let kept = r.entries["a"].last_error.as_deref().unwrap();
        assert!(kept.len() < MAX_FAILURE_MESSAGE + 64, "{}", kept.len());
        assert!(
            kept.ends_with(&format!("… (cut: {} bytes in all)", 15 + (2 << 20))),
            "{}",
            &kept[kept.len() - 40..]
        );
    }

    #[test]
    fn without_the_node_nothing_is_rendered() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = bare_reconciler(dir.path());
        r.apply(empty_catalog());
        list(&mut r, vec![incoming("a", "a", "x:1")]);
        assert!(!dir.path().join("a.yaml").exists());
        assert!(!r.metrics.is_ready());
        r.apply(Input::Node(NodeContext::named("n1")));
        r.reconcile();
        assert!(dir.path().join("a.yaml").exists());
        assert!(r.metrics.is_ready());
    }

    #[test]
    fn without_a_catalog_nothing_is_rendered() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = bare_reconciler(dir.path());
        r.apply(Input::Node(NodeContext::named("n1")));
        list(&mut r, vec![incoming("a", "a", "x:1")]);
        assert!(!dir.path().join("a.yaml").exists());
        assert!(!r.metrics.is_ready());
        r.apply(empty_catalog());
        r.reconcile();
        assert!(dir.path().join("a.yaml").exists());
        assert!(r.metrics.is_ready());
    }

    #[test]
    fn a_new_catalog_renders_only_the_templates_whose_chain_changed() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        let mut own = incoming("b", "b", "x:1");
        if let Ok(t) = &mut own.template {
            // An unknown plugin: the chain is an error, which a catalog
            // that knows no more plugins does not change.
            t.annotations
                .insert(crate::config::PLUGINS_ANNOTATION.into(), "nope".into());
        }
        list(&mut r, vec![incoming("a", "a", "x:1"), own]);
        assert!(r.entries["b"].last_error.is_some());
        // The same chains: nothing to render.
        r.apply(empty_catalog());
        assert!(r.dirty.is_empty(), "{:?}", r.dirty);
        // Another render budget changes the default chain only.
        let budget = Duration::from_millis(1234);
        r.apply(Input::Catalog(Arc::new(
            Catalog::from_steps(Vec::new()).with_render_budget(budget),
        )));
        assert_eq!(r.dirty, BTreeSet::from(["a".to_string()]));
        r.reconcile();
        assert!(r.dirty.is_empty());
    }

    /// The first render and the pods watch's first list race; a revision
    /// this daemon wrote is followed as its own (with its Events) whichever
    /// comes first, and also when the pods watch was lost in between.
    #[test]
    fn a_revision_written_before_pods_are_followed_is_still_our_rollout() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler(dir.path());
        list(&mut r, vec![incoming("a", "a", "x:1")]);
        assert!(dir.path().join("a.yaml").exists());
        assert!(r.rollouts.get("kube-system/a").is_none());
        r.apply(Input::MirrorSynced);
        r.reconcile();
        let rollout = r.rollouts.get("kube-system/a").expect("followed");
        assert!(rollout.written, "written by this daemon: {rollout:?}");
        let first = rollout.revision.clone();

        // Lost before a verdict, then listed again: still ours.
        r.apply(Input::MirrorLost);
        assert!(r.rollouts.get("kube-system/a").is_none());
        r.apply(Input::MirrorSynced);
        r.reconcile();
        let rollout = r.rollouts.get("kube-system/a").expect("followed again");
        assert!(rollout.written && rollout.revision == first, "{rollout:?}");

        // A manifest found in place by a restarted daemon is not.
        let mut r = reconciler(dir.path());
        list(&mut r, vec![incoming("a", "a", "x:1")]);
        r.apply(Input::MirrorSynced);
        r.reconcile();
        let rollout = r.rollouts.get("kube-system/a").expect("followed");
        assert!(!rollout.written, "found in place: {rollout:?}");
    }

    /// The revision label of `file` in `dir`.
    fn revision_in(dir: &Path, file: &str) -> String {
        let text = fs::read_to_string(dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
            .unwrap()
            .trim_matches('"')
            .to_string()
    }

    /// A failed revision rolled back stays held after a restart: the
    /// template still renders it, and it is not written again.
    #[test]
    fn a_held_revision_is_not_written_again_after_a_restart() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("manifests");
        fs::create_dir(&dir).unwrap();
        let history = root.path().join("revisions");
        let with_history = || {
            let mut r = reconciler(&dir);
            r.set_revisions(Store::open(history.clone(), 3, &dir).unwrap());
            r
        };
        let mut r = with_history();
        list(&mut r, vec![incoming("a", "a", "x:1")]);
        let good = revision_in(&dir, "a.yaml");
        r.apply(Input::Applied(incoming("a", "a", "x:2")));
        r.reconcile();
        let failing = revision_in(&dir, "a.yaml");
        assert_ne!(good, failing);
        r.apply(Input::MirrorSynced);
        r.apply(Input::Mirror(Observation {
            source: "kube-system/a".into(),
            revision: failing.clone(),
            state: super::super::mirror::PodState::Failed {
                reason: "CrashLoopBackOff".into(),
                message: "back-off".into(),
            },
            pod: ObjectReference::default(),
        }));
        r.reconcile();
        assert_eq!(revision_in(&dir, "a.yaml"), good, "rolled back");
        let before = fs::metadata(dir.join("a.yaml"))
            .unwrap()
            .modified()
            .unwrap();

        // Restarted: the template still renders the failed revision.
        let mut r = with_history();
        list(&mut r, vec![incoming("a", "a", "x:2")]);
        r.apply(Input::MirrorSynced);
        r.reconcile();
        assert_eq!(revision_in(&dir, "a.yaml"), good, "still held");
        assert_eq!(
            fs::metadata(dir.join("a.yaml"))
                .unwrap()
                .modified()
                .unwrap(),
            before
        );
        // Its fallback gone from the directory: the template's pod is
        // written rather than held out for good.
        fs::remove_file(dir.join("a.yaml")).unwrap();
        r.apply(Input::Applied(incoming("a", "a", "x:2")));
        r.reconcile();
        assert_eq!(revision_in(&dir, "a.yaml"), failing);
        // Another revision is written, and releases it.
        r.apply(Input::Applied(incoming("a", "a", "x:3")));
        r.reconcile();
        let next = revision_in(&dir, "a.yaml");
        assert!(next != good && next != failing);
        let state = r
            .revisions
            .as_ref()
            .unwrap()
            .state("kube-system/a")
            .unwrap();
        assert_eq!(state.held, None);
        assert_eq!(state.pending, Some(next));
    }
}
