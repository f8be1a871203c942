//! Plugins written in Python (plugins/python/: the SDK, componentize-py):
//! the example `substitute-py`, built from source by plugins/python/build.sh,
//! gives the same bytes as the Rust `substitute` through `podstamp render`
//! (its golden cases and its errors) and through the daemon against the
//! real API server; and a Python plugin's output does not depend on the
//! clock, the random source or the environment, which the host fixes.

mod common;
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::{build_refused, declares_shown, plugin, podstamp_in, repo, stderr, stdout};
use serde_json::{Value, json};
use support::{Daemon, Kube, shared_server, unique, wait_for};

const CHECKPOINTER: &str = "examples/pod-checkpointer.yaml";
const NODE: &str = "examples/node.yaml";
/// The test plugin that shows what Python reads from WASI.
const CLOCK_SRC: &str = "tests/fixtures/python-clock";

/// Builds the Python plugins from source, once per test process, with the
/// project's own script (it installs componentize-py when missing and does
/// nothing when the components are up to date), and returns the path of
/// the component `name`: `substitute-py` (the example) or `python-clock`.
fn python_plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out_dir = repo().join("target/plugins");
        let build = |args: &[&str]| {
            let out = std::process::Command::new("bash")
                .arg("plugins/python/build.sh")
                .args(args)
                .current_dir(repo())
                .env("PODSTAMP_PLUGIN_DIR", &out_dir)
                .output()
                .expect("run plugins/python/build.sh");
            assert!(
                out.status.success(),
                "plugins/python/build.sh {args:?} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        build(&[]);
        let clock = out_dir.join("python-clock.wasm");
        build(&[CLOCK_SRC, clock.to_str().unwrap()]);
    });
    plugin(name)
}

/// The compiled code cache of these tests: compiling a Python component
/// (CPython inside) takes a debug build of podstamp a minute, so every
/// render and daemon here shares one, kept between runs.
fn cache_dir() -> PathBuf {
    repo().join("target/plugin-python-cache")
}

/// `path[,settings=FILE]` for --plugin.
fn spec(path: &Path, settings: Option<&str>) -> String {
    match settings {
        Some(file) => format!("{},settings={file}", path.display()),
        None => path.display().to_string(),
    }
}

/// Renders `template` (a path, or `-` for `stdin`) for the node through
/// the plugins; the exit code, stdout and stderr.
fn render(
    template: &str,
    stdin: Option<&str>,
    node: &[&str],
    plugins: &[String],
) -> (i32, String, String) {
    let cache = cache_dir();
    // A generous deadline: these tests are about output, not speed (a
    // Python call in a debug build on a busy machine can take longer than
    // the default 100 ms; the render benchmark measures it).
    let mut args = vec![
        "render",
        template,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--timeout",
        "10s",
        // The checkpointer is a control-plane pod (host network, host
        // paths): granted Pod Security level privileged, deliberately.
        "--pod-security",
        "privileged",
    ];
    args.extend_from_slice(node);
    for p in plugins {
        args.extend(["--plugin", p]);
    }
    let out = podstamp_in(&args, stdin.map(str::as_bytes));
    (out.status.code().unwrap_or(-1), stdout(&out), stderr(&out))
}

/// Renders the checkpointer for the example node, expecting success.
fn render_ok(plugins: &[String]) -> String {
    let (code, out, err) = render(CHECKPOINTER, None, &["--node", NODE], plugins);
    assert_eq!(
        (code, err.as_str()),
        (
            0,
            "podstamp: checked against Pod Security level privileged:latest (from --pod-security)\n"
        ),
        "render failed"
    );
    out
}

/// tests/cases/python: `substitute-py` alone and in the example chain, each
/// case's expected manifest a link to the Rust `substitute`'s
/// (tests/cases/rust), so passing is being byte-identical to it.
#[test]
fn substitute_py_is_byte_identical_to_substitute_on_its_golden_cases() {
    python_plugin("substitute-py");
    for name in ["arch-image", "node-env"] {
        plugin(name);
    }
    let cache = cache_dir();
    assert_eq!(
        common::pass_cases("python", &["--cache-dir", cache.to_str().unwrap()]),
        "ok      example-chain\n\
         ok      substitute\n\
         2 case(s) in tests/cases/python: 2 passed, 0 failed\n"
    );
}

/// What a failing render is given: a label, the template text (`None`: the
/// checkpointer as it is), the node flags and a settings file.
type Case<'a> = (&'a str, Option<String>, &'a [&'a str], Option<String>);

