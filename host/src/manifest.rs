//! The manifest: a validated pod made into the file the kubelet reads.
//!
//! podstamp marks every manifest it writes with two annotations: where it
//! came from (`podstamp.io/source: namespace/template`) and a hash of its
//! content. The daemon manages only files that carry them, and the hash tells
//! a file podstamp wrote from one somebody edited since.
//!
//! Every manifest also carries its revision in the label
//! `podstamp.io/revision`, where the mirror pod shows it: the first
//! [`REVISION_LEN`] hex digits of the SHA-256 of the pod's YAML without the
//! label and without the hash annotation. It depends on the content alone
//! (never on a revision or hash the template carried), so the same content
//! always has the same revision, and the content hash covers the label.
//!
//! A [`Manifest`] is only ever made by reading its bytes back with the
//! reader [`ownership`] uses (the daemon's way of recognising its files at
//! start), refused unless they read back as exactly the pod it was given: a
//! file podstamp could not read back would be called foreign after a restart
//! and orphaned, or be refused by the kubelet. [`finish`] does it at once;
//! [`finish_unverified`] leaves it to [`Unverified::verify`], so that the
//! daemon pays for it only when the bytes are about to replace a file's
//! (most renders find their manifest already in place, and the read back
//! costs more than the rest of a render without plugins).

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::template::{ParseError, parse_document};
use crate::validate::{join_index, join_key};
use crate::yaml::to_yaml;

pub const SOURCE_ANNOTATION: &str = "podstamp.io/source";
pub const HASH_ANNOTATION: &str = "podstamp.io/content-hash";
pub const REVISION_LABEL: &str = "podstamp.io/revision";
/// Hex digits of a revision: short enough to read in `kubectl get pods
/// --show-labels`, long enough (40 bits) that two revisions of one
/// template do not collide in practice.
pub const REVISION_LEN: usize = 10;

/// A rendered static pod manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub pod_name: String,
    /// `namespace/name` of the PodTemplate it was rendered from.
    pub source: String,
    /// `sha256:<hex>` of the manifest with the hash annotation left out.
    pub content_hash: String,
    /// The `podstamp.io/revision` label: see the module's doc.
    pub revision: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

impl Manifest {
    /// The file name in the manifest directory. Pod names are DNS-1123
    /// subdomains (checked before this is called), so the name has no `/`,
    /// no leading dot and cannot be `.` or `..`.
    pub fn file_name(&self) -> String {
        file_name_for(&self.pod_name)
    }
}

pub fn file_name_for(pod_name: &str) -> String {
    format!("{pod_name}.yaml")
}

/// Why the YAML written for a pod does not read back as that pod. Never
/// expected: the writer is tested to round-trip every value; this is the
/// guard that keeps such a file off the disk should it ever not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("its YAML does not parse: {0}")]
    Parse(#[source] ParseError),
    #[error("its YAML reads back as a different pod (first difference at {0})")]
    Differs(String),
}

/// A manifest whose bytes were not read back yet: it can be looked at and
/// compared with what is on disk, but only [`Unverified::verify`] makes it a
/// [`Manifest`] that can be written.
#[derive(Debug, Clone)]
pub struct Unverified {
    manifest: Manifest,
    /// What the bytes must read back as: the pod with its real hash.
    pod: Value,
}

impl Unverified {
    /// The manifest, for its name, source and bytes; not to be written.
    pub fn peek(&self) -> &Manifest {
        &self.manifest
    }

    /// Reads the bytes back (see [`read_back`]).
    pub fn verify(self) -> Result<Manifest, Unreadable> {
        read_back(&self.manifest.bytes, &self.pod)?;
        Ok(self.manifest)
    }
}

/// Sets the namespace and ownership annotations on a validated `pod` and
/// writes it out. The output depends on nothing but the pod's content. Fails
/// when the output does not read back as the pod (see [`read_back`]).
pub fn finish(pod: Value, namespace: &str, source: &str) -> Result<Manifest, Unreadable> {
    finish_unverified(pod, namespace, source).verify()
}

