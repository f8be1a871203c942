//! Plugin field scopes: the parts of a pod one plugin may change.
//!
//! A catalog entry's `scope:` is a list of grants, each a field path in the
//! syntax of podstamp's messages, with selectors for list elements:
//!
//! ```text
//! metadata.labels                      a field and everything under it
//! spec.containers[*].env               every element of a list
//! spec.containers[web].image           the element whose `name` is web
//! metadata.annotations["example.com/x"]  one map key (quoted when not plain)
//! ```
//!
//! Invariants:
//! * a grant allows a change at its path or anywhere under it, and nothing
//!   else: a change is allowed only when some grant is a prefix of its path;
//! * a `[NAME]` selector matches a list element only when the element is
//!   named NAME both before and after the plugin (the side that exists, for
//!   an added or removed one), so a plugin cannot rename an element into a
//!   grant;
//! * an entry without `scope:` gets [`DEFAULT_GRANTS`], which allow nothing
//!   that gives a pod more privilege than its template asked for (see
//!   docs/daemon.md); `scope: []` allows no change at all;
//! * the check walks the two pods once, and not below a granted path;
//! * [`Scope::check_text`] gives the verdict [`Scope::check`] gives on the
//!   same texts parsed, overstep and all: one walk serves both, over parsed
//!   values or over the texts read lazily ([`text`]), where equal bytes end
//!   the walk and only what differs is read.

mod diff;
mod text;

pub use diff::{Change, ChangeKind, diff, top_level_fields};

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

use crate::validate::{join_index, join_key};
use text::{JsonText, Malformed, Node, Open};

/// What an entry without `scope:` may change: metadata labels, and the
/// environment of containers and init containers. Nothing here adds a
/// privilege, a host resource or a command to a pod: a label only names it,
/// and a variable reaches only the program the template already runs, with
/// the privileges the template already gave it. Annotations are left out
/// because the kubelet still honours some as security settings (AppArmor's
/// `container.apparmor.security.beta.kubernetes.io/*`), images because a new
/// image is new code running with the template's privileges.
pub const DEFAULT_GRANTS: [&str; 3] = [
    "metadata.labels",
    "spec.containers[*].env",
    "spec.initContainers[*].env",
];

/// One step of a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    /// An object key.
    Key(String),
    /// `[*]`: any element of a list.
    Any,
    /// `[NAME]`: the list element whose `name` is NAME.
    Named(String),
}

/// One granted path, parsed, with its text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    text: String,
    selectors: Vec<Selector>,
}

/// What one plugin may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    grants: Vec<Grant>,
    /// No check at all: `podstamp render --plugin`, outside any catalog.
    unrestricted: bool,
    /// The entry gave no `scope:`.
    is_default: bool,
}

/// A grant that does not parse: the grant and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{grant:?} is not a field path: {reason} (e.g. metadata.labels, spec.containers[*].env, spec.containers[web].image)"
)]
pub struct GrantError {
    pub grant: String,
    pub reason: String,
}

/// A change outside the scope: the first one found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overstep {
    pub change: Change,
    /// The grant that would allow it: its path, each list index as `[*]`.
    pub needed: String,
}

/// One step of a concrete path in a pod.
#[derive(Debug, Clone)]
enum Step<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

