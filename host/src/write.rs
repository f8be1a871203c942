//! The write stage: replacing a manifest file atomically.
//!
//! The kubelet reads every file in its manifest directory whose name does not
//! start with a dot, whenever it likes. So a manifest is written to a
//! dot-prefixed temporary file in the same directory, synced, renamed over the
//! old one and the directory synced: the kubelet sees the old file or the new
//! one, never half of one. Identical content is not rewritten, so the kubelet
//! has no reason to restart the pod.
//!
//! Many files at once (a pass of the daemon) are written in three steps, so
//! that the disk's flushes are shared rather than paid one after another:
//! [`stage`] every file (the dot-temp file written, not yet synced), then
//! [`sync_staged`] them all (fsyncs in parallel threads: the file system
//! commits them in a few journal transactions instead of one each), then
//! [`Staged::commit`] each (the rename) and [`sync_dirs`] once per
//! directory. The guarantee is the same as one file's: a rename happens only
//! after its file's fsync returned, so a crash at any point leaves under each
//! name the old file or the new one, whole, plus dot-temp files the kubelet
//! ignores and the next start removes ([`remove_stale_temp_files`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Prefix of podstamp's temporary files; the kubelet ignores dot-files.
pub const TEMP_PREFIX: &str = ".podstamp-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Written,
    Unchanged,
}

/// Writes `bytes` to `dir/file_name` atomically, with mode 0600, unless the
/// file already holds exactly these bytes. Refuses to replace a symlink or
/// anything else that is not a regular file. The directory is synced before
/// this returns.
pub fn write_atomic(dir: &Path, file_name: &str, bytes: &[u8]) -> io::Result<Outcome> {
    let outcome = replace(dir, file_name, bytes)?;
    if outcome == Outcome::Written {
        sync_dir(dir)?;
    }
    Ok(outcome)
}

/// [`write_atomic`] but for the sync of the directory: the file is whole on
/// disk before it is renamed into place, but the rename itself is durable
/// only after [`sync_dir`]. For many files at once, one directory sync then
/// serves them all.
pub fn replace(dir: &Path, file_name: &str, bytes: &[u8]) -> io::Result<Outcome> {
    match stage(dir, file_name, bytes)? {
        None => Ok(Outcome::Unchanged),
        Some(staged) => staged.commit().map(|()| Outcome::Written),
    }
}

