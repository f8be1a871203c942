//! Where a call's plugin instance comes from: a pool of reused slots sized
//! for the calls that may run at once, or a fresh mapping per call.

use std::sync::{Condvar, Mutex, MutexGuard};

use wasmtime::{Enabled, PoolingAllocationConfig};

/// Where a call's plugin instance (its memories, tables) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Reused slots of a pool reserved when the runtime starts.
    Pooled,
    /// Mapped for each call and unmapped after it.
    OnDemand,
}

/// Calls that may run at once on one runtime. Every call instantiates its
/// plugin afresh, from a pool of this many instance slots: a reused slot
/// keeps its memory mapped, so an instantiation costs a reset instead of a
/// fresh mapping (see [`KEEP_RESIDENT`] for what the reset does). Further
/// calls wait for a slot.
pub(super) const CONCURRENT_CALLS: u32 = 16;

/// Per call, the core instances, memories and tables a plugin component may
/// have: far more than a component made from one Rust, C or Go module needs
/// (one main module, a few adapter shims).
const CORE_INSTANCES_PER_CALL: u32 = 16;
const MEMORIES_PER_CALL: u32 = 4;
const TABLES_PER_CALL: u32 = 8;

/// How a slot's linear memory is made new again between two calls: none of
/// it is kept resident, so wasmtime hands the whole accessible memory back
/// to the kernel with `madvise(MADV_DONTNEED)`, which drops every page of
/// it, present or swapped out, and the next call reads zeros (or the
/// module's data image, copy-on-write) whatever the kernel did with the
/// pages meanwhile. Its cost is the page faults of the next call.
///
/// Not PAGEMAP_SCAN with pages kept resident (what this pool did before):
/// the scan resets in place only the dirty pages that are *present*, and
/// decommits nothing before where it stopped, so a dirty page the kernel
/// swapped out is neither reset nor released and the next call in the slot
/// reads the previous call's data (wasmtime 48's `reset_with_pagemap`; see
/// bytecodealliance/wasmtime#14357, "reset dirty pages that are not
/// present", open when this was written). A plugin sees the pods and
/// settings of other templates, so this must hold on a node that swaps.
///
/// Keeping pages resident *without* the scan would be safe too (wasmtime
/// then memsets the first bytes of the memory, swapped or not), but a Rust
/// plugin's hot pages are its stack's top and its heap above the first
/// MiB, so the memset clears megabytes it never touched on every call:
/// measured with 1.25 and 2 MiB kept, no faster than the faults it saves
/// (docs/performance.md §3.9).
const KEEP_RESIDENT: usize = 0;

pub(super) fn pool_config() -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(CONCURRENT_CALLS)
        .total_core_instances(CONCURRENT_CALLS * CORE_INSTANCES_PER_CALL)
        .max_core_instances_per_component(CORE_INSTANCES_PER_CALL)
        .total_memories(CONCURRENT_CALLS * MEMORIES_PER_CALL)
        .max_memories_per_component(MEMORIES_PER_CALL)
        .total_tables(CONCURRENT_CALLS * TABLES_PER_CALL)
        .max_tables_per_component(TABLES_PER_CALL)
        // Said explicitly, not left to the defaults: both must stay so for
        // the reset above to hold (tables and their reset keep the defaults:
        // nothing resident, no scan).
        .pagemap_scan(Enabled::No)
        .linear_memory_keep_resident(KEEP_RESIDENT);
    // The largest memory a slot holds stays the engine's default (4 GiB):
    // a component whose memory starts larger than `Limits::memory_bytes` is
    // refused by the memory limiter when it is instantiated, with the
    // message every other memory failure has.
    pool
}

/// Admits at most one call per pool slot ([`CONCURRENT_CALLS`]): a call
/// beyond waits for one to end instead of failing to instantiate.
pub(super) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

/// A slot held by a call; given back when dropped.
pub(super) struct Slot<'a>(&'a Slots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.lock() += 1;
        self.0.freed.notify_one();
    }
}

impl Slots {
    pub(super) fn new(slots: u32) -> Slots {
        Slots {
            free: Mutex::new(slots as usize),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        // A count stays consistent even if a holder panicked.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a free slot and takes it.
    pub(super) fn acquire(&self) -> Slot<'_> {
        let mut free = self.lock();
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}
