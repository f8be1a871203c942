//! Injects facts about the node into containers as environment variables.
//!
//! Settings (all optional):
//! - `containers`: names of the containers to inject into; default all.
//! - `initContainers`: also inject into init containers (default `false`).
//! - `nodeName`: env var for the node's name (default `NODE_NAME`, `""` = none).
//! - `nodeIP`: env var for the node's first InternalIP, else its first
//!   ExternalIP (default `NODE_IP`, `""` = none). No such address is an error.
//! - `labels`: `{ ENV_VAR: label key }`; a missing label is an error.
//! - `annotations`: `{ ENV_VAR: annotation key }`; a missing annotation is an error.
//!
//! A variable that the container already has is replaced where it is; new
//! ones are appended in this order: node name, node IP, labels, annotations
//! (each map sorted by variable name).

use std::collections::BTreeMap;

use podstamp_plugin::{
    Container, ContainerKind, EnvVar, Error, Node, Plugin, Pod, containers, containers_mut,
};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Settings {
    containers: Option<Vec<String>>,
    init_containers: bool,
    node_name: Option<String>,
    #[serde(rename = "nodeIP")]
    node_ip: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

struct NodeEnv;

impl Plugin for NodeEnv {
    type Settings = Settings;
    type Pod = Pod;

    fn transform(pod: &mut Pod, node: &Node, settings: &Settings) -> Result<(), Error> {
        let kinds: &[ContainerKind] = if settings.init_containers {
            &ContainerKind::ALL
        } else {
            &[ContainerKind::Container]
        };
        if let Some(names) = &settings.containers {
            check_containers_exist(pod, kinds, names)?;
        }
        let vars = wanted_vars(node, settings);
        for &kind in kinds {
            for (i, container) in containers_mut(pod, kind).iter_mut().enumerate() {
                let selected = match &settings.containers {
                    Some(names) => names.contains(&container.name),
                    None => true,
                };
                if !selected {
                    continue;
                }
                for (name, value) in &vars {
                    let value = value
                        .as_deref()
                        .map_err(|msg| Error::at(kind.path(i).key("env"), msg.as_str()))?;
                    set_env(container, name, value);
                }
            }
        }
        Ok(())
    }
}

podstamp_plugin::export!(NodeEnv);
// What it changes: the environment of the containers (and, with
// `initContainers: true`, the init containers) it injects into.
podstamp_plugin::scope!("spec.containers[*].env", "spec.initContainers[*].env");

/// The variables to set, in order: (name, value or why there is none).
fn wanted_vars<'a>(node: &'a Node, s: &'a Settings) -> Vec<(&'a str, Result<&'a str, String>)> {
    let mut vars = Vec::new();
    let node_name = s.node_name.as_deref().unwrap_or("NODE_NAME");
    if !node_name.is_empty() {
        vars.push((node_name, Ok(node.name.as_str())));
    }
    let node_ip = s.node_ip.as_deref().unwrap_or("NODE_IP");
    if !node_ip.is_empty() {
        let ip = node
            .address("InternalIP")
            .or_else(|| node.address("ExternalIP"));
        let ip = ip.ok_or_else(|| {
            format!("the node has no InternalIP or ExternalIP address for env var {node_ip}")
        });
        vars.push((node_ip, ip));
    }
    for (var, key) in &s.labels {
        let value = node.label(key);
        let value = value.ok_or_else(|| format!("the node has no label {key:?} for env var {var}"));
        vars.push((var.as_str(), value));
    }
    for (var, key) in &s.annotations {
        let value = node.annotation(key);
        let value =
            value.ok_or_else(|| format!("the node has no annotation {key:?} for env var {var}"));
        vars.push((var.as_str(), value));
    }
    vars
}

fn check_containers_exist(
    pod: &Pod,
    kinds: &[ContainerKind],
    names: &[String],
) -> Result<(), Error> {
    let has = |kind, name: &str| containers(pod, kind).iter().any(|c| c.name == name);
    for name in names {
        if kinds.iter().any(|&kind| has(kind, name)) {
            continue;
        }
        let hint = if has(ContainerKind::Init, name) {
            " (it is an init container: set initContainers: true)"
        } else {
            ""
        };
        return Err(Error::at(
            ContainerKind::Container.list_path(),
            format!("no container named {name:?} in the pod{hint}"),
        ));
    }
    Ok(())
}

