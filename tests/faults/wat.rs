//! Hostile plugins for the fault suite: hand-written core modules in WAT,
//! made into components against our real WIT with wit-component (the
//! technique of tests/sandbox.rs), written to files a daemon config can name.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The contract as it was at 0.1.0 (before `settings-validator`), which the host
/// still loads: every hand-written plugin of the tests is a 0.1.0
/// component, so each test that uses one also shows that such a component
/// keeps working.
pub const WIT: &str = include_str!("../fixtures/wit-0.1.0/podstamp.wit");
/// The contract of today (0.1.1: the optional `settings-validator` export).
pub const WIT_0_1_1: &str = include_str!("../../wit/podstamp.wit");
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

/// A component of today's WIT (0.1.1, with the `settings-validator` export) that
/// returns the pod unchanged and whose `validate-settings` runs `body`
/// (the settings' pointer and length in locals 0 and 1; it leaves a
/// pointer to the result on the stack); `extra` goes after the helpers.
pub fn validating(body: &str, extra: &str) -> Vec<u8> {
    let extra = format!(
        "{extra}\n  (func (export \"podstamp:plugin/settings-validator@0.1.1#validate-settings\") (param i32 i32) (result i32)\n    {body})"
    );
    let module = core_module("", IDENTITY, &extra).replace("@0.1.0#", "@0.1.1#");
    componentize(&module, &[WIT_0_1_1])
}

/// A `validate-settings` that accepts any settings.
pub const VALIDATE_OK: &str = "(i32.store8 (i32.const 2048) (i32.const 0)) (i32.const 2048)";

