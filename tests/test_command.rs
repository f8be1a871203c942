//! `podstamp test DIR`, the golden tests plugin authors run in their CI:
//! what a failing case prints (a unified diff, the two error lines), that
//! `--update` records what renders and rewrites nothing that is already
//! right, that an expected error reads the same from any directory, and
//! that a malformed case stops the run with one line (exit 2). Each case
//! here is built in a temporary directory from the real example plugins;
//! the examples' own cases (tests/cases/) run in tests/render.rs,
//! tests/plugin_python.rs and tests/plugin_js.rs.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{plugin, repo, stderr, stdout};

/// `podstamp test` with `args`, run in `cwd`, with a compiled-code cache of
/// its own.
fn podstamp_test(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .arg("test")
        .args(args)
        .arg("--cache-dir")
        .arg(repo().join("target/test-plugin-cache"))
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .output()
        .expect("run podstamp test")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A directory of cases sharing the checkpointer template, the example node
/// and a one-plugin chain of arch-image (by absolute path), with one case
/// `arm64` (the shared node) and one `s390x` (a node of its own, for which
/// arch-image has no image). No expectations yet.
fn cases() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let copy = |from: &str, to: &str| {
        std::fs::copy(repo().join(from), root.join(to)).unwrap();
    };
    copy("examples/pod-checkpointer.yaml", "template.yaml");
    copy("examples/node.yaml", "node.yaml");
    write(
        &root.join("podstamp.yaml"),
        &format!(
            // The checkpointer runs on the host network, with host paths:
            // granted Pod Security level privileged, as a case must.
            "plugins:\n  arch-image:\n    path: {}\n    settingsFile: settings.yaml\n    scope:\n    - spec.containers[*].image\nchain: [arch-image]\npodSecurity: privileged\n",
            plugin("arch-image").display()
        ),
    );
    copy("tests/fixtures/arch-image.yaml", "settings.yaml");
    std::fs::create_dir(root.join("arm64")).unwrap();
    let node = std::fs::read_to_string(repo().join("examples/node.yaml")).unwrap();
    assert!(node.contains("architecture: arm64"), "{node}");
    write(
        &root.join("s390x/node.yaml"),
        &node.replace("architecture: arm64", "architecture: s390x"),
    );
    dir
}

