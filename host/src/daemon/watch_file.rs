//! Watches the configuration file and tells the loader when its content
//! changed.
//!
//! The watch is on the file's *directory* (inotify), since every way the
//! file changes shows there: an edit in place (`IN_CLOSE_WRITE` of the
//! file), a file renamed over it (`IN_MOVED_TO`), and the kubelet's update
//! of a mounted ConfigMap, where `config.yaml` is a symlink to
//! `..data/config.yaml` and `..data` a symlink to a timestamped directory
//! that the kubelet swaps by renaming a new `..data_tmp` symlink over it
//! (`IN_MOVED_TO ..data`). A watch on the file itself would follow the old
//! inode and miss the last two.
//!
//! Invariants:
//! * Events are debounced: the file is read once the directory has been
//!   quiet for [`DEBOUNCE`], so a burst (an editor's save, the kubelet's
//!   swap) is one read.
//! * The loader is told only when the content changed (sha256 of the bytes,
//!   read through symlinks): touching the file or rewriting the same bytes
//!   does nothing. A file that cannot be read counts as a change (the
//!   loader then refuses it and says why), once per distinct error.
//! * Every [`PERIODIC`], the loader is told to load again whatever the
//!   events said, in case one was missed (a file outside the directory, such
//!   as a `settingsFile` or a symlink's target, or a lost watch).

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchMask};

use super::inbox::Trigger;
use super::poll::wait_readable;
use crate::config::{Content, content};

/// How long the directory must be quiet before the file is read.
pub const DEBOUNCE: Duration = Duration::from_millis(50);
/// How often the catalog is loaded again without an event.
pub const PERIODIC: Duration = Duration::from_secs(60);
/// Watches `path` until `triggers` closes, on the calling thread. `seen` is
/// the content the catalog in use was loaded from: a difference found when
/// the watch starts is a change too.
pub fn watch(path: PathBuf, seen: Content, triggers: Sender<Trigger>) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mask = WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    let mut inotify = Inotify::init()?;
    let mut watching = add_watch(&inotify, &dir, mask);
    let mut seen = seen;
    let mut buffer = vec![0u8; 16 * 1024];
    let mut next_periodic = Instant::now() + PERIODIC;
    // Watching now: a change since the catalog was read is not missed.
    let mut changed = true;
    loop {
        if changed {
            changed = false;
            let now = content(&path);
            if now != seen {
                let what = match &now {
                    Ok(_) => format!("{} changed", path.display()),
                    Err(e) => format!("{} cannot be read ({e})", path.display()),
                };
                seen = now;
                if triggers.send(Trigger::Changed(what)).is_err() {
                    return Ok(());
                }
            }
        }
        let now = Instant::now();
        if now >= next_periodic {
            next_periodic = now + PERIODIC;
            if !watching {
                watching = add_watch(&inotify, &dir, mask);
            }
            seen = content(&path);
            if triggers.send(Trigger::Periodic).is_err() {
                return Ok(());
            }
        }
        if !wait_readable(
            &inotify,
            Some(next_periodic.saturating_duration_since(Instant::now())),
        )? {
            continue;
        }
        // Something happened in the directory: read every event until it
        // has been quiet for DEBOUNCE, then the file once.
        loop {
            match inotify.read_events(&mut buffer) {
                Ok(events) => {
                    for event in events {
                        changed = true;
                        if event.mask.intersects(
                            EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                        ) {
                            tracing::warn!(dir = %dir.display(),
                                "the configuration file's directory went away; it is read again every {}s",
                                PERIODIC.as_secs());
                            watching = false;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !wait_readable(&inotify, Some(DEBOUNCE))? {
                break;
            }
        }
    }
}

/// Adds the directory watch; false (logged) when it cannot be added.
fn add_watch(inotify: &Inotify, dir: &Path, mask: WatchMask) -> bool {
    match inotify.watches().add(dir, mask) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(dir = %dir.display(),
                "cannot watch the configuration file's directory: {e}; the file is read again every {}s",
                PERIODIC.as_secs());
            false
        }
    }
}
