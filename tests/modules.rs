//! The library's modules import one another without circles.
//!
//! Every `use` and every path written in the code (`crate::a::b::item`,
//! `super::x::item`, `self::x`) of `host/src` is read and resolved to the
//! module file it names; the graph of those edges between files must have
//! no cycle. A module's use of its own ancestors (a child file naming
//! `super::Type`, as an `impl` split across files does) is not an edge: a
//! parent owns its children, and Rust lets a child see its parent's
//! privates for that reason. Every other pair of files that reach each
//! other is a circle, printed with the names that tie it.
//!
//! Why a test of our own rather than `cargo modules dependencies
//! --acyclic`: that tool (0.27) checks the graph of items, where a type and
//! its own `impl fmt::Display` already form a cycle, and it loads the whole
//! crate graph through rust-analyzer (over 20 minutes on a 2-core runner).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module: its path from the crate root (`daemon::rollout::machine`).
type Module = Vec<String>;

/// `host/src`, or another tree's (`PODSTAMP_MODULES_SRC`: to see what the
/// check says of an older commit).
fn source_root() -> PathBuf {
    std::env::var_os("PODSTAMP_MODULES_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// Every module file of the library (not the binary's `main.rs` and
/// `cli/`), by its module path.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap();
            let mut parts: Module = relative
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            if parts.first().is_some_and(|p| p == "main" || p == "cli") {
                continue;
            }
            found.insert(parts, path);
        }
    }
    found
}

/// The source without comments, string and char literals (raw and byte
/// strings too), so that a path in any of them is not read as an import.
fn code_only(text: &str) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut last = ' ';
    while i < text.len() {
        let rest = &text[i..];
        let c = rest.chars().next().unwrap();
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
            continue;
        }
        if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
            continue;
        }
        // A raw (byte) string: r"…", r#"…"#, br"…".
        let raw = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'));
        if let Some(after) = raw.filter(|_| !is_ident(last)) {
            let hashes = after.len() - after.trim_start_matches('#').len();
            if after[hashes..].starts_with('"') {
                let close = format!("\"{}", "#".repeat(hashes));
                let body = rest.len() - after.len() + hashes + 1;
                let end = rest[body..]
                    .find(&close)
                    .map_or(rest.len(), |e| body + e + close.len());
                out.push_str("\"\"");
                i += end;
                last = '"';
                continue;
            }
        }
        if c == '"' || (rest.starts_with("b\"") && !is_ident(last)) {
            let mut j = if c == '"' { 1 } else { 2 };
            let bytes = rest.as_bytes();
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += (j + 1).min(rest.len());
            last = '"';
            continue;
        }
        if c == '\'' {
            // A char literal is skipped; a lifetime ('a, 'static) is kept.
            let inner = &rest[1..];
            let escaped = inner.starts_with('\\');
            let first = inner.chars().next().map_or(0, char::len_utf8);
            let end = if escaped {
                inner[1..].find('\'').map(|e| e + 2)
            } else if inner[first..].starts_with('\'') {
                Some(first + 1)
            } else {
                None
            };
            if let Some(end) = end {
                i += 1 + end;
                last = '\'';
                continue;
            }
        }
        out.push(c);
        last = c;
        i += c.len_utf8();
    }
    out
}

/// Every path the code names that starts at `crate`, `super` or `self`,
/// with `use` groups (`use a::{b, c::d}`) expanded, as segments.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|p| code[i..].starts_with(p))
            && (i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':');
        if !starts {
            i += 1;
            continue;
        }
        // The whole path expression, groups included.
        let mut depth = 0;
        let mut end = i;
        while end < bytes.len() {
            let b = bytes[end];
            match b {
                b'{' => depth += 1,
                b'}' if depth > 0 => depth -= 1,
                _ if depth > 0 => {}
                _ if is_ident(b) || b == b':' => {}
                _ => break,
            }
            end += 1;
        }
        expand("", &code[i..end], &mut found);
        i = end.max(i + 1);
    }
    found
}

/// Adds `prefix::text` to `found`, each group member on its own.
fn expand(prefix: &str, text: &str, found: &mut Vec<Vec<String>>) {
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    match text.find('{') {
        None => {
            let full = format!("{prefix}{text}");
            let segments: Vec<String> = full
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if !segments.is_empty() {
                found.push(segments);
            }
        }
        Some(open) => {
            let head = format!("{prefix}{}", &text[..open]);
            let inner = &text[open + 1..text.rfind('}').unwrap_or(text.len())];
            let mut depth = 0;
            let mut start = 0;
            for (at, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&head, &inner[start..at], found);
                        start = at + 1;
                    }
                    _ => {}
                }
            }
            expand(&head, &inner[start..], found);
        }
    }
}

