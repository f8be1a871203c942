//! A pass's renders done a few templates ahead, so that the kubelet's check
//! of their manifests runs in the helper while the next ones render.
//!
//! Each manifest about to be written is checked by the helper
//! ([`crate::kube_check`]); one template after another, the render thread
//! waits for every answer, and the helper waits for every render. So the
//! pass goes through its templates in chunks of [`AHEAD`]: first
//! [`Reconciler::render_ahead`] renders the chunk and sends each new
//! manifest's question to the helper as soon as it is rendered
//! ([`KubeCheck::prefetch`]: several in flight, the answers memoized), then
//! each template goes through [`Reconciler::render_one`] as before, which
//! takes its render from here and its verdict from the memo.
//!
//! Invariants:
//! - Nothing here decides anything: the render is the one `try_render`
//!   would have made (the same template, node, chain and namespace; a render
//!   is taken only for the same template and chain fingerprints, else done
//!   again), failures included; every check, refusal and write still happens
//!   in `render_one`, in the pass's order, before its staging (no check, no
//!   write). A template whose render or checks fail here fails there, with
//!   the same message.
//! - Only the manifests that would be written are asked about (not bytes
//!   already on disk), and a question the helper could not answer is asked
//!   again by the check itself.
//! - What is rendered ahead lives for one chunk: [`Ahead::clear`] after it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Reconciler;
use super::prepare::Ready;
use super::render::render_timed;
use super::timing::Part;
use crate::chain::Chain;
use crate::kube_check::KubeCheck;
use crate::render::{RenderError, Rendered, check_size};
use crate::template::Template;
use crate::write;

/// Templates rendered ahead at once: as many as the check has questions in
/// flight, so that no answer is waited for until the chunk is rendered.
pub(super) const AHEAD: usize = crate::kube_check::MAX_IN_FLIGHT;

/// Renders done ahead, by template key.
#[derive(Default)]
pub(super) struct Ahead {
    rendered: HashMap<String, Early>,
}

struct Early {
    template: [u8; 32],
    chain: [u8; 32],
    rendered: Result<Rendered, RenderError>,
}

impl Ahead {
    /// The render done ahead for `key`, if it was of this `template` through
    /// this `chain`.
    pub(super) fn take(
        &mut self,
        key: &str,
        template: &Template,
        chain: &Chain,
    ) -> Option<Result<Rendered, RenderError>> {
        let early = self.rendered.remove(key)?;
        (early.template == template.fingerprint() && early.chain == chain.fingerprint())
            .then_some(early.rendered)
    }

    pub(super) fn clear(&mut self) {
        self.rendered.clear();
    }
}

impl Reconciler {
    /// Renders `keys` as `try_render` will, keeps the renders, and sends
    /// the helper each new manifest's question (see the module header).
    /// A template `try_render` would refuse before its render is skipped.
    pub(super) fn render_ahead(&mut self, keys: &[(u64, String)]) {
        let (Some(node), Some(_), Some(_)) = (
            self.node.as_ref(),
            self.catalog.as_deref(),
            self.namespace_labels.as_ref(),
        ) else {
            return;
        };
        let whole = Instant::now();
        let mut rendering = Duration::ZERO;
        let mut session = KubeCheck::shared().prefetch();
        for (_, key) in keys {
            let Some(Ok(template)) = self.entries.get(key).map(|e| e.incoming.template.as_ref())
            else {
                continue;
            };
            // Refused by try_render before its render: not rendered here
            // either, so that no plugin call is counted for it.
            let Ok(Ready { held, chain, .. }) = self.prepare(template, node, &mut None, &mut None)
            else {
                continue;
            };
            let started = Instant::now();
            let rendered = check_size(template, self.max_manifest_bytes)
                .and_then(|()| render_timed(template, node, &chain, &self.namespace, &self.metrics))
                .map(|r| r.held_to(held));
            rendering += started.elapsed();
            if let Ok(r) = &rendered {
                let manifest = r.peek();
                if manifest.bytes.len() <= self.max_manifest_bytes
                    && !write::already_holds(&self.dir, &manifest.file_name(), &manifest.bytes)
                {
                    session.ask(r.question());
                }
            }
            self.ahead.rendered.insert(
                key.clone(),
                Early {
                    template: template.fingerprint(),
                    chain: chain.fingerprint(),
                    rendered,
                },
            );
        }
        session.finish();
        // The renders are the render's share; the rest (the questions sent,
        // the chunk's last answers waited for) is the check's, apart from
        // the checks' own read back and memo (`check`).
        self.timing.add_duration(Part::Render, rendering);
        self.timing
            .add_duration(Part::CheckAhead, whole.elapsed().saturating_sub(rendering));
    }
}
