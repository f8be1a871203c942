//! `podstamp test DIR`: golden tests for plugin chains, for plugin authors'
//! CI (like the golden tests of KRM function catalogs).
//!
//! A *case* is a directory under DIR that has no subdirectories (DIR itself
//! when it has none); directories whose name starts with a dot are not
//! looked at. A case is rendered exactly as `podstamp render` would render
//! it, from these files, each taken from the case's directory or else from
//! the nearest directory above it, up to DIR (so that cases share a
//! template, a node or a chain):
//!
//! - `template.yaml`: the PodTemplate (required);
//! - `node.yaml`: the Node to render for, as `render --node` reads it
//!   (required);
//! - `podstamp.yaml`: the configuration, as `render --config` reads it
//!   (catalog, chain, limits, namespace; its paths are relative to it).
//!   Without one, the template passes through.
//!
//! and compared with what the case's own directory expects:
//!
//! - `expected.yaml`: the manifest, byte for byte; a difference is printed
//!   as a unified diff;
//! - `expected.error`: the error line `render` prints (without its
//!   `podstamp: error: ` prefix), with the paths in it relative to the
//!   case's directory, so that it reads the same whatever directory the
//!   cases are run from, and whichever DIR holds them.
//!
//! Under a case that fails, what each plugin changed is printed, as
//! `render --explain` prints it, so that an author sees which plugin set
//! what.
//!
//! `podstamp test DIR CASE…` runs only the cases named (as printed: their
//! paths under DIR), with the files they share still found up to DIR.
//!
//! `--update` writes what each case renders as its expectation instead
//! (only where it differs, atomically, through a symbolic link to the file
//! it names, so that cases that share a golden file keep sharing it).
//! Invariant: it writes (and removes) only inside DIR: every expectation's
//! path is resolved, links and all, against DIR canonicalized before any
//! case is run, and one that leaves DIR (a link, or a case directory that
//! is a link) stops the run with one line naming it and where it points,
//! nothing written; a file is replaced by a temporary file renamed beside
//! the file the link names, never written in place.
//!
//! Nothing from the environment can change a case's result: its settings
//! are its files' (the environment gives only where compiled code is
//! cached). Exit codes are `render`'s: 0 every case passed (or was
//! updated), 1 a case failed, 2 the cases cannot be run as given (DIR, a
//! missing template or node, an unreadable file, both expectations).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use podstamp::settings::Layer;

use crate::Failure;
use crate::cli::render::{Job, render_job};

#[derive(Args)]
pub(crate) struct TestArgs {
    /// The directory of cases (or one case).
    dir: PathBuf,
    /// Run only these cases of DIR (their names as printed, e.g. `rust/node-env`, or a directory of them).
    #[arg(value_name = "CASE")]
    only: Vec<String>,
    /// Write what each case renders as its expectation instead of comparing.
    #[arg(long)]
    update: bool,
    /// Where compiled plugin code is cached [env: PODSTAMP_CACHE_DIR] [default: $XDG_CACHE_HOME/podstamp, else ~/.cache/podstamp].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile plugins every time instead of using the cache.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
}

const TEMPLATE: &str = "template.yaml";
const NODE: &str = "node.yaml";
const CONFIG: &str = "podstamp.yaml";
const EXPECTED: &str = "expected.yaml";
const EXPECTED_ERROR: &str = "expected.error";

/// What a case expects.
enum Expected {
    Manifest(Vec<u8>),
    Error(String),
    Nothing,
}

/// What a case rendered.
enum Outcome {
    Manifest(Vec<u8>),
    Error(String),
}

