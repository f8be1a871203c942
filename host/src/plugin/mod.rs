//! The Wasm plugin runtime: loads plugin components and runs them sandboxed.
//!
//! One engine serves every plugin. Each plugin is compiled once (or loaded
//! from the on-disk code cache) and pre-instantiated; every call gets a fresh
//! store and instance, so nothing leaks between pods or nodes (a pooled
//! slot's memory is dropped between calls, see `pool`). A call is bounded in
//! time by epoch interruption and in memory by a resource limiter; what it
//! returns is bounded too (the pod by `max_output_bytes`, an error's text by
//! `call::MAX_ERROR_TEXT`).
//! Plugins get the `podstamp:plugin/host` import and WASI 0.2's
//! `wasi:cli/imports` interfaces, which grant nothing (see `wasi`): a
//! component that imports anything else is refused at load time.
//!
//! One concern per file: `error` (how loading and calls fail), `interface`
//! (what a component must import and export), `pool` (where instances come
//! from, and the gate that admits one call per pool slot), `call` (one
//! sandboxed call), `log` (where a call's log lines go, bounded), `ticker` (the epoch that makes deadlines fire), `cache`
//! (compiled code on disk), `wasi` (the deny-by-default
//! WASI context).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy};

mod cache;
mod call;
pub mod declared;
mod error;
mod interface;
mod log;
mod pool;
mod ticker;
mod wasi;

pub use cache::{choose_cache_dir, default_cache_dir};
pub use call::{Plugin, WitNode};
pub use error::{CallFailure, LoadError};
pub use interface::{Interface, WIT_PACKAGE};
pub use pool::Allocation;

use cache::CodeCache;
use call::CallState;
use interface::check_interface;
use pool::{CONCURRENT_CALLS, Slots, pool_config};
use ticker::Ticker;

/// The most resource handles a call may hold at once: wasmtime's count of
/// a store's live component handles, and the capacity of the WASI table of
/// what the host handed out (`wasi`). A transform needs a handful;
/// this bounds what a plugin that never drops them makes the host keep.
pub const MAX_HANDLES_PER_CALL: usize = 10_000;

/// The bindings of the least a plugin exports (`transformer`); the
/// optional `settings-validator` export is looked up by name ([`call::Plugin`]).
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "minimal-plugin",
    });
}

/// Bounds on every plugin call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for one call, instantiation included.
    pub timeout: Duration,
    /// The most linear memory one call may have, all the memories of its
    /// instance together.
    pub memory_bytes: usize,
    /// The largest pod a plugin may return, in bytes of JSON.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_millis(100),
            memory_bytes: 64 << 20,
            max_output_bytes: 1 << 20,
        }
    }
}

/// Who a plugin says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
}

impl fmt::Display for PluginInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// Loads plugins and owns what they share: the engine and the epoch ticker.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
    /// Where `oci:` catalog components are pulled from (the daemon's
    /// registry settings); None: anonymously, trusting the system's CAs.
    registry: Option<Arc<crate::oci::Registry>>,
}

struct Shared {
    engine: Engine,
    linker: Linker<CallState>,
    limits: Limits,
    epoch_tick: Duration,
    cache: Option<CodeCache>,
    ticker: Arc<Ticker>,
    ticker_thread: Option<JoinHandle<()>>,
    /// One per pool slot: the calls that may run at once.
    slots: Slots,
    /// How many components were compiled or read from the code cache: what
    /// a catalog that reuses loaded plugins saves, made observable.
    components_loaded: AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ticker.stop();
        if let Some(thread) = self.ticker_thread.take() {
            let _ = thread.join();
        }
    }
}

