//! Embeds the plugin project templates (`plugins/scaffold/`) in the binary
//! for `podstamp plugin new`: a generated table of (language, path in the
//! project, bytes). `plugins/scaffold/LANG/` is one language's project;
//! `plugins/scaffold/tests/` (the golden cases) goes into every one; the
//! Rust project also gets `plugins/Cargo.lock`, so that a new plugin
//! resolves the dependency versions the examples are built and tested with.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub fn embed() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let plugins = manifest_dir.join("../plugins");
    let scaffold = plugins.join("scaffold");
    println!("cargo:rerun-if-changed={}", scaffold.display());
    let mut files = Vec::new();
    for entry in sorted_entries(&scaffold) {
        let name = entry.file_name().unwrap().to_str().unwrap().to_string();
        if !entry.is_dir() {
            continue;
        }
        let (language, prefix) = if name == "tests" {
            ("*", "tests/")
        } else {
            (leak(name), "")
        };
        collect(&entry, prefix, language, &mut files);
    }
    let lock = plugins.join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    files.push(("rust", "Cargo.lock".to_string(), lock));

    let mut out = String::from(
        "/// (language or `*` for all, path in the project, contents)\n\
         pub(crate) static FILES: &[(&str, &str, &[u8])] = &[\n",
    );
    for (language, path, source) in &files {
        let source = source.canonicalize().unwrap();
        writeln!(
            out,
            "    ({language:?}, {path:?}, include_bytes!({:?})),",
            source.display().to_string()
        )
        .unwrap();
    }
    out.push_str("];\n");
    let target = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("scaffold.rs");
    std::fs::write(target, out).unwrap();
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    entries
}

/// Every file under `dir`, but what builds and tools leave there.
fn collect(
    dir: &Path,
    prefix: &str,
    language: &'static str,
    files: &mut Vec<(&'static str, String, PathBuf)>,
) {
    println!("cargo:rerun-if-changed={}", dir.display());
    for path in sorted_entries(dir) {
        let name = path.file_name().unwrap().to_str().unwrap();
        if matches!(
            name,
            "target" | "node_modules" | "__pycache__" | "Cargo.lock"
        ) {
            continue;
        }
        if path.is_dir() {
            collect(&path, &format!("{prefix}{name}/"), language, files);
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
            files.push((language, format!("{prefix}{name}"), path));
        }
    }
}
