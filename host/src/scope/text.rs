//! A pod's JSON text read lazily, one level at a time, for the scope check.
//!
//! Invariants:
//! * a [`Raw`] node is the exact slice of one JSON value in a text; two
//!   nodes with the same bytes are the same value, so nothing under them is
//!   read;
//! * an object's fields are met as a `serde_json::Map` holds them (keys in
//!   byte order, a repeated key counting as its last value), and keys and
//!   `name`s are unescaped as serde_json does, so a walk over [`Raw`] nodes
//!   finds what a walk over the parsed values finds, in the same order;
//! * where two nodes differ in bytes and no finer reading is asked for,
//!   they are compared as parsed values ([`Raw::equal`]): "\u0061" is "a",
//!   and 1 is not 1.0, exactly as for `serde_json::Value`;
//! * one pass over the text finds where every object and list ends (the
//!   [`JsonText`] index), so reading a level costs its own fields, not the
//!   bytes under them;
//! * text that is not valid JSON is never trusted: any surprise is
//!   [`Malformed`], and the caller then parses the texts whole.

use std::borrow::Cow;

use serde_json::Value;

/// The text is not the JSON it should be (the caller falls back to values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

/// A JSON text with where each of its objects and lists ends.
pub(super) struct JsonText<'a> {
    text: &'a str,
    /// (opening byte, one past the closing byte), by opening byte.
    spans: Vec<(usize, usize)>,
}

impl<'a> JsonText<'a> {
    /// Indexes `text`: one pass, strings skipped.
    pub(super) fn new(text: &'a str) -> Result<JsonText<'a>, Malformed> {
        let bytes = text.as_bytes();
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    // The string's bytes, here rather than in string_end: this
                    // loop is most of the cost.
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'"' {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    if i >= bytes.len() {
                        return Err(Malformed);
                    }
                }
                b'{' | b'[' => {
                    open.push(spans.len());
                    spans.push((i, 0));
                }
                b'}' | b']' => {
                    let at = open.pop().ok_or(Malformed)?;
                    spans[at].1 = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        if !open.is_empty() {
            return Err(Malformed);
        }
        Ok(JsonText { text, spans })
    }

    /// The whole text's value: nothing but whitespace around it.
    pub(super) fn root(&self) -> Result<Raw<'_>, Malformed> {
        let start = skip_ws(self.text.as_bytes(), 0);
        let end = self.value_end(start)?;
        if skip_ws(self.text.as_bytes(), end) != self.text.len() {
            return Err(Malformed);
        }
        Ok(Raw {
            doc: self,
            start,
            end,
        })
    }

    /// One past the value that starts at `start`.
    fn value_end(&self, start: usize) -> Result<usize, Malformed> {
        let bytes = self.text.as_bytes();
        match bytes.get(start).ok_or(Malformed)? {
            b'{' | b'[' => {
                let at = self
                    .spans
                    .binary_search_by_key(&start, |(open, _)| *open)
                    .map_err(|_| Malformed)?;
                Ok(self.spans[at].1)
            }
            b'"' => string_end(bytes, start),
            _ => {
                let mut end = start;
                while end < bytes.len()
                    && !matches!(
                        bytes[end],
                        b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    end += 1;
                }
                if end == start {
                    return Err(Malformed);
                }
                Ok(end)
            }
        }
    }
}

// The loops over bytes index the slice directly and call nothing per byte:
// in a debug build, where podstamp's own code is not optimized, a call per
// byte (`get`, `?`, an iterator's `next`) costs more than the parse it saves.

/// One past the closing quote of the string whose opening quote is at `start`.
fn string_end(bytes: &[u8], start: usize) -> Result<usize, Malformed> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Ok(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    Err(Malformed)
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// A JSON string's text (quotes included) as the string it stands for.
fn unquote(text: &str) -> Result<Cow<'_, str>, Malformed> {
    if text.contains('\\') {
        serde_json::from_str::<String>(text)
            .map(Cow::Owned)
            .map_err(|_| Malformed)
    } else {
        text.get(1..text.len() - 1)
            .map(Cow::Borrowed)
            .ok_or(Malformed)
    }
}

/// One JSON value of a [`JsonText`]: its bytes, not yet read.
#[derive(Clone, Copy)]
pub(super) struct Raw<'a> {
    doc: &'a JsonText<'a>,
    start: usize,
    end: usize,
}

