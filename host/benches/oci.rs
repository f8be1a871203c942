//! Plugins from an OCI registry: the first use of a plugin on a node (pull
//! from the registry, check the digest, compile, then render) against a
//! start with the node's caches warm (the component from the disk cache by
//! its digest, its compiled code from the code cache: the registry is not
//! asked), side by side in one run, for plugins of every size podstamp
//! ships: the 85 KB identity, a typed Rust plugin, and the JavaScript and
//! Python examples (12 and 19 MB). Each figure is one whole `podstamp
//! render --config` process, as a node's start pays it.
//!
//! A real registry (Debian's docker-registry, TLS with a CA of this run's
//! own and basic auth, tests/oci/registry.rs) on 127.0.0.1. Prints figures;
//! asserts nothing.
//!
//! Run: `bash plugins/build.sh && bash plugins/js/build.sh && bash plugins/python/build.sh && cargo bench --bench oci`
//! (a plugin not built is left out, saying so). PODSTAMP_BENCH_OCI_RUNS
//! (default 5) runs of each.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/oci/registry.rs"]
mod registry;
#[allow(unused_imports)]
#[path = "../../tests/daemon/support.rs"]
mod support;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use registry::{PASSWORD, TestRegistry};

use common::run_ok;

/// One `podstamp render` of the example with `config`, its code cache in
/// `cache`: how long the process took.
fn timed_render(config: &Path, cache: &Path) -> Duration {
    let repo = common::repo();
    let started = Instant::now();
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_podstamp"))
            .arg("render")
            .arg(repo.join("examples/pod-checkpointer.yaml"))
            .arg("--node")
            .arg(repo.join("examples/node.yaml"))
            .arg("--config")
            .arg(config)
            .arg("--cache-dir")
            .arg(cache),
        "podstamp render",
    );
    started.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let runs: usize = std::env::var("PODSTAMP_BENCH_OCI_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let repo = common::repo();
    let podstamp = env!("CARGO_BIN_EXE_podstamp");
    let tmp = tempfile::tempdir().unwrap();

    let mut registry = TestRegistry::start_with_own_ca(&tmp.path().join("registry"));
    let auth = registry.docker_config(&tmp.path().join("auth.json"), PASSWORD);

    let plugins = [
        ("identity", "Rust, RawPod", "{}"),
        (
            "node-env",
            "Rust, typed Pod",
            r#"{"labels": {"NODE_ZONE": "topology.kubernetes.io/zone"}}"#,
        ),
        (
            "node-env-js",
            "JavaScript",
            r#"{"labels": {"NODE_ZONE": "topology.kubernetes.io/zone"}}"#,
        ),
        (
            "substitute-py",
            "Python",
            r#"{"vars": {"clusterDomain": "cluster.local"}}"#,
        ),
    ];

    println!(
        "podstamp OCI benchmark: cargo bench --bench oci (median of {runs} processes each; lower is better)"
    );
    println!(
        "{:<14} {:<16} {:>12} {:>22} {:>20} {:>8}",
        "plugin", "written in", "size", "first use (pull+compile)", "cached start", "ratio"
    );
    let mut cached_runs = Vec::new();
    for (name, language, settings) in plugins {
        let file = repo.join("target/plugins").join(format!("{name}.wasm"));
        if !file.is_file() {
            println!("{name:<14} not built ({}): left out", file.display());
            continue;
        }
        let size = fs::metadata(&file).unwrap().len();
        let pushed = run_ok(
            Command::new(podstamp)
                .args(["plugin", "push"])
                .arg(&file)
                .arg(format!("{}/bench/{name}:v1", registry.host))
                .arg("--registry-config")
                .arg(&auth)
                .arg("--registry-ca")
                .arg(&registry.ca),
            "podstamp plugin push",
        );
        let reference = pushed.trim().to_string();
        let config = tmp.path().join(format!("{name}.yaml"));
        fs::write(
            &config,
            format!(
                "plugins:\n  {name}:\n    oci: {reference}\n    settings: {settings}\nchain: [{name}]\nlimits: {{timeout: 10s}}\ndaemon: {{registry: {{config: {}, ca: {}}}}}\n",
                auth.display(),
                registry.ca.display()
            ),
        )
        .unwrap();
        let render = |cache: &Path| timed_render(&config, cache);
        let first: Vec<Duration> = (0..runs)
            .map(|i| render(&tmp.path().join(format!("cache-{name}-{i}"))))
            .collect();
        let warm = tmp.path().join(format!("cache-{name}-0"));
        let cached: Vec<Duration> = (0..runs).map(|_| render(&warm)).collect();
        let (first, cached) = (median(first), median(cached));
        println!(
            "{name:<14} {language:<16} {:>9} KB {:>22} {:>20} {:>7.1}×",
            size / 1000,
            ms(first),
            ms(cached),
            first.as_secs_f64() / cached.as_secs_f64()
        );
        cached_runs.push((name, config, warm));
    }

    // The cached start does not ask the registry: the same with it down.
    registry.stop();
    for (name, config, warm) in &cached_runs {
        println!(
            "{name:<14} cached start with the registry down: {}",
            ms(timed_render(config, warm))
        );
    }
}
