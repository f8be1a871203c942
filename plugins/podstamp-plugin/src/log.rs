//! Writing to the host's log.
//!
//! Each call is one line in the host's log, tagged with the plugin and the
//! pod. The host cuts lines over 4 KiB and stops listening after 64 lines in
//! one `transform`. The macros [`error!`](crate::error!),
//! [`warn!`](crate::warn!), [`info!`](crate::info!), [`debug!`](crate::debug!)
//! and [`trace!`](crate::trace!) take `format!` arguments.
//!
//! Outside WebAssembly (in a plugin's unit tests) the lines go to stderr.

use std::fmt;

/// How much a log line matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        })
    }
}

/// Writes one line to the host's log.
#[cfg(target_arch = "wasm32")]
pub fn log(level: Level, message: &str) {
    use crate::bindings::podstamp::plugin::host::{self, LogLevel};
    let level = match level {
        Level::Error => LogLevel::Error,
        Level::Warn => LogLevel::Warn,
        Level::Info => LogLevel::Info,
        Level::Debug => LogLevel::Debug,
        Level::Trace => LogLevel::Trace,
    };
    host::log(level, message);
}

/// Writes one line to the host's log (here, outside WebAssembly: to stderr).
#[cfg(not(target_arch = "wasm32"))]
pub fn log(level: Level, message: &str) {
    eprintln!("[plugin {level}] {message}");
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Logs at trace level.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Logs a `format!` message at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::error(&::std::format!($($arg)+)) };
}

/// Logs a `format!` message at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::warn(&::std::format!($($arg)+)) };
}

/// Logs a `format!` message at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::info(&::std::format!($($arg)+)) };
}

/// Logs a `format!` message at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::debug(&::std::format!($($arg)+)) };
}

/// Logs a `format!` message at trace level.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log::trace(&::std::format!($($arg)+)) };
}

#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
/// The line the panic hook logs: `panicked at src/lib.rs:10:5: the message`.
pub(crate) fn panic_line(info: &std::panic::PanicHookInfo<'_>) -> String {
    let message = info.payload_as_str().unwrap_or("(no message)");
    match info.location() {
        Some(at) => format!(
            "panicked at {}:{}:{}: {message}",
            at.file(),
            at.line(),
            at.column()
        ),
        None => format!("panicked: {message}"),
    }
}

/// Makes a panic log its message and location at error level before the
/// plugin aborts (and the host sees a trap). Idempotent; the SDK calls it at
/// the start of every export. Only in WebAssembly: native tests keep the
/// test harness's hook.
pub(crate) fn install_panic_hook() {
    #[cfg(target_arch = "wasm32")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            std::panic::set_hook(Box::new(|info| error(&panic_line(info))));
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn panic_line_has_location_and_message() {
        let line = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let seen = line.clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            *seen.lock().unwrap() = super::panic_line(info);
        }));
        let _ = std::panic::catch_unwind(|| panic!("boom {}", 42));
        std::panic::set_hook(previous);
        let line = line.lock().unwrap().clone();
        assert!(line.starts_with("panicked at "), "{line}");
        assert!(line.contains("log.rs:"), "{line}");
        assert!(line.ends_with(": boom 42"), "{line}");
    }
}
