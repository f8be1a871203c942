//! A short structural diff of two pods: what one plugin changed.
//!
//! Invariants: a field or list element that one side lacks is one change
//! at its path (added or removed), not one per value under it; lists are
//! compared element by element, by index; every change is found, and
//! [`diff`] lists at most `limit` of them (with the count of the rest).

use std::fmt;

use serde_json::Value;

use crate::validate::{join_index, join_key};

/// What happened at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        })
    }
}

/// One change, at a field path in podstamp's syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.kind)
    }
}

/// The changes from `before` to `after`, in the order of `before`'s fields
/// then `after`'s new ones: at most `limit`, and how many more there were.
pub fn diff(before: &Value, after: &Value, limit: usize) -> (Vec<Change>, usize) {
    let mut found = Found {
        changes: Vec::new(),
        more: 0,
        limit,
    };
    walk(Some(before), Some(after), String::new(), &mut found);
    (found.changes, found.more)
}

/// The distinct fields, two levels deep (`spec.containers`,
/// `metadata.labels`, `spec.hostPID`), under which `changes` are.
pub fn top_level_fields(changes: &[Change]) -> Vec<String> {
    let mut fields: Vec<String> = Vec::new();
    for change in changes {
        // Cut the path after its second field, before any `[` or `.`.
        let path = &change.path;
        let first = path.find(['.', '[']).unwrap_or(path.len());
        let second = path[first..]
            .strip_prefix('.')
            .and_then(|rest| rest.find(['.', '[']).map(|n| first + 1 + n))
            .unwrap_or(path.len());
        let field = path[..second].to_string();
        if !fields.contains(&field) {
            fields.push(field);
        }
    }
    fields
}

struct Found {
    changes: Vec<Change>,
    more: usize,
    limit: usize,
}

impl Found {
    fn push(&mut self, path: String, kind: ChangeKind) {
        if self.changes.len() < self.limit {
            self.changes.push(Change { path, kind });
        } else {
            self.more += 1;
        }
    }
}

fn walk(before: Option<&Value>, after: Option<&Value>, path: String, found: &mut Found) {
    match (before, after) {
        (None, None) => {}
        (None, Some(_)) => found.push(path, ChangeKind::Added),
        (Some(_), None) => found.push(path, ChangeKind::Removed),
        (Some(Value::Object(b)), Some(Value::Object(a))) => {
            for (key, value) in b {
                walk(Some(value), a.get(key), join_key(&path, key), found);
            }
            for (key, value) in a {
                if !b.contains_key(key) {
                    walk(None, Some(value), join_key(&path, key), found);
                }
            }
        }
        (Some(Value::Array(b)), Some(Value::Array(a))) => {
            for i in 0..b.len().max(a.len()) {
                walk(b.get(i), a.get(i), join_index(&path, i), found);
            }
        }
        (Some(b), Some(a)) if b == a => {}
        (Some(_), Some(_)) => found.push(path, ChangeKind::Changed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_change_once_at_its_path() {
        let before = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c", "image": "1"}]}});
        let after = json!({"metadata": {"labels": {"a": "2"}}, "spec": {"hostPID": true, "containers": [{"name": "c"}, {"name": "d"}]}});
        let (changes, more) = diff(&before, &after, 10);
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "metadata.labels.a: changed",
                "spec.containers[0].image: removed",
                "spec.containers[1]: added",
                "spec.hostPID: added",
            ]
        );
        assert_eq!(more, 0);
        assert_eq!(
            top_level_fields(&changes),
            ["metadata.labels", "spec.containers", "spec.hostPID"]
        );
        let (changes, more) = diff(&before, &after, 1);
        assert_eq!((changes.len(), more), (1, 3));
        assert_eq!(diff(&before, &before, 10), (vec![], 0));
    }
}
