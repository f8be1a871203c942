//! Components pulled from registries, kept on disk by digest, in the
//! compiled-code cache's directory and with its guarantees (records of
//! [`Runtime::remember`]: written whole, read only through handles checked
//! to be ours and writable by no one else).
//!
//! Two records per component: `oci-manifest-HEX` (the manifest, whose
//! sha256 is HEX, the pin) and `oci-blob-HEX` (the component, whose sha256
//! is HEX, the manifest's layer digest). Invariant: what is read back is
//! checked against those digests again before use, so a damaged or swapped
//! record is a miss (pulled again), never a wrong component. A pinned
//! digest names fixed content, so a hit needs no registry at all.

use sha2::{Digest, Sha256};

use super::reference::Pinned;
use super::registry::{Pulled, WASM_LAYER_MEDIA_TYPE};
use crate::plugin::Runtime;

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The component `pinned` names, from the disk cache; None on a miss.
pub fn cached(runtime: &Runtime, pinned: &Pinned) -> Option<Vec<u8>> {
    let manifest = runtime.recall(&format!("oci-manifest-{}", pinned.hex()))?;
    if sha256_hex(&manifest) != pinned.hex() {
        tracing::warn!(reference = %pinned, "the cached manifest does not match its digest; pulling it again");
        return None;
    }
    let layer = layer_digest(&manifest)?;
    let bytes = runtime.recall(&format!("oci-blob-{layer}"))?;
    if sha256_hex(&bytes) != layer {
        tracing::warn!(reference = %pinned, "the cached component does not match its digest; pulling it again");
        return None;
    }
    Some(bytes)
}

/// Keeps a checked pull; a failure to keep it is a warning (the next start
/// pulls again).
pub fn keep(runtime: &Runtime, pinned: &Pinned, pulled: &Pulled) {
    let layer = sha256_hex(&pulled.bytes);
    let kept = runtime
        .remember(&format!("oci-blob-{layer}"), &pulled.bytes)
        .and_then(|_| {
            runtime.remember(&format!("oci-manifest-{}", pinned.hex()), &pulled.manifest)
        });
    if let Err(e) = kept {
        tracing::warn!(reference = %pinned, "cannot keep the pulled component on disk: {e}; a start without the registry cannot use it");
    }
}

/// The hex sha256 of a checked manifest's one component layer.
fn layer_digest(manifest: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(manifest).ok()?;
    let layer = value.pointer("/layers/0")?;
    if layer.get("mediaType")?.as_str()? != WASM_LAYER_MEDIA_TYPE {
        return None;
    }
    let hex = layer.get("digest")?.as_str()?.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|c| c.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}
