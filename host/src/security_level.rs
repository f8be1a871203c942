//! Which Pod Security level a template's rendered pod is held to, and why.
//!
//! Static pods bypass Pod Security Admission, so podstamp applies the level
//! the pod's namespace would have applied to it (docs/daemon.md, "Pod
//! Security"). From the first that says:
//!
//! 1. the namespace's `pod-security.kubernetes.io/enforce` label (and
//!    `enforce-version`, else `latest`), as the admission plugin reads them;
//! 2. otherwise the configuration's `podSecurity` (flag `--pod-security`,
//!    `PODSTAMP_POD_SECURITY`, resolved in [`crate::settings`]), by default
//!    [`DEFAULT_LEVEL`];
//!
//! and then the template's annotation [`ANNOTATION`] (`LEVEL` or
//! `LEVEL:VERSION`), which may only make it stricter.
//!
//! Invariants:
//! - A template author cannot loosen the level: an annotation less strict
//!   than the namespace's (or the configuration's) level is not applied (the
//!   level held names both, so a refusal says why). Only whoever may label
//!   the namespace or write podstamp's configuration grants `privileged`.
//! - A label or annotation that is not a level or version is never read as
//!   some other level: the render is refused ([`BadLevel`]) with one line
//!   naming the object, the field and the fix.
//! - [`Held`] always says where its level came from.

use std::collections::BTreeMap;
use std::fmt;

use crate::kube_check::{Level, Policy};

/// The namespace label the Pod Security admission plugin enforces.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// Its version (`latest` or `v1.N`; absent: `latest`).
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
/// A template's own, stricter level: `LEVEL` or `LEVEL:VERSION`.
pub const ANNOTATION: &str = "podstamp.io/pod-security";
/// The level when neither the namespace nor the configuration gives one.
/// `baseline` refuses what takes a node (host namespaces, privileged
/// containers, hostPath volumes, added capabilities, host ports...) while a
/// pod written without security contexts still runs; `restricted` is one
/// label or annotation away. `privileged` (control-plane pods need host
/// networking and host paths) is never a default: it is granted.
pub const DEFAULT_LEVEL: Level = Level::Baseline;

/// A level and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub policy: Policy,
    /// Where, in words: `the namespace kube-system's label
    /// pod-security.kubernetes.io/enforce`, `--pod-security`...
    pub from: String,
}

impl Held {
    /// The default, when nothing is configured.
    pub fn default_level() -> Held {
        Held {
            policy: Policy::latest(DEFAULT_LEVEL),
            from: "podstamp's default (podSecurity)".into(),
        }
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.policy, self.from)
    }
}

/// A level or version that cannot be used; the render is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct BadLevel {
    /// `Namespace kube-system`, `PodTemplate kube-system/etcd`.
    pub object: String,
    /// `metadata.labels[pod-security.kubernetes.io/enforce]`.
    pub field: String,
    pub message: String,
}

