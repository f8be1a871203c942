//! A template's rollout policy, from its PodTemplate's annotations.
//!
//! * `podstamp.io/rollout`: `node-by-node` (the default) or `all-at-once`,
//!   the explicit opt-out: every node writes an update as soon as it
//!   renders it, as podstamp did before rollouts.
//! * `podstamp.io/max-unavailable`: how many nodes may be updating the
//!   template at once, node by node; a whole number from 1 to
//!   [`MAX_SLOTS`], default 1.
//!
//! The progress deadline (`podstamp.io/progress-deadline`) is the node's
//! own ([`crate::daemon::rollout`]). First installs on a node and deletions
//! are never held back by a policy: only updates of an existing manifest.
//!
//! A bad value is an error of that template alone, naming the annotation
//! and the fix; nothing is written for it until it is fixed.

use std::collections::BTreeMap;

pub const ROLLOUT_ANNOTATION: &str = "podstamp.io/rollout";
pub const MAX_UNAVAILABLE_ANNOTATION: &str = "podstamp.io/max-unavailable";
/// The most slots a template may have: each is an object in the API.
pub const MAX_SLOTS: u32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every node writes an update at once.
    AllAtOnce,
    /// At most this many nodes update at once.
    NodeByNode { max_unavailable: u32 },
}

impl Default for Policy {
    fn default() -> Self {
        Policy::NodeByNode { max_unavailable: 1 }
    }
}

/// Reads the policy of a template with these annotations.
pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Policy, String> {
    let max = match annotations.get(MAX_UNAVAILABLE_ANNOTATION) {
        None => None,
        Some(text) => match text.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_SLOTS).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "metadata.annotations.{MAX_UNAVAILABLE_ANNOTATION}: {text:?} is not a whole number from 1 to {MAX_SLOTS}; give how many nodes may update at once, or remove it for 1"
                ));
            }
        },
    };
    match annotations.get(ROLLOUT_ANNOTATION).map(|s| s.trim()) {
        None | Some("node-by-node") => Ok(Policy::NodeByNode {
            max_unavailable: max.unwrap_or(1),
        }),
        Some("all-at-once") => match max {
            None => Ok(Policy::AllAtOnce),
            Some(_) => Err(format!(
                "metadata.annotations.{MAX_UNAVAILABLE_ANNOTATION}: means nothing with {ROLLOUT_ANNOTATION}: all-at-once; remove one of them"
            )),
        },
        Some(other) => Err(format!(
            "metadata.annotations.{ROLLOUT_ANNOTATION}: {other:?} is not a rollout; give node-by-node (the default) or all-at-once"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<Policy, String> {
        from_annotations(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn defaults_to_one_node_at_a_time() {
        assert_eq!(read(&[]), Ok(Policy::NodeByNode { max_unavailable: 1 }));
        assert_eq!(
            read(&[(MAX_UNAVAILABLE_ANNOTATION, "2")]),
            Ok(Policy::NodeByNode { max_unavailable: 2 })
        );
        assert_eq!(
            read(&[(ROLLOUT_ANNOTATION, "all-at-once")]),
            Ok(Policy::AllAtOnce)
        );
    }

    #[test]
    fn bad_values_name_the_annotation_and_the_fix() {
        for bad in ["0", "-1", "two", "101", "1.5"] {
            let e = read(&[(MAX_UNAVAILABLE_ANNOTATION, bad)]).unwrap_err();
            assert!(
                e.contains(MAX_UNAVAILABLE_ANNOTATION) && e.contains("from 1 to 100"),
                "{e}"
            );
        }
        let e = read(&[(ROLLOUT_ANNOTATION, "fast")]).unwrap_err();
        assert!(
            e.contains("node-by-node") && e.contains("all-at-once"),
            "{e}"
        );
        let e = read(&[
            (ROLLOUT_ANNOTATION, "all-at-once"),
            (MAX_UNAVAILABLE_ANNOTATION, "2"),
        ])
        .unwrap_err();
        assert!(e.contains("remove one"), "{e}");
    }
}
