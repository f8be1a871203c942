//! `podstamp render` and `podstamp plugin inspect` through the binary, with
//! the real example plugins compiled from plugins/: the golden cases of each
//! plugin and of the example chain (tests/cases/rust, run by `podstamp
//! test`), byte stability, and every error with its message and exit code.

mod common;
// For the harness's kube-apiserver; this file takes the rest from `common`.
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;
#[path = "faults/wat.rs"]
mod wat_plugins;

use common::{expected, plugin, stderr, stdout};

/// Every template rendered here is a control-plane example (host network,
/// host paths), so each `render` is granted Pod Security level privileged
/// with the flag, deliberately, as its operator would grant it
/// (tests/pod_security.rs holds the levels themselves). The one line saying
/// which level was checked is asserted and taken off stderr, so that what
/// these tests say of stderr ("nothing else") still holds.
fn podstamp(args: &[&str]) -> std::process::Output {
    podstamp_in(args, None)
}

/// [`podstamp`] with `stdin`.
fn podstamp_in(args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let render = args.first() == Some(&"render");
    let mut args = args.to_vec();
    if render && !args.contains(&"--pod-security") {
        args.extend(["--pod-security", "privileged"]);
    }
    let mut out = common::podstamp_in(&args, stdin);
    if render && out.status.success() {
        let text = String::from_utf8(out.stderr).unwrap();
        let line = "podstamp: checked against Pod Security level ";
        let (said, rest): (Vec<&str>, Vec<&str>) = text
            .split_inclusive('\n')
            .partition(|l| l.starts_with(line));
        assert_eq!(said.len(), 1, "one line names the level: {text}");
        out.stderr = rest.concat().into_bytes();
    }
    out
}

const CHECKPOINTER: &str = "examples/pod-checkpointer.yaml";
const NODE: &str = "examples/node.yaml";

fn with_plugin(name: &str, settings: Option<&str>) -> String {
    let path = plugin(name).display().to_string();
    match settings {
        Some(file) => format!("{path},settings={file}"),
        None => path,
    }
}

/// Renders the checkpointer for the example node through `plugins`, expecting success.
fn render_ok(plugins: &[String]) -> String {
    let mut args = vec!["render", CHECKPOINTER, "--node", NODE, "--no-cache"];
    for p in plugins {
        args.extend(["--plugin", p]);
    }
    let out = podstamp(&args);
    assert!(out.status.success(), "render failed: {}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "",
        "a successful render prints nothing on stderr"
    );
    stdout(&out)
}

/// Runs podstamp, expecting it to fail with `code` and one line on stderr.
fn fails(args: &[&str], stdin: Option<&str>, code: i32) -> String {
    let out = podstamp_in(args, stdin.map(str::as_bytes));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(stdout(&out), "", "nothing on stdout when it fails");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err.trim_end()
        .strip_prefix("podstamp: error: ")
        .unwrap_or_else(|| panic!("{err}"))
        .to_string()
}

/// Renders the checkpointer for the node described by `node_args` through
/// one plugin, expecting a failed render; returns the error line.
fn render_fails(node_args: &[&str], plugin_spec: &str) -> String {
    let mut args = vec!["render", CHECKPOINTER];
    args.extend_from_slice(node_args);
    args.extend(["--plugin", plugin_spec, "--no-cache"]);
    fails(&args, None, 1)
}

#[test]
fn passthrough_is_golden_and_byte_stable() {
    let first = render_ok(&[]);
    assert_eq!(first, expected("rust/passthrough"));
    for _ in 0..3 {
        assert_eq!(render_ok(&[]), first);
    }
    // The same bytes through --output, a JSON template and stdin.
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("m.yaml");
    let out = podstamp(&[
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "-o",
        out_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), first);
    let yaml = std::fs::read(common::repo().join(CHECKPOINTER)).unwrap();
    let value: serde_json::Value = serde_norway::from_slice(&yaml).unwrap();
    let json = serde_json::to_string_pretty(&value).unwrap();
    let out = podstamp_in(&["render", "-", "--node", NODE], Some(json.as_bytes()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), first);
}

#[test]
fn identity_changes_nothing() {
    assert_eq!(render_ok(&[with_plugin("identity", None)]), render_ok(&[]));
}

/// The example plugins' golden cases, as a plugin author runs them: each
/// plugin alone with its settings, the example chain, and an error line.
#[test]
fn the_example_plugins_pass_their_golden_cases() {
    for name in ["arch-image", "node-env", "substitute"] {
        plugin(name);
    }
    assert_eq!(
        common::pass_cases("rust", &["--no-cache"]),
        "ok      arch-image\n\
         ok      arch-image-unknown-arch\n\
         ok      example-chain\n\
         ok      node-env\n\
         ok      passthrough\n\
         ok      substitute\n\
         6 case(s) in tests/cases/rust: 6 passed, 0 failed\n"
    );
}

#[test]
fn the_example_chain_is_golden_and_matches_the_flag_form() {
    plugin("arch-image");
    let out = podstamp(&[
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--config",
        "examples/podstamp.yaml",
        "--no-cache",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let from_config = stdout(&out);
    assert_eq!(from_config, expected("rust/example-chain"));
    let from_flags = render_ok(&[
        with_plugin("arch-image", Some("tests/fixtures/arch-image.yaml")),
        with_plugin("node-env", Some("tests/fixtures/node-env.yaml")),
        with_plugin("substitute", None),
    ]);
    assert_eq!(from_flags, from_config);
    for expected in [
        "image: quay.io/coreos/pod-checkpointer:v0.4.2-arm64",
        "--node-ip=10.0.12.7",
        "value: eu-west-1b",
        "checkpointer.alpha.coreos.com/checkpoint-of: worker-eu-1",
    ] {
        assert!(
            from_config.contains(expected),
            "missing {expected:?} in\n{from_config}"
        );
    }
}

#[test]
fn the_compiled_code_cache_gives_the_same_output() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let args = |cache: &str| {
        podstamp(&[
            "render",
            CHECKPOINTER,
            "--node",
            NODE,
            "--config",
            "examples/podstamp.yaml",
            "--cache-dir",
            cache,
        ])
    };
    let cold = args(cache.to_str().unwrap());
    assert!(cold.status.success(), "{}", stderr(&cold));
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        4,
        "one entry per catalog plugin"
    );
    let warm = args(cache.to_str().unwrap());
    assert_eq!(stdout(&warm), stdout(&cold));
}

#[test]
fn a_template_picks_its_chain_from_the_catalog_only() {
    let yaml = std::fs::read_to_string(common::repo().join(CHECKPOINTER)).unwrap();
    let pick = |list: &str| {
        yaml.replace(
            "  labels:\n    podstamp.io/enabled: \"true\"\n",
            &format!("  labels:\n    podstamp.io/enabled: \"true\"\n  annotations:\n    podstamp.io/plugins: \"{list}\"\n"),
        )
    };
    let args = [
        "render",
        "-",
        "--node",
        NODE,
        "--config",
        "examples/podstamp.yaml",
        "--no-cache",
    ];
    let out = podstamp_in(&args, Some(pick("identity").as_bytes()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("${node.name}"),
        "identity only: placeholders stay"
    );
    let err = fails(&args, Some(&pick("node-env, nope")), 1);
    assert_eq!(
        err,
        r#"PodTemplate kube-system/pod-checkpointer: metadata.annotations["podstamp.io/plugins"]: unknown plugin "nope" (the catalog has: arch-image, identity, node-env, substitute)"#
    );
}

#[test]
fn plugin_errors_name_the_template_the_plugin_and_the_field() {
    let node_env = with_plugin("node-env", Some("tests/fixtures/node-env.yaml"));
    let err = render_fails(
        &[
            "--node-name",
            "bare",
            "--node-address",
            "InternalIP=10.0.0.9",
        ],
        &node_env,
    );
    assert!(
        err.starts_with(
            "PodTemplate kube-system/pod-checkpointer: plugin 1 of 1 `node-env` (node-env 0.1.0): "
        ),
        "{err}"
    );
    assert!(err.contains("topology.kubernetes.io/zone"), "{err}");

    let substitute = with_plugin("substitute", None);
    let err = render_fails(&["--node-name", "bare"], &substitute);
    assert!(err.contains("spec.containers[0].command[5]"), "{err}");
    assert!(err.contains("${node.address.InternalIP}"), "{err}");

    let arch = with_plugin(
        "arch-image",
        Some("tests/fixtures/arch-image-amd64-only.json"),
    );
    let err = render_fails(&["--node", NODE], &arch);
    assert_eq!(
        err,
        "PodTemplate kube-system/pod-checkpointer: plugin 1 of 1 `arch-image` (arch-image 0.1.0): spec.containers[0].image: no image for architecture arm64 (have amd64)"
    );
}

/// Renders the checkpointer with arch-image and these settings (written to
/// `file_name`), expecting a failed render; returns the error line.
fn arch_image_fails_with(file_name: &str, settings: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file_name);
    std::fs::write(&path, settings).unwrap();
    let arch = format!(
        "{},settings={}",
        plugin("arch-image").display(),
        path.display()
    );
    render_fails(&["--node", NODE], &arch)
}