/// A concrete path as podstamp writes field paths: `spec.containers[0].env`.
fn path_text(path: &[Step<'_>]) -> String {
    path.iter().fold(String::new(), |at, step| match step {
        Step::Key(key) => join_key(&at, key),
        Step::Index(i) => join_index(&at, *i),
    })
}

/// The grant that would allow a change at `path`: its indices as `[*]`.
fn grant_for(path: &[Step<'_>]) -> String {
    path.iter().fold(String::new(), |at, step| match step {
        Step::Key(key) => join_key(&at, key),
        Step::Index(_) => format!("{at}[*]"),
    })
}

impl Default for Scope {
    /// [`DEFAULT_GRANTS`].
    fn default() -> Scope {
        let grants = DEFAULT_GRANTS
            .iter()
            .map(|g| parse_grant(g).expect("the default grants parse"))
            .collect();
        Scope {
            grants,
            unrestricted: false,
            is_default: true,
        }
    }
}

impl Scope {
    /// A catalog entry's `scope:`, each grant checked.
    pub fn parse<S: AsRef<str>>(grants: &[S]) -> Result<Scope, GrantError> {
        let grants = grants
            .iter()
            .map(|g| parse_grant(g.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Scope {
            grants,
            unrestricted: false,
            is_default: false,
        })
    }

    /// No scope at all: every change allowed, none checked.
    pub fn unrestricted() -> Scope {
        Scope {
            grants: Vec::new(),
            unrestricted: true,
            is_default: false,
        }
    }

    pub fn is_unrestricted(&self) -> bool {
        self.unrestricted
    }

    /// The grants as written, for the catalog's digest.
    pub fn grants(&self) -> Vec<&str> {
        self.grants.iter().map(|g| g.text.as_str()).collect()
    }

    /// The grants of `declared` (what a plugin says it changes) that this
    /// scope does not cover: a grant covers a declared one when it is the
    /// same path or a prefix of it, `[*]` covering any `[NAME]`. A declared
    /// grant that does not parse is never covered.
    pub fn not_granted<'d>(&self, declared: &'d [String]) -> Vec<&'d str> {
        if self.unrestricted {
            return Vec::new();
        }
        declared
            .iter()
            .filter(|d| match parse_grant(d) {
                Ok(d) => !self.grants.iter().any(|g| covers(g, &d)),
                Err(_) => true,
            })
            .map(String::as_str)
            .collect()
    }

    /// Whether a change at the field path `needed` (as [`Overstep::needed`]
    /// writes it) is one that `declared` names.
    pub fn declares(declared: &[String], needed: &str) -> bool {
        let Ok(needed) = parse_grant(needed) else {
            return false;
        };
        declared
            .iter()
            .filter_map(|d| parse_grant(d).ok())
            .any(|d| covers(&d, &needed))
    }

    /// The first change from `before` to `after` that no grant allows.
    pub fn check(&self, before: &Value, after: &Value) -> Result<(), Box<Overstep>> {
        if self.unrestricted {
            return Ok(());
        }
        match self.walk_from(before, after) {
            Err(Stop::Overstep(overstep)) => Err(overstep),
            // Parsed values are never malformed.
            Ok(()) | Err(Stop::Malformed) => Ok(()),
        }
    }

    /// [`Scope::check`] on two JSON texts, without parsing either whole:
    /// a subtree with the same bytes on both sides is not read, nothing is
    /// read below a granted path, and elsewhere both sides are read a level
    /// at a time, values parsed only at the leaves. The verdict and the
    /// overstep are those of [`Scope::check`] on the parsed texts. Both
    /// must be JSON, as the chain has checked each before: one that is not
    /// is an Err where the reading meets the fault, and a fault in a part
    /// it does not read (a bad escape in an unchanged string) goes unseen.
    pub fn check_text(
        &self,
        before: &str,
        after: &str,
    ) -> Result<Result<(), Box<Overstep>>, serde_json::Error> {
        if self.unrestricted {
            return Ok(Ok(()));
        }
        match self.check_lazily(before, after) {
            Ok(verdict) => Ok(verdict),
            // Not the JSON it should be: read as serde_json reads it, to
            // report its error, or (should the lazy reading be wrong about
            // valid JSON) to give the verdict all the same.
            Err(Malformed) => {
                let before: Value = serde_json::from_str(before)?;
                let after: Value = serde_json::from_str(after)?;
                Ok(self.check(&before, &after))
            }
        }
    }

    /// [`Scope::check_text`] without its fallback to values.
    fn check_lazily(
        &self,
        before: &str,
        after: &str,
    ) -> Result<Result<(), Box<Overstep>>, Malformed> {
        let (before, after) = (JsonText::new(before)?, JsonText::new(after)?);
        match self.walk_from(before.root()?, after.root()?) {
            Ok(()) => Ok(Ok(())),
            Err(Stop::Overstep(overstep)) => Ok(Err(overstep)),
            Err(Stop::Malformed) => Err(Malformed),
        }
    }

    fn walk_from<'a, N: Node<'a>>(&self, before: N, after: N) -> Result<(), Stop> {
        let live: Vec<(&Grant, usize)> = self.grants.iter().map(|g| (g, 0)).collect();
        let mut path = Vec::new();
        walk(Some(before), Some(after), &mut path, &live)
    }
}

/// Why a walk stopped.
enum Stop {
    Overstep(Box<Overstep>),
    /// A text was not the JSON it should be.
    Malformed,
}

impl From<Malformed> for Stop {
    fn from(_: Malformed) -> Stop {
        Stop::Malformed
    }
}

impl fmt::Display for Scope {
    /// `the default (a, b)`, `a, b`, `nothing` or `everything`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unrestricted {
            return f.write_str("everything");
        }
        let grants = self.grants().join(", ");
        match (self.is_default, grants.is_empty()) {
            (true, _) => write!(f, "the default ({grants})"),
            (false, true) => f.write_str("nothing (scope: [])"),
            (false, false) => f.write_str(&grants),
        }
    }
}

