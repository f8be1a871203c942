//! The reconciler: the desired state (templates and the node) → the manifest
//! directory. It is the shell of the rollout machine ([`super::rollout`]):
//! it renders and writes, tells the machine what happened, and carries out
//! the machine's effects ([`Reconciler::run_effects`]).
//!
//! It runs on a thread of its own, since plugin calls are synchronous, and is
//! fed [`Input`]s by the sources. A burst of inputs is coalesced: everything
//! queued is applied before anything is rendered, with no added delay.
//!
//! One concern per file: this one (the inputs, the pass, the effects),
//! `render` (one template: render, check, gate, stage its write), `outcome`
//! (how a render ends: metrics, log, Event, the machine told), `batch`
//! (the pass's writes and rollout states, put in place together, crash-safe),
//! `dir` (the manifest directory: what is ours, garbage, durability),
//! `ahead` (a pass's renders a chunk ahead, their checks sent to the helper
//! while the next ones render), `claims` (which manifest file each template
//! claims, for the pod name conflicts),
//! `timing` (where the first sync's time goes).
//!
//! The rules it keeps:
//! * Only files whose `podstamp.io/source` annotation names a template in the
//!   daemon's namespace are podstamp's; every other file is never touched.
//! * A manifest is removed only because a template is gone, and that is known
//!   only after a complete, successful list (or a watch event saying so), or
//!   because its `podstamp.io/node-selector` ([`crate::selector`]) does not
//!   select the Node's labels as last known (then its rollout state goes
//!   too, as for a deleted template). An unreachable API server changes
//!   nothing on disk: the last known labels stay in force.
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
//!   templates whose chain changed (its [`crate::chain::Chain::fingerprint`],
//!   or the error naming it) are rendered again: every other manifest is
//!   left untouched.
//! * Every revision in place is followed through its mirror pod; what a
//!   rollout calls for (a rollback from the revision history
//!   ([`super::revisions`]), a held revision, a slot) is the machine's
//!   decision, carried out here in the order given.

mod ahead;
mod batch;
mod claims;
mod dir;
mod outcome;
mod prepare;
mod render;
#[cfg(test)]
mod tests;
mod timing;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::catalog::Catalog;
use crate::manifest;
use crate::node::NodeContext;
use crate::security_level::Held;
use crate::template::Template;
use crate::write;

use super::events::{EventSink, Report};
use super::inbox::{Ask, Incoming, Input, SourceError};
use super::metrics::Metrics;
use super::revisions::Store;
use super::rollout::{DEFAULT_DEADLINE, Effect, InPlace, Machine, RolloutState};

use dir::read_regular;

struct Entry {
    incoming: Incoming,
    /// The last known `namespace/name`; kept when the template turns invalid.
    id: Option<String>,
    /// Arrival order: of two templates producing the same pod name, the
    /// earlier keeps it.
    seq: u64,
    /// The last failure reported, to report each distinct failure once.
    last_error: Option<String>,
    /// The chain this entry was last rendered with (its fingerprint, or why
    /// the catalog gave none); None when its render stopped before the chain
    /// mattered. A new catalog renders the entry again only if it differs.
    chain: Option<ChainKey>,
    /// Its `podstamp.io/node-selector` did not select this node at its
    /// last render: nothing of it is kept here (its manifest is garbage).
    off_node: bool,
}

/// What a template's render depends on in the catalog.
type ChainKey = Result<[u8; 32], String>;

fn chain_key(catalog: &Catalog, template: &Template) -> ChainKey {
    catalog
        .chain_for(&template.annotations)
        .map(|chain| chain.fingerprint())
        .map_err(|e| e.to_string())
}

