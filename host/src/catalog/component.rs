//! The bytes of one catalog entry's component: read from its file or its
//! ConfigMap, inflated when gzip, and checked against the entry's pin.
//!
//! Invariants: the digest is of the uncompressed component (the same pin
//! for a file, a plain ConfigMap and a gzip one); a pinned component whose
//! bytes differ is never loaded; every refusal names the ConfigMap (with
//! its namespace) and the key, or the file, and the digests when they
//! differ, in one line.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::config_maps::{ConfigMapError, ConfigMaps};
use super::gzip::{GzipError, MAX_COMPONENT_BYTES, inflate, is_gzip};
use super::spec::{ComponentSource, ConfigMapComponent};
use crate::oci::{self, Pinned, Registry, RegistryOptions};
use crate::plugin::{CallFailure, LoadError, Runtime};

/// A component's bytes, uncompressed, and where they came from.
pub struct ComponentBytes {
    pub bytes: Vec<u8>,
    /// sha256 of `bytes`, lowercase hex.
    pub sha256: String,
    /// The file, or `ConfigMap NS/NAME key KEY`: names it in errors and logs.
    pub origin: String,
}

/// Why a catalog entry's component could not be had or loaded.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error(transparent)]
    ConfigMap(#[from] ConfigMapError),
    #[error(
        "ConfigMap {namespace}/{name} does not exist: create it (`podstamp plugin configmap FILE.wasm --name {name}` prints it)"
    )]
    MissingConfigMap { namespace: String, name: String },
    #[error(
        "{origin}: missing (binaryData has: {keys}); give configMap.key, or put the component there"
    )]
    MissingKey { origin: String, keys: String },
    #[error(
        "{origin}: is under data, but a component is binary: put it under binaryData (`podstamp plugin configmap` does)"
    )]
    KeyInData { origin: String },
    #[error("{origin}: not base64 ({detail}); binaryData values are base64")]
    NotBase64 { origin: String, detail: String },
    #[error("{origin}: {source}")]
    Gzip {
        origin: String,
        #[source]
        source: GzipError,
    },
    #[error("{origin}: sha256 is {actual}, but the catalog pins {expected}")]
    Digest {
        origin: String,
        expected: String,
        actual: String,
    },
    /// Starting without the API server: the pinned component is not in the
    /// compiled-code cache, so it cannot be had until the API answers.
    #[error(
        "ConfigMap {name}: the API server does not answer and the compiled-code cache has no component with sha256 {sha256}"
    )]
    NotCached { name: String, sha256: String },
    /// Pulled from a registry (or its disk cache) and checked.
    #[error("oci {reference}: {source}")]
    Oci {
        reference: String,
        /// Boxed: the registry's errors are large, and this error is on
        /// every catalog load's path.
        #[source]
        source: Box<crate::oci::OciError>,
    },
    /// Read, compiled or checked against the WIT: the message names the origin.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The plugin's `validate-settings` refused the entry's settings (its
    /// field, when it names one, is a path inside them), or failed.
    #[error("{}", settings_refused(plugin, failure))]
    Settings {
        /// Who the plugin says it is (`name version`).
        plugin: String,
        /// Boxed: kept small, as every catalog error is.
        #[source]
        failure: Box<CallFailure>,
    },
}

/// Asks `step`'s plugin whether its settings are good (WIT 0.1.1's
/// `validate-settings`; a 0.1.0 plugin cannot say and accepts them here).
pub fn check_settings(step: &crate::chain::Step) -> Result<(), ComponentError> {
    step.plugin
        .validate_settings(&step.settings_json)
        .map_err(|failure| ComponentError::Settings {
            plugin: step.plugin.info().to_string(),
            failure: Box::new(failure),
        })
}

impl ComponentError {
    /// The plugin refused its settings (not: it failed to say).
    pub fn is_settings_refusal(&self) -> bool {
        matches!(self, ComponentError::Settings { failure, .. } if matches!(**failure, CallFailure::Rejected { .. }))
    }
}

/// A catalog entry's component that could not be had or loaded.
#[derive(Debug, thiserror::Error)]
#[error("{entry}: {source}")]
pub struct PluginError {
    /// `plugins.NAME`.
    pub entry: String,
    #[source]
    pub source: ComponentError,
}