#[test]
fn the_result_of_the_chain_is_validated() {
    let err = arch_image_fails_with(
        "s.yaml",
        "images: {pod-checkpointer: {arm64: \"bad-image \"}}\n",
    );
    assert_eq!(
        err,
        r#"PodTemplate kube-system/pod-checkpointer: the pod returned by the plugin chain is invalid: spec.containers[0].image: "bad-image " has leading or trailing whitespace; remove it"#
    );
}

#[test]
fn template_errors_name_the_file_and_field() {
    let args = ["render", "-", "--node-name", "n1"];
    let err = fails(
        &args,
        Some("apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: [x\n"),
        1,
    );
    assert!(
        err.starts_with("<stdin>:5:1: did not find expected ',' or ']'"),
        "{err}"
    );
    let err = fails(
        &args,
        Some(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\ntemplate:\n  spec:\n    containers: [{name: web, image: nginx, ports: [{containerPort: http}]}]\n",
        ),
        1,
    );
    assert_eq!(
        err,
        "<stdin>: template.spec.containers[0].ports[0].containerPort: invalid type: string \"http\", expected i32"
    );
    let err = fails(
        &args,
        Some(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\ntemplate:\n  spec: {containers: []}\n",
        ),
        1,
    );
    assert_eq!(
        err,
        "PodTemplate default/web: the template's pod is invalid: spec.containers: must list at least one container"
    );
    let err = fails(
        &args,
        Some(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: ../../etc/passwd}\ntemplate: {spec: {}}\n",
        ),
        1,
    );
    assert!(
        err.starts_with(
            "<stdin>: metadata.name: \"../../etc/passwd\" is not a valid DNS-1123 subdomain"
        ),
        "{err}"
    );
    let err = fails(&["render", "missing.yaml", "--node-name", "n1"], None, 2);
    assert_eq!(err, "missing.yaml: No such file or directory (os error 2)");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(
        fails(&["render", CHECKPOINTER], None, 2),
        "say which node to render for: --node FILE or --node-name NAME"
    );
    assert_eq!(
        fails(
            &[
                "render",
                CHECKPOINTER,
                "--node-name",
                "n",
                "--node-label",
                "novalue"
            ],
            None,
            2
        ),
        "--node-label \"novalue\": expected KEY=VALUE"
    );
    assert_eq!(
        fails(
            &[
                "render",
                CHECKPOINTER,
                "--node-name",
                "n",
                "--timeout",
                "soon"
            ],
            None,
            2
        ),
        "--timeout: \"soon\" is not a duration such as 100ms or 2s"
    );
    assert_eq!(
        fails(&["render", CHECKPOINTER, "--node", CHECKPOINTER], None, 2),
        "examples/pod-checkpointer.yaml: kind: expected a Node object"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "chain: [missing]\n").unwrap();
    assert_eq!(
        fails(
            &[
                "render",
                CHECKPOINTER,
                "--node-name",
                "n",
                "--config",
                config.to_str().unwrap()
            ],
            None,
            2
        ),
        "chain: unknown plugin \"missing\" (the catalog has: none)"
    );
    // clap's own usage errors exit 2 too.
    let out = podstamp(&["render", "--frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_missing_or_foreign_plugin_fails_the_render() {
    let err = render_fails(&["--node", NODE], "nope.wasm");
    assert_eq!(
        err,
        "nope.wasm: cannot read plugin: No such file or directory (os error 2)"
    );
    let err = render_fails(&["--node", NODE], NODE);
    assert!(
        err.starts_with("examples/node.yaml: not a valid WebAssembly component"),
        "{err}"
    );
}

#[test]
fn inspect_describes_a_plugin() {
    let path = plugin("node-env");
    let out = podstamp(&["plugin", "inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("plugin:  node-env 0.1.0\n"), "{text}");
    assert!(
        text.contains("wit:     podstamp:plugin@0.1.1 (matches this podstamp)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "exports: podstamp:plugin/transformer@0.1.1, podstamp:plugin/settings-validator@0.1.1\n"
        ),
        "{text}"
    );
    assert!(text.contains("podstamp:plugin/host@0.1.1"), "{text}");
    let err = fails(&["plugin", "inspect", NODE], None, 1);
    assert!(
        err.starts_with("examples/node.yaml: not a valid WebAssembly component"),
        "{err}"
    );
}

#[test]
fn the_kubelet_accepts_every_golden_manifest() {
    let dir = common::repo().join("tests/cases/rust");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("expected.yaml"))
        .filter(|p| p.is_file())
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    common::kubelet_accepts(
        &files.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
        "worker-eu-1",
    );
}

/// The PodTemplate exactly as the bootkube discussion wrote it
/// (kubernetes-retired/bootkube#206): `template.metadata` repeats the name and
/// the namespace, which the API server accepts and a static pod cannot use.
#[test]
fn the_bootkube_discussion_template_renders_and_says_what_it_drops() {
    let fixture = common::repo().join("tests/fixtures/bootkube-206-podtemplate.yaml");
    let fixture = fixture.to_str().unwrap();
    let out = podstamp(&["render", fixture, "--node-name", "n1"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // The name and a namespace equal to the manifest's are not worth a word.
    assert_eq!(common::stderr(&out), "");
    let manifest = common::stdout(&out);
    assert!(manifest.contains("namespace: kube-system"), "{manifest}");
    assert!(manifest.contains("k8s-app: pod-checkpointer"), "{manifest}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod-checkpointer.yaml");
    std::fs::write(&file, &manifest).unwrap();
    common::kubelet_accepts(&[&file], "n1");

    // Written for another namespace, the template's own is dropped, and said so.
    let out = podstamp(&[
        "render",
        fixture,
        "--node-name",
        "n1",
        "--namespace",
        "infra",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(
        common::stderr(&out).trim_end(),
        "podstamp: warning: PodTemplate kube-system/pod-checkpointer: ignoring \
         template.metadata.namespace (the manifest's namespace is \"infra\", not \
         \"kube-system\"); only labels and annotations are kept"
    );
    assert!(common::stdout(&out).contains("namespace: infra"));

    // A field that is not ObjectMeta's is still a typo worth refusing.
    let err = fails(
        &["render", "-", "--node-name", "n1"],
        Some(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\ntemplate:\n  metadata: {lables: {a: b}}\n  spec: {containers: [{name: web, image: nginx}]}\n",
        ),
        1,
    );
    assert_eq!(
        err,
        "<stdin>: template.metadata.lables: is not a field of ObjectMeta; a static pod template keeps labels and annotations"
    );
}

// ------------------------------------------------------ the compiled-code cache
//
// The cache holds native code that runs unverified (as root, in the daemon):
// these tests plant what another user, a stale copy or a link could leave
// there. The race the handle-based access closes (a `renameat2(RENAME_EXCHANGE)`
// between a check by path and an open by path) cannot be provoked
// deterministically; host/src/plugin/cache.rs says why it is closed.

/// Renders the example chain with `--cache-dir cache`; returns the output.
fn render_cached(cache: &std::path::Path) -> std::process::Output {
    podstamp(&cached_args(cache))
}

/// The arguments of [`render_cached`].
fn cached_args(cache: &std::path::Path) -> [&str; 8] {
    [
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--config",
        "examples/podstamp.yaml",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]
}

/// The cache entry of the built plugin `name`: named by its sha256.
fn cache_entry(cache: &std::path::Path, name: &str) -> std::path::PathBuf {
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(plugin(name)).unwrap()));
    let found: Vec<_> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&sha))
        .collect();
    assert_eq!(found.len(), 1, "one entry for {name} ({sha}): {found:?}");
    found[0].clone()
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A node whose plugins come from the API starts, with the API server
/// down, from the compiled code of the pinned digests alone: the cache
/// hands a plugin back by its sha256 (any case), with no bytes to compile,
/// and only for a digest it holds code of.
#[test]
fn a_cached_plugin_loads_by_its_digest_alone() {
    use podstamp::plugin::{Limits, Runtime};
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let bytes = std::fs::read(plugin("identity")).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let runtime = Runtime::new(Limits::default(), Some(&cache)).unwrap();
    assert!(
        runtime.load_cached(&sha, "identity").unwrap().is_none(),
        "nothing compiled yet"
    );
    let loaded = runtime.load_bytes(&bytes, "identity").unwrap();
    drop(runtime);

    // A new runtime, as after a restart.
    let runtime = Runtime::new(Limits::default(), Some(&cache)).unwrap();
    let cached = runtime
        .load_cached(&sha.to_uppercase(), "identity")
        .unwrap()
        .expect("the entry written by the first load");
    assert_eq!(cached.info(), loaded.info());
    let node = podstamp::plugin::WitNode::from(&podstamp::node::NodeContext::named("n1"));
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}"#;
    assert_eq!(
        cached.transform(pod, &node, "{}", "t").unwrap(),
        loaded.transform(pod, &node, "{}", "t").unwrap()
    );
    let other = hex::encode(sha2::Sha256::digest(b"another component"));
    assert!(runtime.load_cached(&other, "other").unwrap().is_none());
    assert!(
        runtime
            .load_cached("not-a-digest", "other")
            .unwrap()
            .is_none()
    );
    // No cache: nothing to start from.
    let uncached = Runtime::new(Limits::default(), None).unwrap();
    assert!(uncached.load_cached(&sha, "identity").unwrap().is_none());
}

/// The record a node keeps to start without the API server (its last
/// catalog) lives in the cache with the cache's guarantees: written whole,
/// and never read from a link or a file another user could have written.
#[test]
fn a_record_in_the_cache_is_read_back_only_when_sound() {
    use podstamp::plugin::{Limits, Runtime};
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let runtime = Runtime::new(Limits::default(), Some(&cache)).unwrap();
    assert_eq!(runtime.recall("last-catalog"), None);
    assert!(runtime.remember("last-catalog", b"chain: [a]").unwrap());
    assert!(runtime.remember("last-catalog", b"chain: [b]").unwrap());
    let again = Runtime::new(Limits::default(), Some(&cache)).unwrap();
    assert_eq!(
        again.recall("last-catalog").as_deref(),
        Some(&b"chain: [b]"[..])
    );

    // Replaced by a link to a file of the same content: not read.
    let entry = cache.join("record-last-catalog");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::copy(&entry, &elsewhere).unwrap();
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    assert_eq!(
        again.recall("last-catalog"),
        None,
        "a symlink is not followed"
    );
    // A copy anyone may write: not read.
    std::fs::remove_file(&entry).unwrap();
    std::fs::copy(&elsewhere, &entry).unwrap();
    chmod(&entry, 0o666);
    assert_eq!(
        again.recall("last-catalog"),
        None,
        "a writable record is not read"
    );
    // Bytes without the record header (a file put there by hand): not read.
    std::fs::remove_file(&entry).unwrap();
    std::fs::write(&entry, b"chain: [c]").unwrap();
    chmod(&entry, 0o600);
    assert_eq!(again.recall("last-catalog"), None);

    let uncached = Runtime::new(Limits::default(), None).unwrap();
    assert!(!uncached.remember("last-catalog", b"x").unwrap());
    assert_eq!(uncached.recall("last-catalog"), None);
}

#[test]
fn an_unsafe_cache_dir_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // A subdirectory of ours, 0700, but in a directory anyone can write (and
    // not sticky): anyone could rename it away and put theirs in its place.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let cache = shared.join("cache");
    let args = cached_args(&cache);
    let err = fails(&args, None, 1);
    assert!(
        err.contains(&format!(
            "its parent {} is writable by group or others (mode 0777) and not sticky, so another user could replace the compiled code podstamp runs: run `chmod go-w {}`",
            shared.display(),
            shared.display()
        )),
        "{err}"
    );

    // The cache directory itself world-writable, as the kubelet makes an emptyDir.
    chmod(&shared, 0o755);
    std::fs::create_dir_all(&cache).unwrap();
    chmod(&cache, 0o777);
    let err = fails(&args, None, 1);
    assert!(
        err.contains(&format!(
            "{} is writable by group or others (mode 0777), so another user could replace the compiled code podstamp runs: run `chmod 0700 {}`",
            cache.display(),
            cache.display()
        )),
        "{err}"
    );

    // Another user's directory (the test runs as root, which can chown).
    chmod(&cache, 0o700);
    std::os::unix::fs::chown(&cache, Some(65534), None).unwrap();
    let err = fails(&args, None, 1);
    assert!(
        err.contains(&format!(
            "{} belongs to uid 65534, not to this user",
            cache.display()
        )) && err.contains("run `chown"),
        "{err}"
    );

    // A link to a good directory is not followed either.
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    chmod(&real, 0o700);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = fails(&cached_args(&link), None, 1);
    assert!(
        err.contains(&format!(
            "{} is a symbolic link, which the code cache does not follow",
            link.display()
        )),
        "{err}"
    );
}

#[test]
fn a_cache_entry_copied_or_linked_under_another_plugins_name_is_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cold = render_cached(&cache);
    assert!(cold.status.success(), "{}", stderr(&cold));
    let identity = cache_entry(&cache, "identity");
    let substitute = cache_entry(&cache, "substitute");

    // identity's code under substitute's name: run, it would leave every
    // ${...} placeholder in place.
    std::fs::copy(&identity, &substitute).unwrap();
    let warm = render_cached(&cache);
    assert!(warm.status.success(), "{}", stderr(&warm));
    assert_eq!(stdout(&warm), stdout(&cold), "substitute's own code ran");
    let err = stderr(&warm);
    assert!(
        err.contains(&substitute.display().to_string())
            && err.contains("holds the code of component sha256")
            && err.contains("recompiling it"),
        "a warning names the entry: {err}"
    );
    // ... and the entry was replaced by substitute's code.
    let again = render_cached(&cache);
    assert_eq!(stderr(&again), "", "no warning once recompiled");
    assert_eq!(stdout(&again), stdout(&cold));

    // A link to identity's entry in substitute's place is not followed.
    std::fs::remove_file(&substitute).unwrap();
    std::os::unix::fs::symlink(&identity, &substitute).unwrap();
    let linked = render_cached(&cache);
    assert_eq!(stdout(&linked), stdout(&cold), "substitute's own code ran");
    let err = stderr(&linked);
    assert!(
        err.contains(&substitute.display().to_string()) && err.contains("is a symbolic link"),
        "{err}"
    );

    // An entry that belongs to another user is not run.
    let node_env = cache_entry(&cache, "node-env");
    std::os::unix::fs::chown(&node_env, Some(65534), None).unwrap();
    let foreign = render_cached(&cache);
    assert_eq!(stdout(&foreign), stdout(&cold));
    let err = stderr(&foreign);
    assert!(
        err.contains(&node_env.display().to_string()) && err.contains("belongs to uid 65534"),
        "{err}"
    );
}