pub(crate) fn run(args: TestArgs) -> Result<(), Failure> {
    let usage = Failure::Usage;
    let root = trim_dir(&args.dir);
    if !root.is_dir() {
        return Err(usage(format!(
            "{}: not a directory of test cases",
            root.display()
        )));
    }
    let mut cases = Vec::new();
    find_cases(&root, &mut cases).map_err(usage)?;
    cases.sort();
    if !args.only.is_empty() {
        for wanted in &args.only {
            let wanted = wanted.trim_end_matches('/');
            if !cases.iter().any(|case| in_case(&root, case, wanted)) {
                return Err(usage(format!(
                    "{wanted}: no such case in {}",
                    root.display()
                )));
            }
        }
        cases.retain(|case| {
            args.only
                .iter()
                .any(|w| in_case(&root, case, w.trim_end_matches('/')))
        });
    }

    let env = Layer::from_process_env();
    let settings = Layer {
        cache_dir: args.cache_dir.clone().or(env.cache_dir),
        no_cache: args.no_cache,
        ..Layer::default()
    };
    // Every case's inputs are found before any is run: a malformed case is
    // a usage error, not a failure among passing ones.
    let inputs = cases
        .iter()
        .map(|case| Inputs::find(&root, case))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    if args.update {
        // Before anything is written: a case from someone else (a pull
        // request) must not make --update write outside DIR.
        for input in &inputs {
            for file in [EXPECTED, EXPECTED_ERROR] {
                inside(&root, &input.dir.join(file)).map_err(usage)?;
            }
        }
    }

    let mut stdout = std::io::stdout().lock();
    let (mut passed, mut failed, mut updated) = (0usize, 0usize, 0usize);
    for case in &inputs {
        let (outcome, explain) = case.render(&root, &settings)?;
        let name = case.name(&root);
        if args.update {
            if case.update(&root, &outcome).map_err(Failure::Render)? {
                updated += 1;
                let _ = writeln!(stdout, "updated {name}");
            } else {
                let _ = writeln!(stdout, "ok      {name}");
            }
            continue;
        }
        match case.compare(&outcome) {
            None => {
                passed += 1;
                let _ = writeln!(stdout, "ok      {name}");
            }
            Some(report) => {
                failed += 1;
                let _ = write!(stdout, "FAILED  {name}: {report}");
                // Which plugin set what: where to look first.
                if !explain.is_empty() {
                    let _ = writeln!(stdout, "  what each plugin changed:");
                    for line in &explain {
                        let _ = writeln!(stdout, "  {line}");
                    }
                }
            }
        }
    }
    let total = inputs.len();
    if args.update {
        let _ = writeln!(
            stdout,
            "{total} case(s) in {}: {updated} updated",
            root.display()
        );
        return Ok(());
    }
    let _ = writeln!(
        stdout,
        "{total} case(s) in {}: {passed} passed, {failed} failed",
        root.display()
    );
    if failed > 0 {
        return Err(Failure::Render(format!(
            "{failed} of {total} case(s) in {} failed",
            root.display()
        )));
    }
    Ok(())
}

/// `dir` without trailing slashes, so that the prefix cut from messages is
/// the one the files' paths start with.
fn trim_dir(dir: &Path) -> PathBuf {
    let text = dir.to_string_lossy();
    let trimmed = text.trim_end_matches('/');
    PathBuf::from(if trimmed.is_empty() { "/" } else { trimmed })
}

/// The leaf directories under `dir` (or `dir` itself), hidden ones skipped.
fn find_cases(dir: &Path, cases: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut subdirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        // A symbolic link to a directory is a case too.
        if !hidden && entry.path().is_dir() {
            subdirs.push(entry.path());
        }
    }
    if subdirs.is_empty() {
        cases.push(dir.to_path_buf());
    }
    for sub in subdirs {
        find_cases(&sub, cases)?;
    }
    Ok(())
}

/// A case's files.
struct Inputs {
    dir: PathBuf,
    template: PathBuf,
    node: PathBuf,
    config: Option<PathBuf>,
    expected: Expected,
}

impl Inputs {
    fn find(root: &Path, dir: &Path) -> Result<Inputs, String> {
        let name = relative(root, dir);
        let required = |file: &str, what: &str| {
            nearest(root, dir, file).ok_or_else(|| {
                format!(
                    "case {name}: no {file} in it or above it up to {}: add {what}",
                    root.display()
                )
            })
        };
        let template = required(TEMPLATE, "the PodTemplate to render")?;
        let node = required(NODE, "the Node to render for")?;
        let manifest = dir.join(EXPECTED);
        let error = dir.join(EXPECTED_ERROR);
        let read =
            |path: &Path| std::fs::read(path).map_err(|e| format!("{}: {e}", relative(root, path)));
        let expected = match (manifest.exists(), error.exists()) {
            (true, true) => {
                return Err(format!(
                    "case {name}: both {EXPECTED} and {EXPECTED_ERROR}: a case expects a manifest or an error, remove one"
                ));
            }
            (true, false) => Expected::Manifest(read(&manifest)?),
            (false, true) => {
                let text = String::from_utf8_lossy(&read(&error)?).into_owned();
                Expected::Error(text.trim_end_matches(['\n', '\r']).to_string())
            }
            (false, false) => Expected::Nothing,
        };
        Ok(Inputs {
            dir: dir.to_path_buf(),
            template,
            node,
            config: nearest(root, dir, CONFIG),
            expected,
        })
    }

