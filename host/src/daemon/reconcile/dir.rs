//! The manifest directory, as the reconciler keeps it: which files are
//! ours, which of ours are garbage, and when its changes are durable.
//!
//! Invariants: a file is read only as a regular file (never through a
//! symlink, never one larger than [`MAX_SCANNED_FILE`]); a file is ours only
//! when its `podstamp.io/source` names a template of the daemon's namespace,
//! and is removed only while it still is, as read just before.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{Reconciler, SourceError};
use crate::manifest;
use crate::write;

/// Files larger than this in the manifest directory are not read for
/// ownership (no manifest podstamp writes is near it).
const MAX_SCANNED_FILE: u64 = 16 << 20;

/// The manifests of ours in `dir` (file name → `podstamp.io/source`): those
/// whose source is a template of `namespace`. A manifest edited by hand is
/// said so; it stays ours.
pub(super) fn ours(dir: &Path, namespace: &str) -> std::io::Result<BTreeMap<String, String>> {
    let mut owned = BTreeMap::new();
    let prefix = format!("{namespace}/");
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.starts_with('.') || !entry.file_type()?.is_file() {
            continue;
        }
        let Some(bytes) = read_regular(&dir.join(&name)) else {
            continue;
        };
        if let Some(o) = manifest::ownership(&bytes)
            && o.source.starts_with(&prefix)
        {
            if !o.intact {
                tracing::warn!(file = %name, source = %o.source,
                    "manifest was edited by hand; it will be overwritten when its template is next rendered");
            }
            owned.insert(name, o.source);
        }
    }
    Ok(owned)
}

impl Reconciler {
    /// Makes this pass's renames and removals durable; tried again on the
    /// next pass if it fails.
    pub(super) fn sync_dir(&mut self) {
        if !self.dir_unsynced {
            return;
        }
        match write::sync_dir(&self.dir) {
            Ok(()) => self.dir_unsynced = false,
            Err(e) => tracing::error!(dir = %self.dir.display(),
                "cannot sync the manifest directory: {e}; the manifests are in place, but a crash now could undo their latest changes"),
        }
    }

    /// Removes our manifests whose template is gone (or not for this node).
    pub(super) fn collect_garbage(&mut self) {
        // A template file that could not be read, and was never read, may be
        // any template: removing a manifest now could remove its.
        if self.entries.values().any(|e| {
            e.id.is_none() && matches!(e.incoming.template, Err(SourceError::Unreadable(_)))
        }) {
            tracing::debug!(
                "a template file could not be read yet; garbage collection waits for it"
            );
            self.gc_due = true;
            return;
        }
        // A template that is not for this node is as good as gone here.
        let live: BTreeSet<&str> = self
            .entries
            .values()
            .filter(|e| !e.off_node)
            .filter_map(|e| e.id.as_deref())
            .collect();
        // (template, file) each template wrote; a template that wrote its
        // manifest makes any other file of ours naming it a stale duplicate
        // (say, one renamed by hand).
        let claimed: BTreeSet<(&str, &str)> = self
            .claims
            .iter()
            .filter_map(|(key, file)| Some((self.entries.get(key)?.id.as_deref()?, file)))
            .collect();
        let claiming: BTreeSet<&str> = claimed.iter().map(|(id, _)| *id).collect();
        let stale: Vec<(String, String)> = self
            .owned
            .iter()
            .filter(|(file, source)| {
                !live.contains(source.as_str())
                    || (claiming.contains(source.as_str())
                        && !claimed.contains(&(source.as_str(), file.as_str())))
            })
            .map(|(f, s)| (f.clone(), s.clone()))
            .collect();
        for (file, source) in stale {
            let path = self.dir.join(&file);
            // Only what still is ours, as a regular file, is removed.
            let still_ours = read_regular(&path)
                .and_then(|bytes| manifest::ownership(&bytes))
                .is_some_and(|o| o.source == source);
            if still_ours {
                match fs::remove_file(&path) {
                    Ok(()) => {
                        self.dir_unsynced = true;
                        tracing::info!(file = %file, template = %source, "removed manifest: its template is gone, is not for this node, or wrote its manifest under another name");
                        self.metrics.removed();
                    }
                    Err(e) => {
                        tracing::error!(file = %file, "cannot remove manifest: {e}");
                        continue;
                    }
                }
            }
            self.owned.remove(&file);
            self.claims.release_file(&file);
        }
    }
}

/// A regular file's content, never through a symlink; None otherwise.
pub(super) fn read_regular(path: &Path) -> Option<Vec<u8>> {
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_SCANNED_FILE {
        return None;
    }
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_SCANNED_FILE)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}
