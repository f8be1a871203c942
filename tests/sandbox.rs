//! The plugin sandbox against hostile components.
//!
//! Each plugin here is a hand-written core module in WAT, made into a
//! component against our real WIT (or a variant of it) with wit-component,
//! so every failure mode is exact: a loop, a memory bomb, a trap, a stack
//! overflow, malformed or oversized output, a forbidden import.

use std::path::Path;
use std::time::{Duration, Instant};

use podstamp::chain::{Chain, Step, StepFailure};
use podstamp::node::NodeContext;
use podstamp::plugin::{CallFailure, Limits, LoadError, Plugin, Runtime, WitNode};
use serde_json::json;

// The fault suite's WAT plugins (the module allows dead code: this suite
// uses only their building blocks).
#[path = "faults/wat.rs"]
mod wat_plugins;

use wat_plugins::{IDENTITY, WIT, componentize};

fn core_module(body: &str, extra: &str) -> String {
    wat_plugins::core_module("", body, extra)
}

fn plugin_bytes(body: &str) -> Vec<u8> {
    plugin_bytes_with(body, "")
}

fn plugin_bytes_with(body: &str, extra: &str) -> Vec<u8> {
    componentize(&core_module(body, extra), &[WIT])
}

fn limits() -> Limits {
    Limits {
        timeout: Duration::from_millis(50),
        memory_bytes: 8 << 20,
        max_output_bytes: 64 << 10,
    }
}

fn runtime() -> Runtime {
    Runtime::new(limits(), None).unwrap()
}

fn pod() -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
           "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
    .to_string()
}

fn call(plugin: &Plugin) -> Result<String, CallFailure> {
    plugin.transform(
        &pod(),
        &WitNode::from(&NodeContext::named("n1")),
        "{}",
        "test",
    )
}

fn load(runtime: &Runtime, body: &str) -> Plugin {
    runtime
        .load_bytes(&plugin_bytes(body), "test.wasm")
        .unwrap()
}

