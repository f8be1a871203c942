//! The source stage: PodTemplate objects and the pod each one describes.
//!
//! Templates come from files (YAML or JSON, for `render` and the directory
//! source) or from the API server; either way they end up as a [`Template`]
//! whose `pod` is the starting point of the plugin chain.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value, json};

use crate::validate::{self, FieldError, Invalid};

/// A document that could not be parsed, with where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub origin: String,
    /// 1-based line and column, when the parser knows them.
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some((line, column)) => write!(f, "{}:{line}:{column}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses one YAML or JSON document into a JSON value. JSON is read by a JSON
/// parser (a document starting with `{`), everything else as YAML.
pub fn parse_document(bytes: &[u8], origin: &str) -> Result<Value, ParseError> {
    let error = |location, message: String| ParseError {
        origin: origin.to_string(),
        location,
        message,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| error(None, format!("not UTF-8: {e}")))?;
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|e| {
            let message = e.to_string();
            // serde_json appends " at line L column C"; we print it in front.
            let message = message
                .rsplit_once(" at line ")
                .map_or(message.as_str(), |(m, _)| m)
                .to_string();
            error(Some((e.line(), e.column())), message)
        });
    }
    serde_norway::from_str(text).map_err(|e| {
        let location = e.location().map(|l| (l.line(), l.column()));
        let message = e.to_string();
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m)
            .to_string();
        error(location, message)
    })
}

/// A PodTemplate, reduced to what rendering needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub namespace: String,
    pub name: String,
    /// The PodTemplate's own annotations (a template picks its plugin chain
    /// with one of them).
    pub annotations: BTreeMap<String, String>,
    /// The pod to render (apiVersion, kind, metadata (name, labels,
    /// annotations) and spec), written as JSON: the text the first plugin of
    /// the chain receives. Kept as text, not as a parsed value: a daemon
    /// holds every selected template for as long as it runs, and a parsed
    /// pod takes four times the memory of its text in a hundred
    /// allocations (docs/performance.md §3.6), while a render needs only
    /// the text. Private, so that every template's pod has passed
    /// [`validate::check_schema`]: a passthrough render relies on it.
    pod: Box<str>,
    /// Fields of `template.metadata` that the API server accepts but that
    /// mean nothing for a static pod: dropped, and named once in a warning
    /// (see [`Template::ignored`]).
    ignored: Ignored,
    /// The SHA-256 of `pod`, hashed once when the template is read: a part
    /// of [`Template::fingerprint`], which every render of a rolled
    /// template asks for.
    pod_digest: [u8; 32],
    /// The PodTemplate's `metadata.generation` (the API server counts the
    /// changes of `template`); None in a file. Shown, never decided on.
    pub generation: Option<i64>,
}

/// What [`Template::from_value`] dropped from `template.metadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Ignored {
    /// Every dropped field but the namespace, as `template.metadata.FIELD`.
    fields: Vec<String>,
    /// `template.metadata.namespace`: worth a warning only when it differs
    /// from the namespace the manifest is written in, which only the render
    /// knows.
    namespace: Option<String>,
}