#[test]
fn root_never_uses_the_invoking_users_cache() {
    // `sudo -E podstamp render` keeps the user's $HOME and $XDG_CACHE_HOME.
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    let home = dir.path().join("home");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"));
    command
        .args([
            "render",
            CHECKPOINTER,
            "--node",
            NODE,
            "--config",
            "examples/podstamp.yaml",
        ])
        .current_dir(common::repo())
        .env_remove("PODSTAMP_CACHE_DIR")
        .env("XDG_CACHE_HOME", &xdg)
        .env("HOME", &home);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(
        xdg.join("podstamp").exists(),
        !root,
        "root's default cache is /var/cache/podstamp; a user's is under $XDG_CACHE_HOME"
    );
}

/// `podstamp render` with `env` set (and no other PODSTAMP_ variable).
fn render_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"));
    command.args(args).current_dir(common::repo());
    for name in [
        "RUST_LOG",
        "PODSTAMP_NAMESPACE",
        "PODSTAMP_MAX_MANIFEST_SIZE",
        "PODSTAMP_CACHE_DIR",
        "PODSTAMP_POD_SECURITY",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    command.output().unwrap()
}

/// Each setting is taken from the flag, else the environment, else the
/// configuration file, else the default: the namespace, the size limit and
/// the cache directory alike.
#[test]
fn settings_come_from_flag_then_environment_then_file_then_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("podstamp.yaml");
    let (file_cache, env_cache) = (dir.path().join("file-cache"), dir.path().join("env-cache"));
    let write_config = |limit: &str| {
        std::fs::write(
            &config,
            format!(
                "namespace: from-file\ncacheDir: {}\nplugins:\n  identity: {{path: {}}}\nchain: [identity]\nlimits: {{maxManifestSize: '{limit}'}}\npodSecurity: privileged\n",
                file_cache.display(),
                plugin("identity").display()
            ),
        )
        .unwrap();
    };
    let base = ["render", CHECKPOINTER, "--node", NODE];
    let with_config = [&base[..], &["--config", config.to_str().unwrap()]].concat();
    let namespace_of = |out: &std::process::Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let text = stdout(out);
        text.lines()
            .find_map(|l| l.trim().strip_prefix("namespace: "))
            .unwrap_or_else(|| panic!("no namespace in:\n{text}"))
            .to_string()
    };

    // The namespace, and the cache directory PODSTAMP_CACHE_DIR names over
    // the file's cacheDir.
    write_config("1Mi");
    let granted = [&base[..], &["--pod-security", "privileged"]].concat();
    assert_eq!(namespace_of(&render_env(&granted, &[])), "kube-system");
    let out = render_env(
        &with_config,
        &[("PODSTAMP_CACHE_DIR", env_cache.to_str().unwrap())],
    );
    assert_eq!(namespace_of(&out), "from-file");
    cache_entry(&env_cache, "identity");
    assert!(
        !file_cache.exists(),
        "the environment's cache dir wins over the file's"
    );
    let env = [("PODSTAMP_NAMESPACE", "from-env")];
    assert_eq!(namespace_of(&render_env(&with_config, &env)), "from-env");
    let flag = [&with_config[..], &["--namespace", "from-flag"]].concat();
    assert_eq!(namespace_of(&render_env(&flag, &env)), "from-flag");

    // The size limit: the error names the limit in force.
    let over = |out: std::process::Output, limit: &str| {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "over the limit of {limit} (limits.maxManifestSize)"
            )),
            "{err}"
        );
    };
    write_config("100");
    over(render_env(&with_config, &[]), "100");
    let env = [("PODSTAMP_MAX_MANIFEST_SIZE", "200")];
    over(render_env(&with_config, &env), "200");
    let flag = [&with_config[..], &["--max-manifest-size", "300"]].concat();
    over(render_env(&flag, &env), "300");
    let flag = [&with_config[..], &["--max-manifest-size", "1Mi"]].concat();
    assert_eq!(namespace_of(&render_env(&flag, &env)), "from-file");

    // The Pod Security level (the checkpointer needs privileged): the file
    // grants it, the environment takes it back, the flag grants it again;
    // with none of them, the default (baseline) refuses it.
    write_config("1Mi");
    let level = |out: &std::process::Output| {
        let err = stderr(out);
        let at = err
            .find("Pod Security level ")
            .unwrap_or_else(|| panic!("{err}"));
        err[at..].lines().next().unwrap().to_string()
    };
    let out = render_env(&with_config, &[]);
    assert_eq!(namespace_of(&out), "from-file");
    assert!(level(&out).ends_with(": podSecurity)"), "{}", level(&out));
    let env = [("PODSTAMP_POD_SECURITY", "baseline")];
    let out = render_env(&with_config, &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        level(&out).starts_with("Pod Security level baseline:latest (from PODSTAMP_POD_SECURITY): forbidden: host namespaces"),
        "{}",
        level(&out)
    );
    let flag = [&with_config[..], &["--pod-security", "privileged"]].concat();
    let out = render_env(&flag, &env);
    assert_eq!(namespace_of(&out), "from-file");
    assert_eq!(
        level(&out),
        "Pod Security level privileged:latest (from --pod-security)"
    );
    let out = render_env(&base, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        level(&out).starts_with(
            "Pod Security level baseline:latest (from podstamp's default (podSecurity))"
        ),
        "{}",
        level(&out)
    );
}

