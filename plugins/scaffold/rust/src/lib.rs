//! {{name}}: a podstamp plugin. Sets a label on the pod with the node's
//! architecture (settings: `label`, default `arch`).

use podstamp_plugin::{Error, Node, Plugin, Pod};

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Settings {
    label: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            label: "arch".into(),
        }
    }
}

struct Transform;

impl Plugin for Transform {
    type Settings = Settings;
    type Pod = Pod;

    fn transform(pod: &mut Pod, node: &Node, settings: &Settings) -> Result<(), Error> {
        if node.architecture.is_empty() {
            return Err(Error::new("the host did not say the node's architecture"));
        }
        podstamp_plugin::debug!("label {} set for node {}", settings.label, node.name);
        let labels = pod.metadata.labels.get_or_insert_default();
        labels.insert(settings.label.clone(), node.architecture.clone());
        Ok(())
    }
}

podstamp_plugin::export!(Transform);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_the_label() {
        let node = Node::new("n1").with_architecture("arm64");
        let pod = r#"{"metadata": {"name": "p"}}"#;
        let out = podstamp_plugin::run::<Transform>(pod, &node, r#"{"label": "cpu"}"#).unwrap();
        let out: podstamp_plugin::serde_json::Value =
            podstamp_plugin::serde_json::from_str(&out).unwrap();
        assert_eq!(out["metadata"]["labels"]["cpu"], "arm64");
    }

    #[test]
    fn errors() {
        let err = podstamp_plugin::run::<Transform>("{}", &Node::new("n1"), "{}").unwrap_err();
        assert_eq!(
            err.message(),
            "the host did not say the node's architecture"
        );
        let node = Node::new("n1").with_architecture("arm64");
        let err = podstamp_plugin::run::<Transform>("{}", &node, r#"{"label": 1}"#).unwrap_err();
        assert_eq!(
            err.message(),
            "invalid settings at label: invalid type: integer `1`, expected a string"
        );
    }
}
