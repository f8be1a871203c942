//! Deny-by-default WASI 0.2: what a plugin built by componentize-py or
//! componentize-js (or any `wasm32-wasip2` toolchain) imports, satisfied so
//! that it grants nothing and cannot make a render depend on the machine or
//! the moment.
//!
//! Invariants, for every call of every plugin:
//! - no preopened directory (so no file can be opened), an empty
//!   environment, no arguments, no initial working directory;
//! - sockets always fail: TCP and UDP sockets cannot be created and names
//!   cannot be looked up (`access-denied`), before any host socket exists.
//!   They are linked rather than left out because the toolchains import
//!   them whether or not the plugin uses them;
//! - stdin is empty (closed); stdout and stderr go to the host log, a line
//!   at a time, under the same bounds as the `log` import (shared with it:
//!   4 KiB a line, 64 lines a call);
//! - `exit` ends the call with an error ([`super::CallFailure::Exited`]):
//!   a plugin returns its pod or an error, it does not exit;
//! - the wall clock is fixed at the Unix epoch and the monotonic clock is
//!   frozen at 0; waiting on either is ready at once, so no host thread
//!   ever sleeps for a plugin (wasmtime-wasi's own monotonic clock sleeps
//!   the calling thread in `poll`, where the epoch deadline cannot reach).
//!   A plugin that loops until the clock moves loops in its own code and is
//!   stopped at the epoch deadline like any other loop;
//! - both random sources are the same fixed-seed generator, restarted on
//!   every call: reproducible, not secret (a manifest holds no secrets);
//! - nothing else: an import outside [`WASI_INTERFACES`] is refused at load.
//!
//! The context is made on a call's first WASI import, so a plugin that
//! imports no WASI costs nothing more per call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::HostWallClock;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sockets, sync};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::podstamp::plugin::host::LogLevel;
use super::log::{LogSink, MAX_LOG_LINE};

/// The WASI 0.2 interfaces a plugin may import (any 0.2.x version: the
/// linker matches them semver-compatibly), as `package/interface`: the
/// `wasi:cli/imports` world, which is what the toolchains import. Not
/// `wasi:http`, nor any unstable interface.
pub(super) const WASI_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// Whether `import` (a component's import name) is one of
/// [`WASI_INTERFACES`] at a 0.2 version.
pub(super) fn is_granted(import: &str) -> bool {
    import
        .split_once("@0.2.")
        .is_some_and(|(name, patch)| WASI_INTERFACES.contains(&name) && !patch.is_empty())
}

/// The most random bytes one `get-random-bytes` call may ask for: the host
/// makes them before copying them into the guest, so this bounds what a
/// plugin can make the host allocate (wasmtime-wasi's default is 64 MiB).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The seed of every call's random sources: a constant, so that a render
/// is the same on every run and machine.
const RANDOM_SEED: u64 = 0x706f_6473_7461_6d70; // "podstamp"

/// Links [`WASI_INTERFACES`], each deny-by-default, into the plugins' linker.
pub(super) fn add_to_linker<T: WasiState>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView};

    sync::io::error::add_to_linker::<T, Table>(l, table)?;
    sync::io::poll::add_to_linker::<T, Table>(l, table)?;
    sync::io::streams::add_to_linker::<T, Table>(l, table)?;
    clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    // Ours, not wasmtime-wasi's: see the module's invariants.
    monotonic_clock::add_to_linker::<T, Frozen>(l, |s| FrozenClock(table(s)))?;
    random::random::add_to_linker::<T, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    random::insecure::add_to_linker::<T, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<T, WasiRandom>(l, |s| s.ctx().ctx.random())?;
    cli::environment::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::exit::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_input::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_output::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    filesystem::preopens::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    sync::filesystem::types::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    let network = sockets::network::LinkOptions::default();
    sockets::network::add_to_linker::<T, WasiSockets>(l, &network, T::sockets)?;
    sockets::instance_network::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    sockets::tcp_create_socket::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    sync::sockets::tcp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    // The sync bindings: the async ones make every store async-only, and a
    // sync call of a component importing it fails ("requires that `*_async`
    // functions are used").
    sync::sockets::udp_create_socket::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    sync::sockets::udp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    sockets::ip_name_lookup::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    Ok(())
}

