//! The fault and adversarial suite: bad plugins, bad templates and a failing
//! disk, through the real `podstamp run` daemon (directory source, so no API
//! server is needed), with the kubelet's own decoder checking what is left on
//! disk.
//!
//! Every fault tried is a row of [`FAULTS`]; the test that injects it checks
//! the outcome the row claims (what is kept, the failure reason counted in
//! the metrics and the message in the log), and
//! `docs_reliability_md_is_the_fault_table` checks that docs/reliability.md is
//! exactly this table, so the document cannot drift from what is tested.
//! Regenerate it with `PODSTAMP_BLESS=1 cargo test --test faults docs_`.
//!
//! The disk tests mount small tmpfs file systems, so they need root (or
//! CAP_SYS_ADMIN) and mount(8); they fail, saying so, without them.

mod common;
#[path = "daemon/support.rs"]
mod support;
#[path = "faults/wat.rs"]
mod wat;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

const CONVERGE: Duration = Duration::from_secs(30);

/// One fault and its outcome, as the test that injects it checks it.
struct Fault {
    id: &'static str,
    area: &'static str,
    fault: &'static str,
    /// What stays on disk (and what keeps working).
    kept: &'static str,
    /// `podstamp_render_failures_total{reason=...}` and the log's `reason=`;
    /// or how else it is reported.
    reported: &'static str,
    /// Text the log (or stderr) contains.
    says: &'static str,
    /// The test function that injects it.
    test: &'static str,
}

const PLUGIN_KEPT: &str = "last good manifest, unchanged (same inode and mtime); the daemon stays up; other templates keep rendering";

const FAULTS: &[Fault] = &[
    Fault {
        id: "plugin-infinite-loop",
        area: "plugin",
        fault: "infinite loop",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "deadline of 300 ms exceeded; the call was stopped",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-deep-recursion",
        area: "plugin",
        fault: "unbounded recursion (stack overflow)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "stack overflow",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-memory-growth",
        area: "plugin",
        fault: "memory.grow until the cap (16 MiB here)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "memory cap of 16 MiB exceeded",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-oversized-output",
        area: "plugin",
        fault: "output of 128 KiB, over `limits.maxManifestSize: 64Ki`",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned 131072 bytes, over the limit of 65536",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-invalid-utf8",
        area: "plugin",
        fault: "output that is not UTF-8",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned malformed data: invalid utf-8",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-invalid-json",
        area: "plugin",
        fault: "output that is not JSON",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned invalid JSON",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-rename",
        area: "plugin",
        fault: "output that renames the pod (to `kube-apiserver`)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "changed the pod's name from \"f-rename\" to \"kube-apiserver\"",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-namespace",
        area: "plugin",
        fault: "output that sets `metadata.namespace: ../../etc`",
        kept: "the manifest is written with the namespace forced back to the daemon's (`kube-system`); nothing is written outside the manifest directory",
        reported: "not a failure: the namespace is podstamp's to set",
        says: "namespace: kube-system",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-panic",
        area: "plugin",
        fault: "a panic (the guest logs the panic message, then traps)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "the plugin logged: panicked at src/lib.rs:7:5: boom in the guest",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-filesystem",
        area: "plugin",
        fault: "a component importing `wasi:filesystem/preopens`",
        kept: "nothing is written: refused at load, `podstamp run` exits 2",
        reported: "exit code 2 and one line on stderr",
        says: "imports `wasi:filesystem/preopens@0.2.0`, which podstamp does not provide",
        test: "plugins_importing_wasi_are_refused_at_load",
    },
    Fault {
        id: "plugin-wasi-sockets",
        area: "plugin",
        fault: "a component importing `wasi:sockets/tcp`",
        kept: "nothing is written: refused at load, `podstamp run` exits 2",
        reported: "exit code 2 and one line on stderr",
        says: "imports `wasi:sockets/tcp@0.2.0`, which podstamp does not provide",
        test: "plugins_importing_wasi_are_refused_at_load",
    },
    Fault {
        id: "plugin-wasi-environment",
        area: "plugin",
        fault: "a component importing `wasi:cli/environment`",
        kept: "nothing is written: refused at load, `podstamp run` exits 2",
        reported: "exit code 2 and one line on stderr",
        says: "imports `wasi:cli/environment@0.2.0`, which podstamp does not provide",
        test: "plugins_importing_wasi_are_refused_at_load",
    },
];