#[test]
fn more_concurrent_calls_than_instance_slots_all_succeed() {
    // Calls hold one of the runtime's 16 pooled instance slots while they
    // spin; the ones beyond wait for a slot instead of failing. The deadline
    // is generous so that a loaded machine cannot fail this test.
    let runtime = Runtime::new(
        Limits {
            timeout: Duration::from_secs(5),
            ..limits()
        },
        None,
    )
    .unwrap();
    let spin = "(func $spin (param $n i32) (loop $more (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $more (local.get $n))))";
    let body = format!("(call $spin (i32.const 2000000)) {IDENTITY}");
    let plugin = runtime
        .load_bytes(&plugin_bytes_with(&body, spin), "spin.wasm")
        .unwrap();
    let failures: Vec<CallFailure> = std::thread::scope(|scope| {
        let callers: Vec<_> = (0..48)
            .map(|_| {
                scope.spawn(|| {
                    (0..3)
                        .filter_map(|_| call(&plugin).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        callers
            .into_iter()
            .flat_map(|caller| caller.join().unwrap())
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} calls failed: {:?}",
        failures.len(),
        failures.first()
    );
}

#[test]
fn a_well_behaved_component_round_trips_the_pod() {
    let plugin = load(&runtime(), IDENTITY);
    assert_eq!(plugin.info().to_string(), "wat 0.0.1");
    assert_eq!(call(&plugin).unwrap(), pod());
}

#[test]
fn an_infinite_loop_is_stopped_at_the_deadline_and_the_runtime_keeps_working() {
    let runtime = runtime();
    let looping = load(&runtime, "(loop $forever (br $forever)) (unreachable)");
    let good = load(&runtime, IDENTITY);
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(
            call(&looping),
            Err(CallFailure::DeadlineExceeded {
                timeout: Duration::from_millis(50)
            })
        );
        // Not a benchmark: an unbounded loop would never get here at all.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(call(&good).unwrap(), pod(), "the next call works");
    }
    assert_eq!(
        call(&looping).unwrap_err().to_string(),
        "deadline of 50 ms exceeded; the call was stopped"
    );
}

#[test]
fn growing_memory_past_the_cap_is_a_clean_error() {
    let plugin = load(
        &runtime(),
        "(loop $more (drop (memory.grow (i32.const 16))) (br $more)) (unreachable)",
    );
    assert_over_the_8_mib_cap(call(&plugin).unwrap_err());
}

#[test]
fn a_huge_initial_memory_is_refused_when_instantiated() {
    let wat = core_module(IDENTITY, "").replace(
        "(memory (export \"memory\") 1)",
        "(memory (export \"memory\") 2000)",
    );
    let runtime = runtime();
    // info() runs at load time, so the cap already stops the load.
    let err = runtime
        .load_bytes(&componentize(&wat, &[WIT]), "big.wasm")
        .unwrap_err();
    assert!(
        err.to_string().contains("memory cap of 8 MiB exceeded"),
        "{err}"
    );
}

#[test]
fn a_trap_is_reported_with_what_the_plugin_logged() {
    let plugin = load(&runtime(), "(unreachable)");
    let failure = call(&plugin).unwrap_err();
    assert!(
        matches!(&failure, CallFailure::Trap { trap, .. } if trap.contains("unreachable")),
        "{failure:?}"
    );
}

#[test]
fn deep_recursion_is_a_stack_overflow() {
    let plugin = plugin_bytes_with(
        "(call $down (i32.const 0)) (unreachable)",
        "(func $down (param i32) (result i32) (call $down (i32.add (local.get 0) (i32.const 1))))",
    );
    let plugin = runtime().load_bytes(&plugin, "deep.wasm").unwrap();
    assert_eq!(call(&plugin), Err(CallFailure::StackOverflow));
}

#[test]
fn invalid_utf8_output_is_malformed_data() {
    let plugin = plugin_bytes_with(
        "(call $ok (i32.const 512) (i32.const 2))",
        r#"(data (i32.const 512) "\ff\fe")"#,
    );
    let plugin = runtime().load_bytes(&plugin, "utf8.wasm").unwrap();
    let failure = call(&plugin).unwrap_err();
    assert!(
        matches!(&failure, CallFailure::Malformed { detail } if detail.contains("utf-8")),
        "{failure:?}"
    );
}

#[test]
fn output_over_the_size_limit_is_refused() {
    // 1 MiB of NUL bytes is valid UTF-8, so only the size check stops it.
    let plugin = plugin_bytes_with(
        "(drop (memory.grow (i32.const 17))) (call $ok (i32.const 65536) (i32.const 1048576))",
        "",
    );
    let plugin = runtime().load_bytes(&plugin, "big.wasm").unwrap();
    assert_eq!(
        call(&plugin),
        Err(CallFailure::OutputTooLarge {
            size: 1 << 20,
            limit: 64 << 10
        })
    );
}

#[test]
fn a_plugin_error_keeps_its_message_and_field() {
    // result::err(plugin-error { message: "no", field: some("spec.x") })
    let body = r#"
    (i32.store8 (i32.const 64) (i32.const 1))
    (i32.store (i32.const 68) (i32.const 512)) (i32.store (i32.const 72) (i32.const 2))
    (i32.store8 (i32.const 76) (i32.const 1))
    (i32.store (i32.const 80) (i32.const 520)) (i32.store (i32.const 84) (i32.const 6))
    (i32.const 64)"#;
    let plugin = plugin_bytes_with(
        body,
        r#"(data (i32.const 512) "no") (data (i32.const 520) "spec.x")"#,
    );
    let plugin = runtime().load_bytes(&plugin, "err.wasm").unwrap();
    let failure = call(&plugin).unwrap_err();
    assert_eq!(
        failure,
        CallFailure::Rejected {
            message: "no".into(),
            field: Some("spec.x".into())
        }
    );
    assert_eq!(failure.to_string(), "spec.x: no");
}

#[test]
fn a_huge_plugin_error_is_cut_to_4_kib() {
    // err(plugin-error { message: 7 MiB of "x", field: some(the first 5 KiB of it) }):
    // as much as the 8 MiB memory cap allows.
    let body = r#"
    (drop (memory.grow (i32.const 112)))
    (memory.fill (i32.const 65536) (i32.const 0x78) (i32.const 7340032))
    (i32.store8 (i32.const 64) (i32.const 1))
    (i32.store (i32.const 68) (i32.const 65536)) (i32.store (i32.const 72) (i32.const 7340032))
    (i32.store8 (i32.const 76) (i32.const 1))
    (i32.store (i32.const 80) (i32.const 65536)) (i32.store (i32.const 84) (i32.const 5120))
    (i32.const 64)"#;
    let plugin = runtime()
        .load_bytes(&plugin_bytes(body), "long.wasm")
        .unwrap();
    let Err(CallFailure::Rejected { message, field }) = call(&plugin) else {
        panic!("not rejected");
    };
    let cut = |len: usize| format!("{}… (cut: {len} bytes in all)", "x".repeat(4096));
    assert_eq!(message, cut(7 << 20));
    assert_eq!(field, Some(cut(5120)));
}

#[test]
fn memories_over_the_cap_together_are_stopped_though_each_is_under_it() {
    // A component of four core modules, each with its own memory; three
    // grow theirs to 3 MiB: 9 MiB and more together, over the 8 MiB cap.
    let plugin = runtime()
        .load_bytes(&wat_plugins::memories(48), "memories.wasm")
        .unwrap();
    // Each alone is under the cap: one grown memory is no failure.
    assert_eq!(
        call(
            &runtime()
                .load_bytes(&wat_plugins::memories(0), "m.wasm")
                .unwrap()
        )
        .unwrap(),
        pod()
    );
    assert_over_the_8_mib_cap(call(&plugin).unwrap_err());
}

/// Grows its memory to 256 KiB, looks at every byte above 32 KiB (its data,
/// inputs and results lie below) and returns as its error the first 8 that
/// are not zero; finding none, it leaves a secret in each of the 4 pages
/// and returns its pod.
const SNOOP: &str = r#"
  (func $snoop (result i32)
    (local $p i32)
    (drop (memory.grow (i32.const 3)))
    (local.set $p (i32.const 32768))
    (block $clean
      (loop $next
        (br_if $clean (i32.ge_u (local.get $p) (i32.const 262144)))
        (if (i64.ne (i64.load (local.get $p)) (i64.const 0))
          (then
            (i32.store8 (i32.const 64) (i32.const 1))
            (i32.store (i32.const 68) (local.get $p))
            (i32.store (i32.const 72) (i32.const 8))
            (i32.store8 (i32.const 76) (i32.const 0))
            (return (i32.const 1))))
        (local.set $p (i32.add (local.get $p) (i32.const 8)))
        (br $next)))
    ;; "SECRET!!"
    (i64.store (i32.const 32768) (i64.const 0x2121544552434553))
    (i64.store (i32.const 70000) (i64.const 0x2121544552434553))
    (i64.store (i32.const 140000) (i64.const 0x2121544552434553))
    (i64.store (i32.const 262136) (i64.const 0x2121544552434553))
    (i32.const 0))"#;

#[test]
fn a_call_never_sees_what_an_earlier_call_left_in_memory() {
    // Every call instantiates the plugin in one of the pool's reused slots;
    // the slot's memory must be reset between calls, or a plugin would read
    // the pods and settings an earlier call (of another template) had.
    // This checks the normal path, pages in RAM. The reset also holds for a
    // page the kernel swapped out (the pool drops the whole memory with
    // madvise(MADV_DONTNEED) instead of resetting the dirty pages it finds
    // present with PAGEMAP_SCAN: see host/src/plugin/pool.rs), but a page
    // cannot be made to swap out on a machine without swap, so that case is
    // not tested here.
    let runtime = runtime();
    let body = format!("(if (result i32) (call $snoop) (then (i32.const 64)) (else {IDENTITY}))");
    let snoop = runtime
        .load_bytes(&plugin_bytes_with(&body, SNOOP), "snoop.wasm")
        .unwrap();
    let calls = |n: usize| {
        for i in 0..n {
            if let Err(e) = call(&snoop) {
                panic!(
                    "call {i}: expected it found nothing an earlier call left, but it found: {e}"
                );
            }
        }
    };
    calls(100);
    // Concurrent calls, in several slots at once.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| calls(50));
        }
    });
}

fn chain_of(runtime: &Runtime, bodies: &[(&str, &str)]) -> Chain {
    let steps = bodies
        .iter()
        .enumerate()
        .map(|(i, (body, extra))| {
            let plugin = runtime
                .load_bytes(&plugin_bytes_with(body, extra), "p.wasm")
                .unwrap();
            // No scope: these chains are about the sandbox and the chain's
            // own checks, which hold whatever a plugin is granted.
            let step = Step::new(format!("step{i}"), plugin, &json!({}))
                .with_scope(podstamp::scope::Scope::unrestricted());
            std::sync::Arc::new(step)
        })
        .collect();
    Chain::new(steps)
}

#[test]
fn the_chain_blames_the_plugin_that_returned_invalid_json_or_renamed_the_pod() {
    let runtime = runtime();
    let node = WitNode::from(&NodeContext::named("n1"));
    let not_json = (
        r#"(call $ok (i32.const 512) (i32.const 8))"#,
        r#"(data (i32.const 512) "not json")"#,
    );
    let chain = chain_of(&runtime, &[(IDENTITY, ""), not_json]);
    let failure = chain
        .apply(&serde_json::from_str(&pod()).unwrap(), &node, "t")
        .unwrap_err();
    assert_eq!((failure.position, failure.step.as_str()), (2, "step1"));
    assert!(matches!(failure.failure, StepFailure::InvalidJson(_)));
    assert!(
        failure
            .to_string()
            .starts_with("plugin 2 of 2 `step1` (wat 0.0.1): returned invalid JSON"),
        "{failure}"
    );

    let renamed = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"other"}}"#;
    let data = format!("(data (i32.const 512) {renamed:?})");
    let rename = format!("(call $ok (i32.const 512) (i32.const {}))", renamed.len());
    let chain = chain_of(&runtime, &[(&rename, &data)]);
    let failure = chain
        .apply(&serde_json::from_str(&pod()).unwrap(), &node, "t")
        .unwrap_err();
    assert_eq!(
        failure.failure,
        StepFailure::Renamed {
            from: "web".into(),
            to: "other".into()
        }
    );
}

