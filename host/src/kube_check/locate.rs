//! Where the pod check's helper is.
//!
//! In order: `$PODSTAMP_KUBECHECK` (given: missing is an error, not a reason
//! to look elsewhere); beside podstamp's executable (an install, or the
//! image's /usr/bin); the image's /usr/lib/podstamp; a `kubecheck/`
//! directory up to three levels above the executable (a build tree:
//! `target/release/podstamp` → `target/kubecheck/`, where
//! tests/harness/build-kubecheck.sh writes it).
//!
//! The helper runs with podstamp's privileges until it drops them, so it is
//! used only from a place that only root or this user can change: the file
//! and its directory belong to root or to us and are writable by no one else
//! (the rule of the compiled-code cache, for the same reason).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Unavailable;

/// The environment variable naming the helper.
pub const ENV_VAR: &str = "PODSTAMP_KUBECHECK";
/// The helper's file name.
pub const HELPER_NAME: &str = "podstamp-kubecheck";
/// Where the image has it (deploy/image/build.sh).
pub const IMAGE_PATH: &str = "/usr/lib/podstamp/podstamp-kubecheck";

/// The helper to run: `given` (a setting), else `$PODSTAMP_KUBECHECK`, else
/// the first of the places in the module's comment that has one.
pub fn find(given: Option<&Path>) -> Result<PathBuf, Unavailable> {
    let explicit = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(ENV_VAR).map(PathBuf::from));
    if let Some(path) = explicit {
        return check_safe(&path).map(|()| path);
    }
    let candidates = candidates();
    for path in &candidates {
        if path.is_file() {
            return check_safe(path).map(|()| path.clone());
        }
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(Unavailable(format!(
        "{HELPER_NAME} is missing (looked in {}): build it with `bash tests/harness/build-kubecheck.sh`, install it beside podstamp, or name it with {ENV_VAR}",
        looked.join(", ")
    )))
}

fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    if let Some(dir) = &exe_dir {
        out.push(dir.join(HELPER_NAME));
    }
    out.push(PathBuf::from(IMAGE_PATH));
    if let Some(dir) = &exe_dir {
        for up in dir.ancestors().skip(1).take(3) {
            out.push(up.join("kubecheck").join(HELPER_NAME));
        }
    }
    out
}

/// The helper and its directory: root's or ours, writable by no one else.
fn check_safe(path: &Path) -> Result<(), Unavailable> {
    let euid = euid();
    let meta = std::fs::metadata(path).map_err(|e| {
        Unavailable(format!(
            "{}: {e}: build it with `bash tests/harness/build-kubecheck.sh`, or name another with {ENV_VAR}",
            path.display()
        ))
    })?;
    if !meta.is_file() {
        return Err(Unavailable(format!("{} is not a file", path.display())));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    for (what, meta) in [
        (path, meta),
        (
            dir,
            std::fs::metadata(dir).map_err(|e| Unavailable(format!("{}: {e}", dir.display())))?,
        ),
    ] {
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(Unavailable(format!(
                "{} belongs to uid {}, not to root or this user (uid {euid}), who could replace the check podstamp runs: install it where only root or you can write",
                what.display(),
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(Unavailable(format!(
                "{} is writable by group or others (mode {:04o}), who could replace the check podstamp runs: run `chmod go-w {}`",
                what.display(),
                meta.mode() & 0o7777,
                what.display()
            )));
        }
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_helper_others_can_replace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let helper = dir.path().join(HELPER_NAME);
        std::fs::write(&helper, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = find(Some(&helper)).unwrap_err().0;
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find(Some(&helper)).unwrap(), helper);
    }
}
