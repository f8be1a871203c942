//! The Pod Security check on every render: Kubernetes' own
//! `k8s.io/pod-security-admission/policy`, through podstamp's helper.
//!
//! - One case per baseline and restricted check of the library, each a pod
//!   that fails exactly that check and a near pod that passes it, through the
//!   real helper at both levels: the IDs of the failed checks are pinned per
//!   case (the helper's verdict is the library's evaluator's; what is pinned
//!   is that podstamp asks it the right question and reports every check it
//!   names). The library's checks not covered here fail the test
//!   (`every_check_of_the_library_has_a_case`).
//! - Differential over the library's own test fixtures (its
//!   test/testdata/{baseline,restricted}/v1.N/{pass,fail}, every version,
//!   from the Go module cache the helper was built from): every `pass` pod
//!   allowed, every `fail` pod refused naming its check (or, at restricted,
//!   the restricted check that overrides it). Counts printed.
//! - The attacker's pod from issue 26 (hostPID, hostNetwork, a hostPath `/`
//!   at /host, privileged, a command) is refused at restricted and baseline
//!   and allowed at privileged; a restricted-profile pod passes restricted.
//! - `podstamp render` refuses a template below its level (the configured
//!   one, the annotation that tightens it, `--pod-security`), prints the
//!   level it checked against, and a helper that predates the request is a
//!   check that fails, never a pass.
//!
//! - A prefetch (several requests in flight, a pass's manifests before their
//!   checks) memoizes for each manifest the verdict its own request gives:
//!   compared case by case through the real helper, and with a stand-in
//!   helper that logs what it is asked.
//!
//! Needs target/kubecheck/podstamp-kubecheck (tests/harness/build-kubecheck.sh).

mod common;

use std::collections::BTreeSet;

use podstamp::kube_check::{KubeCheck, Level, PodSecurityError, Policy, Question, Settings};
use serde_json::{Value, json};

/// A pod that meets the restricted profile.
fn restricted_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "kube-system"},
        "spec": {
            "securityContext": {
                "runAsNonRoot": true,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "web",
                "image": "registry.example/web:1",
                "ports": [{"containerPort": 8080}],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                },
                "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}]
            }],
            "volumes": [{"name": "config", "configMap": {"name": "web"}}]
        }
    })
}

/// Merges `patch` into `doc` (objects by key; anything else replaced).
fn merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, v) in p {
                merge(d.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (d, p) => *d = p.clone(),
    }
}

fn container(patch: Value) -> Value {
    let mut c = restricted_pod()["spec"]["containers"][0].clone();
    merge(&mut c, &patch);
    json!({"spec": {"containers": [c]}})
}