// ------------------------------------------- plugins and catalogs from ConfigMaps

/// sha256 of `bytes`, hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// base64, as binaryData holds it.
fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap() {
        serde_json::Value::String(text) => text,
        other => panic!("{other}"),
    }
}

/// A v1 ConfigMap named `name` with these `binaryData` and `data` entries.
fn config_map(name: &str, binary: &[(&str, &[u8])], data: &[(&str, &str)]) -> String {
    let binary: serde_json::Map<String, serde_json::Value> = binary
        .iter()
        .map(|(k, v)| (k.to_string(), base64(v).into()))
        .collect();
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "binaryData": binary,
        "data": data,
    })
    .to_string()
}

/// `podstamp plugin configmap` of a built plugin, expecting success.
fn plugin_configmap(args: &[&str]) -> String {
    let mut all = vec!["plugin", "configmap"];
    all.extend_from_slice(args);
    let out = podstamp(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    stdout(&out)
}

/// The catalog entry `plugin configmap` prints as a comment, uncommented.
fn snippet_of(printed: &str) -> String {
    let (_, snippet) = printed
        .split_once("# The catalog entry that uses it (under plugins: in the catalog):\n")
        .unwrap_or_else(|| panic!("no catalog snippet in\n{printed}"));
    snippet
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("# ").unwrap()))
        .collect()
}

/// A directory holding files; `path` gives a file's path in it as text.
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Files {
        Files(tempfile::tempdir().unwrap())
    }
    fn put(&self, name: &str, content: impl AsRef<[u8]>) -> String {
        let path = self.0.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    }
}

/// The example node-env settings, as a catalog entry's `settings:`.
const NODE_ENV_SETTINGS: &str = "    settings: {containers: [pod-checkpointer], labels: {NODE_ZONE: topology.kubernetes.io/zone}}\n";

/// Renders the checkpointer for the example node with `config` and these
/// --configmap files; the output.
fn render_with(config: &str, config_maps: &[&str]) -> std::process::Output {
    let mut args = vec![
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--config",
        config,
        "--no-cache",
    ];
    for file in config_maps {
        args.extend(["--configmap", file]);
    }
    podstamp(&args)
}

