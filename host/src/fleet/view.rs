//! What `podstamp status` shows: the rollouts of a namespace's templates,
//! read from the node status Leases (see the parent module), summed up per
//! template and listed per node.
//!
//! A template's target is the one wanted by the node that read the newest
//! template (`metadata.generation`; a tie goes to the latest phase change):
//! nodes that have not seen the newest template yet are pending. A node
//! whose plugin settings differ wants another target of the same change
//! ([`super::change`]): up to date on it, it counts as updated. A node
//! appears once its daemon reported the template, or, for a template with
//! a `podstamp.io/node-selector`, when the selector selects its labels
//! ([`Targeting`]): such a template counts the nodes it is for, and one that
//! never reported it is pending.
//!
//! Invariant: a record [`super::trust`] does not take at its word (not
//! written by its own node, or a generation no PodTemplate has) is listed
//! as untrusted, with why, and decides nothing: not the target, not the
//! generation, not a count but its own.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;
use serde_json::Value;

use super::trust::{NODE_LABEL, check_generation, status_owner};
use super::{NodeStatus, Phase, ROLE_LABEL, ROLE_STATUS, STATUS_ANNOTATION, TemplateStatus};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub templates: Vec<TemplateView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateView {
    /// `namespace/name`.
    pub template: String,
    pub target: Option<String>,
    pub generation: Option<i64>,
    /// Nodes whose manifest in place is of the target.
    pub updated: usize,
    /// Of those, the ones whose mirror pod is Ready.
    pub ready: usize,
    /// Nodes where the target failed.
    pub failed: usize,
    /// Nodes not on the target yet (waiting, halted, or not there).
    pub pending: usize,
    /// Records not taken at their word (listed, counted nowhere else).
    pub untrusted: usize,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub node: String,
    /// Why this record is not taken at its word, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<String>,
    #[serde(flatten)]
    pub status: TemplateStatus,
}

/// Which nodes each template is for, as `podstamp status` reads them from
/// the API: every Node's labels (one LIST) and the node selector of each
/// template that has one ([`crate::selector`]).
#[derive(Debug, Clone, Default)]
pub struct Targeting {
    /// Node name → labels.
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// `namespace/name` → its `podstamp.io/node-selector`, as written.
    pub selectors: BTreeMap<String, String>,
}

/// The phase shown for a node a template is for that never reported it.
pub const NOT_REPORTED: &str = "pending";

/// Reads the node status Leases (as JSON, the way the API lists them);
/// `only`: one template's `namespace/name`, or every template of
/// `namespace`.
pub fn from_leases(leases: &[Value], namespace: &str, only: Option<&str>) -> View {
    targeted(leases, namespace, only, None)
}

