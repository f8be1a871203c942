//! Registry credentials: a docker config JSON (`~/.docker/config.json`, the
//! `.dockerconfigjson` key of a `kubernetes.io/dockerconfigjson` Secret),
//! read from a file or from a Secret.
//!
//! Invariants: credentials are read only when a registry is contacted (a
//! component in the disk cache needs none); they are never logged; every
//! error and every 401 names where they came from ([`Credentials`]'s
//! `Display`), so the fix is findable.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// Where the credentials for the registries come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// None: pulls and pushes are anonymous.
    #[default]
    Anonymous,
    /// A docker config JSON file.
    File(PathBuf),
    /// A `kubernetes.io/dockerconfigjson` Secret, read from the API with
    /// the daemon's kubeconfig (None: kube-rs's inference).
    Secret {
        namespace: String,
        name: String,
        kubeconfig: Option<PathBuf>,
    },
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("no credentials (anonymous)"),
            Credentials::File(path) => write!(f, "credentials from file {}", path.display()),
            Credentials::Secret {
                namespace, name, ..
            } => write!(f, "credentials from Secret {namespace}/{name}"),
        }
    }
}

/// Why the credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{from}: cannot be read: {detail}")]
    Read { from: String, detail: String },
    #[error(
        "{from}: not a docker config JSON ({detail}); expected {{\"auths\": {{\"REGISTRY\": {{\"auth\": base64(USER:PASSWORD)}}}}}}"
    )]
    Format { from: String, detail: String },
}

/// A docker config JSON: `auths` by registry.
#[derive(Debug, Default, Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl DockerConfig {
    /// Parses the JSON; `from` names it in errors.
    pub fn parse(bytes: &[u8], from: &str) -> Result<DockerConfig, CredentialsError> {
        serde_json::from_slice(bytes).map_err(|e| CredentialsError::Format {
            from: from.to_string(),
            detail: e.to_string(),
        })
    }

    /// The user and password for `registry` (`host[:port]`): the entry
    /// whose key is that host, with or without a scheme or a path (docker
    /// writes `https://index.docker.io/v1/`).
    pub fn basic(
        &self,
        registry: &str,
        from: &str,
    ) -> Result<Option<(String, String)>, CredentialsError> {
        let host = |key: &str| {
            let key = key
                .strip_prefix("https://")
                .or_else(|| key.strip_prefix("http://"))
                .unwrap_or(key);
            key.split('/').next().unwrap_or(key).to_string()
        };
        let Some(entry) = self
            .auths
            .iter()
            .find(|(key, _)| host(key) == registry)
            .map(|(_, e)| e)
        else {
            return Ok(None);
        };
        if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some((user.clone(), password.clone())));
        }
        let Some(auth) = &entry.auth else {
            return Ok(None);
        };
        let bad = |detail: String| CredentialsError::Format {
            from: from.to_string(),
            detail: format!("auths.{registry}.auth: {detail}"),
        };
        let decoded = serde_json::from_value::<k8s_openapi::ByteString>(serde_json::Value::from(
            auth.as_str(),
        ))
        .map_err(|e| bad(format!("not base64: {e}")))?
        .0;
        let text = String::from_utf8(decoded).map_err(|_| bad("not UTF-8".into()))?;
        let (user, password) = text
            .split_once(':')
            .ok_or_else(|| bad("expected base64 of USER:PASSWORD".into()))?;
        Ok(Some((user.to_string(), password.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_or_username_and_password_match_the_host() {
        let json = br#"{"auths": {"https://127.0.0.1:5000/v1/": {"auth": "dTpwOng="},
            "other.example": {"username": "a", "password": "b"}}}"#;
        let config = DockerConfig::parse(json, "test").unwrap();
        assert_eq!(
            config.basic("127.0.0.1:5000", "test").unwrap(),
            Some(("u".into(), "p:x".into()))
        );
        assert_eq!(
            config.basic("other.example", "test").unwrap(),
            Some(("a".into(), "b".into()))
        );
        assert_eq!(config.basic("127.0.0.1:5001", "test").unwrap(), None);
    }
}
