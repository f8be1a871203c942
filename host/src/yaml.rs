//! A deterministic YAML writer for JSON values.
//!
//! Manifests must be byte-identical across runs, machines and crate upgrades,
//! or the kubelet restarts pods for nothing. So podstamp owns its output
//! format instead of depending on a YAML library's formatting choices: block
//! style, keys sorted by byte order, two-space indents, sequences at their
//! parent's indent (as kubectl prints them), and every string that could read
//! as anything but itself written double-quoted.
//!
//! Every key is written as a YAML "implicit" key (`key: value`) unless its
//! written form is over [`MAX_IMPLICIT_KEY`] bytes: YAML limits implicit keys
//! to 1024 characters, and both go-yaml (the kubelet's reader; it counts
//! characters) and libyaml (serde_norway, podstamp's own reader; it counts
//! bytes) refuse a longer one. Those keys are written as explicit keys
//! (`? key` then `: value` on the next line), which have no length limit;
//! every other key is written as before, so no manifest that podstamp could
//! read back before changes by a byte.

use std::fmt::Write as _;

use serde_json::Value;

/// Writes `value` as a YAML document, ending in a newline.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    write_yaml(&mut out, value);
    out
}

/// [`to_yaml`], appending to `out`.
pub fn write_yaml(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) if !map.is_empty() => write_map(out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(out, items, 0),
        scalar => {
            write_scalar(out, scalar);
            out.push('\n');
        }
    }
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

/// Calls `f` on the entries of `map` in byte order of their keys. serde_json's
/// map keeps that order by itself unless a crate in the build turns on its
/// `preserve_order` feature, so the order is checked (without allocating)
/// rather than assumed, and sorted only when needed.
fn for_each_sorted<'a>(
    map: &'a serde_json::Map<String, Value>,
    mut f: impl FnMut(&'a String, &'a Value),
) {
    if map.keys().is_sorted() {
        map.iter().for_each(|(k, v)| f(k, v));
    } else {
        let mut entries: Vec<_> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries.into_iter().for_each(|(k, v)| f(k, v));
    }
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, level: usize) {
    for_each_sorted(map, |key, value| {
        indent(out, level);
        write_entry(out, key, value, level);
    });
}

/// The longest key written as an implicit key `key: value`, in bytes of its
/// written form (quotes and escapes included): the YAML spec's limit of 1024
/// characters, as libyaml enforces it (it counts the bytes from the key's
/// first to the `:`; go-yaml counts characters, never more than bytes).
pub const MAX_IMPLICIT_KEY: usize = 1024;

/// Writes `key: value`, the key starting where `out` ends (its indent, or
/// `- `, is already written) on a line indented at `level`.
fn write_entry(out: &mut String, key: &str, value: &Value, level: usize) {
    let start = out.len();
    write_string(out, key);
    if out.len() - start <= MAX_IMPLICIT_KEY {
        out.push(':');
        write_child(out, value, level, false);
        return;
    }
    // "? key" then ": value" at the same indent. A nested collection goes on
    // the lines below, one level deeper (a sequence too: it may not sit at
    // the indent of the ":" as it does under an implicit key).
    out.insert_str(start, "? ");
    out.push('\n');
    indent(out, level);
    out.push(':');
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, level + 1);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, level + 1);
        }
        scalar => {
            out.push(' ');
            write_scalar(out, scalar);
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Value], level: usize) {
    for item in items {
        indent(out, level);
        out.push('-');
        write_child(out, item, level, true);
    }
}

/// Writes what follows `key:` or `-`: a scalar on the same line, or a nested
/// collection on the lines below.
fn write_child(out: &mut String, value: &Value, level: usize, in_seq: bool) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            if in_seq {
                // "- key: value" with the following keys aligned under the first.
                out.push(' ');
                let mut first = true;
                for_each_sorted(map, |key, child| {
                    if !first {
                        indent(out, level + 1);
                    }
                    first = false;
                    write_entry(out, key, child, level + 1);
                });
            } else {
                out.push('\n');
                write_map(out, map, level + 1);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            // A sequence under a map key sits at the key's indent; one nested
            // directly in a sequence must go one level deeper.
            write_seq(out, items, if in_seq { level + 1 } else { level });
        }
        scalar => {
            out.push(' ');
            write_scalar(out, scalar);
            out.push('\n');
        }
    }
}

