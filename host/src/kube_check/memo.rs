//! Verdicts by the digest of what was asked.
//!
//! The key is the sha256 of the node name and its kubelet's version (each
//! length-prefixed) and the manifest's bytes: a verdict is reused only for
//! exactly the same question,
//! so a memoized answer is the helper's answer. The memo is bounded: when
//! full it is emptied (a resync of every template asks each once again),
//! which keeps it at most [`CAPACITY`] entries of a few hundred bytes.
//!
//! The Pod Security verdicts have a memo of their own (the same type, another
//! verdict), keyed by [`pod_security_key`]: the level, the version and the
//! bytes, so that a changed label or annotation is a new question.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// At most this many verdicts are kept.
pub const CAPACITY: usize = 4096;

pub type Key = [u8; 32];

pub fn key(node: &str, kubelet: &str, manifest: &[u8]) -> Key {
    let mut hash = Sha256::new();
    for part in [node, kubelet] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.update(manifest);
    hash.finalize().into()
}

/// The key of a Pod Security verdict: level and version (each
/// length-prefixed, after a tag no kubelet question starts with) and the bytes.
pub fn pod_security_key(level: &str, version: &str, manifest: &[u8]) -> Key {
    let mut hash = Sha256::new();
    hash.update(b"\x01pod-security");
    for part in [level, version] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.update(manifest);
    hash.finalize().into()
}

pub struct Memo<V> {
    verdicts: HashMap<Key, V>,
    hits: u64,
    misses: u64,
}

impl<V> Default for Memo<V> {
    fn default() -> Self {
        Memo {
            verdicts: HashMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl<V: Clone> Memo<V> {
    pub fn get(&mut self, key: &Key) -> Option<V> {
        let found = self.verdicts.get(key).cloned();
        match found {
            Some(_) => self.hits += 1,
            None => self.misses += 1,
        }
        found
    }

    /// Is `key` known? Counted neither as a hit nor as a miss: the caller
    /// then asks with [`Memo::get`].
    pub fn peek(&self, key: &Key) -> Option<&V> {
        self.verdicts.get(key)
    }

    /// A verdict asked of the helper without [`Memo::get`] first (the
    /// caller [`Memo::peek`]ed): counted as the miss it was, then kept.
    pub fn record_miss(&mut self, key: Key, verdict: V) {
        self.misses += 1;
        self.insert(key, verdict);
    }

    pub fn insert(&mut self, key: Key, verdict: V) {
        if self.verdicts.len() >= CAPACITY {
            self.verdicts.clear();
        }
        self.verdicts.insert(key, verdict);
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_and_the_bytes_are_both_the_question() {
        assert_ne!(key("n1", "", b"a"), key("n1", "", b"b"));
        assert_ne!(key("n1", "", b"a"), key("n2", "", b"a"));
        assert_ne!(key("n1", "v1.36.0", b"a"), key("n1", "v1.37.0", b"a"));
        // Length-prefixed: no node/version/bytes split hashes like another.
        assert_ne!(key("n1", "", b"2a"), key("n12", "", b"a"));
        assert_ne!(key("n1", "a", b""), key("n1", "", b"a"));
    }

    #[test]
    fn the_level_the_version_and_the_bytes_are_the_pod_security_question() {
        let k = pod_security_key("restricted", "latest", b"a");
        assert_ne!(k, pod_security_key("baseline", "latest", b"a"));
        assert_ne!(k, pod_security_key("restricted", "v1.30", b"a"));
        assert_ne!(k, pod_security_key("restricted", "latest", b"b"));
        // Never the kubelet question's key for the same strings.
        assert_ne!(k, key("restricted", "latest", b"a"));
    }

    #[test]
    fn a_full_memo_starts_again() {
        let mut memo: Memo<Result<Vec<String>, ()>> = Memo::default();
        for i in 0..CAPACITY + 1 {
            memo.insert(key("n", "", &i.to_le_bytes()), Ok(Vec::new()));
        }
        assert_eq!(memo.verdicts.len(), 1);
        assert!(memo.get(&key("n", "", &CAPACITY.to_le_bytes())).is_some());
        assert!(memo.get(&key("n", "", &0usize.to_le_bytes())).is_none());
        assert_eq!((memo.hits(), memo.misses()), (1, 1));
    }
}
