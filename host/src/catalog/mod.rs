//! The plugin catalog: plugins loaded by name, the default chain, and the
//! chain (with its settings) each template gets.
//!
//! The rules a chain keeps, whoever wrote it (the catalog's `chain` or a
//! template's annotation):
//! * it names catalog plugins only, each at most once, so no chain is longer
//!   than the catalog: one annotation cannot make a render run a plugin
//!   thousands of times;
//! * a plugin marked `mandatory: true` is in every chain: the default chain
//!   ends with the mandatory plugins, and a template's own chain is followed
//!   by them (in the default chain's order) whether it names them or not.
//!   They run last so that no plugin a template picks can undo what they do;
//! * each entry's `scope:` is the most its plugin may change (the default
//!   scope when it gives none); a template's settings never change it;
//! * a render has a total time budget (`limits.renderTimeout`, default
//!   [`RENDER_BUDGET_CALLS`] times the per-call timeout), enforced by the chain.
//!
//! A catalog is loaded whole or not at all; a component already loaded by
//! an earlier catalog of the same runtime (same sha256) is taken from it
//! rather than compiled again, so a settings-only change costs no compile.
//!
//! One concern per file: `spec` (the catalog as written), `config_maps`
//! (where ConfigMaps come from), `component` (a component's bytes and pin),
//! `gzip`, `annotation` (chain errors), `settings` (the settings annotation).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::chain::{Chain, Step};
use crate::plugin::{Plugin, Runtime};
use crate::scope::Scope;
use crate::validate::join_key;

mod annotation;
mod component;
mod config_maps;
pub mod gzip;
mod settings;
mod spec;

pub use annotation::{AnnotationError, ChainError, PLUGINS_ANNOTATION};
pub use component::{ComponentError, PluginError, check_settings};
pub use config_maps::{ConfigMapError, ConfigMapSet, ConfigMaps, NoConfigMaps};
pub use settings::{
    SETTINGS_ANNOTATION, SettingsError, SettingsFileError, merge_patch, read_settings,
};
pub use spec::{
    CATALOG_KEY, CatalogRef, CatalogSpec, ComponentSource, ConfigMapComponent,
    DEFAULT_COMPONENT_KEY, PluginEntry, check_config_map_key,
};

/// The default render budget, in per-call timeouts: room for a chain of ten
/// plugins that each run close to their own deadline, so that no sane chain
/// meets it (real plugins take well under a millisecond on a 50 KiB pod, see
/// docs/performance.md), while one template can hold the render thread for
/// at most this long (1 s with the default 100 ms timeout). It follows the
/// timeout, so raising the timeout alone never cuts a single call short.
pub const RENDER_BUDGET_CALLS: u32 = 10;

/// [`RENDER_BUDGET_CALLS`] times the per-call `timeout`.
pub fn default_render_budget(timeout: Duration) -> Duration {
    timeout.saturating_mul(RENDER_BUDGET_CALLS)
}