/// The first step of [`replace`]: checks the target as [`replace`] does and
/// writes `bytes` to a dot-temp file beside it, not synced. None: the target
/// already holds exactly these bytes (nothing is written).
pub fn stage(dir: &Path, file_name: &str, bytes: &[u8]) -> io::Result<Option<Staged>> {
    if file_name.is_empty() || file_name.starts_with('.') || file_name.contains('/') {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{file_name:?} is not a manifest file name"),
        ));
    }
    let target = dir.join(file_name);
    match fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(io::Error::new(
                ErrorKind::AlreadyExists,
                format!("{} is a symlink; refusing to replace it", target.display()),
            ));
        }
        Ok(meta) if !meta.is_file() => {
            return Err(io::Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} is not a regular file; refusing to replace it",
                    target.display()
                ),
            ));
        }
        Ok(meta) if meta.len() == bytes.len() as u64 && holds(&target, bytes)? => {
            return Ok(None);
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }

    let temp = temp_path(dir, file_name);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)?;
        file.write_all(bytes)?;
        Ok(file)
    })();
    match result {
        Ok(file) => Ok(Some(Staged {
            temp,
            target,
            file: Some(file),
        })),
        Err(e) => {
            let _ = fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// The most files a caller holds staged at once before it syncs them: a
/// staged file is open until its fsync (a low open-file limit must not be
/// met halfway), and 128 fsyncs at once already share their journal
/// commits. The daemon's passes and the revision history's writer both
/// commit at this bound.
pub const MAX_STAGED: usize = 128;

/// A file written under a dot-temp name beside its target, not yet synced
/// nor renamed ([`stage`]). Dropped without [`Staged::commit`], its temp
/// file is removed: the target is left as it was.
#[derive(Debug)]
pub struct Staged {
    temp: PathBuf,
    target: PathBuf,
    /// Open until synced.
    file: Option<File>,
}

impl Staged {
    /// The file it replaces.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes the temp file to disk; [`Staged::commit`] does it first if
    /// this was not done.
    pub fn sync(&mut self) -> io::Result<()> {
        if let Some(file) = &self.file {
            file.sync_all()?;
        }
        self.file = None;
        Ok(())
    }

    /// Syncs the temp file if it is not yet, then renames it over the
    /// target. The rename is durable only after [`sync_dir`] of its
    /// directory.
    pub fn commit(mut self) -> io::Result<()> {
        self.sync()?;
        fs::rename(&self.temp, &self.target)?;
        // Renamed: nothing left to remove on drop.
        self.temp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// The most threads that fsync at once: enough for the file system to
/// gather many flushes per journal commit, few enough to be cheap to start.
const SYNC_THREADS: usize = 16;

/// Syncs every staged file, in parallel threads; the result of each, in
/// order. A file whose sync failed must not be committed.
pub fn sync_staged(staged: &mut [Staged]) -> Vec<io::Result<()>> {
    if staged.len() <= 1 {
        return staged.iter_mut().map(Staged::sync).collect();
    }
    let chunk = staged.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = staged
            .chunks_mut(chunk)
            .map(|part| scope.spawn(move || part.iter_mut().map(Staged::sync).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("an fsync thread does not panic"))
            .collect()
    })
}

/// Syncs each directory (its renames and removals made durable), in
/// parallel threads; the result of each, in order.
pub fn sync_dirs(dirs: &[PathBuf]) -> Vec<io::Result<()>> {
    if dirs.len() <= 1 {
        return dirs.iter().map(|d| sync_dir(d)).collect();
    }
    let chunk = dirs.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = dirs
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(|d| sync_dir(d)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("an fsync thread does not panic"))
            .collect()
    })
}

/// Makes the renames and removals done in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Longest part of the target's name kept in a temp file's name, so that the
/// temp name fits in NAME_MAX (255 bytes) whenever the target's name does.
const TEMP_NAME_PART: usize = 200;

fn temp_path(dir: &Path, file_name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut end = file_name.len().min(TEMP_NAME_PART);
    while !file_name.is_char_boundary(end) {
        end -= 1;
    }
    dir.join(format!(
        "{TEMP_PREFIX}{}.{}.{n}.tmp",
        &file_name[..end],
        std::process::id()
    ))
}

/// Whether the file at `path` (not followed if a symlink) holds exactly
/// `bytes`; read in pieces, since it is usually compared and left alone.
/// Whether `dir/file_name` is a regular file holding exactly `bytes` (then
/// [`replace`] would leave it as it is). Any error reading it: no.
pub fn already_holds(dir: &Path, file_name: &str, bytes: &[u8]) -> bool {
    let path = dir.join(file_name);
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() && meta.len() == bytes.len() as u64 => {
            holds(&path, bytes).unwrap_or(false)
        }
        _ => false,
    }
}

fn holds(path: &Path, mut bytes: &[u8]) -> io::Result<bool> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut buffer = [0u8; 8192];
    loop {
        let n = match file.read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(bytes.is_empty());
        }
        match bytes.strip_prefix(&buffer[..n]) {
            Some(rest) => bytes = rest,
            None => return Ok(false),
        }
    }
}

