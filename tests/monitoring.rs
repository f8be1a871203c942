//! podstamp's alerting rules and Grafana dashboard (deploy/monitoring/),
//! held to what they name and what they say:
//!
//! * `promtool check rules` accepts the rules file and the PrometheusRule's
//!   groups, and `promtool test rules tests/monitoring/rules-test.yaml`
//!   passes, with every alert tested both firing and not firing;
//! * the PrometheusRule is generated from the plain rules file (one source:
//!   `PODSTAMP_BLESS=1 cargo test -p podstamp --test monitoring` rewrites
//!   it), and deploy/monitoring/ is a kustomize component that builds it
//!   beside the base;
//! * every metric the rules and the dashboard's queries name is in the
//!   `/metrics` of a real `podstamp run`, with the label values they match
//!   on; the dashboard shows every metric docs/daemon.md lists, and its
//!   queries are PromQL that promtool parses.
//!
//! Needs promtool (`apt-get install prometheus`; `bash
//! tests/harness/monitoring-deps.sh` installs it, as `bash tests/run.sh`
//! does), kubectl 1.27 or later on PATH, the plugins (`bash
//! plugins/build.sh`) and podstamp's pod check
//! (`bash tests/harness/build-kubecheck.sh`).

mod common;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use common::run_ok;
use support::Daemon;

const RULES: &str = "deploy/monitoring/podstamp-rules.yaml";
const OPERATOR: &str = "deploy/monitoring/prometheusrule.yaml";
const DASHBOARD: &str = "deploy/monitoring/grafana-dashboard.json";
const UNIT: &str = "tests/monitoring/rules-test.yaml";

fn promtool() -> Command {
    let found = Command::new("promtool").arg("--version").output();
    match found {
        Ok(out) if out.status.success() => Command::new("promtool"),
        _ => panic!(
            "promtool is missing: apt-get install prometheus (`bash tests/harness/monitoring-deps.sh` does it; so does the test command `bash tests/run.sh`)"
        ),
    }
}

