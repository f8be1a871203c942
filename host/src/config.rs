//! Configuration shared by `podstamp render` and `podstamp run`: the plugin
//! catalog, the default chain, sandbox limits and the manifests' namespace.
//!
//! ```yaml
//! namespace: kube-system        # namespace written into every manifest
//! plugins:                      # the catalog: name -> component + settings
//!   node-env:
//!     path: plugins/node-env.wasm          # relative to this file
//!     settings: {labels: {ZONE: topology.kubernetes.io/zone}}
//!   arch-image:
//!     path: plugins/arch-image.wasm
//!     settingsFile: arch-image.yaml        # YAML or JSON, instead of settings
//! chain: [arch-image, node-env]  # used unless a template names its own
//! limits: {timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi, renderTimeout: 1s}
//! cacheDir: /var/cache/podstamp  # compiled plugin code; omit for the default
//! ```
//!
//! A template picks its own chain from the catalog with the annotation
//! `podstamp.io/plugins: node-env,substitute` (empty: no plugins).
//!
//! The rules a chain keeps, whoever wrote it (the configuration's `chain` or a
//! template's annotation):
//! * it names catalog plugins only, each at most once, so no chain is longer
//!   than the catalog: one annotation cannot make a render run a plugin
//!   thousands of times;
//! * a plugin marked `mandatory: true` is in every chain: the default chain
//!   ends with the mandatory plugins, and a template's own chain is followed
//!   by them (in the default chain's order) whether it names them or not.
//!   They run last so that no plugin a template picks can undo what they do;
//! * a render has a total time budget (`limits.renderTimeout`, default
//!   [`RENDER_BUDGET_CALLS`] times the per-call timeout), enforced by the chain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::chain::{Chain, Step};
use crate::plugin::{Limits, Runtime};
use crate::template::parse_document;
use crate::validate::join_key;

/// The PodTemplate annotation with which a template picks its chain.
pub const PLUGINS_ANNOTATION: &str = "podstamp.io/plugins";
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// The configuration file, as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    pub namespace: Option<String>,
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginEntry>,
    #[serde(default)]
    pub chain: Vec<String>,
    #[serde(default)]
    pub limits: LimitsEntry,
    pub cache_dir: Option<PathBuf>,
    /// `podstamp run` only; its flags and environment override these.
    #[serde(default)]
    pub daemon: DaemonEntry,
}

/// The daemon's settings (docs/daemon.md has the reference).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonEntry {
    /// `api` or `dir:PATH`.
    pub source: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub selector: Option<String>,
    pub node_name: Option<String>,
    /// A Node object (YAML/JSON) describing the node, for the `dir:` source.
    pub node_file: Option<PathBuf>,
    pub manifest_dir: Option<PathBuf>,
    /// `/healthz`, `/readyz`, `/metrics`: `host:port`.
    pub listen: Option<String>,
    /// How often every template is rendered again, e.g. `5m`.
    pub resync: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginEntry {
    pub path: PathBuf,
    pub settings: Option<Value>,
    pub settings_file: Option<PathBuf>,
    /// Runs for every template, whatever its `podstamp.io/plugins` says.
    #[serde(default)]
    pub mandatory: bool,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsEntry {
    /// Per plugin call, e.g. `100ms`, `1s`.
    pub timeout: Option<String>,
    /// Per plugin instance, e.g. `64Mi`.
    pub memory: Option<String>,
    /// Largest pod a plugin may return and largest manifest written, e.g. `1Mi`.
    pub max_manifest_size: Option<String>,
    /// The whole chain of one render, e.g. `1s`; default
    /// [`RENDER_BUDGET_CALLS`] times `timeout`.
    pub render_timeout: Option<String>,
}

/// A configuration error; the message names the file and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigFile {
    /// Reads a configuration file (YAML or JSON).
    pub fn read(path: &Path) -> Result<ConfigFile, ConfigError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ConfigError(format!("{origin}: {e}")))?;
        let value = parse_document(&bytes, &origin).map_err(|e| ConfigError(e.to_string()))?;
        let mut config: ConfigFile = serde_path_to_error::deserialize(value)
            .map_err(|e| ConfigError(format!("{origin}: {}: {}", e.path(), e.inner())))?;
        // Paths in the file are relative to the file.
        let base = path.parent().unwrap_or(Path::new("."));
        for entry in config.plugins.values_mut() {
            entry.path = base.join(&entry.path);
            if let Some(file) = &mut entry.settings_file {
                *file = base.join(&*file);
            }
        }
        if let Some(dir) = &mut config.cache_dir {
            *dir = base.join(&*dir);
        }
        let daemon = &mut config.daemon;
        for path in [
            &mut daemon.kubeconfig,
            &mut daemon.node_file,
            &mut daemon.manifest_dir,
        ]
        .into_iter()
        .flatten()
        {
            *path = base.join(&*path);
        }
        if let Some(dir) = daemon
            .source
            .as_deref()
            .and_then(|s| s.strip_prefix("dir:"))
        {
            let dir = base.join(dir);
            daemon.source = Some(format!("dir:{}", dir.display()));
        }
        Ok(config)
    }

    pub fn sandbox_limits(&self) -> Result<Limits, ConfigError> {
        let mut limits = Limits::default();
        let field = |name: &str| ConfigError(format!("limits.{name}"));
        if let Some(t) = &self.limits.timeout {
            limits.timeout = parse_duration(t)
                .map_err(|e| ConfigError(format!("{}: {e}", field("timeout").0)))?;
        }
        if let Some(m) = &self.limits.memory {
            limits.memory_bytes =
                parse_size(m).map_err(|e| ConfigError(format!("{}: {e}", field("memory").0)))?;
        }
        if let Some(m) = &self.limits.max_manifest_size {
            limits.max_output_bytes = parse_size(m)
                .map_err(|e| ConfigError(format!("{}: {e}", field("maxManifestSize").0)))?;
        }
        Ok(limits)
    }

    /// The time budget of one render (`limits.renderTimeout`), given the
    /// per-call `timeout` in force.
    pub fn render_budget(&self, timeout: Duration) -> Result<Duration, ConfigError> {
        match &self.limits.render_timeout {
            Some(t) => {
                parse_duration(t).map_err(|e| ConfigError(format!("limits.renderTimeout: {e}")))
            }
            None => Ok(default_render_budget(timeout)),
        }
    }
}

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

