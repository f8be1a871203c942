//! The string values of a JSON text, rewritten where they stand: every
//! other byte of the text is kept as it came, so a pod is neither parsed
//! into a tree nor written out again (most of it holds no placeholder).
//!
//! Invariants: object keys are never rewritten; a string is decoded only
//! when its raw text could hold `$` (it has a `$` or an escape), and a
//! rewritten one is written back as JSON; the path given with each string
//! is its field path in the pod (`spec.containers[0].command[3]`), made
//! only when asked for (on an error). The text is the host's, so it is
//! valid JSON; anything else is refused, not repaired.

use std::borrow::Cow;

use podstamp_plugin::serde_json;
use podstamp_plugin::{Error, FieldPath};

/// Deeper than any pod; a bound, so that a hostile text cannot overflow
/// the stack.
const MAX_DEPTH: usize = 128;

/// `text` with each string value `rewrite` returns Some for replaced by
/// it. `rewrite` gets the decoded string; its error becomes an [`Error`] at
/// that string's path.
pub fn rewrite_strings(
    text: &str,
    rewrite: &mut dyn FnMut(&str) -> Result<Option<String>, String>,
) -> Result<String, Error> {
    let mut scanner = Scanner {
        text,
        bytes: text.as_bytes(),
        at: 0,
        out: String::new(),
        copied: 0,
        path: Vec::new(),
    };
    scanner.value(0, rewrite)?;
    scanner.ws();
    if scanner.at != scanner.bytes.len() {
        return Err(scanner.malformed("text after the pod"));
    }
    if scanner.copied == 0 {
        // Nothing rewritten: the text as it came.
        return Ok(text.to_string());
    }
    scanner.out.push_str(&text[scanner.copied..]);
    Ok(scanner.out)
}

/// One step of a path: an object key (its raw text's range, inside the
/// quotes) or an array index.
enum Step {
    Key(usize, usize),
    Index(usize),
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    /// The rewritten text up to `copied`.
    out: String,
    copied: usize,
    path: Vec<Step>,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self
            .bytes
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.ws();
        if self.bytes.get(self.at) == Some(&byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Error> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.malformed(&format!("expected {:?}", byte as char)))
        }
    }

    fn malformed(&self, what: &str) -> Error {
        Error::new(format!(
            "invalid pod: not JSON ({what} at byte {})",
            self.at
        ))
    }

    /// At a `"`: the range of the string's raw text, inside the quotes, and
    /// whether that text is plain (no `$`, no escape), so that it cannot
    /// hold a placeholder: found in the one pass that finds its end.
    fn string(&mut self) -> Result<(usize, usize, bool), Error> {
        self.expect(b'"')?;
        let start = self.at;
        let mut plain = true;
        let mut i = start;
        loop {
            // Eight bytes at a time up to the first that matters: most of a
            // pod's text is strings, most of them plain.
            while let Some(word) = self.bytes.get(i..i + 8) {
                let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
                if has_byte(word, b'"') | has_byte(word, b'\\') | has_byte(word, b'$') {
                    break;
                }
                i += 8;
            }
            let Some(&byte) = self.bytes.get(i) else {
                break;
            };
            match byte {
                b'"' => {
                    self.at = i + 1;
                    return Ok((start, i, plain));
                }
                // An escape: its next byte is never the closing quote.
                b'\\' => {
                    plain = false;
                    i += 2;
                }
                b'$' => {
                    plain = false;
                    i += 1;
                }
                _ => i += 1,
            }
        }
        self.at = i;
        Err(self.malformed("an unterminated string"))
    }

    fn value(
        &mut self,
        depth: usize,
        rewrite: &mut dyn FnMut(&str) -> Result<Option<String>, String>,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(self.malformed("nesting too deep"));
        }
        self.ws();
        match self.bytes.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                if self.eat(b'}') {
                    return Ok(());
                }
                loop {
                    self.ws();
                    let (start, end, _) = self.string()?;
                    self.expect(b':')?;
                    self.path.push(Step::Key(start, end));
                    self.value(depth + 1, rewrite)?;
                    self.path.pop();
                    if !self.eat(b',') {
                        return self.expect(b'}');
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                if self.eat(b']') {
                    return Ok(());
                }
                let mut index = 0;
                loop {
                    self.path.push(Step::Index(index));
                    self.value(depth + 1, rewrite)?;
                    self.path.pop();
                    index += 1;
                    if !self.eat(b',') {
                        return self.expect(b']');
                    }
                }
            }
            Some(b'"') => {
                let (start, end, plain) = self.string()?;
                if plain {
                    return Ok(());
                }
                let decoded = decode(self.text, start, end)
                    .ok_or_else(|| self.malformed("a string that does not decode"))?;
                let replaced =
                    rewrite(&decoded).map_err(|message| Error::at(self.field_path(), message))?;
                if let Some(new) = replaced {
                    let quoted = serde_json::to_string(&new)
                        .map_err(|e| Error::new(format!("cannot write a string as JSON: {e}")))?;
                    // From the last copy to the opening quote, then the new string.
                    self.out.push_str(&self.text[self.copied..start - 1]);
                    self.out.push_str(&quoted);
                    self.copied = end + 1;
                }
                Ok(())
            }
            // A number, true, false or null: up to the next delimiter.
            Some(_) => {
                let start = self.at;
                while self.bytes.get(self.at).is_some_and(|b| {
                    !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                }) {
                    self.at += 1;
                }
                if self.at == start {
                    return Err(self.malformed("a value expected"));
                }
                Ok(())
            }
            None => Err(self.malformed("a value expected")),
        }
    }

    /// The field path of the string being read.
    fn field_path(&self) -> FieldPath {
        let mut path = FieldPath::new();
        for step in &self.path {
            path = match step {
                Step::Key(start, end) => {
                    path.key(&decode(self.text, *start, *end).unwrap_or_default())
                }
                Step::Index(i) => path.index(*i),
            };
        }
        path
    }
}

