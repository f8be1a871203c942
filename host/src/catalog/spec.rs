//! The catalog as written: plugin entries and the default chain, in the
//! configuration file or in a ConfigMap (key `catalog.yaml`), one schema.
//!
//! ```yaml
//! plugins:
//!   node-env:
//!     path: /usr/lib/podstamp/plugins/node-env.wasm   # a file on the node, or
//!     configMap: {name: podstamp-plugin-node-env, key: node-env.wasm}   # or
//!     oci: registry.example/plugins/node-env@sha256:…   # a Wasm OCI artifact, by digest
//!     sha256: 3f1c…        # of the uncompressed component; required for configMap
//!     settings: {…}        # or settingsFile: (file catalog only)
//!     mandatory: false
//!     scope: [spec.containers[*].env]   # what it may change; see crate::scope
//! chain: [node-env]
//! ```
//!
//! Invariants: an entry names exactly one component source; a ConfigMap
//! source is always pinned by digest (what the API holds can change under
//! the daemon; the pin says which component the catalog means); a ConfigMap
//! an `oci:` source is always pinned by its manifest digest (a tag alone is
//! refused: it can be moved under the node); a ConfigMap
//! catalog refers to nothing relative to a file (no `settingsFile`, absolute
//! paths only), since it has no file to be relative to.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::CatalogError;
use super::config_maps::ConfigMaps;
use crate::template::parse_document;
use crate::validate::join_key;

/// The key of a catalog ConfigMap that holds the catalog.
pub const CATALOG_KEY: &str = "catalog.yaml";
/// The key a component is read from when `configMap.key` is not given.
pub const DEFAULT_COMPONENT_KEY: &str = "plugin.wasm";

/// The catalog: plugins by name, and the chain run by default.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CatalogSpec {
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginEntry>,
    #[serde(default)]
    pub chain: Vec<String>,
}

/// One catalog plugin: where its component is, its pin and its settings.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginEntry {
    /// A component file on the node.
    pub path: Option<PathBuf>,
    /// A component in a ConfigMap of the daemon's namespace.
    pub config_map: Option<ConfigMapComponent>,
    /// A Wasm OCI artifact, `REGISTRY/REPO@sha256:DIGEST`.
    pub oci: Option<String>,
    /// The sha256 of the uncompressed component, hex.
    pub sha256: Option<String>,
    pub settings: Option<Value>,
    pub settings_file: Option<PathBuf>,
    /// Runs for every template, whatever its `podstamp.io/plugins` says.
    #[serde(default)]
    pub mandatory: bool,
    /// The fields the plugin may change ([`crate::scope`]); None: the
    /// default scope.
    pub scope: Option<Vec<String>>,
}

/// `configMap: {name, key}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMapComponent {
    pub name: String,
    pub key: Option<String>,
}

impl ConfigMapComponent {
    /// The `binaryData` key holding the component.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_COMPONENT_KEY)
    }
}

/// Where an entry's component comes from, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource<'a> {
    Path(&'a std::path::Path),
    ConfigMap(&'a ConfigMapComponent),
    Oci(crate::oci::Pinned),
}

/// `daemon.catalog`: where the daemon reads its catalog from, instead of
/// the file's `plugins` and `chain`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CatalogRef {
    /// A ConfigMap of the daemon's namespace, key `catalog.yaml`.
    pub config_map: String,
}