/// [`render_with`], expecting failure with `code` and one line; the line.
fn render_with_fails(config: &str, config_maps: &[&str], code: i32) -> String {
    let mut args = vec![
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--config",
        config,
        "--no-cache",
    ];
    for file in config_maps {
        args.extend(["--configmap", file]);
    }
    fails(&args, None, code)
}

#[test]
fn a_plugin_from_a_configmap_renders_as_from_its_path() {
    let wasm = plugin("node-env");
    let bytes = std::fs::read(&wasm).unwrap();
    let sha = sha256_hex(&bytes);
    let files = Files::new();
    let by_path = files.put(
        "path.yaml",
        format!(
            "plugins:\n  node-env:\n    path: {}\n    sha256: {sha}\n{NODE_ENV_SETTINGS}chain: [node-env]\n",
            wasm.display()
        ),
    );
    let out = render_with(&by_path, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = stdout(&out);
    assert!(expected.contains("value: eu-west-1b"), "{expected}");

    // gzip, as `plugin configmap` prints it; the catalog entry it prints.
    let printed = plugin_configmap(&[wasm.to_str().unwrap(), "--name", "podstamp-plugin-node-env"]);
    assert_eq!(
        printed,
        plugin_configmap(&[wasm.to_str().unwrap(), "--name", "podstamp-plugin-node-env"]),
        "the same component gives the same bytes"
    );
    let object: serde_json::Value = serde_norway::from_str(&printed).unwrap();
    assert_eq!(object["kind"], "ConfigMap");
    assert_eq!(object["metadata"]["namespace"], "kube-system");
    assert_eq!(
        object["metadata"]["annotations"]["podstamp.io/sha256"],
        sha.as_str()
    );
    assert_eq!(
        object["metadata"]["labels"]["podstamp.io/plugin"],
        "node-env"
    );
    let stored = serde_json::from_value::<k8s_openapi::ByteString>(
        object["binaryData"]["plugin.wasm"].clone(),
    )
    .unwrap()
    .0;
    assert_eq!(&stored[..2], &[0x1f, 0x8b], "gzip");
    assert!(stored.len() < bytes.len() / 2, "{} bytes", stored.len());
    let snippet = snippet_of(&printed);
    assert_eq!(
        snippet,
        format!(
            "  \"node-env\":\n    configMap: {{name: \"podstamp-plugin-node-env\"}}\n    sha256: {sha}\n"
        )
    );
    let gzip_cm = files.put("gzip.yaml", &printed);
    let by_config_map = files.put(
        "cm.yaml",
        format!("plugins:\n{snippet}{NODE_ENV_SETTINGS}chain: [node-env]\n"),
    );
    let out = render_with(&by_config_map, &[&gzip_cm]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), expected, "gzip ConfigMap");

    // Plain binaryData, in JSON, under another key and name.
    let plain_cm = files.put(
        "plain.json",
        config_map("plain", &[("node-env.wasm", &bytes)], &[]),
    );
    let plain = files.put(
        "plain-catalog.yaml",
        format!(
            "plugins:\n  node-env:\n    configMap: {{name: plain, key: node-env.wasm}}\n    sha256: {sha}\n{NODE_ENV_SETTINGS}chain: [node-env]\n"
        ),
    );
    let out = render_with(&plain, &[&plain_cm]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), expected, "plain ConfigMap");
}

/// A catalog of node-env from ConfigMap `name` (key `key`), pinned to `sha`.
fn config_map_catalog(name: &str, key: &str, sha: &str) -> String {
    format!(
        "plugins:\n  node-env:\n    configMap: {{name: {name}, key: {key}}}\n    sha256: {sha}\n{NODE_ENV_SETTINGS}chain: [node-env]\n"
    )
}

#[test]
fn a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests() {
    let bytes = std::fs::read(plugin("node-env")).unwrap();
    let sha = sha256_hex(&bytes);
    let gz = podstamp::catalog::gzip::compress(&bytes);
    let files = Files::new();
    let catalog = files.put("c.yaml", config_map_catalog("pn", "plugin.wasm", &sha));
    let refused = |binary: &[(&str, &[u8])], data: &[(&str, &str)]| {
        let cm = files.put("cm.json", config_map("pn", binary, data));
        render_with_fails(&catalog, &[&cm], 1)
    };
    let at = "plugins.node-env: ConfigMap kube-system/pn key plugin.wasm";

    // Another component than the pinned one: plain and gzip alike.
    let identity = std::fs::read(plugin("identity")).unwrap();
    let other = sha256_hex(&identity);
    let mismatch = format!("{at}: sha256 is {other}, but the catalog pins {sha}");
    assert_eq!(refused(&[("plugin.wasm", &identity)], &[]), mismatch);
    let identity_gz = podstamp::catalog::gzip::compress(&identity);
    assert_eq!(refused(&[("plugin.wasm", &identity_gz)], &[]), mismatch);

    let err = refused(&[("plugin.wasm", &gz[..gz.len() / 2])], &[]);
    assert!(
        err.starts_with(&format!("{at}: truncated gzip (the stream ends early: ")),
        "{err}"
    );
    let mut corrupt = gz.clone();
    let crc = corrupt.len() - 8;
    corrupt[crc] ^= 0xff;
    let err = refused(&[("plugin.wasm", &corrupt)], &[]);
    assert!(err.starts_with(&format!("{at}: corrupt gzip (")), "{err}");

    // 64 MiB and one byte of zeros, ~65 KiB compressed.
    let bomb = podstamp::catalog::gzip::compress(&vec![0; (64 << 20) + 1]);
    assert_eq!(
        refused(&[("plugin.wasm", &bomb)], &[]),
        format!(
            "{at}: gzip inflates to more than 67108864 bytes (the limit for a component, 64 MiB): refused as a gzip bomb"
        )
    );

    assert_eq!(
        refused(&[("other.wasm", &gz)], &[]),
        format!(
            "{at}: missing (binaryData has: other.wasm); give configMap.key, or put the component there"
        )
    );
    assert_eq!(
        refused(&[], &[("plugin.wasm", "not binary")]),
        format!(
            "{at}: is under data, but a component is binary: put it under binaryData (`podstamp plugin configmap` does)"
        )
    );

    let elsewhere = files.put(
        "other-cm.json",
        config_map("other", &[("plugin.wasm", &gz)], &[]),
    );
    assert_eq!(
        render_with_fails(&catalog, &[&elsewhere], 1),
        "plugins.node-env: ConfigMap kube-system/pn does not exist: create it (`podstamp plugin configmap FILE.wasm --name pn` prints it)"
    );
    assert_eq!(
        render_with_fails(&catalog, &[], 2),
        "plugins.node-env: ConfigMap kube-system/pn: cannot be read here: ConfigMaps are read from the API by podstamp run, and from --configmap FILE by podstamp render"
    );

    // Pinned bytes that are no component.
    let yaml = std::fs::read(common::repo().join(NODE)).unwrap();
    let not_wasm = files.put(
        "not-wasm.yaml",
        config_map_catalog("pn", "plugin.wasm", &sha256_hex(&yaml)),
    );
    let cm = files.put(
        "yaml-cm.json",
        config_map("pn", &[("plugin.wasm", &yaml)], &[]),
    );
    let err = render_with_fails(&not_wasm, &[&cm], 1);
    assert!(
        err.starts_with(&format!("{at}: not a valid WebAssembly component")),
        "{err}"
    );

    // A file pinned to another digest.
    let path = files.put(
        "path-pin.yaml",
        format!(
            "plugins:\n  node-env:\n    path: {}\n    sha256: {other}\n{NODE_ENV_SETTINGS}chain: [node-env]\n",
            plugin("node-env").display()
        ),
    );
    assert_eq!(
        render_with_fails(&path, &[], 1),
        format!(
            "plugins.node-env: {}: sha256 is {sha}, but the catalog pins {other}",
            plugin("node-env").display()
        )
    );
}

