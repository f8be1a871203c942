//! Shared by the integration tests: paths, the built plugins, the binary,
//! RBAC grants waited for, deploy/ applied.
#![allow(dead_code)]

pub mod deploy;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// kubectl from PATH; fails saying what to install when it is not there.
pub fn kubectl() -> Command {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    match found {
        Ok(out) if out.status.success() => {}
        _ => panic!(
            "kubectl is missing: install kubectl 1.27 or later (with its built-in kustomize v5) on PATH"
        ),
    }
    Command::new("kubectl")
}

/// The value of `sample` (a metric's name and labels as written) in a
/// Prometheus text `body`; None when it is not there.
pub fn sample_value(body: &str, sample: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

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

/// A plugin built from source as a test fixture, tests/fixtures/`name` (a
/// crate using the SDK, as `podstamp plugin new` makes one), with
/// plugins/build.sh into target/fixture-plugins; built once per test
/// process, and not rebuilt when up to date.
pub fn fixture_plugin(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let out_dir = repo().join("target/fixture-plugins");
    let path = out_dir.join(format!("{name}.wasm"));
    if !built.iter().any(|b| b == name) {
        let status = Command::new("bash")
            .arg(repo().join("plugins/build.sh"))
            .arg("--manifest-path")
            .arg(repo().join(format!("tests/fixtures/{name}/Cargo.toml")))
            .arg("--out-dir")
            .arg(&out_dir)
            // std for wasm32, built by the examples' build already.
            .arg("--target-dir")
            .arg(repo().join("target/wasm32"))
            .status()
            .expect("run plugins/build.sh (bash is needed)");
        assert!(
            status.success(),
            "plugins/build.sh could not build tests/fixtures/{name}: see its output above (it installs its toolchain when run as root)"
        );
        built.push(name.to_string());
    }
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

/// Runs a plugin SDK's build script (`plugins/<sdk>/build.sh DIR OUT`) on
/// a source it must refuse: it fails with one error line starting with
/// `says` and writes nothing at `out`. `what` names the case in a failure.
pub fn build_refused(script: &str, dir: &Path, out: &Path, says: &str, what: &str) {
    let run = Command::new("bash")
        .arg(repo().join(script))
        .args([dir, out])
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "built with {what}:\n{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(
        err.lines().any(|l| l.starts_with(says)),
        "no line {says:?} in:\n{err}"
    );
    assert!(!out.exists(), "{} written", out.display());
}

/// The `declares:` line `podstamp render --explain` printed on `stderr`
/// for a plugin that declares its scope.
pub fn declares_shown(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.starts_with("  declares: "))
        .unwrap_or_else(|| panic!("no declaration shown:\n{stderr}"))
        .to_string()
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

/// One permission an RBAC rule gives: `verb` on `resource` of API `group`,
/// in `namespace` (empty: cluster-wide), on the object `name` when the rule
/// names objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: Option<String>,
}

/// deploy/rbac.yaml's `rules` as a test grants them for its own namespace
/// `ns`, which stands for kube-system: a rule naming kube-system (the one
/// Namespace podstamp reads, by name) names `ns` instead.
pub fn for_namespace(rules: serde_json::Value, ns: &str) -> serde_json::Value {
    let text = rules
        .to_string()
        .replace("\"kube-system\"", &format!("{ns:?}"));
    serde_json::from_str(&text).expect("rules stay JSON")
}

/// Every permission RBAC `rules` (a Role's or ClusterRole's `rules`, as
/// JSON) give in `namespace`: each verb on each resource, on each of the
/// rule's resourceNames if it has some.
pub fn grants(rules: &serde_json::Value, namespace: &str) -> Vec<Grant> {
    let texts = |rule: &serde_json::Value, field: &str| -> Vec<String> {
        rule[field]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| Some(v.as_str()?.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut all = Vec::new();
    for rule in rules.as_array().expect("RBAC rules are a list") {
        let names: Vec<Option<String>> = match texts(rule, "resourceNames") {
            names if names.is_empty() => vec![None],
            names => names.into_iter().map(Some).collect(),
        };
        for group in texts(rule, "apiGroups") {
            for resource in texts(rule, "resources") {
                for verb in texts(rule, "verbs") {
                    for name in &names {
                        all.push(Grant {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            namespace: namespace.to_string(),
                            name: name.clone(),
                        });
                    }
                }
            }
        }
    }
    all
}

/// Whether the user of `client` has `grant`, as the API server's authorizer
/// answers that user's SelfSubjectAccessReview.
pub async fn allowed(client: &kube::Client, grant: &Grant) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(grant.verb.clone()),
                group: Some(grant.group.clone()),
                resource: Some(grant.resource.clone()),
                namespace: (!grant.namespace.is_empty()).then(|| grant.namespace.clone()),
                name: grant.name.clone(),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    let answer = api.create(&Default::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Waits until the user of `client` has every permission `rules` give in
/// `namespace` (empty: cluster-wide), asking the API server as that user
/// (SelfSubjectAccessReview) every 50 ms, for at most `limit`; panics
/// naming a permission still refused then. A Role or binding just created
/// takes effect once the authorizer's cache has seen it: a request before
/// may be refused (tests/daemon.rs's ConfigMap watch was, about once in
/// five full runs). Call it before the first request that needs them.
pub async fn wait_for_grants(
    client: &kube::Client,
    namespace: &str,
    rules: &serde_json::Value,
    limit: Duration,
) {
    let start = Instant::now();
    for grant in grants(rules, namespace) {
        loop {
            match allowed(client, &grant).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => eprintln!("SelfSubjectAccessReview of {grant:?}: {e}"),
            }
            assert!(
                start.elapsed() < limit,
                "{grant:?} still not granted after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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

/// Template `id`'s rollout state as podstamp keeps it in the revisions
/// directory `history` (its line of `rollout-states.jsonl`); null when it
/// has none.
pub fn rollout_state(history: &Path, id: &str) -> serde_json::Value {
    let Ok(text) = std::fs::read_to_string(history.join("rollout-states.jsonl")) else {
        return serde_json::Value::Null;
    };
    text.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|line| line["template"] == id)
        .map_or(serde_json::Value::Null, |line| line["state"].clone())
}
