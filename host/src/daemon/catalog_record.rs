//! What a node remembers of the catalog it last applied from a ConfigMap,
//! so that it can start with the API server down
//! ([`super::api_catalog`]): the record kept in the code cache, and why a
//! start from it can fail.
//!
//! Invariant: a record of another format or version is never read (the
//! daemon then waits for the API), so that a rollback of podstamp never
//! misreads a newer record.

use serde::{Deserialize, Serialize};

use crate::catalog::CatalogError;

/// The code cache record of the last catalog applied from a ConfigMap.
pub const RECORD_KEY: &str = "last-catalog";
/// [`Record::format`].
pub const RECORD_FORMAT: &str = "podstamp.io/last-catalog";
/// [`Record::version`] written and understood.
pub const RECORD_VERSION: u32 = 1;

/// The last catalog applied from the catalog ConfigMap, as kept on disk.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Always [`RECORD_FORMAT`]: says what the bytes are.
    pub format: String,
    /// [`RECORD_VERSION`]; another version is not read (the daemon then
    /// waits for the API), so that a rollback never misreads a newer record.
    pub version: u32,
    /// The catalog ConfigMap it was read from.
    pub namespace: String,
    pub config_map: String,
    /// `data.catalog.yaml` as read: plugins (with their pins) and chain.
    pub catalog: String,
    /// The digest of the catalog it loaded to, for the log.
    pub digest: String,
}

/// Why the catalog could not be had from disk at start.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "the API server does not answer ({api}), and no catalog from ConfigMap {namespace}/{name} is remembered in the code cache (none was applied on this node yet, or there is no cache): nothing is rendered (manifests on disk are kept) until the API server answers"
    )]
    NoRecord {
        api: String,
        namespace: String,
        name: String,
    },
    #[error(
        "the API server does not answer ({api}), and the remembered catalog is unusable: {detail}; nothing is rendered (manifests on disk are kept) until the API server answers"
    )]
    BadRecord { api: String, detail: String },
    #[error(
        "the API server does not answer ({api}), and the catalog cannot be loaded from disk: {source}; nothing is rendered (manifests on disk are kept) until the API server answers"
    )]
    Load {
        api: String,
        #[source]
        source: CatalogError,
    },
}