/// What a value is, one level down.
pub(super) enum Open<'a, N> {
    /// Its fields, in a `serde_json::Map`'s order, each key once.
    Object(Vec<(Cow<'a, str>, N)>),
    Array(Vec<N>),
    /// A string, number, boolean or null.
    Scalar,
}

impl<'a> Raw<'a> {
    fn text(self) -> &'a str {
        &self.doc.text[self.start..self.end]
    }

    fn first(self) -> u8 {
        self.doc.text.as_bytes()[self.start]
    }

    /// The members of the object or list this is, in text order: (key, value).
    fn members(self) -> Result<Vec<(Option<&'a str>, Raw<'a>)>, Malformed> {
        let bytes = self.doc.text.as_bytes();
        let object = self.first() == b'{';
        let close = if object { b'}' } else { b']' };
        let mut members = Vec::new();
        let mut i = skip_ws(bytes, self.start + 1);
        if bytes.get(i) == Some(&close) && i + 1 == self.end {
            return Ok(members);
        }
        loop {
            let key = if object {
                if bytes.get(i) != Some(&b'"') {
                    return Err(Malformed);
                }
                let end = string_end(bytes, i)?;
                let key = &self.doc.text[i..end];
                i = skip_ws(bytes, end);
                if bytes.get(i) != Some(&b':') {
                    return Err(Malformed);
                }
                i = skip_ws(bytes, i + 1);
                Some(key)
            } else {
                None
            };
            let end = self.doc.value_end(i)?;
            members.push((
                key,
                Raw {
                    doc: self.doc,
                    start: i,
                    end,
                },
            ));
            i = skip_ws(bytes, end);
            match bytes.get(i) {
                Some(b',') => i = skip_ws(bytes, i + 1),
                Some(&b) if b == close && i + 1 == self.end => return Ok(members),
                _ => return Err(Malformed),
            }
        }
    }

    /// The object's fields as a `serde_json::Map` would hold them.
    fn fields(self) -> Result<Vec<(Cow<'a, str>, Raw<'a>)>, Malformed> {
        let mut fields = self
            .members()?
            .into_iter()
            .map(|(key, value)| Ok((unquote(key.ok_or(Malformed)?)?, value)))
            .collect::<Result<Vec<_>, Malformed>>()?;
        // Stable: of a repeated key, the last one written stays last.
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let mut once: Vec<(Cow<'a, str>, Raw<'a>)> = Vec::with_capacity(fields.len());
        for field in fields {
            match once.last_mut() {
                Some(last) if last.0 == field.0 => *last = field,
                _ => once.push(field),
            }
        }
        Ok(once)
    }
}

/// A pod as the scope walk reads it: a parsed value or a [`Raw`] text.
pub(super) trait Node<'a>: Copy {
    /// Surely the same value, known without reading it (equal bytes).
    fn same(self, other: Self) -> bool;
    /// Equal as values.
    fn equal(self, other: Self) -> Result<bool, Malformed>;
    fn open(self) -> Result<Open<'a, Self>, Malformed>;
    /// The string in its `name` field, when it is an object that has one.
    fn name(self) -> Result<Option<Cow<'a, str>>, Malformed>;
}

impl<'a> Node<'a> for &'a Value {
    fn same(self, _: Self) -> bool {
        false
    }

    fn equal(self, other: Self) -> Result<bool, Malformed> {
        Ok(self == other)
    }

    fn open(self) -> Result<Open<'a, Self>, Malformed> {
        Ok(match self {
            Value::Object(map) => {
                let mut fields: Vec<_> = map
                    .iter()
                    .map(|(k, v)| (Cow::Borrowed(k.as_str()), v))
                    .collect();
                // Already in key order unless serde_json's `preserve_order`
                // is on (a dependency may turn it on): the walk looks keys
                // up by binary search, and meets them in the order a text's
                // are met. A sorted list costs one pass to confirm.
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                Open::Object(fields)
            }
            Value::Array(items) => Open::Array(items.iter().collect()),
            _ => Open::Scalar,
        })
    }

    fn name(self) -> Result<Option<Cow<'a, str>>, Malformed> {
        Ok(self.get("name").and_then(Value::as_str).map(Cow::Borrowed))
    }
}

