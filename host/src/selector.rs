//! Which nodes a template is for: the `podstamp.io/node-selector`
//! annotation, a label selector in kubectl's syntax matched against the
//! Node's labels.
//!
//! The syntax is kubectl's (`-l`), the one Kubernetes' own
//! `labels.Parse` reads: requirements separated by commas, all of which
//! must hold —
//! `key` (the label exists), `!key` (it does not), `key=value` (or `==`),
//! `key!=value`, `key in (a,b)`, `key notin (a,b)`, and `key>N` / `key<N`
//! (the value, an integer, compared). `!=` and `notin` hold for a node
//! without the label, as in Kubernetes. An empty selector selects every
//! node, as kubectl's does; a template without the annotation is for
//! every node.
//!
//! kube-rs and k8s-openapi build selectors but parse none, and a selector
//! of another library would have its own reading of the edge cases; this
//! one follows Kubernetes' and is held to it by the tests below.
//!
//! Invariants: [`Selector::parse`] never panics and refuses what
//! Kubernetes refuses (keys that are not qualified names, values that are
//! not label values, an empty `in ()`), with the character where it went
//! wrong; a parsed selector printed ([`std::fmt::Display`]) parses back to
//! itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::validate::{check_label_value, check_qualified_name};

/// The annotation of a PodTemplate that says which nodes it is for.
pub const NODE_SELECTOR_ANNOTATION: &str = "podstamp.io/node-selector";

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    DoesNotExist,
    /// `=`, `==` and `in`: the label is one of these values.
    In(BTreeSet<String>),
    /// `!=` and `notin`: the label is missing or none of these values.
    NotIn(BTreeSet<String>),
    Gt(i64),
    Lt(i64),
}

/// Why a selector does not parse: what was expected, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{selector:?} at character {at}: {why}")]
pub struct ParseError {
    pub selector: String,
    /// 1-based, in characters.
    pub at: usize,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Comma,
    Open,
    Close,
    Eq,
    DoubleEq,
    NotEq,
    Not,
    Gt,
    Lt,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => write!(f, "{s:?}"),
            Token::Comma => f.write_str("','"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Eq => f.write_str("'='"),
            Token::DoubleEq => f.write_str("'=='"),
            Token::NotEq => f.write_str("'!='"),
            Token::Not => f.write_str("'!'"),
            Token::Gt => f.write_str("'>'"),
            Token::Lt => f.write_str("'<'"),
        }
    }
}

