//! What a template's `podstamp.io/plugins` annotation (and the catalog's
//! `chain`) can get wrong, and how a template's annotations fail.
//!
//! Invariants: a chain names catalog plugins only, each at most once, so no
//! chain is longer than the catalog; every annotation error names the
//! annotation and carries the reason reported for the template.

use super::settings::SettingsError;
use crate::reason::Reason;
use crate::validate::join_key;

/// The PodTemplate annotation with which a template picks its chain.
pub const PLUGINS_ANNOTATION: &str = "podstamp.io/plugins";

/// Why a list of plugin names is not a chain that can run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("unknown plugin {name:?} (the catalog has: {known})")]
    Unknown { name: String, known: String },
    #[error(
        "names plugin {name:?} more than once; a chain runs each plugin at most once: list it once"
    )]
    Repeated { name: String },
    #[error(
        "names {count} plugins, but a chain runs each catalog plugin at most once and the catalog has {catalog}: list each plugin once (the catalog has: {known})"
    )]
    TooLong {
        count: usize,
        catalog: usize,
        known: String,
    },
}

/// A template's annotations name a chain or settings that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// `podstamp.io/plugins`.
    #[error("{field}: {0}", field = join_key("metadata.annotations", PLUGINS_ANNOTATION))]
    Plugins(ChainError),
    /// `podstamp.io/settings`; the message names the annotation itself.
    #[error(transparent)]
    Settings(SettingsError),
}

impl AnnotationError {
    /// The failure reason reported for the template (metrics, log, Event).
    pub fn reason(&self) -> Reason {
        match self {
            AnnotationError::Plugins(ChainError::Unknown { .. }) => Reason::UnknownPlugin,
            AnnotationError::Plugins(ChainError::Repeated { .. } | ChainError::TooLong { .. }) => {
                Reason::InvalidChain
            }
            AnnotationError::Settings(_) => Reason::InvalidSettings,
        }
    }
}