/// The same, counting for a template with a node selector only the nodes
/// it selects (`targeting`): a record of a node outside it is left out, and
/// a node inside it that never reported the template is listed, pending. A
/// template without a selector is for every node that runs podstamp, which
/// the API cannot tell: it counts the nodes that reported. A selector that
/// does not parse changes nothing (the daemons report it, InvalidTemplate).
pub fn targeted(
    leases: &[Value],
    namespace: &str,
    only: Option<&str>,
    targeting: Option<&Targeting>,
) -> View {
    let wanted = |id: &str| match only {
        Some(one) => id == one,
        None => id.split('/').next() == Some(namespace),
    };
    let mut per_template: BTreeMap<String, Vec<NodeView>> = BTreeMap::new();
    for lease in leases {
        let label = lease
            .pointer(&format!(
                "/metadata/labels/{}",
                ROLE_LABEL.replace('/', "~1")
            ))
            .and_then(Value::as_str);
        if label != Some(ROLE_STATUS) {
            continue;
        }
        let name = lease
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let holder = lease
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str);
        let node_label = lease
            .pointer(&format!(
                "/metadata/labels/{}",
                NODE_LABEL.replace('/', "~1")
            ))
            .and_then(Value::as_str);
        // An untrusted record is listed under its object's name: the node
        // it claims is what is in doubt.
        let (node, distrust) = match status_owner(name, holder, node_label) {
            Ok(node) => (node.to_string(), None),
            Err(why) => (name.to_string(), Some(why.to_string())),
        };
        let text = lease
            .pointer(&format!(
                "/metadata/annotations/{}",
                STATUS_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str);
        let (record, _) = NodeStatus::parse(text);
        for (id, status) in record.templates {
            if wanted(&id) {
                let untrusted = distrust.clone().or_else(|| {
                    check_generation(&node, &id, status.generation)
                        .err()
                        .map(|why| why.to_string())
                });
                per_template.entry(id).or_default().push(NodeView {
                    node: node.clone(),
                    untrusted,
                    status: *status,
                });
            }
        }
    }
    for (id, text) in targeting.iter().flat_map(|t| &t.selectors) {
        let Ok(selector) = crate::selector::Selector::parse(text) else {
            continue;
        };
        if !wanted(id) {
            continue;
        }
        let targeting = targeting.expect("iterated");
        let selected: Vec<&String> = targeting
            .nodes
            .iter()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(name, _)| name)
            .collect();
        let nodes = per_template.entry(id.clone()).or_default();
        // A trusted record of a node the template is not for does not
        // count (its daemon removes it once it sees its labels).
        nodes.retain(|n| n.untrusted.is_some() || selected.contains(&&n.node));
        for name in selected {
            if !nodes
                .iter()
                .any(|n| n.untrusted.is_none() && &n.node == name)
            {
                nodes.push(NodeView {
                    node: name.clone(),
                    untrusted: None,
                    status: TemplateStatus {
                        phase: NOT_REPORTED.into(),
                        message: Some(format!(
                            "never reported: the node's labels match {} {text:?}; is podstamp running there?",
                            crate::selector::NODE_SELECTOR_ANNOTATION
                        )),
                        ..TemplateStatus::default()
                    },
                });
            }
        }
    }
    let templates = per_template
        .into_iter()
        .map(|(template, mut nodes)| {
            nodes.sort_by(|a, b| a.node.cmp(&b.node));
            let trusted = || nodes.iter().filter(|n| n.untrusted.is_none());
            let newest = trusted()
                .max_by(|a, b| {
                    (a.status.generation, &a.status.since)
                        .cmp(&(b.status.generation, &b.status.since))
                })
                .map(|n| {
                    (
                        n.status.wanted.clone(),
                        n.status.generation,
                        n.status.change.clone(),
                    )
                });
            let (target, generation, change) = newest.unwrap_or_default();
            // On the target, or (per-node plugin settings: each node its
            // own target of one change) up to date on a target of its
            // change; a node whose update of settings alone waits is not.
            let on_target = |n: &NodeView| {
                let s = &n.status;
                (target.is_some() && s.target == target)
                    || (change.is_some()
                        && s.change == change
                        && s.target.is_some()
                        && s.target == s.wanted)
            };
            let updated = trusted().filter(|n| on_target(n)).count();
            let ready = trusted()
                .filter(|n| on_target(n) && n.status.phase == Phase::Ready.as_str())
                .count();
            let failed = trusted()
                .filter(|n| {
                    n.status.failed.as_ref().is_some_and(|f| {
                        (target.is_some() && Some(&f.target) == target.as_ref())
                            || (change.is_some() && f.change == change)
                    })
                })
                .count();
            let counted = trusted().count();
            TemplateView {
                template,
                target,
                generation,
                updated,
                ready,
                failed,
                pending: counted - updated,
                untrusted: nodes.len() - counted,
                nodes,
            }
        })
        .collect();
    View { templates }
}

/// A kubectl-style table: one line per template, then one per node; a
/// node's `AGE` is how long its phase has lasted, as kubectl prints ages.
pub fn table(view: &View) -> String {
    table_at(view, k8s_openapi::jiff::Timestamp::now())
}

