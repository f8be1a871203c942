//! Why a push or a pull failed, one variant per thing a person can fix,
//! each message naming the registry or the reference.

use std::time::Duration;

use super::credentials::CredentialsError;
use super::reference::ReferenceError;

/// How a body passed its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// The `Content-Length` said this many bytes: refused before the body.
    Declared(u64),
    /// No `Content-Length` (or a false one): more than the cap arrived.
    Past(usize),
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Oversize::Declared(n) => write!(f, "{n} bytes by its Content-Length"),
            Oversize::Past(cap) => write!(f, "more than {cap} bytes (read up to the limit)"),
        }
    }
}

/// Why a push or a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("registry CA file {path}: {detail}")]
    Ca { path: String, detail: String },
    #[error("registry {registry} does not answer: {detail}")]
    Unreachable { registry: String, detail: String },
    #[error("registry {registry} did not finish within {timeout:?} (registry timeout)")]
    Timeout { registry: String, timeout: Duration },
    #[error(
        "registry {registry} refuses the credentials (401 Unauthorized; {credentials}): fix them, or the registry's access"
    )]
    Unauthorized {
        registry: String,
        credentials: String,
    },
    #[error("{reference}: not in the registry ({detail}): push it, or fix the digest")]
    Unknown { reference: String, detail: String },
    #[error(
        "{reference}: the manifest is {seen}, over the limit of {limit} bytes: not a component's manifest; refused"
    )]
    ManifestTooLarge {
        reference: String,
        seen: Oversize,
        limit: usize,
    },
    #[error(
        "{reference}: the layer is {seen}, over the {declared} bytes its manifest declares: the registry served other bytes; refused"
    )]
    LayerTooLarge {
        reference: String,
        seen: Oversize,
        declared: usize,
    },
    #[error(
        "{reference}: the {what}'s sha256 is {actual}, not {expected}: the registry served other bytes; refused"
    )]
    Digest {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "{reference}: not a Wasm component artifact ({detail}); push one with `podstamp plugin push`"
    )]
    NotAComponent { reference: String, detail: String },
    #[error("registry {registry}: {detail}")]
    Registry { registry: String, detail: String },
}

impl OciError {
    /// A short name of what went wrong, for the `result` label of
    /// `podstamp_oci_pulls_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            OciError::Reference(_) => "reference",
            OciError::Credentials(_) => "credentials",
            OciError::Ca { .. } => "ca",
            OciError::Unreachable { .. } => "unreachable",
            OciError::Timeout { .. } => "timeout",
            OciError::Unauthorized { .. } => "unauthorized",
            OciError::Unknown { .. } => "unknown",
            OciError::ManifestTooLarge { .. } => "manifest_too_large",
            OciError::LayerTooLarge { .. } => "layer_too_large",
            OciError::Digest { .. } => "digest_mismatch",
            OciError::NotAComponent { .. } => "not_a_component",
            OciError::Registry { .. } => "registry_error",
        }
    }
}