/// The tokens of `text`, each with its 1-based character position.
fn lex(text: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let special = |c: char| c.is_whitespace() || "!=,()<>".contains(c);
    while i < chars.len() {
        let c = chars[i];
        let at = i + 1;
        let next = chars.get(i + 1).copied();
        let (token, len) = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            ',' => (Token::Comma, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            '>' => (Token::Gt, 1),
            '<' => (Token::Lt, 1),
            '=' if next == Some('=') => (Token::DoubleEq, 2),
            '=' => (Token::Eq, 1),
            '!' if next == Some('=') => (Token::NotEq, 2),
            '!' => (Token::Not, 1),
            _ => {
                let end = (i..chars.len())
                    .find(|&j| special(chars[j]))
                    .unwrap_or(chars.len());
                (Token::Ident(chars[i..end].iter().collect()), end - i)
            }
        };
        tokens.push((at, token));
        i += len;
    }
    tokens
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(usize, Token)>,
    next: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next).map(|(_, t)| t)
    }

    /// Where the next token starts (one past the end when there is none).
    fn here(&self) -> usize {
        self.tokens
            .get(self.next)
            .map_or(self.text.chars().count() + 1, |(at, _)| *at)
    }

    fn take(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.next).map(|(_, t)| t.clone());
        self.next += 1;
        token
    }

    fn error(&self, at: usize, why: impl Into<String>) -> ParseError {
        ParseError {
            selector: self.text.to_string(),
            at,
            why: why.into(),
        }
    }

    /// What was found where something else was expected.
    fn found(&self) -> String {
        match self.peek() {
            Some(token) => format!("found {token}"),
            None => "found the end".to_string(),
        }
    }

    fn key(&mut self) -> Result<String, ParseError> {
        let at = self.here();
        match self.take() {
            Some(Token::Ident(key)) => {
                check_qualified_name(&key)
                    .map_err(|why| self.error(at, format!("label key {key:?}: {why}")))?;
                Ok(key)
            }
            other => {
                self.next -= 1;
                let found = match other {
                    Some(t) => format!("found {t}"),
                    None => "found the end".into(),
                };
                Err(self.error(at, format!("expected a label key, {found}")))
            }
        }
    }

    /// A value after `=`, `==` or `!=`: may be empty (`a=` is "a is
    /// empty"), as in Kubernetes.
    fn value(&mut self) -> Result<String, ParseError> {
        let at = self.here();
        let value = match self.peek() {
            Some(Token::Ident(v)) => {
                let v = v.clone();
                self.next += 1;
                v
            }
            None | Some(Token::Comma) => String::new(),
            Some(_) => return Err(self.error(at, format!("expected a value, {}", self.found()))),
        };
        check_label_value(&value).map_err(|why| self.error(at, format!("label {why}")))?;
        Ok(value)
    }

    fn values(&mut self, key: &str) -> Result<BTreeSet<String>, ParseError> {
        let at = self.here();
        if self.take() != Some(Token::Open) {
            self.next -= 1;
            return Err(self.error(
                at,
                format!("expected '(' and the values of {key}, {}", self.found()),
            ));
        }
        let mut values = BTreeSet::new();
        loop {
            let at = self.here();
            match self.take() {
                Some(Token::Ident(v)) => {
                    check_label_value(&v).map_err(|why| self.error(at, format!("label {why}")))?;
                    values.insert(v);
                }
                Some(Token::Close) if values.is_empty() => {
                    return Err(self.error(
                        at,
                        format!("the values of {key} are empty; give at least one"),
                    ));
                }
                _ => {
                    self.next -= 1;
                    return Err(self.error(at, format!("expected a value, {}", self.found())));
                }
            }
            let at = self.here();
            match self.take() {
                Some(Token::Comma) => {}
                Some(Token::Close) => return Ok(values),
                _ => {
                    self.next -= 1;
                    return Err(self.error(
                        at,
                        format!(
                            "expected ',' or ')' after a value of {key}, {}",
                            self.found()
                        ),
                    ));
                }
            }
        }
    }

    fn integer(&mut self, key: &str) -> Result<i64, ParseError> {
        let at = self.here();
        match self.take() {
            Some(Token::Ident(v)) => v.parse::<i64>().map_err(|_| {
                self.error(
                    at,
                    format!("{key} is compared with {v:?}, which is not an integer"),
                )
            }),
            _ => {
                self.next -= 1;
                Err(self.error(at, format!("expected an integer, {}", self.found())))
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, ParseError> {
        if self.peek() == Some(&Token::Not) {
            self.next += 1;
            let key = self.key()?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
            });
        }
        let key = self.key()?;
        let at = self.here();
        let op = match self.take() {
            None | Some(Token::Comma) => {
                self.next -= 1;
                Op::Exists
            }
            Some(Token::Eq) | Some(Token::DoubleEq) => Op::In([self.value()?].into()),
            Some(Token::NotEq) => Op::NotIn([self.value()?].into()),
            Some(Token::Gt) => Op::Gt(self.integer(&key)?),
            Some(Token::Lt) => Op::Lt(self.integer(&key)?),
            Some(Token::Ident(word)) if word == "in" => Op::In(self.values(&key)?),
            Some(Token::Ident(word)) if word == "notin" => Op::NotIn(self.values(&key)?),
            Some(other) => {
                return Err(self.error(
                    at,
                    format!(
                        "after the key {key}, expected ',', '=', '==', '!=', 'in', 'notin', '>' or '<', found {other}"
                    ),
                ));
            }
        };
        Ok(Requirement { key, op })
    }
}

impl Selector {
    /// Parses `text`, kubectl's syntax. Whitespace around tokens is
    /// ignored; an empty (or blank) selector selects everything.
    pub fn parse(text: &str) -> Result<Selector, ParseError> {
        let mut parser = Parser {
            text,
            tokens: lex(text),
            next: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(Selector { requirements });
        }
        loop {
            requirements.push(parser.requirement()?);
            let at = parser.here();
            match parser.take() {
                None => break,
                Some(Token::Comma) => {}
                Some(other) => {
                    return Err(parser.error(
                        at,
                        format!("expected ',' between requirements, found {other}"),
                    ));
                }
            }
        }
        Ok(Selector { requirements })
    }