/// Removes temporary files a crashed podstamp left in `dir`; returns how many.
pub fn remove_stale_temp_files(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(TEMP_PREFIX) && entry.file_type()?.is_file() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn writes_replaces_and_skips_identical_content() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            write_atomic(dir.path(), "a.yaml", b"one").unwrap(),
            Outcome::Written
        );
        let path = dir.path().join("a.yaml");
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            write_atomic(dir.path(), "a.yaml", b"one").unwrap(),
            Outcome::Unchanged
        );
        let again = fs::metadata(&path).unwrap();
        assert_eq!(
            (meta.ino(), meta.mtime_nsec()),
            (again.ino(), again.mtime_nsec())
        );
        assert_eq!(
            write_atomic(dir.path(), "a.yaml", b"two").unwrap(),
            Outcome::Written
        );
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.yaml"], "no temp file is left behind");
    }

    #[test]
    fn refuses_symlinks_and_bad_names() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"keep").unwrap();
        let manifests = dir.path().join("m");
        fs::create_dir(&manifests).unwrap();
        std::os::unix::fs::symlink(&outside, manifests.join("a.yaml")).unwrap();
        let e = write_atomic(&manifests, "a.yaml", b"x").unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
        for bad in ["", ".hidden", "../a.yaml", "a/b"] {
            assert!(write_atomic(&manifests, bad, b"x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_name_of_255_bytes_is_written() {
        // The temp file's name must fit too (it once held the whole name).
        let dir = tempfile::tempdir().unwrap();
        let name = format!("{}.yaml", "a".repeat(250));
        assert_eq!(
            write_atomic(dir.path(), &name, b"x").unwrap(),
            Outcome::Written
        );
        assert_eq!(fs::read(dir.path().join(&name)).unwrap(), b"x");
    }

    #[test]
    fn content_is_compared_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &big).unwrap();
        assert!(holds(&path, &big).unwrap());
        let mut other = big.clone();
        other[19_999] ^= 1;
        assert!(!holds(&path, &other).unwrap());
        assert!(!holds(&path, &big[..10_000]).unwrap());
        assert!(!holds(&path, &[big.as_slice(), b"x"].concat()).unwrap());
        fs::write(&path, b"").unwrap();
        assert!(holds(&path, b"").unwrap());
    }

    #[test]
    fn staged_files_land_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), b"old").unwrap();
        let names = || {
            let mut names: Vec<String> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        // Identical bytes: nothing staged.
        assert!(stage(dir.path(), "a.yaml", b"old").unwrap().is_none());
        let mut staged: Vec<Staged> = (0..40)
            .map(|i| {
                let name = if i == 0 {
                    "a.yaml".to_string()
                } else {
                    format!("n{i:02}.yaml")
                };
                stage(dir.path(), &name, format!("new {i}").as_bytes())
                    .unwrap()
                    .unwrap()
            })
            .collect();
        // Staged and synced, not committed: the targets are as they were,
        // the new bytes only under dot-names the kubelet ignores.
        assert!(sync_staged(&mut staged).iter().all(Result::is_ok));
        assert_eq!(fs::read(dir.path().join("a.yaml")).unwrap(), b"old");
        assert!(!dir.path().join("n01.yaml").exists());
        let visible: Vec<_> = names()
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .collect();
        assert_eq!(visible, ["a.yaml"]);
        // One dropped uncommitted leaves no temp file; the rest land.
        let dropped = staged.pop().unwrap();
        assert_eq!(dropped.target(), dir.path().join("n39.yaml"));
        drop(dropped);
        for s in staged {
            s.commit().unwrap();
        }
        assert!(
            sync_dirs(&[dir.path().to_path_buf()])
                .iter()
                .all(Result::is_ok)
        );
        assert_eq!(fs::read(dir.path().join("a.yaml")).unwrap(), b"new 0");
        assert_eq!(fs::read(dir.path().join("n38.yaml")).unwrap(), b"new 38");
        let all = names();
        assert_eq!(all.len(), 39, "{all:?}");
        assert!(all.iter().all(|n| !n.starts_with('.')), "{all:?}");
    }

    #[test]
    fn stale_temp_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".podstamp-a.yaml.1.0.tmp"), b"half").unwrap();
        fs::write(dir.path().join(".other"), b"not ours").unwrap();
        fs::write(dir.path().join("b.yaml"), b"not ours").unwrap();
        assert_eq!(remove_stale_temp_files(dir.path()).unwrap(), 1);
        assert!(dir.path().join(".other").exists() && dir.path().join("b.yaml").exists());
    }
}