/// [`table`], the ages taken at `now`.
pub fn table_at(view: &View, now: k8s_openapi::jiff::Timestamp) -> String {
    let mut out = String::new();
    if view.templates.is_empty() {
        out.push_str("No rollouts reported: no podstamp daemon has reported a template here.\n");
        return out;
    }
    for (i, t) in view.templates.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let total = t.nodes.len() - t.untrusted;
        let head = [
            "TEMPLATE",
            "TARGET",
            "GENERATION",
            "UPDATED",
            "READY",
            "FAILED",
            "PENDING",
            "UNTRUSTED",
        ];
        let row = [
            t.template.clone(),
            t.target.clone().unwrap_or("-".into()),
            t.generation.map_or("-".into(), |g| g.to_string()),
            format!("{}/{total}", t.updated),
            format!("{}/{total}", t.ready),
            t.failed.to_string(),
            t.pending.to_string(),
            t.untrusted.to_string(),
        ];
        columns(&mut out, &[head.map(str::to_string).to_vec(), row.to_vec()]);
        let mut rows = vec![
            [
                "  NODE",
                "REVISION",
                "TARGET",
                "PHASE",
                "AGE",
                "LAST FAILED",
                "MESSAGE",
            ]
            .map(str::to_string)
            .to_vec(),
        ];
        for n in &t.nodes {
            let s = &n.status;
            rows.push(vec![
                format!("  {}", n.node),
                s.revision.clone().unwrap_or("-".into()),
                s.target.clone().unwrap_or("-".into()),
                s.phase.clone(),
                age(&s.since, now),
                s.failed
                    .as_ref()
                    .map_or("-".into(), |f| format!("{} ({})", f.target, f.reason)),
                match &n.untrusted {
                    Some(why) => format!("UNTRUSTED: {why}"),
                    None => s.message.clone().unwrap_or_default(),
                },
            ]);
        }
        columns(&mut out, &rows);
    }
    out
}

/// How long ago the RFC 3339 time `since` was, as kubectl prints an age;
/// `-` when there is none, `?` when it is not a time.
fn age(since: &str, now: k8s_openapi::jiff::Timestamp) -> String {
    if since.is_empty() {
        return "-".into();
    }
    match since.parse::<k8s_openapi::jiff::Timestamp>() {
        // Whole seconds, cut toward zero as kubectl's are.
        Ok(then) => crate::age::human_seconds(now.duration_since(then).as_secs()),
        Err(_) => "?".into(),
    }
}