#[test]
fn a_component_importing_wasi_beyond_the_fixed_list_is_refused_at_load() {
    let bytes = wat_plugins::importing("wasi:http@0.2.0", "outgoing-handler", "handle");
    let err = runtime().load_bytes(&bytes, "wasi.wasm").unwrap_err();
    assert!(matches!(err, LoadError::ForbiddenImport { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "wasi.wasm: imports `wasi:http/outgoing-handler@0.2.0`, which podstamp does not provide: plugins get only podstamp:plugin/host (@0.1.0 or @0.1.1) and WASI 0.2's io, clocks, random, cli, filesystem and sockets interfaces, which grant nothing"
    );
}

fn load_wasi(runtime: &Runtime, name: &str) -> Plugin {
    runtime
        .load_bytes(&wat_plugins::wasi(name), &format!("wasi-{name}.wasm"))
        .unwrap_or_else(|e| panic!("wasi-{name}: {e}"))
}

#[test]
fn wasi_grants_no_file_socket_environment_argument_or_stdin() {
    let runtime = runtime();
    for (name, found) in [
        (
            "files",
            "no preopened directory: /etc/passwd cannot be opened",
        ),
        (
            "socket",
            "no TCP socket to connect to 127.0.0.1 with: access-denied",
        ),
        ("env", "empty environment and arguments, stdin closed"),
    ] {
        let failure = call(&load_wasi(&runtime, name)).unwrap_err();
        assert_eq!(
            failure,
            CallFailure::Rejected {
                message: found.into(),
                field: None
            },
            "{name}"
        );
    }
}

#[test]
fn a_wasi_plugin_that_calls_exit_fails_and_the_runtime_keeps_working() {
    let runtime = runtime();
    let failure = call(&load_wasi(&runtime, "exit")).unwrap_err();
    assert_eq!(failure, CallFailure::Exited { status: 1 });
    assert_eq!(
        failure.to_string(),
        "called exit (status 1) instead of returning: a plugin returns its pod or an error"
    );
    assert_eq!(call(&load(&runtime, IDENTITY)).unwrap(), pod());
}

#[test]
fn a_wasi_sleep_holds_no_thread_and_a_loop_on_the_clock_is_stopped_at_the_deadline() {
    let runtime = runtime();
    // An hour's sleep returns at once, the clock unmoved (were the sleep
    // real, this call would outlive the test).
    assert_eq!(
        call(&load_wasi(&runtime, "sleep")).unwrap_err(),
        CallFailure::Rejected {
            message: "slept an hour in no time".into(),
            field: None
        }
    );
    assert_eq!(
        call(&load_wasi(&runtime, "clock")).unwrap_err(),
        CallFailure::DeadlineExceeded {
            timeout: limits().timeout
        }
    );
}

#[test]
fn a_wasi_plugin_renders_the_same_bytes_on_every_call_and_every_runtime() {
    let outputs: Vec<String> = (0..2)
        .flat_map(|_| {
            let runtime = runtime();
            let plugin = load_wasi(&runtime, "determinism");
            (0..3).map(|_| call(&plugin).unwrap()).collect::<Vec<_>>()
        })
        .collect();
    assert!(outputs.iter().all(|o| *o == outputs[0]), "{outputs:#?}");
    let pod: serde_json::Value = serde_json::from_str(&outputs[0]).unwrap();
    let hex = pod["metadata"]["annotations"]["wasi"].as_str().unwrap();
    // The wall clock (12 bytes) and the monotonic clock (8) at zero; 16
    // random bytes, which are not.
    assert_eq!(&hex[..40], "0".repeat(40), "{hex}");
    assert_ne!(&hex[40..], "0".repeat(32), "{hex}");
}

#[test]
fn a_component_built_against_another_wit_version_is_refused_naming_the_expected_one() {
    let wit = WIT.replace(
        "package podstamp:plugin@0.1.0;",
        "package podstamp:plugin@0.2.0;",
    );
    let wat = core_module(IDENTITY, "").replace("transformer@0.1.0#", "transformer@0.2.0#");
    let err = runtime()
        .load_bytes(&componentize(&wat, &[&wit]), "old.wasm")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "old.wasm: built against podstamp:plugin@0.2.0, but this podstamp loads podstamp:plugin@0.1.0 and @0.1.1 (it implements podstamp:plugin@0.1.1); rebuild the plugin with the matching SDK"
    );
}

#[test]
fn something_that_is_not_a_plugin_is_refused() {
    let runtime = runtime();
    let err = runtime
        .load_bytes(b"not wasm at all", "junk.wasm")
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("junk.wasm: not a valid WebAssembly component"),
        "{err}"
    );
    let empty = wat::parse_str("(component)").unwrap();
    let err = runtime.load_bytes(&empty, "empty.wasm").unwrap_err();
    assert_eq!(
        err.to_string(),
        "empty.wasm: does not export podstamp:plugin/transformer (@0.1.0 or @0.1.1), so it is not a podstamp plugin (it exports: nothing)"
    );
    let err = runtime.load(Path::new("/nonexistent/p.wasm")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/p.wasm: cannot read plugin"),
        "{err}"
    );
}