/// Why a catalog could not be loaded: how it is written (the message names
/// where and the field), or a plugin in it.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A value that is not valid (the message says which and why).
    #[error("{0}")]
    Invalid(String),
    /// The catalog's text does not parse (the error names it and the place).
    #[error(transparent)]
    Parse(#[from] crate::template::ParseError),
    /// A ConfigMap the field names cannot be read.
    #[error("{field}: {source}")]
    ConfigMap {
        field: &'static str,
        #[source]
        source: Box<ConfigMapError>,
    },
    /// The settings file an entry names cannot be read or parsed.
    #[error("{field}.settingsFile: {source}")]
    SettingsFile {
        field: String,
        #[source]
        source: Box<SettingsFileError>,
    },
    /// A plugin's component could not be had or loaded; names its entry.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// Gives the plugin of a component source and its pin, for
/// `Catalog::load_with`.
type PluginFor<'a> =
    dyn FnMut(&ComponentSource<'_>, Option<&str>) -> Result<Plugin, ComponentError> + 'a;

/// Loaded plugins by catalog name, and the chain used by default.
pub struct Catalog {
    steps: BTreeMap<String, Arc<Step>>,
    /// Each plugin's catalog settings, which a template's annotation patches.
    settings: BTreeMap<String, Value>,
    default_chain: Chain,
    /// The mandatory plugins, in the default chain's order: the tail of
    /// every chain.
    mandatory: Vec<Arc<Step>>,
    /// The time budget of one render, given to every chain.
    budget: Duration,
    /// See [`Catalog::digest`].
    digest: String,
}

impl Catalog {
    /// Loads a catalog; `origin` (empty for the configuration file) prefixes
    /// its configuration errors. Components whose sha256 an entry's bytes
    /// have in `reuse` (a catalog of the same runtime) are taken from there,
    /// not compiled: their bytes are still read and checked against the pin,
    /// so a changed or deleted source is noticed all the same.
    pub fn load_spec(
        spec: &CatalogSpec,
        origin: &str,
        runtime: &Runtime,
        config_maps: &dyn ConfigMaps,
        reuse: Option<&Catalog>,
        budget: Duration,
    ) -> Result<Catalog, CatalogError> {
        let mut loaded: BTreeMap<String, Plugin> = BTreeMap::new();
        Catalog::load_with(spec, origin, budget, &mut |source, pin| {
            let component = component::component_bytes(source, pin, config_maps, runtime)?;
            let known = loaded
                .get(&component.sha256)
                .or_else(|| reuse.and_then(|r| r.plugin_with(&component.sha256)));
            let plugin = match known {
                Some(plugin) => plugin.clone(),
                None => runtime.load_bytes(&component.bytes, &component.origin)?,
            };
            loaded.insert(component.sha256, plugin.clone());
            Ok(plugin)
        })
    }

    /// Loads a catalog without its ConfigMaps, as a node starts when the API
    /// server does not answer: each ConfigMap component is taken from the
    /// compiled-code cache by its pin alone (refused, naming it, when the
    /// cache does not have it); file components are read as usual.
    pub fn load_spec_from_cache(
        spec: &CatalogSpec,
        origin: &str,
        runtime: &Runtime,
        budget: Duration,
    ) -> Result<Catalog, CatalogError> {
        // Only file and OCI components are read through it (a ConfigMap's
        // comes from the cache, above): no namespace is ever named.
        let no_config_maps = NoConfigMaps {
            namespace: String::new(),
        };
        Catalog::load_with(spec, origin, budget, &mut |source, pin| match source {
            ComponentSource::ConfigMap(config_map) => {
                // A ConfigMap source is always pinned (checked before).
                let sha256 = pin.unwrap_or_default();
                let origin = format!(
                    "ConfigMap {} key {} (from the code cache)",
                    config_map.name,
                    config_map.key()
                );
                runtime
                    .load_cached(sha256, &origin)?
                    .ok_or_else(|| ComponentError::NotCached {
                        name: config_map.name.clone(),
                        sha256: sha256.to_string(),
                    })
            }
            // A file is read as usual; an OCI component comes from its disk
            // cache (or the registry, if it answers).
            ComponentSource::Path(_) | ComponentSource::Oci(_) => {
                let component = component::component_bytes(source, pin, &no_config_maps, runtime)?;
                Ok(runtime.load_bytes(&component.bytes, &component.origin)?)
            }
        })
    }

    /// Loads a catalog whose plugins `plugin(source, pin)` provides.
    fn load_with(
        spec: &CatalogSpec,
        origin: &str,
        budget: Duration,
        plugin: &mut PluginFor<'_>,
    ) -> Result<Catalog, CatalogError> {
        let config_error = |message: String| {
            CatalogError::Invalid(if origin.is_empty() {
                message
            } else {
                format!("{origin}: {message}")
            })
        };
        // Every entry is checked before any is loaded: a typo costs no compile.
        let mut checked = Vec::new();
        for (name, entry) in &spec.plugins {
            let field = join_key("plugins", name);
            let settings = match (&entry.settings, &entry.settings_file) {
                (Some(_), Some(_)) => {
                    return Err(config_error(format!(
                        "{field}: give settings or settingsFile, not both"
                    )));
                }
                (Some(inline), None) => inline.clone(),
                (None, Some(file)) => {
                    read_settings(file).map_err(|source| CatalogError::SettingsFile {
                        field: field.clone(),
                        source: Box::new(source),
                    })?
                }
                (None, None) => Value::Object(Default::default()),
            };
            let (source, pin) = entry
                .source(&field)
                .map_err(|e| config_error(e.to_string()))?;
            let scope = match &entry.scope {
                None => Scope::default(),
                Some(grants) => Scope::parse(grants)
                    .map_err(|e| config_error(format!("{}: {e}", join_key(&field, "scope"))))?,
            };
            checked.push((name, field, settings, source, pin, scope));
        }
        let mut steps = BTreeMap::new();
        let mut settings_by_name = BTreeMap::new();
        for (name, field, settings, source, pin, scope) in checked {
            let plugin = plugin(&source, pin.as_deref()).map_err(|source| PluginError {
                entry: field.clone(),
                source,
            })?;
            let step = Step::new(name.clone(), plugin, &settings).with_scope(scope);
            // Bad settings are refused here, before any render, when the
            // plugin can say so (WIT 0.1.1's `validate-settings`).
            component::check_settings(&step).map_err(|source| PluginError {
                entry: field.clone(),
                source,
            })?;
            steps.insert(name.clone(), Arc::new(step));
            settings_by_name.insert(name.clone(), settings);
        }
        let mut catalog = Catalog {
            steps,
            settings: settings_by_name,
            default_chain: Chain::default(),
            mandatory: Vec::new(),
            budget,
            digest: String::new(),
        };
        let default_chain = catalog
            .checked(spec.chain.iter().map(String::as_str))
            .map_err(|e| config_error(format!("chain: {e}")))?;
        // Mandatory plugins end the default chain, so that a template without
        // the annotation runs them where every other template does: last.
        let is_mandatory = |name: &str| spec.plugins.get(name).is_some_and(|p| p.mandatory);
        for (name, entry) in &spec.plugins {
            if entry.mandatory && !spec.chain.contains(name) {
                return Err(config_error(format!(
                    "{}: is mandatory, so it must be in chain (it runs after every template's own plugins); add it at the end of chain",
                    join_key("plugins", name)
                )));
            }
        }
        if let Some(window) = spec
            .chain
            .windows(2)
            .find(|w| is_mandatory(&w[0]) && !is_mandatory(&w[1]))
        {
            return Err(config_error(format!(
                "chain: {:?} is mandatory and {:?} is not, but mandatory plugins run last, after a template's own plugins: put {:?} before {:?}",
                window[0], window[1], window[1], window[0]
            )));
        }
        catalog.mandatory = default_chain
            .iter()
            .filter(|s| is_mandatory(&s.name))
            .cloned()
            .collect();
        catalog.default_chain = Chain::new(default_chain).with_budget(budget);
        catalog.digest = catalog.compute_digest();
        Ok(catalog)
    }

    /// A catalog of exactly these steps, run in this order by default, none
    /// mandatory, with the default render budget for the default timeout.
    pub fn from_steps(steps: Vec<Step>) -> Catalog {
        let steps: Vec<Arc<Step>> = steps.into_iter().map(Arc::new).collect();
        let budget = default_render_budget(crate::plugin::Limits::default().timeout);
        let mut catalog = Catalog {
            default_chain: Chain::new(steps.clone()).with_budget(budget),
            settings: steps
                .iter()
                .map(|s| {
                    let value = serde_json::from_str(&s.settings_json).unwrap_or(Value::Null);
                    (s.name.clone(), value)
                })
                .collect(),
            steps: steps.into_iter().map(|s| (s.name.clone(), s)).collect(),
            mandatory: Vec::new(),
            budget,
            digest: String::new(),
        };
        catalog.digest = catalog.compute_digest();
        catalog
    }

    /// This catalog, with every render given `budget`.
    pub fn with_render_budget(mut self, budget: Duration) -> Catalog {
        self.budget = budget;
        self.default_chain = self.default_chain.with_budget(budget);
        self
    }

    /// The identity of this catalog (metric label, logs): sha256, hex, over
    /// the canonical JSON of each plugin's component sha256, settings (files
    /// read) and `mandatory`, and of the default chain. Where a component
    /// was read from is left out: the same bytes render the same.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    fn compute_digest(&self) -> String {
        let plugins: serde_json::Map<String, Value> = self
            .steps
            .iter()
            .map(|(name, step)| {
                let mut entry = serde_json::json!({
                    "sha256": step.plugin.sha256(),
                    "settings": self.settings.get(name).cloned().unwrap_or(Value::Null),
                    "mandatory": self.mandatory.iter().any(|m| m.name == *name),
                });
                // Only a granted scope is written: a catalog without scopes
                // keeps the digest it had before scopes existed.
                if step.scope != Scope::default() {
                    entry["scope"] = Value::String(step.scope.to_string());
                }
                (name.clone(), entry)
            })
            .collect();
        let chain: Vec<&str> = self
            .default_chain
            .steps()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let mut canonical = String::new();
        write_canonical(
            &serde_json::json!({"plugins": plugins, "chain": chain}),
            &mut canonical,
        );
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }

    /// A loaded plugin of this catalog whose component has this sha256.
    fn plugin_with(&self, sha256: &str) -> Option<&Plugin> {
        self.steps
            .values()
            .map(|s| &s.plugin)
            .find(|p| p.sha256() == sha256)
    }

    fn known(&self) -> String {
        if self.steps.is_empty() {
            "none".to_string()
        } else {
            let known: Vec<&str> = self.steps.keys().map(String::as_str).collect();
            known.join(", ")
        }
    }

    /// The steps `names` name: catalog plugins only, each at most once.
    fn checked<'a>(
        &self,
        names: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<Vec<Arc<Step>>, ChainError> {
        let count = names.len();
        let mut chain: Vec<Arc<Step>> = Vec::new();
        // Past the catalog's size a name is unknown or a repeat, so this
        // stops by then, however many names there are.
        for name in names {
            let Some(step) = self.steps.get(name) else {
                return Err(ChainError::Unknown {
                    name: name.to_string(),
                    known: self.known(),
                });
            };
            if chain.iter().any(|s| s.name == name) {
                // Thousands of names say more about the list than its
                // first repeat does.
                return Err(if count > self.steps.len() {
                    ChainError::TooLong {
                        count,
                        catalog: self.steps.len(),
                        known: self.known(),
                    }
                } else {
                    ChainError::Repeated {
                        name: name.to_string(),
                    }
                });
            }
            chain.push(step.clone());
        }
        Ok(chain)
    }

    /// The chain for a template: the one its `podstamp.io/plugins`
    /// annotation names, from this catalog only, each plugin at most once,
    /// followed by the mandatory plugins; else the default chain. Its
    /// `podstamp.io/settings` annotation is merged over the catalog's
    /// settings of the plugins it names (new steps, the same loaded plugins).
    pub fn chain_for(
        &self,
        template_annotations: &std::collections::BTreeMap<String, String>,
    ) -> Result<Chain, AnnotationError> {
        let chain = match template_annotations.get(PLUGINS_ANNOTATION) {
            None => self.default_chain.clone(),
            Some(list) => {
                let names: Vec<&str> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                let mut chain = self
                    .checked(names.into_iter())
                    .map_err(AnnotationError::Plugins)?;
                // Named or not, the mandatory plugins run last, once, in their order.
                chain.retain(|s| !self.mandatory.iter().any(|m| m.name == s.name));
                chain.extend(self.mandatory.iter().cloned());
                Chain::new(chain).with_budget(self.budget)
            }
        };
        match template_annotations.get(SETTINGS_ANNOTATION) {
            None => Ok(chain),
            Some(text) => self
                .with_template_settings(chain, text)
                .map_err(AnnotationError::Settings),
        }
    }

    /// `chain` with the settings annotation `text` merged over its steps'.
    fn with_template_settings(&self, chain: Chain, text: &str) -> Result<Chain, SettingsError> {
        let patches = settings::parse_annotation(text)?;
        if patches.is_empty() {
            return Ok(chain);
        }
        for plugin in patches.keys() {
            if !self.steps.contains_key(plugin) {
                return Err(SettingsError::UnknownPlugin {
                    plugin: plugin.clone(),
                    known: self.known(),
                });
            }
            if self.mandatory.iter().any(|m| m.name == *plugin) {
                return Err(SettingsError::Mandatory {
                    plugin: plugin.clone(),
                });
            }
            if !chain.steps().iter().any(|s| s.name == *plugin) {
                let names: Vec<&str> = chain.steps().iter().map(|s| s.name.as_str()).collect();
                return Err(SettingsError::NotInChain {
                    plugin: plugin.clone(),
                    chain: if names.is_empty() {
                        "no plugins".into()
                    } else {
                        names.join(", ")
                    },
                });
            }
        }
        let steps = chain
            .steps()
            .iter()
            .map(|step| match patches.get(&step.name) {
                None => step.clone(),
                Some(patch) => {
                    let mut settings = self.settings.get(&step.name).cloned().unwrap_or_default();
                    merge_patch(&mut settings, patch);
                    // The settings are the template's to patch; the scope is not.
                    let patched = Step::new(step.name.clone(), step.plugin.clone(), &settings)
                        .with_scope(step.scope.clone());
                    Arc::new(patched)
                }
            })
            .collect();
        Ok(Chain::new(steps).with_budget(self.budget))
    }

    pub fn default_chain(&self) -> &Chain {
        &self.default_chain
    }
}

/// JSON with every object's keys sorted, whatever order the map keeps, so
/// that the digest depends on the content only.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