/// Left-aligned columns, three spaces apart; the last one unpadded.
fn columns(out: &mut String, rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Failed, status_name};
    use serde_json::json;

    fn lease(node: &str, templates: &[(&str, TemplateStatus)]) -> Value {
        let record = NodeStatus {
            version: 1,
            templates: templates
                .iter()
                .map(|(id, s)| (id.to_string(), Box::new(s.clone())))
                .collect(),
        };
        json!({"metadata": {"name": status_name(node),
            "labels": {ROLE_LABEL: ROLE_STATUS},
            "annotations": {STATUS_ANNOTATION: record.to_json()}},
            "spec": {"holderIdentity": node}})
    }

    fn status(target: &str, wanted: &str, generation: i64, phase: Phase) -> TemplateStatus {
        TemplateStatus {
            revision: Some(format!("rev-{target}")),
            target: Some(target.into()),
            wanted: Some(wanted.into()),
            generation: Some(generation),
            phase: phase.as_str().into(),
            since: format!("2026-12-03T10:00:0{generation}Z"),
            ..TemplateStatus::default()
        }
    }

    #[test]
    fn sums_up_a_rollout_half_way() {
        let mut failed = status("t1", "t2", 2, Phase::Halted);
        failed.message = Some("target t2 failed on node n2".into());
        let mut n2 = status("t1", "t2", 2, Phase::Written);
        n2.failed = Some(Failed {
            target: "t2".into(),
            reason: "CrashLoopBackOff".into(),
            ..Failed::default()
        });
        let leases = vec![
            lease("n1", &[("ns/web", status("t2", "t2", 2, Phase::Ready))]),
            lease(
                "n2",
                &[
                    ("ns/web", n2),
                    ("other/x", status("a", "a", 1, Phase::Ready)),
                ],
            ),
            lease("n3", &[("ns/web", failed)]),
            json!({"metadata": {"name": "unrelated"}}),
        ];
        let view = from_leases(&leases, "ns", None);
        assert_eq!(view.templates.len(), 1);
        let t = &view.templates[0];
        assert_eq!(
            (t.target.as_deref(), t.updated, t.ready, t.failed, t.pending),
            (Some("t2"), 1, 1, 1, 2)
        );
        let text = table(&view);
        assert!(text.starts_with("TEMPLATE"), "{text}");
        // Each node's phase began at 10:00:0<generation>: its age, as
        // kubectl prints one, in the AGE column.
        let now: k8s_openapi::jiff::Timestamp = "2026-12-03T12:03:04Z".parse().unwrap();
        let age_of = |text: &str, node: &str| -> String {
            let head = text.lines().find(|l| l.starts_with("  NODE")).unwrap();
            let at = head.find("   AGE").unwrap() + 3;
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("  {node} ")))
                .unwrap();
            row[at..].split_whitespace().next().unwrap().to_string()
        };
        let aged = table_at(&view, now);
        assert_eq!(age_of(&aged, "n1"), "123m", "{aged}");
        let mut young = view.clone();
        for n in &mut young.templates[0].nodes {
            n.status.since = match n.node.as_str() {
                "n1" => "2026-12-03T12:00:02Z".into(),
                "n2" => "not a time".into(),
                _ => String::new(),
            };
        }
        let young = table_at(&young, now);
        assert_eq!(age_of(&young, "n1"), "3m2s", "{young}");
        assert_eq!(age_of(&young, "n2"), "?", "{young}");
        assert_eq!(age_of(&young, "n3"), "-", "{young}");
        let only = from_leases(&leases, "ns", Some("other/x"));
        assert_eq!(only.templates[0].template, "other/x");
        assert!(table(&from_leases(&[], "ns", None)).contains("No rollouts"));
    }

    /// A template with a node selector counts the nodes it selects: a node
    /// that never reported it is pending, a record of a node it is not
    /// for is left out; a template without one counts what reported.
    #[test]
    fn a_selector_counts_the_nodes_it_selects_and_lists_the_silent_ones() {
        let leases = vec![
            lease(
                "cp1",
                &[
                    ("ns/api", status("t1", "t1", 1, Phase::Ready)),
                    ("ns/web", status("w", "w", 1, Phase::Ready)),
                ],
            ),
            // Relabelled: its daemon has not forgotten the template yet.
            lease("w1", &[("ns/api", status("t1", "t1", 1, Phase::Ready))]),
        ];
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let cp = labels(&[("node-role.kubernetes.io/control-plane", "")]);
        let targeting = Targeting {
            nodes: [
                ("cp1".to_string(), cp.clone()),
                ("cp2".to_string(), cp),
                ("w1".to_string(), labels(&[("zone", "a")])),
            ]
            .into(),
            selectors: [
                (
                    "ns/api".to_string(),
                    "node-role.kubernetes.io/control-plane".to_string(),
                ),
                // Never reported by any node, and for none of them.
                ("ns/gpu".to_string(), "gpu".to_string()),
                ("ns/bad".to_string(), "zone in (".to_string()),
                ("other/x".to_string(), "zone".to_string()),
            ]
            .into(),
        };
        let view = targeted(&leases, "ns", None, Some(&targeting));
        let names: Vec<&str> = view.templates.iter().map(|t| t.template.as_str()).collect();
        assert_eq!(names, ["ns/api", "ns/gpu", "ns/web"]);
        let api = &view.templates[0];
        assert_eq!((api.updated, api.ready, api.pending), (1, 1, 1), "{api:#?}");
        assert_eq!(phases_of(api), [("cp1", "ready"), ("cp2", NOT_REPORTED)]);
        assert!(
            api.nodes[1]
                .status
                .message
                .as_deref()
                .unwrap()
                .starts_with("never reported: the node's labels match podstamp.io/node-selector")
        );
        let gpu = &view.templates[1];
        assert_eq!((gpu.updated, gpu.pending, gpu.nodes.len()), (0, 0, 0));
        let web = &view.templates[2];
        assert_eq!((web.updated, web.pending, web.nodes.len()), (1, 0, 1));
        let text = table(&view);
        assert!(text.contains("1/2") && text.contains("  cp2"), "{text}");
        // Without the Nodes: as before.
        let plain = from_leases(&leases, "ns", None);
        assert_eq!(plain.templates[0].nodes.len(), 2);
    }

    fn phases_of(t: &TemplateView) -> Vec<(&str, &str)> {
        t.nodes
            .iter()
            .map(|n| (n.node.as_str(), n.status.phase.as_str()))
            .collect()
    }

    /// Per-node plugin settings: each node wants a target of its own, of
    /// one change. A node up to date on its target of the change is
    /// updated; one that waits for an update of settings alone is not.
    #[test]
    fn nodes_on_their_own_targets_of_one_change_count_as_updated() {
        let of = |target: &str, wanted: &str, phase: Phase| TemplateStatus {
            change: Some("c2".into()),
            ..status(target, wanted, 2, phase)
        };
        let mut failed = of("t1-n3", "t2-n3", Phase::Ready);
        failed.failed = Some(Failed {
            target: "t2-n3".into(),
            change: Some("c2".into()),
            ..Failed::default()
        });
        let leases = vec![
            lease("n1", &[("ns/web", of("t2-n1", "t2-n1", Phase::Ready))]),
            lease("n2", &[("ns/web", of("t2-n2", "t2-n2", Phase::Ready))]),
            lease("n3", &[("ns/web", failed)]),
            lease("n4", &[("ns/web", of("t1-n4", "t2-n4", Phase::Waiting))]),
        ];
        let t = &from_leases(&leases, "ns", None).templates[0];
        assert_eq!(
            (t.updated, t.ready, t.failed, t.pending),
            (2, 2, 1, 2),
            "{t:#?}"
        );
    }

    /// Finding 9 of the second security review: a record with generation
    /// i64::MAX, or in another node's name, was the newest revision.
    #[test]
    fn a_record_it_cannot_trust_is_shown_as_such_and_decides_nothing() {
        let honest = lease("n1", &[("ns/web", status("t2", "t2", 2, Phase::Ready))]);
        let forged_generation = lease(
            "n2",
            &[("ns/web", status("evil", "evil", i64::MAX, Phase::Ready))],
        );
        // n3 writes a record for n1 (its name, its holder), and one under
        // n1's name that it holds itself.
        let mut in_anothers_name =
            lease("n1", &[("ns/web", status("evil", "evil", 3, Phase::Ready))]);
        in_anothers_name["metadata"]["name"] = json!("podstamp-node.n3");
        let mut held_by_another =
            lease("n3", &[("ns/web", status("evil", "evil", 4, Phase::Ready))]);
        held_by_another["metadata"]["name"] = json!("podstamp-node.n1x");
        let view = from_leases(
            &[honest, forged_generation, in_anothers_name, held_by_another],
            "ns",
            None,
        );
        let t = &view.templates[0];
        assert_eq!(
            (
                t.target.as_deref(),
                t.generation,
                t.updated,
                t.ready,
                t.pending,
                t.untrusted
            ),
            (Some("t2"), Some(2), 1, 1, 0, 3),
            "{t:#?}"
        );
        let why = |node: &str| {
            t.nodes
                .iter()
                .find(|n| n.node == node)
                .and_then(|n| n.untrusted.clone())
                .unwrap_or_else(|| panic!("{node} not listed as untrusted: {t:#?}"))
        };
        assert!(why("n2").contains("claims generation 9223372036854775807 of ns/web"));
        assert!(
            why("podstamp-node.n3").contains("is held by n1, whose record is podstamp-node.n1")
        );
        assert!(why("podstamp-node.n1x").contains("is held by n3"));
        let text = table(&view);
        assert!(
            text.contains("UNTRUSTED: node n2 claims generation"),
            "{text}"
        );
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            ["ns/web", "t2", "2", "1/1", "1/1", "0", "0", "3"],
            "{text}"
        );
    }
}