/// A `validate-settings` that refuses any settings with `message` at
/// `field`: (body, extra) for [`validating`]. The result is laid out as the
/// canonical ABI lays out `result<_, plugin-error>`: the case at 2048, the
/// message's pointer and length at 2052 and 2056, the field's option at
/// 2060, its pointer and length at 2064 and 2068.
pub fn validate_refusing(message: &str, field: &str) -> (String, String) {
    (
        format!(
            "(i32.store8 (i32.const 2048) (i32.const 1))
    (i32.store (i32.const 2052) (i32.const 2304)) (i32.store (i32.const 2056) (i32.const {}))
    (i32.store8 (i32.const 2060) (i32.const 1))
    (i32.store (i32.const 2064) (i32.const 2560)) (i32.store (i32.const 2068) (i32.const {}))
    (i32.const 2048)",
            message.len(),
            field.len()
        ),
        format!("(data (i32.const 2304) \"{message}\") (data (i32.const 2560) \"{field}\")"),
    )
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
    if let Some(wasi_plugin) = name.strip_prefix("wasi-") {
        return wasi(wasi_plugin);
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

/// Just the parts of WASI 0.2 (at 0.2.0, as older toolchains import it; the
/// host matches any 0.2.x) that the WASI plugins below call, dependencies
/// first: our own minimal WIT, type for type as in the WASI packages.
pub const WASI_WIT: &[&str] = &[
    "package wasi:io@0.2.0;
interface error { resource error; }
interface poll { resource pollable { block: func(); } }
interface streams {
  use error.{error};
  variant stream-error { last-operation-failed(error), closed }
  resource input-stream { blocking-read: func(len: u64) -> result<list<u8>, stream-error>; }
  resource output-stream { blocking-write-and-flush: func(contents: list<u8>) -> result<_, stream-error>; }
}",
    "package wasi:clocks@0.2.0;
interface monotonic-clock {
  use wasi:io/poll@0.2.0.{pollable};
  type instant = u64;
  type duration = u64;
  now: func() -> instant;
  subscribe-duration: func(when: duration) -> pollable;
}
interface wall-clock {
  record datetime { seconds: u64, nanoseconds: u32 }
  now: func() -> datetime;
}",
    "package wasi:cli@0.2.0;
interface environment {
  get-environment: func() -> list<tuple<string, string>>;
  get-arguments: func() -> list<string>;
}
interface exit { exit: func(status: result); }
interface stdin { use wasi:io/streams@0.2.0.{input-stream}; get-stdin: func() -> input-stream; }
interface stdout { use wasi:io/streams@0.2.0.{output-stream}; get-stdout: func() -> output-stream; }",
    "package wasi:random@0.2.0;
interface random { get-random-bytes: func(len: u64) -> list<u8>; }",
    "package wasi:filesystem@0.2.0;
interface types { resource descriptor; }
interface preopens {
  use types.{descriptor};
  get-directories: func() -> list<tuple<descriptor, string>>;
}",
    "package wasi:sockets@0.2.0;
interface network {
  enum error-code {
    unknown, access-denied, not-supported, invalid-argument, out-of-memory, timeout,
    concurrency-conflict, not-in-progress, would-block, invalid-state, new-socket-limit,
    address-not-bindable, address-in-use, remote-unreachable, connection-refused,
    connection-reset, connection-aborted, datagram-too-large, name-unresolvable,
    temporary-resolver-failure, permanent-resolver-failure
  }
  enum ip-address-family { ipv4, ipv6 }
}
interface tcp { resource tcp-socket; }
interface tcp-create-socket {
  use network.{error-code, ip-address-family};
  use tcp.{tcp-socket};
  create-tcp-socket: func(address-family: ip-address-family) -> result<tcp-socket, error-code>;
}",
];

/// The WASI interfaces the plugin world of the WASI plugins imports (a
/// component imports only those its core module uses).
const WASI_IMPORTS: &[&str] = &[
    "wasi:clocks/monotonic-clock@0.2.0",
    "wasi:clocks/wall-clock@0.2.0",
    "wasi:cli/environment@0.2.0",
    "wasi:cli/exit@0.2.0",
    "wasi:cli/stdin@0.2.0",
    "wasi:cli/stdout@0.2.0",
    "wasi:random/random@0.2.0",
    "wasi:filesystem/preopens@0.2.0",
    "wasi:sockets/tcp-create-socket@0.2.0",
];

/// Helpers of the WASI plugins: `$err` returns a plugin error whose message
/// is `len` bytes at `ptr`; `$hex` writes `n` bytes at `src` as 2n hex
/// digits at `dst`.
const WASI_HELPERS: &str = r#"
  (func $err (param $ptr i32) (param $len i32) (result i32)
    (i32.store8 (i32.const 64) (i32.const 1))
    (i32.store (i32.const 68) (local.get $ptr))
    (i32.store (i32.const 72) (local.get $len))
    (i32.store8 (i32.const 76) (i32.const 0))
    (i32.const 64))
  (data (i32.const 2000) "0123456789abcdef")
  (func $hex (param $src i32) (param $n i32) (param $dst i32)
    (local $i i32) (local $b i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $b (i32.load8_u (i32.add (local.get $src) (local.get $i))))
      (i32.store8 (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 1)))
        (i32.load8_u (i32.add (i32.const 2000) (i32.shr_u (local.get $b) (i32.const 4)))))
      (i32.store8 (i32.add (i32.add (local.get $dst) (i32.shl (local.get $i) (i32.const 1))) (i32.const 1))
        (i32.load8_u (i32.add (i32.const 2000) (i32.and (local.get $b) (i32.const 15)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next))))
"#;

/// A plugin error `message`, or `otherwise` when `cond` (WAT) is false;
/// the two messages go at 1024 and 1536.
fn verdict(cond: &str, message: &str, otherwise: &str) -> (String, String) {
    (
        format!(
            "(if (result i32) {cond} (then (call $err (i32.const 1024) (i32.const {}))) (else (call $err (i32.const 1536) (i32.const {}))))",
            message.len(),
            otherwise.len()
        ),
        format!("(data (i32.const 1024) {message:?}) (data (i32.const 1536) {otherwise:?})"),
    )
}

/// The plugins that use WASI, by name: each tries what WASI could grant
/// and (but for `clock`, `exit` and `determinism`) fails with a plugin error
/// saying what it found.
pub fn wasi(name: &str) -> Vec<u8> {
    let (imports, body, extra): (&str, String, String) = match name {
        // Preopened directories: the only way to a file, e.g. /etc/passwd.
        "files" => {
            let (body, data) = verdict(
                "(i32.eqz (i32.load (i32.const 260)))",
                "no preopened directory: /etc/passwd cannot be opened",
                "a directory was preopened",
            );
            (
                r#"(import "wasi:filesystem/preopens@0.2.0" "get-directories" (func $dirs (param i32)))"#,
                format!("(call $dirs (i32.const 256)) {body}"),
                data,
            )
        }
        // A TCP socket, to connect to 127.0.0.1 with.
        "socket" => {
            let (body, data) = verdict(
                "(i32.and (i32.eq (i32.load8_u (i32.const 256)) (i32.const 1)) (i32.eq (i32.load8_u (i32.const 260)) (i32.const 1)))",
                "no TCP socket to connect to 127.0.0.1 with: access-denied",
                "a TCP socket was made",
            );
            (
                r#"(import "wasi:sockets/tcp-create-socket@0.2.0" "create-tcp-socket" (func $tcp (param i32 i32)))"#,
                format!("(call $tcp (i32.const 0) (i32.const 256)) {body}"),
                data,
            )
        }
        // The environment, the arguments and stdin.
        "env" => {
            let (body, data) = verdict(
                "(i32.and (i32.and (i32.eqz (i32.load (i32.const 260))) (i32.eqz (i32.load (i32.const 268)))) (i32.and (i32.eq (i32.load8_u (i32.const 272)) (i32.const 1)) (i32.eq (i32.load8_u (i32.const 276)) (i32.const 1))))",
                "empty environment and arguments, stdin closed",
                "saw an environment, arguments or stdin",
            );
            (
                r#"(import "wasi:cli/environment@0.2.0" "get-environment" (func $env (param i32)))
  (import "wasi:cli/environment@0.2.0" "get-arguments" (func $args (param i32)))
  (import "wasi:cli/stdin@0.2.0" "get-stdin" (func $stdin (result i32)))
  (import "wasi:io/streams@0.2.0" "[method]input-stream.blocking-read" (func $read (param i32 i64 i32)))"#,
                format!(
                    "(call $env (i32.const 256)) (call $args (i32.const 264)) (call $read (call $stdin) (i64.const 100) (i32.const 272)) {body}"
                ),
                data,
            )
        }
        // 100 lines on stdout (more than a call may log), then an error.
        "stdout" => (
            r#"(import "wasi:cli/stdout@0.2.0" "get-stdout" (func $stdout (result i32)))
  (import "wasi:io/streams@0.2.0" "[method]output-stream.blocking-write-and-flush" (func $write (param i32 i32 i32 i32)))"#,
            r#"(local.set 0 (i32.const 100))
    (loop $more
      (call $write (call $stdout) (i32.const 1024) (i32.const 18) (i32.const 256))
      (local.set 0 (i32.sub (local.get 0) (i32.const 1)))
      (br_if $more (local.get 0)))
    (call $err (i32.const 1536) (i32.const 25))"#
                .into(),
            r#"(data (i32.const 1024) "hello from stdout\n") (data (i32.const 1536) "wrote 100 lines to stdout")"#.into(),
        ),
        // The identity, after one WASI call (so its WASI context is made):
        // what WASI adds to a call, for the benchmark.
        "identity" => (
            r#"(import "wasi:clocks/wall-clock@0.2.0" "now" (func $wall (param i32)))"#,
            format!("(call $wall (i32.const 2304)) {IDENTITY}"),
            String::new(),
        ),
        "exit" => (
            r#"(import "wasi:cli/exit@0.2.0" "exit" (func $exit (param i32)))"#,
            format!("(call $exit (i32.const 1)) {IDENTITY}"),
            String::new(),
        ),
        // Sleeps 1 ms at a time (dropping each pollable, as a real guest
        // does) until 10 ms have passed on the clock: a sleep that ends at
        // once, on a clock that never moves.
        "clock" => (
            r#"(import "wasi:clocks/monotonic-clock@0.2.0" "now" (func $now (result i64)))
  (import "wasi:clocks/monotonic-clock@0.2.0" "subscribe-duration" (func $sleep (param i64) (result i32)))
  (import "wasi:io/poll@0.2.0" "[method]pollable.block" (func $block (param i32)))
  (import "wasi:io/poll@0.2.0" "[resource-drop]pollable" (func $drop (param i32)))"#,
            r#"(i64.store (i32.const 256) (call $now))
    (loop $more
      (i32.store (i32.const 264) (call $sleep (i64.const 1000000)))
      (call $block (i32.load (i32.const 264)))
      (call $drop (i32.load (i32.const 264)))
      (br_if $more (i64.lt_u (i64.sub (call $now) (i64.load (i32.const 256))) (i64.const 10000000))))
    (call $ok (i32.load (local.get 0)) (i32.load offset=4 (local.get 0)))"#
                .into(),
            String::new(),
        ),
        // Sleeps an hour, then returns the pod if the monotonic clock did
        // not move: a sleep must never hold the host's thread.
        "sleep" => {
            let (body, data) = verdict(
                "(i64.eq (call $now) (i64.load (i32.const 256)))",
                "slept an hour in no time",
                "the clock moved",
            );
            (
                r#"(import "wasi:clocks/monotonic-clock@0.2.0" "now" (func $now (result i64)))
  (import "wasi:clocks/monotonic-clock@0.2.0" "subscribe-duration" (func $sleep (param i64) (result i32)))
  (import "wasi:io/poll@0.2.0" "[method]pollable.block" (func $block (param i32)))"#,
                format!(
                    "(i64.store (i32.const 256) (call $now)) (call $block (call $sleep (i64.const 3600000000000))) {body}"
                ),
                data,
            )
        }
        // A pod named `web` whose annotation `wasi` holds, in hex, the wall
        // clock (12 bytes), the monotonic clock (8) and 16 random bytes.
        "determinism" => {
            let prefix = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","annotations":{"wasi":""#;
            let suffix = r#""}},"spec":{"containers":[{"name":"web","image":"nginx"}]}}"#;
            let (p, s) = (prefix.len(), suffix.len());
            (
                r#"(import "wasi:clocks/wall-clock@0.2.0" "now" (func $wall (param i32)))
  (import "wasi:clocks/monotonic-clock@0.2.0" "now" (func $now (result i64)))
  (import "wasi:random/random@0.2.0" "get-random-bytes" (func $random (param i64 i32)))"#,
                format!(
                    r#"(call $wall (i32.const 2304))
    (i64.store (i32.const 2316) (call $now))
    (call $random (i64.const 16) (i32.const 256))
    (memory.copy (i32.const 2324) (i32.load (i32.const 256)) (i32.const 16))
    (memory.copy (i32.const 2400) (i32.const 1024) (i32.const {p}))
    (call $hex (i32.const 2304) (i32.const 36) (i32.const {hex_at}))
    (memory.copy (i32.const {suffix_at}) (i32.const 1536) (i32.const {s}))
    (call $ok (i32.const 2400) (i32.const {total}))"#,
                    hex_at = 2400 + p,
                    suffix_at = 2400 + p + 72,
                    total = p + 72 + s,
                ),
                format!("(data (i32.const 1024) {prefix:?}) (data (i32.const 1536) {suffix:?})"),
            )
        }
        // Takes 120,000 stdout handles and keeps them all (over podstamp's
        // per-call limit of live handles, and wasmtime's default), then
        // says so.
        "handles" => (
            r#"(import "wasi:cli/stdout@0.2.0" "get-stdout" (func $stdout (result i32)))"#,
            r#"(local $i i32)
    (local.set $i (i32.const 120000))
    (loop $more
      (drop (call $stdout))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br_if $more (local.get $i)))
    (call $err (i32.const 1536) (i32.const 24))"#
                .into(),
            r#"(data (i32.const 1536) "kept 120000 handles live")"#.into(),
        ),
        // The same 120,000 handles, each dropped once taken: never more
        // than one live; then the identity.
        "handles-dropped" => (
            r#"(import "wasi:cli/stdout@0.2.0" "get-stdout" (func $stdout (result i32)))
  (import "wasi:io/streams@0.2.0" "[resource-drop]output-stream" (func $drop (param i32)))"#,
            format!(
                r#"(local $i i32)
    (local.set $i (i32.const 120000))
    (loop $more
      (call $drop (call $stdout))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br_if $more (local.get $i)))
    {IDENTITY}"#
            ),
            String::new(),
        ),
        other => panic!("no WASI plugin {other:?}"),
    };
    let imports_wit: String = WASI_IMPORTS
        .iter()
        .map(|i| format!("\n    import {i};"))
        .collect();
    let wit = WIT.replace(
        "    import host;",
        &format!("    import host;{imports_wit}"),
    );
    let mut packages: Vec<&str> = WASI_WIT.to_vec();
    packages.push(&wit);
    componentize(
        &core_module(imports, &body, &format!("{WASI_HELPERS}{extra}")),
        &packages,
    )
}