/// [`finish`], with the read back left to [`Unverified::verify`].
pub fn finish_unverified(mut pod: Value, namespace: &str, source: &str) -> Unverified {
    let metadata = pod
        .as_object_mut()
        .expect("a validated pod is an object")
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .expect("a validated pod's metadata is an object");
    metadata.insert("namespace".into(), Value::String(namespace.to_string()));
    let pod_name = metadata
        .get("name")
        .and_then(Value::as_str)
        .expect("a validated pod has a name")
        .to_string();
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !annotations.is_object() {
        *annotations = Value::Object(Map::new());
    }
    let annotations = annotations.as_object_mut().expect("just made an object");
    annotations.insert(SOURCE_ANNOTATION.into(), Value::String(source.to_string()));
    annotations.remove(HASH_ANNOTATION);
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    labels
        .as_object_mut()
        .expect("just made an object")
        .remove(REVISION_LABEL);
    if labels.as_object().is_some_and(Map::is_empty) {
        metadata.remove("labels");
    }
    let revision = revision_of(&pod);
    let metadata = pod["metadata"]
        .as_object_mut()
        .expect("a validated pod's metadata is an object");
    metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .expect("labels are an object")
        .insert(REVISION_LABEL.into(), Value::String(revision.clone()));
    metadata["annotations"][HASH_ANNOTATION] = Value::String(HASH_PLACEHOLDER.into());

    let mut text =
        format!("# Written by podstamp from PodTemplate {source}. Edits are overwritten.\n");
    let body = text.len();
    crate::yaml::write_yaml(&mut text, &pod);
    // The hash is of the YAML without the hash annotation's line, and the
    // writer gives every scalar entry one line of its own: so the YAML is
    // written once, with a placeholder as long as the hash, and that line is
    // left out of what is hashed. Keys are written sorted, so the first such
    // line is the one under metadata.annotations (only apiVersion and kind
    // come before metadata, and annotations first within it).
    let line = format!("\n    {HASH_ANNOTATION}: {HASH_PLACEHOLDER}\n");
    let at = body
        + text[body..]
            .find(&line)
            .expect("the hash annotation is written on a line of its own")
        + 1;
    let end = at + line.len() - 1;
    let digest = Sha256::new()
        .chain_update(&text.as_bytes()[body..at])
        .chain_update(&text.as_bytes()[end..])
        .finalize();
    let content_hash = format!("sha256:{}", hex::encode(digest));
    text.replace_range(end - 1 - content_hash.len()..end - 1, &content_hash);
    // What the file must read back as: the pod with its real hash.
    pod["metadata"]["annotations"][HASH_ANNOTATION] = Value::String(content_hash.clone());
    Unverified {
        manifest: Manifest {
            pod_name,
            source: source.to_string(),
            content_hash,
            revision,
            bytes: text.into_bytes(),
        },
        pod,
    }
}

/// Checks that `bytes` read back, with the reader [`ownership`] uses, as
/// exactly `pod`. Then [`ownership`] finds the file intact too: its hash is
/// of the YAML the writer makes of that same value.
pub fn read_back(bytes: &[u8], pod: &Value) -> Result<(), Unreadable> {
    let back = parse_document(bytes, "manifest").map_err(Unreadable::Parse)?;
    match first_difference(pod, &back) {
        None => Ok(()),
        Some(path) if path.is_empty() => Err(Unreadable::Differs("the document".into())),
        Some(path) => Err(Unreadable::Differs(path)),
    }
}

/// The path of the first place where `a` and `b` differ, if any. The path
/// is formatted only for a difference: a read back that matches, what every
/// write does, walks the two trees without allocating.
fn first_difference(a: &Value, b: &Value) -> Option<String> {
    let mut steps = Vec::new();
    differs(a, b, &mut steps).then(|| {
        steps
            .iter()
            .rev()
            .fold(String::new(), |path, step| match step {
                Step::Key(key) => join_key(&path, key),
                Step::Index(i) => join_index(&path, *i),
            })
    })
}

/// One step of a path into a pod, innermost first in [`differs`]'s list.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// Do `a` and `b` differ? If so, `steps` holds where, innermost first: the
/// first key of `a` whose value differs or that `b` lacks, then the first
/// key of `b` that `a` lacks; the first differing element of arrays of one
/// length; the value itself otherwise.
fn differs<'a>(a: &'a Value, b: &'a Value, steps: &mut Vec<Step<'a>>) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let inside = match b.get(key) {
                    Some(other) => differs(value, other, steps),
                    None => true,
                };
                if inside {
                    steps.push(Step::Key(key));
                    return true;
                }
            }
            match b.keys().find(|key| !a.contains_key(*key)) {
                Some(key) => {
                    steps.push(Step::Key(key));
                    true
                }
                None => false,
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if differs(x, y, steps) {
                    steps.push(Step::Index(i));
                    return true;
                }
            }
            false
        }
        _ => a != b,
    }
}

