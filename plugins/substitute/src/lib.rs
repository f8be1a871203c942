//! Replaces placeholders in every string value of the pod (not in map keys).
//!
//! | placeholder               | value                                            |
//! |---------------------------|--------------------------------------------------|
//! | `${node.name}`            | the node's name                                  |
//! | `${node.arch}`            | its architecture (`amd64`, `arm64`...)           |
//! | `${node.os}`              | its operating system (`linux`...)                |
//! | `${node.kubeletVersion}`  | the kubelet's version (`v1.34.2`)                |
//! | `${node.label[KEY]}`      | the value of label KEY                           |
//! | `${node.annotation[KEY]}` | the value of annotation KEY                      |
//! | `${node.address.TYPE}`    | the first address of that type, e.g. InternalIP  |
//! | `${var.NAME}`             | `vars.NAME` from the settings                    |
//!
//! `$${` stands for a literal `${`. Settings: `vars: { NAME: value }`
//! (default none). An unknown placeholder, a `${` without its `}` or a value
//! that the node or the settings do not have is an error at the string's
//! path, e.g. `spec.containers[0].command[3]` or
//! `metadata.annotations["example.com/x"]`.

//!
//! The pod is not parsed: its strings are rewritten in its JSON text
//! (`json_text`), which keeps a call about as cheap as the typed plugins'
//! on a pod whose strings are mostly plain.

mod json_text;

use std::collections::BTreeMap;

use podstamp_plugin::{Error, Node, Plugin, RawPod};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Settings {
    vars: BTreeMap<String, String>,
}

struct Substitute;

impl Plugin for Substitute {
    type Settings = Settings;
    type Pod = RawPod;

    fn transform(pod: &mut RawPod, node: &Node, settings: &Settings) -> Result<(), Error> {
        let rewritten = json_text::rewrite_strings(pod.as_str(), &mut |text| {
            if text.contains("${") {
                expand(text, node, &settings.vars).map(Some)
            } else {
                Ok(None)
            }
        })?;
        pod.0 = rewritten;
        Ok(())
    }
}

podstamp_plugin::export!(Substitute);
// What it changes: any string value of the pod that holds a placeholder
// (the catalog grants only the fields its templates fill in).
podstamp_plugin::scope!("metadata", "spec");