/// The level for a template in `namespace` (its name and labels, when the
/// namespace was read), with the template's `annotations`, over the
/// configured level `configured`.
pub fn resolve(
    configured: &Held,
    namespace: Option<(&str, &BTreeMap<String, String>)>,
    template: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Held, BadLevel> {
    let base = match namespace
        .and_then(|(name, labels)| Some((name, labels.get(ENFORCE_LABEL)?, labels)))
    {
        Some((name, level, labels)) => {
            let bad = |field: &str, message: String| BadLevel {
                object: format!("Namespace {name}"),
                field: format!("metadata.labels[{field}]"),
                message: format!("{message}; podstamp holds the namespace's static pods to it"),
            };
            let level = Level::parse(level).map_err(|e| bad(ENFORCE_LABEL, e))?;
            let version = labels
                .get(ENFORCE_VERSION_LABEL)
                .map_or("latest", String::as_str);
            let policy = Policy::new(level, version).map_err(|e| bad(ENFORCE_VERSION_LABEL, e))?;
            Held {
                policy,
                from: format!("the namespace {name}'s label {ENFORCE_LABEL}"),
            }
        }
        None => configured.clone(),
    };
    let Some(asked) = annotations.get(ANNOTATION) else {
        return Ok(base);
    };
    let asked = Policy::parse(asked).map_err(|e| BadLevel {
        object: format!("PodTemplate {template}"),
        field: format!("metadata.annotations[{ANNOTATION}]"),
        message: format!("{e} (as LEVEL or LEVEL:VERSION)"),
    })?;
    if asked.level > base.policy.level {
        return Ok(Held {
            policy: asked,
            from: format!(
                "the template's annotation {ANNOTATION}, stricter than {}",
                base
            ),
        });
    }
    if asked.level < base.policy.level {
        // Not applied: a template may not loosen its namespace's level.
        return Ok(Held {
            from: format!(
                "{}; the template's annotation {ANNOTATION} asks for {}, which only a namespace label or podstamp's configuration can grant",
                base.from, asked.level
            ),
            ..base
        });
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_namespace_label_then_the_configuration() {
        let configured = Held::default_level();
        let none = map(&[]);
        let held = resolve(&configured, None, "ns/t", &none).unwrap();
        assert_eq!(held, configured);
        let labels = map(&[
            (ENFORCE_LABEL, "restricted"),
            (ENFORCE_VERSION_LABEL, "v1.30"),
        ]);
        let held = resolve(&configured, Some(("ns", &labels)), "ns/t", &none).unwrap();
        assert_eq!(held.policy.to_string(), "restricted:v1.30");
        assert!(held.from.contains("namespace ns's label"), "{held}");
        // A namespace without the label: the configuration's.
        let other = map(&[("team", "a")]);
        let held = resolve(&configured, Some(("ns", &other)), "ns/t", &none).unwrap();
        assert_eq!(held, configured);
    }

    #[test]
    fn an_annotation_only_makes_it_stricter() {
        let labels = map(&[(ENFORCE_LABEL, "baseline")]);
        let stricter = map(&[(ANNOTATION, "restricted")]);
        let held = resolve(
            &Held::default_level(),
            Some(("ns", &labels)),
            "ns/t",
            &stricter,
        )
        .unwrap();
        assert_eq!(held.policy.level, Level::Restricted);
        assert!(held.from.contains(ANNOTATION), "{held}");
        let looser = map(&[(ANNOTATION, "privileged")]);
        let held = resolve(
            &Held::default_level(),
            Some(("ns", &labels)),
            "ns/t",
            &looser,
        )
        .unwrap();
        assert_eq!(held.policy.level, Level::Baseline);
        assert!(held.from.contains("asks for privileged"), "{held}");
        // Over a configured privileged, it tightens too.
        let privileged = Held {
            policy: Policy::latest(Level::Privileged),
            from: "--pod-security".into(),
        };
        let held = resolve(&privileged, None, "ns/t", &stricter).unwrap();
        assert_eq!(held.policy.level, Level::Restricted);
    }

    #[test]
    fn a_bad_label_or_annotation_names_its_object_and_field() {
        let labels = map(&[(ENFORCE_LABEL, "strict")]);
        let e = resolve(
            &Held::default_level(),
            Some(("ns", &labels)),
            "ns/t",
            &map(&[]),
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "Namespace ns: metadata.labels[pod-security.kubernetes.io/enforce]: \"strict\" is not a Pod Security level"
            ),
            "{e}"
        );
        let labels = map(&[(ENFORCE_LABEL, "baseline"), (ENFORCE_VERSION_LABEL, "1.30")]);
        let e = resolve(
            &Held::default_level(),
            Some(("ns", &labels)),
            "ns/t",
            &map(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("enforce-version]"), "{e}");
        let bad = map(&[(ANNOTATION, "restricted:newest")]);
        let e = resolve(&Held::default_level(), None, "ns/t", &bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("PodTemplate ns/t: metadata.annotations[podstamp.io/pod-security]:"),
            "{e}"
        );
    }
}