    fn name(&self, root: &Path) -> String {
        relative(root, &self.dir)
    }

    /// `message` with the paths under the case's directory, and those under
    /// DIR (files shared by cases), made relative to the case's directory.
    fn relative_paths(&self, root: &Path, message: &str) -> String {
        let depth = self
            .dir
            .strip_prefix(root)
            .map_or(0, |rest| rest.components().count());
        let message = replace_path_prefix(message, &format!("{}/", self.dir.display()), "");
        if depth == 0 {
            return message;
        }
        replace_path_prefix(
            &message,
            &format!("{}/", root.display()),
            &"../".repeat(depth),
        )
    }

    /// Renders the case as `podstamp render` would; only a file that cannot
    /// be read is an error here, any render failure is the case's outcome.
    fn render(&self, root: &Path, settings: &Layer) -> Result<(Outcome, Vec<String>), Failure> {
        let origin = self.template.display().to_string();
        let mut explain = Vec::new();
        let text =
            std::fs::read(&self.template).map_err(|e| Failure::Usage(format!("{origin}: {e}")))?;
        let result = podstamp::node::read_node_file(&self.node)
            .map_err(|e| Failure::Usage(e.to_string()))
            .and_then(|node| {
                render_job(Job {
                    flags: Layer {
                        config: self.config.clone(),
                        ..settings.clone()
                    },
                    env: Layer::default(),
                    node,
                    template: (&text, &origin),
                    plugins: &[],
                    configmaps: &[],
                    explain: Some(&mut explain),
                })
            });
        let outcome = match result {
            Ok(output) => {
                for warning in output.warnings {
                    eprintln!("podstamp: warning: case {}: {warning}", self.name(root));
                }
                Outcome::Manifest(output.bytes)
            }
            Err(
                Failure::Usage(message) | Failure::Render(message) | Failure::NotForNode(message),
            ) => Outcome::Error(self.relative_paths(root, &message.replace('\n', " "))),
        };
        Ok((outcome, explain))
    }

    /// None when the outcome is what the case expects, else the report to
    /// print (ending with a newline).
    fn compare(&self, outcome: &Outcome) -> Option<String> {
        match (&self.expected, outcome) {
            (Expected::Manifest(want), Outcome::Manifest(got)) if want == got => None,
            (Expected::Error(want), Outcome::Error(got)) if want == got => None,
            (Expected::Manifest(want), Outcome::Manifest(got)) => {
                let want = String::from_utf8_lossy(want);
                let got = String::from_utf8_lossy(got);
                let diff = similar::TextDiff::from_lines(want.as_ref(), got.as_ref());
                Some(format!(
                    "the manifest differs from {EXPECTED}\n{}",
                    diff.unified_diff()
                        .context_radius(3)
                        .header(EXPECTED, "rendered")
                        .missing_newline_hint(true)
                ))
            }
            (Expected::Error(want), Outcome::Error(got)) => Some(format!(
                "the error differs from {EXPECTED_ERROR}\n  expected: {want}\n  rendered: {got}\n"
            )),
            (Expected::Manifest(_), Outcome::Error(got)) => Some(format!(
                "expected the manifest in {EXPECTED}, the render failed:\n  {got}\n"
            )),
            (Expected::Error(want), Outcome::Manifest(got)) => {
                let mut report = format!(
                    "expected the error in {EXPECTED_ERROR}:\n  {want}\nthe render succeeded:\n"
                );
                for line in String::from_utf8_lossy(got).lines() {
                    let _ = writeln!(report, "  {line}");
                }
                Some(report)
            }
            (Expected::Nothing, _) => Some(format!(
                "no {EXPECTED} or {EXPECTED_ERROR}: record what it renders with `podstamp test --update`\n"
            )),
        }
    }

