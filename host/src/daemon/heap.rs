//! The daemon's heap, where the C library's allocator keeps it.
//!
//! A daemon's memory after its first sync is mostly heap the sync no longer
//! needs: the lists of templates and their decoded objects, the renders'
//! texts, the checks' frames. glibc's malloc keeps what was freed for reuse
//! instead of giving it back, and it keeps it per *arena*: a thread that
//! finds the arenas busy makes a new one (up to 8 per core), each holding its
//! own freed memory. podstamp's threads (the reconciler, the runtime's
//! workers, the fsync workers) then pin several half-empty heaps for good:
//! measured after a 1,000-template sync, 23–29 MiB of heap with glibc's
//! defaults against 19 MiB with one arena and the free heap given back
//! (docs/performance.md §3.3).
//!
//! Invariants:
//! - Only the allocator's bookkeeping changes: nothing here frees memory in
//!   use, and a failure of either call changes nothing but the figure.
//! - [`limit_arenas`] runs before the daemon starts a thread (an arena made
//!   before it stays), and yields to an operator's own `GLIBC_TUNABLES`
//!   `glibc.malloc.arena_max`: the tunable set by hand wins. So does
//!   [`fix_mmap_threshold`], to `glibc.malloc.mmap_threshold`.
//! - [`give_back`] is called after a pass that let much go (the first sync),
//!   never on a hot path: `malloc_trim` walks the whole heap.
//! - On a C library other than glibc every call here is a no-op.

/// How many arenas glibc may make. One: the daemon's allocations come
/// from one thread at a time in the main (the reconciler renders one
/// template at a time, the runtime's workers mostly wait), and a thread's
/// small allocations are served from its own cache without the arena's lock.
/// Measured after a 1,000-template sync (release, side by side): one arena
/// kept 18.7–19.0 MiB of heap, two 21.5–21.8 MiB, glibc's default
/// 23.1–29.4 MiB, with the sync's time the same within its noise.
const ARENAS: i32 = 1;

/// Limits glibc's arenas to [`ARENAS`], unless `GLIBC_TUNABLES` already
/// sets `glibc.malloc.arena_max`. Returns the limit set, if one was.
pub fn limit_arenas() -> Option<i32> {
    set(Param::ArenaMax, ARENAS)
}

/// The size from which malloc serves a request with a mapping of its own,
/// unmapped whole when freed: glibc's own starting value. glibc raises its
/// threshold each time such a chunk is freed (up to 32 MiB), so after the
/// first list's large buffers are freed, the next ones (the list's pages,
/// the response bodies, the pass's texts) are carved from the heap, where
/// the long-lived allocations made meanwhile pin them. Setting it fixes
/// it. Measured after a 1,000-template sync (release): heap 13.1 MiB fixed
/// against 15.0 MiB moving (docs/performance.md §3.6).
const MMAP_THRESHOLD: i32 = 128 << 10;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`], unless
/// `GLIBC_TUNABLES` already sets `glibc.malloc.mmap_threshold`. Returns the
/// threshold set, if one was.
pub fn fix_mmap_threshold() -> Option<i32> {
    set(Param::MmapThreshold, MMAP_THRESHOLD)
}

/// A parameter of malloc's that this module sets.
#[derive(Clone, Copy)]
enum Param {
    ArenaMax,
    MmapThreshold,
}

impl Param {
    /// The glibc tunable an operator sets it with.
    fn tunable(self) -> &'static str {
        match self {
            Param::ArenaMax => "glibc.malloc.arena_max",
            Param::MmapThreshold => "glibc.malloc.mmap_threshold",
        }
    }
}

/// Sets `param` to `value`, unless `GLIBC_TUNABLES` already sets it (the
/// tunable set by hand wins). Returns the value set, if one was.
fn set(param: Param, value: i32) -> Option<i32> {
    let tuned =
        std::env::var("GLIBC_TUNABLES").is_ok_and(|tunables| tunables.contains(param.tunable()));
    if tuned {
        return None;
    }
    mallopt(param, value).then_some(value)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallopt(param: Param, value: i32) -> bool {
    let number = match param {
        Param::ArenaMax => libc::M_ARENA_MAX,
        Param::MmapThreshold => libc::M_MMAP_THRESHOLD,
    };
    // SAFETY: mallopt only sets one of malloc's parameters, under its lock.
    unsafe { libc::mallopt(number, value) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn mallopt(_param: Param, _value: i32) -> bool {
    false
}

/// Gives the heap's free memory back to the kernel (glibc's `malloc_trim`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn give_back() {
    // SAFETY: malloc_trim releases only free memory, under malloc's locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn give_back() {}
