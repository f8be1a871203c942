//! Validation of pods as Kubernetes v1 Pods, with errors that name the field.
//!
//! A pod is checked three ways: it must deserialize as k8s-openapi's typed
//! `Pod` (right types everywhere), it must not carry fields the typed model
//! does not know (a typo such as `imagee` would otherwise vanish silently),
//! and it must pass the rules the kubelet and API server apply to names,
//! labels and containers.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

/// One problem, at one place in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path such as `spec.containers[0].image`; empty for the document itself.
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Every problem found in one document, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub Vec<FieldError>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 5;
        for (i, err) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{err}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "; and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

/// Builds field paths in the one syntax podstamp uses everywhere:
/// `spec.containers[0].env[2].value`, and `metadata.labels["app.kubernetes.io/name"]`
/// for keys that are not plain identifiers.
pub fn join_key(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!("{parent}[{}]", serde_json::Value::from(key)),
    }
}

pub fn join_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// Checks `pod` as a complete v1 Pod: its schema, names, labels and containers.
pub fn validate_pod(pod: &Value) -> Result<(), Invalid> {
    check_schema(pod)?;
    check_rules(pod)
}

/// Checks the rules on names, labels and containers of a pod that has
/// already passed [`check_schema`].
pub fn check_rules(pod: &Value) -> Result<(), Invalid> {
    let mut errors = Vec::new();
    check_metadata(pod, &mut errors);
    check_containers(pod, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Invalid(errors))
    }
}

/// Checks only that `pod` has the shape of a v1 Pod: the right types and no
/// unknown fields. This is what a template must pass before the plugin
/// chain, which may still fill in images or containers.
pub fn check_schema(pod: &Value) -> Result<(), Invalid> {
    let mut errors = Vec::new();
    let Some(object) = pod.as_object() else {
        return Err(Invalid(vec![FieldError {
            field: String::new(),
            message: format!("expected a JSON object, found {}", kind_of(pod)),
        }]));
    };
    for (field, expected) in [("apiVersion", "v1"), ("kind", "Pod")] {
        match object.get(field) {
            Some(Value::String(s)) if s == expected => {}
            Some(other) => errors.push(err(field, format!("must be {expected:?}, found {other}"))),
            None => errors.push(err(field, format!("is missing (must be {expected:?})"))),
        }
    }
    // One typed pass, which also reports every field the typed model does
    // not know (it skips them as IgnoredAny). Tracking the path of every
    // field for an error costs time, so that is done only when there is one.
    let mut ignored = Vec::new();
    match serde_ignored::deserialize::<_, _, Pod>(pod, |path| ignored.push(segments(&path))) {
        Ok(_) => {
            for segments in ignored {
                // A null is no value, whatever its key (as in the API server).
                if lookup(pod, &segments).is_some_and(Value::is_null) {
                    continue;
                }
                errors.push(err(
                    &field_path(&segments),
                    "unknown field (not part of a v1 Pod; check the spelling)",
                ));
            }
        }
        Err(plain) => match serde_path_to_error::deserialize::<_, Pod>(pod) {
            Err(e) => errors.push(err(&path_of(e.path()), e.inner().to_string())),
            Ok(_) => errors.push(err("", plain.to_string())),
        },
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Invalid(errors))
    }
}

fn err(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_string(),
        message: message.into(),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn path_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        out = match segment {
            Segment::Seq { index } => join_index(&out, *index),
            Segment::Map { key } => join_key(&out, key),
            Segment::Enum { variant } => join_key(&out, variant),
            Segment::Unknown => join_key(&out, "?"),
        };
    }
    out
}

/// One step into a JSON document.
enum Segment {
    Key(String),
    Index(usize),
}

