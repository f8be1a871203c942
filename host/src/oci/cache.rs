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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Limits;

    fn manifest_for(component: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"layers": [{
            "mediaType": WASM_LAYER_MEDIA_TYPE,
            "digest": format!("sha256:{}", sha256_hex(component)),
            "size": component.len()}]}))
        .unwrap()
    }

    /// The re-verification the second security review saw hold: a record
    /// swapped on disk (the component, or the manifest for one naming other
    /// bytes) is a miss, pulled again, never a wrong component.
    #[test]
    fn a_swapped_record_is_a_miss_never_a_wrong_component() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(Limits::default(), Some(&dir.path().join("cache"))).unwrap();
        let component = b"the component".to_vec();
        let manifest = manifest_for(&component);
        let pinned = Pinned {
            registry: "127.0.0.1:5000".into(),
            repository: "plugins/p".into(),
            digest: format!("sha256:{}", sha256_hex(&manifest)),
        };
        keep(
            &runtime,
            &pinned,
            &Pulled {
                bytes: component.clone(),
                manifest: manifest.clone(),
            },
        );
        assert_eq!(cached(&runtime, &pinned), Some(component.clone()));

        let blob = format!("oci-blob-{}", sha256_hex(&component));
        runtime.remember(&blob, b"another component").unwrap();
        assert_eq!(cached(&runtime, &pinned), None, "a swapped component");
        runtime.remember(&blob, &component).unwrap();
        assert_eq!(cached(&runtime, &pinned), Some(component.clone()));

        let other = b"another component";
        runtime
            .remember(&format!("oci-blob-{}", sha256_hex(other)), other)
            .unwrap();
        runtime
            .remember(
                &format!("oci-manifest-{}", pinned.hex()),
                &manifest_for(other),
            )
            .unwrap();
        assert_eq!(cached(&runtime, &pinned), None, "a swapped manifest");
    }
}