/// Why a catalog could not be loaded: its configuration, or a plugin in it.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A plugin failed to load; the message names its catalog entry.
    #[error("{0}")]
    Plugin(String),
}

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

/// A template's `podstamp.io/plugins` annotation names a chain that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {0}", field = join_key("metadata.annotations", PLUGINS_ANNOTATION))]
pub struct AnnotationError(pub ChainError);

impl AnnotationError {
    /// The failure reason reported for the template (metrics, log, Event).
    pub fn reason(&self) -> &'static str {
        match self.0 {
            ChainError::Unknown { .. } => "UnknownPlugin",
            ChainError::Repeated { .. } | ChainError::TooLong { .. } => "InvalidChain",
        }
    }
}

/// Loaded plugins by catalog name, and the chain used by default.
pub struct Catalog {
    steps: BTreeMap<String, Arc<Step>>,
    default_chain: Chain,
    /// The mandatory plugins, in the default chain's order: the tail of
    /// every chain.
    mandatory: Vec<Arc<Step>>,
    /// The time budget of one render, given to every chain.
    budget: Duration,
}

impl Catalog {
    /// Loads every plugin of the catalog and resolves the default chain.
    pub fn load(config: &ConfigFile, runtime: &Runtime) -> Result<Catalog, CatalogError> {
        let budget = config.render_budget(runtime.limits().timeout)?;
        let mut steps = BTreeMap::new();
        for (name, entry) in &config.plugins {
            let field = join_key("plugins", name);
            let settings = match (&entry.settings, &entry.settings_file) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError(format!(
                        "{field}: give settings or settingsFile, not both"
                    ))
                    .into());
                }
                (Some(inline), None) => inline.clone(),
                (None, Some(file)) => read_settings(file)?,
                (None, None) => Value::Object(Default::default()),
            };
            let plugin = runtime
                .load(&entry.path)
                .map_err(|e| CatalogError::Plugin(format!("{field}: {e}")))?;
            steps.insert(
                name.clone(),
                Arc::new(Step::new(name.clone(), plugin, &settings)),
            );
        }
        let mut catalog = Catalog {
            steps,
            default_chain: Chain::default(),
            mandatory: Vec::new(),
            budget,
        };
        let default_chain = catalog
            .checked(config.chain.iter().map(String::as_str))
            .map_err(|e| ConfigError(format!("chain: {e}")))?;
        // Mandatory plugins end the default chain, so that a template without
        // the annotation runs them where every other template does: last.
        let is_mandatory = |name: &str| config.plugins.get(name).is_some_and(|p| p.mandatory);
        for (name, entry) in &config.plugins {
            if entry.mandatory && !config.chain.contains(name) {
                return Err(ConfigError(format!(
                    "{}: is mandatory, so it must be in chain (it runs after every template's own plugins); add it at the end of chain",
                    join_key("plugins", name)
                ))
                .into());
            }
        }
        if let Some(window) = config
            .chain
            .windows(2)
            .find(|w| is_mandatory(&w[0]) && !is_mandatory(&w[1]))
        {
            return Err(ConfigError(format!(
                "chain: {:?} is mandatory and {:?} is not, but mandatory plugins run last, after a template's own plugins: put {:?} before {:?}",
                window[0], window[1], window[1], window[0]
            ))
            .into());
        }
        catalog.mandatory = default_chain
            .iter()
            .filter(|s| is_mandatory(&s.name))
            .cloned()
            .collect();
        catalog.default_chain = Chain::new(default_chain).with_budget(budget);
        Ok(catalog)
    }

    /// A catalog of exactly these steps, run in this order by default, none
    /// mandatory, with the default render budget for the default timeout.
    pub fn from_steps(steps: Vec<Step>) -> Catalog {
        let steps: Vec<Arc<Step>> = steps.into_iter().map(Arc::new).collect();
        let budget = default_render_budget(crate::plugin::Limits::default().timeout);
        Catalog {
            default_chain: Chain::new(steps.clone()).with_budget(budget),
            steps: steps.into_iter().map(|s| (s.name.clone(), s)).collect(),
            mandatory: Vec::new(),
            budget,
        }
    }

    /// This catalog, with every render given `budget`.
    pub fn with_render_budget(mut self, budget: Duration) -> Catalog {
        self.budget = budget;
        self.default_chain = self.default_chain.with_budget(budget);
        self
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
    /// followed by the mandatory plugins; else the default chain.
    pub fn chain_for(
        &self,
        template_annotations: &BTreeMap<String, String>,
    ) -> Result<Chain, AnnotationError> {
        let Some(list) = template_annotations.get(PLUGINS_ANNOTATION) else {
            return Ok(self.default_chain.clone());
        };
        let names: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        let mut chain = self.checked(names.into_iter()).map_err(AnnotationError)?;
        // Named or not, the mandatory plugins run last, once, in their order.
        chain.retain(|s| !self.mandatory.iter().any(|m| m.name == s.name));
        chain.extend(self.mandatory.iter().cloned());
        Ok(Chain::new(chain).with_budget(self.budget))
    }

    pub fn default_chain(&self) -> &Chain {
        &self.default_chain
    }

    /// Every plugin of the catalog, by name (for the catalog's digest).
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.steps.values().map(|s| &**s)
    }
}