#[test]
fn compiled_code_is_cached_by_content_and_a_bad_cache_entry_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let bytes = plugin_bytes(IDENTITY);
    let runtime = Runtime::new(limits(), Some(&cache)).unwrap();
    call(&runtime.load_bytes(&bytes, "a.wasm").unwrap()).unwrap();
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    let name = entry.file_name().unwrap().to_string_lossy().into_owned();
    let sha = runtime
        .load_bytes(&bytes, "a.wasm")
        .unwrap()
        .sha256()
        .to_string();
    assert!(name.starts_with(&sha) && name.ends_with(".cwasm"), "{name}");

    // A new runtime (a restart) loads from the cache; a corrupt entry is replaced.
    std::fs::write(entry, b"garbage").unwrap();
    let runtime = Runtime::new(limits(), Some(&cache)).unwrap();
    assert_eq!(
        call(&runtime.load_bytes(&bytes, "a.wasm").unwrap()).unwrap(),
        pod()
    );
    assert_ne!(std::fs::read(entry).unwrap(), b"garbage");
}

#[test]
fn a_cache_dir_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Runtime::new(limits(), Some(dir.path()))
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains(&format!(
            "is writable by group or others (mode 0777), so another user could replace the compiled code podstamp runs: run `chmod 0700 {}`",
            dir.path().display()
        )),
        "{err}"
    );
}

