//! `podstamp render` and `podstamp plugin inspect` through the binary, with
//! the real example plugins compiled from plugins/: golden output for each
//! plugin and for the example chain, byte stability, and every error with its
//! message and exit code.

mod common;

use common::{golden, plugin, podstamp, podstamp_in, stderr, stdout};

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
    golden("passthrough.yaml", &first);
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

#[test]
fn node_env_is_golden() {
    golden(
        "node-env.yaml",
        &render_ok(&[with_plugin(
            "node-env",
            Some("tests/fixtures/node-env.yaml"),
        )]),
    );
}

#[test]
fn substitute_is_golden() {
    golden(
        "substitute.yaml",
        &render_ok(&[with_plugin(
            "substitute",
            Some("tests/fixtures/substitute.yaml"),
        )]),
    );
}

#[test]
fn arch_image_is_golden() {
    golden(
        "arch-image.yaml",
        &render_ok(&[with_plugin(
            "arch-image",
            Some("tests/fixtures/arch-image.yaml"),
        )]),
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
    golden("example-chain.yaml", &from_config);
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
fn invalid_plugin_settings_are_reported_by_the_plugin() {
    let err = arch_image_fails_with(
        "s.json",
        r#"{"images": {"pod-checkpointer": {"arm64": 5}}}"#,
    );
    assert!(err.contains("invalid settings"), "{err}");
    assert!(err.contains("images.pod-checkpointer.arm64"), "{err}");
}

#[test]
fn the_result_of_the_chain_is_validated() {
    let err = arch_image_fails_with(
        "s.yaml",
        "images: {pod-checkpointer: {arm64: \"bad image\"}}\n",
    );
    assert_eq!(
        err,
        r#"PodTemplate kube-system/pod-checkpointer: the pod returned by the plugin chain is invalid: spec.containers[0].image: "bad image" contains whitespace"#
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
        text.contains("wit:     podstamp:plugin@0.1.0 (matches this podstamp)\n"),
        "{text}"
    );
    assert!(
        text.contains("exports: podstamp:plugin/transformer@0.1.0\n"),
        "{text}"
    );
    assert!(text.contains("podstamp:plugin/host@0.1.0"), "{text}");
    let err = fails(&["plugin", "inspect", NODE], None, 1);
    assert!(
        err.starts_with("examples/node.yaml: not a valid WebAssembly component"),
        "{err}"
    );
}

#[test]
fn the_kubelet_accepts_every_golden_manifest() {
    let dir = common::repo().join("tests/golden");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
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
    let out = common::podstamp(&["render", fixture, "--node-name", "n1"]);
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
    let out = common::podstamp(&[
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
