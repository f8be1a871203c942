//! How loading a plugin and calling one fail: typed, with the origin named.

use std::time::Duration;

use super::interface::WIT_PACKAGE;

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
        "{origin}: built against podstamp:plugin@{found}, but this podstamp loads podstamp:plugin@0.1.0 and @0.1.1 (it implements {WIT_PACKAGE}); rebuild the plugin with the matching SDK"
    )]
    WrongVersion { origin: String, found: String },
    #[error(
        "{origin}: does not export podstamp:plugin/transformer (@0.1.0 or @0.1.1), so it is not a podstamp plugin (it exports: {exports})"
    )]
    NotAPlugin { origin: String, exports: String },
    #[error(
        "{origin}: imports `{import}`, which podstamp does not provide: plugins get only podstamp:plugin/host (@0.1.0 or @0.1.1) and WASI 0.2's io, clocks, random, cli, filesystem and sockets interfaces, which grant nothing"
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
    #[error(
        "held more than {limit} resource handles at once (the per-call limit); the call was stopped: a plugin must drop the handles it is done with"
    )]
    HandleLimitExceeded { limit: usize },
    #[error("trapped: {trap}{}", plugin_said(.last_error))]
    Trap {
        trap: String,
        last_error: Option<String>,
    },
    #[error(
        "called exit (status {status}) instead of returning: a plugin returns its pod or an error"
    )]
    Exited { status: i32 },
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