pub struct Reconciler {
    dir: PathBuf,
    namespace: String,
    /// None until the first [`Input::Catalog`]: nothing renders meanwhile.
    catalog: Option<Arc<Catalog>>,
    metrics: Arc<Metrics>,
    events: Option<EventSink>,
    node: Option<NodeContext>,
    /// Boxed: an entry is over 500 bytes, and a map's nodes are about
    /// half full when keys arrive in order (as a list's do), so inline
    /// entries would cost twice their size (docs/performance.md §3.6).
    entries: BTreeMap<String, Box<Entry>>,
    /// The manifest file each entry last wrote or confirmed, or staged in
    /// the pass under way ([`claims`]).
    claims: claims::Claims,
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
    /// Every rollout decision ([`super::rollout`]).
    rollouts: Machine,
    /// To the coordinator of rollouts across nodes; None: nothing
    /// coordinates (a `dir:` source).
    asks: Option<UnboundedSender<Ask>>,
    /// The Pod Security level of a template whose namespace has no
    /// `pod-security.kubernetes.io/enforce` label (the configured one).
    pod_security: Held,
    /// The namespace's Pod Security labels ([`Input::Namespace`]); None:
    /// not read yet, and nothing renders until they are.
    namespace_labels: Option<BTreeMap<String, String>>,
    waiting_for_namespace_logged: bool,
    /// What the pass under way holds back until it commits ([`batch`]).
    pass: batch::Pass,
    /// The first sync's time, by part ([`timing`]).
    timing: timing::SyncTiming,
    /// Renders done ahead in the pass's current chunk ([`ahead`]).
    ahead: ahead::Ahead,
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
        let owned = dir::ours(&dir, &namespace)?;
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
            claims: claims::Claims::default(),
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
            rollouts: Machine::new("", false),
            asks: None,
            pod_security: Held::default_level(),
            namespace_labels: Some(BTreeMap::new()),
            waiting_for_namespace_logged: false,
            pass: batch::Pass::default(),
            timing: timing::SyncTiming::default(),
            ahead: ahead::Ahead::default(),
        })
    }

    /// Holds every rendered pod to `configured`, or to the level its
    /// namespace's label enforces; `read_namespace`: that label comes from
    /// the API ([`Input::Namespace`]) and nothing renders before it did.
    /// Called before the first input.
    pub fn hold_to(&mut self, configured: Held, read_namespace: bool) {
        self.pod_security = configured;
        self.namespace_labels = (!read_namespace).then(BTreeMap::new);
    }

    /// Coordinates updates with the other nodes: the machine's asks go to
    /// the coordinator through `asks`. Called before the first input.
    pub fn coordinate(&mut self, asks: UnboundedSender<Ask>) {
        let node = self.node.as_ref().map_or("", |n| n.name.as_str());
        self.rollouts = Machine::new(node, true);
        self.asks = Some(asks);
    }

    /// Keeps the last manifests of each template in `store`.
    pub fn set_revisions(&mut self, store: Store) {
        self.revisions = Some(store);
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
                    self.timing.listed();
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
                    self.rollouts.set_node(&node.name);
                    self.node = Some(node);
                    self.mark_all_dirty();
                }
            }
            Input::Namespace(labels) => {
                if self.namespace_labels.as_ref() != Some(&labels) {
                    tracing::info!(namespace = %self.namespace, labels = ?labels,
                        "the namespace's Pod Security labels; rendering every template again");
                    self.namespace_labels = Some(labels);
                    self.mark_all_dirty();
                }
            }
            Input::Catalog(catalog) => self.swap_catalog(catalog),
            Input::Mirror(observation) => self.rollouts.observe(observation, Instant::now()),
            Input::MirrorSynced => {
                if self.rollouts.mirror_synced() {
                    tracing::info!(
                        "following this node's mirror pods: every revision in place is confirmed"
                    );
                    // Each template's revision in place gets followed.
                    self.mark_all_dirty();
                }
            }
            Input::Fleet(answer) => self.rollouts.fleet(answer),
            Input::MirrorLost => self.rollouts.mirror_lost(),
            Input::Local(observation) => {
                if !self.synced {
                    self.follow_offline(&observation.source, &observation.revision);
                }
                self.rollouts.local_observed(observation, Instant::now())
            }
            Input::LocalAvailable(available) => {
                if self.rollouts.local_available(available) {
                    tracing::info!(
                        "following rollouts from the node itself (the container runtime and the pods' probes)"
                    );
                    self.mark_all_dirty();
                }
            }
        }
        self.run_effects();
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
                    Box::new(Entry {
                        id: incoming.id.clone(),
                        incoming,
                        seq,
                        last_error: None,
                        chain: None,
                        off_node: false,
                    }),
                );
            }
        }
        self.dirty.insert(key);
    }

    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            self.claims.set(key, entry.seq, None);
            tracing::info!(template = key, "template gone");
            if let Some(id) = &entry.id {
                self.rollouts.forget(id);
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
        self.rollouts.tick(Instant::now());
        self.run_effects();
        if self.gc_due && self.synced {
            self.gc_due = false;
            let start = Instant::now();
            self.collect_garbage();
            self.timing.add(timing::Part::Gc, start);
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
        if self.namespace_labels.is_none() {
            if !self.dirty.is_empty() && !self.waiting_for_namespace_logged {
                tracing::warn!(namespace = %self.namespace,
                    "the namespace's Pod Security labels are not read yet; not rendering (manifests on disk are kept)");
                self.waiting_for_namespace_logged = true;
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
        self.open_pass();
        for chunk in dirty.chunks(ahead::AHEAD) {
            // A pass of one renders in place: nothing to overlap.
            if chunk.len() > 1 {
                self.render_ahead(chunk);
            }
            for (_, key) in chunk {
                self.render_one(key);
                self.run_effects();
                if self.pass_full() {
                    self.commit_pass();
                    self.run_effects();
                }
            }
            self.ahead.clear();
        }
        self.close_pass();
        self.run_effects();
        if rendered && self.synced {
            let start = Instant::now();
            self.collect_garbage();
            self.timing.add(timing::Part::Gc, start);
        }
        self.rollouts.after_pass();
        self.run_effects();
        self.sync_dir();
        self.metrics.set_managed(self.owned.len());
        if self.synced {
            self.metrics.synced_now();
            if !self.metrics.is_ready() {
                let took = self.first_list_at.take().map(|t| t.elapsed());
                if let Some(took) = took {
                    self.metrics.set_initial_sync(took);
                    self.metrics.set_initial_sync_parts(self.timing.finish());
                }
                tracing::info!(
                    managed = self.owned.len(),
                    templates = self.entries.len(),
                    since_list_ms = took.map_or(0, |t| t.as_millis() as u64),
                    "first sync done; ready"
                );
                self.metrics.set_ready();
                // The first sync's lists, objects and renders are freed:
                // give their memory back rather than keep it for good.
                super::heap::give_back();
            }
        }
    }

    /// Carries out what the rollout machine decided, in order, until it
    /// has nothing more to say (a rollback's result is told back to it).
    pub(super) fn run_effects(&mut self) {
        loop {
            let effects = self.rollouts.take_effects();
            if effects.is_empty() {
                return;
            }
            for effect in effects {
                self.execute(effect);
            }
        }
    }

    fn execute(&mut self, effect: Effect) {
        match effect {
            Effect::Ask(ask) => {
                // The coordinator lives as long as the daemon; gone, nothing
                // coordinates any more and the daemon is stopping.
                if let Some(asks) = &self.asks {
                    let _ = asks.send(ask);
                }
            }
            Effect::SaveState { id, state } if self.pass.open => {
                self.pass.save_state(id, state);
            }
            Effect::SaveState { id, state } => {
                if let Some(store) = &mut self.revisions
                    && let Err(e) = store.save_state(&id, &state)
                {
                    tracing::error!(template = %id, dir = %store.dir().display(),
                        "cannot keep the rollout state: {e}; a restart would not know it");
                }
            }
            Effect::ForgetState { id } => {
                self.pass.forget_state(&id);
                if let Some(store) = &mut self.revisions
                    && let Err(e) = store.forget_state(&id)
                {
                    tracing::error!(template = %id, "cannot remove the rollout state: {e}");
                }
            }
            Effect::RollBack {
                id,
                revision,
                failed: _,
            } => {
                // Nothing staged in this pass may land over the rollback.
                self.commit_pass();
                let result = self.roll_back(&id, &revision);
                self.rollouts
                    .rolled_back(&id, &revision, result, Instant::now());
            }
            Effect::Event {
                id,
                reason,
                note,
                related,
            } => {
                let reference = self
                    .entries
                    .values()
                    .find(|e| e.id.as_deref() == Some(id.as_str()))
                    .and_then(|e| e.incoming.reference.clone())
                    // Followed offline (before the templates are listed):
                    // the PodTemplate by its name, as the API source names
                    // it (a `dir:` source has no Events).
                    .or_else(|| (!self.synced).then(|| template_reference(&id)).flatten());
                if let (Some(events), Some(reference)) = (&self.events, reference) {
                    events.report(Report {
                        reference,
                        reason,
                        note,
                        related,
                    });
                }
            }
            Effect::Phase {
                id,
                revision,
                phase,
            } => self.metrics.set_rollout(&id, &revision, phase),
            Effect::Result(result) => self.metrics.rollout_result(result),
            Effect::Disagreed { id } => self.metrics.evidence_disagreed(&id),
            Effect::Stalled { id, stalled } => self.metrics.set_kubelet_not_started(&id, stalled),
            Effect::ForgetMetrics { id } => self.metrics.forget_rollout(&id),
            Effect::Render { id } => {
                let keys: Vec<String> = self
                    .entries
                    .iter()
                    .filter(|(_, e)| e.id.as_deref() == Some(id.as_str()))
                    .map(|(k, _)| k.clone())
                    .collect();
                self.dirty.extend(keys);
            }
        }
    }

    /// Follows `revision` of template `id`, in place in the manifest
    /// directory, before the templates could be listed (a daemon started
    /// while the API server is down): from its rollout state alone (a
    /// `pending` revision is this daemon's own write, judged by the progress
    /// deadline recorded at its write; any other by the default), so that
    /// local evidence can judge it and roll it back.
    fn follow_offline(&mut self, id: &str, revision: &str) {
        if self
            .rollouts
            .following(id)
            .is_some_and(|(r, _)| r == revision)
        {
            return;
        }
        ensure_state(&mut self.rollouts, self.revisions.as_mut(), id);
        let store = self.revisions.as_ref();
        let quorum = self.rollouts.is_quorum(id);
        self.rollouts.in_place(
            InPlace {
                id: id.to_string(),
                revision: revision.to_string(),
                written: false,
                deadline: self
                    .rollouts
                    .recorded_deadline(id, revision)
                    .unwrap_or(DEFAULT_DEADLINE),
                held: false,
                gated: None,
                target: None,
                change: None,
                generation: None,
                // Not known before the template is read: as last known.
                quorum,
            },
            || outcome::newest_other(store, id, revision),
            Instant::now(),
        );
    }

    /// The manifest file of template `id` in the manifest directory, read
    /// from the files themselves (before the templates are listed).
    fn file_in_place(&self, id: &str) -> Option<String> {
        std::fs::read_dir(&self.dir)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".yaml") && !name.starts_with('.'))
            .find(|name| {
                std::fs::read(self.dir.join(name))
                    .ok()
                    .and_then(|bytes| manifest::ownership(&bytes))
                    .is_some_and(|o| o.source == id)
            })
    }

    /// Writes `previous` back from the history in place of template `id`'s
    /// failed revision ([`Effect::RollBack`]).
    fn roll_back(&mut self, id: &str, previous: &str) -> Result<(), String> {
        // Before the templates are listed (followed offline), the file is
        // found by its content.
        let offline_file = if self.synced {
            None
        } else {
            self.file_in_place(id)
        };
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
        let key = self
            .entries
            .iter()
            .find(|(_, e)| e.id.as_deref() == Some(id))
            .map(|(key, _)| key);
        let file = match key {
            Some(key) => self
                .claims
                .of(key)
                .map(str::to_string)
                .ok_or("the template has no manifest")?,
            // Before the templates are listed (followed offline).
            None if !self.synced => {
                offline_file.ok_or("its manifest is no longer in the manifest directory")?
            }
            None => return Err("the template is gone".into()),
        };
        write::write_atomic(&self.dir, &file, &bytes).map_err(|e| format!("{file}: {e}"))?;
        if let Err(e) = store.record(id, previous, &bytes) {
            tracing::error!(template = %id, "cannot mark revision {previous} as the newest in the history: {e}");
        }
        Ok(())
    }
}

/// The PodTemplate `namespace/name` as an Event's object (no uid: not
/// known before it is listed).
fn template_reference(id: &str) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
    let (namespace, name) = id.split_once('/')?;
    Some(k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PodTemplate".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        ..Default::default()
    })
}

/// Loads template `id`'s rollout state into the machine, from `store`, the
/// first time (a file that cannot be read is reported and read as empty).
fn ensure_state(rollouts: &mut Machine, store: Option<&mut Store>, id: &str) {
    if rollouts.knows_state(id) {
        return;
    }
    let state = match store {
        None => RolloutState::default(),
        Some(store) => store.state(id).unwrap_or_else(|e| {
            tracing::error!(template = %id, "cannot read the rollout state: {e}; starting without it");
            RolloutState::default()
        }),
    };
    rollouts.load_state(id, state);
}
