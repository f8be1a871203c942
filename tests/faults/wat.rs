//! Hostile plugins for the fault suite: hand-written core modules in WAT,
//! made into components against our real WIT with wit-component (the
//! technique of tests/sandbox.rs), written to files a daemon config can name.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub const WIT: &str = include_str!("../../wit/podstamp.wit");
const TRANSFORM: &str = "podstamp:plugin/transformer@0.1.0#transform";

/// A core module implementing the plugin ABI; `body` is the transform
/// function's body (argument area in local 0, leaves a pointer to the
/// result area on the stack); `imports` go first, `extra` after the helpers.
pub fn core_module(imports: &str, body: &str, extra: &str) -> String {
    format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $bump (mut i32) (i32.const 4096))
  (func $alloc (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get 2))))
    (global.set $bump (i32.add (local.get $p) (local.get 3)))
    (block $ok
      (br_if $ok (i32.le_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536))))
      (drop (memory.grow (i32.add (i32.div_u (i32.sub (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
                                              (i32.const 65536)) (i32.const 1)))))
    (local.get $p))
  (data (i32.const 0) "\10\00\00\00\03\00\00\00\20\00\00\00\05\00\00\00")
  (data (i32.const 16) "wat")
  (data (i32.const 32) "0.0.1")
  (func (export "podstamp:plugin/transformer@0.1.0#info") (result i32) (i32.const 0))
  (func $ok (param $ptr i32) (param $len i32) (result i32)
    (i32.store8 (i32.const 64) (i32.const 0))
    (i32.store (i32.const 68) (local.get $ptr))
    (i32.store (i32.const 72) (local.get $len))
    (i32.const 64))
  {extra}
  (func (export "{TRANSFORM}") (param i32) (result i32)
    {body}))"#
    )
}

/// Embeds the world `plugin` of `wit_packages` (the last is the main one) and encodes a component.
pub fn componentize(core_wat: &str, wit_packages: &[&str]) -> Vec<u8> {
    let mut module = wat::parse_str(core_wat).expect("test WAT parses");
    let mut resolve = wit_parser::Resolve::default();
    let mut main = None;
    for (i, wit) in wit_packages.iter().enumerate() {
        main = Some(
            resolve
                .push_str(format!("wit{i}.wit"), wit)
                .expect("test WIT parses"),
        );
    }
    let world = resolve
        .select_world(&[main.unwrap()], Some("plugin"))
        .expect("world plugin");
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
        false,
    )
    .expect("embed WIT");
    let mut encoder = wit_component::ComponentEncoder::default();
    encoder.module(&module).expect("module").validate(true);
    encoder.encode().expect("componentize")
}

/// Returns its input pod unchanged.
pub const IDENTITY: &str = "(call $ok (i32.load (local.get 0)) (i32.load offset=4 (local.get 0)))";

/// A plugin whose transform returns exactly `output` (bytes, not necessarily UTF-8).
pub fn returning(output: &[u8]) -> (String, String) {
    let escaped: String = output.iter().map(|b| format!("\\{b:02x}")).collect();
    (
        format!("(call $ok (i32.const 1024) (i32.const {}))", output.len()),
        format!("(data (i32.const 1024) \"{escaped}\")"),
    )
}

/// A component of four core modules, each with its own memory, three of
/// which its transform grows by `grow_pages` pages (64 KiB each) before
/// returning the pod: see memories.wat.
pub fn memories(grow_pages: u32) -> Vec<u8> {
    let text = include_str!("memories.wat").replace("GROW_PAGES", &grow_pages.to_string());
    wat::parse_str(text).expect("memories.wat parses")
}

