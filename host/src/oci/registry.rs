//! Pushing and pulling components through a registry, through [`fetch`]
//! (requests whose answers are capped while they are read, which the ORAS
//! project's `oci-client` cannot do; it still parses references).
//!
//! Invariants:
//! * a pull never returns bytes that were not checked: the manifest's
//!   sha256 is the pinned digest, it is at most [`MAX_MANIFEST_BYTES`], it
//!   holds exactly one `application/wasm` layer, and that layer's bytes
//!   (at most [`MAX_COMPONENT_BYTES`]) have the sha256 the manifest says;
//! * a pull never holds more than those caps of what a registry sends: a
//!   `Content-Length` over a cap is refused before the body, a body without
//!   one is refused at the chunk that passes the cap;
//! * every call is bounded by the configured timeout, whatever the
//!   registry does (connect, each read, and the whole pull);
//! * the layout is the CNCF TAG Runtime's Wasm OCI artifact: an OCI image
//!   manifest whose config is `application/vnd.wasm.config.v0+json` and
//!   whose one layer is the component, `application/wasm`; a push writes no
//!   timestamp, so the same component gives the same digest;
//! * every error names the registry (or the reference) and, for a 401,
//!   where the credentials came from.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::credentials::{Credentials, CredentialsError, DockerConfig};
use super::error::OciError;
use super::fetch::{self, Session};
use super::options::RegistryOptions;
use super::reference::{Pinned, parse_target};
pub use crate::catalog::gzip::MAX_COMPONENT_BYTES;

/// The config media type of a Wasm component artifact (CNCF TAG Runtime).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a Wasm component artifact (CNCF TAG Runtime).
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The largest manifest pulled: a component's manifest is well under 1 KiB;
/// this bounds what a hostile or broken registry can make us hold.
pub const MAX_MANIFEST_BYTES: usize = 64 << 10;
/// The parts of an OCI image manifest a pull reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
}

/// A component pulled and checked.
pub struct Pulled {
    pub bytes: Vec<u8>,
    /// The manifest, as pulled (its sha256 is the pin).
    pub manifest: Vec<u8>,
}

/// Pushes and pulls components.
pub struct Registry {
    options: RegistryOptions,
    pulls: Arc<PullCounts>,
}

/// How the daemon's pulls of pinned components ended, by result: `pulled`,
/// `cached` (from the disk cache, the registry not asked) or the kind of
/// failure ([`OciError::kind`]). Shared with `/metrics`.
#[derive(Debug, Default)]
pub struct PullCounts {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl PullCounts {
    pub fn add(&self, result: &'static str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(result)
            .or_default() += 1;
    }

    /// Every result seen so far, with its count, by result.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Registry {
    pub fn new(options: RegistryOptions) -> Registry {
        Registry {
            options,
            pulls: Arc::default(),
        }
    }

    /// How pulls through this registry ended (the catalog loader counts
    /// them; the daemon's `/metrics` shows them).
    pub fn pulls(&self) -> &Arc<PullCounts> {
        &self.pulls
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    /// Pushes `component` to `target` (`REGISTRY/REPO[:TAG]`) and returns
    /// the reference pinned by the manifest's digest.
    pub fn push(&self, component: &[u8], target: &str) -> Result<Pinned, OciError> {
        let reference = parse_target(target)?;
        let registry = reference.resolve_registry().to_string();
        self.block_on(&registry, async {
            let http = fetch::http_client(&self.options)?;
            let basic = self.basic(&registry).await?;
            let mut session = Session::new(
                http,
                &self.options,
                &registry,
                reference.repository(),
                basic,
            )
            .for_push();
            let shown = reference.whole();
            let layer_digest = format!("sha256:{}", sha256_hex(component));
            // No `created`: the same component gives the same digest.
            let config = serde_json::to_vec(&json!({
                "architecture": "wasm",
                "os": "wasip2",
                "layerDigests": [layer_digest],
            }))
            .expect("a JSON value serializes");
            let config_digest = format!("sha256:{}", sha256_hex(&config));
            let manifest = serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": OCI_IMAGE_MEDIA_TYPE,
                "config": {"mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config.len()},
                "layers": [{"mediaType": WASM_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": component.len()}],
            }))
            .expect("a JSON value serializes");
            session
                .push_blob(&layer_digest, component, &shown)
                .await?;
            session
                .push_blob(&config_digest, &config, &shown)
                .await?;
            // By tag when one is given (oci-client's way: `latest` else),
            // so `plugin push REPO:TAG` still moves the tag.
            let tag = reference.tag().unwrap_or("latest");
            session
                .push_manifest(tag, &manifest, OCI_IMAGE_MEDIA_TYPE, &shown)
                .await?;
            Ok(Pinned {
                registry: reference.registry().to_string(),
                repository: reference.repository().to_string(),
                digest: format!("sha256:{}", sha256_hex(&manifest)),
            })
        })
    }

    /// Pulls the component `pinned` names and checks it (see the module's
    /// invariants). Every body is read through [`fetch`], capped while it
    /// is read: the manifest at [`MAX_MANIFEST_BYTES`], the layer at the
    /// size its (checked) manifest declares.
    pub fn pull(&self, pinned: &Pinned) -> Result<Pulled, OciError> {
        let registry = pinned.registry.clone();
        self.block_on(&registry, async {
            let http = fetch::http_client(&self.options)?;
            let basic = self.basic(&registry).await?;
            let reference = pinned.reference();
            let shown = pinned.to_string();
            let mut session = Session::new(
                http,
                &self.options,
                reference.resolve_registry(),
                reference.repository(),
                basic,
            );
            let manifest = session
                .get(
                    &format!("manifests/{}", pinned.digest),
                    OCI_IMAGE_MEDIA_TYPE,
                    MAX_MANIFEST_BYTES,
                    &shown,
                )
                .await
                .map_err(|e| match e {
                    Ok(seen) => OciError::ManifestTooLarge {
                        reference: shown.clone(),
                        seen,
                        limit: MAX_MANIFEST_BYTES,
                    },
                    Err(e) => e,
                })?;
            let actual = sha256_hex(&manifest);
            if actual != pinned.hex() {
                return Err(OciError::Digest {
                    reference: shown,
                    what: "manifest",
                    expected: pinned.digest.clone(),
                    actual: format!("sha256:{actual}"),
                });
            }
            let layer = component_layer(&manifest, &shown)?;
            // The manifest is checked, so its size for the layer is the
            // pinned one (and at most MAX_COMPONENT_BYTES): a byte more is
            // not the component.
            let declared = layer.size as usize;
            let bytes = session
                .get(&format!("blobs/{}", layer.digest), "*/*", declared, &shown)
                .await
                .map_err(|e| match e {
                    Ok(seen) => OciError::LayerTooLarge {
                        reference: shown.clone(),
                        seen,
                        declared,
                    },
                    Err(e) => e,
                })?;
            let actual = format!("sha256:{}", sha256_hex(&bytes));
            if actual != layer.digest {
                return Err(OciError::Digest {
                    reference: shown,
                    what: "layer",
                    expected: layer.digest,
                    actual,
                });
            }
            Ok(Pulled { bytes, manifest })
        })
    }

    /// Runs `work` on a runtime of its own (callers are synchronous: the
    /// CLI, the catalog loader's thread), bounded by the timeout.
    fn block_on<T>(
        &self,
        registry: &str,
        work: impl Future<Output = Result<T, OciError>>,
    ) -> Result<T, OciError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| OciError::Registry {
                registry: registry.to_string(),
                detail: format!("cannot start an async runtime: {e}"),
            })?;
        let timeout = self.options.timeout;
        runtime
            .block_on(async { tokio::time::timeout(timeout, work).await })
            .unwrap_or_else(|_| {
                Err(OciError::Timeout {
                    registry: registry.to_string(),
                    timeout,
                })
            })
    }