/// One case: a patch of the restricted pod, and the IDs it must fail at
/// baseline and at restricted (empty: allowed).
struct Case {
    name: &'static str,
    patch: Value,
    baseline: &'static [&'static str],
    restricted: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "restricted profile",
            patch: json!({}),
            baseline: &[],
            restricted: &[],
        },
        // hostNamespaces (baseline)
        // Under hostNetwork, Kubernetes' defaults set each hostPort to its
        // containerPort (SetDefaults_Pod), before admission sees the pod:
        // so host ports fail too, as they would in the API server.
        Case {
            name: "hostNetwork",
            patch: json!({"spec": {"hostNetwork": true}}),
            baseline: &["hostNamespaces", "hostPorts"],
            restricted: &["hostNamespaces", "hostPorts"],
        },
        Case {
            name: "hostPID",
            patch: json!({"spec": {"hostPID": true}}),
            baseline: &["hostNamespaces"],
            restricted: &["hostNamespaces"],
        },
        Case {
            name: "hostNetwork false",
            patch: json!({"spec": {"hostNetwork": false, "hostPID": false, "hostIPC": false}}),
            baseline: &[],
            restricted: &[],
        },
        // privileged (baseline)
        Case {
            name: "privileged",
            patch: container(json!({"securityContext": {"privileged": true}})),
            baseline: &["privileged"],
            restricted: &["privileged"],
        },
        Case {
            name: "privileged false",
            patch: container(json!({"securityContext": {"privileged": false}})),
            baseline: &[],
            restricted: &[],
        },
        // capabilities_baseline / capabilities_restricted
        Case {
            name: "add SYS_ADMIN",
            patch: container(
                json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}}),
            ),
            baseline: &["capabilities_baseline"],
            restricted: &["capabilities_restricted"],
        },
        Case {
            name: "add NET_BIND_SERVICE",
            patch: container(
                json!({"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}),
            ),
            baseline: &[],
            restricted: &[],
        },
        Case {
            name: "drop nothing",
            patch: container(json!({"securityContext": {"capabilities": {"drop": []}}})),
            baseline: &[],
            restricted: &["capabilities_restricted"],
        },
        // hostPathVolumes (baseline) / restrictedVolumes (restricted)
        Case {
            name: "hostPath volume",
            patch: json!({"spec": {"volumes": [{"name": "config", "hostPath": {"path": "/etc"}}]}}),
            baseline: &["hostPathVolumes"],
            restricted: &["restrictedVolumes"],
        },
        Case {
            name: "emptyDir volume",
            patch: json!({"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}),
            baseline: &[],
            restricted: &[],
        },
        Case {
            name: "gitRepo volume",
            patch: json!({"spec": {"volumes": [{"name": "config", "gitRepo": {"repository": "https://example.com/r"}}]}}),
            baseline: &[],
            restricted: &["restrictedVolumes"],
        },
        // hostPorts (baseline)
        Case {
            name: "hostPort",
            patch: container(json!({"ports": [{"containerPort": 8080, "hostPort": 8080}]})),
            baseline: &["hostPorts"],
            restricted: &["hostPorts"],
        },
        Case {
            name: "hostPort 0",
            patch: container(json!({"ports": [{"containerPort": 8080, "hostPort": 0}]})),
            baseline: &[],
            restricted: &[],
        },
        // appArmorProfile (baseline)
        Case {
            name: "appArmor unconfined",
            patch: container(
                json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
            ),
            baseline: &["appArmorProfile"],
            restricted: &["appArmorProfile"],
        },
        Case {
            name: "appArmor runtime default",
            patch: container(
                json!({"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}),
            ),
            baseline: &[],
            restricted: &[],
        },
        // seLinuxOptions (baseline)
        Case {
            name: "seLinux type spc_t",
            patch: container(json!({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}})),
            baseline: &["seLinuxOptions"],
            restricted: &["seLinuxOptions"],
        },
        Case {
            name: "seLinux type container_t",
            patch: container(
                json!({"securityContext": {"seLinuxOptions": {"type": "container_t"}}}),
            ),
            baseline: &[],
            restricted: &[],
        },
        // procMount (baseline; restricted has its own)
        Case {
            name: "procMount Unmasked",
            patch: container(json!({"securityContext": {"procMount": "Unmasked"}})),
            baseline: &["procMount"],
            restricted: &["procMount_restricted"],
        },
        Case {
            name: "procMount Default",
            patch: container(json!({"securityContext": {"procMount": "Default"}})),
            baseline: &[],
            restricted: &[],
        },
        // seccompProfile_baseline / seccompProfile_restricted
        Case {
            name: "seccomp Unconfined",
            patch: json!({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}),
            baseline: &["seccompProfile_baseline"],
            restricted: &["seccompProfile_restricted"],
        },
        Case {
            name: "seccomp Localhost",
            patch: json!({"spec": {"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}}}),
            baseline: &[],
            restricted: &[],
        },
        Case {
            name: "no seccomp",
            patch: json!({"spec": {"securityContext": {"seccompProfile": null}}}),
            baseline: &[],
            restricted: &["seccompProfile_restricted"],
        },
        // sysctls (baseline)
        Case {
            name: "unsafe sysctl",
            patch: json!({"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}}),
            baseline: &["sysctls"],
            restricted: &["sysctls"],
        },
        Case {
            name: "safe sysctl",
            patch: json!({"spec": {"securityContext": {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]}}}),
            baseline: &[],
            restricted: &[],
        },
        // windowsHostProcess (baseline)
        Case {
            name: "windows hostProcess",
            patch: container(json!({"securityContext": {"windowsOptions": {"hostProcess": true}}})),
            baseline: &["windowsHostProcess"],
            restricted: &["windowsHostProcess"],
        },
        Case {
            name: "windows hostProcess false",
            patch: container(
                json!({"securityContext": {"windowsOptions": {"hostProcess": false}}}),
            ),
            baseline: &[],
            restricted: &[],
        },
        // hostProbesAndHostLifecycle (baseline)
        Case {
            name: "probe on another host",
            patch: container(
                json!({"livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 8080}}}),
            ),
            baseline: &["hostProbesAndHostLifecycle"],
            restricted: &["hostProbesAndHostLifecycle"],
        },
        Case {
            name: "probe on the pod",
            patch: container(json!({"livenessProbe": {"httpGet": {"port": 8080}}})),
            baseline: &[],
            restricted: &[],
        },
        // allowPrivilegeEscalation (restricted)
        Case {
            name: "privilege escalation",
            patch: container(json!({"securityContext": {"allowPrivilegeEscalation": true}})),
            baseline: &[],
            restricted: &["allowPrivilegeEscalation"],
        },
        // runAsNonRoot (restricted)
        Case {
            name: "runAsNonRoot false",
            patch: json!({"spec": {"securityContext": {"runAsNonRoot": false}}}),
            baseline: &[],
            restricted: &["runAsNonRoot"],
        },
        Case {
            name: "runAsNonRoot in the container",
            patch: json!({"spec": {"securityContext": {"runAsNonRoot": null}, "containers": [container(json!({"securityContext": {"runAsNonRoot": true}}))["spec"]["containers"][0].clone()]}}),
            baseline: &[],
            restricted: &[],
        },
        // runAsUser (restricted)
        Case {
            name: "runAsUser 0",
            patch: json!({"spec": {"securityContext": {"runAsUser": 0}}}),
            baseline: &[],
            restricted: &["runAsUser"],
        },
        Case {
            name: "runAsUser 1000",
            patch: json!({"spec": {"securityContext": {"runAsUser": 1000}}}),
            baseline: &[],
            restricted: &[],
        },
    ]
}

/// The library's checks (policy.DefaultChecks of v0.37.2), each a case above.
const CHECKS: [&str; 19] = [
    "allowPrivilegeEscalation",
    "appArmorProfile",
    "capabilities_baseline",
    "capabilities_restricted",
    "hostNamespaces",
    "hostPathVolumes",
    "hostPorts",
    "hostProbesAndHostLifecycle",
    "privileged",
    "procMount",
    "procMount_restricted",
    "restrictedVolumes",
    "runAsNonRoot",
    "runAsUser",
    "seLinuxOptions",
    "seccompProfile_baseline",
    "seccompProfile_restricted",
    "sysctls",
    "windowsHostProcess",
];

fn pod_of(case: &Case) -> Vec<u8> {
    let mut pod = restricted_pod();
    merge(&mut pod, &case.patch);
    serde_json::to_vec(&pod).unwrap()
}

fn failed(check: &KubeCheck, level: Level, pod: &[u8]) -> Vec<String> {
    match check.pod_security(&Policy::latest(level), pod) {
        Ok(()) => vec![],
        Err(PodSecurityError::Violated(v)) => {
            assert!(
                v.message
                    .starts_with(&format!("violates PodSecurity \"{level}:latest\": ")),
                "{}",
                v.message
            );
            v.ids().into_iter().map(String::from).collect()
        }
        Err(e) => panic!("{e}"),
    }
}

fn helper() -> KubeCheck {
    KubeCheck::new(Settings {
        path: Some(common::kubecheck()),
        ..Settings::default()
    })
}

#[test]
fn each_check_fails_and_passes_as_the_library_decides() {
    let check = helper();
    let mut disagreements = Vec::new();
    let cases = cases();
    for case in &cases {
        let pod = pod_of(case);
        for (level, want) in [
            (Level::Baseline, case.baseline),
            (Level::Restricted, case.restricted),
        ] {
            let got = failed(&check, level, &pod);
            if got != want {
                disagreements.push(format!(
                    "{} at {level}: failed {got:?}, expected {want:?}",
                    case.name
                ));
            }
        }
        // Nothing is refused at privileged.
        assert_eq!(
            failed(&check, Level::Privileged, &pod),
            Vec::<String>::new()
        );
    }
    println!(
        "{} cases x 3 levels, {} disagreements",
        cases.len(),
        disagreements.len()
    );
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

#[test]
fn every_check_of_the_library_has_a_case() {
    let failing: BTreeSet<&str> = cases()
        .iter()
        .flat_map(|c| c.baseline.iter().chain(c.restricted))
        .copied()
        .collect();
    let all: BTreeSet<&str> = CHECKS.into_iter().collect();
    assert_eq!(
        failing, all,
        "a check without a failing case, or an unknown ID"
    );
    // And every check has a case that passes it at the level it belongs to:
    // each case above that fails nothing at its level is one (by name).
    assert!(cases().iter().filter(|c| c.restricted.is_empty()).count() >= 12);
}

fn attacker_pod() -> Vec<u8> {
    let mut pod = restricted_pod();
    merge(
        &mut pod,
        &json!({"spec": {
            "hostPID": true,
            "hostNetwork": true,
            "volumes": [{"name": "config", "hostPath": {"path": "/"}}],
        }}),
    );
    pod["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", "cat /host/etc/shadow"]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "config", "mountPath": "/host"}]);
    serde_json::to_vec(&pod).unwrap()
}

#[test]
fn the_attackers_pod_is_refused_at_restricted_and_baseline_and_allowed_at_privileged() {
    let check = helper();
    let pod = attacker_pod();
    assert_eq!(
        failed(&check, Level::Baseline, &pod),
        // hostPorts: the defaults' hostPort under hostNetwork (see above).
        [
            "hostNamespaces",
            "hostPathVolumes",
            "hostPorts",
            "privileged"
        ]
    );
    let restricted = failed(&check, Level::Restricted, &pod);
    for id in [
        "hostNamespaces",
        "privileged",
        "allowPrivilegeEscalation",
        "restrictedVolumes",
    ] {
        assert!(restricted.iter().any(|r| r == id), "{id}: {restricted:?}");
    }
    assert_eq!(
        failed(&check, Level::Privileged, &pod),
        Vec::<String>::new()
    );
    // Asked once per level and bytes: again, from the memo.
    let (hits, misses) = check.pod_security_counts();
    failed(&check, Level::Baseline, &pod);
    assert_eq!(check.pod_security_counts(), (hits + 1, misses));
}

/// A podstamp render of `template` (a file) with `args`; (exit code,
/// stdout, stderr).
fn render_code(template: &str, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(&path, template).unwrap();
    common::kubecheck();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .arg("render")
        .arg(&path)
        .args(["--node-name", "n1", "--no-cache"])
        .args(args)
        .env_remove("PODSTAMP_POD_SECURITY")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`render_code`], with whether it succeeded.
fn render(template: &str, args: &[&str]) -> (bool, String, String) {
    let (code, stdout, stderr) = render_code(template, args);
    (code == 0, stdout, stderr)
}

fn template(annotations: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: web\n  namespace: kube-system\n{annotations}template:\n  metadata:\n    name: web\n  spec:\n{spec}"
    )
}

const HOST_NETWORK: &str = "    hostNetwork: true\n    containers:\n    - name: web\n      image: registry.example/web:1\n";
const RESTRICTED: &str = "    securityContext:\n      runAsNonRoot: true\n      seccompProfile: {type: RuntimeDefault}\n    containers:\n    - name: web\n      image: registry.example/web:1\n      securityContext:\n        allowPrivilegeEscalation: false\n        capabilities: {drop: [ALL]}\n";

#[test]
fn render_holds_the_pod_to_the_configured_level_and_says_which() {
    // The default: baseline, which a host-network pod does not meet.
    let (ok, stdout, stderr) = render(&template("", HOST_NETWORK), &[]);
    assert!(!ok, "{stdout}");
    assert!(stdout.is_empty(), "nothing is printed: {stdout}");
    assert!(
        stderr.contains("PodTemplate kube-system/web: the template's pod does not meet Pod Security level baseline:latest (from podstamp's default (podSecurity)): forbidden: host namespaces (hostNetwork=true)"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    // Granted deliberately.
    let (ok, stdout, stderr) = render(
        &template("", HOST_NETWORK),
        &["--pod-security", "privileged"],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("hostNetwork: true"), "{stdout}");
    assert!(
        stderr
            .contains("checked against Pod Security level privileged:latest (from --pod-security)"),
        "{stderr}"
    );
    // A restricted pod passes restricted.
    let (ok, _, stderr) = render(
        &template("", RESTRICTED),
        &["--pod-security", "restricted:v1.30"],
    );
    assert!(ok, "{stderr}");
    assert!(stderr.contains("level restricted:v1.30"), "{stderr}");
}

#[test]
fn a_templates_annotation_only_makes_the_level_stricter() {
    let stricter = "  annotations:\n    podstamp.io/pod-security: restricted\n";
    let (ok, _, stderr) = render(
        &template(stricter, HOST_NETWORK),
        &["--pod-security", "privileged"],
    );
    assert!(!ok);
    assert!(
        stderr.contains("does not meet Pod Security level restricted:latest (from the template's annotation podstamp.io/pod-security, stricter than privileged:latest (from --pod-security))"),
        "{stderr}"
    );
    // Asking for less than the level is not applied: still baseline.
    let looser = "  annotations:\n    podstamp.io/pod-security: privileged\n";
    let (ok, _, stderr) = render(&template(looser, HOST_NETWORK), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("level baseline:latest (from podstamp's default (podSecurity); the template's annotation podstamp.io/pod-security asks for privileged, which only a namespace label or podstamp's configuration can grant)"),
        "{stderr}"
    );
}

#[test]
fn a_level_that_is_no_level_is_refused_where_it_was_given() {
    let bad = "  annotations:\n    podstamp.io/pod-security: strict\n";
    let (code, stdout, stderr) = render_code(&template(bad, RESTRICTED), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("PodTemplate kube-system/web: its Pod Security level cannot be read, so it is not rendered: PodTemplate kube-system/web: metadata.annotations[podstamp.io/pod-security]: \"strict\" is not a Pod Security level"),
        "{stderr}"
    );
    let (ok, _, stderr) = render(
        &template("", RESTRICTED),
        &["--pod-security", "baseline:1.30"],
    );
    assert!(!ok);
    assert!(
        stderr.contains("--pod-security: \"1.30\" is not a Pod Security version"),
        "{stderr}"
    );
}

/// A stand-in for a helper built before the Pod Security request: it greets
/// as the old one did (no `podSecurity`), and would answer anything.
#[test]
fn a_helper_without_the_pod_security_check_is_a_check_that_fails() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("podstamp-kubecheck");
    // Only the greeting matters: podstamp must not send it the request.
    std::fs::write(
        &old,
        "#!/usr/bin/python3\nimport sys,struct\nh=b'{\"protocol\":1,\"kubernetes\":\"v1.37.2\"}'\nsys.stdout.buffer.write(struct.pack('<I',len(h))+h)\nsys.stdout.flush()\nfor _ in iter(lambda: sys.stdin.buffer.read(4), b''):\n    pass\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = KubeCheck::new(Settings {
        path: Some(old.clone()),
        ..Settings::default()
    });
    let e = check
        .pod_security(&Policy::latest(Level::Restricted), &attacker_pod())
        .unwrap_err();
    assert!(matches!(e, PodSecurityError::Unavailable(_)), "{e}");
    assert!(e.to_string().contains("has no Pod Security check"), "{e}");
}

/// Baseline checks a restricted check replaces at the restricted level
/// (`OverrideCheckIDs` in the library's policy/check_*_restricted.go).
const OVERRIDDEN_BY: [(&str, &str); 4] = [
    ("capabilities_baseline", "capabilities_restricted"),
    ("seccompProfile_baseline", "seccompProfile_restricted"),
    ("hostPathVolumes", "restrictedVolumes"),
    ("procMount", "procMount_restricted"),
];

/// The Pod Security module's version the harness pins (tests/harness/go.mod).
fn pinned_pod_security_version() -> String {
    let go_mod = std::fs::read_to_string(common::repo().join("tests/harness/go.mod")).unwrap();
    go_mod
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("k8s.io/pod-security-admission => k8s.io/pod-security-admission ")
        })
        .expect("tests/harness/go.mod replaces k8s.io/pod-security-admission")
        .trim()
        .to_string()
}

/// The library's own test fixtures (`test/testdata/{baseline,restricted}/v1.N/{pass,fail}`,
/// generated by its TestFixtures), from the Go module cache the helper was
/// built from.
fn library_fixtures() -> std::path::PathBuf {
    let version = pinned_pod_security_version();
    let cache = std::env::var_os("GOMODCACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            ["go", "/usr/local/go/bin/go"].iter().find_map(|go| {
                let out = std::process::Command::new(go)
                    .args(["env", "GOMODCACHE"])
                    .output()
                    .ok()?;
                let text = String::from_utf8(out.stdout).ok()?;
                Some(std::path::PathBuf::from(text.trim()))
            })
        })
        .expect("no Go module cache: install Go >= 1.26 and run `bash tests/harness/build-kubecheck.sh`, which downloads the pinned modules");
    let dir = cache.join(format!(
        "k8s.io/pod-security-admission@{version}/test/testdata"
    ));
    assert!(
        dir.is_dir(),
        "{} is missing: run `bash tests/harness/build-kubecheck.sh` (it downloads the pinned modules), or set GOMODCACHE",
        dir.display()
    );
    dir
}

/// Differential, over the library's own fixtures for every version and
/// both levels: each `pass` pod is allowed, each `fail` pod is refused with
/// its check (the file's name, lower-cased, is the check's ID) among the
/// failed ones.
#[test]
fn the_librarys_own_fixtures_pass_and_fail_as_it_generated_them() {
    let check = helper();
    let by_lower: std::collections::BTreeMap<String, &str> =
        CHECKS.iter().map(|id| (id.to_lowercase(), *id)).collect();
    let root = library_fixtures();
    let (mut cases, mut disagreements) = (0usize, Vec::new());
    for level in [Level::Baseline, Level::Restricted] {
        for version in std::fs::read_dir(root.join(level.as_str())).unwrap() {
            let version = version.unwrap().file_name().into_string().unwrap();
            let policy = Policy::new(level, &version).unwrap();
            for outcome in ["pass", "fail"] {
                let dir = root.join(level.as_str()).join(&version).join(outcome);
                let Ok(files) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for file in files {
                    let path = file.unwrap().path();
                    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                    let bytes = std::fs::read(&path).unwrap();
                    cases += 1;
                    let verdict = check.pod_security(&policy, &bytes);
                    let agrees = match (outcome, &verdict) {
                        ("pass", Ok(())) => true,
                        ("fail", Err(PodSecurityError::Violated(v))) => {
                            let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
                            let id = by_lower
                                .get(stem)
                                .unwrap_or_else(|| panic!("{}: no check {stem}", path.display()));
                            // At restricted, a restricted check may stand
                            // in for the baseline check it overrides (the
                            // library's OverrideCheckIDs).
                            let ids = v.ids();
                            ids.contains(id)
                                || (level == Level::Restricted
                                    && OVERRIDDEN_BY
                                        .iter()
                                        .any(|(b, r)| b == id && ids.contains(r)))
                        }
                        (_, Err(PodSecurityError::Unavailable(e))) => {
                            panic!("{}: {e}", path.display())
                        }
                        _ => false,
                    };
                    if !agrees {
                        disagreements
                            .push(format!("{level}:{version} {outcome}/{name}: {verdict:?}"));
                    }
                }
            }
        }
    }
    println!(
        "the library's fixtures: {cases} cases, {} disagreements",
        disagreements.len()
    );
    assert!(
        cases > 1000,
        "only {cases} fixtures under {}",
        root.display()
    );
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

/// A case's pod as a static pod may be (the kubelet refuses a ConfigMap
/// volume in a static pod): its `config` volume an emptyDir.
fn static_pod_of(case: &Case) -> Vec<u8> {
    let mut pod: Value = serde_json::from_slice(&pod_of(case)).unwrap();
    if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
        for volume in volumes {
            if volume.get("configMap").is_some() {
                *volume = json!({"name": volume["name"], "emptyDir": {}});
            }
        }
    }
    serde_json::to_vec(&pod).unwrap()
}

/// The combined request (a write held to a level: the kubelet's check and
/// Pod Security on one decode) answers each question exactly as its own
/// request does, for every case at every level, through the real helper.
#[test]
fn one_request_for_both_checks_answers_each_as_it_would_alone() {
    let combined = helper();
    let alone = helper();
    let (mut compared, mut refused_by_kubelet) = (0, 0);
    for case in &cases() {
        let pod = static_pod_of(case);
        for level in Level::ALL {
            // A node per level, so that no kubelet verdict is memoized and
            // every question goes out as one combined request.
            let node = format!("node-{level}");
            let policy = Policy::latest(level);
            let both = combined.check_held(&node, Some("v1.37.2"), &pod, &policy);
            let kubelet = alone.check(&node, Some("v1.37.2"), &pod);
            match (both, kubelet) {
                (Err(a), Err(b)) => {
                    assert_eq!(a, b, "{} at {level}", case.name);
                    refused_by_kubelet += 1;
                }
                (Ok(security), Ok(())) => {
                    assert_eq!(
                        security,
                        alone.pod_security(&policy, &pod),
                        "{} at {level}",
                        case.name
                    );
                    compared += 1;
                }
                (a, b) => panic!("{} at {level}: combined {a:?}, alone {b:?}", case.name),
            }
        }
    }
    println!(
        "{compared} Pod Security verdicts compared, {refused_by_kubelet} pods refused by the kubelet's check alike"
    );
    // The cases are pods the kubelet runs but for a few (e.g. a sysctl it
    // does not allow): nearly every verdict was compared.
    assert!(compared >= 3 * (cases().len() - 4), "{compared}");
    // And the attacker's pod, refused at baseline with every check named.
    let pod = attacker_pod();
    let policy = Policy::latest(Level::Baseline);
    match combined.check_held("node-attacker", None, &pod, &policy) {
        Ok(Err(PodSecurityError::Violated(v))) => assert_eq!(
            v.ids(),
            [
                "hostNamespaces",
                "hostPathVolumes",
                "hostPorts",
                "privileged"
            ]
        ),
        other => panic!("{other:?}"),
    }
}

/// A stand-in helper that logs the first bytes of every request to `log`
/// and accepts everything; `both`: its hello offers the combined request.
fn logging_helper(dir: &std::path::Path, both: bool) -> (KubeCheck, std::path::PathBuf) {
    let log = dir.join("requests.log");
    let path = dir.join("podstamp-kubecheck");
    let hello = if both {
        r#"{"protocol":1,"kubernetes":"v1.37.2","podSecurity":"v0.37.2","both":true}"#
    } else {
        r#"{"protocol":1,"kubernetes":"v1.37.2","podSecurity":"v0.37.2"}"#
    };
    std::fs::write(
        &path,
        format!(
            r#"#!/usr/bin/python3
import sys, struct
out = sys.stdout.buffer
def frame(b):
    out.write(struct.pack('<I', len(b)) + b)
    out.flush()
frame(b'{hello}')
log = open({log:?}, 'ab', buffering=0)
while True:
    n = sys.stdin.buffer.read(4)
    if len(n) < 4:
        break
    req = sys.stdin.buffer.read(struct.unpack('<I', n)[0])
    tag = req.split(b'\0')[0] if req[:1] in (b'\x01', b'\x02') else b'kubelet'
    log.write(tag.lstrip(b'\x01\x02') + b'\n')
    if req[:1] == b'\x02':
        frame(b'{{"kubelet":{{"ok":true}},"podSecurity":{{"ok":true}}}}')
    else:
        frame(b'{{"ok":true}}')
"#
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let check = KubeCheck::new(Settings {
        path: Some(path),
        ..Settings::default()
    });
    (check, log)
}

fn requests(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// A write held to a level is one round trip to the helper, and each
/// verdict is then memoized as if asked alone; a helper whose hello does not
/// offer the combined request is asked each question in turn.
#[test]
fn a_write_held_to_a_level_asks_the_helper_once() {
    let dir = tempfile::tempdir().unwrap();
    let (check, log) = logging_helper(dir.path(), true);
    let policy = Policy::latest(Level::Restricted);
    let pod = b"apiVersion: v1\nkind: Pod\n";
    assert_eq!(check.check_held("n1", None, pod, &policy), Ok(Ok(())));
    assert_eq!(requests(&log), ["both"]);
    // Both verdicts memoized under their own keys: nothing asked again.
    assert_eq!(check.check_held("n1", None, pod, &policy), Ok(Ok(())));
    assert_eq!(check.check("n1", None, pod), Ok(()));
    assert_eq!(check.pod_security(&policy, pod), Ok(()));
    assert_eq!(requests(&log), ["both"]);
    // Another level: the kubelet's verdict is memoized, so only the Pod
    // Security question goes out, on its own.
    let baseline = Policy::latest(Level::Baseline);
    assert_eq!(check.check_held("n1", None, pod, &baseline), Ok(Ok(())));
    assert_eq!(requests(&log), ["both", "pod-security"]);

    let older = tempfile::tempdir().unwrap();
    let (check, log) = logging_helper(older.path(), false);
    assert_eq!(check.check_held("n1", None, pod, &policy), Ok(Ok(())));
    assert_eq!(requests(&log), ["kubelet", "pod-security"]);
}

/// A prefetch (every case at every level held, and every case unheld, all
/// sent in one session with several requests in flight) memoizes for each
/// manifest the verdicts its own requests give: the checks afterwards ask
/// the helper nothing and answer as a check that was never prefetched.
#[test]
fn a_prefetch_answers_each_manifest_as_its_own_request_would() {
    let prefetched = helper();
    let alone = helper();
    let mut questions = Vec::new();
    for case in &cases() {
        let pod = static_pod_of(case);
        for level in Level::ALL {
            let node = format!("node-{level}");
            questions.push((case.name, node, pod.clone(), Some(Policy::latest(level))));
        }
        questions.push((case.name, "node-plain".to_string(), pod, None));
    }
    let mut session = prefetched.prefetch();
    for (_, node, pod, policy) in &questions {
        session.ask(Question {
            node,
            kubelet: Some("v1.37.2"),
            manifest: pod,
            policy: policy.as_ref(),
        });
    }
    let answered = session.finish();
    // One request per distinct question: a few cases are the same pod once
    // made static (their ConfigMap volume an emptyDir), asked once.
    let distinct: BTreeSet<(&String, &Vec<u8>)> = questions
        .iter()
        .map(|(_, node, pod, _)| (node, pod))
        .collect();
    assert_eq!(answered, distinct.len());
    let asked = prefetched.counts().1;
    assert_eq!(asked as usize, distinct.len());
    let (mut held, mut refused) = (0, 0);
    for (name, node, pod, policy) in &questions {
        match policy {
            Some(policy) => {
                let got = prefetched.check_held(node, Some("v1.37.2"), pod, policy);
                let want = alone
                    .check(node, Some("v1.37.2"), pod)
                    .map(|()| alone.pod_security(policy, pod));
                assert_eq!(got, want, "{name} on {node}");
                held += 1;
                refused += usize::from(got.is_err());
            }
            None => assert_eq!(
                prefetched.check(node, Some("v1.37.2"), pod),
                alone.check(node, Some("v1.37.2"), pod),
                "{name} unheld"
            ),
        }
    }
    // Every verdict came from the memo: nothing more was asked.
    assert_eq!(prefetched.counts().1, asked);
    assert_eq!(prefetched.counts().0 as usize, questions.len());
    println!(
        "{} questions prefetched and compared ({held} held to a level, {refused} of those refused by the kubelet's check alike)",
        questions.len()
    );
    assert!(held >= 3 * cases().len(), "{held}");
}

/// What a prefetch sends: the combined request for a pod held to a level,
/// the kubelet's for the others, a repeated question once; nothing for a
/// verdict memoized; the checks afterwards send nothing. A helper without
/// the combined request is sent the kubelet's, and the Pod Security question
/// is asked by the check, as without the prefetch. No helper: nothing sent,
/// and the check fails as it would have.
#[test]
fn a_prefetch_sends_what_the_checks_would_and_they_then_send_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (check, log) = logging_helper(dir.path(), true);
    let policy = Policy::latest(Level::Restricted);
    let (a, b) = (&b"apiVersion: v1\nkind: Pod\n"[..], &b"kind: Pod\n"[..]);
    let held = |manifest: &'static [u8]| Question {
        node: "n1",
        kubelet: None,
        manifest,
        policy: Some(&policy),
    };
    let mut session = check.prefetch();
    session.ask(held(a));
    session.ask(held(a));
    session.ask(Question {
        policy: None,
        ..held(b)
    });
    assert_eq!(session.finish(), 2);
    assert_eq!(requests(&log), ["both", "kubelet"]);
    assert_eq!(check.check_held("n1", None, a, &policy), Ok(Ok(())));
    assert_eq!(check.check("n1", None, b), Ok(()));
    assert_eq!(requests(&log), ["both", "kubelet"]);
    // Memoized already: a second session sends nothing.
    let mut session = check.prefetch();
    session.ask(held(a));
    assert_eq!(session.finish(), 0);
    assert_eq!(requests(&log), ["both", "kubelet"]);

    let older = tempfile::tempdir().unwrap();
    let (check, log) = logging_helper(older.path(), false);
    let mut session = check.prefetch();
    session.ask(held(a));
    assert_eq!(session.finish(), 1);
    assert_eq!(requests(&log), ["kubelet"]);
    assert_eq!(check.check_held("n1", None, a, &policy), Ok(Ok(())));
    assert_eq!(requests(&log), ["kubelet", "pod-security"]);

    let missing = KubeCheck::new(Settings {
        path: Some("/nonexistent/podstamp-kubecheck".into()),
        ..Settings::default()
    });
    let mut session = missing.prefetch();
    session.ask(held(a));
    assert_eq!(session.finish(), 0);
    let e = missing.check_held("n1", None, a, &policy).unwrap_err();
    assert!(e.to_string().contains("build-kubecheck.sh"), "{e}");
}
