//! Compiled plugin code on disk, so that a restart does not recompile.
//!
//! The cache holds native code that wasmtime runs without verifying it (as
//! root, in the daemon), so whoever can change what the cache hands back can
//! run code as us. The invariants that keep it ours:
//!
//! - The directory is reached once, by handles: `/` is opened, then each
//!   component of the (canonical) parent path with `openat(O_DIRECTORY |
//!   O_NOFOLLOW)` relative to the one before, and each handle is checked with
//!   `fstat`: every ancestor belongs to root or to us and is writable by no
//!   one else, unless it is sticky (`/tmp`); the cache directory itself
//!   belongs to us and is writable by no one else, and is never a symlink.
//! - Every entry is opened relative to that handle (`openat`, `O_NOFOLLOW`),
//!   checked through its own handle (a regular file of ours, writable by no
//!   one else), and read into memory; only those bytes are deserialized. No
//!   path is looked up twice, so nothing can be swapped between a check and
//!   a use (a `renameat2(RENAME_EXCHANGE)` race on the path finds us holding
//!   the inode we checked, or not finding the entry at all).
//! - Each entry starts with a header naming the sha256 of the component it
//!   was compiled from and the engine it was compiled for, checked after
//!   reading and before deserializing: an entry copied or renamed to another
//!   component's name is refused (with a warning) and recompiled.
//! - Writes go through the same handle: a new dot-file (`O_CREAT|O_EXCL`),
//!   fsync, then `renameat` over the entry, so readers see whole entries.
//!
//! Why a sticky ancestor is acceptable: in a sticky directory only the owner
//! of an entry (or of the directory, or root) can rename or remove it, and the
//! walk checks that the entry it goes through belongs to root or to us; so
//! another user can neither replace it nor move it away, only create other
//! names, which the walk never goes through. Directories cannot be hard
//! linked, so they cannot bring in one of ours from elsewhere either.
//!
//! Symlinked ancestors (a `target -> ...` link, `/var/run`) are resolved once
//! by `canonicalize`, and then every directory on the resolved path is
//! checked as above: whatever a link said, the directory we end up with is
//! one that only root and we can change. The cache directory itself and its
//! entries are never followed through a link.
//!
//! Where the cache is: `--cache-dir`, the configuration's `cacheDir` or
//! `$PODSTAMP_CACHE_DIR` (explicit: an unsafe one is refused, with what to
//! do), else a default (root: `/var/cache/podstamp`, never the invoking
//! user's cache under `sudo -E`; others: `$XDG_CACHE_HOME/podstamp` or
//! `~/.cache/podstamp`), which, when unsafe, is skipped with a warning.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::hash::Hasher;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component as Part, Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The default cache directory when running as root.
const ROOT_DEFAULT: &str = "/var/cache/podstamp";

/// What every entry starts with, before the component's sha256 and the
/// engine key (32 bytes each).
const MAGIC: &[u8; 16] = b"podstamp-cwasm\x00\x01";
const HEADER_LEN: usize = MAGIC.len() + 32 + 32;
/// What every record starts with (records hold data, never code).
const RECORD_MAGIC: &[u8; 16] = b"podstamp-record\x01";

/// The built-in cache directory: `/var/cache/podstamp` for root (whatever
/// `$HOME` says, so `sudo -E` does not use the invoking user's cache), else
/// `$XDG_CACHE_HOME/podstamp`, else `~/.cache/podstamp`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if euid() == 0 {
        return Some(PathBuf::from(ROOT_DEFAULT));
    }
    // The XDG spec says to ignore relative values.
    let from_env = |name| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    from_env("XDG_CACHE_HOME")
        .map(|d| d.join("podstamp"))
        .or_else(|| from_env("HOME").map(|d| d.join(".cache/podstamp")))
}

/// The cache directory to use: none with `no_cache`, else the one `given`
/// (by a flag, the environment or the configuration, as
/// [`crate::settings`] resolves it; the runtime refuses it when unsafe),
/// else [`default_cache_dir`] if it is safe to use; if not, a warning says
/// why and there is no cache.
pub fn choose_cache_dir(no_cache: bool, given: Option<&Path>) -> Option<PathBuf> {
    if no_cache {
        return None;
    }
    let explicit = given.map(Path::to_path_buf);
    if explicit.is_some() {
        return explicit;
    }
    let dir = default_cache_dir()?;
    // The runtime opens it again and checks it again through its handles;
    // this only decides whether to ask it to.
    match open_dir(&dir) {
        Ok(_) => Some(dir),
        Err(e) => {
            tracing::warn!(
                "running without the compiled-code cache (plugins are compiled at every start): {e}"
            );
            None
        }
    }
}