/// `failure` is the memory cap of [`runtime`] (8 MiB), hit by a larger request.
fn assert_over_the_8_mib_cap(failure: CallFailure) {
    assert!(
        matches!(failure, CallFailure::MemoryCapExceeded { limit, requested } if limit == 8 << 20 && requested > limit),
        "{failure:?}"
    );
    assert!(
        failure
            .to_string()
            .starts_with("memory cap of 8 MiB exceeded"),
        "{failure}"
    );
}

/// WIT 0.1.1's optional `validate-settings`: called only on a plugin that
/// exports it (a 0.1.0 component has nothing to call and accepts anything
/// here), its refusal kept with its field, and bounded like any call.
#[test]
fn validate_settings_is_called_when_exported_and_bounded_like_a_call() {
    let runtime = runtime();
    let old = load(&runtime, IDENTITY);
    assert!(!old.validates_settings());
    assert_eq!(old.validate_settings(r#"{"anything": 1}"#), Ok(()));
    assert!(call(&old).is_ok(), "a 0.1.0 component still transforms");

    let load_validating = |(body, extra): (&str, &str)| {
        runtime
            .load_bytes(&wat_plugins::validating(body, extra), "v.wasm")
            .unwrap()
    };
    let accepting = load_validating((wat_plugins::VALIDATE_OK, ""));
    assert!(accepting.validates_settings());
    assert_eq!(accepting.validate_settings("{}"), Ok(()));
    assert_eq!(call(&accepting), Ok(pod()), "a 0.1.1 component transforms");

    let (body, extra) = wat_plugins::validate_refusing("must be set", "label");
    let refusing = load_validating((&body, &extra));
    assert_eq!(
        refusing.validate_settings("{}"),
        Err(CallFailure::Rejected {
            message: "must be set".into(),
            field: Some("label".into()),
        })
    );

    let trapping = load_validating(("(unreachable)", ""));
    assert!(
        matches!(
            trapping.validate_settings("{}"),
            Err(CallFailure::Trap { .. })
        ),
        "{:?}",
        trapping.validate_settings("{}")
    );
    let looping = load_validating(("(loop $l (br $l)) (unreachable)", ""));
    assert_eq!(
        looping.validate_settings("{}"),
        Err(CallFailure::DeadlineExceeded {
            timeout: limits().timeout
        })
    );
}

/// Noted by the second security review: a plugin that hits the limit of
/// live resource handles was reported as "returned malformed data". It is
/// named as the limit it hit; a plugin that drops its handles may take as
/// many as it likes, one at a time; the runtime keeps working.
#[test]
fn a_plugin_holding_too_many_handles_is_stopped_at_the_handle_limit_named_as_such() {
    // Time enough for 120,000 host calls in a debug build: the limit, not
    // the deadline, is what must stop it.
    let runtime = Runtime::new(
        Limits {
            timeout: Duration::from_secs(10),
            ..limits()
        },
        None,
    )
    .unwrap();
    let failure = call(&load_wasi(&runtime, "handles")).unwrap_err();
    assert_eq!(
        failure,
        CallFailure::HandleLimitExceeded {
            limit: podstamp::plugin::MAX_HANDLES_PER_CALL
        }
    );
    assert_eq!(
        failure.to_string(),
        "held more than 10000 resource handles at once (the per-call limit); the call was stopped: a plugin must drop the handles it is done with"
    );
    assert_eq!(
        call(&load_wasi(&runtime, "handles-dropped")).unwrap(),
        pod()
    );
    assert_eq!(call(&load(&runtime, IDENTITY)).unwrap(), pod());
}
