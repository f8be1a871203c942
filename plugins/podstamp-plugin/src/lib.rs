//! The SDK for podstamp plugins.
//!
//! A podstamp plugin is a WebAssembly component that gets one pod, the node
//! it is rendered for and its own settings, and returns the changed pod. It
//! runs sandboxed: no filesystem, network, clock, environment or randomness,
//! only the host's log. This crate hides the component-model bindings: a
//! plugin implements [`Plugin`] and calls [`export!`].
//!
//! A complete plugin, which sets a label with the node's architecture:
//!
//! ```
//! use podstamp_plugin::{Error, Node, Pod, Plugin};
//!
//! #[derive(serde::Deserialize, Default)]
//! #[serde(rename_all = "camelCase", deny_unknown_fields, default)]
//! struct Settings {
//!     /// The label to set; `arch` if not configured.
//!     label: Option<String>,
//! }
//!
//! struct ArchLabel;
//!
//! impl Plugin for ArchLabel {
//!     type Settings = Settings;
//!     type Pod = Pod;
//!
//!     fn transform(pod: &mut Pod, node: &Node, settings: &Settings) -> Result<(), Error> {
//!         if node.architecture.is_empty() {
//!             return Err(Error::new("the host did not say the node's architecture"));
//!         }
//!         let key = settings.label.clone().unwrap_or_else(|| "arch".into());
//!         podstamp_plugin::debug!("setting label {key}");
//!         let labels = pod.metadata.labels.get_or_insert_default();
//!         labels.insert(key, node.architecture.clone());
//!         Ok(())
//!     }
//! }
//!
//! podstamp_plugin::export!(ArchLabel);
//!
//! // Unit tests run natively and go through the same code as the host's calls:
//! let node = Node::new("n1").with_architecture("arm64");
//! let out = podstamp_plugin::run::<ArchLabel>(r#"{"metadata":{"name":"p"}}"#, &node, "{}")?;
//! assert_eq!(out, r#"{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"arch":"arm64"},"name":"p"}}"#);
//! let err = podstamp_plugin::run::<ArchLabel>("{}", &node, r#"{"label":1}"#).unwrap_err();
//! assert_eq!(err.message(), "invalid settings at label: invalid type: integer `1`, expected a string");
//! # Ok::<(), podstamp_plugin::Error>(())
//! ```
//!
//! The plugin crate is a `cdylib`; `plugins/build.sh` builds it for
//! `wasm32-unknown-unknown` and turns it into a component.
//!
//! The pod can be seen as the typed [`Pod`], as a [`serde_json::Value`] or as
//! a [`RawPod`] (the JSON text, not parsed): choose with `type Pod`.
//! Settings are any `serde::Deserialize` type ([`NoSettings`] for none);
//! the host passes them as JSON, `{}` when none are configured.
//!
//! Errors with a field say where in the pod the problem is, as a
//! [`FieldPath`] such as `spec.containers[0].image`.
//!
//! A panic logs its message and location to the host at error level, then
//! aborts the call: the host reports a trap.

mod error;
pub mod log;
mod node;
mod pod;
mod types;

pub use error::{Error, FieldPath};
/// k8s-openapi, in the version the host uses, for plugins that want every
/// field of the pod typed (`type Pod = k8s_openapi::api::core::v1::Pod`):
/// the feature `k8s-openapi` (a component about 1 MB larger).
#[cfg(feature = "k8s-openapi")]
pub use k8s_openapi;
pub use node::{Node, NodeAddress};
pub use pod::{ContainerKind, PodDocument, RawPod, containers, containers_mut};
pub use serde_json;
pub use types::{Container, EnvVar, ObjectMeta, Other, Pod, PodSpec};

/// A podstamp plugin. See the [crate documentation](crate) for an example.
pub trait Plugin {
    /// The plugin's settings, parsed from the JSON the host passes (`{}` when
    /// none are configured). A good choice is a struct with
    /// `#[serde(rename_all = "camelCase", deny_unknown_fields, default)]`.
    type Settings: serde::de::DeserializeOwned;