/// Why the cache directory cannot be used. Each message names the directory
/// at fault and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{dir}: cannot open {at}: {source}")]
    Io {
        dir: PathBuf,
        at: PathBuf,
        source: io::Error,
    },
    #[error("{dir}: the path has no directory name or contains `..`; give a plain path")]
    BadPath { dir: PathBuf },
    #[error(
        "{dir}: {at} is a symbolic link, which the code cache does not follow: give the directory it points to"
    )]
    Symlink { dir: PathBuf, at: PathBuf },
    #[error("{dir}: {at} is not a directory")]
    NotADirectory { dir: PathBuf, at: PathBuf },
    #[error(
        "{dir}: {at} belongs to uid {owner}, not to root or this user (uid {euid}), who could replace the compiled code podstamp runs: choose a cache directory whose parents belong to root or to you"
    )]
    AncestorOwner {
        dir: PathBuf,
        at: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{dir}: its parent {at} is writable by group or others (mode {mode:04o}) and not sticky, so another user could replace the compiled code podstamp runs: run `chmod go-w {at}`, or choose a cache directory elsewhere"
    )]
    AncestorWritable {
        dir: PathBuf,
        at: PathBuf,
        mode: u32,
    },
    #[error(
        "{dir} belongs to uid {owner}, not to this user (uid {euid}): run `chown {euid} {dir}`, or choose another cache directory (--cache-dir, cacheDir, PODSTAMP_CACHE_DIR)"
    )]
    Owner { dir: PathBuf, owner: u32, euid: u32 },
    #[error(
        "{dir} is writable by group or others (mode {mode:04o}), so another user could replace the compiled code podstamp runs: run `chmod 0700 {dir}` (in Kubernetes, mount a hostPath volume of type DirectoryOrCreate there: the kubelet makes an emptyDir world-writable)"
    )]
    Writable { dir: PathBuf, mode: u32 },
}

/// Why one cache entry is not used (it is then recompiled and replaced).
#[derive(Debug, thiserror::Error)]
enum EntryError {
    #[error("cannot read it: {0}")]
    Io(#[from] io::Error),
    #[error("it is a symbolic link")]
    Symlink,
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it belongs to uid {owner}, not to this user (uid {euid})")]
    Owner { owner: u32, euid: u32 },
    #[error("it is writable by group or others (mode {mode:04o})")]
    Writable { mode: u32 },
    #[error("it has no podstamp cache header (written by an older podstamp?)")]
    NoHeader,
    #[error(
        "it holds the code of component sha256 {found}, not of this one (copied or renamed from another entry?)"
    )]
    OtherComponent { found: String },
    #[error("it was compiled for other engine settings")]
    OtherEngine,
    #[error("wasmtime refuses it: {0}")]
    Deserialize(String),
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `openat(dir, name, flags)`, never following a symlink in `name`'s last
/// component and never leaking the descriptor into a child process.
fn open_at(dir: &File, name: &OsStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    let name = c_name(name)?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string,
    // both alive for the call; the result is checked before use.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat, so it is open and ours alone.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn open_dir_at(dir: &File, name: &OsStr) -> io::Result<File> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Did opening `at` with O_NOFOLLOW fail because it is a symlink? (ELOOP, or
/// ENOTDIR with O_DIRECTORY.) The lstat here only words the error.
fn is_symlink_error(e: &io::Error, at: &Path) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR))
        && std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_symlink())
}

