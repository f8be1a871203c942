//! The configuration file as a source of catalogs, for the loader.
//!
//! Invariants:
//! * Only the catalog (`plugins`, `chain`) changes at run time. Node-local
//!   settings (namespace, `daemon:`, `cacheDir`, `limits`) keep the values
//!   the daemon started with; a changed one is logged once per new value as
//!   needing a restart, never silently ignored and never half-applied: the
//!   catalog is loaded with the limits in force, not the file's new ones.
//! * The file is read whole at each load; a file that cannot be read or
//!   parsed refuses that load like any other catalog error.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::catalog::Catalog;
use crate::catalog::NoConfigMaps;
use crate::config::ConfigFile;
use crate::plugin::Runtime;

use super::reload::{CatalogSource, ReloadError};

/// The configuration file the daemon started with, reread at each load.
pub struct FileCatalog {
    path: PathBuf,
    /// The file as the daemon started with it.
    started: ConfigFile,
    /// The namespace in use (resolved from flags, environment, file), where
    /// a ConfigMap named by the file would be.
    namespace: String,
    /// What each node-local setting is in use, as shown in the log.
    in_use: BTreeMap<&'static str, String>,
    /// The file's value of each node-local setting last reported as
    /// needing a restart.
    reported: BTreeMap<&'static str, String>,
}

impl FileCatalog {
    /// `started` is the file as read at start; `namespace` and `in_use`
    /// what the namespace and each node-local setting resolved to (flags,
    /// environment, file, default: [`crate::settings`]).
    pub fn new(
        path: PathBuf,
        started: ConfigFile,
        namespace: String,
        in_use: BTreeMap<&'static str, String>,
    ) -> FileCatalog {
        FileCatalog {
            path,
            started,
            namespace,
            in_use,
            reported: BTreeMap::new(),
        }
    }

    /// The file as the daemon started with it.
    pub fn started(&self) -> &ConfigFile {
        &self.started
    }

    /// Logs each node-local setting of `config` that differs from the start
    /// and was not reported with this value yet.
    fn report_restart_needed(&mut self, config: &ConfigFile) {
        let before: BTreeMap<_, _> = node_local(&self.started).into_iter().collect();
        for (field, value) in node_local(config) {
            if before.get(field) == Some(&value) {
                if self.reported.remove(field).is_some() {
                    tracing::info!(config = %self.path.display(), field,
                        "{}: {field} is back to the value the daemon started with", self.path.display());
                }
                continue;
            }
            if self.reported.get(field) == Some(&value) {
                continue;
            }
            let in_use = self
                .in_use
                .get(field)
                .or_else(|| before.get(field))
                .cloned()
                .unwrap_or_default();
            tracing::warn!(config = %self.path.display(), field,
                "{}: {field} changed to {value}: needs a restart to take effect; still using {in_use}",
                self.path.display());
            self.reported.insert(field, value);
        }
    }
}

impl FileCatalog {
    /// The file as it is now, its node-local changes reported, with the
    /// limits in force (the runtime's are fixed at start; the render
    /// budget follows them, whatever the file now says).
    pub fn read(&mut self) -> Result<ConfigFile, ReloadError> {
        let mut config = ConfigFile::read(&self.path)?;
        self.report_restart_needed(&config);
        config.limits = self.started.limits.clone();
        Ok(config)
    }
}

impl CatalogSource for FileCatalog {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    fn load(
        &mut self,
        runtime: &Runtime,
        current: Option<&Catalog>,
    ) -> Result<Catalog, ReloadError> {
        let config = self.read()?;
        // Components whose bytes did not change are not compiled again.
        let config_maps = NoConfigMaps {
            namespace: self.namespace.clone(),
        };
        Ok(config.load_catalog_with(runtime, &config_maps, current)?)
    }
}

/// Each node-local setting of the file, by its name in the file, as shown
/// in the log (`(not set)` when absent).
pub fn node_local(config: &ConfigFile) -> Vec<(&'static str, String)> {
    fn shown<T: std::fmt::Debug>(value: &Option<T>) -> String {
        match value {
            Some(v) => format!("{v:?}"),
            None => "(not set)".to_string(),
        }
    }
    let d = &config.daemon;
    let l = &config.limits;
    vec![
        ("namespace", shown(&config.namespace)),
        ("cacheDir", shown(&config.cache_dir)),
        ("daemon.source", shown(&d.source)),
        ("daemon.kubeconfig", shown(&d.kubeconfig)),
        ("daemon.selector", shown(&d.selector)),
        ("daemon.nodeName", shown(&d.node_name)),
        ("daemon.nodeFile", shown(&d.node_file)),
        ("daemon.manifestDir", shown(&d.manifest_dir)),
        ("daemon.listen", shown(&d.listen)),
        ("daemon.resync", shown(&d.resync)),
        ("daemon.revisionsDir", shown(&d.revisions_dir)),
        ("daemon.revisionHistory", shown(&d.revision_history)),
        ("daemon.criSocket", shown(&d.cri_socket)),
        (
            "daemon.rollouts.namespace",
            shown(&d.rollouts.as_ref().and_then(|r| r.namespace.clone())),
        ),
        (
            "daemon.rollouts.leaseDuration",
            shown(&d.rollouts.as_ref().and_then(|r| r.lease_duration.clone())),
        ),
        (
            "daemon.rollouts.allowControlPlaneNamespace",
            shown(
                &d.rollouts
                    .as_ref()
                    .and_then(|r| r.allow_control_plane_namespace),
            ),
        ),
        ("daemon.registry", shown(&d.registry)),
        ("limits.timeout", shown(&l.timeout)),
        ("limits.memory", shown(&l.memory)),
        ("limits.maxManifestSize", shown(&l.max_manifest_size)),
        ("limits.renderTimeout", shown(&l.render_timeout)),
    ]
}