    /// How the plugin sees the pod: [`Pod`], [`serde_json::Value`] or [`RawPod`].
    type Pod: PodDocument;

    /// Changes the pod for this node, or says why it cannot.
    fn transform(pod: &mut Self::Pod, node: &Node, settings: &Self::Settings) -> Result<(), Error>;

    /// Checks settings that parsed, beyond their type, when the host loads
    /// the catalog (before any render): an error refuses the catalog, its
    /// field a path inside the settings. By default, settings that parse are
    /// good. Settings that do not parse are refused before this is called.
    fn validate(settings: &Self::Settings) -> Result<(), Error> {
        let _ = settings;
        Ok(())
    }
}

/// Settings for a plugin that has none: accepts only `{}`.
#[derive(serde::Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

/// Does what the host's call does: parses the settings and the pod, runs
/// `P::transform` and writes the pod back as JSON. For unit tests.
pub fn run<P: Plugin>(
    pod: impl Into<String>,
    node: &Node,
    settings: &str,
) -> Result<String, Error> {
    let settings: P::Settings = parse_settings(settings)?;
    let pod = pod.into();
    let length = pod.len();
    let mut pod = P::Pod::from_json(pod)?;
    P::transform(&mut pod, node, &settings)?;
    pod.into_json_with_capacity(length)
}

/// Parses settings from JSON, naming the offending field on error:
/// `invalid settings at images.amd64: invalid type: integer `1`, expected a string`.
/// An empty text counts as `{}`.
pub fn parse_settings<S: serde::de::DeserializeOwned>(json: &str) -> Result<S, Error> {
    parse_settings_at(json).map_err(|(path, message)| match path {
        Some(path) => Error::new(format!("invalid settings at {path}: {message}")),
        None => Error::new(format!("invalid settings: {message}")),
    })
}

/// Does what the host's `validate-settings` call does: parses the settings
/// and runs `P::validate`. A settings error's field is its path inside the
/// settings (`images.amd64`), its message serde's.
pub fn validate_settings<P: Plugin>(settings: &str) -> Result<(), Error> {
    let settings: P::Settings =
        parse_settings_at(settings).map_err(|(path, message)| match path {
            Some(path) => Error::at(path, message),
            None => Error::new(format!("invalid settings: {message}")),
        })?;
    P::validate(&settings)
}

/// The settings, or where (None: the whole value) and why they do not parse.
fn parse_settings_at<S: serde::de::DeserializeOwned>(
    json: &str,
) -> Result<S, (Option<FieldPath>, String)> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    error::parse_json(json).map_err(|(path, message)| (path.filter(|p| !p.is_root()), message))
}

/// Exports a [`Plugin`] as the component's `transformer` interface.
///
/// Use it once, in the plugin crate's `lib.rs`: `podstamp_plugin::export!(MyPlugin);`.
/// The plugin's `info()` is the crate's package name and version.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            struct PodstampPluginExport;

            impl $crate::__private::Guest for PodstampPluginExport {
                fn info() -> $crate::__private::PluginInfo {
                    $crate::__private::info(
                        ::core::env!("CARGO_PKG_NAME"),
                        ::core::env!("CARGO_PKG_VERSION"),
                    )
                }

                fn transform(
                    pod: ::std::string::String,
                    node: $crate::__private::NodeContext,
                    settings: ::std::string::String,
                ) -> ::core::result::Result<::std::string::String, $crate::__private::PluginError>
                {
                    $crate::__private::transform::<$plugin>(pod, node, settings)
                }
            }

            impl $crate::__private::SettingsGuest for PodstampPluginExport {
                fn validate_settings(
                    settings: ::std::string::String,
                ) -> ::core::result::Result<(), $crate::__private::PluginError> {
                    $crate::__private::validate_settings::<$plugin>(settings)
                }
            }

    $crate::__export_plugin_impl!(PodstampPluginExport with_types_in $crate::bindings);
        };
    };
}