/// Opens the cache directory `dir` (creating it, 0700, if missing) through
/// handles from `/`, checking it and every ancestor; see the module's
/// invariants.
fn open_dir(dir: &Path) -> Result<File, CacheError> {
    let euid = euid();
    let io_error = |at: &Path, source| CacheError::Io {
        dir: dir.to_path_buf(),
        at: at.to_path_buf(),
        source,
    };
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| io_error(Path::new("."), e))?
            .join(dir)
    };
    let bad_path = || CacheError::BadPath {
        dir: dir.to_path_buf(),
    };
    if absolute.components().any(|c| c == Part::ParentDir) {
        return Err(bad_path());
    }
    let (Some(parent), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return Err(bad_path());
    };
    let parent = match std::fs::canonicalize(parent) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .and_then(|()| std::fs::canonicalize(parent))
        }
        other => other,
    }
    .map_err(|e| io_error(parent, e))?;

    let mut at = PathBuf::from("/");
    let mut current = File::open(&at).map_err(|e| io_error(&at, e))?;
    check_ancestor(dir, &at, &current, euid)?;
    for part in parent.components() {
        let Part::Normal(part) = part else { continue };
        at.push(part);
        current = open_dir_at(&current, part).map_err(|e| {
            if is_symlink_error(&e, &at) {
                // Only a link created after canonicalize: refuse, do not chase.
                CacheError::Symlink {
                    dir: dir.to_path_buf(),
                    at: at.clone(),
                }
            } else {
                io_error(&at, e)
            }
        })?;
        check_ancestor(dir, &at, &current, euid)?;
    }
    at.push(name);
    let c = c_name(name).map_err(|e| io_error(&at, e))?;
    // SAFETY: `current` is an open directory and `c` a NUL-terminated name.
    if unsafe { libc::mkdirat(current.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(io_error(&at, e));
        }
    }
    let cache = open_dir_at(&current, name).map_err(|e| {
        if is_symlink_error(&e, &at) {
            CacheError::Symlink {
                dir: dir.to_path_buf(),
                at: at.clone(),
            }
        } else if e.raw_os_error() == Some(libc::ENOTDIR) {
            CacheError::NotADirectory {
                dir: dir.to_path_buf(),
                at: at.clone(),
            }
        } else {
            io_error(&at, e)
        }
    })?;
    let meta = cache.metadata().map_err(|e| io_error(&at, e))?;
    if meta.uid() != euid {
        return Err(CacheError::Owner {
            dir: dir.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(CacheError::Writable {
            dir: dir.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(cache)
}

/// An ancestor, checked through its handle: root's or ours, and writable by
/// no one else unless sticky (see the module's comment for why that is safe).
fn check_ancestor(dir: &Path, at: &Path, handle: &File, euid: u32) -> Result<(), CacheError> {
    let meta = handle.metadata().map_err(|source| CacheError::Io {
        dir: dir.to_path_buf(),
        at: at.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(CacheError::NotADirectory {
            dir: dir.to_path_buf(),
            at: at.to_path_buf(),
        });
    }
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(CacheError::AncestorOwner {
            dir: dir.to_path_buf(),
            at: at.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o022 != 0 && meta.mode() & libc::S_ISVTX == 0 {
        return Err(CacheError::AncestorWritable {
            dir: dir.to_path_buf(),
            at: at.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Compiled plugin code on disk, keyed by the plugin's sha256 and the
/// engine's compatibility hash, so a restart does not recompile.
pub(super) struct CodeCache {
    /// The directory's handle: every entry is opened relative to it.
    dir: File,
    /// For messages only; never opened again.
    path: PathBuf,
    /// sha256 of the engine's compatibility hash.
    engine_key: [u8; 32],
    euid: u32,
}

/// Feeds `Hash` output into sha256, for a key that is stable across runs
/// (std's hashers are not).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the digest is used")
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl CodeCache {
    pub(super) fn open(dir: &Path, engine: &Engine) -> Result<Self, CacheError> {
        let handle = open_dir(dir)?;
        let mut hasher = Sha256Hasher(Sha256::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        Ok(CodeCache {
            dir: handle,
            path: dir.to_path_buf(),
            engine_key: hasher.0.finalize().into(),
            euid: euid(),
        })
    }

    pub(super) fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        sha256: &str,
    ) -> wasmtime::Result<Component> {
        let name = self.entry_name(sha256);
        match self.read_entry(engine, &name, sha256) {
            Ok(Some(component)) => return Ok(component),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                entry = %self.path.join(&name).display(),
                "not using cached plugin code: {e}; recompiling it"
            ),
        }
        let component = Component::new(engine, bytes)?;
        if let Err(e) = self.store(&name, sha256, &component) {
            tracing::warn!(
                entry = %self.path.join(&name).display(),
                "cannot cache compiled plugin: {e:#}"
            );
        }
        Ok(component)
    }

    /// The compiled code of component `sha256` alone, when the cache has a
    /// sound entry for it (one that fails its checks is None, with a
    /// warning: the caller has no bytes to compile instead).
    pub(super) fn cached(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let sha256 = sha256.to_ascii_lowercase();
        let name = self.entry_name(&sha256);
        match self.read_entry(engine, &name, &sha256) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(
                    entry = %self.path.join(&name).display(),
                    "not using cached plugin code: {e}"
                );
                None
            }
        }
    }

    fn entry_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", hex::encode(&self.engine_key[..8]))
    }

    /// The bytes of the entry `name`, read through a handle checked to be
    /// a regular file of ours that no one else can write; None when there
    /// is no such entry.
    fn read_checked(&self, name: &str) -> Result<Option<Vec<u8>>, EntryError> {
        // O_NONBLOCK: a FIFO put here must not hang the open; it is then
        // refused as not a regular file. It changes nothing for a file.
        let mut file = match open_at(
            &self.dir,
            OsStr::new(name),
            libc::O_RDONLY | libc::O_NONBLOCK,
            0,
        ) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(EntryError::Symlink),
            Err(e) => return Err(e.into()),
        };
        // Checked through the handle the bytes are read from.
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(EntryError::NotAFile);
        }
        if meta.uid() != self.euid {
            return Err(EntryError::Owner {
                owner: meta.uid(),
                euid: self.euid,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(EntryError::Writable {
                mode: meta.mode() & 0o7777,
            });
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// A record: what the daemon keeps next to the compiled code so that it
    /// can start without the API server (the last catalog it used). Read
    /// with the same checks as code; None when there is none or it fails
    /// them (with a warning).
    pub(super) fn record(&self, key: &str) -> Option<Vec<u8>> {
        let name = format!("record-{key}");
        match self.read_checked(&name) {
            Ok(Some(bytes)) => match bytes.strip_prefix(RECORD_MAGIC.as_slice()) {
                Some(content) => Some(content.to_vec()),
                None => {
                    tracing::warn!(entry = %self.path.join(&name).display(), "not using this record: {}", EntryError::NoHeader);
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(entry = %self.path.join(&name).display(), "not using this record: {e}");
                None
            }
        }
    }

    /// Writes the record `key` whole (a reader sees the old one or this one).
    pub(super) fn store_record(&self, key: &str, content: &[u8]) -> io::Result<()> {
        let mut entry = Vec::with_capacity(RECORD_MAGIC.len() + content.len());
        entry.extend_from_slice(RECORD_MAGIC);
        entry.extend_from_slice(content);
        self.write_whole(&format!("record-{key}"), &entry)
    }

    /// The entry `name` for component `sha256`, None when there is none.
    fn read_entry(
        &self,
        engine: &Engine,
        name: &str,
        sha256: &str,
    ) -> Result<Option<Component>, EntryError> {
        let Some(code) = self.read_checked(name)? else {
            return Ok(None);
        };
        let header = code.get(..HEADER_LEN).ok_or(EntryError::NoHeader)?;
        let (magic, rest) = header.split_at(MAGIC.len());
        let (component, engine_key) = rest.split_at(32);
        if magic != MAGIC {
            return Err(EntryError::NoHeader);
        }
        let found = hex::encode(component);
        if found != sha256 {
            return Err(EntryError::OtherComponent { found });
        }
        if engine_key != self.engine_key {
            return Err(EntryError::OtherEngine);
        }
        // SAFETY: these bytes were read, through a handle checked above, from
        // a regular file of ours in a directory only root and we can write
        // (checked through handles in `open_dir`), and their header says they
        // were compiled from this component for this engine; wasmtime copies
        // them into its own memory, so no later change to the file reaches
        // the code (unlike deserialize_file, which maps the file), and checks
        // its own compatibility header too.
        match unsafe { Component::deserialize(engine, &code[HEADER_LEN..]) } {
            Ok(c) => Ok(Some(c)),
            Err(e) => Err(EntryError::Deserialize(format!("{e:#}"))),
        }
    }

    fn store(&self, name: &str, sha256: &str, component: &Component) -> anyhow::Result<()> {
        let code = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut entry = Vec::with_capacity(HEADER_LEN + code.len());
        entry.extend_from_slice(MAGIC);
        entry.extend_from_slice(&hex::decode(sha256)?);
        entry.extend_from_slice(&self.engine_key);
        entry.extend_from_slice(&code);
        self.write_whole(name, &entry)?;
        // The directory is not fsynced: a rename lost in a crash only means
        // compiling once more.
        Ok(())
    }

    /// Writes the entry `name` through the directory's handle: a new
    /// dot-file, fsynced, renamed over the entry.
    fn write_whole(&self, name: &str, entry: &[u8]) -> io::Result<()> {
        let tmp = format!(".{name}.{}.tmp", std::process::id());
        let create = || {
            open_at(
                &self.dir,
                OsStr::new(&tmp),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
        };
        let mut file = match create() {
            // Left by a process with our pid that died mid-write.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.unlink(&tmp);
                create()?
            }
            other => other?,
        };
        let written = file
            .write_all(entry)
            .and_then(|()| file.sync_all())
            .and_then(|()| self.rename(&tmp, name));
        if let Err(e) = written {
            self.unlink(&tmp);
            return Err(e);
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (from, to) = (c_name(OsStr::new(from))?, c_name(OsStr::new(to))?);
        let fd = self.dir.as_raw_fd();
        // SAFETY: `fd` is our open directory; both names are NUL-terminated.
        if unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn unlink(&self, name: &str) {
        if let Ok(name) = c_name(OsStr::new(name)) {
            // SAFETY: as in `rename`. A failure leaves a dot-file behind.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) };
        }
    }
}
