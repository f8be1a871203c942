//! Plugin field scopes (issue 26), through `podstamp render` and `podstamp
//! test` with a real plugin built from source: the attacker of the issue
//! (tests/fixtures/attacker, the SDK as `podstamp plugin new` sets it up),
//! which returns a restricted-profile pod with the host's namespaces, its
//! `/` mounted, a privileged container and a command of its own.
//!
//! Each test writes its own catalog naming the built component, renders
//! tests/fixtures/restricted-podtemplate.yaml, and checks the one error
//! line (plugin, digest, field, the grant that would allow it) or the
//! manifest.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{podstamp, repo, stderr, stdout};

const TEMPLATE: &str = "tests/fixtures/restricted-podtemplate.yaml";

/// The attacker component (built once per test run) and its sha256.
fn attacker() -> &'static (PathBuf, String) {
    static BUILT: OnceLock<(PathBuf, String)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let path = common::fixture_plugin("attacker");
        let sha = {
            use sha2::{Digest, Sha256};
            hex::encode(Sha256::digest(std::fs::read(&path).unwrap()))
        };
        (path, sha)
    })
}

/// A catalog of `entries` (name, settings, scope lines or None for the
/// default), every one the attacker, run in that order.
fn catalog(dir: &Path, entries: &[(&str, &str, Option<&[&str]>)]) -> PathBuf {
    let (path, _) = attacker();
    let mut text = String::from("plugins:\n");
    for (name, settings, scope) in entries {
        text.push_str(&format!(
            "  {name}:\n    path: {}\n    settings: {settings}\n",
            path.display()
        ));
        if let Some(scope) = scope {
            text.push_str(if scope.is_empty() {
                "    scope: []\n"
            } else {
                "    scope:\n"
            });
            for grant in *scope {
                text.push_str(&format!("    - '{grant}'\n"));
            }
        }
    }
    let names: Vec<&str> = entries.iter().map(|(n, _, _)| *n).collect();
    text.push_str(&format!(
        "chain: [{}]\nlimits: {{timeout: 10s}}\n",
        names.join(", ")
    ));
    let config = dir.join("podstamp.yaml");
    std::fs::write(&config, text).unwrap();
    config
}

fn render(config: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "render",
        TEMPLATE,
        "--node-name",
        "n1",
        "--config",
        config.to_str().unwrap(),
        "--no-cache",
    ];
    args.extend_from_slice(extra);
    podstamp(&args)
}

/// The one error line of a refused render, without its prefix.
fn refused(config: &Path) -> String {
    let out = render(config, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "expected a refusal: {err}");
    assert_eq!(stdout(&out), "", "nothing written when refused");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err.trim_end()
        .strip_prefix("podstamp: error: ")
        .unwrap_or_else(|| panic!("{err}"))
        .to_string()
}

fn rendered(config: &Path) -> String {
    let out = render(config, &[]);
    assert!(out.status.success(), "render failed: {}", stderr(&out));
    stdout(&out)
}

const DEFAULT: &str =
    "the default (metadata.labels, spec.containers[*].env, spec.initContainers[*].env)";

#[test]
fn the_attacker_is_refused_by_the_default_scope_naming_plugin_digest_field_and_grant() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = attacker();
    let config = catalog(dir.path(), &[("evil", "{}", None)]);
    assert_eq!(
        refused(&config),
        format!(
            "PodTemplate kube-system/web: plugin 1 of 1 `evil` (attacker 0.1.0): spec.containers[0].securityContext.allowPrivilegeEscalation: changed, outside the plugin's scope: {DEFAULT}; the change is refused (plugin sha256 {sha}); if this plugin may change it, grant it in its catalog entry: scope: [spec.containers[*].securityContext.allowPrivilegeEscalation]"
        )
    );
}

