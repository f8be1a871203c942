//! One render: template → plugin chain → validation → manifest → the
//! kubelet's check.
//!
//! The manifest's bytes are checked as the node's kubelet would read them
//! ([`crate::kube_check`]) when they are about to be written
//! ([`Rendered::verify`]): a manifest equal to the file on disk is not
//! checked again, and nothing the kubelet refuses is ever written. A render
//! given a Pod Security level ([`Rendered::held_to`], from
//! [`crate::security_level`]) is also held to it there, by Kubernetes' own
//! checks: a pod that fails one is refused like an invalid pod. The daemon
//! and the CLI always give one; a library caller that gives none gets the
//! kubelet's check alone.
//!
//! Its time is bounded: the chain by its budget, the native stages by the
//! template's size, which [`check_size`] caps at the largest manifest
//! written, so that one template cannot hold the render thread for long
//! (docs/performance.md measures it).

use std::fmt;
use std::time::Duration;

use crate::chain::{Chain, ChainFailure, Step, StepChanges};
use crate::kube_check::{
    CheckError, KubeCheck, PodSecurityError, Question, Refusal, Unavailable, Violation,
};
use crate::manifest::{self, Manifest};
use crate::node::NodeContext;
use crate::plugin::WitNode;
use crate::security_level::{BadLevel, Held};
use crate::template::Template;
use crate::validate::{self, Invalid};

/// Why a template could not be rendered; says which template, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    /// `namespace/name` of the PodTemplate.
    pub template: String,
    pub stage: Stage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// The template itself names a chain that does not exist.
    Chain(String),
    /// A plugin failed.
    Plugin(Box<ChainFailure>),
    /// The pod after the chain is not a valid v1 Pod.
    Result {
        after_plugins: bool,
        invalid: Invalid,
    },
    /// The kubelet would refuse the manifest (Kubernetes' own validation of
    /// a static pod file), and stop the pod running from the file.
    Refused {
        after_plugins: bool,
        refusal: Box<Refusal>,
    },
    /// The kubelet's check could not be run, so nothing is written.
    Unchecked(Unavailable),
    /// The pod does not meet the Pod Security level it is held to.
    PodSecurity {
        after_plugins: bool,
        held: Box<Held>,
        violation: Box<Violation>,
    },
    /// The Pod Security check could not be run, so nothing is written.
    PodSecurityUnchecked(Unavailable),
    /// The level the template is held to cannot be read (a namespace label
    /// or the template's annotation that is no level or version).
    Level(BadLevel),
    /// The manifest written for the pod does not read back as the pod: a
    /// bug in podstamp's writer, caught before anything is written. The same
    /// template fails the same way every time, so it is a render failure (the
    /// last good manifest stays), not a write failure (the disk is fine).
    Manifest(manifest::Unreadable),
    /// The template's pod is larger, as JSON, than any manifest written.
    TooLarge { size: usize, limit: usize },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodTemplate {}: ", self.template)?;
        match &self.stage {
            Stage::Chain(e) => write!(f, "{e}"),
            Stage::Plugin(e) => write!(f, "{e}"),
            Stage::Result {
                after_plugins: true,
                invalid,
            } => write!(
                f,
                "the pod returned by the plugin chain is invalid: {invalid}"
            ),
            Stage::Result {
                after_plugins: false,
                invalid,
            } => write!(f, "the template's pod is invalid: {invalid}"),
            Stage::Refused {
                after_plugins: true,
                refusal,
            } => write!(
                f,
                "the pod returned by the plugin chain is invalid: {refusal}"
            ),
            Stage::Refused {
                after_plugins: false,
                refusal,
            } => write!(f, "the template's pod is invalid: {refusal}"),
            Stage::Unchecked(e) => write!(f, "{}", CheckError::Unavailable(e.clone())),
            Stage::PodSecurity {
                after_plugins,
                held,
                violation,
            } => write!(
                f,
                "{} does not meet Pod Security level {}: {violation}",
                if *after_plugins {
                    "the pod returned by the plugin chain"
                } else {
                    "the template's pod"
                },
                held
            ),
            Stage::PodSecurityUnchecked(e) => {
                write!(f, "{}", PodSecurityError::Unavailable(e.clone()))
            }
            Stage::Level(e) => write!(
                f,
                "its Pod Security level cannot be read, so it is not rendered: {e}"
            ),
            Stage::Manifest(e) => write!(
                f,
                "podstamp cannot read back the manifest it made for the pod, so it is not written: {e} (a bug in podstamp; please report it with the template)"
            ),
            Stage::TooLarge { size, limit } => write!(
                f,
                "the template's pod is {size} bytes, over the limit of {limit} (limits.maxManifestSize) for a manifest; it is not rendered"
            ),
        }
    }
}