#[test]
fn a_catalog_entry_names_one_pinned_source() {
    let files = Files::new();
    let sha = "ab".repeat(32);
    let unpinned = files.put(
        "unpinned.yaml",
        "plugins:\n  node-env:\n    configMap: {name: pn}\nchain: [node-env]\n",
    );
    assert_eq!(
        render_with_fails(&unpinned, &[], 2),
        "plugins.node-env: configMap \"pn\" has no sha256: a component from a ConfigMap must be pinned; add sha256: (printed by `podstamp plugin configmap`, or `sha256sum` of the .wasm)"
    );
    let both = files.put(
        "both.yaml",
        format!("plugins:\n  node-env:\n    path: x.wasm\n    configMap: {{name: pn}}\n    sha256: {sha}\n"),
    );
    assert_eq!(
        render_with_fails(&both, &[], 2),
        "plugins.node-env: give one of path, configMap and oci, not several (one entry, one component)"
    );
    let neither = files.put("neither.yaml", "plugins:\n  node-env: {settings: {}}\n");
    assert_eq!(
        render_with_fails(&neither, &[], 2),
        "plugins.node-env: no component: give path (a file on the node), configMap: {name, key} or oci: REGISTRY/REPO@sha256:DIGEST"
    );
    let bad_pin = files.put(
        "bad-pin.yaml",
        "plugins:\n  node-env:\n    configMap: {name: pn}\n    sha256: 3f1c\n",
    );
    assert_eq!(
        render_with_fails(&bad_pin, &[], 2),
        "plugins.node-env.sha256: \"3f1c\" is not a sha256: expected 64 hex digits (`sha256sum plugin.wasm`)"
    );
}