    /// The user and password for `registry`, read now (see
    /// [`Credentials`]); None: anonymous.
    async fn basic(&self, registry: &str) -> Result<Option<(String, String)>, OciError> {
        let from = self.options.credentials.to_string();
        let json = match &self.options.credentials {
            Credentials::Anonymous => return Ok(None),
            Credentials::File(path) => std::fs::read(path).map_err(|e| CredentialsError::Read {
                from: from.clone(),
                detail: e.to_string(),
            })?,
            Credentials::Secret {
                namespace,
                name,
                kubeconfig,
            } => read_secret(namespace, name, kubeconfig.as_deref())
                .await
                .map_err(|detail| CredentialsError::Read {
                    from: from.clone(),
                    detail,
                })?,
        };
        let config = DockerConfig::parse(&json, &from)?;
        Ok(config.basic(registry, &from)?)
    }
}

/// The one `application/wasm` layer of a component's manifest.
fn component_layer(manifest: &[u8], reference: &str) -> Result<Descriptor, OciError> {
    let not = |detail: String| OciError::NotAComponent {
        reference: reference.to_string(),
        detail,
    };
    let manifest: Manifest =
        serde_json::from_slice(manifest).map_err(|e| not(format!("its manifest: {e}")))?;
    if let Some(config) = &manifest.config
        && config.media_type != WASM_CONFIG_MEDIA_TYPE
    {
        return Err(not(format!(
            "config media type {}, expected {WASM_CONFIG_MEDIA_TYPE}",
            config.media_type
        )));
    }
    let mut layers = manifest.layers.into_iter();
    match (layers.next(), layers.next()) {
        (Some(layer), None) if layer.media_type == WASM_LAYER_MEDIA_TYPE => {
            if layer.size > MAX_COMPONENT_BYTES as u64 {
                return Err(not(format!(
                    "its layer is {} bytes, over {MAX_COMPONENT_BYTES}",
                    layer.size
                )));
            }
            Ok(layer)
        }
        (Some(layer), None) => Err(not(format!(
            "layer media type {}, expected {WASM_LAYER_MEDIA_TYPE}",
            layer.media_type
        ))),
        _ => Err(not("expected exactly one layer".into())),
    }
}

/// The `.dockerconfigjson` of a Secret, read with the daemon's kubeconfig.
async fn read_secret(
    namespace: &str,
    name: &str,
    kubeconfig: Option<&std::path::Path>,
) -> Result<Vec<u8>, String> {
    let client = crate::kube_client::client(kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, namespace);
    let secret = api.get(name).await.map_err(|e| e.to_string())?;
    if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
        return Err(format!(
            "type is {:?}, expected kubernetes.io/dockerconfigjson (`kubectl create secret docker-registry`)",
            secret.type_.as_deref().unwrap_or("")
        ));
    }
    secret
        .data
        .and_then(|mut d| d.remove(".dockerconfigjson"))
        .map(|b| b.0)
        .ok_or_else(|| "has no key .dockerconfigjson".to_string())
}
