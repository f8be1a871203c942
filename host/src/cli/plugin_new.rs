//! `podstamp plugin new NAME --lang rust|python|js`: a plugin project of its
//! own, anywhere, from the templates in `plugins/scaffold/` (embedded in the
//! binary by build.rs).
//!
//! The project depends on podstamp's SDK for its language, and its
//! `build.sh` runs podstamp's own build script for that language
//! (`plugins/build.sh`, `plugins/python/build.sh`, `plugins/js/build.sh`),
//! so a plugin made outside podstamp's tree is built exactly as the
//! examples are. Both are found in a podstamp checkout's `plugins/`
//! directory: `--plugins DIR`, by default the one this podstamp was built
//! from when it is still there.
//!
//! Placeholders in the templates: `{{name}}` (the plugin's name, also its
//! package's) and `{{plugins}}` (that directory, absolute). The project is
//! written into a hidden sibling directory and renamed into place, so a
//! failure leaves nothing half made.
//!
//! Invariant: that staging directory is one this run created, never one it
//! found: a fresh random name, made by `mkdir` with mode 0700 (which fails
//! on anything already there, a symbolic link included, and is then tried
//! with another name), so nothing planted beside `--dir` can make the
//! project be written through it.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use crate::Failure;

mod files {
    include!(concat!(env!("OUT_DIR"), "/scaffold.rs"));
}

#[derive(Clone, Copy, ValueEnum)]
enum Language {
    Rust,
    Python,
    Js,
}

impl Language {
    fn key(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Js => "js",
        }
    }

    /// What the language's project needs from podstamp's plugins/ directory.
    fn needs(self) -> &'static [&'static str] {
        match self {
            Language::Rust => &["build.sh", "podstamp-plugin/Cargo.toml"],
            Language::Python => &["python/build.sh", "python/podstamp_plugin/__init__.py"],
            Language::Js => &["js/build.sh", "js/podstamp-plugin/index.js"],
        }
    }

    /// What to run next, in the new project.
    fn next(self) -> &'static str {
        match self {
            Language::Rust => "cargo test && bash build.sh && podstamp test tests",
            Language::Python => "python3 -m unittest && bash build.sh && podstamp test tests",
            Language::Js => "bash build.sh && podstamp test tests",
        }
    }
}

#[derive(Args)]
pub(crate) struct NewArgs {
    /// The plugin's name: lowercase letters, digits and '-', starting with a letter (it names the package and the component).
    name: String,
    /// The language the plugin is written in.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Language,
    /// Where to create the project [default: ./NAME]; it must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The plugins/ directory of a podstamp checkout (the SDKs and build scripts) [default: the one this podstamp was built from].
    #[arg(long, value_name = "DIR")]
    plugins: Option<PathBuf>,
}

/// Where this binary's own plugins/ directory was, when it was built.
const BUILT_FROM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins");

pub(crate) fn run(args: NewArgs) -> Result<(), Failure> {
    let usage = Failure::Usage;
    check_name(&args.name).map_err(|e| usage(format!("NAME {:?}: {e}", args.name)))?;
    let plugins = plugins_dir(args.plugins.as_deref(), args.lang)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if let Ok(mut entries) = std::fs::read_dir(&dir) {
        if entries.next().is_some() {
            return Err(usage(format!(
                "--dir {}: exists and is not empty; choose another directory",
                dir.display()
            )));
        }
    } else if dir.exists() {
        return Err(usage(format!("--dir {}: not a directory", dir.display())));
    }

    let plugins_text = plugins.display().to_string();
    let fill = |bytes: &[u8]| -> Vec<u8> {
        match std::str::from_utf8(bytes) {
            Ok(text) => text
                .replace("{{name}}", &args.name)
                .replace("{{plugins}}", &plugins_text)
                .into_bytes(),
            Err(_) => bytes.to_vec(),
        }
    };
    let files: Vec<(&str, Vec<u8>)> = files::FILES
        .iter()
        .filter(|(language, _, _)| *language == "*" || *language == args.lang.key())
        .map(|(_, path, bytes)| (*path, fill(bytes)))
        .collect();

    write_project(&dir, &files).map_err(Failure::Render)?;
    println!(
        "created {} ({} plugin {}); next: cd {} && {}",
        dir.display(),
        args.lang.key(),
        args.name,
        dir.display(),
        args.lang.next()
    );
    Ok(())
}