/// Compiles the examples in `plugins/README.md` as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
    });
}

#[doc(hidden)]
/// The name of the custom section a plugin's scope is declared in
/// ([`scope!`]); the host reads it from the component.
pub const SCOPE_SECTION: &str = "podstamp:scope";

/// Declares the parts of the pod this plugin changes (its scope), in the
/// syntax of a catalog entry's `scope:` (`metadata.labels`,
/// `spec.containers[*].env`, `spec.containers[web].image`). The host reads
/// the declaration from the component, shows it beside the catalog's grant
/// (`podstamp render --explain`), and names what the catalog does not grant
/// when it refuses a change. A declaration grants nothing: the catalog
/// entry's `scope:` (or the default) is what the host enforces.
///
/// `podstamp_plugin::scope!();` declares that the plugin changes nothing.
///
/// It is a custom section of the component, [`SCOPE_SECTION`]: the line
/// `podstamp-scope 1`, then one grant a line. Call it once, at the top level.
#[macro_export]
macro_rules! scope {
    ($($grant:literal),* $(,)?) => {
        const _: () = {
            const TEXT: &str = ::core::concat!("podstamp-scope 1\n", $($grant, "\n"),*);
            #[unsafe(link_section = "podstamp:scope")]
            #[used]
            static SCOPE: [u8; TEXT.len()] = $crate::__private::scope_bytes(TEXT);
        };
    };
}

pub mod __private {
    pub use crate::bindings::exports::podstamp::plugin::settings_validator::Guest as SettingsGuest;
    pub use crate::bindings::exports::podstamp::plugin::transformer::{
        Guest, NodeContext, PluginError, PluginInfo,
    };
    use crate::{Error, Node, Plugin};

    fn wit_error(e: Error) -> PluginError {
        PluginError {
            message: e.message().to_owned(),
            field: e.field().map(str::to_owned),
        }
    }

