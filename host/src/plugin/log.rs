//! Where a call's log lines go: the host log, tagged with the plugin and
//! what it renders, bounded per call and per line.
//!
//! One sink serves both ways a plugin writes (its `log` import and, for a
//! WASI plugin, its stdout and stderr): the bounds hold whichever it uses.

use std::sync::atomic::{AtomicU32, Ordering};

use super::bindings::podstamp::plugin::host::LogLevel;

/// Where a call's log lines go: the host log, tagged with the plugin and
/// what it renders, at most [`MAX_LOG_LINES_PER_CALL`] of them whichever way
/// the plugin writes them (shared with its WASI stdout and stderr).
pub(super) struct LogSink {
    plugin: String,
    subject: String,
    lines: AtomicU32,
}

impl LogSink {
    /// A sink for one call of `plugin` rendering `subject`.
    pub(super) fn new(plugin: String, subject: String) -> LogSink {
        LogSink {
            plugin,
            subject,
            lines: AtomicU32::new(0),
        }
    }
}

impl LogSink {
    /// Logs `message`, cut to [`MAX_LOG_LINE`]; false when the call is over
    /// its lines and it was dropped.
    pub(super) fn log(&self, level: LogLevel, message: &str) -> bool {
        let lines = self.lines.fetch_add(1, Ordering::Relaxed) + 1;
        if lines > MAX_LOG_LINES_PER_CALL {
            if lines == MAX_LOG_LINES_PER_CALL + 1 {
                tracing::warn!(plugin = %self.plugin, subject = %self.subject, "plugin logged over {MAX_LOG_LINES_PER_CALL} lines in one call; dropping the rest");
            }
            return false;
        }
        let message = if message.len() > MAX_LOG_LINE {
            let mut cut = message[..message.floor_char_boundary(MAX_LOG_LINE)].to_string();
            cut.push('…');
            std::borrow::Cow::Owned(cut)
        } else {
            std::borrow::Cow::Borrowed(message)
        };
        let (plugin, subject) = (&self.plugin, &self.subject);
        match level {
            LogLevel::Error => tracing::error!(plugin, subject, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, subject, "{message}"),
            LogLevel::Info => tracing::info!(plugin, subject, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, subject, "{message}"),
            LogLevel::Trace => tracing::trace!(plugin, subject, "{message}"),
        }
        true
    }
}

pub(super) const MAX_LOG_LINE: usize = 4096;
const MAX_LOG_LINES_PER_CALL: u32 = 64;
