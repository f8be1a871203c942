//! A template's rollout policy, from its PodTemplate's annotations.
//!
//! * `podstamp.io/rollout`: `node-by-node` (the default) or `all-at-once`,
//!   the explicit opt-out: every node writes an update as soon as it
//!   renders it, as podstamp did before rollouts.
//! * `podstamp.io/max-unavailable`: how many nodes may be updating the
//!   template at once, node by node; a whole number from 1 to
//!   [`MAX_SLOTS`], or a percentage of the nodes the template is for
//!   (`10%`, [`Policy::Percent`]); default 1.
//! * `podstamp.io/quorum: "true"`: the template is a member of a quorum
//!   (etcd, or the API servers in front of it): one node at a time, and a
//!   node starts only once no other node's revision of it is unconfirmed
//!   ([`Policy::Quorum`]). `max-unavailable` may only say 1 beside it, and
//!   `all-at-once` not at all: a second member down loses the quorum.
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
pub const QUORUM_ANNOTATION: &str = "podstamp.io/quorum";
/// The most slots a template may have, given as a count or resolved from a
/// share: each is a Lease in the API, created once and, while held, renewed
/// every third of its lease duration. 500 held at the default 30 s are
/// 50 writes/s and under 0.5 MiB in etcd: a tenth of what a 5,000-node
/// cluster's kubelets write for their own node Leases (one each every
/// 10 s), and 10% of such a fleet at once.
pub const MAX_SLOTS: u32 = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every node writes an update at once.
    AllAtOnce,
    /// At most this many nodes update at once.
    NodeByNode { max_unavailable: u32 },
    /// At most this share of the nodes the template is for (its
    /// `podstamp.io/node-selector`, or every node) update at once: `percent`
    /// of their count, rounded up, at least 1 and at most [`MAX_SLOTS`]
    /// ([`share`]), as the DaemonSet controller reads its `maxUnavailable`.
    Percent { percent: u32 },
    /// One node at a time, and never while another node's revision is
    /// unconfirmed: its one slot is held from before the write until this
    /// node's revision in place is Ready again (the new one, or the one a
    /// failure rolled back to), and a holder that stops renewing it keeps
    /// it ([`Policy::expires`]): a member that did not come back must not
    /// let a second one go down. An operator frees it by deleting the slot
    /// Lease, once the member is known to be gone.
    Quorum,
}

impl Policy {
    /// How many nodes may be updating at once (0: no limit), for a template
    /// that is for `nodes` nodes (None: not known yet, when a share counts
    /// as one node: never more at once than asked).
    pub fn slots(self, nodes: Option<u32>) -> u32 {
        match self {
            Policy::AllAtOnce => 0,
            Policy::NodeByNode { max_unavailable } => max_unavailable,
            Policy::Percent { percent } => nodes.map_or(1, |n| share(percent, n)),
            Policy::Quorum => 1,
        }
    }

    /// Whether a slot whose holder stopped renewing it is free once its
    /// duration passed. Not for a quorum member: its holder may be the
    /// member that is down.
    pub fn expires(self) -> bool {
        !matches!(self, Policy::Quorum)
    }
}

/// `percent` of `nodes`, rounded up (as Kubernetes'
/// `intstr.GetScaledValueFromIntOrPercent(…, roundUp: true)` does for a
/// DaemonSet's `maxUnavailable`), at least 1 (a rollout always moves) and at
/// most [`MAX_SLOTS`].
pub fn share(percent: u32, nodes: u32) -> u32 {
    let scaled = (u64::from(percent) * u64::from(nodes)).div_ceil(100);
    scaled.clamp(1, u64::from(MAX_SLOTS)) as u32
}

