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