/// The manifest `podstamp render` prints for `case` of [`cases`].
fn rendered(root: &Path, case: &str) -> String {
    let node = [root.join(case).join("node.yaml"), root.join("node.yaml")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap();
    let out = common::podstamp(&[
        "render",
        root.join("template.yaml").to_str().unwrap(),
        "--node",
        node.to_str().unwrap(),
        "--config",
        root.join("podstamp.yaml").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn update_records_what_renders_and_then_every_case_passes() {
    let dir = cases();
    let root = dir.path();

    // No expectation: the case fails and says how to record one.
    let out = podstamp_test(root, &["."]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("FAILED  arm64: no expected.yaml or expected.error: record what it renders with `podstamp test --update`"),
        "{text}"
    );
    assert_eq!(
        stderr(&out),
        "podstamp: error: 2 of 2 case(s) in . failed\n"
    );

    let out = podstamp_test(root, &[".", "--update"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "updated arm64\nupdated s390x\n2 case(s) in .: 2 updated\n"
    );
    // What `render` prints, and `render`'s error line.
    let expected = root.join("arm64/expected.yaml");
    assert_eq!(
        std::fs::read_to_string(&expected).unwrap(),
        rendered(root, "arm64")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("s390x/expected.error")).unwrap(),
        "PodTemplate kube-system/pod-checkpointer: plugin 1 of 1 `arch-image` (arch-image 0.1.0): spec.containers[0].image: no image for architecture s390x (have amd64, arm64)\n"
    );

    let out = podstamp_test(root, &["."]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "ok      arm64\nok      s390x\n2 case(s) in .: 2 passed, 0 failed\n"
    );

    // Up to date: nothing is rewritten.
    let before = std::fs::metadata(&expected).unwrap();
    let out = podstamp_test(root, &[".", "--update"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).ends_with("2 case(s) in .: 0 updated\n"));
    let after = std::fs::metadata(&expected).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );

    // A case that now fails: its manifest expectation becomes an error one.
    write(
        &root.join("arm64/node.yaml"),
        &std::fs::read_to_string(root.join("s390x/node.yaml")).unwrap(),
    );
    let out = podstamp_test(root, &[".", "--update"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!expected.exists());
    assert_eq!(
        std::fs::read(root.join("arm64/expected.error")).unwrap(),
        std::fs::read(root.join("s390x/expected.error")).unwrap()
    );
}

#[test]
fn a_failing_case_prints_a_unified_diff_or_both_error_lines() {
    let dir = cases();
    let root = dir.path();
    let manifest = rendered(root, "arm64");
    let altered = manifest.replace("v0.4.2-arm64", "v0.4.1-arm64");
    assert_ne!(altered, manifest);
    write(&root.join("arm64/expected.yaml"), &altered);
    write(&root.join("s390x/expected.error"), "no image for s390x\n");

    let out = podstamp_test(Path::new("/"), &[root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let image = manifest
        .lines()
        .find(|l| l.contains("v0.4.2-arm64"))
        .unwrap();
    let diff = "FAILED  arm64: the manifest differs from expected.yaml\n--- expected.yaml\n+++ rendered\n@@ ";
    assert!(text.contains(diff), "{text}");
    assert!(
        text.contains(&format!(
            "\n-{}\n+{image}\n",
            image.replace("v0.4.2", "v0.4.1")
        )),
        "{text}"
    );
    assert!(
        text.contains("FAILED  s390x: the error differs from expected.error\n  expected: no image for s390x\n  rendered: PodTemplate kube-system/pod-checkpointer: plugin 1 of 1 `arch-image`"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "2 case(s) in {}: 0 passed, 2 failed\n",
            root.display()
        )),
        "{text}"
    );
    // One line on stderr, as every podstamp error.
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));

    // Expecting an error and rendering a manifest, and the other way round.
    std::fs::remove_file(root.join("arm64/expected.yaml")).unwrap();
    write(&root.join("arm64/expected.error"), "some error\n");
    std::fs::remove_file(root.join("s390x/expected.error")).unwrap();
    write(&root.join("s390x/expected.yaml"), &manifest);
    let text = stdout(&podstamp_test(root, &["."]));
    assert!(
        text.contains("FAILED  arm64: expected the error in expected.error:\n  some error\nthe render succeeded:\n  # Written by podstamp from PodTemplate kube-system/pod-checkpointer."),
        "{text}"
    );
    assert!(
        text.contains("FAILED  s390x: expected the manifest in expected.yaml, the render failed:\n  PodTemplate kube-system/pod-checkpointer: plugin 1 of 1"),
        "{text}"
    );
}

/// An error line names files relative to the directory of cases, so an
/// expectation does not depend on where the test is run from; and nothing
/// in the environment changes a case.
#[test]
fn an_expected_error_reads_the_same_from_any_directory_and_any_environment() {
    let dir = cases();
    let root = dir.path();
    write(
        &root.join("missing/podstamp.yaml"),
        &format!(
            "plugins:\n  arch-image:\n    path: {}\n    settingsFile: ../settings-gone.yaml\nchain: [arch-image]\npodSecurity: privileged\n",
            plugin("arch-image").display()
        ),
    );
    let out = podstamp_test(root, &[".", "missing", "--update"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The field, and the file relative to the case.
    assert_eq!(
        std::fs::read_to_string(root.join("missing/expected.error")).unwrap(),
        "plugins.arch-image.settingsFile: ../settings-gone.yaml: No such file or directory (os error 2)\n"
    );

    let parent = root.parent().unwrap();
    let name = root.file_name().unwrap().to_str().unwrap();
    for (cwd, arg) in [
        (root.to_path_buf(), ".".to_string()),
        (root.to_path_buf(), "./".to_string()),
        (parent.to_path_buf(), format!("{name}/")),
        (repo(), root.display().to_string()),
    ] {
        let out = podstamp_test(&cwd, &[&arg]);
        // The two other cases have no expectation: 1; `missing` passes.
        assert_eq!(out.status.code(), Some(1), "{arg}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("ok      missing\n"),
            "{arg}: {}",
            stdout(&out)
        );
    }

    podstamp_test(root, &[".", "--update"]);
    let out = Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args(["test", "."])
        .current_dir(root)
        .env("PODSTAMP_NAMESPACE", "elsewhere")
        .env("PODSTAMP_MAX_MANIFEST_SIZE", "10")
        .env("PODSTAMP_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}

#[test]
fn a_malformed_case_stops_the_run_with_one_line_and_exit_2() {
    // No node anywhere up to DIR.
    let dir = cases();
    let root = dir.path();
    std::fs::remove_file(root.join("node.yaml")).unwrap();
    let out = podstamp_test(root, &["."]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "podstamp: error: case arm64: no node.yaml in it or above it up to .: add the Node to render for\n"
    );
    assert_eq!(stdout(&out), "", "no case runs");

    // Both expectations.
    let dir = cases();
    let root = dir.path();
    write(&root.join("arm64/expected.yaml"), "x\n");
    write(&root.join("arm64/expected.error"), "x\n");
    let out = podstamp_test(root, &["."]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "podstamp: error: case arm64: both expected.yaml and expected.error: a case expects a manifest or an error, remove one\n"
    );

    // A case that is not there.
    let out = podstamp_test(root, &[".", "amd64"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "podstamp: error: amd64: no such case in .\n");

    // Not a directory.
    let out = podstamp_test(root, &["nowhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "podstamp: error: nowhere: not a directory of test cases\n"
    );
}

/// Cases that share a golden file by a symbolic link (as the Python and
/// JavaScript examples share the Rust ones') keep sharing it on update.
#[test]
fn update_writes_through_a_symbolic_link_to_the_shared_golden_file() {
    let dir = cases();
    let root = dir.path();
    write(&root.join("golden/arm64.yaml"), "stale\n");
    std::os::unix::fs::symlink("../golden/arm64.yaml", root.join("arm64/expected.yaml")).unwrap();
    let out = podstamp_test(root, &[".", "arm64/", "--update"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(root.join("arm64/expected.yaml"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(root.join("golden/arm64.yaml")).unwrap(),
        rendered(root, "arm64")
    );
}

/// Finding 7 of the second security review: a link in a case directory
/// that leaves DIR (a case from a pull request pointing at `~/.bashrc`) is
/// refused by `--update` in one line naming the link and where it points,
/// and nothing is written: neither the file it names, nor any other case.
#[test]
fn update_refuses_a_link_that_leaves_dir_and_writes_nothing() {
    let dir = cases();
    let root = dir.path();
    let elsewhere = tempfile::tempdir().unwrap();
    let bashrc = elsewhere.path().join(".bashrc");
    write(&bashrc, "alias ls='ls --color'\n");
    let outside = std::fs::canonicalize(&bashrc).unwrap();
    std::os::unix::fs::symlink(&bashrc, root.join("arm64/expected.yaml")).unwrap();
    let out = podstamp_test(root, &[".", "--update"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let line = stderr(&out);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with(&format!(
            "podstamp: error: ./arm64/expected.yaml: a link to {}, outside . (",
            outside.display()
        )) && line.contains("nothing written"),
        "{line}"
    );
    assert_eq!(
        std::fs::read_to_string(&bashrc).unwrap(),
        "alias ls='ls --color'\n"
    );
    assert!(
        !root.join("s390x/expected.error").exists(),
        "another case was written"
    );
    assert_eq!(stdout(&out), "", "no case was run");

    // The same through the link `expected.error` would be removed by (the
    // case renders a manifest), and through a case directory that is a
    // link out of DIR.
    std::fs::remove_file(root.join("arm64/expected.yaml")).unwrap();
    std::os::unix::fs::symlink(&bashrc, root.join("arm64/expected.error")).unwrap();
    let out = podstamp_test(root, &[".", "arm64", "--update"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("./arm64/expected.error: a link to "),
        "{}",
        stderr(&out)
    );
    assert!(std::fs::symlink_metadata(root.join("arm64/expected.error")).is_ok());
    std::fs::remove_file(root.join("arm64/expected.error")).unwrap();
    let away = elsewhere.path().join("case");
    std::fs::create_dir(&away).unwrap();
    std::os::unix::fs::symlink(&away, root.join("away")).unwrap();
    let out = podstamp_test(root, &[".", "--update"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!(
            "./away: a link to {}, outside .",
            std::fs::canonicalize(&away).unwrap().display()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_dir(&away).unwrap().count(),
        0,
        "written outside DIR"
    );
    assert_eq!(
        std::fs::read_to_string(&bashrc).unwrap(),
        "alias ls='ls --color'\n"
    );
}
