//! How podstamp reaches registries: credentials, extra CAs, the timeout.

use std::path::PathBuf;
use std::time::Duration;

use super::credentials::Credentials;

/// The default bound on one pull or push.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub credentials: Credentials,
    /// A PEM file of CA certificates trusted besides the system's.
    pub ca: Option<PathBuf>,
    pub timeout: Duration,
    /// Plain HTTP instead of HTTPS (tests of the CLI only; never the default).
    pub insecure_http: bool,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            credentials: Credentials::Anonymous,
            ca: None,
            timeout: DEFAULT_TIMEOUT,
            insecure_http: false,
        }
    }
}