/// `text` with its placeholders replaced, or why it cannot be.
fn expand(text: &str, node: &Node, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let Some(end) = after.find('}') else {
                return Err(format!(
                    "unterminated placeholder {tail:?}: no closing \"}}\""
                ));
            };
            out.push_str(lookup(&after[..end], node, vars)?);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of the placeholder `${expr}`.
fn lookup<'a>(
    expr: &str,
    node: &'a Node,
    vars: &'a BTreeMap<String, String>,
) -> Result<&'a str, String> {
    let missing = |what: String| format!("{what} for placeholder \"${{{expr}}}\"");
    let inside = |prefix: &str| expr.strip_prefix(prefix)?.strip_suffix(']');
    match expr {
        "node.name" => Ok(&node.name),
        "node.arch" => Ok(&node.architecture),
        "node.os" => Ok(&node.operating_system),
        "node.kubeletVersion" => node
            .kubelet_version
            .as_deref()
            .ok_or_else(|| missing("the host does not know the kubelet's version".into())),
        _ => {
            if let Some(key) = inside("node.label[") {
                node.label(key)
                    .ok_or_else(|| missing(format!("the node has no label {key:?}")))
            } else if let Some(key) = inside("node.annotation[") {
                node.annotation(key)
                    .ok_or_else(|| missing(format!("the node has no annotation {key:?}")))
            } else if let Some(kind) = expr.strip_prefix("node.address.") {
                node.address(kind)
                    .ok_or_else(|| missing(format!("the node has no {kind} address")))
            } else if let Some(name) = expr.strip_prefix("var.") {
                vars.get(name)
                    .map(String::as_str)
                    .ok_or_else(|| missing(format!("no var {name:?} in the settings")))
            } else {
                Err(format!("unknown placeholder \"${{{expr}}}\""))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstamp_plugin::serde_json::{Value, json};

    fn node() -> Node {
        Node::new("n1")
            .with_architecture("arm64")
            .with_operating_system("linux")
            .with_kubelet_version("v1.34.2")
            .with_label("app.kubernetes.io/zone", "a")
            .with_annotation("rack", "r7")
            .with_address("InternalIP", "10.0.0.12")
            .with_address("InternalIP", "10.0.0.13")
    }

    fn run(pod: Value, node: &Node, settings: Value) -> Result<Value, Error> {
        let out = podstamp_plugin::run::<Substitute>(pod.to_string(), node, &settings.to_string())?;
        Ok(podstamp_plugin::serde_json::from_str(&out).unwrap())
    }

    fn one(text: &str) -> Result<String, String> {
        let vars = BTreeMap::from([("region".to_string(), "eu".to_string())]);
        expand(text, &node(), &vars)
    }

    #[test]
    fn placeholders() {
        assert_eq!(
            one("${node.name}-${node.arch}/${node.os}").unwrap(),
            "n1-arm64/linux"
        );
        assert_eq!(
            one("kubelet ${node.kubeletVersion}").unwrap(),
            "kubelet v1.34.2"
        );
        assert_eq!(one("${node.label[app.kubernetes.io/zone]}").unwrap(), "a");
        assert_eq!(one("${node.annotation[rack]}").unwrap(), "r7");
        assert_eq!(
            one("--ip=${node.address.InternalIP}").unwrap(),
            "--ip=10.0.0.12"
        );
        assert_eq!(one("${var.region}${var.region}").unwrap(), "eueu");
    }

    #[test]
    fn escapes_and_lone_dollars() {
        assert_eq!(
            one("$${node.name} is ${node.name}").unwrap(),
            "${node.name} is n1"
        );
        assert_eq!(one("$HOME $$ $ {x} $").unwrap(), "$HOME $$ $ {x} $");
        assert_eq!(one("$${").unwrap(), "${");
    }

    #[test]
    fn errors_quote_the_placeholder() {
        assert_eq!(
            one("${node.nam}").unwrap_err(),
            r#"unknown placeholder "${node.nam}""#
        );
        assert_eq!(
            one("a ${node.name").unwrap_err(),
            r#"unterminated placeholder "${node.name": no closing "}""#
        );
        assert_eq!(
            one("${node.label[x]}").unwrap_err(),
            r#"the node has no label "x" for placeholder "${node.label[x]}""#
        );
        assert_eq!(
            one("${node.annotation[y]}").unwrap_err(),
            r#"the node has no annotation "y" for placeholder "${node.annotation[y]}""#
        );
        assert_eq!(
            one("${node.address.ExternalIP}").unwrap_err(),
            r#"the node has no ExternalIP address for placeholder "${node.address.ExternalIP}""#
        );
        assert_eq!(
            one("${var.zone}").unwrap_err(),
            r#"no var "zone" in the settings for placeholder "${var.zone}""#
        );
        let vars = BTreeMap::new();
        assert!(expand("${node.kubeletVersion}", &Node::new("n"), &vars).is_err());
    }

    #[test]
    fn every_string_value_but_not_keys() {
        let pod = json!({
            "metadata": {"name": "p", "labels": {"${node.name}": "${node.name}"}},
            "spec": {"containers": [{"command": ["run", "--node", "${node.name}", "${var.region}"], "ports": [{"containerPort": 80}]}]},
        });
        let out = run(pod, &node(), json!({"vars": {"region": "eu"}})).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"${node.name}": "n1"}));
        assert_eq!(
            out["spec"]["containers"][0]["command"],
            json!(["run", "--node", "n1", "eu"])
        );
        assert_eq!(
            out["spec"]["containers"][0]["ports"][0]["containerPort"],
            80
        );
    }

    #[test]
    fn errors_name_the_exact_path() {
        let pod = json!({"spec": {"containers": [{"command": ["a", "b", "c", "${var.x}"]}]}});
        let err = run(pod, &node(), json!({})).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers[0].command[3]"));

        let pod = json!({"metadata": {"annotations": {"foo": "${nope}"}}});
        let err = run(pod, &node(), json!({})).unwrap_err();
        assert_eq!(err.field(), Some("metadata.annotations.foo"));
        assert_eq!(err.message(), r#"unknown placeholder "${nope}""#);

        let pod = json!({"metadata": {"labels": {"app.kubernetes.io/name": "${nope}"}}});
        let err = run(pod, &node(), json!({})).unwrap_err();
        assert_eq!(
            err.field(),
            Some(r#"metadata.labels["app.kubernetes.io/name"]"#)
        );
    }

    #[test]
    fn invalid_settings() {
        let err = run(json!({}), &node(), json!({"vars": {"a": 1}})).unwrap_err();
        assert_eq!(
            err.message(),
            "invalid settings at vars.a: invalid type: integer `1`, expected a string"
        );
    }
}
