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
//! The catalog (`plugins`, `chain`; or `daemon.catalog: {configMap: NAME}`
//! instead of both) is described and loaded by [`crate::catalog`]; this
//! module reads the file, resolves its relative paths and its limits.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::template::parse_document;

use crate::catalog::{
    Catalog, CatalogError, CatalogRef, CatalogSpec, ConfigMaps, NoConfigMaps, PluginEntry,
    default_render_budget,
};
use crate::plugin::Runtime;

pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// Where the rollout Leases are unless `daemon.rollouts.namespace` says:
/// a namespace of their own (deploy/namespace.yaml), never the control
/// plane's (see [`crate::settings::CONTROL_PLANE_NAMESPACES`]).
pub const DEFAULT_ROLLOUT_NAMESPACE: &str = "podstamp-rollouts";
/// What the rollout namespace's name is followed by to name the
/// namespace of the nodes' status records, unless
/// `daemon.rollouts.statusNamespace` says (`podstamp-rollouts-status` by
/// default): apart from the slots and halt markers, which every node with
/// something to roll watches, because the API server hands every write of
/// a namespace to every watch of it (docs/daemon.md, "Fleets"). Derived, so
/// that a fleet that names its rollout namespace gets its own status one.
pub const STATUS_NAMESPACE_SUFFIX: &str = "-status";

/// The status records' namespace for rollout namespace `rollouts`, unless
/// one is named.
pub fn default_status_namespace(rollouts: &str) -> String {
    format!("{rollouts}{STATUS_NAMESPACE_SUFFIX}")
}

/// [`default_status_namespace`], refused when it is no namespace name (a
/// rollout namespace of 57 characters or more): the daemon's settings and
/// `podstamp status` say so alike.
pub fn derived_status_namespace(rollouts: &str) -> Result<String, NoStatusNamespace> {
    let namespace = default_status_namespace(rollouts);
    match crate::validate::check_dns_label(&namespace) {
        Ok(()) => Ok(namespace),
        Err(reason) => Err(NoStatusNamespace { namespace, reason }),
    }
}

/// The status records' namespace derived from the rollout one is no
/// namespace name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the status records' namespace {namespace:?}: {reason}; name one with --status-namespace (daemon.rollouts.statusNamespace)"
)]
pub struct NoStatusNamespace {
    pub namespace: String,
    pub reason: String,
}

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
    /// The Pod Security level (`LEVEL` or `LEVEL:VERSION`) of a template
    /// whose namespace has no `pod-security.kubernetes.io/enforce` label
    /// (crate::security_level).
    pub pod_security: Option<String>,
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
    /// The catalog from a ConfigMap instead of `plugins` and `chain`.
    pub catalog: Option<CatalogRef>,
    /// Where the last manifests of each template are kept.
    pub revisions_dir: Option<PathBuf>,
    /// How many manifests are kept per template.
    pub revision_history: Option<usize>,
    /// The container runtime's CRI socket: what the kubelet runs, read
    /// while the API server is down.
    pub cri_socket: Option<PathBuf>,
    /// Rollouts across nodes: where their Leases are, and how long a slot
    /// outlives a holder that stopped renewing it.
    pub rollouts: Option<RolloutsEntry>,
    /// How `oci:` catalog components are pulled.
    pub registry: Option<RegistryEntry>,
}

