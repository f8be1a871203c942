//! podstamp where kubectl users already are: `kubectl podstamp status`
//! (podstamp on PATH as `kubectl-podstamp`, as krew installs plugins), run
//! by the real kubectl against the harness's real API server (one of this
//! test's own, stopped when it ends), with ages in the `AGE` column as
//! kubectl prints them; and `podstamp completion bash` driven by a real
//! bash's completion machinery.
//!
//! Needs kubectl on PATH, the Go harness (`bash tests/harness/build.sh`)
//! and bash.

mod common;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use common::run_ok;
use support::ApiServer;

/// A directory holding `kubectl-podstamp`, a link to this build's podstamp
/// (what `ln -s "$(command -v podstamp)" kubectl-podstamp` makes), and
/// PATH with it first.
fn plugin_path(dir: &Path) -> String {
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podstamp"), dir.join("kubectl-podstamp"))
        .unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    format!("{}:{path}", dir.display())
}

fn kubectl(path: &str) -> Command {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "kubectl is missing: install kubectl on PATH"
    );
    let mut command = Command::new("kubectl");
    command.env("PATH", path).env_remove("RUST_LOG");
    command
}

#[test]
fn kubectl_runs_podstamp_status_as_its_plugin_with_ages_as_kubectl_prints_them() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let path = plugin_path(&bin);

    // kubectl finds it.
    let listed = run_ok(
        kubectl(&path).args(["plugin", "list", "--name-only"]),
        "kubectl plugin list",
    );
    assert!(
        listed.lines().any(|l| l.trim() == "kubectl-podstamp"),
        "{listed}"
    );

    // A node's status record, as its daemon writes it: web's new revision
    // ready on n1 for 3h10m.
    let server = ApiServer::start(&tmp.path().join("apiserver"));
    let kubeconfig = server.kubeconfig("admin");
    let since = Timestamp::now() - SignedDuration::from_secs(3 * 3600 + 10 * 60);
    let record = json!({"version": 1, "templates": {"kube-system/web": {
        "revision": "c752cf21c8", "target": "c752cf21c8", "wanted": "c752cf21c8",
        "generation": 3, "phase": "ready", "since": since.to_string()}}});
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "podstamp-node.n1", "labels": {"podstamp.io/lease": "node-status"},
            "annotations": {"podstamp.io/status": record.to_string()}},
        "spec": {"holderIdentity": "n1"}}))
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api: kube::Api<Lease> =
            kube::Api::namespaced(server.admin().await, "podstamp-rollouts-status");
        api.create(&Default::default(), &lease).await.unwrap();
    });

    let out = run_ok(
        kubectl(&path)
            .args(["podstamp", "status", "-n", "kube-system"])
            .env("KUBECONFIG", &kubeconfig),
        "kubectl podstamp status",
    );
    let head = out
        .lines()
        .find(|l| l.starts_with("  NODE"))
        .unwrap_or_else(|| panic!("{out}"));
    let at = head.find("   AGE").expect("an AGE column") + 3;
    let row = out
        .lines()
        .find(|l| l.starts_with("  n1 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        row[at..].split_whitespace().next(),
        Some("3h10m"),
        "kubectl prints 3 hours 10 minutes as 3h10m:\n{out}"
    );
    assert!(
        out.starts_with("TEMPLATE") && out.contains("kube-system/web"),
        "{out}"
    );

    // Its help speaks as kubectl's plugin.
    let help = run_ok(
        kubectl(&path).args(["podstamp", "status", "--help"]),
        "kubectl podstamp status --help",
    );
    assert!(
        help.contains("Usage: kubectl podstamp status [OPTIONS] [TEMPLATE]"),
        "{help}"
    );
    assert!(help.contains("\nExamples:\n"), "{help}");
    drop(server);
}

/// What bash completes after `words` (the last one being completed), with
/// the script `podstamp completion bash` prints loaded.
fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let program = format!(
        "source {}\nCOMP_WORDS=({line})\nCOMP_CWORD={}\nCOMP_LINE='{line}'\nCOMP_POINT=${{#COMP_LINE}}\n_podstamp podstamp '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = run_ok(
        Command::new("bash").args(["--norc", "-c", &program]),
        "bash completion",
    );
    out.lines().map(str::to_string).collect()
}

#[test]
fn the_bash_completion_script_completes_podstamps_commands_and_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("podstamp.bash");
    let out = common::podstamp(&["completion", "bash"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    std::fs::write(&script, &out.stdout).unwrap();

    let commands = bash_completes(&script, &["podstamp", "st"]);
    assert_eq!(commands, ["status"], "podstamp st<TAB>");
    let all = bash_completes(&script, &["podstamp", ""]);
    for command in ["render", "run", "status", "test", "plugin", "completion"] {
        assert!(all.iter().any(|c| c == command), "{command}: {all:?}");
    }
    let flags = bash_completes(&script, &["podstamp", "status", "--wa"]);
    assert_eq!(flags, ["--watch"], "podstamp status --wa<TAB>");
    let mut shells = bash_completes(&script, &["podstamp", "completion", ""]);
    shells.retain(|c| !c.starts_with('-'));
    assert_eq!(shells, ["bash", "zsh", "fish"], "podstamp completion <TAB>");

    // zsh and fish: their scripts, from the same generator (no zsh or fish
    // here to run them: the generator is clap's, exercised above for bash).
    for (shell, marker) in [
        ("zsh", "#compdef podstamp"),
        ("fish", "complete -c podstamp"),
    ] {
        let out = common::podstamp(&["completion", shell]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let text = common::stdout(&out);
        assert!(
            text.contains(marker) && text.contains("status"),
            "{shell}: {text}"
        );
    }
    let bad = common::podstamp(&["completion", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
}
