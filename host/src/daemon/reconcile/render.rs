//! One template, rendered and put in place: the render through its chain,
//! the checks a manifest must pass before it may replace a file (size, pod
//! name, ownership), the rollout machine's gate, and the write.
//!
//! Invariants: a render that fails in any way leaves the file as it is and
//! is reported once per distinct failure; a revision is marked pending
//! ([`crate::daemon::rollout::Machine::writing`]) and that state saved before
//! its file is renamed into place (the write is staged, and put in place
//! with the pass's others by [`super::batch`]); bytes already on disk are
//! never written again.

use std::fs;
use std::time::Instant;

use super::outcome::{Done, Failure, write_failed};
use super::prepare::{NotReady, Ready};
use super::timing::Part;
use super::{ChainKey, Reconciler, ensure_state, read_regular};
use crate::chain::{Chain, StepFailure};
use crate::daemon::metrics::Metrics;
use crate::daemon::revisions::Store;
use crate::fleet;
use crate::fleet::policy::Policy;
use crate::manifest;
use crate::node::NodeContext;
use crate::reason::Reason;
use crate::render::{RenderError, Rendered, Stage, check_size, render_unverified};
use crate::template::Template;
use crate::write::{self, Outcome};

/// How a render ended without a failure.
enum Placed {
    /// The manifest is in place (written, unchanged, held or gated).
    Done(Done),
    /// The template's `podstamp.io/node-selector` does not select this
    /// node: nothing is rendered, and what it had here goes.
    NotForNode { selector: String },
    /// The new manifest waits in its dot-temp file for the end of the pass
    /// ([`super::batch`]), which ends the render as a [`Placed::Done`] or
    /// a failure.
    Staged { file: String },
}

impl Reconciler {
    pub(super) fn render_one(&mut self, key: &str) {
        let node = self.node.clone().expect("checked by reconcile");
        let mut chain_seen = None;
        let mut selected = None;
        let result = self.try_render(key, &node, &mut chain_seen, &mut selected);
        let entry = self.entries.get_mut(key).expect("dirty keys exist");
        entry.chain = chain_seen;
        let id = entry.id.clone().unwrap_or_else(|| key.to_string());
        let was_off_node = entry.off_node;
        if let Some(selected) = selected {
            entry.off_node = !selected;
        }
        match result {
            Ok(Placed::NotForNode { selector }) => {
                self.claims.set(key, entry.seq, None);
                entry.last_error = None;
                if !was_off_node {
                    tracing::info!(template = %id, node = %node.name, selector = %selector,
                        "not for this node: its {} does not select the node's labels; its manifest and rollout state, if any, are removed",
                        crate::selector::NODE_SELECTOR_ANNOTATION);
                    // As when the template is deleted: its slot, its
                    // record, its state and its metrics go; the collector
                    // removes its manifest.
                    self.rollouts.forget(&id);
                    self.gc_due = true;
                }
            }
            // Claimed now, so that a later template of this pass producing
            // the same pod name is refused; the rest when the pass commits.
            Ok(Placed::Staged { file }) => self.claims.set(key, entry.seq, Some(file)),
            Ok(Placed::Done(done)) => self.placed(key, done),
            Err(failure) => self.failed(key, &node, failure),
        }
    }