/// `daemon.registry`: credentials, CA and timeout of the registries that
/// `oci:` catalog entries name.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistryEntry {
    /// A docker config JSON file.
    pub config: Option<PathBuf>,
    /// A `kubernetes.io/dockerconfigjson` Secret of the daemon's namespace.
    pub secret: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's.
    pub ca: Option<PathBuf>,
    /// The most one pull may take, e.g. `30s`.
    pub timeout: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutsEntry {
    /// The namespace of the slot and node status Leases.
    pub namespace: Option<String>,
    /// The namespace of the nodes' status records: written by each node,
    /// watched by none, so kept apart from the slots.
    pub status_namespace: Option<String>,
    /// A slot's `leaseDurationSeconds`, e.g. `30s`.
    pub lease_duration: Option<String>,
    /// Lets `namespace` be one where the control plane keeps its own Leases
    /// (kube-system, kube-node-lease): refused without it.
    pub allow_control_plane_namespace: Option<bool>,
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

/// A configuration error; the message names the file and the field, and
/// the error it comes from stays its source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that is not valid (the message says which and why).
    #[error("{0}")]
    Invalid(String),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML or JSON (the error names the file and the place).
    #[error(transparent)]
    Parse(#[from] crate::template::ParseError),
    /// A field of the wrong shape, or unknown.
    #[error("{origin}: {field}: {source}")]
    Field {
        origin: String,
        field: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ConfigError {
    fn read(path: &Path, source: std::io::Error) -> ConfigError {
        ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl ConfigFile {
    /// Reads a configuration file (YAML or JSON).
    pub fn read(path: &Path) -> Result<ConfigFile, ConfigError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ConfigError::read(path, e))?;
        let value = parse_document(&bytes, &origin)?;
        let mut config: ConfigFile =
            serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
                origin: origin.clone(),
                field: e.path().to_string(),
                source: e.into_inner(),
            })?;
        // Paths in the file are relative to the file.
        let base = path.parent().unwrap_or(Path::new("."));
        if let Some(catalog) = &config.daemon.catalog
            && (!config.plugins.is_empty() || !config.chain.is_empty())
        {
            return Err(ConfigError::Invalid(format!(
                "{origin}: daemon.catalog: the catalog comes from ConfigMap {:?}, so plugins and chain must not be given here too: give one or the other",
                catalog.config_map
            )));
        }
        if let Some(catalog) = &config.daemon.catalog {
            crate::validate::check_dns_subdomain(&catalog.config_map).map_err(|e| {
                ConfigError::Invalid(format!("{origin}: daemon.catalog.configMap: {e}"))
            })?;
        }
        for entry in config.plugins.values_mut() {
            if let Some(path) = &mut entry.path {
                *path = base.join(&*path);
            }
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
        .chain(
            daemon
                .registry
                .as_mut()
                .map(|r| [&mut r.config, &mut r.ca])
                .into_iter()
                .flatten(),
        )
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

    /// The file's own catalog: its `plugins` and `chain`.
    pub fn catalog_spec(&self) -> CatalogSpec {
        CatalogSpec {
            plugins: self.plugins.clone(),
            chain: self.chain.clone(),
        }
    }

    /// Loads the file's catalog (its `plugins` and `chain`), with no
    /// ConfigMaps: an entry or catalog from a ConfigMap fails, saying it
    /// needs the API or `--configmap`.
    pub fn load_catalog(&self, runtime: &Runtime) -> Result<Catalog, CatalogError> {
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
        self.load_catalog_with(runtime, &NoConfigMaps { namespace }, None)
    }

    /// Loads the catalog the file names: its own `plugins` and `chain`, or
    /// the ConfigMap of `daemon.catalog`; components from ConfigMaps come
    /// from `config_maps`, and those `reuse` (a catalog of the same runtime)
    /// has are not compiled again.
    pub fn load_catalog_with(
        &self,
        runtime: &Runtime,
        config_maps: &dyn ConfigMaps,
        reuse: Option<&Catalog>,
    ) -> Result<Catalog, CatalogError> {
        let budget = self
            .render_budget(runtime.limits().timeout)
            .map_err(|e| CatalogError::Invalid(e.to_string()))?;
        let (spec, origin) = match &self.daemon.catalog {
            Some(source) => CatalogSpec::from_config_map(config_maps, &source.config_map)?,
            None => (self.catalog_spec(), String::new()),
        };
        Catalog::load_spec(&spec, &origin, runtime, config_maps, reuse, budget)
    }

    /// The time budget of one render (`limits.renderTimeout`), given the
    /// per-call `timeout` in force.
    pub fn render_budget(&self, timeout: Duration) -> Result<Duration, ConfigError> {
        match &self.limits.render_timeout {
            Some(t) => parse_duration(t)
                .map_err(|e| ConfigError::Invalid(format!("limits.renderTimeout: {e}"))),
            None => Ok(default_render_budget(timeout)),
        }
    }
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

/// Largest configuration file read (no real one is near it).
const MAX_CONFIG_FILE: u64 = 16 << 20;

/// The file's content as compared by the daemon's watch of it
/// ([`crate::daemon::watch_file`]): its sha256, or the error reading it.
pub type Content = Result<[u8; 32], String>;

/// The sha256 of the file's bytes (through symlinks), or why it cannot be read.
pub fn content(path: &Path) -> Content {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_FILE).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    Ok(Sha256::digest(&bytes).into())
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