/// Whether any of the eight bytes of `word` is `byte` (the zero-byte test
/// of Hacker's Delight on `word ^ byte…`: exact as to whether there is one).
fn has_byte(word: u64, byte: u8) -> bool {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// The string whose raw text (inside its quotes) is `text[start..end]`.
fn decode(text: &str, start: usize, end: usize) -> Option<Cow<'_, str>> {
    let raw = &text[start..end];
    if !raw.contains('\\') {
        return Some(Cow::Borrowed(raw));
    }
    serde_json::from_str::<String>(&text[start - 1..end + 1])
        .ok()
        .map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstamp_plugin::serde_json::{Value, json};

    fn upper_dollars(text: &str) -> Result<String, Error> {
        rewrite_strings(text, &mut |s| Ok(s.contains('$').then(|| s.to_uppercase())))
    }

    #[test]
    fn only_the_strings_asked_for_change_and_everything_else_is_kept_byte_for_byte() {
        let text = r#"{"b": [1, 2.5e3, true, null, "$x", "y"], "a$": {"k": "$z \"q\""}}"#;
        let out = upper_dollars(text).unwrap();
        assert_eq!(
            out,
            r#"{"b": [1, 2.5e3, true, null, "$X", "y"], "a$": {"k": "$Z \"Q\""}}"#
        );
        let untouched = r#"{"a": ["b", {"c": 1}], "d": "e"}"#;
        assert_eq!(upper_dollars(untouched).unwrap(), untouched);
    }

    #[test]
    fn long_strings_are_scanned_a_word_at_a_time_and_nothing_is_missed() {
        // A `$`, an escape or the end at every offset from a word's start.
        for at in 0..20 {
            let pad = "p".repeat(at);
            let text = format!(r#"{{"a": "{pad}$x{pad}", "b": "{pad}\"{pad}", "c": "{pad}"}}"#);
            let out = upper_dollars(&text).unwrap();
            let value: Value = serde_json::from_str(&out).unwrap();
            let upper = pad.to_uppercase();
            assert_eq!(
                value,
                json!({"a": format!("{upper}$X{upper}"), "b": format!("{pad}\"{pad}"), "c": pad}),
                "{text}"
            );
        }
        for word in [0u64, u64::MAX, 0x2424_2424_2424_2424, 0x8080_8080_8080_8080] {
            for byte in [b'"', b'\\', b'$', 0, 0x80, 0xff] {
                assert_eq!(
                    has_byte(word, byte),
                    word.to_le_bytes().contains(&byte),
                    "{word:x} {byte}"
                );
            }
        }
        for shift in 0..8 {
            let word =
                u64::from(b'$') << (8 * shift) | 0x0101_0101_0101_0101 & !(0xff << (8 * shift));
            assert!(has_byte(word, b'$') && !has_byte(word, b'"'), "{word:x}");
        }
    }

    #[test]
    fn escapes_are_decoded_before_and_written_after() {
        // `\u0024` is `$`: found, and written back as JSON.
        let out = upper_dollars(r#"{"a": "\u0024a\n"}"#).unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value, json!({"a": "$A\n"}));
    }

    #[test]
    fn an_error_names_the_path_keys_decoded() {
        let text = r#"{"spec": {"containers": [{"command": ["a", "b"]}, {"command": ["c", "$bad"]}]}, "m": {"x.y/\u007a": "$bad"}}"#;
        let err = rewrite_strings(text, &mut |s| {
            if s == "$bad" {
                Err("no".into())
            } else {
                Ok(None)
            }
        })
        .unwrap_err();
        assert_eq!(err.field(), Some("spec.containers[1].command[1]"));
        let err = rewrite_strings(
            r#"{"m": {"x.y/\u007a": "$bad"}}"#,
            &mut |_| Err("no".into()),
        )
        .unwrap_err();
        assert_eq!(err.field(), Some(r#"m["x.y/z"]"#));
    }

    #[test]
    fn malformed_text_is_refused() {
        for text in [
            r#"{"a": "b"#,
            r#"{"a" "b"}"#,
            r#"{"a": }"#,
            r#"{} x"#,
            "[1,",
        ] {
            let err = upper_dollars(text).unwrap_err();
            assert!(
                err.message().starts_with("invalid pod: not JSON"),
                "{text}: {err}"
            );
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(upper_dollars(&deep).is_err());
    }
}