fn row(id: &str) -> &'static Fault {
    FAULTS
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no fault {id:?} in FAULTS"))
}

fn render_table() -> String {
    let mut out = String::from(
        "# Reliability: faults tried and their outcomes\n\n\
         Generated from the fault suite (`tests/faults.rs`, table `FAULTS`); a test\n\
         checks that this file matches it, and each row's test checks the outcome\n\
         the row states. Regenerate: `PODSTAMP_BLESS=1 cargo test --test faults docs_`.\n\n\
         *Reported* is the `reason` label of `podstamp_render_failures_total` and of\n\
         the warning in the log (and of the Event, with the API source), unless it\n\
         says otherwise; *Message* is text the log line contains.\n\n\
         | Area | Fault | Kept | Reported | Message | Test |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for f in FAULTS {
        out.push_str(&format!(
            "| {} | {} | {} | {} | `{}` | `{}` |\n",
            f.area,
            f.fault,
            f.kept,
            f.reported,
            f.says.replace('|', "\\|"),
            f.test
        ));
    }
    out
}

#[test]
fn docs_reliability_md_is_the_fault_table() {
    let source = include_str!("faults.rs");
    for f in FAULTS {
        assert!(
            source.contains(&format!("fn {}()", f.test)),
            "fault {}: no test fn {}",
            f.id,
            f.test
        );
        assert!(
            source.matches(&format!("\"{}\"", f.id)).count() >= 2,
            "fault {}: no test checks it (expected a row({:?}) outside FAULTS)",
            f.id,
            f.id
        );
    }
    let path = common::repo().join("docs/reliability.md");
    let table = render_table();
    if std::env::var_os("PODSTAMP_BLESS").is_some() {
        fs::write(&path, &table).unwrap();
        return;
    }
    let doc = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        doc == table,
        "{} does not match the fault table in tests/faults.rs; regenerate it with PODSTAMP_BLESS=1 cargo test --test faults docs_",
        path.display()
    );
}

// ---------------------------------------------------------------- helpers

struct Env {
    tmp: tempfile::TempDir,
    templates: PathBuf,
    manifests: PathBuf,
    config: PathBuf,
    node_file: PathBuf,
}

/// A temp dir with templates/, manifests/ and a config whose catalog is the
/// hostile plugins; the default chain is the identity plugin.
fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    let manifests = tmp.path().join("manifests");
    fs::create_dir(&templates).unwrap();
    fs::create_dir(&manifests).unwrap();
    let plugins = tmp.path().join("plugins");
    fs::create_dir(&plugins).unwrap();
    let mut catalog = String::new();
    for name in [
        "identity",
        "loop",
        "recurse",
        "memory",
        "huge",
        "utf8",
        "notjson",
        "rename",
        "namespace",
        "panic",
    ] {
        let path = wat::write(&plugins, name, &wat::hostile(name));
        catalog.push_str(&format!("  {name}:\n    path: {}\n", path.display()));
    }
    let config = tmp.path().join("podstamp.yaml");
    fs::write(
        &config,
        format!(
            "plugins:\n{catalog}chain: [identity]\nlimits: {{timeout: 300ms, memory: 16Mi, maxManifestSize: 64Ki}}\n"
        ),
    )
    .unwrap();
    let node_file = tmp.path().join("node.yaml");
    fs::write(
        &node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: lab}}\n",
    )
    .unwrap();
    Env {
        tmp,
        templates,
        manifests,
        config,
        node_file,
    }
}

