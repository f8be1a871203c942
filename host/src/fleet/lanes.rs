//! Lanes: which of a template's slots a node waits for, and its turn
//! among the nodes waiting for the same one.
//!
//! A node waiting to update a template watches only its lanes (at most
//! [`LANES`] of the template's `max-unavailable` slots, chosen by a hash
//! of the node, the template and the target), not every slot: what it
//! receives per rollout is the writes to those few slots, about
//! `LANES × 2 × N / max-unavailable` events, constant in N when
//! max-unavailable is a share of the fleet. Several lanes per node, not
//! one: with one, the lane that hashing made longest sets the rollout's
//! length; with a choice of a few, a node takes whichever frees first and
//! the lanes even out (the "power of two choices").
//!
//! Invariants: pure functions of their arguments (every node computes the
//! same lanes for a node, so none needs another's list); a turn is in
//! [0, 1) and changes with the target, so no node waits last in every
//! rollout.

use sha2::{Digest, Sha256};

/// The most slots of one template a node watches.
pub const LANES: u32 = 3;

fn hash(parts: &[&str]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The lane label of slot `slot` (its name): 16 hex digits.
pub fn lane(slot: &str) -> String {
    format!("{:016x}", hash(&["podstamp lane v1", slot]))
}

/// The slot indexes of template `id` (of `slots`) node `node` waits for
/// to write `target`: all of them when there are [`LANES`] or fewer.
pub fn lanes(node: &str, id: &str, target: &str, slots: u32) -> Vec<u32> {
    if slots <= LANES {
        return (0..slots).collect();
    }
    let mut chosen = Vec::with_capacity(LANES as usize);
    // Bounded: a few draws suffice; past 64 the rest are filled in order.
    for k in 0..64u32 {
        let i = (hash(&["podstamp lanes v1", node, id, target, &k.to_string()]) % u64::from(slots))
            as u32;
        if !chosen.contains(&i) {
            chosen.push(i);
        }
        if chosen.len() == LANES as usize {
            return chosen;
        }
    }
    let mut i = 0;
    while chosen.len() < LANES as usize {
        if !chosen.contains(&i) {
            chosen.push(i);
        }
        i += 1;
    }
    chosen
}

/// Node `node`'s turn for slot `index` of template `id` and `target`, in
/// [0, 1): waiters try a freed slot after `turn × spread`, the lowest
/// first, instead of all at once.
pub fn turn(node: &str, id: &str, target: &str, index: u32) -> f64 {
    (hash(&["podstamp turn v1", node, id, target, &index.to_string()]) >> 11) as f64
        / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_few_distinct_and_spread_over_the_slots() {
        assert_eq!(lanes("n1", "ns/web", "t1", 2), vec![0, 1]);
        let mut load = vec![0u32; 100];
        for n in 0..1000 {
            let l = lanes(&format!("n{n}"), "ns/web", "t1", 100);
            assert_eq!(l.len(), 3);
            assert!(l[0] != l[1] && l[1] != l[2] && l[0] != l[2]);
            for i in l {
                load[i as usize] += 1;
            }
        }
        // 3,000 choices over 100 slots: 30 each on average.
        assert!(load.iter().all(|&n| (5..80).contains(&n)), "{load:?}");
        assert_ne!(
            lanes("n1", "ns/web", "t1", 100),
            lanes("n1", "ns/web", "t2", 100)
        );
    }

    #[test]
    fn turns_are_in_the_unit_interval_and_differ_by_node() {
        let a = turn("n1", "ns/web", "t1", 0);
        let b = turn("n2", "ns/web", "t1", 0);
        assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
        assert_ne!(a, b);
        assert_eq!(lane("podstamp-slot.ns.web.0").len(), 16);
    }
}
