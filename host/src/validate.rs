//! Validation of pods as Kubernetes v1 Pods, with errors that name the field.
//!
//! A pod is checked three ways: it must deserialize as k8s-openapi's typed
//! `Pod` (right types everywhere), it must not carry fields the typed model
//! does not know (a typo such as `imagee` would otherwise vanish silently:
//! the kubelet's decoder drops it), and it must pass the rules the kubelet
//! applies before it runs a static pod file that a template author can
//! plausibly get wrong: names, labels, node selectors, containers and their
//! images, environment variable names, the few enumerated policies, volume
//! names and mounts, and references to API objects, which a static pod may
//! not have. These come first, with podstamp's own messages; every rule of
//! the kubelet's, these and the rest (ports, probes, resources, security
//! contexts, ...), is then applied by the kubelet's own code to the
//! manifest's bytes ([`crate::kube_check`], docs/daemon.md "What the kubelet
//! refuses"). None of these rules refuses what the kubelet accepts
//! (tests/fuzz.rs and tests/kubecheck.rs compare the verdicts), but for the
//! schema: an unknown field or a wrong type, which the kubelet's decoder
//! drops or refuses in its own words.

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
    check_spec(pod, &mut errors);
    check_containers(pod, &mut errors);
    check_volumes(pod, &mut errors);
    check_api_references(pod, &mut errors);
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
    check_labels(pod, "/metadata/labels", "metadata.labels", errors);
    if let Some(Value::Object(annotations)) = pod.pointer("/metadata/annotations") {
        const MAX_TOTAL: usize = 256 * 1024;
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.as_str().map_or(0, str::len);
            // Kubernetes checks an annotation key lowercased (case does not
            // matter in it, `ValidateAnnotations`); a label key as it is.
            if let Err(msg) = check_qualified_name(&go_lowercase(key)) {
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

/// Label keys and values, as Kubernetes requires of `metadata.labels` and
/// `spec.nodeSelector` (the kubelet checks both with `ValidateLabels`).
fn check_labels(pod: &Value, pointer: &str, field: &str, errors: &mut Vec<FieldError>) {
    let Some(Value::Object(labels)) = pod.pointer(pointer) else {
        return;
    };
    for (key, value) in labels {
        let field = join_key(field, key);
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

/// The pod-level fields of the spec the kubelet checks and an author can
/// plausibly get wrong: the node selector and the enumerated policies.
fn check_spec(pod: &Value, errors: &mut Vec<FieldError>) {
    check_labels(pod, "/spec/nodeSelector", "spec.nodeSelector", errors);
    check_one_of(
        pod,
        "/spec/restartPolicy",
        "spec.restartPolicy",
        &["Always", "OnFailure", "Never"],
        errors,
    );
    check_one_of(
        pod,
        "/spec/dnsPolicy",
        "spec.dnsPolicy",
        &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        errors,
    );
}

/// An enumerated string field: absent or empty (the kubelet fills in its
/// default) or one of `allowed`, spelled exactly.
fn check_one_of(
    value: &Value,
    pointer: &str,
    field: &str,
    allowed: &[&str],
    errors: &mut Vec<FieldError>,
) {
    if let Some(Value::String(s)) = value.pointer(pointer)
        && !s.is_empty()
        && !allowed.contains(&s.as_str())
    {
        errors.push(err(
            field,
            format!(
                "{s:?} is not one of {} (spelled exactly so)",
                allowed.join(", ")
            ),
        ));
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
                // The kubelet's rule (Go's strings.TrimSpace and Rust's
                // trim agree on what whitespace is); one inside the name is
                // the image pull's to refuse, as on the kubelet.
                Some(image) if image.trim() != image => errors.push(err(
                    &format!("{path}.image"),
                    format!("{image:?} has leading or trailing whitespace; remove it"),
                )),
                Some(_) => {}
            }
            check_one_of(
                container,
                "/imagePullPolicy",
                &format!("{path}.imagePullPolicy"),
                &["Always", "Never", "IfNotPresent"],
                errors,
            );
            check_env_names(container, &path, errors);
            if let Some(Value::Array(ports)) = container.get("ports") {
                for (j, port) in ports.iter().enumerate() {
                    check_one_of(
                        port,
                        "/protocol",
                        &format!("{}.protocol", join_index(&format!("{path}.ports"), j)),
                        &["TCP", "UDP", "SCTP"],
                        errors,
                    );
                }
            }
        }
    }
}

/// Volume names (DNS-1123 labels, unique) and the mounts that use them: each
/// names a volume of the pod, at a mount path of its own (the kubelet's
/// `ValidateVolumes` and `ValidateVolumeMounts`; a misspelt volume name in a
/// mount is the usual slip).
fn check_volumes(pod: &Value, errors: &mut Vec<FieldError>) {
    let mut names = BTreeSet::new();
    if let Some(Value::Array(volumes)) = pod.pointer("/spec/volumes") {
        for (i, volume) in volumes.iter().enumerate() {
            let field = format!("{}.name", join_index("spec.volumes", i));
            let name = volume.get("name").and_then(Value::as_str).unwrap_or("");
            if let Err(msg) = check_dns_label(name) {
                errors.push(err(&field, msg));
            } else if !names.insert(name) {
                errors.push(err(&field, format!("duplicate volume name {name:?}")));
            }
        }
    }
    for list in ["initContainers", "containers"] {
        let Some(Value::Array(items)) = pod.pointer(&format!("/spec/{list}")) else {
            continue;
        };
        for (i, container) in items.iter().enumerate() {
            let Some(Value::Array(mounts)) = container.get("volumeMounts") else {
                continue;
            };
            let path = join_index(&format!("spec.{list}"), i);
            let mut paths = BTreeSet::new();
            for (j, mount) in mounts.iter().enumerate() {
                let at = join_index(&format!("{path}.volumeMounts"), j);
                let name = mount.get("name").and_then(Value::as_str).unwrap_or("");
                if !names.contains(name) {
                    errors.push(err(
                        &format!("{at}.name"),
                        format!("{name:?} names no volume in spec.volumes; add the volume or fix the name"),
                    ));
                }
                match mount.get("mountPath").and_then(Value::as_str).unwrap_or("") {
                    "" => errors.push(err(&format!("{at}.mountPath"), "must not be empty")),
                    mount_path if !paths.insert(mount_path) => errors.push(err(
                        &format!("{at}.mountPath"),
                        format!("{mount_path:?} is mounted twice in this container"),
                    )),
                    _ => {}
                }
            }
        }
    }
}

/// Environment variable names: since Kubernetes 1.34 any printable ASCII
/// but `=` (`IsRelaxedEnvVarName`); not empty.
fn check_env_names(container: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let Some(Value::Array(env)) = container.get("env") else {
        return;
    };
    for (i, var) in env.iter().enumerate() {
        let field = format!("{}.name", join_index(&format!("{path}.env"), i));
        match var.get("name").and_then(Value::as_str) {
            None | Some("") => errors.push(err(&field, "must not be empty")),
            Some(name)
                if !name
                    .bytes()
                    .all(|c| (b' '..=b'~').contains(&c) && c != b'=') =>
            {
                errors.push(err(
                    &field,
                    format!("{name:?} may only contain printable ASCII characters other than '='"),
                ))
            }
            Some(_) => {}
        }
    }
}

/// Why each kind of volume is refused in a static pod (the kubelet's
/// `HasAPIObjectReference`): the kubelet runs static pods without the API
/// server, so nothing they use may come from it.
const API_VOLUMES: &[(&str, &str)] = &[
    ("configMap", "a ConfigMap"),
    ("secret", "a Secret"),
    ("csi", "a CSIDriver"),
    ("glusterfs", "an Endpoints object"),
    ("persistentVolumeClaim", "a PersistentVolumeClaim"),
    ("ephemeral", "a PersistentVolumeClaim"),
    ("azureFile", "a Secret"),
];

/// Volume sources whose `secretRef` names a Secret (`VisitPodSecretNames`).
const SECRET_REF_VOLUMES: &[&str] = &[
    "cephfs",
    "cinder",
    "flexVolume",
    "rbd",
    "scaleIO",
    "iscsi",
    "storageOS",
];

/// A static pod may not use anything from the API server: no ServiceAccount,
/// Secret, ConfigMap, claim or volume backed by an API object. The kubelet
/// refuses the whole file for one ("static pods may not reference ...").
fn check_api_references(pod: &Value, errors: &mut Vec<FieldError>) {
    let refuse = |errors: &mut Vec<FieldError>, field: &str, what: &str| {
        errors.push(err(
            field,
            format!("a static pod may not reference {what} (the kubelet runs it without the API server); remove it, or use a hostPath volume or literal values"),
        ));
    };
    let named = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    for field in ["serviceAccountName", "serviceAccount"] {
        if named(pod.pointer(&format!("/spec/{field}"))) {
            refuse(errors, &format!("spec.{field}"), "a ServiceAccount");
        }
    }
    if let Some(Value::Array(secrets)) = pod.pointer("/spec/imagePullSecrets") {
        for (i, secret) in secrets.iter().enumerate() {
            if named(secret.get("name")) {
                refuse(errors, &join_index("spec.imagePullSecrets", i), "a Secret");
            }
        }
    }
    if pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
    {
        refuse(errors, "spec.resourceClaims", "a ResourceClaim");
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(Value::Array(items)) = pod.pointer(&format!("/spec/{list}")) else {
            continue;
        };
        for (i, container) in items.iter().enumerate() {
            let path = join_index(&format!("spec.{list}"), i);
            if let Some(Value::Array(env)) = container.get("env") {
                for (j, var) in env.iter().enumerate() {
                    for (source, what) in [
                        ("secretKeyRef", "a Secret"),
                        ("configMapKeyRef", "a ConfigMap"),
                    ] {
                        if named(var.pointer(&format!("/valueFrom/{source}/name"))) {
                            let field = format!(
                                "{}.valueFrom.{source}",
                                join_index(&format!("{path}.env"), j)
                            );
                            refuse(errors, &field, what);
                        }
                    }
                }
            }
            if let Some(Value::Array(env_from)) = container.get("envFrom") {
                for (j, source) in env_from.iter().enumerate() {
                    for (kind, what) in [("secretRef", "a Secret"), ("configMapRef", "a ConfigMap")]
                    {
                        if named(source.pointer(&format!("/{kind}/name"))) {
                            let field =
                                format!("{}.{kind}", join_index(&format!("{path}.envFrom"), j));
                            refuse(errors, &field, what);
                        }
                    }
                }
            }
        }
    }
    let Some(Value::Array(volumes)) = pod.pointer("/spec/volumes") else {
        return;
    };
    for (i, volume) in volumes.iter().enumerate() {
        let path = join_index("spec.volumes", i);
        let present = |key: &str| volume.get(key).is_some_and(|v| !v.is_null());
        for (kind, what) in API_VOLUMES {
            if present(kind) {
                refuse(errors, &format!("{path}.{kind}"), what);
            }
        }
        for kind in SECRET_REF_VOLUMES {
            if named(volume.pointer(&format!("/{kind}/secretRef/name"))) {
                refuse(errors, &format!("{path}.{kind}.secretRef"), "a Secret");
            }
        }
        if let Some(Value::Array(sources)) = volume.pointer("/projected/sources") {
            for (j, source) in sources.iter().enumerate() {
                let Some(source) = source.as_object() else {
                    continue;
                };
                for (kind, value) in source {
                    // Only the downward API comes from the pod itself.
                    if kind != "downwardAPI" && !value.is_null() {
                        let field = format!(
                            "{}.{kind}",
                            join_index(&format!("{path}.projected.sources"), j)
                        );
                        refuse(errors, &field, &format!("API objects ({kind})"));
                    }
                }
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

/// `s` lowercased as Go's `strings.ToLower` does it, one character for one
/// (Unicode's simple mapping): Rust's `to_lowercase` maps U+0130 (İ) to
/// two characters, Go to `i`; every other character maps to one either way.
fn go_lowercase(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{130}' => 'i',
            c => c.to_lowercase().next().unwrap_or(c),
        })
        .collect()
}

/// A label or annotation key: an optional DNS subdomain prefix and a name.
pub fn check_qualified_name(key: &str) -> Result<(), String> {
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

/// A label value (empty, or up to 63 letters, digits, `-`, `_`, `.`,
/// starting and ending with a letter or digit), as Kubernetes requires.
pub fn check_label_value(value: &str) -> Result<(), String> {
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
    fn an_annotation_key_is_checked_lowercased_and_a_label_key_as_it_is() {
        // As Kubernetes' ValidateAnnotations: the kubelet ran a manifest
        // with the annotation `Y/Q` that podstamp refused (tests/fuzz.rs).
        let mut p = pod();
        p["metadata"]["annotations"] =
            json!({"Y/Q": "x", "Example.COM/Key": "y", "\u{212a}": "kelvin"});
        validate_pod(&p).unwrap();
        p["metadata"]["annotations"] = json!({"a_b/c": "x"});
        assert_eq!(
            fields(validate_pod(&p)),
            [r#"metadata.annotations["a_b/c"]"#]
        );
        let mut p = pod();
        p["metadata"]["labels"] = json!({"Y/Q": "x"});
        assert_eq!(fields(validate_pod(&p)), [r#"metadata.labels["Y/Q"]"#]);
        assert_eq!(go_lowercase("\u{130}K\u{212a}"), "ikk");
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
            json!([{"name": "a", "image": ""}, {"name": "a", "image": "x "}, {"image": "z y"}]);
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
        // Whitespace inside a name is the image pull's to refuse, as on the kubelet.
        assert!(
            e.0[3].message.contains("leading or trailing whitespace"),
            "{}",
            e.0[3]
        );
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
    fn node_selectors_are_checked_as_labels() {
        let mut p = pod();
        p["spec"]["nodeSelector"] =
            json!({"disk": "a\u{2028}b", "zone": "a", "bad key": "x", "nel": "a\u{85}b"});
        let e = validate_pod(&p).unwrap_err();
        assert_eq!(
            e.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            [
                r#"spec.nodeSelector["bad key"]"#,
                "spec.nodeSelector.disk",
                "spec.nodeSelector.nel"
            ]
        );
        assert_eq!(
            e.0[1].to_string(),
            r#"spec.nodeSelector.disk: value "a\u{2028}b": may only contain letters, digits, '-', '_' and '.'"#
        );
    }

    #[test]
    fn policies_and_env_names_are_spelled_as_the_kubelet_takes_them() {
        let mut p = pod();
        p["spec"]["restartPolicy"] = json!("always");
        p["spec"]["dnsPolicy"] = json!("");
        p["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
        p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "protocol": "tcp"}]);
        p["spec"]["containers"][0]["env"] = json!([
            {"name": "A B.c-1", "value": "ok"}, {"name": "A=B"}, {"name": "É"}, {"name": ""}
        ]);
        assert_eq!(
            fields(validate_pod(&p)),
            [
                "spec.restartPolicy",
                "spec.containers[0].env[1].name",
                "spec.containers[0].env[2].name",
                "spec.containers[0].env[3].name",
                "spec.containers[0].ports[0].protocol"
            ]
        );
    }

    #[test]
    fn volume_names_and_mounts_are_checked() {
        let mut p = pod();
        p["spec"]["volumes"] = json!([
            {"name": "etc", "hostPath": {"path": "/etc"}},
            {"name": "etc", "emptyDir": {}},
            {"name": "My_Vol", "emptyDir": {}}
        ]);
        p["spec"]["containers"][0]["volumeMounts"] = json!([
            {"name": "etc", "mountPath": "/etc/x"},
            {"name": "ect", "mountPath": "/etc/y"},
            {"name": "etc", "mountPath": "/etc/x"}
        ]);
        assert_eq!(
            fields(validate_pod(&p)),
            [
                "spec.volumes[1].name",
                "spec.volumes[2].name",
                "spec.containers[0].volumeMounts[1].name",
                "spec.containers[0].volumeMounts[2].mountPath"
            ]
        );
    }

    #[test]
    fn references_to_api_objects_are_refused() {
        let mut p = pod();
        p["spec"]["serviceAccountName"] = json!("default");
        p["spec"]["imagePullSecrets"] = json!([{"name": "registry"}]);
        p["spec"]["containers"][0]["env"] = json!([
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        ]);
        p["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "c"}}]);
        p["spec"]["volumes"] = json!([
            {"name": "a", "hostPath": {"path": "/etc"}},
            {"name": "b", "configMap": {"name": "c"}},
            {"name": "c", "flexVolume": {"driver": "x/y", "secretRef": {"name": "s"}}},
            {"name": "d", "projected": {"sources": [{"downwardAPI": {}}, {"serviceAccountToken": {"path": "t"}}]}},
            {"name": "e", "emptyDir": {}}
        ]);
        let e = validate_pod(&p).unwrap_err();
        assert_eq!(
            e.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            [
                "spec.serviceAccountName",
                "spec.imagePullSecrets[0]",
                "spec.containers[0].env[0].valueFrom.secretKeyRef",
                "spec.containers[0].envFrom[0].configMapRef",
                "spec.volumes[1].configMap",
                "spec.volumes[2].flexVolume.secretRef",
                "spec.volumes[3].projected.sources[1].serviceAccountToken"
            ]
        );
        assert!(
            e.0[4]
                .message
                .contains("a static pod may not reference a ConfigMap")
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
