//! One sandboxed call: a fresh store and instance, bounded in time (epoch
//! deadline), memory (a resource limiter) and live resource handles
//! ([`super::MAX_HANDLES_PER_CALL`], each limit reported as itself), with the plugin's log lines
//! (its `log` import and, for a WASI plugin, its stdout and stderr) bounded
//! together and attributed to the plugin and what it renders.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ComponentExportIndex;
use wasmtime::{ResourceLimiter, Store, Trap};

use super::bindings;
use super::bindings::podstamp::plugin::host::LogLevel;
use super::bindings::podstamp::plugin::types as wit;
use super::log::{LogSink, MAX_LOG_LINE};
use super::wasi::{Wasi, WasiState};
use super::{CallFailure, Limits, PluginInfo, Runtime};
use crate::node::NodeContext;

/// A loaded plugin, ready to be called any number of times from any thread.
#[derive(Clone)]
pub struct Plugin {
    pub(super) runtime: Runtime,
    pub(super) pre: bindings::MinimalPluginPre<CallState>,
    /// Its `validate-settings` function, when it exports one (WIT 0.1.1).
    pub(super) validate: Option<ComponentExportIndex>,
    pub(super) origin: String,
    pub(super) sha256: String,
    pub(super) info: PluginInfo,
    /// The scope its component declares ([`super::declared`]); None: none
    /// declared, or not known (loaded from the compiled-code cache alone).
    pub(super) declared: Option<Vec<String>>,
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

    /// The grants the plugin declares it needs ([`super::declared`]).
    pub fn declared_scope(&self) -> Option<&[String]> {
        self.declared.as_deref()
    }

    /// The sha256 of the plugin's bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub(super) fn call_info(&self) -> Result<PluginInfo, CallFailure> {
        let info = self.call("info()", Duration::MAX, |plugin, store| {
            plugin.podstamp_plugin_transformer().call_info(store)
        })?;
        Ok(PluginInfo {
            name: info.name,
            version: info.version,
        })
    }

    /// Whether the plugin checks its settings before rendering (it exports
    /// `validate-settings`, WIT 0.1.1).
    pub fn validates_settings(&self) -> bool {
        self.validate.is_some()
    }

    /// Runs `validate-settings` on these settings (the JSON `transform`
    /// would get), in a fresh instance with the limits of any call. A
    /// plugin that does not export it (built against WIT 0.1.0) accepts
    /// anything here: its first `transform` checks them.
    pub fn validate_settings(&self, settings_json: &str) -> Result<(), CallFailure> {
        let Some(index) = &self.validate else {
            return Ok(());
        };
        let result = self.call_with("validate-settings", Duration::MAX, |store| {
            let instance = self.pre.instance_pre().instantiate(&mut *store)?;
            let validate = instance
                .get_typed_func::<(&str,), (Result<(), wit::PluginError>,)>(&mut *store, index)?;
            Ok(validate.call(&mut *store, (settings_json,))?.0)
        })?;
        result.map_err(rejected)
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
        self.transform_within(pod_json, node, settings_json, subject, Duration::MAX)
    }

    /// [`Plugin::transform`], stopped after `time_left` when that comes
    /// before the call's own timeout; the deadline it then fails with is
    /// `time_left`.
    pub fn transform_within(
        &self,
        pod_json: &str,
        node: &WitNode,
        settings_json: &str,
        subject: &str,
        time_left: Duration,
    ) -> Result<String, CallFailure> {
        let result = self.call(subject, time_left, |plugin, store| {
            plugin.podstamp_plugin_transformer().call_transform(
                store,
                pod_json,
                &node.0,
                settings_json,
            )
        })?;
        // The bindings have already copied these strings out of the guest,
        // each after checking that it lies within the guest's memory: so a
        // huge pod or error costs at most the memory cap (twice, for a
        // message and a field) for the moment it takes to refuse or cut it
        // here. Refusing before the copy would take hand-written lifting
        // (`WasmStr`) instead of the generated bindings.
        match result {
            Ok(pod) if pod.len() > self.runtime.shared.limits.max_output_bytes => {
                Err(CallFailure::OutputTooLarge {
                    size: pod.len(),
                    limit: self.runtime.shared.limits.max_output_bytes,
                })
            }
            Ok(pod) => Ok(pod),
            Err(e) => Err(rejected(e)),
        }
    }

    /// One call of the transformer interface, in a fresh instance.
    fn call<R>(
        &self,
        subject: &str,
        time_left: Duration,
        f: impl FnOnce(&bindings::MinimalPlugin, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, CallFailure> {
        self.call_with(subject, time_left, |store| {
            let plugin = self.pre.instantiate(&mut *store)?;
            f(&plugin, store)
        })
    }

    /// `f` (which instantiates the plugin) in a fresh store, bounded.
    fn call_with<R>(
        &self,
        subject: &str,
        time_left: Duration,
        f: impl FnOnce(&mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, CallFailure> {
        let shared = &self.runtime.shared;
        // The deadline is a whole number of epoch ticks, rounded down, so
        // that the call never outlives `time_left`; with less than a tick
        // left it is not made at all.
        let limits = Limits {
            timeout: shared.limits.timeout.min(time_left),
            ..shared.limits
        };
        let ticks = limits.timeout.as_nanos() / shared.epoch_tick.as_nanos().max(1);
        if ticks == 0 && limits.timeout < shared.limits.timeout {
            return Err(CallFailure::DeadlineExceeded {
                timeout: limits.timeout,
            });
        }
        // Taken before the store is made and so given back after it is
        // dropped (locals drop in reverse): the store holds the pool slot
        // until then. The ticker counts the call once it has its slot, so a
        // waiting call does not keep the epoch ticking.
        let _slot = shared.slots.acquire();
        let _running = shared.ticker.start_call();
        let mut store = Store::new(
            &shared.engine,
            CallState {
                limiter: CallLimiter::new(shared.limits.memory_bytes),
                log: Arc::new(LogSink::new(self.info.name.clone(), subject.to_string())),
                last_error: None,
                wasi: None,
            },
        );
        store.limiter(|state| &mut state.limiter);
        store.set_max_component_handles(super::MAX_HANDLES_PER_CALL);
        store.set_epoch_deadline(ticks.max(1) as u64);
        store.epoch_deadline_trap();

        let result = f(&mut store);
        result.map_err(|e| classify(e, store.data_mut(), limits))
    }
}

/// A plugin's own error, its message and field cut to size.
fn rejected(e: wit::PluginError) -> CallFailure {
    CallFailure::Rejected {
        message: crate::text::cut(e.message, MAX_ERROR_TEXT),
        field: e
            .field
            .filter(|f| !f.is_empty())
            .map(|f| crate::text::cut(f, MAX_ERROR_TEXT)),
    }
}

/// Whether `error` is one of the handle limits: the WASI table's full
/// (typed), or wasmtime's component handle limit, which it raises as a
/// message only ("cannot allocate another handle: …", wasmtime 48's
/// handle_table.rs; tests/sandbox.rs pins it).
fn is_handle_limit(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<wasmtime::component::ResourceTableError>(),
            Some(wasmtime::component::ResourceTableError::Full)
        ) || cause
            .to_string()
            .starts_with("cannot allocate another handle")
    })
}