/// A count (`"3"`) or a percentage (`"10%"`), within bounds.
fn read_max(text: &str) -> Option<Policy> {
    let text = text.trim();
    match text.strip_suffix('%') {
        Some(percent) => match percent.parse::<u32>() {
            Ok(p) if (1..=100).contains(&p) => Some(Policy::Percent { percent: p }),
            _ => None,
        },
        None => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_SLOTS).contains(&n) => {
                Some(Policy::NodeByNode { max_unavailable: n })
            }
            _ => None,
        },
    }
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
        Some(text) => Some(read_max(text).ok_or_else(|| {
            format!(
                "metadata.annotations.{MAX_UNAVAILABLE_ANNOTATION}: {text:?} is not a whole number from 1 to {MAX_SLOTS} or a percentage from 1% to 100%; give how many nodes may update at once (10, or 10% of the nodes the template is for), or remove it for 1"
            )
        })?),
    };
    let rollout = annotations.get(ROLLOUT_ANNOTATION).map(|s| s.trim());
    match annotations.get(QUORUM_ANNOTATION).map(|s| s.trim()) {
        None | Some("false") => {}
        Some("true") => {
            if rollout == Some("all-at-once") {
                return Err(format!(
                    "metadata.annotations.{ROLLOUT_ANNOTATION}: all-at-once would take every member of the quorum down at once ({QUORUM_ANNOTATION}: \"true\"); remove one of them"
                ));
            }
            if max.is_some_and(|m| m != Policy::NodeByNode { max_unavailable: 1 }) {
                return Err(format!(
                    "metadata.annotations.{MAX_UNAVAILABLE_ANNOTATION}: a quorum member ({QUORUM_ANNOTATION}: \"true\") updates one node at a time; remove it or set it to 1"
                ));
            }
            return match rollout {
                None | Some("node-by-node") => Ok(Policy::Quorum),
                Some(other) => Err(format!(
                    "metadata.annotations.{ROLLOUT_ANNOTATION}: {other:?} is not a rollout; give node-by-node (the default) or all-at-once"
                )),
            };
        }
        Some(other) => {
            return Err(format!(
                "metadata.annotations.{QUORUM_ANNOTATION}: {other:?} is not \"true\" or \"false\"; give \"true\" for a member of a quorum (etcd, the API servers), or remove it"
            ));
        }
    }
    match rollout {
        None | Some("node-by-node") => Ok(max.unwrap_or_default()),
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
        for bad in [
            "0", "-1", "two", "501", "1.5", "0%", "101%", "%", "1.5%", "10 %", "-5%",
        ] {
            let e = read(&[(MAX_UNAVAILABLE_ANNOTATION, bad)]).unwrap_err();
            assert!(
                e.contains(MAX_UNAVAILABLE_ANNOTATION)
                    && e.contains("from 1 to 500")
                    && e.contains("from 1% to 100%"),
                "{bad}: {e}"
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

    #[test]
    fn a_quorum_member_updates_one_node_at_a_time_and_its_slot_does_not_expire() {
        for pairs in [
            &[(QUORUM_ANNOTATION, "true")][..],
            &[
                (QUORUM_ANNOTATION, " true "),
                (MAX_UNAVAILABLE_ANNOTATION, "1"),
            ],
            &[
                (QUORUM_ANNOTATION, "true"),
                (ROLLOUT_ANNOTATION, "node-by-node"),
            ],
        ] {
            let p = read(pairs).unwrap();
            assert_eq!(p, Policy::Quorum, "{pairs:?}");
            assert_eq!((p.slots(Some(5)), p.expires()), (1, false));
        }
        assert_eq!(
            read(&[
                (QUORUM_ANNOTATION, "false"),
                (MAX_UNAVAILABLE_ANNOTATION, "3")
            ]),
            Ok(Policy::NodeByNode { max_unavailable: 3 })
        );
        assert!(Policy::default().expires() && Policy::AllAtOnce.expires());
        assert_eq!(Policy::AllAtOnce.slots(None), 0);
    }

    #[test]
    fn a_percentage_is_of_the_nodes_the_template_is_for_rounded_up_at_least_one() {
        assert_eq!(
            read(&[(MAX_UNAVAILABLE_ANNOTATION, " 10% ")]),
            Ok(Policy::Percent { percent: 10 })
        );
        let ten = Policy::Percent { percent: 10 };
        // As the DaemonSet controller rounds a maxUnavailable of 10%.
        for (nodes, slots) in [
            (0, 1),
            (1, 1),
            (9, 1),
            (10, 1),
            (11, 2),
            (2_000, 200),
            (5_000, 500),
            (6_000, 500),
        ] {
            assert_eq!(ten.slots(Some(nodes)), slots, "10% of {nodes}");
        }
        assert_eq!(Policy::Percent { percent: 100 }.slots(Some(3)), 3);
        assert_eq!(Policy::Percent { percent: 50 }.slots(Some(3)), 2);
        assert_eq!(ten.slots(None), 1, "not counted yet: one at a time");
        assert_eq!(share(100, u32::MAX), MAX_SLOTS);
        let e = read(&[
            (QUORUM_ANNOTATION, "true"),
            (MAX_UNAVAILABLE_ANNOTATION, "34%"),
        ])
        .unwrap_err();
        assert!(e.contains("set it to 1"), "{e}");
    }

    #[test]
    fn a_quorum_member_refuses_what_would_take_two_members_down() {
        let e = read(&[
            (QUORUM_ANNOTATION, "true"),
            (MAX_UNAVAILABLE_ANNOTATION, "2"),
        ])
        .unwrap_err();
        assert!(
            e.contains(MAX_UNAVAILABLE_ANNOTATION) && e.contains("set it to 1"),
            "{e}"
        );
        let e = read(&[
            (QUORUM_ANNOTATION, "true"),
            (ROLLOUT_ANNOTATION, "all-at-once"),
        ])
        .unwrap_err();
        assert!(
            e.contains(ROLLOUT_ANNOTATION) && e.contains("remove one"),
            "{e}"
        );
        let e = read(&[(QUORUM_ANNOTATION, "yes")]).unwrap_err();
        assert!(
            e.contains(QUORUM_ANNOTATION) && e.contains("\"true\""),
            "{e}"
        );
    }
}
