//! The catalog with the API source: the configuration file, the catalog
//! ConfigMap it may name (`daemon.catalog.configMap`, key `catalog.yaml`)
//! and the ConfigMaps holding plugin components, read through the daemon's
//! [`ConfigMapWatches`].
//!
//! Invariants:
//! * Exactly the ConfigMaps named by the catalog in use and by the last
//!   candidate are watched: after each load, applied or refused, the
//!   watches are told to [`ConfigMapWatches::keep`] those; a change to any
//!   of them triggers a load (the watches' callback only sends a
//!   [`Trigger`] on a channel: it never blocks their async tasks).
//! * A refused catalog gets an Event (reason `CatalogRefused`) on the
//!   ConfigMap at fault: the plugin ConfigMap whose component failed when
//!   it exists and can be read, else the catalog ConfigMap; and on this
//!   daemon's Node when no ConfigMap is at fault (a catalog of the
//!   configuration file: an `oci:` component the registry refuses, settings
//!   a plugin refuses, a file that does not parse). Once per distinct
//!   refusal; none while the API server does not answer. The log line and
//!   the metric are the loader's.
//! * An applied catalog read from the catalog ConfigMap is remembered in the
//!   code cache (record [`RECORD_KEY`], a versioned [`Record`]): the
//!   catalog's text as read, with its pins.
//! * At the first load only, when the API server does not answer (or
//!   refuses) within [`START_WAIT`], the catalog comes from disk: the
//!   remembered one (or the file's own), each ConfigMap component taken
//!   from the code cache by its pin. When that is impossible too, the load
//!   is refused: nothing renders (manifests on disk are kept) until the API
//!   answers, which triggers a load. An unreadable ConfigMap only ever
//!   refuses a catalog; it never removes a manifest.
//! * No ConfigMap's content is logged.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::catalog::{CATALOG_KEY, CatalogSpec, ConfigMapSet, ConfigMaps};
use crate::catalog::{Catalog, CatalogError};
use crate::config::ConfigFile;
use crate::plugin::Runtime;
use crate::reason::Reason;
use crate::validate::join_key;

use super::catalog_record::{DiskError, RECORD_FORMAT, RECORD_KEY, RECORD_VERSION, Record};
use super::config_file::FileCatalog;
use super::configmaps::{self, ConfigMapWatches, FIRST_ANSWER};
use super::events::{EventSink, Report};
use super::inbox::Trigger;
use super::reload::{CatalogSource, ReloadError};

/// How long the first load waits for the API server before the daemon
/// starts from disk.
pub const START_WAIT: Duration = Duration::from_secs(5);

/// What one load asked the watches for.
#[derive(Default)]
struct Seen {
    /// Each ConfigMap asked for, as it was (None: absent or unreadable).
    objects: BTreeMap<String, Option<Arc<Value>>>,
    /// A ConfigMap could not be read: no answer, or a refusal.
    unanswered: bool,
    /// The API server did not answer at all (nothing to post an Event to).
    away: bool,
}

/// [`ConfigMaps`] over the watches, recording what a load asked for.
struct ApiConfigMaps<'a> {
    watches: &'a ConfigMapWatches,
    wait: Duration,
    seen: RefCell<Seen>,
}

impl ConfigMaps for ApiConfigMaps<'_> {
    fn namespace(&self) -> &str {
        self.watches.namespace()
    }

    fn get(&self, name: &str) -> Result<Option<Value>, crate::catalog::ConfigMapError> {
        let mut seen = self.seen.borrow_mut();
        match self.watches.get(name, self.wait) {
            Ok(object) => {
                let value = object.as_deref().cloned();
                seen.objects.insert(name.to_string(), object);
                Ok(value)
            }
            Err(e) => {
                seen.objects.insert(name.to_string(), None);
                seen.unanswered = true;
                seen.away |= matches!(e, configmaps::ConfigMapError::NoAnswer { .. });
                Err(crate::catalog::ConfigMapError::Read {
                    namespace: self.watches.namespace().to_string(),
                    name: name.to_string(),
                    source: Box::new(Unreadable(e)),
                })
            }
        }
    }
}