    /// Whether a node with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Selects every node (no requirement).
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match &self.op {
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::In(values) => value.is_some_and(|v| values.contains(v)),
            Op::NotIn(values) => !value.is_some_and(|v| values.contains(v)),
            Op::Gt(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Op::Lt(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let list =
                |values: &BTreeSet<String>| values.iter().cloned().collect::<Vec<_>>().join(",");
            let key = &r.key;
            match &r.op {
                Op::Exists => write!(f, "{key}")?,
                Op::DoesNotExist => write!(f, "!{key}")?,
                Op::In(v) if v.len() == 1 => write!(f, "{key}={}", list(v))?,
                Op::In(v) => write!(f, "{key} in ({})", list(v))?,
                Op::NotIn(v) if v.len() == 1 => write!(f, "{key}!={}", list(v))?,
                Op::NotIn(v) => write!(f, "{key} notin ({})", list(v))?,
                Op::Gt(n) => write!(f, "{key}>{n}")?,
                Op::Lt(n) => write!(f, "{key}<{n}")?,
            }
        }
        Ok(())
    }
}

/// The selector of a template with these annotations: None when it has no
/// `podstamp.io/node-selector` (it is for every node). A bad one is the
/// template's error, naming the annotation and the fix.
pub fn from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Selector>, String> {
    let Some(text) = annotations.get(NODE_SELECTOR_ANNOTATION) else {
        return Ok(None);
    };
    Selector::parse(text).map(Some).map_err(|e| {
        format!(
            "metadata.annotations.{NODE_SELECTOR_ANNOTATION}: {e}; give a label selector as kubectl takes it (e.g. node-role.kubernetes.io/control-plane, or zone in (a,b),!example.com/drain), or remove the annotation for every node"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector)
            .unwrap_or_else(|e| panic!("{e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn every_operator_as_kubernetes_reads_it() {
        let cp = [("node-role.kubernetes.io/control-plane", ""), ("zone", "a")];
        let worker = [("zone", "b"), ("gpu", "4")];
        // (selector, control-plane node, worker node)
        let table = [
            ("", true, true),
            ("   ", true, true),
            ("node-role.kubernetes.io/control-plane", true, false),
            ("!node-role.kubernetes.io/control-plane", false, true),
            ("zone=a", true, false),
            ("zone==a", true, false),
            ("zone = a", true, false),
            ("zone!=a", false, true),
            // `!=` and `notin` hold without the label.
            ("gpu!=4", true, false),
            ("gpu notin (4,8)", true, false),
            ("zone in (a,b)", true, true),
            ("zone in ( a , c )", true, false),
            ("zone notin (a)", false, true),
            ("gpu>3", false, true),
            ("gpu<3", false, false),
            ("gpu>-1", false, true),
            // The empty value: the label is there, empty.
            ("node-role.kubernetes.io/control-plane=", true, false),
            ("zone,gpu", false, true),
            (
                "zone=b,gpu in (4),!node-role.kubernetes.io/control-plane",
                false,
                true,
            ),
            ("zone in (a,b),zone!=b", true, false),
        ];
        for (selector, on_cp, on_worker) in table {
            assert_eq!(
                (matches(selector, &cp), matches(selector, &worker)),
                (on_cp, on_worker),
                "{selector:?}"
            );
        }
    }

    #[test]
    fn what_kubernetes_refuses_is_refused_where_it_goes_wrong() {
        // (selector, character, what the message says)
        let table = [
            ("zone in (a", 11, "expected ',' or ')'"),
            ("zone in ()", 10, "are empty"),
            ("zone in a", 9, "expected '('"),
            ("zone=a b", 8, "expected ',' between requirements"),
            ("=a", 1, "expected a label key"),
            ("zone,", 6, "expected a label key, found the end"),
            (",zone", 1, "expected a label key"),
            ("zone=(a)", 6, "expected a value"),
            ("Zone_/x=a", 1, "label key \"Zone_/x\""),
            ("-zone", 1, "must start and end with a letter or digit"),
            ("zone=-a", 6, "must start and end"),
            ("gpu>four", 5, "not an integer"),
            ("gpu>", 5, "expected an integer"),
            ("zone exists", 6, "after the key zone, expected"),
            ("!", 2, "expected a label key"),
            ("zone=a)", 7, "expected ','"),
        ];
        for (selector, at, says) in table {
            let e = Selector::parse(selector).expect_err(selector);
            assert_eq!(e.at, at, "{selector:?}: {e}");
            assert!(e.to_string().contains(says), "{selector:?}: {e}");
        }
        let long = format!("zone={}", "a".repeat(64));
        assert!(
            Selector::parse(&long)
                .unwrap_err()
                .to_string()
                .contains("over the limit of 63")
        );
    }

    #[test]
    fn the_annotation_names_itself_and_the_fix() {
        let none = from_annotations(&BTreeMap::new()).unwrap();
        assert_eq!(none, None);
        let e = from_annotations(&labels(&[(NODE_SELECTOR_ANNOTATION, "zone in (a")])).unwrap_err();
        assert!(
            e.starts_with(
                "metadata.annotations.podstamp.io/node-selector: \"zone in (a\" at character 11"
            ) && e.contains("give a label selector as kubectl takes it"),
            "{e}"
        );
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]([a-z0-9-]{0,6}[a-z0-9])?",
            "[a-z]{1,5}\\.[a-z]{2,3}/[A-Za-z]([A-Za-z0-9._-]{0,6}[A-Za-z0-9])?",
        ]
    }

    fn value() -> impl Strategy<Value = String> {
        "([A-Za-z0-9]([A-Za-z0-9._-]{0,6}[A-Za-z0-9])?)?"
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        let nonempty = || {
            proptest::collection::btree_set("[A-Za-z0-9]([A-Za-z0-9._-]{0,4}[A-Za-z0-9])?", 1..4)
        };
        (
            key(),
            prop_oneof![
                Just(Op::Exists),
                Just(Op::DoesNotExist),
                value().prop_map(|v| Op::In([v].into())),
                value().prop_map(|v| Op::NotIn([v].into())),
                nonempty().prop_map(Op::In),
                nonempty().prop_map(Op::NotIn),
                any::<i64>().prop_map(Op::Gt),
                any::<i64>().prop_map(Op::Lt),
            ],
        )
            .prop_map(|(key, op)| Requirement { key, op })
    }

    proptest! {
        /// A selector printed reads back as itself, and selects the same
        /// nodes as each of its requirements alone, all together.
        #[test]
        fn a_printed_selector_parses_back_to_itself(
            requirements in proptest::collection::vec(requirement(), 0..5),
            node in proptest::collection::btree_map(key(), value(), 0..6),
        ) {
            let selector = Selector { requirements };
            let text = selector.to_string();
            let parsed = Selector::parse(&text);
            prop_assert_eq!(parsed.as_ref(), Ok(&selector), "{}", text);
            let each = selector.requirements.iter().all(|r| {
                Selector { requirements: vec![r.clone()] }.matches(&node)
            });
            prop_assert_eq!(selector.matches(&node), each);
        }

        /// A node's own labels, as `key=value` each, select it; and every
        /// `!=` of them does not.
        #[test]
        fn a_node_is_selected_by_its_own_labels(
            node in proptest::collection::btree_map(key(), value(), 1..6),
        ) {
            let equal: Vec<String> = node.iter().map(|(k, v)| format!("{k}={v}")).collect();
            prop_assert!(Selector::parse(&equal.join(",")).unwrap().matches(&node));
            for (k, v) in &node {
                let not = Selector::parse(&format!("{k}!={v}")).unwrap();
                prop_assert!(!not.matches(&node));
                let gone = Selector::parse(&format!("!{k}")).unwrap();
                prop_assert!(!gone.matches(&node));
            }
        }

        /// Anything at all parses or is refused with a position inside it
        /// (or just past its end); nothing panics.
        #[test]
        fn any_text_parses_or_is_refused_in_place(text in "[ a-z=!,()<>/.0-9-]{0,24}|\\PC{0,24}") {
            if let Err(e) = Selector::parse(&text) {
                prop_assert!(e.at >= 1 && e.at <= text.chars().count() + 1, "{}", e);
            }
        }
    }
}
