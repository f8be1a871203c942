//! Compiled plugin code on disk, so that a restart does not recompile.

use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where compiled plugin code is cached unless configured otherwise:
/// `$PODSTAMP_CACHE_DIR`, else `$XDG_CACHE_HOME/podstamp`, else `~/.cache/podstamp`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let from_env = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from_env("PODSTAMP_CACHE_DIR")
        .or_else(|| from_env("XDG_CACHE_HOME").map(|d| d.join("podstamp")))
        .or_else(|| from_env("HOME").map(|d| d.join(".cache/podstamp")))
}

/// The cache directory to use: none with `no_cache`, else the flag's, else
/// the configuration's, else [`default_cache_dir`].
pub fn choose_cache_dir(
    no_cache: bool,
    flag: Option<&Path>,
    configured: Option<&Path>,
) -> Option<PathBuf> {
    if no_cache {
        return None;
    }
    flag.or(configured)
        .map(Path::to_path_buf)
        .or_else(default_cache_dir)
}

/// Compiled plugin code on disk, keyed by the plugin's sha256 and the
/// engine's compatibility hash, so a restart does not recompile.
pub(super) struct CodeCache {
    dir: PathBuf,
    engine_key: String,
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
    pub(super) fn open(dir: &Path, engine: &Engine) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Cached code is loaded as native code without verification, so the
        // directory must be ours alone.
        let meta = std::fs::symlink_metadata(dir)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
            return Err(std::io::Error::other(
                "must be a directory owned by this user and writable by no one else",
            ));
        }
        let mut hasher = Sha256Hasher(Sha256::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..8]);
        Ok(CodeCache {
            dir: dir.to_path_buf(),
            engine_key,
        })
    }

    pub(super) fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        sha256: &str,
    ) -> wasmtime::Result<Component> {
        let path = self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key));
        if path.is_file() {
            // SAFETY: the file was written by `store` below into a directory
            // that only this user can write (checked in `open`), under a name
            // that binds it to these exact plugin bytes and engine settings;
            // wasmtime also checks the engine compatibility header itself.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cached code: {e:#}")
                }
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(e) = self.store(&path, &component) {
            tracing::warn!(path = %path.display(), "cannot cache compiled plugin: {e:#}");
        }
        Ok(component)
    }

    fn store(&self, path: &Path, component: &Component) -> anyhow::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let code = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            path.file_name().unwrap_or_default().display(),
            std::process::id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let written = file.write_all(&code).and_then(|()| file.sync_all());
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        Ok(())
    }
}