impl Runtime {
    /// A runtime whose calls obey `limits`, caching compiled code in
    /// `cache_dir` when one is given.
    ///
    /// Plugin instances come from a pool of reused slots; where the pool's
    /// address space cannot be reserved (a `ulimit -v`, strict overcommit),
    /// each call maps its own memory instead, with a warning.
    pub fn new(limits: Limits, cache_dir: Option<&Path>) -> Result<Self, LoadError> {
        match Runtime::with_allocation(limits, cache_dir, Allocation::Pooled) {
            // Only the engine reserves the pool; any other error is the same
            // either way.
            Err(LoadError::Setup {
                what: "engine",
                detail,
                ..
            }) => {
                tracing::warn!(
                    "cannot reserve the plugin instance pool ({detail}); allocating each plugin instance on its own"
                );
                Runtime::with_allocation(limits, cache_dir, Allocation::OnDemand)
            }
            result => result,
        }
    }

    /// [`Runtime::new`] with the instance allocation chosen, and no fallback.
    pub fn with_allocation(
        limits: Limits,
        cache_dir: Option<&Path>,
        allocation: Allocation,
    ) -> Result<Self, LoadError> {
        let setup = |what, detail: String| LoadError::Setup {
            origin: "plugin runtime".into(),
            what,
            detail,
        };
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        if allocation == Allocation::Pooled {
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool_config()));
        }
        let engine = Engine::new(&config).map_err(|e| setup("engine", e.to_string()))?;
        let mut linker = Linker::new(&engine);
        bindings::MinimalPlugin::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .and_then(|()| wasi::add_to_linker(&mut linker))
            .map_err(|e| setup("linker", e.to_string()))?;
        let cache = match cache_dir {
            Some(dir) => Some(
                CodeCache::open(dir, &engine).map_err(|e| setup("code cache", e.to_string()))?,
            ),
            None => None,
        };
        // Ten ticks per deadline keep the cut-off within 10% of the timeout.
        let epoch_tick =
            (limits.timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(10));
        let ticker = Arc::new(Ticker::new());
        let ticker_thread = {
            let ticker = ticker.clone();
            let engine = engine.weak();
            std::thread::Builder::new()
                .name("podstamp-epoch".into())
                .spawn(move || ticker.run(engine, epoch_tick))
                .map_err(|e| setup("epoch thread", e.to_string()))?
        };
        Ok(Runtime {
            shared: Arc::new(Shared {
                engine,
                linker,
                limits,
                epoch_tick,
                cache,
                ticker,
                ticker_thread: Some(ticker_thread),
                slots: Slots::new(CONCURRENT_CALLS),
                components_loaded: AtomicU64::new(0),
            }),
            registry: None,
        })
    }

    /// This runtime, pulling `oci:` components through `registry`.
    pub fn with_registry(mut self, registry: crate::oci::Registry) -> Self {
        self.registry = Some(Arc::new(registry));
        self
    }

    /// The registry settings `oci:` components are pulled with, if given.
    pub fn registry(&self) -> Option<&crate::oci::Registry> {
        self.registry.as_deref()
    }

    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// How many components this runtime has compiled (or read compiled
    /// from the code cache) so far.
    pub fn components_loaded(&self) -> u64 {
        self.shared.components_loaded.load(Ordering::Relaxed)
    }

    /// Loads the plugin component at `path`.
    pub fn load(&self, path: &Path) -> Result<Plugin, LoadError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            origin: origin.clone(),
            source,
        })?;
        self.load_bytes(&bytes, &origin)
    }

    /// Loads a plugin from the bytes of a binary component;
    /// `origin` names it in errors.
    pub fn load_bytes(&self, bytes: &[u8], origin: &str) -> Result<Plugin, LoadError> {
        let shared = &self.shared;
        let sha256 = hex::encode(Sha256::digest(bytes));
        let compile_error = |e: wasmtime::Error| LoadError::Compile {
            origin: origin.to_string(),
            detail: format!("{e:#}"),
        };
        let component = match &shared.cache {
            Some(cache) => cache
                .load(&shared.engine, bytes, &sha256)
                .map_err(compile_error)?,
            None => Component::new(&shared.engine, bytes).map_err(compile_error)?,
        };
        let declared = declared::declared_scope(bytes).map_err(|detail| LoadError::Setup {
            origin: origin.to_string(),
            what: "its declared scope cannot be read",
            detail,
        })?;
        let mut plugin = self.ready(component, sha256, origin)?;
        plugin.declared = declared;
        Ok(plugin)
    }

    /// The plugin whose component has this sha256, from the compiled-code
    /// cache alone, without the component's bytes: how a node whose
    /// plugins come from the API starts while the API server is down. None
    /// when there is no cache or no entry for it (an entry that fails its
    /// checks is None too, with a warning, as in [`Runtime::load_bytes`]).
    pub fn load_cached(&self, sha256: &str, origin: &str) -> Result<Option<Plugin>, LoadError> {
        let shared = &self.shared;
        let Some(cache) = &shared.cache else {
            return Ok(None);
        };
        match cache.cached(&shared.engine, sha256) {
            Some(component) => self
                .ready(component, sha256.to_ascii_lowercase(), origin)
                .map(Some),
            None => Ok(None),
        }
    }

    /// The record `key` kept in the compiled-code cache (see
    /// [`Runtime::remember`]); None without a cache, or when there is none.
    pub fn recall(&self, key: &str) -> Option<Vec<u8>> {
        check_record_key(key);
        self.shared.cache.as_ref()?.record(key)
    }

    /// Keeps `content` as the record `key` in the compiled-code cache, with
    /// the cache's guarantees (written whole, read only through checked
    /// handles): what a node needs to start again without the API server,
    /// next to the code it needs. Without a cache, nothing is kept (false).
    pub fn remember(&self, key: &str, content: &[u8]) -> std::io::Result<bool> {
        check_record_key(key);
        match &self.shared.cache {
            Some(cache) => cache.store_record(key, content).map(|()| true),
            None => Ok(false),
        }
    }

    /// A compiled component made into a plugin: its interface checked,
    /// linked, and its `info()` read.
    fn ready(
        &self,
        component: Component,
        sha256: String,
        origin: &str,
    ) -> Result<Plugin, LoadError> {
        let shared = &self.shared;
        shared.components_loaded.fetch_add(1, Ordering::Relaxed);
        check_interface(&shared.engine, &component, origin)?;
        let pre = shared
            .linker
            .instantiate_pre(&component)
            .and_then(bindings::MinimalPluginPre::new)
            .map_err(|e| LoadError::Setup {
                origin: origin.to_string(),
                what: "cannot link",
                detail: format!("{e:#}"),
            })?;
        let validate = component
            .get_export_index(None, interface::SETTINGS_EXPORT)
            .and_then(|settings| {
                component.get_export_index(Some(&settings), interface::VALIDATE_SETTINGS)
            });
        let mut plugin = Plugin {
            runtime: self.clone(),
            pre,
            validate,
            origin: origin.to_string(),
            sha256,
            // Read from the bytes by the caller that has them: from the
            // compiled-code cache alone, not known.
            declared: None,
            info: PluginInfo {
                name: origin.to_string(),
                version: String::new(),
            },
        };
        plugin.info = plugin.call_info().map_err(|e| LoadError::Setup {
            origin: origin.to_string(),
            what: "info() failed",
            detail: e.to_string(),
        })?;
        Ok(plugin)
    }
}

impl Runtime {
    /// Compiles `bytes` and lists the component's imports and exports.
    pub fn describe(&self, bytes: &[u8]) -> Result<Interface, String> {
        let engine = &self.shared.engine;
        let component = Component::new(engine, bytes)
            .map_err(|e| format!("not a valid WebAssembly component: {e:#}"))?;
        let ty = component.component_type();
        Ok(Interface {
            sha256: hex::encode(Sha256::digest(bytes)),
            imports: ty.imports(engine).map(|(n, _)| n.to_string()).collect(),
            exports: ty.exports(engine).map(|(n, _)| n.to_string()).collect(),
        })
    }
}

/// Record keys are podstamp's own words, never user input: a key that is
/// not one (a path, a dot-file) is a bug.
fn check_record_key(key: &str) {
    assert!(
        !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "record key {key:?}: lower-case letters, digits and dashes only"
    );
}
