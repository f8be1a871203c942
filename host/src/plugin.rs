//! The Wasm plugin runtime: loads plugin components and runs them sandboxed.
//!
//! One engine serves every plugin. Each plugin is compiled once (or loaded
//! from the on-disk code cache) and pre-instantiated; every call gets a fresh
//! store and instance, so nothing leaks between pods or nodes. A call is
//! bounded in time by epoch interruption and in memory by a resource limiter.
//! Plugins get only the `podstamp:plugin/host` import: a component that
//! imports anything else (WASI filesystem, sockets, clocks...) is refused at
//! load time.

use std::fmt;
use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Enabled, Engine, EngineWeak, InstanceAllocationStrategy, PoolingAllocationConfig,
    ResourceLimiter, Store, Trap,
};

use crate::node::NodeContext;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
    });
}

use bindings::podstamp::plugin::host::LogLevel;
use bindings::podstamp::plugin::types as wit;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "podstamp:plugin@0.1.0";
const EXPORT_NAME: &str = "podstamp:plugin/transformer@0.1.0";
const EXPORT_PREFIX: &str = "podstamp:plugin/transformer@";
const HOST_IMPORT: &str = "podstamp:plugin/host@0.1.0";
/// The interface of shared types; it has no functions, so importing it grants nothing.
const TYPES_IMPORT: &str = "podstamp:plugin/types@0.1.0";

/// Bounds on every plugin call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for one call, instantiation included.
    pub timeout: Duration,
    /// The most linear memory one instance may have.
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

/// Why a plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{origin}: cannot read plugin: {source}")]
    Read {
        origin: String,
        source: std::io::Error,
    },
    #[error("{origin}: not a valid WebAssembly component: {detail}")]
    Compile { origin: String, detail: String },
    #[error(
        "{origin}: built against podstamp:plugin@{found}, but this podstamp expects {WIT_PACKAGE}; rebuild the plugin with the matching SDK"
    )]
    WrongVersion { origin: String, found: String },
    #[error(
        "{origin}: does not export {EXPORT_NAME}, so it is not a podstamp plugin (it exports: {exports})"
    )]
    NotAPlugin { origin: String, exports: String },
    #[error(
        "{origin}: imports `{import}`, which podstamp does not provide: plugins get no filesystem, network, clock, environment or arguments, only {HOST_IMPORT}"
    )]
    ForbiddenImport { origin: String, import: String },
    #[error("{origin}: {what}: {detail}")]
    Setup {
        origin: String,
        what: &'static str,
        detail: String,
    },
}

/// How one plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    #[error("deadline of {} ms exceeded; the call was stopped", .timeout.as_millis())]
    DeadlineExceeded { timeout: Duration },
    #[error("memory cap of {} exceeded (it asked for {})", mib(*.limit), mib(*.requested))]
    MemoryCapExceeded { limit: usize, requested: usize },
    #[error("stack overflow")]
    StackOverflow,
    #[error("trapped: {trap}{}", plugin_said(.last_error))]
    Trap {
        trap: String,
        last_error: Option<String>,
    },
    #[error("returned malformed data: {detail}")]
    Malformed { detail: String },
    #[error("returned {size} bytes, over the limit of {limit}")]
    OutputTooLarge { size: usize, limit: usize },
    #[error("{}{message}", .field.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
    Rejected {
        message: String,
        field: Option<String>,
    },
}