impl std::error::Error for RenderError {}

/// Refuses a template whose pod, written as JSON, is over `max_bytes`
/// (`limits.maxManifestSize`): its manifest would be refused after the whole
/// render, which for a template of many megabytes holds the render thread
/// many times longer than writing the JSON to count it.
pub fn check_size(template: &Template, max_bytes: usize) -> Result<(), RenderError> {
    let size = template.pod_json_len();
    if size > max_bytes {
        return Err(RenderError {
            template: template.id(),
            stage: Stage::TooLarge {
                size,
                limit: max_bytes,
            },
        });
    }
    Ok(())
}

/// Renders `template` for `node` through `chain`, into a manifest in `namespace`.
pub fn render(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
) -> Result<Manifest, RenderError> {
    render_observed(template, node, chain, namespace, &mut |_, _, _| {})
}

/// [`render`], telling `observe` about every plugin call (see [`Chain::apply_observed`]).
pub fn render_observed(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    observe: &mut dyn FnMut(&Step, bool, Duration),
) -> Result<Manifest, RenderError> {
    render_unverified(template, node, chain, namespace, observe)?.verify()
}

/// [`render_unverified`], adding to `explain` what each plugin changed
/// (`podstamp render --explain`): filled as far as the chain ran, also
/// when it fails.
pub fn render_explained(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    explain: &mut Vec<StepChanges>,
) -> Result<Rendered, RenderError> {
    render_inner(
        template,
        node,
        chain,
        namespace,
        &mut |_, _, _| {},
        Some(explain),
    )
}

/// A rendered manifest whose bytes were not read back yet: the daemon
/// compares them with the file on disk first, and reads back only bytes
/// that are about to be written.
#[derive(Debug, Clone)]
pub struct Rendered {
    template: String,
    manifest: manifest::Unverified,
    /// The node whose kubelet reads the manifest, and that kubelet's version.
    node: String,
    kubelet_version: Option<String>,
    after_plugins: bool,
    /// The Pod Security level the pod is held to; None: not checked.
    pod_security: Option<Held>,
}

impl Rendered {
    /// Holds the pod to the Pod Security level `held` when it is verified.
    pub fn held_to(mut self, held: Held) -> Rendered {
        self.pod_security = Some(held);
        self
    }

    /// The level given to [`Rendered::held_to`].
    pub fn pod_security(&self) -> Option<&Held> {
        self.pod_security.as_ref()
    }

    /// The manifest, for its name, source and bytes; not to be written.
    pub fn peek(&self) -> &Manifest {
        self.manifest.peek()
    }