/// Stands for the hash while the manifest is written: `sha256:` and 64 hex digits.
const HASH_PLACEHOLDER: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn hash_of(pod_without_hash: &Value) -> String {
    let digest = Sha256::digest(to_yaml(pod_without_hash).as_bytes());
    format!("sha256:{}", hex::encode(digest))
}

/// The revision of a pod without its revision label and hash annotation.
fn revision_of(pod: &Value) -> String {
    let digest = Sha256::digest(to_yaml(pod).as_bytes());
    hex::encode(digest)[..REVISION_LEN].to_string()
}

/// What a manifest file says about its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub source: String,
    /// Whether the content still matches the hash podstamp wrote.
    pub intact: bool,
}

/// Reads podstamp's annotations from a manifest file's content. None when the
/// file is not one of podstamp's (or not a pod at all).
pub fn ownership(bytes: &[u8]) -> Option<Ownership> {
    let mut pod = crate::template::parse_document(bytes, "manifest").ok()?;
    let annotations = pod.pointer_mut("/metadata/annotations")?.as_object_mut()?;
    let source = annotations.get(SOURCE_ANNOTATION)?.as_str()?.to_string();
    let recorded = annotations.remove(HASH_ANNOTATION);
    let intact = recorded.as_ref().and_then(Value::as_str) == Some(hash_of(&pod).as_str());
    Some(Ownership { source, intact })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "evil"},
               "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
    }

    /// Each kind of difference is named by its path, the outermost key
    /// first; equal trees have none.
    #[test]
    fn the_first_difference_is_named_by_its_path() {
        let a = pod();
        assert_eq!(first_difference(&a, &a.clone()), None);
        let changed = |f: &dyn Fn(&mut Value)| {
            let mut b = a.clone();
            f(&mut b);
            first_difference(&a, &b)
        };
        let path = |p: &str| Some(p.to_string());
        assert_eq!(
            changed(&|b| b["spec"]["containers"][0]["image"] = json!("evil")),
            path("spec.containers[0].image")
        );
        assert_eq!(
            changed(&|b| {
                b["metadata"].as_object_mut().unwrap().remove("namespace");
            }),
            path("metadata.namespace")
        );
        assert_eq!(
            changed(&|b| b["metadata"]["labels"] = json!({})),
            path("metadata.labels")
        );
        assert_eq!(
            changed(&|b| b["spec"]["containers"][0]["a b"] = json!(1)),
            path("spec.containers[0][\"a b\"]")
        );
        assert_eq!(
            changed(&|b| b["spec"]["containers"] = json!([])),
            path("spec.containers")
        );
        assert_eq!(changed(&|b| *b = json!([])), path(""));
    }

    #[test]
    fn namespace_is_forced_and_ownership_recorded() {
        let m = finish(pod(), "kube-system", "default/web").unwrap();
        let text = String::from_utf8(m.bytes.clone()).unwrap();
        assert!(text.contains("  namespace: kube-system\n"), "{text}");
        assert!(text.contains("podstamp.io/source: default/web\n"), "{text}");
        assert_eq!(m.file_name(), "web.yaml");
        assert_eq!(
            ownership(&m.bytes),
            Some(Ownership {
                source: "default/web".into(),
                intact: true
            })
        );
    }

    #[test]
    fn an_edit_breaks_the_hash() {
        let m = finish(pod(), "kube-system", "default/web").unwrap();
        let edited = String::from_utf8(m.bytes)
            .unwrap()
            .replace("image: nginx", "image: evil");
        assert_eq!(ownership(edited.as_bytes()).map(|o| o.intact), Some(false));
    }

    #[test]
    fn foreign_files_have_no_owner() {
        assert_eq!(
            ownership(b"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"),
            None
        );
        assert_eq!(ownership(b"\x00garbage"), None);
    }

    #[test]
    fn the_hash_is_of_the_yaml_without_the_hash_annotation() {
        // The definition ownership() checks, and manifests on disk carry.
        let mut p = pod();
        p["metadata"]["annotations"] =
            json!({"a": "1", "zz": "x\n    podstamp.io/content-hash: sha256:0"});
        p["spec"]["nodeSelector"] = json!({HASH_ANNOTATION: HASH_PLACEHOLDER});
        let m = finish(p.clone(), "kube-system", "default/web").unwrap();
        let mut expected = p;
        expected["metadata"]["namespace"] = json!("kube-system");
        expected["metadata"]["annotations"][SOURCE_ANNOTATION] = json!("default/web");
        expected["metadata"]["labels"] = json!({REVISION_LABEL: m.revision});
        assert_eq!(m.content_hash, hash_of(&expected));
        expected["metadata"]["annotations"][HASH_ANNOTATION] = json!(m.content_hash);
        let text = String::from_utf8(m.bytes).unwrap();
        let (comment, yaml) = text.split_once('\n').unwrap();
        assert!(comment.starts_with("# Written by podstamp"));
        assert_eq!(yaml, to_yaml(&expected));
    }

    #[test]
    fn bytes_that_do_not_read_back_as_the_pod_are_refused() {
        let m = finish(pod(), "kube-system", "default/web").unwrap();
        let mut meant: Value = parse_document(&m.bytes, "manifest").unwrap();
        read_back(&m.bytes, &meant).unwrap();
        let text = String::from_utf8(m.bytes).unwrap();
        // A long key once written as an implicit key: no YAML reader takes it.
        let key = "k".repeat(1100);
        meant["spec"]["nodeSelector"] = json!({ &key: "v" });
        let unparsable = format!("{text}  nodeSelector:\n    {key}: v\n");
        let e = read_back(unparsable.as_bytes(), &meant).unwrap_err();
        assert!(matches!(e, Unreadable::Parse(_)), "{e}");
        // A value the reader takes for another (an unquoted "1" is a number).
        meant["spec"]
            .as_object_mut()
            .unwrap()
            .remove("nodeSelector");
        meant["spec"]["containers"][0]["args"] = json!(["1"]);
        let changed = text.replace(
            "  - image: nginx\n",
            "  - image: nginx\n    args:\n    - 1\n",
        );
        assert_eq!(
            read_back(changed.as_bytes(), &meant).unwrap_err(),
            Unreadable::Differs("spec.containers[0].args[0]".into())
        );
    }

    #[test]
    fn output_does_not_depend_on_a_stale_hash() {
        let mut stale = pod();
        stale["metadata"]["annotations"] = json!({HASH_ANNOTATION: "sha256:old"});
        assert_eq!(
            finish(stale, "kube-system", "default/web").unwrap(),
            finish(pod(), "kube-system", "default/web").unwrap()
        );
    }

    #[test]
    fn the_revision_is_a_label_of_the_content_alone() {
        let m = finish(pod(), "kube-system", "default/web").unwrap();
        assert_eq!(m.revision.len(), REVISION_LEN);
        assert!(m.revision.bytes().all(|b| b.is_ascii_hexdigit()));
        let back: Value = parse_document(&m.bytes, "manifest").unwrap();
        assert_eq!(
            back["metadata"]["labels"][REVISION_LABEL],
            json!(m.revision)
        );
        // A stale revision in the template changes nothing.
        let mut stale = pod();
        stale["metadata"]["labels"] = json!({REVISION_LABEL: "0123456789"});
        assert_eq!(finish(stale, "kube-system", "default/web").unwrap(), m);
        // Other content, another revision; other labels are kept.
        let mut other = pod();
        other["metadata"]["labels"] = json!({"app": "web"});
        let o = finish(other, "kube-system", "default/web").unwrap();
        assert_ne!(o.revision, m.revision);
        let back: Value = parse_document(&o.bytes, "manifest").unwrap();
        assert_eq!(back["metadata"]["labels"]["app"], json!("web"));
        // The content hash covers the label: an edit of it is an edit.
        let edited = String::from_utf8(m.bytes.clone())
            .unwrap()
            .replace(&m.revision, "ffffffffff");
        assert_eq!(ownership(edited.as_bytes()).map(|o| o.intact), Some(false));
    }
}