/// `bytes` as an unsigned LEB128.
fn leb128(mut value: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

#[test]
fn plugin_configmap_refuses_what_is_no_plugin_or_does_not_fit() {
    let err = fails(&["plugin", "configmap", NODE, "--name", "x"], None, 1);
    assert!(
        err.starts_with("examples/node.yaml: not a valid WebAssembly component"),
        "{err}"
    );
    // node-env with a custom section of 1.2 MB that gzip cannot shrink: still
    // a plugin, too big for a ConfigMap.
    let mut bytes = std::fs::read(plugin("node-env")).unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..1_200_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let name = b"noise";
    let mut section = leb128(name.len());
    section.extend_from_slice(name);
    section.extend_from_slice(&noise);
    bytes.push(0);
    bytes.extend(leb128(section.len()));
    bytes.extend(section);
    let files = Files::new();
    let big = files.put("big.wasm", &bytes);
    let inspect = podstamp(&["plugin", "inspect", &big]);
    assert!(
        inspect.status.success(),
        "still a plugin: {}",
        stderr(&inspect)
    );
    let err = fails(&["plugin", "configmap", &big, "--name", "big"], None, 1);
    let gz = podstamp::catalog::gzip::compress(&bytes);
    assert_eq!(
        err,
        format!(
            "{big}: gzip-compressed, the component is {} bytes ({} uncompressed), over the 1048576 bytes (1 MiB) a ConfigMap holds: make the plugin smaller (e.g. opt-level = \"s\", strip = true), or ship it by path on the node",
            gz.len(),
            bytes.len()
        )
    );
    let err = fails(
        &[
            "plugin",
            "configmap",
            plugin("identity").to_str().unwrap(),
            "--name",
            "Not_A_Name",
        ],
        None,
        2,
    );
    assert!(err.starts_with("--name \"Not_A_Name\": "), "{err}");
}

#[test]
fn a_catalog_from_a_configmap_renders_like_the_file() {
    let files = Files::new();
    let bytes = std::fs::read(plugin("node-env")).unwrap();
    let sha = sha256_hex(&bytes);
    let printed = plugin_configmap(&[
        plugin("node-env").to_str().unwrap(),
        "--name",
        "podstamp-plugin-node-env",
    ]);
    let plugin_cm = files.put("plugin-cm.yaml", &printed);
    let by_file = files.put(
        "file.yaml",
        format!(
            "plugins:\n{}{NODE_ENV_SETTINGS}chain: [node-env]\n",
            snippet_of(&printed)
        ),
    );
    let out = render_with(&by_file, &[&plugin_cm]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = stdout(&out);

    let catalog_text = format!(
        "plugins:\n  node-env:\n    configMap: {{name: podstamp-plugin-node-env}}\n    sha256: {sha}\n{NODE_ENV_SETTINGS}  identity:\n    path: {}\nchain: [node-env]\n",
        plugin("identity").display()
    );
    let catalog_cm = |text: &str| {
        files.put(
            "catalog-cm.json",
            config_map("podstamp-catalog", &[], &[("catalog.yaml", text)]),
        )
    };
    let config = files.put(
        "config.yaml",
        "namespace: kube-system\ndaemon:\n  catalog: {configMap: podstamp-catalog}\n",
    );
    let out = render_with(&config, &[&plugin_cm, &catalog_cm(&catalog_text)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), expected);

    let at = "ConfigMap kube-system/podstamp-catalog key catalog.yaml";
    let relative = catalog_text.replace(&plugin("identity").display().to_string(), "identity.wasm");
    assert_eq!(
        render_with_fails(&config, &[&plugin_cm, &catalog_cm(&relative)], 2),
        format!(
            "{at}: plugins.identity.path: \"identity.wasm\" is relative, but a catalog in a ConfigMap has no directory: give an absolute path on the node"
        )
    );
    let settings_file =
        format!("{catalog_text}  extra:\n    path: /x.wasm\n    settingsFile: x.yaml\n")
            .replace("chain: [node-env]\n", "")
            + "chain: [node-env]\n";
    assert_eq!(
        render_with_fails(&config, &[&plugin_cm, &catalog_cm(&settings_file)], 2),
        format!(
            "{at}: plugins.extra.settingsFile: a catalog in a ConfigMap has no file to read settings from: give settings inline"
        )
    );
    assert_eq!(
        render_with_fails(
            &config,
            &[&plugin_cm, &catalog_cm("plugins: {}\nchian: []\n")],
            2
        ),
        format!("{at}: chian: unknown field `chian`, expected `plugins` or `chain`")
    );
    assert_eq!(
        render_with_fails(&config, &[&plugin_cm], 2),
        "daemon.catalog.configMap: ConfigMap kube-system/podstamp-catalog does not exist: create it (its key catalog.yaml holds plugins and chain)"
    );
    let in_other_namespace = files.put(
        "other-ns.yaml",
        printed.replace("namespace: \"kube-system\"", "namespace: \"default\""),
    );
    let err = render_with_fails(&config, &[&in_other_namespace], 2);
    assert!(
        err.ends_with("ConfigMap default/podstamp-plugin-node-env: metadata.namespace: is \"default\", but podstamp reads ConfigMaps from namespace \"kube-system\" (its namespace): move it there or drop the field"),
        "{err}"
    );

    // One or the other: the file's own catalog, or the ConfigMap's.
    let both = files.put(
        "both.yaml",
        "daemon:\n  catalog: {configMap: podstamp-catalog}\nchain: []\nplugins:\n  a: {path: a.wasm}\n",
    );
    assert_eq!(
        render_with_fails(&both, &[], 2),
        format!(
            "{both}: daemon.catalog: the catalog comes from ConfigMap \"podstamp-catalog\", so plugins and chain must not be given here too: give one or the other"
        )
    );

    // The daemon cannot read it from a directory source.
    let manifests = files.0.path().join("manifests");
    let templates = files.0.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    let source = format!("dir:{}", templates.display());
    let err = fails(
        &[
            "run",
            "--config",
            &config,
            "--source",
            &source,
            "--node-name",
            "n1",
            "--manifest-dir",
            manifests.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        None,
        2,
    );
    assert_eq!(
        err,
        "daemon.catalog.configMap: a ConfigMap is read from the API, but the source is dir:; with --source dir: give plugins by path and the catalog in the configuration file"
    );
}

// ------------------------------------------------- the settings annotation

/// The checkpointer template with these annotations.
fn checkpointer_annotated(annotations: &[(&str, &str)]) -> String {
    let yaml = std::fs::read_to_string(common::repo().join(CHECKPOINTER)).unwrap();
    let mut block = String::from("  annotations:\n");
    for (key, value) in annotations {
        block.push_str(&format!("    {key}: {}\n", serde_json::Value::from(*value)));
    }
    yaml.replace(
        "  labels:\n    podstamp.io/enabled: \"true\"\n",
        &format!("  labels:\n    podstamp.io/enabled: \"true\"\n{block}"),
    )
}

/// Renders the annotated checkpointer with `config`; the output.
fn render_annotated(config: &str, annotations: &[(&str, &str)]) -> std::process::Output {
    let args = [
        "render",
        "-",
        "--node",
        NODE,
        "--config",
        config,
        "--no-cache",
    ];
    podstamp_in(&args, Some(checkpointer_annotated(annotations).as_bytes()))
}

const SETTINGS: &str = "podstamp.io/settings";

#[test]
fn the_settings_annotation_is_merged_over_the_catalogs() {
    let config = "examples/podstamp.yaml";
    let plain = render_annotated(config, &[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let plain = stdout(&plain);
    assert!(plain.contains("name: NODE_ZONE"), "{plain}");

    // A key replaced deep inside, a key removed (null), a key added; the
    // rest of the catalog's settings kept.
    let out = render_annotated(
        config,
        &[(
            SETTINGS,
            "arch-image: {images: {pod-checkpointer: {arm64: registry.example/cp:arm64}}}\n\
             node-env:\n  labels: {NODE_ZONE: null, NODE_REGION: topology.kubernetes.io/region}\n",
        )],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let merged = stdout(&out);
    assert!(
        merged.contains("image: registry.example/cp:arm64"),
        "{merged}"
    );
    assert!(merged.contains("name: NODE_REGION"), "{merged}");
    assert!(merged.contains("value: eu-west-1\n"), "{merged}");
    assert!(
        !merged.contains("NODE_ZONE"),
        "null removes the key: {merged}"
    );
    assert!(
        merged.contains("name: NODE_IP"),
        "containers kept: {merged}"
    );

    // JSON too; null removes the arm64 image, the amd64 one stays.
    let args = [
        "render",
        "-",
        "--node",
        NODE,
        "--config",
        config,
        "--no-cache",
    ];
    let template = checkpointer_annotated(&[(
        SETTINGS,
        r#"{"arch-image": {"images": {"pod-checkpointer": {"arm64": null}}}}"#,
    )]);
    assert_eq!(
        fails(&args, Some(&template), 1),
        "PodTemplate kube-system/pod-checkpointer: plugin 1 of 3 `arch-image` (arch-image 0.1.0): spec.containers[0].image: no image for architecture arm64 (have amd64)"
    );
}

#[test]
fn a_bad_settings_annotation_names_the_annotation_the_plugin_and_the_field() {
    let files = Files::new();
    let path = |name: &str| plugin(name).display().to_string();
    let mandatory = files.put(
        "mandatory.yaml",
        format!(
            "plugins:\n  arch-image:\n    path: {}\n    settingsFile: {}\n    scope: [metadata, spec]\n  identity:\n    path: {}\n  substitute:\n    path: {}\n    mandatory: true\n    scope: [metadata, spec]\nchain: [arch-image, substitute]\n",
            path("arch-image"),
            common::repo().join("tests/fixtures/arch-image.yaml").display(),
            path("identity"),
            path("substitute"),
        ),
    );
    let args = [
        "render",
        "-",
        "--node",
        NODE,
        "--config",
        &mandatory,
        "--no-cache",
    ];
    let refused = |text: &str| fails(&args, Some(&checkpointer_annotated(&[(SETTINGS, text)])), 1);
    let at =
        r#"PodTemplate kube-system/pod-checkpointer: metadata.annotations["podstamp.io/settings"]"#;
    assert_eq!(
        refused("[arch-image]"),
        format!(
            "{at}: is a list, but it must be a mapping of plugin name to settings, e.g. `node-env: {{labels: {{ZONE: topology.kubernetes.io/zone}}}}`"
        )
    );
    assert_eq!(
        refused("arch-image: {images: ["),
        format!(
            "{at}:2:1: did not find expected node content; write a mapping of plugin name to settings, in YAML or JSON"
        )
    );
    assert_eq!(
        refused("nope: {}"),
        format!(
            "{at}: unknown plugin \"nope\" (the catalog has: arch-image, identity, substitute)"
        )
    );
    assert_eq!(
        refused("identity: {x: 1}"),
        format!(
            "{at}.identity: plugin \"identity\" is not in this template's chain (arch-image, substitute), so its settings would never be used: remove them, or add \"identity\" to podstamp.io/plugins"
        )
    );
    assert_eq!(
        refused("substitute: {x: 1}"),
        format!(
            "{at}.substitute: plugin \"substitute\" is mandatory: its settings are the platform's (the catalog's) and a template cannot change them; remove them from the annotation"
        )
    );
    // A chain the template picks is the one its settings are checked against.
    let picked = checkpointer_annotated(&[
        ("podstamp.io/plugins", "identity"),
        (SETTINGS, "arch-image: {}"),
    ]);
    assert_eq!(
        fails(&args, Some(&picked), 1),
        format!(
            "{at}.arch-image: plugin \"arch-image\" is not in this template's chain (identity, substitute), so its settings would never be used: remove them, or add \"arch-image\" to podstamp.io/plugins"
        )
    );
}

// ------------------------------------------------- reuse by digest

#[test]
fn a_catalog_reloaded_with_the_same_components_compiles_nothing() {
    use podstamp::catalog::{Catalog, CatalogSpec, ConfigMapSet};
    use podstamp::plugin::{Limits, Runtime};

    let bytes = std::fs::read(plugin("node-env")).unwrap();
    let sha = sha256_hex(&bytes);
    let mut config_maps = ConfigMapSet::new("kube-system");
    let cm: serde_json::Value = serde_json::from_str(&config_map(
        "pn",
        &[("plugin.wasm", &podstamp::catalog::gzip::compress(&bytes))],
        &[],
    ))
    .unwrap();
    config_maps.insert(cm, "test").unwrap();
    let spec = |zone: &str| -> CatalogSpec {
        let text = format!(
            "plugins:\n  node-env:\n    configMap: {{name: pn}}\n    sha256: {sha}\n    settings: {{labels: {{NODE_ZONE: {zone}}}}}\n  identity:\n    path: {}\nchain: [node-env]\n",
            plugin("identity").display()
        );
        serde_norway::from_str(&text).unwrap()
    };
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    let budget = std::time::Duration::from_secs(1);
    let load = |spec: &CatalogSpec, reuse: Option<&Catalog>| {
        Catalog::load_spec(spec, "", &runtime, &config_maps, reuse, budget).unwrap()
    };
    let first = load(&spec("a"), None);
    assert_eq!(runtime.components_loaded(), 2, "node-env and identity");

    let again = load(&spec("a"), Some(&first));
    assert_eq!(
        runtime.components_loaded(),
        2,
        "the same spec: nothing compiled"
    );
    assert_eq!(again.digest(), first.digest());

    let settings_only = load(&spec("b"), Some(&again));
    assert_eq!(
        runtime.components_loaded(),
        2,
        "a settings change: nothing compiled"
    );
    assert_ne!(settings_only.digest(), first.digest());

    // Without a catalog to reuse, every component is loaded again.
    let cold = load(&spec("a"), None);
    assert_eq!(runtime.components_loaded(), 4);
    assert_eq!(
        cold.digest(),
        first.digest(),
        "the digest depends on content only"
    );
}

/// What `plugin configmap` prints goes through the real kube-apiserver as
/// is, and what the server gives back (as `kubectl get -o json` would)
/// renders like the plugin's file; the 1 MiB the command allows (gzip bytes)
/// is what the server allows.
#[test]
fn the_api_server_stores_the_printed_configmap_and_what_it_returns_renders() {
    use k8s_openapi::api::core::v1::ConfigMap;

    let files = Files::new();
    let server = support::ApiServer::start(&files.0.path().join("apiserver"));
    let wasm = plugin("node-env");
    let printed = plugin_configmap(&[wasm.to_str().unwrap(), "--name", "podstamp-plugin-node-env"]);
    let object: ConfigMap = serde_norway::from_str(&printed).unwrap();
    let sized = |size: usize| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("size-{size}")),
            ..Default::default()
        },
        binary_data: Some([("k".to_string(), k8s_openapi::ByteString(vec![7; size]))].into()),
        ..Default::default()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (stored, at_limit, over_limit) = runtime.block_on(async {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(server.admin().await, "kube-system");
        let post = kube::api::PostParams::default();
        api.create(&post, &object).await.unwrap();
        let stored = api.get("podstamp-plugin-node-env").await.unwrap();
        // The values together (keys are not counted): 1 MiB is accepted,
        // one byte more is not. Only the errors are kept: an object's Debug
        // is a megabyte.
        let at_limit = api.create(&post, &sized(1 << 20)).await.map(drop);
        let over_limit = api.create(&post, &sized((1 << 20) + 1)).await.map(drop);
        (stored, at_limit, over_limit)
    });
    assert!(at_limit.is_ok(), "{at_limit:?}");
    let refused = over_limit.expect_err("over 1 MiB").to_string();
    assert!(refused.contains("1048576"), "{refused}");

    let stored_json = files.put("stored.json", serde_json::to_string(&stored).unwrap());
    let catalog = files.put(
        "c.yaml",
        format!(
            "plugins:\n{}{NODE_ENV_SETTINGS}chain: [node-env]\n",
            snippet_of(&printed)
        ),
    );
    let by_path = files.put(
        "p.yaml",
        format!(
            "plugins:\n  node-env:\n    path: {}\n{NODE_ENV_SETTINGS}chain: [node-env]\n",
            wasm.display()
        ),
    );
    let from_api = render_with(&catalog, &[&stored_json]);
    assert!(from_api.status.success(), "{}", stderr(&from_api));
    let from_path = render_with(&by_path, &[]);
    assert!(from_path.status.success(), "{}", stderr(&from_path));
    assert_eq!(stdout(&from_api), stdout(&from_path));
}

/// `podstamp render` of the checkpointer for the example node through the
/// plugin `spec`, expecting exit `code`; the error line.
fn example_with_plugin_fails(spec: &str, code: i32) -> String {
    let args = [
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--plugin",
        spec,
        "--no-cache",
    ];
    fails(&args, None, code)
}

/// Settings a plugin refuses (WIT 0.1.1's `validate-settings`) are refused
/// when the plugins are loaded, before anything renders, naming the entry
/// and the field inside the settings: the SDK's type check and the
/// plugin's own (`arch-image` refuses an empty image). A 0.1.0 component,
/// which cannot say, still loads and renders with any settings.
#[test]
fn settings_a_plugin_refuses_are_refused_at_load_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let arch_image = plugin("arch-image").display().to_string();
    let cases = [
        (
            r#"{"images": {"pod-checkpointer": 5}}"#,
            "settings.images.pod-checkpointer: invalid type: integer `5`, expected a map",
        ),
        (
            r#"{"images": {"pod-checkpointer": {"arm64": ""}}}"#,
            "settings.images.pod-checkpointer.arm64: an empty image; give the image for this architecture, or remove the entry",
        ),
    ];
    for (i, (settings, says)) in cases.iter().enumerate() {
        let settings = file(&format!("s{i}.json"), settings);
        let spec = format!("{arch_image},settings={settings}");
        let err = example_with_plugin_fails(&spec, 2);
        assert_eq!(
            err,
            format!(
                "--plugin {spec}: {says} (refused by the plugin arch-image 0.1.0's validate-settings; fix the settings)"
            )
        );
        // In a catalog, even an entry no chain uses.
        let config = file(
            &format!("c{i}.yaml"),
            &format!(
                "plugins:\n  arch-image:\n    path: {arch_image}\n    settingsFile: {settings}\nchain: []\n"
            ),
        );
        let err = fails(
            &[
                "render",
                CHECKPOINTER,
                "--node",
                NODE,
                "--config",
                &config,
                "--no-cache",
            ],
            None,
            2,
        );
        assert!(
            err.starts_with(&format!("plugins.arch-image: {says} (refused by")),
            "{err}"
        );
    }

    // A 0.1.0 component: nothing to ask; it renders.
    let old = dir.path().join("old.wasm");
    std::fs::write(
        &old,
        wat_plugins::componentize(
            &wat_plugins::core_module("", wat_plugins::IDENTITY, ""),
            &[wat_plugins::WIT],
        ),
    )
    .unwrap();
    let settings = file("any.json", r#"{"images": 5}"#);
    let spec = format!("{},settings={settings}", old.display());
    let out = podstamp(&[
        "render",
        CHECKPOINTER,
        "--node",
        NODE,
        "--plugin",
        &spec,
        "--no-cache",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), expected("rust/passthrough"));

    // A validate-settings that traps: the plugin is broken, not the settings.
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, wat_plugins::validating("(unreachable)", "")).unwrap();
    let spec = broken.display().to_string();
    let err = example_with_plugin_fails(&spec, 1);
    assert!(
        err.starts_with(&format!(
            "--plugin {spec}: settings: the plugin wat 0.0.1's validate-settings failed: trapped"
        )),
        "{err}"
    );
}

/// A template whose `podstamp.io/node-selector` does not select the node
/// renders nothing (exit 3, one line naming the template, the node and the
/// selector); one that does renders as without it; a bad selector is the
/// template's error (exit 1) naming the annotation and the fix.
#[test]
fn a_template_not_for_this_node_renders_nothing_and_says_so() {
    let template = |selector: &str| {
        format!(
            "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: cp\n  namespace: kube-system\n  annotations:\n    podstamp.io/node-selector: {selector:?}\ntemplate:\n  spec:\n    containers:\n    - name: c\n      image: x:1\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cp.yaml");
    let selector = "node-role.kubernetes.io/control-plane,zone notin (b)";
    let args = |extra: &[&str]| {
        let mut args = vec!["render", "-", "--node-name", "n1", "-o"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let worker = args(&["--node-label", "zone=a"]);
    let e = fails(&refs(&worker), Some(&template(selector)), 3);
    assert_eq!(
        e,
        format!(
            "PodTemplate kube-system/cp is not for node n1: its podstamp.io/node-selector {selector:?} does not select the node's labels; nothing is rendered (exit code 3). Give the node's labels with --node or --node-label"
        )
    );
    assert!(!out.exists(), "nothing written");

    let cp = args(&[
        "--node-label",
        "node-role.kubernetes.io/control-plane=",
        "--node-label",
        "zone=a",
    ]);
    let rendered = podstamp_in(&refs(&cp), Some(template(selector).as_bytes()));
    assert!(rendered.status.success(), "{}", stderr(&rendered));
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("image: x:1")
    );

    let e = fails(&refs(&cp), Some(&template("zone in (a")), 1);
    assert!(
        e.starts_with("PodTemplate kube-system/cp: metadata.annotations.podstamp.io/node-selector: \"zone in (a\" at character 11: expected ',' or ')'")
            && e.contains("give a label selector as kubectl takes it"),
        "{e}"
    );
}