/// The watches' error without its `ConfigMap NS/NAME:` prefix, which the
/// catalog's error already gives.
#[derive(Debug)]
struct Unreadable(configmaps::ConfigMapError);

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        let prefix = match &self.0 {
            configmaps::ConfigMapError::Refused {
                namespace, name, ..
            }
            | configmaps::ConfigMapError::NoAnswer {
                namespace, name, ..
            } => format!("ConfigMap {namespace}/{name}: "),
        };
        f.write_str(text.strip_prefix(&prefix).unwrap_or(&text))
    }
}

impl std::error::Error for Unreadable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The trigger a watched ConfigMap's change sends the loader.
pub fn trigger(name: &str) -> Trigger {
    Trigger::Changed(format!("ConfigMap {name} changed"))
}

/// The catalog of the configuration file and the ConfigMaps it names.
pub struct ApiCatalog {
    file: FileCatalog,
    watches: ConfigMapWatches,
    events: Option<EventSink>,
    /// The loader's runtime: its code cache keeps the [`Record`].
    runtime: Runtime,
    /// The ConfigMaps the catalog in use names.
    in_use: BTreeSet<String>,
    /// What the last load read.
    last: Last,
    /// The note of the last Event posted about a refusal.
    reported: Option<String>,
    loads: u64,
    /// This daemon's Node: where a refusal no ConfigMap caused is reported.
    node_name: String,
}

#[derive(Default)]
struct Last {
    seen: Seen,
    /// `daemon.catalog.configMap` of the file as last read.
    catalog_config_map: Option<String>,
    /// The ConfigMap at fault when the load failed.
    fault: Option<String>,
    /// The plugin ConfigMap whose component failed, when one did.
    culprit: Option<String>,
    /// The catalog ConfigMap's text, to remember once applied.
    record: Option<Record>,
    from_disk: bool,
}

impl ApiCatalog {
    pub fn new(
        file: FileCatalog,
        watches: ConfigMapWatches,
        events: Option<EventSink>,
        runtime: Runtime,
        node_name: String,
    ) -> ApiCatalog {
        // The log names the catalog ConfigMap from the first load on.
        let last = Last {
            catalog_config_map: file
                .started()
                .daemon
                .catalog
                .as_ref()
                .map(|c| c.config_map.clone()),
            ..Last::default()
        };
        ApiCatalog {
            file,
            watches,
            events,
            runtime,
            in_use: BTreeSet::new(),
            last,
            reported: None,
            loads: 0,
            node_name,
        }
    }

    fn namespace(&self) -> &str {
        self.watches.namespace()
    }