/// Reads a settings file (YAML or JSON) into a JSON value.
pub fn read_settings(path: &Path) -> Result<Value, ConfigError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ConfigError(format!("{origin}: {e}")))?;
    parse_document(&bytes, &origin).map_err(|e| ConfigError(e.to_string()))
}

/// `250ms`, `2s`, `1m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 100ms or 2s"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number * 60),
        _ => {
            return Err(format!(
                "{text:?} is not a duration such as 100ms or 2s (units: ms, s, m)"
            ));
        }
    };
    if duration.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(duration)
}

/// `65536`, `64Ki`, `64Mi`, `1Gi` (powers of 1024, as in Kubernetes quantities).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 64Mi"))?;
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => {
            return Err(format!(
                "{text:?} is not a size such as 64Mi (units: Ki, Mi, Gi)"
            ));
        }
    };
    let size = number
        .checked_shl(shift)
        .filter(|s| s >> shift == number && *s > 0)
        .ok_or_else(|| format!("{text:?} is out of range"))?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("0ms").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("fast").is_err());
        assert_eq!(parse_size("64Mi"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1Pi").is_err());
        assert!(parse_size("99999999999999999999Gi").is_err());
    }

    #[test]
    fn unknown_config_fields_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "plugins:\n  a:\n    path: a.wasm\n    setings: {}\n").unwrap();
        let e = ConfigFile::read(&path).unwrap_err().to_string();
        assert!(
            e.contains("c.yaml: plugins.a.setings: unknown field `setings`"),
            "{e}"
        );
    }
}