/// Sets `name` to `value`: in place if the container has it, else appended.
fn set_env(container: &mut Container, name: &str, value: &str) {
    let env = container.env.get_or_insert_default();
    let mut found = false;
    for var in env.iter_mut().filter(|v| v.name == name) {
        var.value = Some(value.to_owned());
        var.value_from = None;
        found = true;
    }
    if !found {
        env.push(EnvVar {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            value_from: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstamp_plugin::serde_json::{Value, json};

    fn node() -> Node {
        Node::new("n1")
            .with_address("Hostname", "n1.local")
            .with_address("ExternalIP", "203.0.113.7")
            .with_address("InternalIP", "10.0.0.12")
            .with_label("topology.kubernetes.io/zone", "zone-a")
            .with_annotation("rack", "r7")
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "setup"}],
                "containers": [
                    {"name": "app", "env": [{"name": "A", "value": "1"}, {"name": "NODE_NAME", "value": "old"}, {"name": "Z", "value": "2"}]},
                    {"name": "sidecar"},
                ],
            },
        })
    }

    fn run(pod: &Value, node: &Node, settings: Value) -> Result<Value, Error> {
        let out = podstamp_plugin::run::<NodeEnv>(pod.to_string(), node, &settings.to_string())?;
        Ok(podstamp_plugin::serde_json::from_str(&out).unwrap())
    }

    fn env(pod: &Value, list: &str, i: usize) -> Vec<(String, String)> {
        let env = pod["spec"][list][i]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        env.iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().into(),
                    v["value"].as_str().unwrap().into(),
                )
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn defaults_inject_name_and_ip_into_regular_containers() {
        let out = run(&pod(), &node(), json!({})).unwrap();
        assert_eq!(
            env(&out, "containers", 0),
            pairs(&[
                ("A", "1"),
                ("NODE_NAME", "n1"),
                ("Z", "2"),
                ("NODE_IP", "10.0.0.12")
            ])
        );
        assert_eq!(
            env(&out, "containers", 1),
            pairs(&[("NODE_NAME", "n1"), ("NODE_IP", "10.0.0.12")])
        );
        assert!(env(&out, "initContainers", 0).is_empty());
    }

    #[test]
    fn selected_containers_labels_and_annotations() {
        let settings = json!({
            "containers": ["sidecar", "setup"],
            "initContainers": true,
            "nodeName": "",
            "nodeIP": "HOST_IP",
            "labels": {"ZONE": "topology.kubernetes.io/zone"},
            "annotations": {"RACK": "rack"},
        });
        let out = run(&pod(), &node(), settings).unwrap();
        let want = pairs(&[("HOST_IP", "10.0.0.12"), ("ZONE", "zone-a"), ("RACK", "r7")]);
        assert_eq!(env(&out, "containers", 1), want);
        assert_eq!(env(&out, "initContainers", 0), want);
        assert_eq!(env(&out, "containers", 0).len(), 3, "app is not selected");
    }

    #[test]
    fn replacing_drops_value_from() {
        let mut pod = pod();
        pod["spec"]["containers"][1]["env"] = json!([{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]);
        let out = run(&pod, &node(), json!({"nodeIP": ""})).unwrap();
        assert_eq!(
            out["spec"]["containers"][1]["env"],
            json!([{"name": "NODE_NAME", "value": "n1"}])
        );
    }

    #[test]
    fn external_ip_when_no_internal_ip() {
        let node = Node::new("n1").with_address("ExternalIP", "203.0.113.7");
        let out = run(&pod(), &node, json!({"nodeName": ""})).unwrap();
        assert_eq!(
            env(&out, "containers", 1),
            pairs(&[("NODE_IP", "203.0.113.7")])
        );
    }

    #[test]
    fn errors() {
        let err = run(&pod(), &Node::new("n1"), json!({})).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers[0].env"));
        assert_eq!(
            err.message(),
            "the node has no InternalIP or ExternalIP address for env var NODE_IP"
        );

        let err = run(&pod(), &node(), json!({"labels": {"POOL": "pool"}})).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers[0].env"));
        assert_eq!(
            err.message(),
            r#"the node has no label "pool" for env var POOL"#
        );

        let err = run(&pod(), &node(), json!({"annotations": {"X": "x"}})).unwrap_err();
        assert_eq!(
            err.message(),
            r#"the node has no annotation "x" for env var X"#
        );

        let err = run(&pod(), &node(), json!({"containers": ["web"]})).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers"));
        assert_eq!(err.message(), r#"no container named "web" in the pod"#);

        let err = run(&pod(), &node(), json!({"containers": ["setup"]})).unwrap_err();
        assert_eq!(
            err.message(),
            r#"no container named "setup" in the pod (it is an init container: set initContainers: true)"#
        );

        let err = run(&pod(), &node(), json!({"nodeIp": "X"})).unwrap_err();
        assert!(
            err.message()
                .starts_with("invalid settings at nodeIp: unknown field"),
            "{err}"
        );
    }
}
