//! Where ConfigMaps come from: the API (the daemon, in
//! `daemon::api_catalog`), files given with `podstamp render --configmap`,
//! or nowhere.
//!
//! Invariants: a source serves the ConfigMaps of one namespace, the one the
//! daemon manages, and says which (errors name `namespace/name`); "does not
//! exist" (`Ok(None)`) is told apart from "cannot be read" (`Err`), so that
//! an unreadable API is never reported as a deleted plugin.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a ConfigMap could not be read (not: why it does not exist).
#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    /// This source has no ConfigMaps at all (`podstamp render` without
    /// `--configmap`, or a daemon without the API).
    #[error(
        "ConfigMap {namespace}/{name}: cannot be read here: ConfigMaps are read from the API by podstamp run, and from --configmap FILE by podstamp render"
    )]
    Unavailable { namespace: String, name: String },
    /// The API or a file failed; `detail` says how.
    #[error("ConfigMap {namespace}/{name}: cannot be read: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Where the ConfigMaps holding components (and the catalog) are read from.
/// The daemon implements it over the API; `podstamp render --configmap FILE`
/// over files; tests over a map.
pub trait ConfigMaps {
    /// The namespace every name is looked up in.
    fn namespace(&self) -> &str;
    /// The ConfigMap `name` as JSON (a v1 ConfigMap object), None when it
    /// does not exist.
    fn get(&self, name: &str) -> Result<Option<Value>, ConfigMapError>;
}

/// No ConfigMaps: every lookup says where they would come from.
pub struct NoConfigMaps {
    pub namespace: String,
}

impl ConfigMaps for NoConfigMaps {
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn get(&self, name: &str) -> Result<Option<Value>, ConfigMapError> {
        Err(ConfigMapError::Unavailable {
            namespace: self.namespace.clone(),
            name: name.to_string(),
        })
    }
}

/// A fixed set of ConfigMap objects, by name, of one namespace.
#[derive(Debug, Default, Clone)]
pub struct ConfigMapSet {
    namespace: String,
    objects: BTreeMap<String, Value>,
}

impl ConfigMapSet {
    pub fn new(namespace: &str) -> ConfigMapSet {
        ConfigMapSet {
            namespace: namespace.to_string(),
            objects: BTreeMap::new(),
        }
    }

    /// Adds a ConfigMap object (as read from a file or the API); `origin`
    /// names it in errors. Refuses what is not a v1 ConfigMap with a name,
    /// one of another namespace (the daemon would never see it), and a name
    /// given twice (which one wins would be a guess).
    pub fn insert(&mut self, object: Value, origin: &str) -> Result<(), String> {
        let kind = object.get("kind").and_then(Value::as_str);
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        if kind != Some("ConfigMap") || api_version != Some("v1") {
            return Err(format!(
                "{origin}: kind/apiVersion: is {}/{}, expected a v1 ConfigMap",
                kind.unwrap_or("none"),
                api_version.unwrap_or("none")
            ));
        }
        let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str) else {
            return Err(format!(
                "{origin}: metadata.name: missing; a ConfigMap has a name"
            ));
        };
        let name = name.to_string();
        if let Some(namespace) = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            && namespace != self.namespace
        {
            return Err(format!(
                "{origin}: ConfigMap {namespace}/{name}: metadata.namespace: is {namespace:?}, but podstamp reads ConfigMaps from namespace {:?} (its namespace): move it there or drop the field",
                self.namespace
            ));
        }
        if self.objects.contains_key(&name) {
            return Err(format!(
                "{origin}: ConfigMap {}/{name} is given twice; give each ConfigMap once",
                self.namespace
            ));
        }
        self.objects.insert(name, object);
        Ok(())
    }
}

impl ConfigMaps for ConfigMapSet {
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn get(&self, name: &str) -> Result<Option<Value>, ConfigMapError> {
        Ok(self.objects.get(name).cloned())
    }
}