    /// `text` as an array of its bytes, for [`crate::scope!`]'s section.
    pub const fn scope_bytes<const N: usize>(text: &str) -> [u8; N] {
        let bytes = text.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = bytes[i];
            i += 1;
        }
        out
    }

    pub fn validate_settings<P: Plugin>(settings: String) -> Result<(), PluginError> {
        crate::log::install_panic_hook();
        crate::validate_settings::<P>(&settings).map_err(wit_error)
    }

    pub fn info(name: &str, version: &str) -> PluginInfo {
        crate::log::install_panic_hook();
        PluginInfo {
            name: name.into(),
            version: version.into(),
        }
    }

    pub fn transform<P: Plugin>(
        pod: String,
        node: NodeContext,
        settings: String,
    ) -> Result<String, PluginError> {
        crate::log::install_panic_hook();
        let node = Node::from(node);
        crate::run::<P>(pod, &node, &settings).map_err(wit_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(serde::Deserialize, Default, Debug)]
    #[serde(rename_all = "camelCase", deny_unknown_fields, default)]
    struct Settings {
        images: BTreeMap<String, String>,
        max_count: u32,
    }

    struct Checked;

    impl Plugin for Checked {
        type Settings = Settings;
        type Pod = serde_json::Value;

        fn transform(_: &mut Self::Pod, _: &Node, _: &Settings) -> Result<(), Error> {
            Ok(())
        }

        fn validate(settings: &Settings) -> Result<(), Error> {
            if settings.max_count > 10 {
                return Err(Error::at("maxCount", "at most 10"));
            }
            Ok(())
        }
    }

    #[test]
    fn validate_settings_names_the_field_inside_the_settings() {
        assert!(validate_settings::<Checked>("{}").is_ok());
        assert!(validate_settings::<Checked>("").is_ok());
        let err = validate_settings::<Checked>(r#"{"images":{"amd64":1}}"#).unwrap_err();
        assert_eq!(err.field(), Some("images.amd64"));
        assert_eq!(
            err.message(),
            "invalid type: integer `1`, expected a string"
        );
        let err = validate_settings::<Checked>(r#"{"maxCount":11}"#).unwrap_err();
        assert_eq!(
            (err.field(), err.message()),
            (Some("maxCount"), "at most 10")
        );
        let err = validate_settings::<Checked>("[").unwrap_err();
        assert_eq!(err.field(), None);
        assert!(err.message().starts_with("invalid settings: "), "{err}");
    }

    #[test]
    fn settings_errors_name_the_path() {
        let err = parse_settings::<Settings>(r#"{"images":{"amd64":1}}"#).unwrap_err();
        assert_eq!(
            err.message(),
            "invalid settings at images.amd64: invalid type: integer `1`, expected a string"
        );
        assert_eq!(err.field(), None);
        let err = parse_settings::<Settings>(r#"{"imagez":{}}"#).unwrap_err();
        assert!(
            err.message()
                .starts_with("invalid settings at imagez: unknown field `imagez`"),
            "{err}"
        );
        let err = parse_settings::<Settings>("[").unwrap_err();
        assert!(err.message().starts_with("invalid settings: EOF"), "{err}");
        let err = parse_settings::<Settings>("{} 1").unwrap_err();
        assert!(
            err.message().starts_with("invalid settings: trailing"),
            "{err}"
        );
    }

    #[test]
    fn empty_settings() {
        assert_eq!(parse_settings::<Settings>("").unwrap().max_count, 0);
        assert_eq!(
            parse_settings::<Settings>(r#"{"maxCount":3}"#)
                .unwrap()
                .max_count,
            3
        );
        parse_settings::<NoSettings>("{}").unwrap();
        parse_settings::<NoSettings>(" ").unwrap();
        assert!(parse_settings::<NoSettings>(r#"{"a":1}"#).is_err());
    }

    struct Rename;
    impl Plugin for Rename {
        type Settings = NoSettings;
        type Pod = serde_json::Value;
        fn transform(
            pod: &mut serde_json::Value,
            node: &Node,
            _: &NoSettings,
        ) -> Result<(), Error> {
            if node.name.is_empty() {
                return Err(Error::at("metadata.name", "no node name"));
            }
            pod["metadata"]["name"] = node.name.clone().into();
            Ok(())
        }
    }
    // `export!(Rename)` only works from another crate (the crate doc's
    // example uses it); here the test calls what it expands to.

    #[test]
    fn run_goes_through_the_plugin() {
        let out = run::<Rename>(r#"{"metadata":{"name":"x"}}"#, &Node::new("n1"), "{}").unwrap();
        assert_eq!(out, r#"{"metadata":{"name":"n1"}}"#);
        let err = run::<Rename>("{}", &Node::default(), "{}").unwrap_err();
        assert_eq!(err.field(), Some("metadata.name"));
        // Settings are checked before the pod.
        let err = run::<Rename>("not json", &Node::new("n1"), r#"{"x":1}"#).unwrap_err();
        assert!(err.message().starts_with("invalid settings"), "{err}");
    }

    #[test]
    fn the_export_maps_node_and_errors() {
        use crate::bindings::podstamp::plugin::types::NodeAddress as WitAddress;
        let node = __private::NodeContext {
            name: String::new(),
            labels: vec![("a".into(), "1".into())],
            annotations: vec![],
            addresses: vec![WitAddress {
                kind: "InternalIP".into(),
                address: "10.0.0.1".into(),
            }],
            architecture: "amd64".into(),
            operating_system: "linux".into(),
            kubelet_version: None,
        };
        let converted = Node::from(node.clone());
        assert_eq!(converted.label("a"), Some("1"));
        assert_eq!(converted.address("InternalIP"), Some("10.0.0.1"));
        let err = __private::transform::<Rename>("{}".into(), node, "{}".into()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("metadata.name"));
        assert_eq!(err.message, "no node name");
        let info = __private::info("x", "1.0");
        assert_eq!((info.name.as_str(), info.version.as_str()), ("x", "1.0"));
    }
}