    /// Renders and writes one template; `chain_seen` gets the chain it was
    /// rendered with, once the catalog gave one (or refused to), and
    /// `selected` whether its node selector selects this node, once that is
    /// known.
    fn try_render(
        &mut self,
        key: &str,
        node: &NodeContext,
        chain_seen: &mut Option<ChainKey>,
        selected: &mut Option<bool>,
    ) -> Result<Placed, Failure> {
        let entry = &self.entries[key];
        let template = entry.incoming.template.as_ref().map_err(|e| Failure {
            reason: e.reason(),
            plugin: None,
            message: e.to_string(),
        })?;
        let Ready {
            selector,
            deadline,
            policy,
            held,
            chain,
        } = match self.prepare(template, node, chain_seen, selected) {
            Ok(ready) => ready,
            Err(NotReady::NotForNode(selector)) => return Ok(Placed::NotForNode { selector }),
            Err(NotReady::Refused(failure)) => return Err(failure),
        };
        // What a share of the nodes (`max-unavailable: 10%`) is of, as the
        // API reads a label selector: kubectl's syntax, which it prints.
        let nodes = selector
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let target = self
            .rollouts
            .coordinated()
            .then(|| fleet::target(&template.fingerprint(), &chain.fingerprint()));
        // The same without the chain's settings, which may differ per node:
        // what a failure halts on every node.
        let change = target
            .as_ref()
            .map(|_| fleet::change(&template.fingerprint(), &chain.shape()));
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
        // Rendered ahead, with the pass's chunk ([`super::ahead`]), or now.
        let started = Instant::now();
        let rendered = match self.ahead.take(key, template, &chain) {
            Some(rendered) => rendered,
            None => check_size(template, self.max_manifest_bytes).and_then(|()| {
                render_timed(template, node, &chain, &self.namespace, &self.metrics)
            }),
        };
        self.timing.add(Part::Render, started);
        let rendered = rendered.map_err(render_failed)?.held_to(held);
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
        if let Some(other) = self.claims.earlier(&file, entry.seq, key) {
            let other = self
                .entries
                .get(other)
                .and_then(|e| e.id.as_deref())
                .unwrap_or(other);
            return Err(conflict(format!(
                "PodTemplate {}: pod name {:?} is already produced by PodTemplate {other}",
                template.id(),
                manifest.pod_name,
            )));
        }
        // Whether the file was seen missing just now, by the ownership check
        // below: then it holds no bytes either, and is not opened again to
        // compare them (a new manifest's name is looked up once, not twice).
        let mut missing = false;
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
                let found = fs::symlink_metadata(&path);
                missing = found
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
                if found.is_ok() {
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
        // Every end of this render reports the same template, revision,
        // deadline and policy; only the file's fate differs.
        let done = |file: String, outcome: Outcome, target: Option<String>| Done {
            file,
            outcome,
            source: done_source.clone(),
            revision: revision.clone(),
            deadline,
            held: false,
            gated: None,
            target,
            change: change.clone(),
            quorum: policy == Policy::Quorum,
        };
        let template_id = template.id();
        ensure_state(&mut self.rollouts, self.revisions.as_mut(), &source);
        let mut held = self.rollouts.is_held(&source, &manifest.revision);
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
            self.rollouts.unhold(&source);
            held = false;
        }
        if held {
            tracing::debug!(template = %source, revision = %revision, "revision held: it failed and was rolled back");
            self.owned.insert(file.clone(), source);
            return Ok(Placed::Done(Done {
                held: true,
                ..done(file, Outcome::Unchanged, target)
            }));
        }
        // Bytes already on disk were read back when they were written; only
        // new bytes are read back, just before they replace the file.
        let holds = !missing && write::already_holds(&self.dir, &file, &manifest.bytes);
        if let Some(target) = &target {
            if holds {
                self.rollouts.unchanged(&source);
            } else if self.owned.contains_key(&file) && self.dir.join(&file).exists() {
                // An update of a manifest in place: it may have to wait.
                if let Some(gated) =
                    self.rollouts
                        .gate(&source, target, change.as_deref(), policy, &nodes)
                {
                    self.owned.insert(file.clone(), source);
                    return Ok(Placed::Done(Done {
                        gated: Some(gated),
                        ..done(file, Outcome::Unchanged, Some(target.clone()))
                    }));
                }
            }
        }
        let outcome = if holds {
            record_revision(&mut self.revisions, manifest);
            Outcome::Unchanged
        } else {
            let started = Instant::now();
            let verified = rendered.verify();
            self.timing.add(Part::Check, started);
            let manifest = verified.map_err(render_failed)?;
            // Known before the file is in place: a daemon killed right after
            // the rename still follows it as its own after a restart. (The
            // state is saved, durably, when the pass commits, before any
            // rename.)
            self.rollouts.writing(&source, &manifest.revision, deadline);
            self.run_effects();
            let staged = write::stage(&self.dir, &file, &manifest.bytes)
                .map_err(|e| write_failed(&template_id, &file, e))?;
            let Some(staged) = staged else {
                // Already there after all (written meanwhile by hand?).
                record_revision(&mut self.revisions, &manifest);
                self.owned.insert(file.clone(), source);
                return Ok(Placed::Done(done(file, Outcome::Unchanged, target)));
            };
            let previous = self.claims.of(key).map(str::to_string);
            self.pass.writes.push(super::batch::PendingWrite {
                key: key.to_string(),
                template_id,
                staged,
                manifest,
                previous_claim: previous,
                done: done(file.clone(), Outcome::Written, target),
            });
            return Ok(Placed::Staged { file });
        };
        self.owned.insert(file.clone(), source);
        Ok(Placed::Done(done(file, outcome, target)))
    }
}

/// Records `manifest` as its template's revision in use, written behind
/// the pass. A failure is logged by the history, not the render's: the
/// manifest itself is in place.
fn record_revision(store: &mut Option<Store>, manifest: &manifest::Manifest) {
    if let Some(store) = store {
        store.record_many(&[(&manifest.source, &manifest.revision, &manifest.bytes)]);
    }
}

/// [`crate::render::render`], with each plugin call timed for the metrics,
/// each refusal by a plugin's scope counted, and the read back left to the
/// caller ([`Rendered::verify`]).
pub fn render_timed(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    metrics: &Metrics,
) -> Result<Rendered, RenderError> {
    let rendered = render_unverified(template, node, chain, namespace, &mut |step, ok, took| {
        metrics.plugin_call(&step.name, ok, took)
    });
    if let Err(RenderError {
        stage: Stage::Plugin(failure),
        ..
    }) = &rendered
        && matches!(failure.failure, StepFailure::OutOfScope { .. })
    {
        metrics.scope_refusal(&failure.step);
    }
    rendered
}
