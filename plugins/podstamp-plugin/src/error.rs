use std::fmt;

/// Why a plugin refused to transform a pod: a message for a human and,
/// when the problem is about one field of the pod, the path of that field.
///
/// ```
/// use podstamp_plugin::{ContainerKind, Error};
///
/// let err = Error::at(ContainerKind::Container.path(0).key("image"), "no image for arm64");
/// assert_eq!(err.to_string(), "spec.containers[0].image: no image for arm64");
/// assert_eq!(Error::new("bad settings").field(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    message: String,
    field: Option<String>,
}

impl Error {
    /// An error that is not about one field of the pod.
    pub fn new(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            field: None,
        }
    }

    /// An error about one field of the pod. `field` is a path such as
    /// `spec.containers[0].image` (see [`FieldPath`]).
    pub fn at(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        Error {
            message: message.into(),
            field: (!field.is_empty()).then_some(field),
        }
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Where in the pod it went wrong, if it is about one field.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {}

/// The path of a field in the pod, as the host expects in [`Error::at`].
///
/// Syntax: object keys are joined with `.`, array indexes are in brackets,
/// and a key that is not made only of ASCII letters, digits, `-` and `_`
/// (a label key such as `app.kubernetes.io/name`, say) is written as a JSON
/// string in brackets:
///
/// ```
/// use podstamp_plugin::FieldPath;
///
/// let p = FieldPath::new().key("spec").key("containers").index(0).key("command").index(3);
/// assert_eq!(p.as_str(), "spec.containers[0].command[3]");
/// let p = FieldPath::from("metadata.labels").key("app.kubernetes.io/name");
/// assert_eq!(p.as_str(), r#"metadata.labels["app.kubernetes.io/name"]"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// The root of the pod (an empty path).
    pub fn new() -> Self {
        FieldPath(String::new())
    }

    /// This path followed by an object key.
    pub fn key(&self, key: &str) -> Self {
        let mut path = self.clone();
        path.push_key(key);
        path
    }

    /// This path followed by an array index.
    pub fn index(&self, index: usize) -> Self {
        let mut path = self.clone();
        path.push_index(index);
        path
    }

    /// Runs `f` with `key` appended to this path, then removes it again:
    /// handy for a recursive walk that only needs the path on error.
    pub fn with_key<R>(&mut self, key: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let len = self.0.len();
        self.push_key(key);
        let result = f(self);
        self.0.truncate(len);
        result
    }

    /// Runs `f` with `[index]` appended to this path, then removes it again.
    pub fn with_index<R>(&mut self, index: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        let len = self.0.len();
        self.push_index(index);
        let result = f(self);
        self.0.truncate(len);
        result
    }

    /// The path as text, e.g. `spec.containers[0].image`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the root (empty) path.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    fn push_key(&mut self, key: &str) {
        let plain = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if plain {
            if !self.0.is_empty() {
                self.0.push('.');
            }
            self.0.push_str(key);
        } else {
            self.0.push('[');
            // Serializing a string to JSON cannot fail.
            self.0
                .push_str(&serde_json::to_string(key).unwrap_or_default());
            self.0.push(']');
        }
    }

    fn push_index(&mut self, index: usize) {
        use fmt::Write;
        let _ = write!(self.0, "[{index}]");
    }
}

/// Takes `text` as an already formatted path, e.g. `"spec.containers"`.
impl From<&str> for FieldPath {
    fn from(text: &str) -> Self {
        FieldPath(text.to_owned())
    }
}

impl From<FieldPath> for String {
    fn from(path: FieldPath) -> Self {
        path.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses `json` as a `T`, or says where it failed (the field's path; `None`
/// for text after the value) and why.
///
/// Tracking the path of every field costs as much as the parse itself, so
/// it is done only after a plain parse failed: the same text fails the same
/// way, now with its path.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    json: &str,
) -> Result<T, (Option<FieldPath>, String)> {
    if let Ok(value) = serde_json::from_str(json) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| (Some(from_serde_path(e.path())), json_message(e.inner())))?;
    de.end().map_err(|e| (None, e.to_string()))?;
    Ok(value)
}

/// Converts a path tracked by `serde_path_to_error` into a [`FieldPath`].
fn from_serde_path(path: &serde_path_to_error::Path) -> FieldPath {
    use serde_path_to_error::Segment;
    let mut out = FieldPath::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_index(*index),
            Segment::Map { key } => out.push_key(key),
            Segment::Enum { variant } => out.push_key(variant),
            // A key that could not be read: the path ends at its parent.
            Segment::Unknown => break,
        }
    }
    out
}

/// `serde_json`'s message. For a value of the wrong type or shape it drops
/// the ` at line L column C` suffix, which says little next to the path of
/// the field; for a syntax error it keeps it.
pub(crate) fn json_message(err: &serde_json::Error) -> String {
    let text = err.to_string();
    if err.classify() != serde_json::error::Category::Data {
        return text;
    }
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    match text.strip_suffix(&suffix) {
        Some(message) => message.to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let root = FieldPath::new();
        assert!(root.is_root());
        assert_eq!(root.index(2).as_str(), "[2]");
        assert_eq!(root.key("a.b").as_str(), r#"["a.b"]"#);
        assert_eq!(root.key("").as_str(), r#"[""]"#);
        assert_eq!(
            root.key("metadata")
                .key("annotations")
                .key("my-key_1")
                .as_str(),
            "metadata.annotations.my-key_1"
        );
        assert_eq!(
            root.key("x").key(r#"say "hi""#).as_str(),
            r#"x["say \"hi\""]"#
        );
    }

    #[test]
    fn with_key_restores_the_path() {
        let mut path = FieldPath::from("spec");
        let inner = path.with_key("containers", |p| p.with_index(1, |p| p.to_string()));
        assert_eq!(inner, "spec.containers[1]");
        assert_eq!(path.as_str(), "spec");
    }

    #[test]
    fn errors() {
        let err = Error::at("spec.containers[0].image", "bad");
        assert_eq!(err.field(), Some("spec.containers[0].image"));
        assert_eq!(err.message(), "bad");
        assert_eq!(err.to_string(), "spec.containers[0].image: bad");
        assert_eq!(Error::at(FieldPath::new(), "root").field(), None);
        assert_eq!(Error::new("plain").to_string(), "plain");
    }
}
