//! Shared by the integration tests: paths, the built plugins, the binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A plugin component built by plugins/build.sh. Fails, saying how to build
/// it, when it is missing.
pub fn plugin(name: &str) -> PathBuf {
    let path = repo().join("target/plugins").join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the plugins with `bash plugins/build.sh` (the test command `bash tests/run.sh` does it)",
        path.display()
    );
    path
}

pub fn podstamp(args: &[&str]) -> Output {
    podstamp_in(args, None)
}

/// Runs the podstamp binary from the repo root, with `stdin` if given.
pub fn podstamp_in(args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut command = Command::new(env!("CARGO_BIN_EXE_podstamp"));
    command
        .args(args)
        .current_dir(repo())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("run podstamp");
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// Runs `command`, failing with its output unless it succeeds; its stdout.
pub fn run_ok(command: &mut Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// The expected manifest of the example case `case` (tests/cases/`case`/expected.yaml).
pub fn expected(case: &str) -> String {
    let path = repo().join("tests/cases").join(case).join("expected.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (record it with `podstamp test tests/cases --update`)",
            path.display()
        )
    })
}

/// Runs `podstamp test tests/cases/`group` `args…` from the repo root and
/// returns what it printed, panicking with it unless every case passed.
pub fn pass_cases(group: &str, args: &[&str]) -> String {
    let dir = format!("tests/cases/{group}");
    let mut all = vec!["test", dir.as_str()];
    all.extend_from_slice(args);
    let out = podstamp(&all);
    assert!(
        out.status.success(),
        "`podstamp test {dir}` failed (if the change is meant, record it with `podstamp test {dir} --update`):\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// podstamp's pod check, built by tests/harness/build-kubecheck.sh into
/// target/kubecheck (where podstamp finds it from target/*/podstamp).
pub fn kubecheck() -> PathBuf {
    let path = repo().join("target/kubecheck/podstamp-kubecheck");
    assert!(
        path.is_file(),
        "{} is missing: build it with `bash tests/harness/build-kubecheck.sh` (the test command `bash tests/run.sh` does it)",
        path.display()
    );
    path
}

/// A binary of the Go test harness, built by tests/harness/build.sh.
pub fn harness_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("PODSTAMP_HARNESS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/harness"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the test harness with `bash tests/harness/build.sh` (the test command `bash tests/run.sh` does it)",
        path.display()
    );
    path
}

/// Runs the kubelet's own static pod file decoder on `paths`, as the kubelet
/// of node `node` would; panics with its verdicts unless it accepts every file.
pub fn kubelet_accepts(paths: &[&Path], node: &str) {
    let out = Command::new(harness_bin("podstamp-manifestcheck"))
        .arg("--node-name")
        .arg(node)
        .args(paths)
        .output()
        .expect("run podstamp-manifestcheck");
    assert!(
        out.status.success(),
        "the kubelet's decoder rejects a manifest ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kubelet's verdict on every file of `dir`, by file name, from its own
/// static pod file source (the harness's podstamp-manifestcheck) run once
/// over the directory as the kubelet of node `node`: Ok, or its error text.
/// Panics when the harness itself fails (exit 3, or output it cannot read).
pub fn kubelet_verdicts(
    dir: &Path,
    node: &str,
) -> std::collections::BTreeMap<String, Result<(), String>> {
    let out = Command::new(harness_bin("podstamp-manifestcheck"))
        .arg("--node-name")
        .arg(node)
        .arg(dir)
        .output()
        .expect("run podstamp-manifestcheck");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "podstamp-manifestcheck failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut verdicts = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let result: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("podstamp-manifestcheck printed {line:?}: {e}"));
        let file = Path::new(result["file"].as_str().expect("a file"))
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let verdict = if result["ok"] == serde_json::Value::Bool(true) {
            Ok(())
        } else {
            Err(result["error"].as_str().unwrap_or_default().to_string())
        };
        verdicts.insert(file, verdict);
    }
    verdicts
}