/// The hostile plugins of the fault suite, by name: (body, extra, imports).
pub fn hostile(name: &str) -> Vec<u8> {
    // Three more memories of 6 MiB: each under the fault suite's 16 MiB
    // cap, 18 MiB together.
    if name == "memories" {
        return memories(96);
    }
    let (imports, body, extra): (&str, String, String) = match name {
        "identity" => ("", IDENTITY.into(), String::new()),
        "loop" => ("", "(loop $forever (br $forever)) (unreachable)".into(), String::new()),
        "recurse" => (
            "",
            "(call $down (i32.const 0)) (unreachable)".into(),
            "(func $down (param i32) (result i32) (call $down (i32.add (local.get 0) (i32.const 1))))".into(),
        ),
        "memory" => (
            "",
            "(loop $more (drop (memory.grow (i32.const 16))) (br $more)) (unreachable)".into(),
            String::new(),
        ),
        // 128 KiB of NUL bytes: valid UTF-8, so only the size limit stops it.
        "huge" => (
            "",
            "(drop (memory.grow (i32.const 2))) (call $ok (i32.const 65536) (i32.const 131072))".into(),
            String::new(),
        ),
        "utf8" => {
            let (b, e) = returning(b"{\"a\":\"\xff\xfe\"}");
            ("", b, e)
        }
        // 1500 nested arrays (fits below the allocator at 4096): serde_json's recursion limit, not the host's stack.
        "deepjson" => {
            let deep = format!("{}{}", "[".repeat(1500), "]".repeat(1500));
            let (b, e) = returning(deep.as_bytes());
            ("", b, e)
        }
        "notjson" => {
            let (b, e) = returning(b"not json {");
            ("", b, e)
        }
        "rename" => {
            let (b, e) = returning(
                br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kube-apiserver"},"spec":{"containers":[{"name":"main","image":"evil:1"}]}}"#,
            );
            ("", b, e)
        }
        "namespace" => {
            let (b, e) = returning(
                br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"f-namespace","namespace":"../../etc"},"spec":{"containers":[{"name":"main","image":"evil:1"}]}}"#,
            );
            ("", b, e)
        }
        // What a Rust guest's panic hook does: log the message, then trap.
        "panic" => {
            let message = b"panicked at src/lib.rs:7:5: boom in the guest";
            let escaped: String = message.iter().map(|b| format!("\\{b:02x}")).collect();
            (
                r#"(import "podstamp:plugin/host@0.1.0" "log" (func $log (param i32 i32 i32)))"#,
                format!(
                    "(call $log (i32.const 0) (i32.const 1024) (i32.const {})) (unreachable)",
                    message.len()
                ),
                format!("(data (i32.const 1024) \"{escaped}\")"),
            )
        }
        // An error as long as the memory cap (16 MiB in the fault suite)
        // allows: a 14 MiB message, and a 1 MiB field.
        "longerror" => (
            "",
            r#"(drop (memory.grow (i32.const 224)))
    (memory.fill (i32.const 65536) (i32.const 0x78) (i32.const 14680064))
    (i32.store8 (i32.const 64) (i32.const 1))
    (i32.store (i32.const 68) (i32.const 65536)) (i32.store (i32.const 72) (i32.const 14680064))
    (i32.store8 (i32.const 76) (i32.const 1))
    (i32.store (i32.const 80) (i32.const 65536)) (i32.store (i32.const 84) (i32.const 1048576))
    (i32.const 64)"#
                .into(),
            String::new(),
        ),
        other => panic!("no hostile plugin {other:?}"),
    };
    componentize(&core_module(imports, &body, &extra), &[WIT])
}

/// A plugin that imports `interface` (e.g. `wasi:filesystem/preopens@0.2.0`
/// with function `func`) besides our host interface.
pub fn importing(package: &str, interface: &str, func: &str) -> Vec<u8> {
    let (pkg, version) = package.split_once('@').unwrap();
    let dep = format!("package {package};\ninterface {interface} {{ {func}: func() -> u32; }}\n");
    let full = format!("{pkg}/{interface}@{version}");
    let wit = WIT.replace(
        "    import host;",
        &format!("    import host;\n    import {full};"),
    );
    let import = format!(r#"(import "{full}" "{func}" (func $f (result i32)))"#);
    let body = format!("(drop (call $f)) {IDENTITY}");
    componentize(&core_module(&import, &body, ""), &[&dep, &wit])
}

pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path
}