#[test]
fn each_overstep_is_refused_on_its_own_by_the_default_scope() {
    let dir = tempfile::tempdir().unwrap();
    for (part, says) in [
        ("hostPID", "spec.hostPID: added"),
        ("hostNetwork", "spec.hostNetwork: added"),
        // The volume first: its mount comes after it in the walk.
        ("hostPath", "spec.containers[0].volumeMounts: added"),
        (
            "privileged",
            "spec.containers[0].securityContext.allowPrivilegeEscalation: changed",
        ),
        ("command", "spec.containers[0].command: added"),
    ] {
        let config = catalog(
            dir.path(),
            &[("evil", &format!("{{only: [{part}]}}"), None)],
        );
        let line = refused(&config);
        assert!(
            line.contains(&format!(": {says}, outside the plugin's scope: {DEFAULT}")),
            "{part}: {line}"
        );
    }
    // Granted env alone, only the hostPath volume still refused, at the volumes.
    let config = catalog(
        dir.path(),
        &[(
            "evil",
            "{only: [hostPath]}",
            Some(&["spec.containers[*].volumeMounts"]),
        )],
    );
    let line = refused(&config);
    assert!(
        line.contains(
            "spec.volumes: added, outside the plugin's scope: spec.containers[*].volumeMounts;"
        ) && line.ends_with("scope: [spec.volumes]"),
        "{line}"
    );
}

#[test]
fn the_attacker_renders_only_when_its_entry_grants_every_field_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let grants: &[&str] = &[
        "spec.hostPID",
        "spec.hostNetwork",
        "spec.volumes",
        "spec.containers[web].volumeMounts",
        "spec.containers[web].securityContext",
        "spec.containers[web].command",
    ];
    // Everything but the env variable, which an explicit scope must grant too.
    let all = "{only: [hostPID, hostNetwork, hostPath, privileged, command]}";
    let config = catalog(dir.path(), &[("evil", all, Some(grants))]);
    // Every field granted, the pod is still held to Pod Security (baseline
    // by default): the two checks are each a boundary of their own.
    let line = refused(&config);
    assert!(
        line.contains("does not meet Pod Security level baseline")
            && line.contains("host namespaces (hostNetwork=true, hostPID=true)"),
        "{line}"
    );
    // Allowed only when both grant it: the scope and level privileged.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("podSecurity: privileged\n");
    std::fs::write(&config, text).unwrap();
    let manifest = rendered(&config);
    for field in [
        "hostPID: true",
        "hostNetwork: true",
        "privileged: true",
        "mountPath: /host",
        "path: /",
        "cat /host/etc/shadow",
    ] {
        assert!(manifest.contains(field), "{field} missing:\n{manifest}");
    }
    // One grant fewer, and it is refused again, naming the missing one.
    for missing in 0..grants.len() {
        let fewer: Vec<&str> = grants
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != missing)
            .map(|(_, g)| *g)
            .collect();
        let config = catalog(dir.path(), &[("evil", all, Some(&fewer))]);
        let line = refused(&config);
        let field = grants[missing].replace("[web]", "[0]");
        assert!(
            line.contains(&format!("): {field}")),
            "without {}: {line}",
            grants[missing]
        );
    }
}

#[test]
fn a_plugin_that_changes_only_its_granted_fields_passes() {
    let dir = tempfile::tempdir().unwrap();
    // env is in the default scope.
    let config = catalog(dir.path(), &[("tame", "{only: [env]}", None)]);
    assert!(rendered(&config).contains("name: ATTACKER"));
    // A command, granted by name to the container it changes.
    let config = catalog(
        dir.path(),
        &[(
            "tame",
            "{only: [command]}",
            Some(&["spec.containers[web].command"]),
        )],
    );
    assert!(rendered(&config).contains("cat /host/etc/shadow"));
    // ... but not to another container's name.
    let config = catalog(
        dir.path(),
        &[(
            "tame",
            "{only: [command]}",
            Some(&["spec.containers[other].command"]),
        )],
    );
    assert!(refused(&config).contains("spec.containers[0].command: added"));
    // `scope: []` allows nothing, not even env.
    let config = catalog(dir.path(), &[("tame", "{only: [env]}", Some(&[]))]);
    assert!(refused(&config).contains("outside the plugin's scope: nothing (scope: [])"),);
}

