//! The revision history: the last manifests written for each template, kept
//! outside the kubelet's directory, for rollback and for people to compare.
//!
//! Layout: `DIR/<namespace>_<template>/<seq>-<revision>.yaml`, where `seq`
//! grows by one per revision recorded (namespaces and template names cannot
//! hold `_`, so a directory name is one template's alone). The newest file is
//! the revision last written to the manifest directory.
//!
//! Invariants:
//! * DIR is never the manifest directory nor inside it (the kubelet would
//!   run every revision), nor a symlink; it is created with mode 0700 and
//!   refused at start unless it is a directory owned by this user that
//!   nobody else can write (a hostPath the kubelet creates is 0755); the
//!   directories in it are 0700 and the files 0600, readable by this user
//!   alone, like the manifests.
//! * Files are written as manifests are ([`crate::write`]): a dot-temp file,
//!   synced, renamed into place, the directory synced. The store decides
//!   what each template's history needs (which file to write, rename or
//!   prune) and its writer thread ([`writer`]) does it, behind the pass: a
//!   pass's manifests are in place without waiting for their history. Many
//!   templates at once ([`Store::record_many`]) are one batch, each step
//!   taken for all of them before the next, the syncs in parallel. The
//!   states of many templates ([`Store::save_states`]) are one write, done
//!   before this returns. A revision already kept is never written again;
//!   recorded again (after an older one came back), its file is renamed to
//!   the newest `seq`, not rewritten.
//! * At most `keep` files per template: the oldest go when a new one comes.
//! * What a template keeps is read from disk once, the first time it is
//!   recorded in this run, then kept in an index that each record updates
//!   as it queues its job: a template whose revision did not change costs
//!   no file system access. A job that fails marks its template stale and
//!   the index is read again from disk (after the queue is done).
//! * Reading a kept file waits for the queue ([`writer::Writer::flush`]).
//! * The rollout states of all templates are one file beside the
//!   templates' directories ([`rollout_file`], `rollout-states.jsonl`),
//!   read once at open; a template's directory holds only its revisions
//!   (and its outbox of Events, [`super::outbox`]).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::rollout::RolloutState as State;
use super::rollout_file;
use crate::write;

mod writer;
pub use writer::{Counts, Drain};

/// Why the revisions directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{0}: is the manifest directory or inside it, where the kubelet would run every revision; give a directory outside it (daemon.revisionsDir, --revisions-dir)"
    )]
    InManifestDir(PathBuf),
    #[error("{0}: {1}")]
    Unsafe(PathBuf, String),
    #[error("revisionHistory: must be at least 1 (the revision in use is always kept)")]
    NoHistory,
}

/// One kept revision of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub seq: u64,
    pub revision: String,
    pub file: String,
}

pub struct Store {
    dir: PathBuf,
    keep: usize,
    /// Template id → the revisions it keeps, oldest first, as decided in
    /// this run (their jobs may still be queued).
    index: BTreeMap<String, Vec<Kept>>,
    /// Every template's rollout state, read once.
    states: rollout_file::States,
    /// Does the disk work of the history (dropped last: it finishes first).
    writer: writer::Writer,
}