fn write_scalar(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(out, s),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
}

fn write_string(out: &mut String, s: &str) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else {
        write_quoted(out, s);
    }
}

/// Words that some YAML 1.1 or 1.2 reader (Go's yaml.v2 among them) takes for
/// a boolean or null.
const SPECIAL_WORDS: &[&str] = &[
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~", "=", "<<",
];

/// The longest of [`SPECIAL_WORDS`].
const LONGEST_SPECIAL_WORD: usize = 5;

/// The bytes a plain scalar may hold: letters, digits and a few punctuation
/// marks that no YAML reader takes for syntax inside a word.
const PLAIN_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = (c as u8).is_ascii_alphanumeric();
        c += 1;
    }
    let punctuation = b"-_./=:+,@%~^()$ ";
    let mut i = 0;
    while i < punctuation.len() {
        table[punctuation[i] as usize] = true;
        i += 1;
    }
    table
};

/// Whether `s` reads back as the same string when written without quotes.
/// Deliberately conservative: a string that is quoted without need is still
/// correct, one that is not quoted when it should be is a different value.
fn is_plain_safe(s: &str) -> bool {
    let bytes = s.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if first == b' ' || last == b' ' || last == b':' {
        return false;
    }
    if bytes.len() <= LONGEST_SPECIAL_WORD
        && SPECIAL_WORDS.iter().any(|w| s.eq_ignore_ascii_case(w))
    {
        return false;
    }
    // One pass: only plain bytes, and no ": " (it starts a mapping value
    // inside a plain scalar) or "  ".
    let mut previous = 0u8;
    for &c in bytes {
        if !PLAIN_BYTES[c as usize] || (c == b' ' && (previous == b':' || previous == b' ')) {
            return false;
        }
        previous = c;
    }
    // "---" at the start of a line is a document marker.
    if s.starts_with("---") {
        return false;
    }
    match first {
        b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'/' | b'$' => true,
        // "--flag=x" is plain, but "-1", "-.5" and "- x" are not strings.
        b'-' => bytes
            .get(1)
            .is_some_and(|&c| c != b' ' && c != b'.' && !c.is_ascii_digit()),
        // Digits: anything that could be an int, float, octal, hex, base-60
        // number or a date/time is quoted.
        b'0'..=b'9' => !bytes
            .iter()
            .all(|&c| c.is_ascii_hexdigit() || b"xXoO._:+- tTzZ".contains(&c)),
        _ => false,
    }
}

