//! The daemon's open file limit.
//!
//! Every connection to the metrics port, template file read and manifest
//! write takes a file descriptor, and the soft limit a daemon starts with
//! (1024, or less in some containers) is often far below the hard limit it
//! may raise it to. podstamp raises the soft limit to the hard one at start
//! (it never uses select(2), so a high limit is safe), and the metrics
//! server's connection cap is derived from the result, so that clients of
//! the metrics port can never take the descriptors the rest of the daemon
//! needs.

use std::io;

/// The soft open file limit before and after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    pub before: u64,
    pub now: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(OpenFileLimit {
            before,
            now: before,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OpenFileLimit {
        before,
        now: limit.rlim_max,
    })
}

/// The most connections the metrics server holds at once with `nofile`
/// descriptors: a quarter of them, at most 64 (Prometheus and the kubelet's
/// probes need a few), at least 1.
pub fn max_connections(nofile: u64) -> usize {
    usize::try_from((nofile / 4).clamp(1, 64)).unwrap_or(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_most_descriptors_to_the_daemon() {
        assert_eq!(max_connections(1024), 64);
        assert_eq!(max_connections(256), 64);
        assert_eq!(max_connections(64), 16);
        assert_eq!(max_connections(2), 1);
    }
}