impl Store {
    /// Checks (creating it if missing) the revisions directory.
    pub fn open(dir: PathBuf, keep: usize, manifest_dir: &Path) -> Result<Store, OpenError> {
        if keep == 0 {
            return Err(OpenError::NoHistory);
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenError::Io { path, source }
        };
        // Refused before anything is created in the manifest directory; and
        // again once created, with symlinks resolved.
        let absolute = |p: &Path| std::path::absolute(p).map_err(io(p));
        if absolute(&dir)?.starts_with(absolute(manifest_dir)?) {
            return Err(OpenError::InManifestDir(dir));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        check_private(&dir)?;
        let real = dir.canonicalize().map_err(io(&dir))?;
        let manifests = manifest_dir.canonicalize().map_err(io(manifest_dir))?;
        if real.starts_with(&manifests) {
            return Err(OpenError::InManifestDir(dir));
        }
        write::remove_stale_temp_files(&dir).map_err(io(&dir))?;
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            if entry.file_type().map_err(io(&dir))?.is_dir() {
                write::remove_stale_temp_files(&entry.path()).map_err(io(&entry.path()))?;
            }
        }
        let (states, unreadable) = rollout_file::States::load(&dir);
        for e in unreadable {
            tracing::error!("cannot read the rollout state: {e}; starting without it");
        }
        let writer = writer::Writer::start(dir.clone());
        Ok(Store {
            dir,
            keep,
            index: BTreeMap::new(),
            states,
            writer,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of template `id` (`namespace/name`).
    pub fn template_dir(&self, id: &str) -> PathBuf {
        template_dir_in(&self.dir, id)
    }

    /// Records that `revision` (with these bytes) is now the template's
    /// manifest, and waits until it is on disk. Returns whether a file was
    /// written.
    pub fn record(&mut self, id: &str, revision: &str, bytes: &[u8]) -> io::Result<bool> {
        match self.plan(id, revision, bytes)? {
            None => Ok(false),
            Some(job) => self
                .writer
                .run_now(vec![job])
                .pop()
                .expect("one outcome a job"),
        }
    }

    /// [`Store::record`] for many templates at once (`(id, revision,
    /// bytes)`, one per template), without waiting: their files are
    /// written behind, in one batch ([`writer`]), and each outcome logged
    /// there. What is returned, in order, is whether each could be
    /// decided (its directory read), a failure logged here already.
    pub fn record_many(&mut self, items: &[(&str, &str, &[u8])]) -> Vec<io::Result<()>> {
        let mut jobs = Vec::new();
        let mut results = Vec::with_capacity(items.len());
        for (id, revision, bytes) in items {
            results.push(self.plan(id, revision, bytes).map(|job| jobs.extend(job)));
        }
        if !jobs.is_empty()
            && let Err(e) = self.writer.send(jobs)
        {
            for result in results.iter_mut().filter(|r| r.is_ok()) {
                *result = Err(io::Error::new(e.kind(), e.to_string()));
            }
        }
        for ((id, revision, _), result) in items.iter().zip(&results) {
            if let Err(e) = result {
                writer::log_failure(id, revision, &self.template_dir(id), e);
            }
        }
        results
    }

    /// What recording `revision` as template `id`'s newest takes on disk;
    /// the index updated as if it were done. None: nothing to do.
    fn plan(&mut self, id: &str, revision: &str, bytes: &[u8]) -> io::Result<Option<writer::Job>> {
        if self.writer.stale(id, true) {
            // Its last job failed: the disk says what it keeps.
            self.writer.flush();
            self.index.remove(id);
        }
        let dir = self.template_dir(id);
        let kept = match self.index.entry(id.to_string()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(kept_on_disk(&dir)?),
        };
        let next = kept.last().map_or(1, |k| k.seq + 1);
        let newest = Kept {
            seq: next,
            revision: revision.to_string(),
            file: file_name(next, revision),
        };
        let change = match kept.iter().position(|k| k.revision == revision) {
            Some(i) if i + 1 == kept.len() => writer::Change::Keep,
            Some(i) => {
                let older = kept.remove(i);
                kept.push(newest.clone());
                writer::Change::Rename {
                    from: older.file,
                    to: newest.file,
                }
            }
            None => {
                kept.push(newest.clone());
                writer::Change::Write {
                    file: newest.file,
                    bytes: bytes.to_vec(),
                }
            }
        };
        let excess = kept.len().saturating_sub(self.keep);
        let prune: Vec<String> = kept.drain(..excess).map(|k| k.file).collect();
        if matches!(change, writer::Change::Keep) && prune.is_empty() {
            return Ok(None);
        }
        Ok(Some(writer::Job {
            id: id.to_string(),
            revision: revision.to_string(),
            dir,
            change,
            prune,
        }))
    }

    /// Waits until every revision recorded so far is on disk.
    pub fn flush(&self) {
        self.writer.flush();
    }

    /// A handle to wait, when stopping, for the history's writes.
    pub fn drain(&self) -> Drain {
        self.writer.drain()
    }

    /// The writer's counts, for `/metrics`.
    pub fn counts(&self) -> std::sync::Arc<Counts> {
        self.writer.counts()
    }

    /// What template `id`'s rollouts left ([`rollout_file`]).
    pub fn state(&mut self, id: &str) -> Result<State, rollout_file::LoadError> {
        let dir = self.template_dir(id);
        self.states.get(id, &dir)
    }

    /// Replaces what template `id`'s rollouts leave for the next start.
    pub fn save_state(&mut self, id: &str, state: &State) -> io::Result<()> {
        self.save_states(&[(id.to_string(), state.clone())])
    }

    /// [`Store::save_state`] for many templates at once: one write of the
    /// one file ([`rollout_file`]), synced, before this returns.
    pub fn save_states(&mut self, states: &[(String, State)]) -> io::Result<()> {
        let root = &self.dir;
        self.states.set_many(states, |id| template_dir_in(root, id))
    }

    /// Removes template `id`'s rollout state (the template is gone); its
    /// kept revisions stay, for people to compare.
    pub fn forget_state(&mut self, id: &str) -> io::Result<()> {
        let dir = self.template_dir(id);
        self.states.forget(id, &dir)
    }

    /// The revisions kept for template `id`, oldest first (as recorded:
    /// some may still be being written).
    pub fn kept(&self, id: &str) -> io::Result<Vec<Kept>> {
        if self.writer.stale(id, false) {
            self.writer.flush();
        } else if let Some(kept) = self.index.get(id) {
            return Ok(kept.clone());
        }
        kept_on_disk(&self.template_dir(id))
    }

    /// The bytes of a kept revision of template `id` (once written).
    pub fn read(&self, id: &str, kept: &Kept) -> io::Result<Vec<u8>> {
        self.writer.flush();
        fs::read(self.template_dir(id).join(&kept.file))
    }
}

/// The revisions in a template's directory, oldest first; none if it does
/// not exist yet.
fn kept_on_disk(dir: &Path) -> io::Result<Vec<Kept>> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(io::Error::other(format!(
                "{} is not a directory; remove it",
                dir.display()
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    let mut kept = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if let Some(k) = parse_file_name(&name) {
            kept.push(k);
        }
    }
    kept.sort_by_key(|k| k.seq);
    Ok(kept)
}

/// The directory of template `id` (`namespace/name`) in the revisions
/// directory `root`: `<namespace>_<name>`.
fn template_dir_in(root: &Path, id: &str) -> PathBuf {
    root.join(id.replacen('/', "_", 1))
}

fn file_name(seq: u64, revision: &str) -> String {
    format!("{seq:08}-{revision}.yaml")
}

fn parse_file_name(name: &str) -> Option<Kept> {
    let (seq, revision) = name.strip_suffix(".yaml")?.split_once('-')?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) || revision.is_empty() {
        return None;
    }
    Some(Kept {
        seq: seq.parse().ok()?,
        revision: revision.to_string(),
        file: name.to_string(),
    })
}

/// A directory (not a symlink) owned by this user, private to it.
fn check_private(dir: &Path) -> Result<(), OpenError> {
    let meta = fs::symlink_metadata(dir).map_err(|source| OpenError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let unsafe_ = |why: String| Err(OpenError::Unsafe(dir.to_path_buf(), why));
    if !meta.is_dir() {
        return unsafe_("is not a directory (a symlink is refused too); give a directory".into());
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return unsafe_(format!(
            "is owned by uid {}, not by this user (uid {me}); chown it or give another directory",
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return unsafe_(format!(
            "mode is {:o}: others can write it; chmod go-w it (or 700)",
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(keep: usize) -> (tempfile::TempDir, Store) {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("manifests")).unwrap();
        let store = Store::open(
            root.path().join("var/revisions"),
            keep,
            &root.path().join("manifests"),
        )
        .unwrap();
        (root, store)
    }

    /// The files template `id` keeps, by the index.
    pub(super) fn names(store: &Store, id: &str) -> Vec<String> {
        store
            .kept(id)
            .unwrap()
            .into_iter()
            .map(|k| k.file)
            .collect()
    }

    #[test]
    fn keeps_the_last_n_and_never_rewrites_a_revision() {
        let (_root, mut store) = store(3);
        let id = "kube-system/web";
        assert!(store.record(id, "aaaa", b"a").unwrap());
        assert!(!store.record(id, "aaaa", b"a").unwrap());
        for (rev, bytes) in [("bbbb", b"b"), ("cccc", b"c"), ("dddd", b"d")] {
            assert!(store.record(id, rev, bytes).unwrap());
            assert!(store.kept(id).unwrap().len() <= 3);
        }
        assert_eq!(
            names(&store, id),
            [
                "00000002-bbbb.yaml",
                "00000003-cccc.yaml",
                "00000004-dddd.yaml"
            ]
        );
        let dir = store.template_dir(id);
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // An older revision back: renamed to the newest, not rewritten.
        let before = fs::metadata(dir.join("00000002-bbbb.yaml")).unwrap().ino();
        assert!(!store.record(id, "bbbb", b"b").unwrap());
        assert_eq!(
            names(&store, id),
            [
                "00000003-cccc.yaml",
                "00000004-dddd.yaml",
                "00000005-bbbb.yaml"
            ]
        );
        assert_eq!(
            fs::metadata(dir.join("00000005-bbbb.yaml")).unwrap().ino(),
            before
        );
        // A restarted daemon finds the newest in place: no write.
        let mut again = Store::open(
            store.dir().to_path_buf(),
            3,
            &_root.path().join("manifests"),
        )
        .unwrap();
        assert!(!again.record(id, "bbbb", b"b").unwrap());
        assert_eq!(again.read(id, &again.kept(id).unwrap()[2]).unwrap(), b"b");
        // Only our files, no temp files left.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 3);
    }

    /// The files in template `id`'s directory.
    pub(super) fn on_disk(store: &Store, id: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(store.template_dir(id))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Recorded behind the pass: the index answers at once; the files land
    /// in the order recorded once the writer is done, a template's jobs in
    /// batches of their own and many templates' in one; a dropped store
    /// finishes its queue first.
    #[test]
    fn revisions_recorded_behind_land_in_order() {
        use std::sync::atomic::Ordering::SeqCst;
        let (root, mut store) = store(2);
        let id = "ns/t";
        for rev in ["a1", "b2", "c3", "d4"] {
            let results = store.record_many(&[(id, rev, rev.as_bytes())]);
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        let others: Vec<(String, String)> = (0..300)
            .map(|i| (format!("ns/m{i}"), format!("r{i}")))
            .collect();
        let items: Vec<(&str, &str, &[u8])> = others
            .iter()
            .map(|(id, rev)| (id.as_str(), rev.as_str(), rev.as_bytes()))
            .collect();
        store.record_many(&items);
        let newest = ["00000003-c3.yaml", "00000004-d4.yaml"];
        assert_eq!(names(&store, id), newest, "from the index");
        store.flush();
        assert_eq!(on_disk(&store, id), newest);
        assert_eq!(on_disk(&store, "ns/m299"), ["00000001-r299.yaml"]);
        let kept = store.kept(id).unwrap();
        assert_eq!(store.read(id, &kept[1]).unwrap(), b"d4");
        let counts = store.counts();
        assert_eq!(counts.queued.load(SeqCst), 0);
        assert_eq!(counts.done.load(SeqCst), 304);
        assert_eq!(counts.failed.load(SeqCst), 0);
        // Dropped with work queued: it is done first.
        let mut again =
            Store::open(store.dir().to_path_buf(), 2, &root.path().join("manifests")).unwrap();
        again.record_many(&[(id, "e5", b"e5")]);
        drop(again);
        assert_eq!(
            on_disk(&store, id),
            ["00000004-d4.yaml", "00000005-e5.yaml"]
        );
    }

    #[test]
    fn a_smaller_history_prunes_at_the_next_record() {
        let (root, mut store) = store(3);
        let id = "ns/t";
        for rev in ["a1", "b2", "c3"] {
            store.record(id, rev, rev.as_bytes()).unwrap();
        }
        let mut one =
            Store::open(store.dir().to_path_buf(), 1, &root.path().join("manifests")).unwrap();
        one.record(id, "d4", b"d4").unwrap();
        assert_eq!(names(&one, id), ["00000004-d4.yaml"]);
    }

    #[test]
    fn the_manifest_dir_and_unsafe_dirs_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let manifests = root.path().join("manifests");
        fs::create_dir(&manifests).unwrap();
        for inside in [manifests.clone(), manifests.join("revisions")] {
            let e = Store::open(inside, 3, &manifests).err().unwrap();
            assert!(matches!(e, OpenError::InManifestDir(_)), "{e}");
        }
        // Through a symlink into it.
        std::os::unix::fs::symlink(&manifests, root.path().join("link")).unwrap();
        let e = Store::open(root.path().join("link"), 3, &manifests)
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Unsafe(..)), "{e}");
        let open = root.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o775)).unwrap();
        let e = Store::open(open.clone(), 3, &manifests).err().unwrap();
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        // As the kubelet makes a hostPath: fine.
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
        Store::open(open, 3, &manifests).unwrap();
        let e = Store::open(root.path().join("r"), 0, &manifests)
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::NoHistory), "{e}");
    }
}
