//! Where a call's plugin instance comes from: a pool of reused slots sized
//! for the calls that may run at once, or a fresh mapping per call.

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
/// keeps its memory mapped and its pages resident, so an instantiation costs
/// a reset instead of a fresh mapping and page faults. Further calls wait for
/// a slot.
pub(super) const CONCURRENT_CALLS: u32 = 16;

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

pub(super) fn pool_config() -> PoolingAllocationConfig {
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