/// The uncompressed component of `source`, checked against `pin`.
pub fn component_bytes(
    source: &ComponentSource<'_>,
    pin: Option<&str>,
    config_maps: &dyn ConfigMaps,
    runtime: &Runtime,
) -> Result<ComponentBytes, ComponentError> {
    let (bytes, origin) = match source {
        ComponentSource::Path(path) => (read_file(path)?, path.display().to_string()),
        ComponentSource::ConfigMap(source) => from_config_map(source, config_maps)?,
        ComponentSource::Oci(pinned) => (from_registry(pinned, runtime)?, format!("oci {pinned}")),
    };
    let sha256 = hex::encode(Sha256::digest(&bytes));
    if let Some(expected) = pin
        && expected != sha256
    {
        return Err(ComponentError::Digest {
            origin,
            expected: expected.to_string(),
            actual: sha256,
        });
    }
    Ok(ComponentBytes {
        bytes,
        sha256,
        origin,
    })
}

/// The component of a pinned artifact: from the disk cache, else pulled
/// (checked against its digests) and kept there.
fn from_registry(pinned: &Pinned, runtime: &Runtime) -> Result<Vec<u8>, ComponentError> {
    let anonymous;
    let registry = match runtime.registry() {
        Some(registry) => registry,
        None => {
            anonymous = Registry::new(RegistryOptions::default());
            &anonymous
        }
    };
    if let Some(bytes) = oci::cache::cached(runtime, pinned) {
        registry.pulls().add("cached");
        return Ok(bytes);
    }
    let pulled = registry.pull(pinned).map_err(|source| {
        registry.pulls().add(source.kind());
        ComponentError::Oci {
            reference: pinned.to_string(),
            source: Box::new(source),
        }
    })?;
    registry.pulls().add("pulled");
    tracing::info!(reference = %pinned, bytes = pulled.bytes.len(), "pulled a plugin component");
    oci::cache::keep(runtime, pinned, &pulled);
    Ok(pulled.bytes)
}

fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        origin: path.display().to_string(),
        source,
    })
}

/// The bytes under `binaryData[key]` of the ConfigMap, inflated if gzip.
fn from_config_map(
    source: &ConfigMapComponent,
    config_maps: &dyn ConfigMaps,
) -> Result<(Vec<u8>, String), ComponentError> {
    let namespace = config_maps.namespace().to_string();
    let key = source.key();
    let origin = format!("ConfigMap {namespace}/{} key {key}", source.name);
    let object =
        config_maps
            .get(&source.name)?
            .ok_or_else(|| ComponentError::MissingConfigMap {
                namespace,
                name: source.name.clone(),
            })?;
    let binary = object.get("binaryData").and_then(Value::as_object);
    let Some(encoded) = binary.and_then(|b| b.get(key)) else {
        if object.pointer("/data").and_then(|d| d.get(key)).is_some() {
            return Err(ComponentError::KeyInData { origin });
        }
        let keys: Vec<&str> = binary
            .map(|b| b.keys().map(String::as_str).collect())
            .unwrap_or_default();
        return Err(ComponentError::MissingKey {
            origin,
            keys: if keys.is_empty() {
                "nothing".into()
            } else {
                keys.join(", ")
            },
        });
    };
    // k8s-openapi decodes binaryData's base64 exactly as the API server does.
    let raw = serde_json::from_value::<k8s_openapi::ByteString>(encoded.clone())
        .map_err(|e| ComponentError::NotBase64 {
            origin: origin.clone(),
            detail: e.to_string(),
        })?
        .0;
    let bytes = if is_gzip(&raw) {
        inflate(&raw, MAX_COMPONENT_BYTES).map_err(|source| ComponentError::Gzip {
            origin: origin.clone(),
            source,
        })?
    } else {
        raw
    };
    Ok((bytes, origin))
}

/// `settings.FIELD: MESSAGE (refused by …)`, or how the check failed.
fn settings_refused(plugin: &str, failure: &CallFailure) -> String {
    match failure {
        CallFailure::Rejected { message, field } => {
            let at = field
                .as_deref()
                .map(|f| format!("settings.{f}"))
                .unwrap_or_else(|| "settings".to_string());
            format!(
                "{at}: {message} (refused by the plugin {plugin}'s validate-settings; fix the settings)"
            )
        }
        other => format!("settings: the plugin {plugin}'s validate-settings failed: {other}"),
    }
}