fn classify(error: wasmtime::Error, state: &mut CallState, limits: Limits) -> CallFailure {
    if let Some(requested) = state.limiter.exceeded {
        return CallFailure::MemoryCapExceeded {
            limit: limits.memory_bytes,
            requested,
        };
    }
    if is_handle_limit(&error) {
        return CallFailure::HandleLimitExceeded {
            limit: super::MAX_HANDLES_PER_CALL,
        };
    }
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return CallFailure::Exited { status: exit.0 };
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
pub(super) struct CallState {
    limiter: CallLimiter,
    log: Arc<LogSink>,
    last_error: Option<String>,
    /// Made on the call's first WASI import (most plugins have none).
    wasi: Option<Box<Wasi>>,
}

impl WasiState for CallState {
    /// The call's WASI context, made now if it is the first use.
    fn wasi(&mut self) -> &mut Wasi {
        let log = &self.log;
        self.wasi.get_or_insert_with(|| Wasi::new(log))
    }
}

impl wasmtime_wasi::WasiView for CallState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.wasi().view()
    }
}

/// The most of a plugin's error message, and of the field it names, that is
/// kept: what a person reads in a log line or an Event. A plugin may return
/// a string as large as its memory; the text is cut here, before it is
/// logged, kept in the reconciler's state or queued as an Event.
pub(super) const MAX_ERROR_TEXT: usize = 4096;

impl bindings::podstamp::plugin::types::Host for CallState {}

impl bindings::podstamp::plugin::host::Host for CallState {
    fn log(&mut self, level: LogLevel, mut message: String) {
        if self.log.log(level, &message) && level == LogLevel::Error {
            if message.len() > MAX_LOG_LINE {
                message.truncate(message.floor_char_boundary(MAX_LOG_LINE));
                message.push('…');
            }
            self.last_error = Some(message);
        }
    }
}

/// Caps what one call may allocate, summed over all of its instance's
/// linear memories (a component may define several, one per core module,
/// and the pool allows [`super::pool`]'s `MEMORIES_PER_CALL`) and over all
/// of its tables: wasmtime asks per memory or table (its current and
/// desired size), so the totals are kept here.
///
/// A growth is counted when it is granted. wasmtime can still fail a
/// granted growth, which would leave the total counting bytes the plugin
/// never got; so a growth past the memory's (or table's) own declared
/// maximum, which wasmtime always fails, is refused here uncounted, and what
/// remains (the host out of memory) only errs on the safe side. (Its
/// `*_grow_failed` hooks cannot undo a grant: wasmtime also calls them for
/// growths it refused without asking.)
struct CallLimiter {
    /// `Limits::memory_bytes`, for all memories together.
    memory_limit: usize,
    /// The bytes of linear memory granted so far.
    memory_bytes: usize,
    /// The total asked for when the cap was hit.
    exceeded: Option<usize>,
    /// The table elements granted so far, all tables together.
    table_elements: usize,
}

impl CallLimiter {
    fn new(memory_limit: usize) -> Self {
        CallLimiter {
            memory_limit,
            memory_bytes: 0,
            exceeded: None,
            table_elements: 0,
        }
    }
}

/// The most table elements one call may create, all its tables together;
/// generous for any real plugin, small enough that a hostile one cannot use
/// them to exhaust host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        // A new memory comes here too, with `current` 0.
        let total = self
            .memory_bytes
            .saturating_add(desired.saturating_sub(current));
        if total > self.memory_limit {
            self.exceeded = Some(total);
            // Trapping (rather than returning false) stops a plugin that
            // would otherwise retry or limp on without its memory.
            return Err(wasmtime::format_err!("memory cap exceeded"));
        }
        self.memory_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let total = self
            .table_elements
            .saturating_add(desired.saturating_sub(current));
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
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
