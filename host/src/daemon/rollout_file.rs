//! The file of what a template's rollouts leave for the next start of the
//! daemon ([`super::rollout::RolloutState`]): the
//! last revision that succeeded on this node, the failed revision that is
//! held (not written again while the template renders it), and the revision
//! this daemon wrote whose rollout has no verdict yet. Without it a restart
//! would write a held revision again (and the kubelet would run a broken pod
//! once more), roll back to a revision never confirmed, or take its own
//! write for one found in place.
//!
//! Layout: `<revisions dir>/<namespace>_<template>/rollout.json`, next to the
//! kept revisions ([`super::revisions`]), whose file names it cannot take
//! (those end in `.yaml`).
//!
//! Invariants:
//! * Outside the kubelet's directory, written like the manifests and the
//!   history ([`crate::write`]): a dot-temp file (which
//!   [`super::revisions::Store::open`] removes at start should a crash leave
//!   one), fsynced, renamed into place, the directory fsynced; mode 0600.
//! * Read once per template and run, then kept in memory: it is written
//!   only when it changes.
//! * A file that cannot be read or parsed is reported (naming it) and read
//!   as empty: the daemon then behaves as before it kept one (the failed
//!   revision may be written once more, and rolled back once more), never
//!   worse.

use std::io;
use std::path::Path;

use super::rollout::RolloutState as State;
use crate::write;

/// The file's name in a template's revisions directory.
pub const FILE: &str = "rollout.json";

/// Why a state file was read as empty.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: {source}; delete it (the failed revision it holds may then be written once more)"
    )]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The state kept in the template directory `dir`; empty when there is none.
pub fn load(dir: &Path) -> Result<State, LoadError> {
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
        Err(source) => {
            return Err(LoadError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes).map_err(|source| LoadError::Parse {
        path: path.display().to_string(),
        source,
    })
}

/// Replaces the state in the template directory `dir` (which exists).
pub fn save(dir: &Path, state: &State) -> io::Result<()> {
    write::write_atomic(dir, FILE, &bytes(state)?).map(|_| ())
}

/// The first step of [`save`] ([`write::stage`]): the new state in a
/// dot-temp file, to be synced, committed and its directory synced by the
/// caller. None: the file already holds it.
pub fn stage(dir: &Path, state: &State) -> io::Result<Option<write::Staged>> {
    write::stage(dir, FILE, &bytes(state)?)
}

fn bytes(state: &State) -> io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn saved_state_reads_back_and_nothing_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), State::default());
        let state = State {
            good: Some("aaaa".into()),
            held: Some("bbbb".into()),
            pending: Some("cccc".into()),
            deadline: Some(90),
            failed: Some(crate::fleet::Failed {
                target: "t1".into(),
                change: Some("c1".into()),
                ..crate::fleet::Failed::default()
            }),
        };
        save(dir.path(), &state).unwrap();
        assert_eq!(load(dir.path()).unwrap(), state);
        let meta = std::fs::metadata(dir.path().join(FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Only the file: no temp file left.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_field_of_a_later_version_leaves_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE),
            "{\"good\": \"aaaa\", \"held\": \"bbbb\", \"fromLater\": {\"x\": 1}}",
        )
        .unwrap();
        let state = load(dir.path()).unwrap();
        assert_eq!(state.held.as_deref(), Some("bbbb"));
        assert_eq!(state.good.as_deref(), Some("aaaa"));
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "{\"held\": 3}").unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("rollout.json"), "{e}");
        assert!(e.to_string().contains("delete it"), "{e}");
    }
}