/// Writes `s` as a YAML double-quoted scalar. Escapes every character that a
/// YAML reader would fold, drop or refuse: controls, DEL, C1 controls,
/// NEL and the Unicode line and paragraph separators, the BOM and the
/// non-characters U+FFFE/U+FFFF.
fn write_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20
                || (0x7f..=0x9f).contains(&(c as u32))
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(value: &Value) {
        let text = to_yaml(value);
        let back: Value = serde_norway::from_str(&text)
            .unwrap_or_else(|e| panic!("emitted YAML does not parse: {e}\n{text}"));
        assert_eq!(&back, value, "round trip changed the value:\n{text}");
    }

    #[test]
    fn special_words_fit_the_length_checked_first() {
        assert!(
            SPECIAL_WORDS
                .iter()
                .all(|w| w.len() <= LONGEST_SPECIAL_WORD)
        );
    }

    #[test]
    fn layout_matches_kubectl_style() {
        let pod = json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": "a", "labels": {}},
            "spec": {"containers": [{"name": "c", "args": ["--x=1", "run"], "ports": [{"containerPort": 80}]}], "volumes": []}
        });
        let text = to_yaml(&pod);
        assert_eq!(
            text,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {}\n  name: a\nspec:\n  containers:\n  - args:\n    - --x=1\n    - run\n    name: c\n    ports:\n    - containerPort: 80\n  volumes: []\n"
        );
        round_trip(&pod);
    }

    #[test]
    fn ambiguous_strings_are_quoted_and_survive() {
        let tricky = [
            "",
            " ",
            "yes",
            "No",
            "ON",
            "off",
            "null",
            "Null",
            "~",
            "true",
            "y",
            "=",
            "<<",
            "1",
            "-1",
            "0x1f",
            "0o17",
            "012",
            "1e3",
            "1.5",
            ".5",
            "-.inf",
            ".nan",
            "1:20",
            "10.0.0.1",
            "2026-12-02",
            "2026-12-02T10:00:00Z",
            "a: b",
            "a:",
            "#x",
            "a #b",
            "- x",
            "-",
            "--",
            "@x",
            "%x",
            "---",
            "--- x",
            "...",
            "!tag",
            "&a",
            "*a",
            "|",
            ">",
            "[a]",
            "{a}",
            "'q'",
            "\"q\"",
            "?",
            ",",
            "a\nb",
            "tab\there",
            "nel\u{85}x",
            "ls\u{2028}x",
            "bom\u{feff}",
            "del\u{7f}",
            "é",
            "trailing ",
            " leading",
            "two  spaces",
            "${node.name}",
            "--advertise-address=${node.address.InternalIP}",
            "--flag=a,b",
            "http://x:80/p",
            "podstamp.io/source",
            "100m",
            "64Mi",
            "3d",
            "1_000",
        ];
        for s in tricky {
            round_trip(&json!({ s: s, "list": [s] }));
        }
    }

    #[test]
    fn nested_sequences_and_scalars_round_trip() {
        round_trip(
            &json!({"a": [[1, 2], [], [{"b": [3]}], {"c": {}}], "n": null, "f": 1.25, "t": true}),
        );
        round_trip(&json!([{"a": 1}, [2]]));
        round_trip(&json!("top"));
    }

    #[test]
    fn keys_over_the_implicit_key_limit_are_written_as_explicit_keys() {
        // Written forms of about 1020 to 1026 bytes, plain, quoted (the
        // quotes count), with escapes (each counts as written) and
        // multi-byte characters (libyaml counts their bytes).
        let mut keys = Vec::new();
        for n in 1020..=1026 {
            keys.push("k".repeat(n));
            keys.push(format!("{}é", "k".repeat(n - 1)));
            keys.push(format!("#{}", "q".repeat(n - 3)));
            keys.push(format!("\u{2028}{}", "e".repeat(n - 8)));
            keys.push(format!("{}é", "k".repeat(n - 4)));
            keys.push("é".repeat(n / 2));
            keys.push("é".repeat(n));
        }
        for key in &keys {
            let values = [
                json!("v"),
                json!({}),
                json!([]),
                json!(null),
                json!({"a": 1, "b": [1, {"c": "d"}]}),
                json!([[1], {"x": "y"}, "z"]),
            ];
            for value in values {
                let v = || value.clone();
                round_trip(&json!({ key: v(), "z": 1 }));
                round_trip(&json!({"m": { key: v() }}));
                // In a sequence item, as its first key and as a later one.
                round_trip(&json!([{ key: v(), "z": 1 }]));
                round_trip(&json!([{ "a": 1, key: v() }]));
                round_trip(&json!([[{ key: v() }]]));
            }
            let mut written = String::new();
            write_string(&mut written, key);
            let explicit = to_yaml(&json!({ key: 1 })).starts_with("? ");
            assert_eq!(
                explicit,
                written.len() > MAX_IMPLICIT_KEY,
                "{} bytes written",
                written.len()
            );
        }
    }

    #[test]
    fn explicit_key_layout() {
        let key = "k".repeat(1025);
        assert_eq!(
            to_yaml(&json!({"m": {&key: {"a": [1]}, "n": [{&key: "v", "w": [2]}]}})),
            format!(
                "m:\n  ? {key}\n  :\n    a:\n    - 1\n  \"n\":\n  - ? {key}\n    : v\n    w:\n    - 2\n"
            )
        );
    }

    #[test]
    fn output_is_independent_of_insertion_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":3,"y":2},"b":1}"#).unwrap();
        assert_eq!(to_yaml(&a), to_yaml(&b));
    }
}