/// Walks `before` and `after` at `path` with the grants still `live` (each
/// with how many of its selectors are matched): Ok when the two are equal
/// or a live grant is matched whole. Equal bytes end it at once;
/// otherwise it reads one level down on both sides, and compares values
/// only where one side is neither an object nor a list.
fn walk<'a, N: Node<'a>>(
    before: Option<N>,
    after: Option<N>,
    path: &mut Vec<Step<'a>>,
    live: &[(&Grant, usize)],
) -> Result<(), Stop> {
    if live.iter().any(|(g, n)| *n == g.selectors.len()) {
        return Ok(());
    }
    let refuse = |kind, path: &[Step<'_>]| {
        Err(Stop::Overstep(Box::new(Overstep {
            change: Change {
                path: path_text(path),
                kind,
            },
            needed: grant_for(path),
        })))
    };
    let (b, a) = match (before, after) {
        (None, None) => return Ok(()),
        (None, Some(_)) => return refuse(ChangeKind::Added, path),
        (Some(_), None) => return refuse(ChangeKind::Removed, path),
        (Some(b), Some(a)) => (b, a),
    };
    // Not compared as values where no grant goes on, but walked on: a
    // plugin that writes the fields in another order leaves most of them
    // the same bytes, found so without building either side.
    if b.same(a) {
        return Ok(());
    }
    match (b.open()?, a.open()?) {
        (Open::Object(b), Open::Object(a)) => {
            let get = |fields: &[(Cow<'a, str>, N)], key: &str| {
                fields
                    .binary_search_by(|(k, _)| k.as_ref().cmp(key))
                    .ok()
                    .map(|at| fields[at].1)
            };
            for (key, value) in &b {
                let next = advance_key(live, key);
                path.push(Step::Key(key.clone()));
                walk(Some(*value), get(&a, key), path, &next)?;
                path.pop();
            }
            for (key, value) in &a {
                if get(&b, key).is_some() {
                    continue;
                }
                let next = advance_key(live, key);
                path.push(Step::Key(key.clone()));
                walk(None, Some(*value), path, &next)?;
                path.pop();
            }
            Ok(())
        }
        (Open::Array(b), Open::Array(a)) => {
            for i in 0..b.len().max(a.len()) {
                let (bi, ai) = (b.get(i).copied(), a.get(i).copied());
                let next = advance_index(live, bi, ai)?;
                path.push(Step::Index(i));
                walk(bi, ai, path, &next)?;
                path.pop();
            }
            Ok(())
        }
        _ if b.equal(a)? => Ok(()),
        _ => refuse(ChangeKind::Changed, path),
    }
}

/// The live grants that go on past the key `key`.
fn advance_key<'g>(live: &[(&'g Grant, usize)], key: &str) -> Vec<(&'g Grant, usize)> {
    live.iter()
        .filter(|(g, n)| matches!(&g.selectors[*n], Selector::Key(k) if k == key))
        .map(|(g, n)| (*g, n + 1))
        .collect()
}