/// A name usable as a Cargo package, a Python or npm project and a
/// component's name: `[a-z][a-z0-9-]*`, not ending with '-', ≤ 63.
fn check_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !name.is_empty()
        && name.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && bytes
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err("use lowercase letters, digits and '-', starting with a letter, at most 63 (e.g. my-plugin)".into())
    }
}

/// The podstamp plugins/ directory the project will use, absolute, with
/// what `language` needs in it.
fn plugins_dir(given: Option<&Path>, language: Language) -> Result<PathBuf, Failure> {
    let (dir, origin) = match given {
        Some(dir) => (dir.to_path_buf(), "--plugins"),
        None => (
            PathBuf::from(BUILT_FROM),
            "the plugins/ directory this podstamp was built from",
        ),
    };
    let fix = "give --plugins DIR, the plugins/ directory of a podstamp checkout";
    let dir = dir
        .canonicalize()
        .map_err(|e| Failure::Usage(format!("{origin} ({}): {e}: {fix}", dir.display())))?;
    for need in language.needs() {
        if !dir.join(need).is_file() {
            return Err(Failure::Usage(format!(
                "{origin} ({}): no {need} in it: {fix}",
                dir.display()
            )));
        }
    }
    // The path goes into TOML, JSON, Python and shell strings as it is.
    let text = dir.display().to_string();
    if text.contains(['"', '\'', '\\', '$', '`', '\n']) {
        return Err(Failure::Usage(format!(
            "{origin} ({text}): a path with quotes, backslashes, '$' or '`' cannot be written into the project's files: use a link without them"
        )));
    }
    Ok(dir)
}

/// How many random names are tried before giving up (each taken only by
/// an entry that was there: 16 in a row is someone planting them).
const STAGING_TRIES: usize = 16;

/// A new empty directory `.NAME.podstamp-new-RANDOM` in `parent`, mode
/// 0700, created by this call (see the module's invariant).
fn create_staging(parent: &Path, name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..STAGING_TRIES {
        let path = parent.join(format!(".{name}.podstamp-new-{:016x}", random_u64()?));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(path),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "{}: {STAGING_TRIES} random staging names in a row were taken (the last {}); is something planting entries there?",
        parent.display(),
        last.map(|p| p.display().to_string()).unwrap_or_default()
    ))
}

/// 64 bits from the kernel's random source (getrandom(2)).
fn random_u64() -> Result<u64, String> {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is ours and 8 bytes long, as passed.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(format!(
            "cannot read the kernel's random source: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// Writes `files` into a hidden sibling of `dir`, then renames it to `dir`.
fn write_project(dir: &Path, files: &[(&str, Vec<u8>)]) -> Result<(), String> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("--dir {}: not a directory name", dir.display()))?;
    let staging = create_staging(parent, name)?;
    let result = (|| {
        for (path, bytes) in files {
            let target = staging.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            std::fs::write(&target, bytes).map_err(|e| format!("{}: {e}", target.display()))?;
            if path.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("{}: {e}", target.display()))?;
            }
        }
        // Private while it is being written; a project's usual mode once whole.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", staging.display()))?;
        }
        // An empty directory given as --dir is replaced.
        if dir.exists() {
            std::fs::remove_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::rename(&staging, dir).map_err(|e| format!("{}: {e}", dir.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn staging_is_a_fresh_private_directory_never_one_found() {
        let tmp = tempfile::tempdir().unwrap();
        let a = create_staging(tmp.path(), "p").unwrap();
        let b = create_staging(tmp.path(), "p").unwrap();
        assert_ne!(a, b);
        let meta = std::fs::symlink_metadata(&a).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert!(
            a.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(".p.podstamp-new-")
        );
    }
}