/// The ObjectMeta fields the API server accepts in `template.metadata`
/// (and fills in or keeps on the objects it returns) that a static pod
/// cannot use: the kubelet names the pod, sets its namespace, uid and
/// timestamps itself. `name` is handled apart (it must match the template's).
const IGNORED_METADATA: &[&str] = &[
    "namespace",
    "generateName",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

impl Template {
    /// The one warning about what was dropped from `template.metadata`, for a
    /// manifest written in `namespace`; `None` when there is nothing worth
    /// saying (a namespace equal to the manifest's is not).
    pub fn ignored(&self, namespace: &str) -> Option<String> {
        // Sorted, so the line is the same whatever order the object had.
        let mut fields = self.ignored.fields.clone();
        fields.sort();
        let mut why = Vec::new();
        if let Some(ns) = &self.ignored.namespace
            && ns != namespace
        {
            fields.insert(0, "template.metadata.namespace".to_string());
            why.push(format!(
                "the manifest's namespace is {namespace:?}, not {ns:?}"
            ));
        }
        if fields.is_empty() {
            return None;
        }
        if !self.ignored.fields.is_empty() {
            why.push("a static pod's metadata is set by the kubelet".to_string());
        }
        Some(format!(
            "PodTemplate {}: ignoring {} ({}); only labels and annotations are kept",
            self.id(),
            fields.join(", "),
            why.join("; ")
        ))
    }

    /// The pod to render, parsed anew from its text at each call; it has the
    /// shape of a v1 Pod (types, no unknown fields).
    pub fn pod(&self) -> Value {
        parse_pod(&self.pod)
    }

    /// The pod to render, written as JSON (what the chain's first plugin
    /// receives).
    pub fn pod_json(&self) -> &str {
        &self.pod
    }

    /// The length of the template's pod written as JSON, in bytes.
    pub fn pod_json_len(&self) -> usize {
        self.pod.len()
    }

    /// What every node reads of this template, hashed: its identity, its
    /// own annotations and its pod. The same PodTemplate gives the same
    /// fingerprint on every node (a rollout's target is made of it).
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for part in [&self.namespace, &self.name] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        // A BTreeMap and a `Value` (whose maps are sorted) serialize the
        // same way wherever they were read from.
        hash.update(serde_json::to_vec(&self.annotations).expect("strings serialize"));
        hash.update([0]);
        hash.update(self.pod_digest);
        hash.finalize().into()
    }

    /// `namespace/name`, how templates are named in logs and errors.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Reads a PodTemplate object. A missing namespace means `default`, as
    /// for kubectl.
    pub fn from_value(object: &Value) -> Result<Template, Invalid> {
        let mut errors = Vec::new();
        let fail = |field: &str, message: String| FieldError {
            field: field.to_string(),
            message,
        };
        let Some(root) = object.as_object() else {
            return Err(Invalid(vec![fail(
                "",
                "expected a PodTemplate object".into(),
            )]));
        };
        for (field, expected) in [("apiVersion", "v1"), ("kind", "PodTemplate")] {
            match root.get(field).and_then(Value::as_str) {
                Some(value) if value == expected => {}
                Some(value) => errors.push(fail(
                    field,
                    format!("must be {expected:?}, found {value:?}"),
                )),
                None => errors.push(fail(field, format!("is missing (must be {expected:?})"))),
            }
        }
        let name = match object.pointer("/metadata/name").and_then(Value::as_str) {
            Some(name) => {
                if let Err(msg) = validate::check_dns_subdomain(name) {
                    errors.push(fail("metadata.name", msg));
                }
                name.to_string()
            }
            None => {
                errors.push(fail("metadata.name", "is missing".into()));
                String::new()
            }
        };
        let namespace = match object.pointer("/metadata/namespace") {
            None | Some(Value::Null) => "default".to_string(),
            Some(Value::String(ns)) => {
                if let Err(msg) = validate::check_dns_label(ns) {
                    errors.push(fail("metadata.namespace", msg));
                }
                ns.clone()
            }
            Some(other) => {
                errors.push(fail(
                    "metadata.namespace",
                    format!("must be a string, found {other}"),
                ));
                String::new()
            }
        };
        let annotations = string_map(
            object.pointer("/metadata/annotations"),
            "metadata.annotations",
            &mut errors,
        );

        let spec = match object.pointer("/template/spec") {
            Some(spec @ Value::Object(_)) => spec.clone(),
            Some(_) => {
                errors.push(fail("template.spec", "must be an object".into()));
                Value::Null
            }
            None => {
                errors.push(fail(
                    "template.spec",
                    "is missing: a PodTemplate needs template.spec".into(),
                ));
                Value::Null
            }
        };
        let mut metadata = Map::new();
        let mut ignored = Ignored::default();
        if let Some(Value::Object(meta)) = object.pointer("/template/metadata") {
            for (key, value) in meta {
                let field = validate::join_key("template.metadata", key);
                match key.as_str() {
                    _ if value.is_null() => {}
                    "labels" | "annotations" => {
                        metadata.insert(key.clone(), value.clone());
                    }
                    "name" if value.as_str() == Some(name.as_str()) => {}
                    "name" => errors.push(fail(
                        "template.metadata.name",
                        format!("is {value}, but a rendered pod is named after its PodTemplate ({name:?}); remove it"),
                    )),
                    "namespace" => match value.as_str() {
                        Some(ns) => ignored.namespace = Some(ns.to_string()),
                        None => errors.push(fail(
                            &field,
                            format!("must be a string, found {value}"),
                        )),
                    },
                    // Dropped unread: their values are the API server's
                    // (or a copy of another object's), and one the time
                    // library cannot represent must not refuse the template.
                    _ if IGNORED_METADATA.contains(&key.as_str()) => ignored.fields.push(field),
                    // Not an ObjectMeta field: the API server would have
                    // pruned it, so in a file it is a typo worth refusing.
                    _ => errors.push(fail(
                        &field,
                        "is not a field of ObjectMeta; a static pod template keeps labels and annotations".into(),
                    )),
                }
            }
        }
        metadata.insert("name".into(), Value::String(name.clone()));
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});

        if errors.is_empty()
            && let Err(Invalid(pod_errors)) = validate::check_schema(&pod)
        {
            errors.extend(pod_errors.into_iter().map(|e| FieldError {
                field: template_field(&e.field),
                message: e.message,
            }));
        }
        if errors.is_empty() {
            let text = pod.to_string();
            let pod_digest = {
                use sha2::{Digest, Sha256};
                Sha256::digest(text.as_bytes()).into()
            };
            Ok(Template {
                namespace,
                name,
                annotations,
                generation: object
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64),
                pod_digest,
                pod: text.into_boxed_str(),
                ignored,
            })
        } else {
            Err(Invalid(errors))
        }
    }
}