#[test]
fn substitute_py_fails_with_substitute_s_messages() {
    let python = python_plugin("substitute-py");
    let rust = plugin("substitute");
    let dir = tempfile::tempdir().unwrap();
    let settings = |name: &str, text: &str| {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        Some(path.display().to_string())
    };
    let yaml = fs::read_to_string(repo().join(CHECKPOINTER)).unwrap();
    // The checkpointer with one more annotation on its pod (annotations take any value).
    let annotated = |key: &str, value: &str| {
        let anchor = "    annotations:\n      checkpointer.alpha.coreos.com/checkpoint-of:";
        assert!(yaml.contains(anchor), "{CHECKPOINTER} changed");
        yaml.replace(
            anchor,
            &format!("    annotations:\n      {key}: {value}\n      checkpointer.alpha.coreos.com/checkpoint-of:"),
        )
    };
    let node = ["--node", NODE];
    let bare = ["--node-name", "bare"];
    let cases: Vec<Case> = vec![
        // tests/render.rs: a node without the address.
        ("no address", None, &bare, None),
        (
            "no such label",
            Some(annotated("x", "\"${node.label[pool]}\"")),
            &node,
            None,
        ),
        (
            "a key quoted in the path",
            Some(annotated("example.com/x", "\"${node.nam}\"")),
            &node,
            None,
        ),
        (
            "unterminated, escaped as Rust does",
            Some(annotated("x", "\"a\\t${node.name\\n\"")),
            &node,
            None,
        ),
        (
            "no such var",
            Some(annotated("x", "\"${var.zone}\"")),
            &node,
            settings("empty.yaml", "vars: {}\n"),
        ),
        (
            "settings of the wrong type (refused at load)",
            None,
            &node,
            settings("bad.json", r#"{"vars": {"a": 1}}"#),
        ),
        (
            "an unknown setting (refused at load)",
            None,
            &node,
            settings("unknown.json", r#"{"varz": {}}"#),
        ),
    ];
    for (what, template, node_args, settings) in cases {
        let run = |path: &Path| {
            let (source, stdin) = match &template {
                Some(text) => ("-", Some(text.as_str())),
                None => (CHECKPOINTER, None),
            };
            render(source, stdin, node_args, &[spec(path, settings.as_deref())])
        };
        let (py_code, py_out, py_err) = run(&python);
        let (rs_code, _, rs_err) = run(&rust);
        // Settings are refused at load (validate-settings, exit 2), the
        // rest when rendering (exit 1): the same for both.
        assert_eq!(
            (py_code, py_out.as_str()),
            (rs_code, ""),
            "{what}: {py_err}"
        );
        assert!(matches!(rs_code, 1 | 2), "{what}: {rs_err}");
        // The same line but for the plugin's name.
        assert_eq!(
            py_err.replace("substitute-py", "substitute"),
            rs_err,
            "{what}"
        );
        assert!(
            py_err.contains("`substitute-py` (substitute-py 0.1.0): ")
                || py_err.contains(
                    "(refused by the plugin substitute-py 0.1.0's validate-settings; fix the settings)"
                ),
            "{py_err}"
        );
    }
}

#[test]
fn a_python_plugin_sees_a_fixed_clock_random_source_and_environment() {
    let clock = spec(&python_plugin("python-clock"), None);
    let first = render_ok(std::slice::from_ref(&clock));
    // Another process, another moment: the same bytes.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(render_ok(std::slice::from_ref(&clock)), first);
    // The clocks stand at the Unix epoch and at 0, the environment is empty.
    for line in [
        "test.podstamp.io/time: \"0.0\"",
        "test.podstamp.io/monotonic: \"0.0\"",
        "test.podstamp.io/environ: \"[]\"",
    ] {
        assert!(first.contains(line), "no {line:?} in\n{first}");
    }
}

impl Kube {
    fn create_object<K>(&self, api: kube::Api<K>, object: Value)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize,
        K: std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object).unwrap();
        self.rt
            .block_on(api.create(&Default::default(), &object))
            .unwrap();
    }
}