    /// Writes the outcome as the case's expectation; false when it already
    /// was.
    fn update(&self, root: &Path, outcome: &Outcome) -> Result<bool, String> {
        let (keep, drop, bytes) = match outcome {
            Outcome::Manifest(bytes) => (EXPECTED, EXPECTED_ERROR, bytes.clone()),
            Outcome::Error(line) => (EXPECTED_ERROR, EXPECTED, format!("{line}\n").into_bytes()),
        };
        let stale = self.dir.join(drop);
        let mut changed = false;
        if std::fs::symlink_metadata(&stale).is_ok() {
            // The link itself, if it is one (in the case's directory, which
            // `inside` checked): never what it names.
            std::fs::remove_file(&stale).map_err(|e| format!("{}: {e}", stale.display()))?;
            changed = true;
        }
        let path = self.dir.join(keep);
        if std::fs::read(&path).is_ok_and(|old| old == bytes) {
            return Ok(changed);
        }
        // Through a link to the file it names (checked again here, as the
        // tree may have changed since the run began): the rename replaces
        // that file.
        let target = inside(root, &path)?;
        let dir = target.parent().unwrap_or(Path::new("."));
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: not a file name", target.display()))?;
        podstamp::write::write_atomic(dir, name, &bytes)
            .map_err(|e| format!("{}: {e}", target.display()))?;
        Ok(true)
    }
}

/// Where `--update` may write `path`, a case's expectation: the file it
/// names once every link on the way is followed (its directory's included),
/// when that lies inside `root` canonicalized; else the line refusing it,
/// naming the link and where it points.
fn inside(root: &Path, path: &Path) -> Result<PathBuf, String> {
    let within = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let refuse = |link: &Path, to: &Path| {
        format!(
            "{}: a link to {}, outside {} ({}): --update writes through links only inside DIR; nothing written (make it a file, or run on a DIR that holds what it names)",
            link.display(),
            to.display(),
            root.display(),
            within.display()
        )
    };
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let target = if is_link {
        std::fs::canonicalize(path).map_err(|_| {
            let to = std::fs::read_link(path).unwrap_or_default();
            format!(
                "{}: a link to {}, which does not exist: --update does not follow it; nothing written (remove it, or make it a file)",
                path.display(),
                to.display()
            )
        })?
    } else {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .ok_or_else(|| format!("{}: not a file name", path.display()))?;
        std::fs::canonicalize(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .join(name)
    };
    if target.starts_with(&within) {
        return Ok(target);
    }
    // Which link leaves: the file's own, or a directory on its way.
    let link = if is_link {
        path
    } else {
        path.parent().unwrap_or(path)
    };
    let to = if is_link {
        target.clone()
    } else {
        target.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    Err(refuse(link, &to))
}

/// Whether `case` is the case named `wanted`, or under the directory of
/// that name.
fn in_case(root: &Path, case: &Path, wanted: &str) -> bool {
    case.strip_prefix(root)
        .is_ok_and(|rest| rest.starts_with(wanted) || wanted == ".")
}

/// `file` in `dir`, or in the nearest directory above it up to `root`.
fn nearest(root: &Path, dir: &Path, file: &str) -> Option<PathBuf> {
    let mut at = dir;
    loop {
        let candidate = at.join(file);
        if candidate.is_file() {
            return Some(candidate);
        }
        if at == root {
            return None;
        }
        at = at.parent()?;
    }
}

/// `path` relative to `root` ("." for `root` itself), for names and messages.
fn relative(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rest) if rest.as_os_str().is_empty() => ".".to_string(),
        Ok(rest) => rest.display().to_string(),
        Err(_) => path.display().to_string(),
    }
}

/// `message` with `prefix` replaced by `by` where a path starts (at the
/// start, or after a space, a quote or a parenthesis), not inside one (`./`
/// is also the end of `../`).
fn replace_path_prefix(message: &str, prefix: &str, by: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(prefix) {
        let starts_path = at == 0 && out.is_empty()
            || rest[..at]
                .chars()
                .next_back()
                .or_else(|| out.chars().next_back())
                .is_some_and(|c| matches!(c, ' ' | '"' | '\'' | '(' | '`'));
        out.push_str(&rest[..at]);
        out.push_str(if starts_path { by } else { prefix });
        rest = &rest[at + prefix.len()..];
    }
    out.push_str(rest);
    out
}
