//! A template's own plugin settings: the `podstamp.io/settings` annotation.
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     podstamp.io/settings: |
//!       arch-image: {images: {arm64: registry.example/cp:arm64}}
//!       node-env: {labels: {ZONE: null}}
//! ```
//!
//! The annotation is YAML or JSON: a mapping of plugin name to settings. A
//! step's effective settings are the catalog's with the template's merged
//! over them as a JSON merge patch (RFC 7386): objects merge key by key,
//! recursively; `null` removes a key; anything else replaces.
//!
//! Invariants: an annotation only ever changes the settings of a plugin its
//! template's chain runs, never a `mandatory` plugin's (those are the
//! platform's), and never the chain itself; a bad annotation fails its own
//! template only, naming the annotation, the plugin and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::template::{ParseError, parse_document};
use crate::validate::join_key;

/// The PodTemplate annotation holding the template's settings per plugin.
pub const SETTINGS_ANNOTATION: &str = "podstamp.io/settings";

/// `metadata.annotations["podstamp.io/settings"]`.
pub fn annotation_field() -> String {
    join_key("metadata.annotations", SETTINGS_ANNOTATION)
}

/// Why a template's settings annotation cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{0}; write a mapping of plugin name to settings, in YAML or JSON")]
    Parse(ParseError),
    #[error(
        "{field}: is {found}, but it must be a mapping of plugin name to settings, e.g. `node-env: {{labels: {{ZONE: topology.kubernetes.io/zone}}}}`",
        field = annotation_field()
    )]
    NotAMapping { found: &'static str },
    #[error(
        "{field}: unknown plugin {plugin:?} (the catalog has: {known})",
        field = annotation_field()
    )]
    UnknownPlugin { plugin: String, known: String },
    #[error(
        "{field}: plugin {plugin:?} is not in this template's chain ({chain}), so its settings would never be used: remove them, or add {plugin:?} to podstamp.io/plugins",
        field = join_key(&annotation_field(), plugin)
    )]
    NotInChain { plugin: String, chain: String },
    #[error(
        "{field}: plugin {plugin:?} is mandatory: its settings are the platform's (the catalog's) and a template cannot change them; remove them from the annotation",
        field = join_key(&annotation_field(), plugin)
    )]
    Mandatory { plugin: String },
}

/// The annotation's mapping of plugin name to settings patch.
pub fn parse_annotation(text: &str) -> Result<Map<String, Value>, SettingsError> {
    match parse_document(text.as_bytes(), &annotation_field()) {
        Ok(Value::Object(map)) => Ok(map),
        // An empty annotation says nothing.
        Ok(Value::Null) => Ok(Map::new()),
        Ok(other) => Err(SettingsError::NotAMapping {
            found: kind(&other),
        }),
        Err(e) => Err(SettingsError::Parse(e)),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Applies `patch` to `target` as an RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        unreachable!("made an object above")
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value) -> Value {
        let mut target = target;
        merge_patch(&mut target, &patch);
        target
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        // The examples of RFC 7386, appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            assert_eq!(
                merged(target.clone(), patch.clone()),
                expected,
                "{target} + {patch}"
            );
        }
    }

    #[test]
    fn the_annotation_is_a_mapping_of_yaml_or_json() {
        assert_eq!(
            parse_annotation("a: {x: 1}").unwrap(),
            json!({"a": {"x": 1}}).as_object().unwrap().clone()
        );
        assert_eq!(
            parse_annotation(r#"{"a": null}"#).unwrap(),
            json!({"a": null}).as_object().unwrap().clone()
        );
        assert!(parse_annotation("").unwrap().is_empty());
        let e = parse_annotation("[a, b]").unwrap_err().to_string();
        assert!(
            e.starts_with(r#"metadata.annotations["podstamp.io/settings"]: is a list, but it must be a mapping"#),
            "{e}"
        );
        let e = parse_annotation("a: [").unwrap_err().to_string();
        assert!(
            e.starts_with(r#"metadata.annotations["podstamp.io/settings"]:2:1: did not find expected node content"#)
                && e.ends_with("write a mapping of plugin name to settings, in YAML or JSON"),
            "{e}"
        );
    }
}

/// Why a catalog entry's `settingsFile` cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SettingsFileError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML or JSON (the error names the file and the place).
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// Reads a settings file (YAML or JSON) into a JSON value.
pub fn read_settings(path: &Path) -> Result<Value, SettingsFileError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| SettingsFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_document(&bytes, &origin)?)
}