impl Env {
    fn start(&self, extra: &[&str], log: &str) -> Daemon {
        let source = format!("dir:{}", self.templates.display());
        let mut args = vec![
            "--config",
            self.config.to_str().unwrap(),
            "--source",
            &source,
            "--node-name",
            "n1",
            "--node-file",
            self.node_file.to_str().unwrap(),
            "--manifest-dir",
            self.manifests.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Daemon::start(&args, self.tmp.path().join(log))
    }

    /// Writes templates/`file` by rename, as an editor would.
    fn put(&self, file: &str, text: &str) {
        let path = self.templates.join(file);
        let temp = self.templates.join(format!(".{file}.tmp"));
        fs::write(&temp, text).unwrap();
        fs::rename(&temp, &path).unwrap();
    }

    fn manifest(&self, name: &str) -> PathBuf {
        self.manifests.join(format!("{name}.yaml"))
    }
}

/// A PodTemplate named `name`, with chain `plugins` (None: the default chain).
fn template(name: &str, plugins: Option<&str>, image: &str) -> String {
    let annotations = match plugins {
        Some(p) => format!("\n  annotations: {{podstamp.io/plugins: \"{p}\"}}"),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: {name}{annotations}\ntemplate:\n  spec:\n    containers:\n    - {{name: main, image: \"{image}\"}}\n"
    )
}

/// [`wait_for`], but a timeout shows the daemon's log.
fn wait_logged<T>(daemon: &Daemon, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        daemon.assert_running();
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "timed out after {CONVERGE:?} waiting for {what}; the daemon's log:\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

fn wait_content(daemon: &Daemon, path: &Path, needle: &str) -> String {
    wait_logged(
        daemon,
        &format!("{} to contain {needle:?}", path.display()),
        || read(path).filter(|t| t.contains(needle)),
    )
}

/// Waits for the warning about template `name` with `fault`'s reason and
/// message, and checks the failure is counted.
fn expect_failure(daemon: &Daemon, name: &str, fault: &Fault) -> String {
    let template = format!("template=kube-system/{name}");
    let reason = format!("reason=\"{}\"", fault.reported);
    let line = wait_logged(
        daemon,
        &format!("the log to report {} for {name}", fault.id),
        || {
            daemon
                .logs()
                .lines()
                .find(|l| {
                    l.contains("WARN")
                        && l.contains(&template)
                        && l.contains(&reason)
                        && l.contains(fault.says)
                })
                .map(str::to_string)
        },
    );
    let counted = daemon.metric(&format!(
        "podstamp_render_failures_total{{reason=\"{}\"}}",
        fault.reported
    ));
    assert!(counted >= 1.0, "{}: not counted in /metrics", fault.id);
    assert!(
        line.contains("the last good manifest stays"),
        "{}: {line}",
        fault.id
    );
    line
}

/// Every non-dot file in `dir` is accepted by the kubelet's decoder.
fn kubelet_accepts_dir(dir: &Path) {
    let files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    if !files.is_empty() {
        let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        kubelet_accepts(&refs, "n1");
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------- plugins

/// (fault id, hostile plugin) for the render-time plugin faults.
const BAD_PLUGINS: &[(&str, &str)] = &[
    ("plugin-infinite-loop", "loop"),
    ("plugin-deep-recursion", "recurse"),
    ("plugin-memory-growth", "memory"),
    ("plugin-oversized-output", "huge"),
    ("plugin-invalid-utf8", "utf8"),
    ("plugin-invalid-json", "notjson"),
    ("plugin-rename", "rename"),
    ("plugin-panic", "panic"),
];

#[test]
fn bad_plugins_keep_the_last_good_manifest() {
    let e = env();
    // One template per fault, first rendered through the good plugin.
    for (id, _) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        e.put(&format!("{name}.yaml"), &template(&name, None, "good:1"));
    }
    e.put("f-namespace.yaml", &template("f-namespace", None, "good:1"));
    e.put("control.yaml", &template("control", None, "control:1"));
    let daemon = e.start(&[], "plugins.log");
    daemon.wait_ready(CONVERGE);
    let mut before = Vec::new();
    for (id, _) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        wait_content(&daemon, &e.manifest(&name), "image: good:1");
        before.push((name.clone(), identity(&e.manifest(&name))));
    }
    wait_content(&daemon, &e.manifest("control"), "image: control:1");
    kubelet_accepts_dir(&e.manifests);

    // Now each picks its hostile plugin (and asks for a new image).
    for (id, plugin) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        e.put(
            &format!("{name}.yaml"),
            &template(&name, Some(plugin), "bad:1"),
        );
    }
    for ((id, _), (name, was)) in BAD_PLUGINS.iter().zip(&before) {
        expect_failure(&daemon, name, row(id));
        assert_eq!(
            identity(&e.manifest(name)),
            *was,
            "{id}: the last good manifest was touched"
        );
        assert!(read(&e.manifest(name)).unwrap().contains("image: good:1"));
    }
    assert!(
        !e.manifests.join("kube-apiserver.yaml").exists(),
        "plugin-rename: no manifest under the stolen name"
    );

    // The namespace is podstamp's: forced back, nothing outside the directory.
    let ns = row("plugin-namespace");
    e.put(
        "f-namespace.yaml",
        &template("f-namespace", Some("namespace"), "good:1"),
    );
    let text = wait_content(&daemon, &e.manifest("f-namespace"), "image: evil:1");
    assert!(text.contains(ns.says), "{text}");
    assert!(!text.contains("../"), "{text}");
    assert_eq!(
        names_in(e.tmp.path()),
        [
            "manifests",
            "node.yaml",
            "plugins",
            "plugins.log",
            "podstamp.yaml",
            "templates"
        ],
        "nothing written outside the manifest directory"
    );

    // Other templates keep rendering, and the daemon is still up.
    e.put("control.yaml", &template("control", None, "control:2"));
    wait_content(&daemon, &e.manifest("control"), "image: control:2");
    kubelet_accepts_dir(&e.manifests);
    daemon.assert_running();
    assert_eq!(daemon.get("/healthz").map(|r| r.0), Some(200));

    // A failing template recovers when its plugin is fixed.
    let name = "f-infinite-loop";
    e.put(&format!("{name}.yaml"), &template(name, None, "good:2"));
    wait_content(&daemon, &e.manifest(name), "image: good:2");
    assert!(daemon.stop().success());
}

#[test]
fn plugins_importing_wasi_are_refused_at_load() {
    for (id, package, interface, func) in [
        (
            "plugin-wasi-filesystem",
            "wasi:filesystem@0.2.0",
            "preopens",
            "get-directories",
        ),
        (
            "plugin-wasi-sockets",
            "wasi:sockets@0.2.0",
            "tcp",
            "connect",
        ),
        (
            "plugin-wasi-environment",
            "wasi:cli@0.2.0",
            "environment",
            "get-environment",
        ),
    ] {
        let fault = row(id);
        let e = env();
        let path = wat::write(
            e.tmp.path(),
            "wasi",
            &wat::importing(package, interface, func),
        );
        fs::write(
            &e.config,
            format!(
                "plugins:\n  wasi:\n    path: {}\nchain: [wasi]\n",
                path.display()
            ),
        )
        .unwrap();
        e.put("boot.yaml", &template("boot", None, "boot:1"));
        let out = common::podstamp(&[
            "run",
            "--config",
            e.config.to_str().unwrap(),
            "--source",
            &format!("dir:{}", e.templates.display()),
            "--node-name",
            "n1",
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
        ]);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{id}: {err}");
        assert!(err.contains(fault.says), "{id}: {err}");
        assert!(
            err.contains("plugins get no filesystem, network, clock, environment or arguments"),
            "{id}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{id}: one line: {err}");
        assert!(names_in(&e.manifests).is_empty(), "{id}: nothing written");
    }
}