impl<'a> Node<'a> for Raw<'a> {
    fn same(self, other: Self) -> bool {
        self.text() == other.text()
    }

    fn equal(self, other: Self) -> Result<bool, Malformed> {
        // Values of two JSON types are never equal: nothing to parse.
        let kind = |b: u8| match b {
            b'{' | b'[' | b'"' | b'n' => b,
            b't' | b'f' => b't',
            _ => b'0',
        };
        if kind(self.first()) != kind(other.first()) {
            return Ok(false);
        }
        // `str::parse`, not `serde_json::from_str`: the same parse, but the
        // copy serde_json compiles for its own `FromStr`, which a debug
        // build has optimized with the dependencies.
        let parse = |raw: Raw<'_>| raw.text().parse::<Value>().map_err(|_| Malformed);
        Ok(parse(self)? == parse(other)?)
    }

    fn open(self) -> Result<Open<'a, Self>, Malformed> {
        Ok(match self.first() {
            b'{' => Open::Object(self.fields()?),
            b'[' => Open::Array(self.members()?.into_iter().map(|(_, v)| v).collect()),
            _ => Open::Scalar,
        })
    }

    fn name(self) -> Result<Option<Cow<'a, str>>, Malformed> {
        if self.first() != b'{' {
            return Ok(None);
        }
        // The last `name` written is the one a Map keeps. A key spelled
        // plainly is compared as it is: unescaping every key of every list
        // element, for a `[NAME]` grant, cost more than the parse it saves.
        let mut name = None;
        for (key, value) in self.members()? {
            let key = key.ok_or(Malformed)?;
            let is_name = if key.len() == 6 || key.contains('\\') {
                unquote(key)? == "name"
            } else {
                false
            };
            if is_name {
                name = Some(value);
            }
        }
        match name {
            Some(value) if value.first() == b'"' => unquote(value.text()).map(Some),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Scope;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The grant sets the texts are checked under.
    const GRANTS: &[&[&str]] = &[
        &[],
        &[
            "metadata.labels",
            "spec.containers[*].env",
            "spec.initContainers[*].env",
        ],
        &["metadata.labels"],
        &["spec.containers[*].env"],
        &["spec.containers[web].image"],
        &["spec.containers[web]", "spec.volumes"],
        &[
            r#"metadata.annotations["example.com/x"]"#,
            "spec.hostNetwork",
        ],
        &["spec.containers[*]", "metadata"],
        &["spec"],
    ];

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "labels": {"app": "web", "tier": "front"},
                "annotations": {"example.com/x": "1", "note": "caf\u{e9} \"q\" a/b"},
            },
            "spec": {
                "hostNetwork": false,
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "web",
                        "image": "registry.example.com/web:1.2",
                        "command": ["/bin/web", "--port=8080", "line\nbreak"],
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": ""}],
                        "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                        "securityContext": {"runAsUser": 1000, "readOnlyRootFilesystem": true},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    },
                    {"name": "side", "image": "side:1", "env": [], "ports": [{"containerPort": 9090}]},
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
        })
    }

    /// Changes `pod` in one of the ways a plugin might; `k` picks among
    /// names and values.
    fn mutate(pod: &mut Value, op: u8, k: u8) {
        let c = usize::from(k % 2);
        let spec = &mut pod["spec"];
        // An earlier change may have taken away what a later one changes:
        // then it changes nothing.
        let push = |list: Option<&mut Value>, item: Value| {
            if let Some(Value::Array(items)) = list {
                items.push(item);
            }
        };
        match op {
            0 => pod["metadata"]["labels"][format!("l{k}")] = json!(format!("v{k}")),
            1 => drop(
                pod["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove("app"),
            ),
            2 => push(
                spec.pointer_mut(&format!("/containers/{c}/env")),
                json!({"name": format!("E{k}"), "value": "x"}),
            ),
            3 => {
                if let Some(value) = spec.pointer_mut("/containers/0/env/0/value") {
                    *value = json!(format!("{k}"));
                }
            }
            4 => spec["containers"][c]["image"] = json!(format!("evil:{k}")),
            5 => spec["containers"][c]["command"] = json!(["/bin/sh", "-c", format!("{k}")]),
            6 => spec["containers"][c]["securityContext"]["privileged"] = json!(true),
            7 => push(
                spec.get_mut("volumes"),
                json!({"name": format!("v{k}"), "hostPath": {"path": "/"}}),
            ),
            8 => spec["volumes"] = json!([]),
            9 => {
                spec["containers"][c]["name"] = json!(["web", "side", "other"][usize::from(k % 3)])
            }
            10 => spec["containers"].as_array_mut().unwrap().swap(0, 1),
            11 => spec["hostNetwork"] = json!(k.is_multiple_of(2)),
            12 => pod["metadata"]["annotations"]["example.com/x"] = json!(format!("{k}")),
            13 => push(
                spec.get_mut("containers"),
                json!({"name": "web", "image": "x"}),
            ),
            14 => spec["terminationGracePeriodSeconds"] = json!(k % 3 * 15),
            15 => spec["containers"][c]["env"] = json!("not a list"),
            16 => spec["containers"][c]["env"] = json!({"A": "1"}),
            17 => pod["metadata"]["name"] = json!(format!("web-{k}")),
            _ => drop(spec.as_object_mut().unwrap().remove("volumes")),
        }
    }

    /// Writes values as JSON in one of many spellings, each read back as
    /// the same value by serde_json, or (numbers as `N.0`) as one a plugin
    /// might also write.
    struct Writer {
        seed: u64,
        out: String,
    }

    impl Writer {
        fn pick(&mut self, n: usize) -> usize {
            // xorshift64: reproducible from the seed proptest shrinks.
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            (self.seed % n as u64) as usize
        }

        fn space(&mut self) {
            let ws = [" ", "", "", "\n  ", "\t", "\r\n"][self.pick(6)];
            self.out.push_str(ws);
        }

        fn string(&mut self, s: &str) {
            self.out.push('"');
            for c in s.chars() {
                match c {
                    '"' => self.out.push_str("\\\""),
                    '\\' => self.out.push_str("\\\\"),
                    '/' if self.pick(2) == 0 => self.out.push_str("\\/"),
                    c if (c as u32) < 0x20 || (c.is_alphanumeric() && self.pick(8) == 0) => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            self.out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }

        fn value(&mut self, v: &Value) {
            match v {
                Value::Object(map) => {
                    let mut fields: Vec<_> = map.iter().collect();
                    match self.pick(3) {
                        0 => {}
                        1 => fields.reverse(),
                        _ => {
                            let by = self.pick(fields.len().max(1));
                            fields.rotate_left(by);
                        }
                    }
                    self.out.push('{');
                    let mut first = true;
                    for (key, value) in fields {
                        // A key written twice: the last one is the value.
                        let decoy = (self.pick(6) == 0).then(|| json!("decoy"));
                        for v in decoy.as_ref().into_iter().chain([value]) {
                            if !first {
                                self.out.push(',');
                            }
                            first = false;
                            self.space();
                            self.string(key);
                            self.space();
                            self.out.push(':');
                            self.space();
                            self.value(v);
                        }
                    }
                    self.space();
                    self.out.push('}');
                }
                Value::Array(items) => {
                    self.out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.space();
                        self.value(item);
                    }
                    self.space();
                    self.out.push(']');
                }
                Value::String(s) => self.string(s),
                Value::Number(n) if n.is_u64() => match self.pick(5) {
                    0 => self.out.push_str(&format!("{n}.0")),
                    1 => self.out.push_str(&format!("{n}e0")),
                    _ => self.out.push_str(&n.to_string()),
                },
                other => self.out.push_str(&other.to_string()),
            }
        }
    }

    fn write(v: &Value, seed: u64) -> String {
        let mut writer = Writer {
            seed: seed | 1,
            out: String::new(),
        };
        writer.space();
        writer.value(v);
        writer.space();
        writer.out
    }

    /// The verdict on the texts, lazily, and on their parsed values.
    fn both(grants: &[&str], before: &str, after: &str) {
        let scope = Scope::parse(grants).unwrap();
        let values = scope.check(
            &serde_json::from_str(before).unwrap(),
            &serde_json::from_str(after).unwrap(),
        );
        let lazily = scope
            .check_lazily(before, after)
            .unwrap_or_else(|_| panic!("valid JSON read as malformed:\n{before}\n{after}"));
        assert_eq!(lazily, values, "{grants:?}\n{before}\n{after}");
        assert_eq!(scope.check_text(before, after).unwrap(), values);
    }

    proptest! {
        /// Whatever a plugin changes, and however it spells the JSON, the
        /// texts get the verdict their values get, overstep and all.
        #[test]
        fn the_texts_get_the_verdict_of_their_values(
            ops in proptest::collection::vec((0u8..19, any::<u8>()), 0..4),
            grants in 0..GRANTS.len(),
            seeds in any::<(u64, u64)>(),
            same_spelling in any::<bool>(),
        ) {
            let before = pod();
            let mut after = before.clone();
            for (op, k) in ops {
                mutate(&mut after, op, k);
            }
            let before_text = write(&before, seeds.0);
            let after_text = write(&after, if same_spelling { seeds.0 } else { seeds.1 });
            both(GRANTS[grants], &before_text, &after_text);
        }
    }

    #[test]
    fn spellings_of_one_value_are_one_value() {
        let grants: &[&str] = &["metadata.labels"];
        let cases = [
            // Escapes, key order, white space, a repeated key.
            (
                r#"{"a":"a","b":[1,2]}"#,
                r#" { "b" : [ 1 , 2 ] , "a" : "\u0061" } "#,
                true,
            ),
            (r#"{"a":1}"#, r#"{"a":0,"a":1}"#, true),
            (r#"{"a":1,"a":0}"#, r#"{"a":0}"#, true),
            (r#"{"\u0061":1}"#, r#"{"a":1}"#, true),
            // 1 is not 1.0, as serde_json reads them.
            (r#"{"a":1}"#, r#"{"a":1.0}"#, false),
            (r#"{"a":{"b":1}}"#, r#"{"a":{"b":true}}"#, false),
            (r#"{"a":[]}"#, r#"{"a":{}}"#, false),
        ];
        for (before, after, same) in cases {
            both(grants, before, after);
            let verdict = Scope::parse(grants)
                .unwrap()
                .check_text(before, after)
                .unwrap();
            assert_eq!(verdict.is_ok(), same, "{before} {after}");
        }
        // A named element is read by its last `name`, unescaped.
        for grants in [
            &["spec.containers[web].image"][..],
            &["spec.containers[*].image"],
        ] {
            both(
                grants,
                r#"{"spec":{"containers":[{"name":"x","name":"web","image":"a"}]}}"#,
                r#"{"spec":{"containers":[{"name":"w\u0065b","image":"b"}]}}"#,
            );
            both(
                grants,
                r#"{"spec":{"containers":[{"name":"web","image":"a"}]}}"#,
                r#"{"spec":{"containers":[{"name":"web","name":"side","image":"b"}]}}"#,
            );
        }
    }

    #[test]
    fn text_that_is_not_json_is_an_error_not_a_verdict() {
        let scope = Scope::parse(&["metadata.labels"]).unwrap();
        // What the lazy reading notices (a bad escape in a part it does not
        // read it does not: the chain checks each text as JSON before).
        for bad in [
            r#"{"a":1"#,
            r#"{"a":1}}"#,
            r#"{"a" 1}"#,
            "",
            r#"{"a":1,}"#,
            "[1 2]",
        ] {
            assert!(scope.check_text(r#"{"a":1}"#, bad).is_err(), "{bad}");
            assert!(scope.check_text(bad, r#"{"a":1}"#).is_err(), "{bad}");
        }
    }
}