fn segments(path: &serde_ignored::Path) -> Vec<Segment> {
    use serde_ignored::Path;
    let mut out = match path {
        Path::Root => return Vec::new(),
        Path::Seq { parent, .. }
        | Path::Map { parent, .. }
        | Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segments(parent),
    };
    match path {
        Path::Seq { index, .. } => out.push(Segment::Index(*index)),
        Path::Map { key, .. } => out.push(Segment::Key(key.clone())),
        _ => {}
    }
    out
}

fn lookup<'a>(value: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    segments
        .iter()
        .try_fold(value, |value, segment| match segment {
            Segment::Key(key) => value.get(key),
            Segment::Index(index) => value.get(index),
        })
}

fn field_path(segments: &[Segment]) -> String {
    segments
        .iter()
        .fold(String::new(), |path, segment| match segment {
            Segment::Key(key) => join_key(&path, key),
            Segment::Index(index) => join_index(&path, *index),
        })
}

fn check_metadata(pod: &Value, errors: &mut Vec<FieldError>) {
    match pod.pointer("/metadata/name") {
        Some(Value::String(name)) => {
            if let Err(msg) = check_dns_subdomain(name) {
                errors.push(err("metadata.name", msg));
            }
        }
        _ => errors.push(err("metadata.name", "is missing")),
    }
    if let Some(Value::String(namespace)) = pod.pointer("/metadata/namespace")
        && let Err(msg) = check_dns_label(namespace)
    {
        errors.push(err("metadata.namespace", msg));
    }
    if let Some(Value::Object(labels)) = pod.pointer("/metadata/labels") {
        for (key, value) in labels {
            let field = join_key("metadata.labels", key);
            if let Err(msg) = check_qualified_name(key) {
                errors.push(err(&field, format!("invalid key: {msg}")));
            }
            if let Some(value) = value.as_str()
                && let Err(msg) = check_label_value(value)
            {
                errors.push(err(&field, msg));
            }
        }
    }
    if let Some(Value::Object(annotations)) = pod.pointer("/metadata/annotations") {
        const MAX_TOTAL: usize = 256 * 1024;
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.as_str().map_or(0, str::len);
            if let Err(msg) = check_qualified_name(key) {
                errors.push(err(
                    &join_key("metadata.annotations", key),
                    format!("invalid key: {msg}"),
                ));
            }
        }
        if total > MAX_TOTAL {
            errors.push(err(
                "metadata.annotations",
                format!("total size {total} bytes is over the limit of {MAX_TOTAL}"),
            ));
        }
    }
}

fn check_containers(pod: &Value, errors: &mut Vec<FieldError>) {
    let mut names = BTreeSet::new();
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(|c| c.is_empty()) {
        errors.push(err("spec.containers", "must list at least one container"));
    }
    for list in ["initContainers", "containers"] {
        let Some(items) = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for (i, container) in items.iter().enumerate() {
            let path = join_index(&format!("spec.{list}"), i);
            match container.get("name").and_then(Value::as_str) {
                None => errors.push(err(&format!("{path}.name"), "is missing")),
                Some(name) => {
                    if let Err(msg) = check_dns_label(name) {
                        errors.push(err(&format!("{path}.name"), msg));
                    } else if !names.insert(name.to_string()) {
                        errors.push(err(
                            &format!("{path}.name"),
                            format!("duplicate container name {name:?}"),
                        ));
                    }
                }
            }
            match container.get("image").and_then(Value::as_str) {
                None => errors.push(err(&format!("{path}.image"), "is missing")),
                Some("") => errors.push(err(&format!("{path}.image"), "must not be empty")),
                Some(image) if image.trim() != image || image.contains(char::is_whitespace) => {
                    errors.push(err(
                        &format!("{path}.image"),
                        format!("{image:?} contains whitespace"),
                    ))
                }
                Some(_) => {}
            }
        }
    }
}

/// RFC 1123 subdomain, as Kubernetes requires of pod names.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!(
            "is {} characters long, over the limit of 253",
            s.len()
        ));
    }
    for part in s.split('.') {
        check_label_chars(part).map_err(|why| {
            format!("{s:?} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit): {why}")
        })?;
    }
    Ok(())
}

