//! Render overhead: native passthrough vs the identity plugin vs the example
//! 3-plugin chain, on a ~5 KiB control-plane pod and a ~50 KiB pod, measured
//! side by side in one run, with the stages of a native render on their own
//! (where its time goes). Prints figures and the targets of docs/performance.md;
//! asserts nothing.
//!
//! A render is timed as the daemon does it at every resync: render, then
//! compare with the manifest already on disk (in step, so nothing is read
//! back or written). The read back that precedes every write, and that
//! `podstamp render` always does, has a row of its own.
//!
//! Run: `bash plugins/build.sh && cargo bench --bench render`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use podstamp::chain::{Chain, Step};
use podstamp::config::{Catalog, ConfigFile};
use podstamp::node::NodeContext;
use podstamp::plugin::{Allocation, Limits, Runtime, WitNode};
use podstamp::render::{render, render_unverified};
use podstamp::template::{Template, parse_document};
use podstamp::{manifest, validate, write};
use serde_json::Value;

// The fault suite's WAT plugins, for the WASI row.
#[path = "../../tests/faults/wat.rs"]
mod wat_plugins;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read_value(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_document(&bytes, &path.display().to_string()).unwrap()
}

/// The 5 KiB kube-apiserver template, and a ~50 KiB one made from it by
/// adding fifteen more copies of its container.
fn templates() -> Vec<(&'static str, Template)> {
    let small = read_value(&repo().join("examples/kube-apiserver.yaml"));
    let mut large = small.clone();
    let first = large["template"]["spec"]["containers"][0].clone();
    for i in 1..16 {
        let mut copy = first.clone();
        copy["name"] = Value::String(format!("kube-apiserver-{i}"));
        large["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(copy);
    }
    vec![
        ("5 KiB pod", Template::from_value(&small).unwrap()),
        ("50 KiB pod", Template::from_value(&large).unwrap()),
    ]
}

/// Median time per iteration over batches of about 20 ms each.
fn measure(mut f: impl FnMut()) -> Duration {
    let warm_until = Instant::now() + Duration::from_millis(200);
    let mut per_batch = 0u32;
    while Instant::now() < warm_until {
        f();
        per_batch += 1;
    }
    let per_batch = (per_batch / 10).max(1);
    let mut samples: Vec<Duration> = (0..25)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            start.elapsed() / per_batch
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let plugins = repo().join("target/plugins");
    if !plugins.join("identity.wasm").is_file() {
        eprintln!("the plugins are not built: run `bash plugins/build.sh` first");
        std::process::exit(2);
    }
    let config = ConfigFile::read(&repo().join("examples/podstamp.yaml")).unwrap();
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    let catalog = Catalog::load(&config, &runtime).unwrap();
    let node = NodeContext::from_node(
        &serde_json::from_value(read_value(&repo().join("examples/node.yaml"))).unwrap(),
    )
    .unwrap();
    let wit_node = WitNode::from(&node);

    // The identity plugin once more, in a runtime that maps a fresh instance
    // for every call: what the instance pool saves.
    let on_demand_identity =
        Runtime::with_allocation(Limits::default(), None, Allocation::OnDemand)
            .unwrap()
            .load(&plugins.join("identity.wasm"))
            .unwrap();
    // The fault suite's WAT identity plugin, and the same after one WASI call
    // (so its deny-by-default WASI context is made): what WASI adds to a call.
    let wat_identity = runtime
        .load_bytes(&wat_plugins::hostile("identity"), "wat-identity.wasm")
        .unwrap();
    let wasi_identity = runtime
        .load_bytes(&wat_plugins::wasi("identity"), "wasi-identity.wasm")
        .unwrap();
    let identity = catalog
        .chain_for(&[("podstamp.io/plugins".to_string(), "identity".to_string())].into())
        .unwrap();
    // The example chain, with settings for the benchmark pod's containers.
    let step = |name: &str, settings: serde_json::Value| {
        let plugin = runtime.load(&plugins.join(format!("{name}.wasm"))).unwrap();
        std::sync::Arc::new(Step::new(name.to_string(), plugin, &settings))
    };
    let example = Chain::new(vec![
        step(
            "arch-image",
            serde_json::json!({"images": {"kube-apiserver": {
                "amd64": "registry.k8s.io/kube-apiserver-amd64:v1.36.3",
                "arm64": "registry.k8s.io/kube-apiserver-arm64:v1.36.3"}}}),
        ),
        step(
            "node-env",
            serde_json::json!({"labels": {"NODE_ZONE": "topology.kubernetes.io/zone"}}),
        ),
        step("substitute", serde_json::json!({})),
    ]);

    // node-env and its JavaScript twin (plugins/js/build.sh; skipped when
    // not built), with the same settings: what a call costs in each language.
    let node_env_settings =
        serde_json::json!({"labels": {"NODE_ZONE": "topology.kubernetes.io/zone"}}).to_string();
    let node_env = runtime.load(&plugins.join("node-env.wasm")).unwrap();
    let node_env_js = plugins
        .join("node-env-js.wasm")
        .is_file()
        .then(|| runtime.load(&plugins.join("node-env-js.wasm")).unwrap());

    println!(
        "podstamp render benchmark: cargo bench --bench render (median of 25 batches; lower is better)"
    );
    println!(
        "{:<11} {:<34} {:>12} {:>10}",
        "pod", "path", "per render", "vs native"
    );
    let disk = tempfile::tempdir().unwrap();
    for (label, template) in templates() {
        // The manifest in place, as the daemon finds it at a resync.
        let written = render(&template, &node, &example, "kube-system").unwrap();
        write::write_atomic(disk.path(), &written.file_name(), &written.bytes).unwrap();
        let in_step = |chain: &Chain| {
            let rendered =
                render_unverified(&template, &node, chain, "kube-system", &mut |_, _, _| {})
                    .unwrap();
            let m = rendered.peek();
            black_box(write::already_holds(disk.path(), &m.file_name(), &m.bytes));
        };
        let native = measure(|| in_step(&Chain::default()));
        let pod_json = template.pod().to_string();
        let identity_step = &identity.steps()[0];
        let call = measure(|| {
            black_box(
                identity_step
                    .plugin
                    .transform(&pod_json, &wit_node, &identity_step.settings_json, "bench")
                    .unwrap(),
            );
        });
        let on_demand_call = measure(|| {
            black_box(
                on_demand_identity
                    .transform(&pod_json, &wit_node, &identity_step.settings_json, "bench")
                    .unwrap(),
            );
        });
        let wat_call = measure(|| {
            black_box(
                wat_identity
                    .transform(&pod_json, &wit_node, &identity_step.settings_json, "bench")
                    .unwrap(),
            );
        });
        let wasi_call = measure(|| {
            black_box(
                wasi_identity
                    .transform(&pod_json, &wit_node, &identity_step.settings_json, "bench")
                    .unwrap(),
            );
        });
        let typed_call = |plugin: &podstamp::plugin::Plugin| {
            measure(|| {
                black_box(
                    plugin
                        .transform(&pod_json, &wit_node, &node_env_settings, "bench")
                        .unwrap(),
                );
            })
        };
        let node_env_call = typed_call(&node_env);
        let node_env_js_call = node_env_js.as_ref().map(typed_call);
        let one = measure(|| in_step(&identity));
        let three = measure(|| in_step(&example));
        let three_verified = measure(|| {
            black_box(render(&template, &node, &example, "kube-system").unwrap());
        });
        let mut pod = template.pod().clone();
        pod["metadata"]["namespace"] = Value::from("kube-system");
        let validating = measure(|| {
            validate::validate_pod(black_box(&pod)).unwrap();
        });
        let finishing = measure(|| {
            black_box(manifest::finish_unverified(
                pod.clone(),
                "kube-system",
                "kube-system/bench",
            ));
        });
        // The read back that precedes every write, on its own.
        let written = manifest::finish(pod.clone(), "kube-system", "kube-system/bench").unwrap();
        let meant = parse_document(&written.bytes, "bench").unwrap();
        let reading_back = measure(|| {
            manifest::read_back(black_box(&written.bytes), &meant).unwrap();
        });
        let ratio = |d: Duration| d.as_secs_f64() / native.as_secs_f64();
        let row = |name: &str, d: Duration, show_ratio: bool, target: &str| {
            let ratio = if show_ratio {
                format!("{:.2}x", ratio(d))
            } else {
                "-".into()
            };
            println!(
                "{label:<11} {name:<34} {:>9.1} µs {ratio:>10}   {target}",
                d.as_secs_f64() * 1e6
            );
        };
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        row("native passthrough", native, true, "");
        row("  stage: full validation", validating, true, "");
        row("  stage: manifest", finishing, true, "");
        row("read back (before a write only)", reading_back, true, "");
        let call_target = if label.starts_with("5 KiB") {
            format!(
                "target <= 100 µs: {}",
                verdict(call <= Duration::from_micros(100))
            )
        } else {
            String::new()
        };
        row("identity plugin call alone", call, false, &call_target);
        row("  the same, instance not pooled", on_demand_call, false, "");
        row("WAT identity call alone", wat_call, false, "");
        row("  the same, after one WASI call", wasi_call, false, "");
        row("node-env call alone", node_env_call, false, "");
        if let Some(d) = node_env_js_call {
            row("node-env-js call alone (JS)", d, false, "");
        }
        row("render with identity plugin", one, true, "");
        row(
            "render with 3-plugin example",
            three,
            true,
            &format!("target <= 3x: {}", verdict(ratio(three) <= 3.0)),
        );
        row(
            "  the same, read back (render cmd)",
            three_verified,
            true,
            "",
        );
        println!(
            "{label:<11} input {} bytes of JSON, manifest {} bytes",
            pod_json.len(),
            render(&template, &node, &example, "kube-system")
                .unwrap()
                .bytes
                .len()
        );
    }
}