/// The live grants that go on past a list element, `before`/`after` as
/// the element is on each side.
fn advance_index<'a, 'g, N: Node<'a>>(
    live: &[(&'g Grant, usize)],
    before: Option<N>,
    after: Option<N>,
) -> Result<Vec<(&'g Grant, usize)>, Malformed> {
    let named = |name: &str| -> Result<bool, Malformed> {
        // Each side that has the element must name it so.
        let is = |v: Option<N>| -> Result<bool, Malformed> {
            Ok(match v {
                Some(v) => v.name()?.as_deref() == Some(name),
                None => true,
            })
        };
        Ok(is(before)? && is(after)?)
    };
    let mut next = Vec::new();
    for (g, n) in live {
        let goes_on = match &g.selectors[*n] {
            Selector::Any => true,
            Selector::Named(name) => named(name)?,
            Selector::Key(_) => false,
        };
        if goes_on {
            next.push((*g, n + 1));
        }
    }
    Ok(next)
}

/// Whether `grant` allows everything `other` does: its selectors a prefix
/// of `other`'s, `[*]` standing for any element.
fn covers(grant: &Grant, other: &Grant) -> bool {
    grant.selectors.len() <= other.selectors.len()
        && grant
            .selectors
            .iter()
            .zip(&other.selectors)
            .all(|(g, o)| match (g, o) {
                (Selector::Any, Selector::Any | Selector::Named(_)) => true,
                (g, o) => g == o,
            })
}

/// Parses one grant: keys separated by `.`, `["quoted key"]`, `[*]` and
/// `[NAME]`.
fn parse_grant(text: &str) -> Result<Grant, GrantError> {
    let fail = |reason: &str| GrantError {
        grant: text.to_string(),
        reason: reason.to_string(),
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut selectors = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(inside) = rest.strip_prefix('[') {
            if inside.starts_with('"') {
                // A quoted key: a JSON string, then `]`.
                let mut stream = serde_json::Deserializer::from_str(inside).into_iter::<String>();
                let key = match stream.next() {
                    Some(Ok(key)) => key,
                    _ => return Err(fail("a [\"key\"] that is not a JSON string")),
                };
                rest = inside[stream.byte_offset()..]
                    .strip_prefix(']')
                    .ok_or_else(|| fail("a [\"key\"] without its ]"))?;
                selectors.push(Selector::Key(key));
            } else {
                let end = inside.find(']').ok_or_else(|| fail("a [ without its ]"))?;
                let name = &inside[..end];
                selectors.push(match name {
                    "*" => Selector::Any,
                    "" => return Err(fail("[] selects nothing: write [*] or [NAME]")),
                    name if name.chars().all(|c| plain(c) || c == '.') => {
                        Selector::Named(name.to_string())
                    }
                    _ => return Err(fail("a list selector is [*] or [NAME] (a DNS name)")),
                });
                rest = &inside[end + 1..];
            }
        } else {
            if !selectors.is_empty() {
                rest = rest
                    .strip_prefix('.')
                    .ok_or_else(|| fail("expected . or [ between fields"))?;
            }
            let end = rest.find(|c: char| !plain(c)).unwrap_or(rest.len());
            if end == 0 {
                return Err(fail("an empty field name"));
            }
            selectors.push(Selector::Key(rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    if selectors.is_empty() {
        return Err(fail("empty"));
    }
    if !matches!(selectors[0], Selector::Key(_)) {
        return Err(fail("a path starts with a field name"));
    }
    Ok(Grant {
        text: text.to_string(),
        selectors,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_declaration_is_granted_by_the_same_or_a_wider_grant() {
        let declared: Vec<String> = ["spec.containers[*].image", "spec.initContainers[*].image"]
            .map(String::from)
            .to_vec();
        let narrow = Scope::parse(&["spec.containers[web].image"]).unwrap();
        assert_eq!(
            narrow.not_granted(&declared),
            declared.iter().map(String::as_str).collect::<Vec<_>>()
        );
        let wide = Scope::parse(&["spec.containers", "spec.initContainers[*]"]).unwrap();
        assert!(wide.not_granted(&declared).is_empty());
        assert!(Scope::unrestricted().not_granted(&declared).is_empty());
        assert!(Scope::declares(&declared, "spec.containers[*].image"));
        assert!(!Scope::declares(&declared, "spec.hostPID"));
    }

    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "1"}, "annotations": {"example.com/x": "1"}},
            "spec": {
                "containers": [
                    {"name": "web", "image": "web:1", "env": [{"name": "A", "value": "1"}]},
                    {"name": "side", "image": "side:1"},
                ],
            },
        })
    }

    fn check(grants: &[&str], change: impl FnOnce(&mut Value)) -> Result<(), (String, String)> {
        let before = pod();
        let mut after = before.clone();
        change(&mut after);
        Scope::parse(grants)
            .unwrap()
            .check(&before, &after)
            .map_err(|o| (format!("{}: {}", o.change.path, o.change.kind), o.needed))
    }

    #[test]
    fn grants_parse_in_the_field_path_syntax() {
        let g = parse_grant(r#"metadata.annotations["example.com/x"]"#).unwrap();
        assert_eq!(
            g.selectors,
            vec![
                Selector::Key("metadata".into()),
                Selector::Key("annotations".into()),
                Selector::Key("example.com/x".into()),
            ]
        );
        let g = parse_grant("spec.containers[*].env").unwrap();
        assert_eq!(g.selectors[2], Selector::Any);
        let g = parse_grant("spec.containers[web].image").unwrap();
        assert_eq!(g.selectors[2], Selector::Named("web".into()));
        for bad in [
            "",
            "[*]",
            "spec..x",
            "spec.containers[]",
            "spec[",
            "a b",
            ".spec",
        ] {
            assert!(parse_grant(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_change_inside_a_grant_passes_and_one_outside_names_its_path() {
        assert_eq!(
            check(&["metadata.labels"], |p| p["metadata"]["labels"]["b"] =
                json!("2")),
            Ok(())
        );
        assert_eq!(
            check(&["metadata.labels"], |p| p["spec"]["hostPID"] = json!(true)),
            Err(("spec.hostPID: added".into(), "spec.hostPID".into()))
        );
        assert_eq!(
            check(&["spec.containers[*].env"], |p| p["spec"]["containers"]
                [1]["image"] =
                json!("x")),
            Err((
                "spec.containers[1].image: changed".into(),
                "spec.containers[*].image".into()
            ))
        );
        assert_eq!(
            check(&[r#"metadata.annotations["example.com/x"]"#], |p| {
                p["metadata"]["annotations"]["example.com/x"] = json!("2")
            }),
            Ok(())
        );
        assert_eq!(
            check(&[r#"metadata.annotations["example.com/x"]"#], |p| {
                p["metadata"]["annotations"]["example.com/y"] = json!("2")
            }),
            Err((
                r#"metadata.annotations["example.com/y"]: added"#.into(),
                r#"metadata.annotations["example.com/y"]"#.into()
            ))
        );
        assert_eq!(check(&[], |_| {}), Ok(()), "no change needs no grant");
    }

    #[test]
    fn a_named_grant_holds_only_for_the_element_named_so_on_both_sides() {
        let grant = ["spec.containers[web].image"];
        assert_eq!(
            check(&grant, |p| p["spec"]["containers"][0]["image"] = json!("x")),
            Ok(())
        );
        assert!(check(&grant, |p| p["spec"]["containers"][1]["image"] = json!("x")).is_err());
        // Renamed into the grant: the element was not `web` before.
        assert!(
            check(&grant, |p| {
                p["spec"]["containers"][1]["name"] = json!("web");
                p["spec"]["containers"][1]["image"] = json!("x");
            })
            .is_err()
        );
        // A whole list element added is under [*], not under a field of it.
        assert_eq!(
            check(&grant, |p| p["spec"]["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "web", "image": "evil"}))),
            Err((
                "spec.containers[2]: added".into(),
                "spec.containers[*]".into()
            ))
        );
    }

    #[test]
    fn the_default_allows_labels_and_env_only() {
        let scope = Scope::default();
        let before = pod();
        let mut after = before.clone();
        after["metadata"]["labels"]["zone"] = json!("z");
        after["spec"]["containers"][1]["env"] = json!([{"name": "N", "value": "n"}]);
        assert_eq!(scope.check(&before, &after), Ok(()));
        after["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
        let o = scope.check(&before, &after).unwrap_err();
        assert_eq!(o.change.path, "spec.containers[0].securityContext");
        assert!(
            scope
                .to_string()
                .starts_with("the default (metadata.labels"),
            "{scope}"
        );
        assert_eq!(Scope::unrestricted().check(&before, &json!({})), Ok(()));
    }
}