/// RFC 1123 label, as Kubernetes requires of namespaces and container names.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!(
            "is {} characters long, over the limit of 63",
            s.len()
        ));
    }
    check_label_chars(s).map_err(|why| {
        format!("{s:?} is not a valid DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit): {why}")
    })
}

fn check_label_chars(s: &str) -> Result<(), &'static str> {
    let bytes = s.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err("empty part");
    };
    if bytes.len() > 63 {
        return Err("a part is over 63 characters");
    }
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("must start and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        return Err("has a character other than a-z, 0-9 and '-'");
    }
    Ok(())
}

/// A label or annotation key: an optional DNS subdomain prefix and a name.
fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_dns_subdomain(prefix).map_err(|e| format!("prefix {e}"))?;
    }
    if name.is_empty() || name.len() > 63 {
        return Err(format!("name part of {key:?} must be 1 to 63 characters"));
    }
    check_name_chars(name).map_err(|why| format!("{key:?}: {why}"))
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err(format!(
            "value is {} characters long, over the limit of 63",
            value.len()
        ));
    }
    check_name_chars(value).map_err(|why| format!("value {value:?}: {why}"))
}

fn check_name_chars(s: &str) -> Result<(), &'static str> {
    let bytes = s.as_bytes();
    if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err("must start and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
    {
        return Err("may only contain letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "kube-system", "labels": {"app.kubernetes.io/name": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "resources": {"requests": {"cpu": 1}}}]}
        })
    }

    fn fields(result: Result<(), Invalid>) -> Vec<String> {
        result.unwrap_err().0.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_valid_pod_passes() {
        validate_pod(&pod()).unwrap();
    }

    #[test]
    fn unknown_fields_are_named() {
        let mut p = pod();
        p["spec"]["containers"][0]["imagee"] = json!("x");
        p["metadata"]["labels"]["ok"] = json!("fine");
        p["spec"]["hostNetworking"] = json!(true);
        assert_eq!(
            fields(validate_pod(&p)),
            ["spec.containers[0].imagee", "spec.hostNetworking"]
        );
    }

    #[test]
    fn wrong_types_name_the_field() {
        let mut p = pod();
        p["spec"]["containers"][0]["args"] = json!(["a", 5]);
        let e = validate_pod(&p).unwrap_err();
        assert_eq!(e.0[0].field, "spec.containers[0].args[1]");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }

    #[test]
    fn names_containers_and_images_are_checked() {
        let mut p = pod();
        p["metadata"]["name"] = json!("Web_1");
        p["spec"]["containers"] =
            json!([{"name": "a", "image": ""}, {"name": "a", "image": "x y"}, {"image": "z"}]);
        let e = validate_pod(&p).unwrap_err();
        assert_eq!(
            e.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            [
                "metadata.name",
                "spec.containers[0].image",
                "spec.containers[1].name",
                "spec.containers[1].image",
                "spec.containers[2].name"
            ]
        );
        assert!(e.0[2].message.contains("duplicate container name"));
    }

    #[test]
    fn no_containers_is_an_error() {
        let mut p = pod();
        p["spec"]["containers"] = json!([]);
        assert_eq!(fields(validate_pod(&p)), ["spec.containers"]);
    }

    #[test]
    fn label_keys_with_dots_are_quoted_in_paths() {
        let mut p = pod();
        p["metadata"]["labels"]["example.com/tier"] = json!("-bad");
        assert_eq!(
            fields(validate_pod(&p)),
            [r#"metadata.labels["example.com/tier"]"#]
        );
    }

    #[test]
    fn dns_names() {
        assert!(check_dns_subdomain("kube-apiserver.v2").is_ok());
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a..b",
            "../etc",
            ".hidden",
            "a/b",
            &"a".repeat(254),
        ] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_dns_label("a.b").is_err());
    }
}