/// The module a path names from module `from`: the longest prefix of it
/// that is a module file.
fn resolve(from: &Module, path: &[String], known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut at: Module = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut m = from.clone();
            m.pop();
            m
        }
        _ => return None,
    };
    let mut rest = &path[1..];
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest = &rest[1..];
    }
    let mut best = at.clone();
    for segment in rest {
        at.push(segment.clone());
        if known.contains_key(&at) {
            best = at.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// Edges between module files: (from, to) → the paths that make it.
fn graph(known: &BTreeMap<Module, PathBuf>) -> BTreeMap<(Module, Module), BTreeSet<String>> {
    let mut edges: BTreeMap<(Module, Module), BTreeSet<String>> = BTreeMap::new();
    for (module, file) in known {
        let code = code_only(&fs::read_to_string(file).unwrap());
        for path in paths(&code) {
            let Some(to) = resolve(module, &path, known) else {
                continue;
            };
            // Oneself, and one's own ancestors, are not edges.
            if to.len() <= module.len() && module[..to.len()] == to[..] {
                continue;
            }
            edges
                .entry((module.clone(), to))
                .or_default()
                .insert(path.join("::"));
        }
    }
    edges
}

/// The strongly connected components with more than one module (Tarjan).
fn circles(edges: &BTreeMap<(Module, Module), BTreeSet<String>>) -> Vec<Vec<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    struct Tarjan<'a> {
        next: &'a BTreeMap<&'a Module, Vec<&'a Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.next[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in next.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

#[test]
fn the_library_s_modules_import_one_another_without_circles() {
    let known = modules(&source_root());
    assert!(
        known.len() > 40
            && known.contains_key(&vec!["daemon".to_string(), "reconcile".to_string()]),
        "the library's module files were not found: {:?}",
        known.keys().collect::<Vec<_>>()
    );
    let edges = graph(&known);
    assert!(
        edges.len() > 100,
        "too few imports read ({}): the reader is broken",
        edges.len()
    );
    let found = circles(&edges);
    let mut report = String::new();
    for circle in &found {
        report.push_str(&format!(
            "circle of {} modules: {}\n",
            circle.len(),
            circle.iter().map(name).collect::<Vec<_>>().join(", ")
        ));
        for ((from, to), names) in &edges {
            if circle.contains(from) && circle.contains(to) {
                let names: Vec<&String> = names.iter().take(4).collect();
                report.push_str(&format!("  {} -> {}: {names:?}\n", name(from), name(to)));
            }
        }
    }
    assert!(found.is_empty(), "import circles:\n{report}");
}

#[test]
fn the_reader_sees_groups_nested_paths_and_ancestors_and_ignores_comments_and_strings() {
    let code = code_only(
        "use crate::a::{b::{C, d}, e};\n// use crate::x::Y;\nlet s = \"crate::z::W\";\nlet q = '\"'; super::f::g();\nlet r = r#\"crate::p \" crate::q\"#; let e = '\\''; let u = '…';\n/* crate::k */ impl<'a> T<'a> { fn h() { crate::i::j(); } }",
    );
    let found: BTreeSet<String> = paths(&code).into_iter().map(|p| p.join("::")).collect();
    let expected: BTreeSet<String> = [
        "crate::a::b::C",
        "crate::a::b::d",
        "crate::a::e",
        "super::f::g",
        "crate::i::j",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);

    let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    let known: BTreeMap<Module, PathBuf> = ["a", "a::b", "f", "x::y", "x::z"]
        .into_iter()
        .map(|s| (m(s), PathBuf::new()))
        .collect();
    assert_eq!(
        resolve(&m("x::y"), &m("super::z::Item"), &known),
        Some(m("x::z"))
    );
    assert_eq!(
        resolve(&m("x::y"), &m("crate::a::b::C"), &known),
        Some(m("a::b"))
    );
    // Two siblings that import each other are a circle; a child naming its
    // parent is not an edge.
    let mut edges = BTreeMap::new();
    edges.insert((m("x::y"), m("x::z")), BTreeSet::new());
    edges.insert((m("x::z"), m("x::y")), BTreeSet::new());
    edges.insert((m("a::b"), m("f")), BTreeSet::new());
    assert_eq!(circles(&edges), vec![vec![m("x::y"), m("x::z")]]);
}