#[test]
fn the_daemon_writes_the_same_manifest_with_substitute_py_as_with_substitute() {
    use k8s_openapi::api::core::v1::{Node, PodTemplate};
    let python = python_plugin("substitute-py");
    let server = shared_server();
    let ns = unique("python");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_object::<Node>(
        kube::Api::all(kube.client.clone()),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name, "labels": {"zone": "zone-a"}}}),
    );
    kube.create_object::<PodTemplate>(
        kube.templates(),
        json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "web", "labels": {"podstamp.io/enabled": "true"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"node": "${node.name}"}},
                "spec": {"containers": [{
                    "name": "main", "image": "nginx:1.27",
                    "command": ["serve", "--node=${node.name}", "--zone=${node.label[zone]}", "--say=${var.greeting}", "--cost=$${price}"]
                }]}
            }
        }),
    );
    let tmp = tempfile::tempdir().unwrap();
    // One daemon after the other, on the same node and namespace, each with
    // its own catalog and manifest directory: `substitute` is the Rust or
    // the Python component.
    let run_with = |label: &str, substitute: &Path| {
        let config = tmp.path().join(format!("{label}.yaml"));
        fs::write(
            &config,
            format!(
                "plugins:\n  substitute:\n    path: {}\n    settings: {{vars: {{greeting: hello}}}}\n    scope: [metadata, spec]\n  node-env:\n    path: {}\n    settings: {{nodeIP: \"\", labels: {{ZONE: zone}}}}\nchain: [substitute, node-env]\nlimits: {{timeout: 10s}}\n",
                substitute.display(),
                plugin("node-env").display()
            ),
        )
        .unwrap();
        let dir = tmp.path().join(label);
        fs::create_dir(&dir).unwrap();
        let kubeconfig = server.kubeconfig("admin");
        let cache = cache_dir();
        let daemon = Daemon::start(
            &[
                "--config",
                config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &ns,
                "--node-name",
                &node_name,
                "--manifest-dir",
                dir.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            tmp.path().join(format!("{label}.log")),
        );
        let web = dir.join("web.yaml");
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for("web.yaml", Duration::from_secs(30), || {
                daemon.assert_running();
                fs::read_to_string(&web).ok()
            })
        }));
        let text =
            found.unwrap_or_else(|_| panic!("no {}; log:\n{}", web.display(), daemon.logs()));
        let calls = daemon.metric(
            "podstamp_plugin_call_duration_seconds_count{plugin=\"substitute\",result=\"ok\"}",
        );
        assert!(calls >= 1.0, "{label}: substitute was not called");
        assert!(daemon.stop().success(), "{label}: podstamp run failed");
        common::kubelet_accepts(&[&web], &node_name);
        text
    };
    let from_rust = run_with("rust", &plugin("substitute"));
    let from_python = run_with("python", &python);
    assert_eq!(from_python, from_rust);
    for expected in [
        &format!("--node={node_name}") as &str,
        "--zone=zone-a",
        "--say=hello",
        "--cost=${price}",
        "value: zone-a",
    ] {
        assert!(
            from_python.contains(expected),
            "no {expected:?} in\n{from_python}"
        );
    }
}

/// The `declares:` line `render --explain` shows for this plugin alone.
fn declares_line(plugin: &Path) -> String {
    let (code, _, err) = render(
        CHECKPOINTER,
        None,
        &["--node", NODE, "--explain"],
        &[spec(plugin, None)],
    );
    assert_eq!(code, 0, "render --explain failed:\n{err}");
    declares_shown(&err)
}

/// A Python plugin declares its scope in app.py (`PODSTAMP_SCOPE`), which
/// plugins/python/build.sh writes into the component: the host reads it as
/// it reads the Rust SDK's `scope!`, and the example declares exactly what
/// its Rust twin declares.
#[test]
fn substitute_py_declares_the_scope_substitute_declares() {
    let line = declares_line(&python_plugin("substitute-py"));
    assert_eq!(line, "  declares: metadata, spec; granted: everything");
    assert_eq!(line, declares_line(&plugin("substitute")));
}

/// A `PODSTAMP_SCOPE` that is not a list of grants is refused by the build,
/// before componentize-py, in one line naming the file, the field and the
/// fix; nothing is written.
#[test]
fn a_python_plugin_whose_declared_scope_is_not_a_list_of_grants_is_refused_by_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app.py");
    let out = dir.path().join("bad.wasm");
    for (declaration, says) in [
        (
            "PODSTAMP_SCOPE = \"spec\"\n",
            format!(
                "{}:1: PODSTAMP_SCOPE must be a list of string literals, e.g. PODSTAMP_SCOPE = [\"spec.containers[*].env\"]",
                app.display()
            ),
        ),
        (
            "PODSTAMP_SCOPE = [\"spec\", \"spec.containers\\nmetadata\"]\n",
            format!(
                "{}: PODSTAMP_SCOPE: grant 'spec.containers\\nmetadata' is not a field path: write it as in a catalog entry's scope:",
                app.display()
            ),
        ),
    ] {
        fs::write(&app, declaration).unwrap();
        build_refused(
            "plugins/python/build.sh",
            dir.path(),
            &out,
            &format!("scope-section.py: error: {says}"),
            &format!("{declaration:?}"),
        );
    }
}

/// The host reads a Python component's declaration after componentize-py's
/// own sections, where the build appends it: a malformed one there (not
/// `podstamp-scope 1`) refuses the plugin at load, as a Rust plugin's
/// would be. The test fixture declares nothing; the section is appended
/// here by hand, since the build writes only well-formed ones.
#[test]
fn a_python_component_with_a_malformed_declaration_is_refused_at_load() {
    let mut bytes = fs::read(python_plugin("python-clock")).unwrap();
    let name = b"podstamp:scope";
    let data = b"podstamp-scope 2\nspec\n";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(data);
    bytes.push(0);
    bytes.push(u8::try_from(payload.len()).unwrap());
    bytes.extend(payload);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad-scope.wasm");
    fs::write(&bad, &bytes).unwrap();
    let (code, out, err) = render(CHECKPOINTER, None, &["--node", NODE], &[spec(&bad, None)]);
    assert_ne!(code, 0, "rendered with a malformed declaration:\n{out}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("its declared scope cannot be read")
            && err.contains(
                "its custom section podstamp:scope does not start with \"podstamp-scope 1\""
            ),
        "{err}"
    );
}