#[test]
fn a_chain_whose_second_plugin_undoes_the_first_is_refused_at_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = attacker();
    // The first holds the container to the restricted profile (granted);
    // the second, granted env only, makes it privileged again.
    let config = catalog(
        dir.path(),
        &[
            (
                "restrict",
                "{only: [restrict]}",
                Some(&["spec.containers[*].securityContext"]),
            ),
            (
                "undo",
                "{only: [privileged, env]}",
                Some(&["spec.containers[*].env"]),
            ),
        ],
    );
    let line = refused(&config);
    assert!(
        line.starts_with(&format!(
            "PodTemplate kube-system/web: plugin 2 of 2 `undo` (attacker 0.1.0): spec.containers[0].securityContext.allowPrivilegeEscalation: changed, outside the plugin's scope: spec.containers[*].env; the change is refused (plugin sha256 {sha})"
        )),
        "{line}"
    );
    // The first alone renders.
    let config = catalog(
        dir.path(),
        &[(
            "restrict",
            "{only: [restrict]}",
            Some(&["spec.containers[*].securityContext"]),
        )],
    );
    assert!(rendered(&config).contains("RuntimeDefault"));
}

#[test]
fn a_template_cannot_widen_a_scope_with_its_settings_annotation() {
    let dir = tempfile::tempdir().unwrap();
    let config = catalog(dir.path(), &[("evil", "{only: [env]}", None)]);
    // The template's settings make the plugin do everything: still refused.
    let text = std::fs::read_to_string(repo().join(TEMPLATE))
        .unwrap()
        .replace(
            "  namespace: kube-system\n",
            "  namespace: kube-system\n  annotations:\n    podstamp.io/settings: '{\"evil\": {\"only\": null}}'\n",
        );
    let template = dir.path().join("t.yaml");
    std::fs::write(&template, text).unwrap();
    let out = podstamp(&[
        "render",
        template.to_str().unwrap(),
        "--node-name",
        "n1",
        "--config",
        config.to_str().unwrap(),
        "--no-cache",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("outside the plugin's scope: {DEFAULT}")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn explain_shows_what_each_plugin_changed_also_when_the_render_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = catalog(
        dir.path(),
        &[
            (
                "restrict",
                "{only: [restrict]}",
                Some(&["spec.containers[*].securityContext"]),
            ),
            ("tame", "{only: [env]}", None),
        ],
    );
    let out = render(&config, &["--explain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "plugin 1 `restrict` (attacker 0.1.0): 2 changes\n\
         \x20 spec.containers[0].securityContext.runAsNonRoot: added\n\
         \x20 spec.containers[0].securityContext.seccompProfile: added\n\
         plugin 2 `tame` (attacker 0.1.0): 1 change\n\
         \x20 spec.containers[0].env: added\n\
         podstamp: checked against Pod Security level baseline:latest (from podstamp's default (podSecurity))\n"
    );
    // Without --explain, only the level checked against.
    assert_eq!(
        stderr(&render(&config, &[])),
        "podstamp: checked against Pod Security level baseline:latest (from podstamp's default (podSecurity))\n"
    );
    // A refused render explains the plugins that ran to their end, then
    // says the error last.
    let config = catalog(
        dir.path(),
        &[
            ("tame", "{only: [env]}", None),
            ("evil", "{only: [hostPID]}", None),
        ],
    );
    let out = render(&config, &["--explain"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "plugin 1 `tame` (attacker 0.1.0): 1 change",
            "  spec.containers[0].env: added"
        ],
        "{err}"
    );
    assert!(
        lines[2].starts_with("podstamp: error: ") && lines[2].contains("spec.hostPID: added"),
        "{err}"
    );
    assert_eq!(lines.len(), 3, "{err}");
}

#[test]
fn podstamp_test_shows_what_each_plugin_changed_under_a_failed_case() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    let case = cases.join("evil");
    std::fs::create_dir_all(&case).unwrap();
    catalog(
        &cases,
        &[
            ("tame", "{only: [env]}", None),
            ("evil", "{only: [hostPID]}", None),
        ],
    );
    std::fs::copy(repo().join(TEMPLATE), cases.join("template.yaml")).unwrap();
    std::fs::write(
        cases.join("node.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
    )
    .unwrap();
    std::fs::write(case.join("expected.yaml"), "not what it renders\n").unwrap();
    let out = podstamp(&["test", cases.to_str().unwrap(), "--no-cache"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("  what each plugin changed:\n  plugin 1 `tame` (attacker 0.1.0): 1 change\n    spec.containers[0].env: added\n"),
        "{text}"
    );
}

#[test]
fn a_grant_that_is_not_a_field_path_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, reason) in [
        ("spec..x", "an empty field name"),
        ("[*]", "a path starts with a field name"),
        (
            "spec.containers[]",
            "[] selects nothing: write [*] or [NAME]",
        ),
    ] {
        let config = catalog(dir.path(), &[("evil", "{}", Some(&[bad]))]);
        let out = render(&config, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(
            err.trim_end(),
            format!(
                "podstamp: error: plugins.evil.scope: {bad:?} is not a field path: {reason} (e.g. metadata.labels, spec.containers[*].env, spec.containers[web].image)"
            ),
            "{bad}"
        );
    }
}

/// A plugin declares the scope it needs (the SDK's `scope!`, a custom
/// section of its component): `render --explain` shows it beside the
/// catalog's grant and names what the catalog does not grant; a refusal
/// says whether the plugin declared the change it made. The example
/// plugins declare exactly what they may change, whatever their settings.
#[test]
fn a_plugins_declared_scope_is_shown_beside_its_grant_and_named_in_a_refusal() {
    let out = podstamp(&[
        "render",
        "examples/pod-checkpointer.yaml",
        "--config",
        "examples/podstamp.yaml",
        "--node",
        "examples/node.yaml",
        "--no-cache",
        "--explain",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    for line in [
        "  declares: spec.containers[*].image, spec.initContainers[*].image; granted: spec.containers[pod-checkpointer].image",
        "  declared, not granted: spec.containers[*].image, spec.initContainers[*].image",
        "  declares: spec.containers[*].env, spec.initContainers[*].env; granted: spec.containers[pod-checkpointer].env",
        "  declares: metadata, spec; granted: metadata.annotations[\"checkpointer.alpha.coreos.com/checkpoint-of\"], spec.containers[pod-checkpointer].command",
    ] {
        assert!(
            err.lines().any(|l| l == line),
            "no line {line:?} in:\n{err}"
        );
    }

    // Granted what it declares: nothing is left ungranted.
    let dir = tempfile::tempdir().unwrap();
    let plugin = repo().join("target/plugins/arch-image.wasm");
    let write = |scope: &str| {
        let config = dir.path().join("podstamp.yaml");
        std::fs::write(
            &config,
            format!(
                "plugins:\n  arch-image:\n    path: {}\n    settings: {{images: {{web: {{amd64: a:1, arm64: a:1}}}}}}\n{scope}chain: [arch-image]\npodSecurity: privileged\n",
                plugin.display()
            ),
        )
        .unwrap();
        config
    };
    let config = write("    scope: ['spec.containers[*].image', 'spec.initContainers']\n");
    let out = render(&config, &["--explain"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("  declares: spec.containers[*].image, spec.initContainers[*].image; granted: spec.containers[*].image, spec.initContainers\n")
            && !err.contains("declared, not granted"),
        "{err}"
    );

    // The default scope: refused, and the refusal says the plugin declared
    // the change; the attacker declares nothing, and its refusals say
    // nothing of a declaration (the tests above).
    let line = refused(&write(""));
    assert!(
        line.contains("spec.containers[0].image: changed, outside the plugin's scope: the default")
            && line.ends_with("; the plugin declares this change (it declares: spec.containers[*].image, spec.initContainers[*].image), which its catalog entry does not grant"),
        "{line}"
    );
}