    /// The catalog from disk, for a start without the API server.
    fn load_from_disk(
        &self,
        config: &ConfigFile,
        runtime: &Runtime,
        api: &ReloadError,
    ) -> Result<(Catalog, String), DiskError> {
        let api = api.to_string().replace('\n', " ");
        let budget = config
            .render_budget(runtime.limits().timeout)
            .map_err(|e| DiskError::Load {
                api: api.clone(),
                source: CatalogError::Invalid(e.to_string()),
            })?;
        let namespace = self.namespace().to_string();
        let (spec, origin, described) = match &config.daemon.catalog {
            Some(catalog) => {
                let name = &catalog.config_map;
                let no_record = || DiskError::NoRecord {
                    api: api.clone(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                let bytes = runtime.recall(RECORD_KEY).ok_or_else(no_record)?;
                let bad = |detail: String| DiskError::BadRecord {
                    api: api.clone(),
                    detail,
                };
                let record: Record = serde_json::from_slice(&bytes)
                    .map_err(|e| bad(format!("record {RECORD_KEY}: {e}")))?;
                if record.format != RECORD_FORMAT || record.version != RECORD_VERSION {
                    return Err(bad(format!(
                        "record {RECORD_KEY} is {} version {}, this podstamp reads {RECORD_FORMAT} version {RECORD_VERSION}",
                        record.format, record.version
                    )));
                }
                if record.namespace != namespace || record.config_map != *name {
                    return Err(no_record());
                }
                let mut set = ConfigMapSet::new(&namespace);
                set.insert(
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name}, "data": {CATALOG_KEY: record.catalog}}),
                    "the remembered catalog",
                )
                .map_err(bad)?;
                let (spec, origin) =
                    CatalogSpec::from_config_map(&set, name).map_err(|source| DiskError::Load {
                        api: api.clone(),
                        source,
                    })?;
                (
                    spec,
                    origin,
                    format!(
                        "the catalog last applied from ConfigMap {namespace}/{name} (remembered in the code cache)"
                    ),
                )
            }
            None => (
                config.catalog_spec(),
                String::new(),
                format!("the catalog of {}", self.file.origin()),
            ),
        };
        let catalog = Catalog::load_spec_from_cache(&spec, &origin, runtime, budget)
            .map_err(|source| DiskError::Load { api, source })?;
        Ok((catalog, described))
    }

    /// The plugin ConfigMap whose component failed, for a load's `error`.
    fn culprit(spec: Option<&CatalogSpec>, error: &ReloadError) -> Option<String> {
        let ReloadError::Catalog(CatalogError::Plugin(plugin)) = error else {
            return None;
        };
        let (_, entry) = spec?
            .plugins
            .iter()
            .find(|(name, _)| join_key("plugins", name) == plugin.entry)?;
        entry.config_map.as_ref().map(|c| c.name.clone())
    }

    /// The ConfigMap the Event about a refusal goes on: the culprit when it
    /// can be read, else the catalog ConfigMap (a deleted or unreadable
    /// plugin ConfigMap cannot carry the Event).
    fn fault(&self) -> Option<String> {
        match &self.last.culprit {
            Some(name) if matches!(self.last.seen.objects.get(name), Some(Some(_))) => {
                Some(name.clone())
            }
            _ => self.last.catalog_config_map.clone(),
        }
    }
}

impl CatalogSource for ApiCatalog {
    fn origin(&self) -> String {
        match &self.last.catalog_config_map {
            Some(name) => format!("ConfigMap {}/{name}", self.namespace()),
            None => self.file.origin(),
        }
    }

    fn load(
        &mut self,
        runtime: &Runtime,
        current: Option<&Catalog>,
    ) -> Result<Catalog, ReloadError> {
        self.loads += 1;
        let first = self.loads == 1 && current.is_none();
        self.last = Last {
            catalog_config_map: self.last.catalog_config_map.take(),
            ..Last::default()
        };
        // A file that cannot be read refuses the load; it names no ConfigMap.
        let config = self.file.read()?;
        self.last.catalog_config_map = config.daemon.catalog.as_ref().map(|c| c.config_map.clone());
        let config_maps = ApiConfigMaps {
            watches: &self.watches,
            wait: if first { START_WAIT } else { FIRST_ANSWER },
            seen: RefCell::default(),
        };
        let mut spec = None;
        let result = (|| -> Result<Catalog, ReloadError> {
            let budget = config
                .render_budget(runtime.limits().timeout)
                .map_err(|e| CatalogError::Invalid(e.to_string()))?;
            let (loaded, origin) = match &config.daemon.catalog {
                Some(catalog) => CatalogSpec::from_config_map(&config_maps, &catalog.config_map)?,
                None => (config.catalog_spec(), String::new()),
            };
            let spec = spec.insert(loaded);
            Ok(Catalog::load_spec(
                spec,
                &origin,
                runtime,
                &config_maps,
                current,
                budget,
            )?)
        })();
        self.last.seen = config_maps.seen.into_inner();
        // Watched from now on: what the candidate and the catalog in use name.
        let names: BTreeSet<&str> = self
            .last
            .seen
            .objects
            .keys()
            .chain(&self.in_use)
            .map(String::as_str)
            .collect();
        self.watches.keep(names);
        match result {
            Ok(catalog) => {
                if let Some(name) = &self.last.catalog_config_map
                    && let Some(Some(object)) = self.last.seen.objects.get(name)
                    && let Some(text) = object.pointer(&format!("/data/{CATALOG_KEY}"))
                {
                    self.last.record = Some(Record {
                        format: RECORD_FORMAT.to_string(),
                        version: RECORD_VERSION,
                        namespace: self.namespace().to_string(),
                        config_map: name.clone(),
                        catalog: text.as_str().unwrap_or_default().to_string(),
                        digest: catalog.digest().to_string(),
                    });
                }
                Ok(catalog)
            }
            Err(error) if first && self.last.seen.unanswered => {
                let (catalog, described) = self.load_from_disk(&config, runtime, &error)?;
                tracing::warn!(catalog = %catalog.digest(),
                    "the API server does not answer ({}): running from disk with {described}, catalog {}, its ConfigMap components from the code cache; the API's catalog replaces it when the API server answers",
                    error.to_string().replace('\n', " "), catalog.digest());
                self.last.from_disk = true;
                Ok(catalog)
            }
            Err(error) => {
                self.last.culprit = ApiCatalog::culprit(spec.as_ref(), &error);
                self.last.fault = if self.last.seen.away {
                    // The API server is away: nothing to post an Event to.
                    None
                } else {
                    self.fault()
                };
                Err(error)
            }
        }
    }

