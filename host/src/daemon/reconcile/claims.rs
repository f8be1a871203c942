//! Which manifest file each template claims: the file it last wrote or
//! confirmed, or staged in the pass under way.
//!
//! Kept both ways, by template and by file, so that the check every render
//! makes (does a template that arrived earlier claim this pod's file? then
//! the earlier one keeps the name) is one lookup. It was a scan of every
//! template for every template rendered: a million comparisons in a sync of
//! a thousand templates, growing with the square of their number.
//!
//! Invariants:
//! * The two maps say the same thing: every change goes through
//!   [`Claims::set`] or [`Claims::release_file`].
//! * A template claims at most one file; a file may be claimed by several
//!   templates for a moment (a template that arrived earlier takes its name
//!   back from a later one, which then fails its next render): the earliest
//!   is the one that keeps it.
//! * A template's arrival order (`seq`) never changes while it is known.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(super) struct Claims {
    /// Template key → (its arrival order, the file it claims).
    by_key: HashMap<String, (u64, String)>,
    /// File → (arrival order, template key) of every template claiming it,
    /// the earliest first.
    by_file: HashMap<String, BTreeSet<(u64, String)>>,
}

impl Claims {
    /// The file template `key` claims.
    pub(super) fn of(&self, key: &str) -> Option<&str> {
        self.by_key.get(key).map(|(_, file)| file.as_str())
    }

    /// Template `key` (arrival order `seq`) claims `file` from now on, or
    /// nothing (None: also when the template is gone).
    pub(super) fn set(&mut self, key: &str, seq: u64, file: Option<String>) {
        // Claimed again as it was (a staged write put in place, a resync
        // finding its manifest unchanged): nothing to move.
        let unchanged = match (self.by_key.get(key), file.as_deref()) {
            (Some((old_seq, old)), Some(new)) => *old_seq == seq && old == new,
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        if let Some((old_seq, old_file)) = self.by_key.remove(key) {
            self.unindex(&old_file, old_seq, key);
        }
        if let Some(file) = file {
            self.by_file
                .entry(file.clone())
                .or_default()
                .insert((seq, key.to_string()));
            self.by_key.insert(key.to_string(), (seq, file));
        }
    }

    /// No template claims `file` any more (it was removed).
    pub(super) fn release_file(&mut self, file: &str) {
        for (_, key) in self.by_file.remove(file).unwrap_or_default() {
            self.by_key.remove(&key);
        }
    }

    /// The template that arrived before `seq`, other than `key`, and
    /// claims `file`: the earliest such, if any.
    pub(super) fn earlier(&self, file: &str, seq: u64, key: &str) -> Option<&str> {
        self.by_file
            .get(file)?
            .iter()
            .take_while(|(s, _)| *s < seq)
            .find(|(_, k)| k != key)
            .map(|(_, k)| k.as_str())
    }

    /// Every (template key, file) claimed.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_key
            .iter()
            .map(|(key, (_, file))| (key.as_str(), file.as_str()))
    }

    fn unindex(&mut self, file: &str, seq: u64, key: &str) {
        if let Some(claimants) = self.by_file.get_mut(file) {
            claimants.remove(&(seq, key.to_string()));
            if claimants.is_empty() {
                self.by_file.remove(file);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(file: &str) -> Option<String> {
        Some(file.to_string())
    }

    /// The two maps agree after every change: every key's file lists the
    /// key, and every file lists only keys that claim it.
    fn consistent(c: &Claims) {
        for (key, (seq, file)) in &c.by_key {
            assert!(c.by_file[file].contains(&(*seq, key.clone())), "{key}");
        }
        for (file, claimants) in &c.by_file {
            assert!(!claimants.is_empty(), "{file} kept empty");
            for (seq, key) in claimants {
                assert_eq!(c.by_key.get(key), Some(&(*seq, file.clone())), "{file}");
            }
        }
    }

    #[test]
    fn a_claim_moves_and_goes_with_its_template() {
        let mut c = Claims::default();
        c.set("a", 1, some("web.yaml"));
        consistent(&c);
        assert_eq!(c.of("a"), Some("web.yaml"));
        c.set("a", 1, some("web.yaml"));
        consistent(&c);
        // The pod renamed: the old file is no longer claimed.
        c.set("a", 1, some("api.yaml"));
        consistent(&c);
        assert_eq!(c.of("a"), Some("api.yaml"));
        assert_eq!(c.earlier("web.yaml", 9, "z"), None);
        assert_eq!(c.earlier("api.yaml", 9, "z"), Some("a"));
        c.set("a", 1, None);
        consistent(&c);
        assert_eq!(c.of("a"), None);
        assert!(c.by_file.is_empty());
        assert_eq!(c.iter().count(), 0);
    }

    /// Only a template that arrived earlier counts, never the one asking,
    /// and of several the earliest is named.
    #[test]
    fn the_earliest_other_claimant_is_found() {
        let mut c = Claims::default();
        c.set("late", 7, some("web.yaml"));
        c.set("mid", 5, some("web.yaml"));
        c.set("early", 2, some("web.yaml"));
        consistent(&c);
        assert_eq!(c.earlier("web.yaml", 7, "late"), Some("early"));
        assert_eq!(c.earlier("web.yaml", 5, "mid"), Some("early"));
        assert_eq!(c.earlier("web.yaml", 2, "early"), None);
        assert_eq!(c.earlier("web.yaml", 3, "new"), Some("early"));
        assert_eq!(c.earlier("other.yaml", 9, "new"), None);
        c.set("early", 2, None);
        assert_eq!(c.earlier("web.yaml", 7, "late"), Some("mid"));
        assert_eq!(c.earlier("web.yaml", 5, "mid"), None);
    }

    #[test]
    fn a_removed_file_is_claimed_by_nobody() {
        let mut c = Claims::default();
        c.set("a", 1, some("web.yaml"));
        c.set("b", 2, some("web.yaml"));
        c.set("c", 3, some("db.yaml"));
        c.release_file("web.yaml");
        consistent(&c);
        assert_eq!(
            (c.of("a"), c.of("b"), c.of("c")),
            (None, None, Some("db.yaml"))
        );
        let all: Vec<_> = c.iter().collect();
        assert_eq!(all, vec![("c", "db.yaml")]);
        c.release_file("nothing.yaml");
        consistent(&c);
    }
}
