//! Watching a daemon from outside: its /readyz, and the manifests renamed
//! into place in its directory (inotify IN_MOVED_TO, the moment the kubelet
//! could see them).

use std::fs;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use inotify::{Inotify, WatchDescriptor, WatchMask};

use crate::support::Daemon;

/// Polls /readyz every 5 ms until 200: the time since `since`; None after
/// `limit`.
pub fn time_to_ready(daemon: &Daemon, since: Instant, limit: Duration) -> Option<Duration> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if daemon.get("/readyz").is_some_and(|(code, _)| code == 200) {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Renames into place (IN_MOVED_TO) in a set of directories, or the events
/// of [`Renames::watch_for`]'s mask.
pub struct Renames {
    inotify: Inotify,
    dirs: Vec<PathBuf>,
    watches: Vec<WatchDescriptor>,
    buffer: Vec<u8>,
}

impl Renames {
    pub fn watch(dirs: &[PathBuf]) -> Renames {
        Renames::watch_for(dirs, WatchMask::MOVED_TO)
    }

    /// The events of `mask` (e.g. also IN_CREATE) in every one of `dirs`.
    pub fn watch_for(dirs: &[PathBuf], mask: WatchMask) -> Renames {
        let inotify = Inotify::init().expect("inotify");
        let watches = dirs
            .iter()
            .map(|d| inotify.watches().add(d, mask).expect("inotify watch"))
            .collect();
        Renames {
            inotify,
            dirs: dirs.to_vec(),
            watches,
            buffer: vec![0; 256 * 1024],
        }
    }

    /// The next renames: (directory index, file name, when seen); empty once
    /// `deadline` passed.
    pub fn next(&mut self, deadline: Instant) -> Vec<(usize, String, Instant)> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            let wait = (deadline - now).as_millis().clamp(1, 1000) as i32;
            let mut poll = libc::pollfd {
                fd: self.inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            if unsafe { libc::poll(&mut poll, 1, wait) } <= 0 {
                continue;
            }
            let when = Instant::now();
            let mut out = Vec::new();
            match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => {
                    for event in events {
                        if let (Some(i), Some(name)) =
                            (self.watches.iter().position(|w| *w == event.wd), event.name)
                        {
                            out.push((i, name.to_string_lossy().into_owned(), when));
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("inotify: {e}"),
            }
            if !out.is_empty() {
                return out;
            }
        }
    }

    /// Waits until `file`, holding `marker`, is renamed into place in every
    /// directory: the time each took since `t0`, None if not by `deadline`.
    pub fn wait_marker(
        &mut self,
        file: &str,
        marker: &str,
        t0: Instant,
        deadline: Instant,
    ) -> Vec<Option<Duration>> {
        let mut took = vec![None; self.dirs.len()];
        while took.iter().any(Option::is_none) {
            let batch = self.next(deadline);
            if batch.is_empty() {
                break;
            }
            for (i, name, when) in batch {
                if name == file
                    && took[i].is_none()
                    && fs::read_to_string(self.dirs[i].join(&name))
                        .is_ok_and(|text| text.contains(marker))
                {
                    took[i] = Some(when - t0);
                }
            }
        }
        took
    }
}
