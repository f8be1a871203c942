//! Rollout Events that could not be published (the API server down: the
//! rule when the template rolled out is the API server itself), kept on disk
//! until they can be: a rollback decided from the node's own evidence is
//! still announced once the API answers again, also after a restart of
//! podstamp in between.
//!
//! Layout: `<revisions dir>/<namespace>_<template>/events.json`, beside the
//! template's kept revisions, outside the kubelet's directory: a JSON list
//! of the Events, oldest first.
//!
//! Invariants:
//! * Written like the rollout states ([`super::rollout_file`],
//!   [`crate::write`]: dot-temp file, fsync, rename, directory fsync; mode
//!   0600).
//! * Bounded: at most [`MAX_KEPT`] Events per template, the oldest dropped
//!   first (a rollout's story is its last Events).
//! * An Event is removed only once the API server accepted it; one that
//!   fails again stays, in order, for the next try.
//! * A file that cannot be parsed is reported (naming it) and replaced by
//!   the next Event kept: an Event lost, never a stuck publisher.

use std::io;
use std::path::{Path, PathBuf};

use crate::write;

/// The file's name in a template's revisions directory.
pub const FILE: &str = "events.json";
/// Events kept per template at most.
pub const MAX_KEPT: usize = 16;

/// One Event kept for later.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    /// The PodTemplate's namespace and name.
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// `RolloutFailed`, `RolloutSucceeded`, `RolloutHalted`,
    /// `KubeletNotStarted`.
    pub reason: String,
    pub note: String,
    /// When it happened (RFC 3339), said in the note when published late.
    pub at: String,
}

/// The outbox of every template, under the revisions directory.
#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
}

impl Outbox {
    pub fn new(dir: &Path) -> Outbox {
        Outbox {
            dir: dir.to_path_buf(),
        }
    }

    fn template_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.dir.join(format!("{namespace}_{name}"))
    }

    /// Keeps `event` after those already kept for its template.
    pub fn keep(&self, event: Kept) -> io::Result<()> {
        let dir = self.template_dir(&event.namespace, &event.name);
        std::fs::create_dir_all(&dir)?;
        let mut kept = load(&dir).unwrap_or_default();
        kept.push(event);
        let over = kept.len().saturating_sub(MAX_KEPT);
        kept.drain(..over);
        save(&dir, &kept)
    }

    /// Every template directory with Events kept, and its Events.
    pub fn pending(&self) -> Vec<(PathBuf, Vec<Kept>)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let dir = entry.path();
            if !dir.join(FILE).exists() {
                continue;
            }
            match load(&dir) {
                Ok(kept) if !kept.is_empty() => out.push((dir, kept)),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot read the Events kept for later: {e}"),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The first `published` of the Events kept in `dir` were published.
    pub fn published(&self, dir: &Path, published: usize) -> io::Result<()> {
        let mut kept = load(dir).unwrap_or_default();
        kept.drain(..published.min(kept.len()));
        if kept.is_empty() {
            match std::fs::remove_file(dir.join(FILE)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => return Ok(()),
            }
        }
        save(dir, &kept)
    }
}

/// The Events kept in the template directory `dir` (none without a file).
pub fn load(dir: &Path) -> Result<Vec<Kept>, String> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "{}: {e}; it is replaced by the next Event kept",
                path.display()
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn save(dir: &Path, kept: &[Kept]) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(kept).map_err(io::Error::other)?;
    bytes.push(b'\n');
    write::write_atomic(dir, FILE, &bytes).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(note: &str) -> Kept {
        Kept {
            namespace: "ns".into(),
            name: "web".into(),
            uid: None,
            reason: "RolloutFailed".into(),
            note: note.into(),
            at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn kept_events_come_back_in_order_bounded_and_go_once_published() {
        let root = tempfile::tempdir().unwrap();
        let outbox = Outbox::new(root.path());
        assert!(outbox.pending().is_empty());
        for i in 0..MAX_KEPT + 2 {
            outbox.keep(event(&format!("n{i}"))).unwrap();
        }
        let pending = outbox.pending();
        assert_eq!(pending.len(), 1);
        let (dir, kept) = &pending[0];
        assert_eq!(dir, &root.path().join("ns_web"));
        assert_eq!(kept.len(), MAX_KEPT);
        assert_eq!(kept[0].note, "n2", "the oldest dropped first");
        outbox.published(dir, MAX_KEPT - 1).unwrap();
        assert_eq!(load(dir).unwrap()[0].note, format!("n{}", MAX_KEPT + 1));
        outbox.published(dir, 1).unwrap();
        assert!(!dir.join(FILE).exists());
        assert!(outbox.pending().is_empty());
    }
}