    fn applied(&mut self, catalog: &Catalog) {
        self.reported = None;
        self.in_use = self.last.seen.objects.keys().cloned().collect();
        self.watches.keep(self.in_use.iter().map(String::as_str));
        if self.last.from_disk {
            return;
        }
        let Some(record) = &self.last.record else {
            return;
        };
        let remembered = serde_json::to_vec(record)
            .map_err(std::io::Error::other)
            .and_then(|bytes| self.runtime.remember(RECORD_KEY, &bytes));
        match remembered {
            Ok(true) => {
                tracing::debug!(catalog = %catalog.digest(), "catalog remembered for a start without the API server")
            }
            Ok(false) => tracing::info!(catalog = %catalog.digest(),
                "no code cache: the catalog from the API is not remembered, so a start without the API server renders nothing"),
            Err(e) => tracing::warn!(catalog = %catalog.digest(),
                "cannot remember the catalog in the code cache: {e}; a start without the API server would use an older one, or none"),
        }
    }

    fn refused(&mut self, error: &ReloadError) {
        let Some(events) = &self.events else {
            return;
        };
        let note = format!(
            "the new plugin catalog is refused: {}; the one in use keeps serving",
            error.to_string().replace('\n', " ")
        );
        if self.reported.as_ref() == Some(&note) {
            return;
        }
        let Some(name) = &self.last.fault else {
            // No ConfigMap at fault, and the API server answers.
            if !self.last.seen.away {
                events.report(Report {
                    reference: node_reference(&self.node_name),
                    reason: Reason::CatalogRefused,
                    note: note.clone(),
                    related: None,
                });
                self.reported = Some(note);
            }
            return;
        };
        let Some(Some(object)) = self.last.seen.objects.get(name) else {
            return;
        };
        let Some(reference) = configmaps::reference(object) else {
            return;
        };
        let report = Report {
            reference,
            reason: Reason::CatalogRefused,
            note: note.clone(),
            related: None,
        };
        // On the catalog ConfigMap because of a plugin ConfigMap (deleted,
        // or not granted): that one is the Event's related object.
        match &self.last.culprit {
            Some(culprit) if culprit != name => {
                events.report_related(report, config_map_reference(self.namespace(), culprit))
            }
            _ => events.report(report),
        }
        self.reported = Some(note);
    }
}

/// A reference to the Node `name`, as the kubelet makes it for its own
/// Events (the node's name as its uid), so `kubectl describe node` shows it.
fn node_reference(name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Node".to_string()),
        name: Some(name.to_string()),
        uid: Some(name.to_string()),
        ..Default::default()
    }
}

/// A reference to the ConfigMap `name` of `namespace`, which may not exist.
fn config_map_reference(
    namespace: &str,
    name: &str,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("ConfigMap".to_string()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        ..Default::default()
    }
}
