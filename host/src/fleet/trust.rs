//! Which node status records count, and as what: the one trust rule for
//! everything that reads them (`podstamp status` now; the coordinator's
//! reading of other nodes' records is meant to call the same functions).
//!
//! Invariant: a status record counts only as what its own node may have
//! written: its `holderIdentity` names a node, its object name is that
//! node's [`status_name`], and a [`NODE_LABEL`], when it carries one, names
//! the same node (name ↔ holder ↔ node: the same rule the admission policy
//! checks against the writer's node-bound token, so a cluster without the
//! policy is not trusted more). Inside a trusted record, a template's
//! `generation` counts only when a PodTemplate could have it. A record that
//! fails is shown as untrusted, with why, and decides nothing: not a
//! template's target, not a count.
//!
//! Pure functions of the object's fields: no I/O, no clock.

use super::{halt_name, status_name};

/// The node a status record is for, on records whose writer labels it
/// (checked when present; the name and the holder are always checked).
pub const NODE_LABEL: &str = "podstamp.io/node";

/// The highest `metadata.generation` taken at its word: the API server
/// starts a generation at 1 and adds 1 per change of the spec, so none
/// reaches 2^53 (where JSON readers also stop counting exactly); i64::MAX
/// or a negative one is forged or broken.
pub const MAX_GENERATION: i64 = 1 << 53;

/// Why a record, or one template's state in it, is not taken at its word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("status Lease {name} has no holderIdentity: no node speaks for it")]
    NoHolder { name: String },
    #[error(
        "status Lease {name} is held by {holder}, whose record is {expected}: not written by its node"
    )]
    Name {
        name: String,
        holder: String,
        expected: String,
    },
    #[error("status Lease {name} is labelled {NODE_LABEL}={label} but held by {holder}")]
    Label {
        name: String,
        label: String,
        holder: String,
    },
    #[error(
        "halt marker {name} is held by {holder}, whose marker for {template} is {expected}: not written by its node"
    )]
    HaltName {
        name: String,
        holder: String,
        template: String,
        expected: String,
    },
    #[error("halt marker {name} names no template: it halts nothing")]
    HaltTemplate { name: String },
    #[error(
        "node {node} claims generation {generation} of {template}, which no PodTemplate has (1 to 2^53)"
    )]
    Generation {
        node: String,
        template: String,
        generation: i64,
    },
}

/// The holder of Lease `name`: none, or an empty one, speaks for no node.
fn held_by<'a>(name: &str, holder: Option<&'a str>) -> Result<&'a str, Untrusted> {
    holder
        .filter(|h| !h.is_empty())
        .ok_or_else(|| Untrusted::NoHolder {
            name: name.to_string(),
        })
}

/// The node a status Lease named `name`, held by `holder` and labelled
/// `node_label` speaks for (see the module's invariant).
pub fn status_owner<'a>(
    name: &str,
    holder: Option<&'a str>,
    node_label: Option<&str>,
) -> Result<&'a str, Untrusted> {
    let holder = held_by(name, holder)?;
    let expected = status_name(holder);
    if name != expected {
        return Err(Untrusted::Name {
            name: name.to_string(),
            holder: holder.to_string(),
            expected,
        });
    }
    if let Some(label) = node_label
        && label != holder
    {
        return Err(Untrusted::Label {
            name: name.to_string(),
            label: label.to_string(),
            holder: holder.to_string(),
        });
    }
    Ok(holder)
}

/// The node a halt marker named `name`, held by `holder`, for template
/// `template`, speaks for: its name must be that node's [`halt_name`] of
/// the template (the rule the admission policy holds writers to).
pub fn halt_owner<'a>(
    name: &str,
    holder: Option<&'a str>,
    template: Option<&str>,
) -> Result<&'a str, Untrusted> {
    let holder = held_by(name, holder)?;
    let template = template
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Untrusted::HaltTemplate {
            name: name.to_string(),
        })?;
    let expected = halt_name(holder, template);
    if name != expected {
        return Err(Untrusted::HaltName {
            name: name.to_string(),
            holder: holder.to_string(),
            template: template.to_string(),
            expected,
        });
    }
    Ok(holder)
}

/// Whether node `node`'s `generation` of `template` can be taken at its
/// word (None, not reported, can).
pub fn check_generation(
    node: &str,
    template: &str,
    generation: Option<i64>,
) -> Result<(), Untrusted> {
    match generation {
        Some(g) if !(1..=MAX_GENERATION).contains(&g) => Err(Untrusted::Generation {
            node: node.to_string(),
            template: template.to_string(),
            generation: g,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_only_as_its_own_nodes() {
        assert_eq!(status_owner("podstamp-node.n1", Some("n1"), None), Ok("n1"));
        assert_eq!(
            status_owner("podstamp-node.n1", Some("n1"), Some("n1")),
            Ok("n1")
        );
        // n2 writing a record in n1's name, or under a name of its own
        // choosing, or with no holder at all.
        assert!(matches!(
            status_owner("podstamp-node.n1", Some("n2"), None),
            Err(Untrusted::Name { .. })
        ));
        assert!(matches!(
            status_owner("evil", Some("n1"), None),
            Err(Untrusted::Name { .. })
        ));
        assert!(matches!(
            status_owner("podstamp-node.n1", None, None),
            Err(Untrusted::NoHolder { .. })
        ));
        assert!(matches!(
            status_owner("podstamp-node.n1", Some(""), None),
            Err(Untrusted::NoHolder { .. })
        ));
        let e = status_owner("podstamp-node.n1", Some("n1"), Some("n2")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "status Lease podstamp-node.n1 is labelled podstamp.io/node=n2 but held by n1"
        );
    }

    #[test]
    fn a_halt_marker_counts_only_as_its_own_nodes() {
        let name = halt_name("n1", "ns/web");
        assert_eq!(halt_owner(&name, Some("n1"), Some("ns/web")), Ok("n1"));
        // Another node's name, another template, no holder, no template.
        assert!(halt_owner(&name, Some("n2"), Some("ns/web")).is_err());
        assert!(halt_owner(&name, Some("n1"), Some("ns/db")).is_err());
        assert!(halt_owner(&name, None, Some("ns/web")).is_err());
        assert!(halt_owner(&name, Some("n1"), None).is_err());
    }

    #[test]
    fn a_generation_no_podtemplate_can_have_is_not_taken() {
        assert_eq!(check_generation("n1", "ns/web", None), Ok(()));
        assert_eq!(check_generation("n1", "ns/web", Some(1)), Ok(()));
        assert_eq!(
            check_generation("n1", "ns/web", Some(MAX_GENERATION)),
            Ok(())
        );
        for forged in [i64::MAX, MAX_GENERATION + 1, 0, -1, i64::MIN] {
            assert!(
                check_generation("n1", "ns/web", Some(forged)).is_err(),
                "{forged}"
            );
        }
    }
}