fn mib(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

fn plugin_said(last_error: &Option<String>) -> String {
    last_error
        .as_ref()
        .map(|m| format!(" (the plugin logged: {m})"))
        .unwrap_or_default()
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

/// Where a call's plugin instance (its memories, tables) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Reused slots of a pool reserved when the runtime starts.
    Pooled,
    /// Mapped for each call and unmapped after it.
    OnDemand,
}

/// Loads plugins and owns what they share: the engine and the epoch ticker.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

struct Shared {
    engine: Engine,
    linker: Linker<CallState>,
    limits: Limits,
    epoch_tick: Duration,
    cache: Option<CodeCache>,
    ticker: Arc<Ticker>,
    ticker_thread: Option<JoinHandle<()>>,
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
        bindings::Plugin::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(|e| setup("linker", e.to_string()))?;
        let cache = match cache_dir {
            Some(dir) => Some(
                CodeCache::open(dir, &engine)
                    .map_err(|e| setup("code cache", format!("{}: {e}", dir.display())))?,
            ),
            None => None,
        };
        // Ten ticks per deadline keep the cut-off within 10% of the timeout.
        let epoch_tick =
            (limits.timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(10));
        let ticker = Arc::new(Ticker::new(CONCURRENT_CALLS));
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
            }),
        })
    }

    pub fn limits(&self) -> Limits {
        self.shared.limits
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
        check_interface(&shared.engine, &component, origin)?;
        let pre = shared
            .linker
            .instantiate_pre(&component)
            .and_then(bindings::PluginPre::new)
            .map_err(|e| LoadError::Setup {
                origin: origin.to_string(),
                what: "cannot link",
                detail: format!("{e:#}"),
            })?;
        let mut plugin = Plugin {
            runtime: self.clone(),
            pre,
            origin: origin.to_string(),
            sha256,
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

/// Calls that may run at once on one runtime. Every call instantiates its
/// plugin afresh, from a pool of this many instance slots: a reused slot
/// keeps its memory mapped and its pages resident, so an instantiation costs
/// a reset instead of a fresh mapping and page faults. Further calls wait for
/// a slot.
const CONCURRENT_CALLS: u32 = 16;

/// Per call, the core instances, memories and tables a plugin component may
/// have: far more than a component made from one Rust, C or Go module needs
/// (one main module, a few adapter shims).
const CORE_INSTANCES_PER_CALL: u32 = 16;
const MEMORIES_PER_CALL: u32 = 4;
const TABLES_PER_CALL: u32 = 8;

/// Linear memory kept resident in a slot between calls, where the kernel
/// can tell which pages a call dirtied (Linux 6.7's PAGEMAP_SCAN): only
/// those are reset, and the next call takes no page faults on them. Without
/// it, wasmtime would memset this much on every call, more than the faults
/// it saves, so the memory is handed back to the kernel instead.
const KEEP_RESIDENT: usize = 4 << 20;

fn pool_config() -> PoolingAllocationConfig {
    let keep_resident = if PoolingAllocationConfig::is_pagemap_scan_available() {
        KEEP_RESIDENT
    } else {
        0
    };
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(CONCURRENT_CALLS)
        .total_core_instances(CONCURRENT_CALLS * CORE_INSTANCES_PER_CALL)
        .max_core_instances_per_component(CORE_INSTANCES_PER_CALL)
        .total_memories(CONCURRENT_CALLS * MEMORIES_PER_CALL)
        .max_memories_per_component(MEMORIES_PER_CALL)
        .total_tables(CONCURRENT_CALLS * TABLES_PER_CALL)
        .max_tables_per_component(TABLES_PER_CALL)
        .pagemap_scan(Enabled::Auto)
        .linear_memory_keep_resident(keep_resident);
    // The largest memory a slot holds stays the engine's default (4 GiB):
    // a component whose memory starts larger than `Limits::memory_bytes` is
    // refused by the memory limiter when it is instantiated, with the
    // message every other memory failure has.
    pool
}

/// What a component imports and exports, whether or not it is a plugin.
#[derive(Debug, Clone)]
pub struct Interface {
    pub sha256: String,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
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

/// Checks the component's imports and exports against our WIT package before
/// linking, so that a mismatch gets a message that says what to do.
fn check_interface(engine: &Engine, component: &Component, origin: &str) -> Result<(), LoadError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    if !exports.contains(&EXPORT_NAME) {
        if let Some(found) = exports.iter().find_map(|e| e.strip_prefix(EXPORT_PREFIX)) {
            return Err(LoadError::WrongVersion {
                origin: origin.to_string(),
                found: found.to_string(),
            });
        }
        return Err(LoadError::NotAPlugin {
            origin: origin.to_string(),
            exports: if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            },
        });
    }
    for (import, _) in ty.imports(engine) {
        if import == HOST_IMPORT || import == TYPES_IMPORT {
            continue;
        }
        if let Some(found) = ["podstamp:plugin/host@", "podstamp:plugin/types@"]
            .iter()
            .find_map(|prefix| import.strip_prefix(prefix))
        {
            return Err(LoadError::WrongVersion {
                origin: origin.to_string(),
                found: found.to_string(),
            });
        }
        return Err(LoadError::ForbiddenImport {
            origin: origin.to_string(),
            import: import.to_string(),
        });
    }
    Ok(())
}

/// A loaded plugin, ready to be called any number of times from any thread.
#[derive(Clone)]
pub struct Plugin {
    runtime: Runtime,
    pre: bindings::PluginPre<CallState>,
    origin: String,
    sha256: String,
    info: PluginInfo,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("origin", &self.origin)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The node context in the form the WIT bindings take; built once per
/// render and shared by every plugin of the chain.
pub struct WitNode(wit::NodeContext);

impl From<&NodeContext> for WitNode {
    fn from(node: &NodeContext) -> Self {
        let pairs = |m: &std::collections::BTreeMap<String, String>| {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        WitNode(wit::NodeContext {
            name: node.name.clone(),
            labels: pairs(&node.labels),
            annotations: pairs(&node.annotations),
            addresses: node
                .addresses
                .iter()
                .map(|a| wit::NodeAddress {
                    kind: a.kind.clone(),
                    address: a.address.clone(),
                })
                .collect(),
            architecture: node.architecture.clone(),
            operating_system: node.operating_system.clone(),
            kubelet_version: node.kubelet_version.clone(),
        })
    }
}

impl Plugin {
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// Where the plugin was loaded from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The sha256 of the plugin's bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    fn call_info(&self) -> Result<PluginInfo, CallFailure> {
        let info = self.call("info()", |plugin, store| {
            plugin.podstamp_plugin_transformer().call_info(store)
        })?;
        Ok(PluginInfo {
            name: info.name,
            version: info.version,
        })
    }

    /// Runs `transform` on one pod. `subject` names what is rendered (the
    /// template, the node) in the plugin's log lines.
    pub fn transform(
        &self,
        pod_json: &str,
        node: &WitNode,
        settings_json: &str,
        subject: &str,
    ) -> Result<String, CallFailure> {
        let result = self.call(subject, |plugin, store| {
            plugin.podstamp_plugin_transformer().call_transform(
                store,
                pod_json,
                &node.0,
                settings_json,
            )
        })?;
        match result {
            Ok(pod) if pod.len() > self.runtime.shared.limits.max_output_bytes => {
                Err(CallFailure::OutputTooLarge {
                    size: pod.len(),
                    limit: self.runtime.shared.limits.max_output_bytes,
                })
            }
            Ok(pod) => Ok(pod),
            Err(e) => Err(CallFailure::Rejected {
                message: e.message,
                field: e.field.filter(|f| !f.is_empty()),
            }),
        }
    }

    fn call<R>(
        &self,
        subject: &str,
        f: impl FnOnce(&bindings::Plugin, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, CallFailure> {
        let shared = &self.runtime.shared;
        // Taken before the store is made and so given back after it is
        // dropped: the store holds the pool slot until then.
        let _running = shared.ticker.start_call();
        let mut store = Store::new(
            &shared.engine,
            CallState {
                limiter: MemoryLimiter {
                    limit: shared.limits.memory_bytes,
                    exceeded: None,
                },
                plugin: self.info.name.clone(),
                subject: subject.to_string(),
                log_lines: 0,
                last_error: None,
            },
        );
        store.limiter(|state| &mut state.limiter);
        let ticks = shared.limits.timeout.as_nanos() / shared.epoch_tick.as_nanos().max(1);
        store.set_epoch_deadline(ticks.max(1) as u64);
        store.epoch_deadline_trap();

        let result = self
            .pre
            .instantiate(&mut store)
            .and_then(|plugin| f(&plugin, &mut store));
        result.map_err(|e| classify(e, store.data_mut(), shared.limits))
    }
}

fn classify(error: wasmtime::Error, state: &mut CallState, limits: Limits) -> CallFailure {
    if let Some(requested) = state.limiter.exceeded {
        return CallFailure::MemoryCapExceeded {
            limit: limits.memory_bytes,
            requested,
        };
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallFailure::DeadlineExceeded {
            timeout: limits.timeout,
        },
        Some(Trap::StackOverflow) => CallFailure::StackOverflow,
        Some(trap) => CallFailure::Trap {
            trap: trap.to_string(),
            last_error: state.last_error.take(),
        },
        None => CallFailure::Malformed {
            detail: format!("{error:#}"),
        },
    }
}

/// Per-call state: lives in the store, dies with it.
struct CallState {
    limiter: MemoryLimiter,
    plugin: String,
    subject: String,
    log_lines: u32,
    last_error: Option<String>,
}

const MAX_LOG_LINE: usize = 4096;
const MAX_LOG_LINES_PER_CALL: u32 = 64;

impl bindings::podstamp::plugin::types::Host for CallState {}

impl bindings::podstamp::plugin::host::Host for CallState {
    fn log(&mut self, level: LogLevel, mut message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES_PER_CALL {
            if self.log_lines == MAX_LOG_LINES_PER_CALL + 1 {
                tracing::warn!(plugin = %self.plugin, subject = %self.subject, "plugin logged over {MAX_LOG_LINES_PER_CALL} lines in one call; dropping the rest");
            }
            return;
        }
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        let (plugin, subject) = (&self.plugin, &self.subject);
        match level {
            LogLevel::Error => tracing::error!(plugin, subject, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, subject, "{message}"),
            LogLevel::Info => tracing::info!(plugin, subject, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, subject, "{message}"),
            LogLevel::Trace => tracing::trace!(plugin, subject, "{message}"),
        }
        if level == LogLevel::Error {
            self.last_error = Some(message);
        }
    }
}

struct MemoryLimiter {
    limit: usize,
    /// The size asked for when the cap was hit.
    exceeded: Option<usize>,
}

/// The most table elements and instances one call may create; generous for
/// any real plugin, small enough that a hostile one cannot use them to
/// exhaust host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = Some(desired);
            // Trapping (rather than returning false) stops a plugin that
            // would otherwise retry or limp on without its memory.
            return Err(wasmtime::format_err!("memory cap exceeded"));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

/// Advances the engine's epoch while at least one call is running, and sleeps
/// otherwise, so an idle daemon spends no CPU on it. It also admits at most
/// `max_calls` calls at once (one per pool slot).
struct Ticker {
    state: Mutex<TickerState>,
    wake: Condvar,
    slot_free: Condvar,
    max_calls: usize,
}

#[derive(Default)]
struct TickerState {
    running_calls: usize,
    stopped: bool,
}

struct RunningCall<'a>(&'a Ticker);

impl Drop for RunningCall<'_> {
    fn drop(&mut self) {
        self.0.lock().running_calls -= 1;
        self.0.slot_free.notify_one();
    }
}

impl Ticker {
    fn new(max_calls: u32) -> Ticker {
        Ticker {
            state: Mutex::default(),
            wake: Condvar::new(),
            slot_free: Condvar::new(),
            max_calls: max_calls as usize,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        // The state stays consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a free slot, then counts the call as running.
    fn start_call(&self) -> RunningCall<'_> {
        let mut state = self.lock();
        while state.running_calls >= self.max_calls {
            state = self
                .slot_free
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.running_calls += 1;
        drop(state);
        self.wake.notify_one();
        RunningCall(self)
    }

    fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_one();
    }

    fn run(&self, engine: EngineWeak, tick: Duration) {
        loop {
            {
                let mut state = self.lock();
                while state.running_calls == 0 && !state.stopped {
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.stopped {
                    return;
                }
            }
            std::thread::sleep(tick);
            match engine.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        }
    }
}

/// Where compiled plugin code is cached unless configured otherwise:
/// `$PODSTAMP_CACHE_DIR`, else `$XDG_CACHE_HOME/podstamp`, else `~/.cache/podstamp`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let from_env = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from_env("PODSTAMP_CACHE_DIR")
        .or_else(|| from_env("XDG_CACHE_HOME").map(|d| d.join("podstamp")))
        .or_else(|| from_env("HOME").map(|d| d.join(".cache/podstamp")))
}

/// The cache directory to use: none with `no_cache`, else the flag's, else
/// the configuration's, else [`default_cache_dir`].
pub fn choose_cache_dir(
    no_cache: bool,
    flag: Option<&Path>,
    configured: Option<&Path>,
) -> Option<PathBuf> {
    if no_cache {
        return None;
    }
    flag.or(configured)
        .map(Path::to_path_buf)
        .or_else(default_cache_dir)
}

/// Compiled plugin code on disk, keyed by the plugin's sha256 and the
/// engine's compatibility hash, so a restart does not recompile.
struct CodeCache {
    dir: PathBuf,
    engine_key: String,
}

/// Feeds `Hash` output into sha256, for a key that is stable across runs
/// (std's hashers are not).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the digest is used")
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl CodeCache {
    fn open(dir: &Path, engine: &Engine) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Cached code is loaded as native code without verification, so the
        // directory must be ours alone.
        let meta = std::fs::symlink_metadata(dir)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
            return Err(std::io::Error::other(
                "must be a directory owned by this user and writable by no one else",
            ));
        }
        let mut hasher = Sha256Hasher(Sha256::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..8]);
        Ok(CodeCache {
            dir: dir.to_path_buf(),
            engine_key,
        })
    }

    fn load(&self, engine: &Engine, bytes: &[u8], sha256: &str) -> wasmtime::Result<Component> {
        let path = self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key));
        if path.is_file() {
            // SAFETY: the file was written by `store` below into a directory
            // that only this user can write (checked in `open`), under a name
            // that binds it to these exact plugin bytes and engine settings;
            // wasmtime also checks the engine compatibility header itself.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cached code: {e:#}")
                }
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(e) = self.store(&path, &component) {
            tracing::warn!(path = %path.display(), "cannot cache compiled plugin: {e:#}");
        }
        Ok(component)
    }

    fn store(&self, path: &Path, component: &Component) -> anyhow::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let code = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            path.file_name().unwrap_or_default().display(),
            std::process::id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let written = file.write_all(&code).and_then(|()| file.sync_all());
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        Ok(())
    }
}