/// A call's WASI context and the table of the resources it handed out.
pub(super) struct Wasi {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl Wasi {
    /// The context that grants nothing, its stdout and stderr logged
    /// through `log`.
    pub(super) fn new(log: &Arc<LogSink>) -> Box<Wasi> {
        let mut builder = WasiCtxBuilder::new();
        // The builder's defaults already give no preopens, no environment,
        // no arguments, a closed stdin and no addresses; what is set here is
        // what they do not, or what this module promises regardless of them.
        builder
            .stdout(LogStream::new(log, "stdout", LogLevel::Info))
            .stderr(LogStream::new(log, "stderr", LogLevel::Warn))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .wall_clock(EpochClock)
            .secure_random(SplitMix64(RANDOM_SEED))
            .insecure_random(SplitMix64(RANDOM_SEED))
            .insecure_random_seed(u128::from(RANDOM_SEED))
            .max_random_size(MAX_RANDOM_BYTES);
        let mut table = ResourceTable::new();
        // As many as the guest's own handles may be (both count the same
        // streams and pollables): a full table is the handle limit.
        table.set_max_capacity(super::MAX_HANDLES_PER_CALL);
        Box::new(Wasi {
            ctx: builder.build(),
            table,
        })
    }
}

/// What a store's data gives this module: its call's WASI context, made on
/// first use. The store's data type is the caller's (`call`), so that this
/// module depends on none of it.
pub(super) trait WasiState: WasiView + Sized + 'static {
    fn wasi(&mut self) -> &mut Wasi;
}

impl Wasi {
    /// The view wasmtime-wasi's bindings take.
    pub(super) fn view(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

fn table<T: WasiState>(state: &mut T) -> &mut ResourceTable {
    &mut state.wasi().table
}

struct Table;

impl HasData for Table {
    type Data<'a> = &'a mut ResourceTable;
}

/// The wall clock: always 1970-01-01T00:00:00Z.
struct EpochClock;

impl HostWallClock for EpochClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The monotonic clock: always at 0, and every wait on it ready at once.
struct FrozenClock<'a>(&'a mut ResourceTable);

struct Frozen;

impl HasData for Frozen {
    type Data<'a> = FrozenClock<'a>;
}

impl FrozenClock<'_> {
    fn ready_now(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let ready = self.0.push(Ready)?;
        wasmtime_wasi::p2::subscribe(self.0, ready)
    }
}

impl monotonic_clock::Host for FrozenClock<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(0)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        _when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.ready_now()
    }

    fn subscribe_duration(
        &mut self,
        _duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.ready_now()
    }
}

/// A pollable that is always ready.
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a fixed algorithm, so that the
/// bytes a seed gives never change with a dependency's version.
struct SplitMix64(u64);

impl rand_core::TryRng for SplitMix64 {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let word = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

/// stdout or stderr: lines to the host log at `level`. Every stream the
/// guest opens on it shares the one pending (unterminated) line, which is
/// logged when the call ends.
struct LogStream {
    pending: Arc<Mutex<PendingLine>>,
}

impl LogStream {
    fn new(log: &Arc<LogSink>, stream: &'static str, level: LogLevel) -> LogStream {
        LogStream {
            pending: Arc::new(Mutex::new(PendingLine {
                log: log.clone(),
                stream,
                level,
                bytes: Vec::new(),
                cut: false,
            })),
        }
    }
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LogWriter(self.pending.clone()))
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only WASI 0.3 (not linked) asks for this one.
        Box::new(tokio::io::sink())
    }
}

struct PendingLine {
    log: Arc<LogSink>,
    stream: &'static str,
    level: LogLevel,
    /// At most `MAX_LOG_LINE` bytes of the line being written.
    bytes: Vec<u8>,
    /// Whether the line being written was longer.
    cut: bool,
}

impl PendingLine {
    fn write(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.push(&bytes[..end]);
            self.emit();
            bytes = &bytes[end + 1..];
        }
        self.push(bytes);
    }

    fn push(&mut self, bytes: &[u8]) {
        let room = MAX_LOG_LINE.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.cut |= bytes.len() > room;
    }

    fn emit(&mut self) {
        let mut line = String::from_utf8_lossy(&self.bytes).into_owned();
        if self.cut {
            line.push('…');
        }
        self.log
            .log(self.level, &format!("{}: {line}", self.stream));
        self.bytes.clear();
        self.cut = false;
    }
}

impl Drop for PendingLine {
    fn drop(&mut self) {
        if !self.bytes.is_empty() || self.cut {
            self.emit();
        }
    }
}

struct LogWriter(Arc<Mutex<PendingLine>>);

/// How much the guest may write at once: writes are never refused, so the
/// permit only sizes the guest's chunks.
const WRITE_PERMIT: usize = 64 << 10;

impl OutputStream for LogWriter {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogWriter {
    async fn ready(&mut self) {}
}