fn read(path: &str) -> String {
    fs::read_to_string(common::repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(text: &str) -> Value {
    Value::deserialize(serde_norway::Deserializer::from_str(text)).unwrap()
}

/// The alerting rules: (name, expr).
fn alerts() -> Vec<(String, String)> {
    let rules = yaml(&read(RULES));
    let mut out = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            out.push((
                rule["alert"]
                    .as_str()
                    .expect("an alerting rule")
                    .to_string(),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The dashboard's queries.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(!out.is_empty());
    out
}

/// The podstamp metric names in a query.
fn metric_names(query: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("podstamp_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.push(name);
    }
    out
}

/// The `name{label="value"}` equality matchers of a query: (name, label,
/// value).
fn matchers(query: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for name in metric_names(query) {
        let Some(at) = query.find(&format!("{name}{{")) else {
            continue;
        };
        let inside = &query[at + name.len() + 1..];
        let inside = &inside[..inside.find('}').unwrap()];
        for matcher in inside.split(',') {
            if let Some((label, value)) = matcher.split_once("=\"")
                && !label.ends_with(['!', '=', '~'])
            {
                out.push((
                    name.clone(),
                    label.trim().to_string(),
                    value.trim_end_matches('"').to_string(),
                ));
            }
        }
    }
    out
}

/// The PrometheusRule for the rules file's text: its groups (the file
/// after its header comment) as the spec, comments kept.
fn prometheus_rule(rules: &str) -> String {
    let body = &rules[rules.find("\ngroups:").expect("a `groups:` line") + 1..];
    let mut out = String::from(
        "# GENERATED from podstamp-rules.yaml by tests/monitoring.rs\n\
         # (PODSTAMP_BLESS=1 cargo test -p podstamp --test monitoring): edit that\n\
         # file, not this one. The same alerting rules as a PrometheusRule of the\n\
         # Prometheus Operator (its CRD must be installed), in podstamp's namespace;\n\
         # add the label your Prometheus' ruleSelector wants in an overlay.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: podstamp\n  namespace: kube-system\n  labels:\n    app.kubernetes.io/name: podstamp\n\
         spec:\n",
    );
    for line in body.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_every_alert_is_tested_firing_and_not() {
    let repo = common::repo();
    run_ok(
        promtool().args(["check", "rules"]).arg(repo.join(RULES)),
        "promtool check rules",
    );
    // The PrometheusRule's groups, as Prometheus would load them.
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("spec.yaml");
    let operator = yaml(&read(OPERATOR));
    fs::write(&spec, serde_norway::to_string(&operator["spec"]).unwrap()).unwrap();
    let checked = run_ok(
        promtool().args(["check", "rules"]).arg(&spec),
        "promtool check rules (the PrometheusRule's spec)",
    );
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts().len())),
        "{checked}"
    );
    let out = run_ok(
        promtool()
            .args(["test", "rules"])
            .arg(repo.join(UNIT))
            .current_dir(&repo),
        "promtool test rules",
    );
    assert!(out.contains("SUCCESS"), "{out}");

    let unit = yaml(&read(UNIT));
    let cases: Vec<&Value> = unit["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect();
    for (alert, _) in alerts() {
        let of: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == alert).collect();
        let fires = |c: &&&Value| !c["exp_alerts"].as_array().unwrap().is_empty();
        assert!(
            of.iter().any(fires),
            "{UNIT} has no case where {alert} fires"
        );
        assert!(
            of.iter().any(|c| !fires(c)),
            "{UNIT} has no case where {alert} does not fire"
        );
    }
}

#[test]
fn the_prometheus_rule_is_generated_from_the_rules_file() {
    let rules = read(RULES);
    let generated = prometheus_rule(&rules);
    let path = common::repo().join(OPERATOR);
    if std::env::var("PODSTAMP_BLESS").as_deref() == Ok("1") {
        fs::write(&path, &generated).unwrap();
    }
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        generated,
        "{OPERATOR} is not generated from {RULES}: run PODSTAMP_BLESS=1 cargo test -p podstamp --test monitoring"
    );
    assert_eq!(yaml(&generated)["spec"], yaml(&rules));

    // deploy/monitoring/ is a component an overlay of deploy/ adds: kubectl's
    // kustomize builds the base and the PrometheusRule together.
    let tmp = tempfile::tempdir().unwrap();
    let repo = common::repo();
    let overlay = tmp.path().join("overlay");
    fs::create_dir(&overlay).unwrap();
    copy_dir(&repo.join("deploy"), &tmp.path().join("deploy"));
    fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../deploy]\ncomponents: [../deploy/monitoring]\n",
    )
    .unwrap();
    let built = run_ok(
        Command::new("kubectl").arg("kustomize").arg(&overlay),
        "kubectl kustomize (deploy/ with the monitoring component; kubectl 1.27 or later must be on PATH)",
    );
    let objects: Vec<Value> = serde_norway::Deserializer::from_str(&built)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let rule: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rule.len(), 1, "{built}");
    assert_eq!(rule[0]["spec"], yaml(&rules));
    assert!(objects.iter().any(|o| o["kind"] == "DaemonSet"));
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn the_dashboards_queries_are_promql_and_show_every_documented_metric() {
    // Each query as a recording rule, its Grafana variables given values,
    // for promtool's parser.
    let queries = dashboard_queries();
    let rules = json!({"groups": [{"name": "dashboard", "rules": queries.iter().enumerate().map(|(i, q)| json!({
        "record": format!("dashboard:query{i}"),
        "expr": q.replace("$__rate_interval", "5m").replace("$instance", ".*"),
    })).collect::<Vec<_>>()}]});
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("dashboard-rules.yaml");
    fs::write(&file, serde_norway::to_string(&rules).unwrap()).unwrap();
    run_ok(
        promtool().args(["check", "rules"]).arg(&file),
        "promtool check rules (the dashboard's queries)",
    );

    // docs/daemon.md's metric table: each row's metric, in the dashboard.
    let docs = read("docs/daemon.md");
    let table = &docs[docs.find("| metric | type | meaning |").unwrap()..];
    let documented: BTreeSet<String> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| `podstamp_"))
        .map(|l| metric_names(l)[0].clone())
        .collect();
    assert!(documented.len() >= 20, "{documented:?}");
    let shown: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| metric_names(q))
        .map(|n| base_name(&n).to_string())
        .collect();
    let missing: Vec<_> = documented.difference(&shown).collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} shows no panel of {missing:?} (docs/daemon.md, Observability)"
    );
}

/// A histogram's series name without its suffix.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|b| *b == "podstamp_plugin_call_duration_seconds")
        .unwrap_or(name)
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    common::kubecheck();
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    let manifests = tmp.path().join("manifests");
    fs::create_dir_all(&templates).unwrap();
    fs::create_dir_all(&manifests).unwrap();
    fs::write(
        templates.join("web.yaml"),
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\ntemplate:\n  spec:\n    containers:\n    - {name: web, image: busybox:1, command: [sleep, \"3600\"]}\n",
    )
    .unwrap();
    let config = support::write_config(tmp.path());
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--source",
            &format!("dir:{}", templates.display()),
            "--node-name",
            "n1",
            "--manifest-dir",
            manifests.to_str().unwrap(),
        ],
        tmp.path().join("podstamp.log"),
    );
    daemon.wait_ready(Duration::from_secs(60));
    let (code, body) = daemon.get("/metrics").expect("/metrics answers");
    assert_eq!(code, 200);

    // Every metric the exposition declares, a histogram's series too.
    let mut exported = BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            exported.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    assert!(exported.contains("podstamp_ready"), "{body}");

    let docs = read("docs/daemon.md");
    let mut named = Vec::new();
    for (alert, expr) in alerts() {
        named.push((format!("{RULES}: {alert}"), expr));
    }
    for query in dashboard_queries() {
        named.push((DASHBOARD.to_string(), query));
    }
    for (whose, query) in &named {
        for name in metric_names(query) {
            assert!(
                exported.contains(&name),
                "{whose} names {name}, which `podstamp run` does not export: {query}"
            );
        }
        // A label value matched on: in a series of the exposition, or one
        // docs/daemon.md gives for that metric (a phase the node is not in).
        for (name, label, value) in matchers(query) {
            let series = format!("{label}=\"{value}\"");
            let in_exposition = body
                .lines()
                .any(|l| l.starts_with(&format!("{name}{{")) && l.contains(&series));
            let row = docs
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}{{")))
                .unwrap_or_else(|| panic!("docs/daemon.md has no row for {name}"));
            assert!(
                in_exposition || row.contains(&format!("`{value}`")),
                "{whose} matches {name}{{{series}}}, a value neither exported nor documented: {query}"
            );
        }
    }
    assert!(daemon.stop().success());
}
