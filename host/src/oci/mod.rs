//! Plugins as OCI artifacts: `podstamp plugin push|pull` and the catalog's
//! `oci:` entries.
//!
//! Invariants: a component from a registry is always named by digest
//! ([`Pinned`]) and never used before its manifest and its one layer were
//! checked against that digest ([`registry`]); once checked, it is kept on
//! disk by digest with the compiled-code cache's guarantees ([`cache`]), so
//! a node restarted while the registry is down still starts; credentials are
//! read only when a registry is contacted, and never logged.
//!
//! One concern per file: `reference` (parsing and pinning), `credentials`
//! (docker config JSON from a file or a Secret), `registry` (push, pull and
//! their checks), `fetch` (the registry protocol's requests, every body
//! capped while it is read), `cache` (the components on disk).

pub mod cache;
pub mod credentials;
pub mod error;
pub mod fetch;
pub mod options;
pub mod reference;
pub mod registry;

pub use credentials::{Credentials, CredentialsError, DockerConfig};
pub use error::OciError;
pub use options::RegistryOptions;
pub use reference::{Pinned, ReferenceError};
pub use registry::{
    MAX_MANIFEST_BYTES, PullCounts, Pulled, Registry, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE,
};
