//! Picks each container's image for the node's CPU architecture.
//!
//! Settings: `images: { <container name>: { <arch>: <image> } }`, for
//! containers and init containers alike; arch names are Go's (`amd64`,
//! `arm64`, ...) as the node reports them. A container that is not listed
//! keeps its image. A listed container without an image for the node's
//! architecture, or that is not in the pod, is an error.

use std::collections::BTreeMap;

use podstamp_plugin::{
    ContainerKind, Error, FieldPath, Node, Plugin, Pod, containers, containers_mut,
};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
struct Settings {
    images: BTreeMap<String, BTreeMap<String, String>>,
}

struct ArchImage;

impl Plugin for ArchImage {
    type Settings = Settings;
    type Pod = Pod;

    /// An empty image would be refused by the kubelet on every node: refused
    /// when the catalog is loaded instead.
    fn validate(settings: &Settings) -> Result<(), Error> {
        for (container, by_arch) in &settings.images {
            for (arch, image) in by_arch {
                if image.trim().is_empty() {
                    return Err(Error::at(
                        FieldPath::new().key("images").key(container).key(arch),
                        "an empty image; give the image for this architecture, or remove the entry",
                    ));
                }
            }
        }
        Ok(())
    }

    fn transform(pod: &mut Pod, node: &Node, settings: &Settings) -> Result<(), Error> {
        for name in settings.images.keys() {
            let present = ContainerKind::ALL
                .iter()
                .any(|&kind| containers(pod, kind).iter().any(|c| &c.name == name));
            if !present {
                return Err(Error::at(
                    ContainerKind::Container.list_path(),
                    format!("no container named {name:?} in the pod (it is listed in images)"),
                ));
            }
        }
        let arch = node.architecture.as_str();
        for kind in ContainerKind::ALL {
            for (i, container) in containers_mut(pod, kind).iter_mut().enumerate() {
                let Some(by_arch) = settings.images.get(&container.name) else {
                    continue;
                };
                let Some(image) = by_arch.get(arch) else {
                    let have: Vec<&str> = by_arch.keys().map(String::as_str).collect();
                    return Err(Error::at(
                        kind.path(i).key("image"),
                        format!(
                            "no image for architecture {arch} (have {})",
                            have.join(", ")
                        ),
                    ));
                };
                container.image = Some(image.clone());
            }
        }
        Ok(())
    }
}

podstamp_plugin::export!(ArchImage);
// What it changes: the image of a container or init container listed in
// its settings, nothing else.
podstamp_plugin::scope!("spec.containers[*].image", "spec.initContainers[*].image");

#[cfg(test)]
mod tests {
    use super::*;
    use podstamp_plugin::serde_json::{Value, json};

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "setup", "image": "setup:1"}],
                "containers": [{"name": "app", "image": "app:1"}, {"name": "other", "image": "other:1"}],
            },
        })
    }

    fn settings() -> Value {
        json!({"images": {
            "app": {"amd64": "app:1-amd64", "arm64": "app:1-arm64"},
            "setup": {"arm64": "setup:1-arm64"},
        }})
    }

    fn run(node: &Node, settings: Value) -> Result<Value, Error> {
        let out =
            podstamp_plugin::run::<ArchImage>(pod().to_string(), node, &settings.to_string())?;
        Ok(podstamp_plugin::serde_json::from_str(&out).unwrap())
    }

    #[test]
    fn an_empty_image_is_refused_with_its_path_in_the_settings() {
        let bad = json!({"images": {"app": {"amd64": "app:1", "arm64": " "}}});
        let err = podstamp_plugin::validate_settings::<ArchImage>(&bad.to_string()).unwrap_err();
        assert_eq!(err.field(), Some("images.app.arm64"));
        assert!(podstamp_plugin::validate_settings::<ArchImage>(&settings().to_string()).is_ok());
    }

    #[test]
    fn picks_the_image_for_the_arch() {
        let out = run(&Node::new("n1").with_architecture("arm64"), settings()).unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "app:1-arm64");
        assert_eq!(
            out["spec"]["containers"][1]["image"], "other:1",
            "not listed"
        );
        assert_eq!(out["spec"]["initContainers"][0]["image"], "setup:1-arm64");
    }

    #[test]
    fn no_settings_changes_nothing() {
        let out = run(&Node::new("n1").with_architecture("amd64"), json!({})).unwrap();
        assert_eq!(out, pod());
    }

    #[test]
    fn missing_arch_is_an_error_at_the_image() {
        let err = run(&Node::new("n1").with_architecture("riscv64"), settings()).unwrap_err();
        assert_eq!(err.field(), Some("spec.initContainers[0].image"));
        assert_eq!(
            err.message(),
            "no image for architecture riscv64 (have arm64)"
        );

        let mut settings = settings();
        settings["images"]["setup"]["amd64"] = "setup:1-amd64".into();
        let err = run(&Node::new("n1").with_architecture("s390x"), settings).unwrap_err();
        let err2 = run(
            &Node::new("n1").with_architecture("amd64"),
            json!({"images": {"app": {"arm64": "x"}}}),
        )
        .unwrap_err();
        assert_eq!(
            err.message(),
            "no image for architecture s390x (have amd64, arm64)"
        );
        assert_eq!(err2.field(), Some("spec.containers[0].image"));
        assert_eq!(
            err2.message(),
            "no image for architecture amd64 (have arm64)"
        );
    }

    #[test]
    fn listed_container_must_exist() {
        let node = Node::new("n1").with_architecture("amd64");
        let err = run(&node, json!({"images": {"web": {"amd64": "web:1"}}})).unwrap_err();
        assert_eq!(err.field(), Some("spec.containers"));
        assert_eq!(
            err.message(),
            r#"no container named "web" in the pod (it is listed in images)"#
        );
    }

    #[test]
    fn invalid_settings() {
        let node = Node::new("n1").with_architecture("amd64");
        let err = run(&node, json!({"images": {"app": {"amd64": 1}}})).unwrap_err();
        assert_eq!(
            err.message(),
            "invalid settings at images.app.amd64: invalid type: integer `1`, expected a string"
        );
    }
}
