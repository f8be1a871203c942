//! What a template must pass before it is rendered, in the order a render
//! refuses it: its namespace, its node selector, its rollout annotations
//! (progress deadline, policy), its Pod Security level, its chain.
//!
//! One function for both callers: [`super::render`] turns a refusal into
//! the template's failure, and [`super::ahead`] skips the template, so that
//! what is rendered ahead is exactly what the render would render (no
//! plugin call is counted for a template it refuses) and the two cannot
//! drift apart.

use std::time::Duration;

use super::outcome::Failure;
use super::{ChainKey, Reconciler};
use crate::chain::Chain;
use crate::daemon::rollout;
use crate::fleet::policy::{self, Policy};
use crate::node::NodeContext;
use crate::reason::Reason;
use crate::security_level::{self, Held};
use crate::selector::{self, Selector};
use crate::template::Template;

/// A template that may be rendered, with what its annotations said.
pub(super) struct Ready {
    pub(super) selector: Option<Selector>,
    pub(super) deadline: Duration,
    pub(super) policy: Policy,
    /// The Pod Security level the rendered pod is held to.
    pub(super) held: Held,
    pub(super) chain: Chain,
}

/// Why a template is not rendered.
pub(super) enum NotReady {
    /// Its `podstamp.io/node-selector` (this text) does not select this
    /// node.
    NotForNode(String),
    Refused(Failure),
}

impl Reconciler {
    /// Whether `template` may be rendered on `node` (see the module
    /// header). `selected` gets whether its selector selects the node and
    /// `chain_seen` the chain the catalog gave (or its refusal), once each
    /// is known.
    pub(super) fn prepare(
        &self,
        template: &Template,
        node: &NodeContext,
        chain_seen: &mut Option<ChainKey>,
        selected: &mut Option<bool>,
    ) -> Result<Ready, NotReady> {
        let invalid = |message: String| {
            NotReady::Refused(Failure {
                reason: Reason::InvalidTemplate,
                plugin: None,
                message,
            })
        };
        if template.namespace != self.namespace {
            return Err(invalid(format!(
                "PodTemplate {}: metadata.namespace: is {:?}, but this podstamp manages namespace {:?}",
                template.id(),
                template.namespace,
                self.namespace
            )));
        }
        let selector = selector::from_annotations(&template.annotations)
            .map_err(|e| invalid(format!("PodTemplate {}: {e}", template.id())))?;
        *selected = Some(selector.as_ref().is_none_or(|s| s.matches(&node.labels)));
        if *selected == Some(false) {
            return Err(NotReady::NotForNode(
                template.annotations[selector::NODE_SELECTOR_ANNOTATION].clone(),
            ));
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
        // The level is known before anything renders: a pod is never
        // written unchecked for want of it.
        let labels = self
            .namespace_labels
            .as_ref()
            .expect("checked by reconcile");
        let held = security_level::resolve(
            &self.pod_security,
            Some((self.namespace.as_str(), labels)),
            &template.id(),
            &template.annotations,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let catalog = self.catalog.as_deref().expect("checked by reconcile");
        let chain = catalog.chain_for(&template.annotations);
        *chain_seen = Some(match &chain {
            Ok(chain) => Ok(chain.fingerprint()),
            Err(e) => Err(e.to_string()),
        });
        let chain = chain.map_err(|e| {
            NotReady::Refused(Failure {
                reason: e.reason(),
                plugin: None,
                message: format!("PodTemplate {}: {e}", template.id()),
            })
        })?;
        Ok(Ready {
            selector,
            deadline,
            policy,
            held,
            chain,
        })
    }
}
