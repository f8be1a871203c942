//! `podstamp plugin new NAME --lang rust|python|js`, as a plugin author
//! uses it: a project made in a temporary directory outside podstamp's
//! tree, its unit tests run natively, built by its own `build.sh` (which
//! runs podstamp's build for the language), and its `podstamp test` cases
//! passing; then the same cases failing, with a diff, once the chain's
//! settings change. And the command's refusals, each one line.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{podstamp, repo, stderr, stdout};

fn run(command: &mut Command) -> Output {
    let out = command.output().expect("run a command");
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    out
}

/// Makes a project for `lang` in a new temporary directory (outside the
/// repository), runs `native_test` in it, builds it and runs its cases.
fn scaffold_builds_and_passes_its_cases(lang: &str, native_test: Option<&[&str]>) {
    let tmp = tempfile::Builder::new()
        .prefix("podstamp-scaffold-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    assert!(!tmp.path().starts_with(repo()));
    let dir = tmp.path().join("my-plugin");
    let name = format!("demo-{lang}");
    let out = podstamp(&[
        "plugin",
        "new",
        &name,
        "--lang",
        lang,
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!(
            "created {} ({lang} plugin {name}); next: cd ",
            dir.display()
        )),
        "{}",
        stdout(&out)
    );
    for file in [
        "build.sh",
        "README.md",
        ".gitignore",
        "tests/template.yaml",
        "tests/node.yaml",
        "tests/podstamp.yaml",
        "tests/basic/expected.yaml",
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.starts_with(&format!("# {name}\n")), "{readme}");
    assert!(!readme.contains("{{"), "a placeholder left: {readme}");

    if let Some(argv) = native_test {
        let mut command = Command::new(argv[0]);
        command.args(&argv[1..]).current_dir(&dir);
        if lang == "rust" {
            // The SDK's dependencies compiled once for every run.
            command.env("CARGO_TARGET_DIR", repo().join("target/scaffold-native"));
        }
        run(&mut command);
    }

    let mut build = Command::new("bash");
    build.arg("build.sh").current_dir(&dir);
    if lang == "rust" {
        // std for wasm32, built by the examples' build already.
        build.env("PODSTAMP_PLUGIN_TARGET_DIR", repo().join("target/wasm32"));
    }
    run(&mut build);
    let component = dir.join(format!("target/{name}.wasm"));
    assert!(component.is_file(), "{} missing", component.display());

    // A deadline for a debug build of podstamp on a busy machine (a
    // CPython or SpiderMonkey component); the cases are about output.
    let config = dir.join("tests/podstamp.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}limits:\n  timeout: 10s\n")).unwrap();
    let cache = repo().join("target/test-plugin-cache");
    let test = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_podstamp"));
        command
            .args(["test", "tests", "--cache-dir"])
            .arg(&cache)
            .args(extra)
            .current_dir(&dir)
            .env_remove("RUST_LOG");
        command.output().unwrap()
    };
    let out = test(&[]);
    assert_eq!(
        (out.status.code(), stdout(&out).as_str()),
        (
            Some(0),
            "ok      basic\n1 case(s) in tests: 1 passed, 0 failed\n"
        ),
        "{}",
        stderr(&out)
    );
    let expected = std::fs::read_to_string(dir.join("tests/basic/expected.yaml")).unwrap();
    assert!(expected.contains("    cpu: arm64\n"), "{expected}");

    // The cases can fail: another label key.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("label: cpu", "label: gpu"),
    )
    .unwrap();
    let out = test(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("FAILED  basic: the manifest differs from expected.yaml\n"),
        "{text}"
    );
    assert!(
        text.contains("\n-    cpu: arm64\n") && text.contains("\n+    gpu: arm64\n"),
        "{text}"
    );
}

#[test]
fn a_rust_plugin_made_outside_the_tree_builds_and_passes_its_cases() {
    // The host's toolchain for the native unit tests (rustup's cargo).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    scaffold_builds_and_passes_its_cases("rust", Some(&[&cargo, "test", "--quiet"]));
}

#[test]
fn a_python_plugin_made_outside_the_tree_builds_and_passes_its_cases() {
    scaffold_builds_and_passes_its_cases("python", Some(&["python3", "-m", "unittest"]));
}

#[test]
fn a_javascript_plugin_made_outside_the_tree_builds_and_passes_its_cases() {
    scaffold_builds_and_passes_its_cases("js", None);
}

#[test]
fn plugin_new_refuses_with_one_line_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let at = |name: &str| tmp.path().join(name).display().to_string();
    let fails = |args: &[&str]| {
        let out = podstamp(args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(stdout(&out), "");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let err = fails(&["plugin", "new", "My_Plugin", "--dir", &at("a")]);
    assert!(
        err.starts_with(
            "podstamp: error: NAME \"My_Plugin\": use lowercase letters, digits and '-'"
        ),
        "{err}"
    );
    std::fs::create_dir(tmp.path().join("full")).unwrap();
    std::fs::write(tmp.path().join("full/keep"), "mine").unwrap();
    let err = fails(&["plugin", "new", "p", "--dir", &at("full")]);
    assert!(
        err.contains("exists and is not empty; choose another directory"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("full/keep")).unwrap(),
        "mine"
    );
    let err = fails(&[
        "plugin",
        "new",
        "p",
        "--lang",
        "python",
        "--dir",
        &at("b"),
        "--plugins",
        &at("full"),
    ]);
    assert!(
        err.contains("no python/build.sh in it: give --plugins DIR, the plugins/ directory of a podstamp checkout"),
        "{err}"
    );
    // Nothing left behind, not even the staging directory.
    let left: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left, vec![tmp.path().join("full")]);

    // An empty directory is used.
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let out = podstamp(&["plugin", "new", "p", "--dir", &at("empty")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(Path::new(&at("empty")).join("src/lib.rs").is_file());
}

/// Finding 8 of the second security review: `plugin new` staged in
/// `.NAME.podstamp-new-PID` beside `--dir` and followed a symbolic link
/// planted there. Here the link is planted at exactly that name before
/// podstamp starts (a shell that waits for a line, then `exec`s podstamp
/// under its own PID): nothing is written through it, and the project is
/// made where it was asked.
#[test]
fn plugin_new_writes_nothing_through_a_link_planted_at_the_staging_name() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let dir = tmp.path().join("p");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read -r _ && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_podstamp"))
        .args(["plugin", "new", "p", "--dir"])
        .arg(&dir)
        .current_dir(repo())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sh");
    let planted = tmp.path().join(format!(".p.podstamp-new-{}", child.id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("created "), "{}", stdout(&out));
    assert_eq!(
        std::fs::read_dir(&victim).unwrap().count(),
        0,
        "written through the link planted at {}",
        planted.display()
    );
    assert!(
        std::fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the planted link is left as it was"
    );
    assert!(dir.join("src/lib.rs").is_file());
    // Nothing else left beside it: the victim, the link, the project.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 3);
}
