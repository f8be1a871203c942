//! The catalog loader: builds new catalogs when their source changes and
//! hands the reconciler only whole, loaded ones.
//!
//! Invariants:
//! * Catalogs are loaded (components read and compiled, or taken from the
//!   code cache) on the loader's own thread, with its own clone of the
//!   plugin [`Runtime`]: a reload never holds the render thread.
//! * All or nothing: a catalog that fails in any way is refused whole, the
//!   one in use keeps serving, and the failure goes to the log and to
//!   `podstamp_config_reloads_total{result="refused"}`.
//! * Every reload ends as exactly one of applied, refused, unchanged (a
//!   catalog with the digest of the one in use is not sent).
//! * The loader keeps the catalog in use (shared with the reconciler), so
//!   that the next load can compare with it and reuse its components; a
//!   replaced catalog is freed once both have let go of it.
//!
//! * A loader started without a catalog (one that needs the API server)
//!   loads one at once; until a load succeeds, nothing is sent and nothing
//!   renders.
//!
//! Where catalogs come from is a [`CatalogSource`]; what says "load again"
//! is a [`Trigger`] on a channel. Any number of watchers (the configuration
//! file, the ConfigMaps the catalog names) can feed the same channel:
//! triggers queued while a load runs are coalesced into one more load.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};

use crate::catalog::{Catalog, CatalogError};
use crate::plugin::Runtime;

use super::inbox::{Input, Trigger};
use super::metrics::{Metrics, ReloadResult};

/// Why a new catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration file cannot be read, or is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// At start, neither the API server nor the disk gave a catalog.
    #[error(transparent)]
    Disk(#[from] super::catalog_record::DiskError),
}

/// Where catalogs come from: the configuration file, and with the API
/// source the ConfigMaps it names.
pub trait CatalogSource: Send {
    /// What the catalog is read from, for the log (e.g. the file's path).
    fn origin(&self) -> String;

    /// Loads the catalog the source describes now. `current` is the
    /// catalog in use (None before the first), whose compiled components a
    /// load may reuse.
    fn load(
        &mut self,
        runtime: &Runtime,
        current: Option<&Catalog>,
    ) -> Result<Catalog, ReloadError>;

    /// The last load's catalog is now in use (it was new).
    fn applied(&mut self, _catalog: &Catalog) {}

    /// The last load was refused with `error` (already logged).
    fn refused(&mut self, _error: &ReloadError) {}
}

/// Loads catalogs from a source, one at a time, and sends the reconciler
/// each new one.
pub struct Loader {
    runtime: Runtime,
    source: Box<dyn CatalogSource>,
    current: Option<Arc<Catalog>>,
    digest: Option<String>,
    inputs: Sender<Input>,
    metrics: Arc<Metrics>,
}

impl Loader {
    /// A loader whose catalog in use is `current` (already sent to the
    /// reconciler); None: there is none yet, [`Loader::run`] loads one first.
    pub fn new(
        runtime: Runtime,
        source: Box<dyn CatalogSource>,
        current: Option<Arc<Catalog>>,
        inputs: Sender<Input>,
        metrics: Arc<Metrics>,
    ) -> Loader {
        Loader {
            digest: current.as_ref().map(|c| c.digest().to_string()),
            runtime,
            source,
            current,
            inputs,
            metrics,
        }
    }

    /// Loads the catalog again, now, and sends it on if it is new. None
    /// when the reconciler is gone.
    pub fn reload(&mut self, trigger: &Trigger) -> Option<ReloadResult> {
        let origin = self.source.origin();
        let why = match trigger {
            Trigger::Changed(what) => what.as_str(),
            Trigger::Periodic => "periodic re-read",
        };
        let started = std::time::Instant::now();
        let in_use = self.digest.as_deref().unwrap_or("none");
        let result = match self.source.load(&self.runtime, self.current.as_deref()) {
            Err(e) => {
                let keeps = if self.current.is_some() {
                    "the one in use keeps serving until a fixed one loads"
                } else {
                    "there is no catalog in use yet: nothing is rendered (manifests on disk are kept) until one loads"
                };
                tracing::error!(config = %origin, catalog = %in_use,
                    "{origin}: the new plugin catalog is refused: {}; {keeps}",
                    e.to_string().replace('\n', " "));
                self.source.refused(&e);
                ReloadResult::Refused
            }
            Ok(catalog) => {
                let digest = catalog.digest().to_string();
                if Some(&digest) == self.digest.as_ref() {
                    if *trigger == Trigger::Periodic {
                        tracing::debug!(config = %origin, catalog = %digest, "catalog unchanged");
                    } else {
                        tracing::info!(config = %origin, catalog = %digest, "{why}; the plugin catalog is unchanged");
                    }
                    ReloadResult::Unchanged
                } else {
                    let catalog = Arc::new(catalog);
                    if self.inputs.send(Input::Catalog(catalog.clone())).is_err() {
                        return None;
                    }
                    tracing::info!(config = %origin, catalog = %digest, previous = %in_use,
                        load_ms = started.elapsed().as_millis() as u64,
                        "{why}: new plugin catalog loaded");
                    self.source.applied(&catalog);
                    // The old catalog goes when the reconciler lets go of it too.
                    self.current = Some(catalog);
                    self.digest = Some(digest);
                    ReloadResult::Applied
                }
            }
        };
        self.metrics.reload(result);
        Some(result)
    }

    /// Reloads at each trigger until the triggers or the reconciler go.
    /// Triggers that arrive during a load are coalesced into one more load.
    pub fn run(mut self, triggers: Receiver<Trigger>) {
        if self.current.is_none()
            && self
                .reload(&Trigger::Changed("start".to_string()))
                .is_none()
        {
            return;
        }
        while let Ok(mut trigger) = triggers.recv() {
            while let Ok(next) = triggers.try_recv() {
                // A change says more than a periodic re-read.
                if next != Trigger::Periodic || trigger == Trigger::Periodic {
                    trigger = next;
                }
            }
            if self.reload(&trigger).is_none() {
                return;
            }
        }
    }
}

/// Starts `loader` on a thread of its own.
pub fn spawn(loader: Loader, triggers: Receiver<Trigger>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("catalog-loader".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| loader.run(triggers));
            if std::panic::catch_unwind(run).is_err() {
                // The catalog in use keeps serving; only reloading stops.
                tracing::error!(
                    "the catalog loader panicked; the catalog in use keeps serving, but a change to the configuration now needs a restart"
                );
            }
        })
        .map(drop)
}

/// A catalog shows as its digest (in an [`Input`]'s debug output, say).
impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Catalog({})", self.digest())
    }
}