impl PluginEntry {
    /// The component source and the pin, checked: exactly one source, a
    /// ConfigMap source pinned, the pin 64 hex digits. `field` is the
    /// entry's (`plugins.NAME`).
    pub fn source(
        &self,
        field: &str,
    ) -> Result<(ComponentSource<'_>, Option<String>), CatalogError> {
        let pin = match &self.sha256 {
            Some(pin) => Some(check_sha256(pin).map_err(|e| {
                CatalogError::Invalid(format!("{}: {e}", join_key(field, "sha256")))
            })?),
            None => None,
        };
        let given = [
            self.path.is_some(),
            self.config_map.is_some(),
            self.oci.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(CatalogError::Invalid(format!(
                "{field}: give one of path, configMap and oci, not several (one entry, one component)"
            )));
        }
        let source = match (&self.path, &self.config_map, &self.oci) {
            (None, None, None) => {
                return Err(CatalogError::Invalid(format!(
                    "{field}: no component: give path (a file on the node), configMap: {{name, key}} or oci: REGISTRY/REPO@sha256:DIGEST"
                )));
            }
            (Some(path), _, _) => ComponentSource::Path(path),
            (_, _, Some(text)) => {
                let pinned = crate::oci::Pinned::parse(text).map_err(|e| {
                    CatalogError::Invalid(format!("{}: {e}", join_key(field, "oci")))
                })?;
                ComponentSource::Oci(pinned)
            }
            (None, Some(config_map), None) => {
                let at = join_key(field, "configMap");
                crate::validate::check_dns_subdomain(&config_map.name).map_err(|e| {
                    CatalogError::Invalid(format!("{}: {e}", join_key(&at, "name")))
                })?;
                check_config_map_key(config_map.key())
                    .map_err(|e| CatalogError::Invalid(format!("{}: {e}", join_key(&at, "key"))))?;
                if pin.is_none() {
                    return Err(CatalogError::Invalid(format!(
                        "{field}: configMap {:?} has no sha256: a component from a ConfigMap must be pinned; add sha256: (printed by `podstamp plugin configmap`, or `sha256sum` of the .wasm)",
                        config_map.name
                    )));
                }
                ComponentSource::ConfigMap(config_map)
            }
        };
        Ok((source, pin))
    }
}

/// A pin, lowercased: 64 hex digits.
fn check_sha256(pin: &str) -> Result<String, String> {
    if pin.len() == 64 && pin.bytes().all(|c| c.is_ascii_hexdigit()) {
        Ok(pin.to_ascii_lowercase())
    } else {
        Err(format!(
            "{pin:?} is not a sha256: expected 64 hex digits (`sha256sum plugin.wasm`)"
        ))
    }
}

/// A ConfigMap key, as the API server checks it.
pub fn check_config_map_key(key: &str) -> Result<(), String> {
    let ok = !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a ConfigMap key (letters, digits, '-', '_', '.'; at most 253)"
        ))
    }
}

impl CatalogSpec {
    /// The catalog held by the ConfigMap `name` (key `catalog.yaml`), and the
    /// origin naming it in errors.
    pub fn from_config_map(
        config_maps: &dyn ConfigMaps,
        name: &str,
    ) -> Result<(CatalogSpec, String), CatalogError> {
        let namespace = config_maps.namespace();
        let origin = format!("ConfigMap {namespace}/{name} key {CATALOG_KEY}");
        let object = config_maps
            .get(name)
            .map_err(|source| CatalogError::ConfigMap {
                field: "daemon.catalog.configMap",
                source: Box::new(source),
            })?
            .ok_or_else(|| {
                CatalogError::Invalid(format!(
                    "daemon.catalog.configMap: ConfigMap {namespace}/{name} does not exist: create it (its key {CATALOG_KEY} holds plugins and chain)"
                ))
            })?;
        let text = match object.pointer(&format!("/data/{CATALOG_KEY}")) {
            Some(Value::String(text)) => text,
            _ if object
                .pointer(&format!("/binaryData/{CATALOG_KEY}"))
                .is_some() =>
            {
                return Err(CatalogError::Invalid(format!(
                    "{origin}: is under binaryData; the catalog is text: put it under data"
                )));
            }
            _ => {
                return Err(CatalogError::Invalid(format!(
                    "{origin}: missing: the catalog ConfigMap holds plugins and chain under data.{CATALOG_KEY}"
                )));
            }
        };
        let value = parse_document(text.as_bytes(), &origin)?;
        let spec: CatalogSpec = serde_path_to_error::deserialize(value)
            .map_err(|e| CatalogError::Invalid(format!("{origin}: {}: {}", e.path(), e.inner())))?;
        for (plugin, entry) in &spec.plugins {
            let field = join_key("plugins", plugin);
            if entry.settings_file.is_some() {
                return Err(CatalogError::Invalid(format!(
                    "{origin}: {}: a catalog in a ConfigMap has no file to read settings from: give settings inline",
                    join_key(&field, "settingsFile")
                )));
            }
            if let Some(path) = &entry.path
                && !path.is_absolute()
            {
                return Err(CatalogError::Invalid(format!(
                    "{origin}: {}: {:?} is relative, but a catalog in a ConfigMap has no directory: give an absolute path on the node",
                    join_key(&field, "path"),
                    path.display()
                )));
            }
        }
        Ok((spec, origin))
    }
}