/// Parses a template's pod text ([`Template::pod_json`]). It was written
/// from a `Value` by serde_json, and the schema check bounds its depth far
/// below the parser's limit: it parses.
pub(crate) fn parse_pod(text: &str) -> Value {
    serde_json::from_str(text).expect("a template's pod is JSON written by serde_json")
}

/// Where a field of the template's pod lives in the PodTemplate object.
fn template_field(pod_field: &str) -> String {
    if pod_field.starts_with("spec") || pod_field.starts_with("metadata") {
        format!("template.{pod_field}")
    } else {
        pod_field.to_string()
    }
}

fn string_map(
    value: Option<&Value>,
    field: &str,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Object(entries)) => {
            for (key, value) in entries {
                match value.as_str() {
                    Some(v) => {
                        map.insert(key.clone(), v.to_string());
                    }
                    None => errors.push(FieldError {
                        field: validate::join_key(field, key),
                        message: format!("must be a string, found {value}"),
                    }),
                }
            }
        }
        Some(other) => errors.push(FieldError {
            field: field.to_string(),
            message: format!("must be a map of strings, found {other}"),
        }),
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(yaml: &str) -> Result<Template, Invalid> {
        Template::from_value(&parse_document(yaml.as_bytes(), "t.yaml").unwrap())
    }

    #[test]
    fn builds_the_pod_from_the_template() {
        let t = template(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web, namespace: kube-system, annotations: {a: b}}\n\
             template:\n  metadata: {labels: {app: web}, creationTimestamp: null}\n  spec: {containers: [{name: web, image: nginx}]}\n",
        )
        .unwrap();
        assert_eq!(t.id(), "kube-system/web");
        assert_eq!(t.annotations["a"], "b");
        assert_eq!(
            t.pod(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
                   "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
        );
    }

    #[test]
    fn errors_name_template_fields() {
        let e = template(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\n\
             template:\n  metadata: {lables: {a: b}}\n  spec: {containers: [{name: web, image: nginx}]}\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "template.metadata.lables: is not a field of ObjectMeta; a static pod template keeps labels and annotations"
        );
        let e = template(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\ntemplate:\n  spec: {containers: [{name: web, imag: nginx}]}\n",
        )
        .unwrap_err();
        assert_eq!(e.0[0].field, "template.spec.containers[0].imag");
        let e = template("apiVersion: v1\nkind: Pod\nmetadata: {name: ../x}\n").unwrap_err();
        let fields: Vec<_> = e.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["kind", "metadata.name", "template.spec"]);
    }

    #[test]
    fn metadata_the_api_server_accepts_is_dropped_with_one_warning() {
        // What kube-apiserver returns for a PodTemplate written as in the
        // bootkube discussion, plus fields copied from another object.
        let t = template(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web, namespace: kube-system}\n\
             template:\n  metadata:\n    name: web\n    namespace: kube-system\n    labels: {app: web}\n\
             \x20   creationTimestamp: \"9999-12-31T23:59:59Z\"\n    uid: 0b3f\n    finalizers: [x/y]\n\
             \x20 spec: {containers: [{name: web, image: nginx}]}\n",
        )
        .unwrap();
        assert_eq!(
            t.pod()["metadata"],
            json!({"name": "web", "labels": {"app": "web"}})
        );
        assert_eq!(
            t.ignored("kube-system").as_deref(),
            Some(
                "PodTemplate kube-system/web: ignoring template.metadata.creationTimestamp, \
                 template.metadata.finalizers, template.metadata.uid (a static pod's metadata is \
                 set by the kubelet); only labels and annotations are kept"
            )
        );
        assert_eq!(
            t.ignored("infra").as_deref(),
            Some(
                "PodTemplate kube-system/web: ignoring template.metadata.namespace, \
                 template.metadata.creationTimestamp, template.metadata.finalizers, \
                 template.metadata.uid (the manifest's namespace is \"infra\", not \
                 \"kube-system\"; a static pod's metadata is set by the kubelet); only labels \
                 and annotations are kept"
            )
        );
        // An equal namespace alone is not worth a warning.
        let t = template(
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: web}\n\
             template:\n  metadata: {namespace: kube-system}\n  spec: {containers: [{name: web, image: nginx}]}\n",
        )
        .unwrap();
        assert_eq!(t.ignored("kube-system"), None);
        assert!(
            t.ignored("infra")
                .unwrap()
                .contains("template.metadata.namespace")
        );
    }

    #[test]
    fn parse_errors_have_line_and_column() {
        let e = parse_document(b"a: 1\nb: [\n", "x.yaml").unwrap_err();
        assert!(e.location.is_some(), "{e}");
        assert!(e.to_string().starts_with("x.yaml:"), "{e}");
        let e = parse_document(b"{\"a\": 1,\n \"b\" 2}", "x.json").unwrap_err();
        assert_eq!(e.location, Some((2, 6)));
        assert_eq!(e.to_string(), "x.json:2:6: expected `:`");
    }
}