    /// The question [`Rendered::verify`] will ask the kubelet's check about
    /// these bytes, for [`KubeCheck::prefetch`] to send ahead.
    pub fn question(&self) -> Question<'_> {
        Question {
            node: &self.node,
            kubelet: self.kubelet_version.as_deref(),
            manifest: &self.manifest.peek().bytes,
            policy: self.pod_security.as_ref().map(|held| &held.policy),
        }
    }

    /// Reads the bytes back, then asks the process's kubelet check
    /// ([`KubeCheck::shared`]) about them, and the Pod Security check when
    /// held to a level; a failure is the render's ([`Stage::Manifest`],
    /// [`Stage::Refused`], [`Stage::Unchecked`], [`Stage::PodSecurity`],
    /// [`Stage::PodSecurityUnchecked`]).
    pub fn verify(self) -> Result<Manifest, RenderError> {
        self.verify_with(KubeCheck::shared())
    }

    /// [`Rendered::verify`] with the kubelet check `check`.
    pub fn verify_with(self, check: &KubeCheck) -> Result<Manifest, RenderError> {
        let template = self.template;
        let fail = |stage| RenderError {
            template: template.clone(),
            stage,
        };
        let manifest = self
            .manifest
            .verify()
            .map_err(|e| fail(Stage::Manifest(e)))?;
        let refused = |e| match e {
            CheckError::Refused(refusal) => fail(Stage::Refused {
                after_plugins: self.after_plugins,
                refusal: Box::new(refusal),
            }),
            CheckError::Unavailable(e) => fail(Stage::Unchecked(e)),
        };
        let kubelet = self.kubelet_version.as_deref();
        let Some(held) = self.pod_security else {
            check
                .check(&self.node, kubelet, &manifest.bytes)
                .map_err(refused)?;
            return Ok(manifest);
        };
        // Held to a level: both checks in one request to the helper.
        check
            .check_held(&self.node, kubelet, &manifest.bytes, &held.policy)
            .map_err(refused)?
            .map_err(|e| match e {
                PodSecurityError::Violated(violation) => fail(Stage::PodSecurity {
                    after_plugins: self.after_plugins,
                    held: Box::new(held.clone()),
                    violation: Box::new(violation),
                }),
                PodSecurityError::Unavailable(e) => fail(Stage::PodSecurityUnchecked(e)),
            })?;
        Ok(manifest)
    }
}

/// [`render_observed`] but for the read back, left to [`Rendered::verify`].
pub fn render_unverified(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    observe: &mut dyn FnMut(&Step, bool, Duration),
) -> Result<Rendered, RenderError> {
    render_inner(template, node, chain, namespace, observe, None)
}

fn render_inner(
    template: &Template,
    node: &NodeContext,
    chain: &Chain,
    namespace: &str,
    observe: &mut dyn FnMut(&Step, bool, Duration),
    explain: Option<&mut Vec<StepChanges>>,
) -> Result<Rendered, RenderError> {
    let id = template.id();
    let fail = |stage| RenderError {
        template: id.clone(),
        stage,
    };
    let subject = format!("{id} on {}", node.name);
    let wit_node = WitNode::from(node);
    let pod = match explain {
        None => chain.apply_observed(template, &wit_node, &subject, observe),
        Some(explain) => chain.apply_explained(template, &wit_node, &subject, observe, explain),
    }
    .map_err(|e| fail(Stage::Plugin(e)))?;
    let mut pod = pod;
    // Forced before validation, so that what is validated is what is written.
    pod["metadata"]["namespace"] = serde_json::Value::String(namespace.to_string());
    // A template's pod passed the schema check when the template was read,
    // and forcing the namespace keeps it so: without plugins, only the rules
    // on names and containers are left to check.
    let checked = if chain.is_empty() {
        validate::check_rules(&pod)
    } else {
        validate::validate_pod(&pod)
    };
    checked.map_err(|invalid| {
        fail(Stage::Result {
            after_plugins: !chain.is_empty(),
            invalid,
        })
    })?;
    // The kubelet names a static pod `<name>-<node name>` and rejects the
    // file when that is over 253 characters.
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let kubelet_name_len = name.len() + 1 + node.name.len();
    if kubelet_name_len > 253 {
        return Err(fail(Stage::Result {
            after_plugins: !chain.is_empty(),
            invalid: Invalid(vec![validate::FieldError {
                field: "metadata.name".into(),
                message: format!(
                    "is {} characters long; the kubelet names the pod \"<name>-{}\", {kubelet_name_len} characters, over the limit of 253",
                    name.len(),
                    node.name
                ),
            }]),
        }));
    }
    Ok(Rendered {
        manifest: manifest::finish_unverified(pod, namespace, &id),
        template: id,
        node: node.name.clone(),
        kubelet_version: node.kubelet_version.clone(),
        after_plugins: !chain.is_empty(),
        pod_security: None,
    })
}
