//! Waiting for a descriptor (an inotify instance) to become readable, with
//! a timeout: the one blocking wait the file and directory watchers share.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// Waits until `fd` is readable or `timeout` passes (None: no timeout);
/// whether it is readable. A signal ending the wait early is "not yet":
/// callers loop and compute what is left of their own deadlines.
pub fn wait_readable(fd: &impl AsRawFd, timeout: Option<Duration>) -> std::io::Result<bool> {
    // At least 1 ms: a timeout rounded down to 0 would make poll return at
    // once and the caller spin.
    let millis = timeout.map_or(-1, |t| {
        i32::try_from(t.as_millis().max(1)).unwrap_or(i32::MAX)
    });
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let r = unsafe { libc::poll(&mut poll, 1, millis) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok(false);
    }
    Ok(r > 0)
}
