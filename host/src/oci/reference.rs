//! A component's place in a registry, pinned: `REGISTRY/REPO@sha256:HEX`.
//!
//! Invariants: a [`Pinned`] always carries a sha256 manifest digest (64
//! lowercase hex digits); a tag alone is refused, since a tag can be moved
//! under a node and the pin says which component the catalog means. A tag
//! given together with a digest is dropped: the digest decides.

use std::fmt;

use oci_client::Reference;

/// A manifest in a repository of a registry, by digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// `host[:port]`, as written.
    pub registry: String,
    pub repository: String,
    /// `sha256:` and 64 lowercase hex digits.
    pub digest: String,
}

/// Why a reference cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("{text:?} is not an OCI reference ({detail}); write REGISTRY/REPO@sha256:DIGEST")]
    Syntax { text: String, detail: String },
    #[error(
        "{text:?} names a tag, which can be moved to another component: pin it by digest, {text}@sha256:… (`podstamp plugin push` prints the reference with its digest)"
    )]
    Tag { text: String },
    #[error("{text:?}: the digest must be sha256:<64 hex digits>")]
    Digest { text: String },
}

/// `REGISTRY/REPO[:TAG]`, for a push: where the artifact goes.
pub fn parse_target(text: &str) -> Result<Reference, ReferenceError> {
    text.parse::<Reference>()
        .map_err(|e| ReferenceError::Syntax {
            text: text.to_string(),
            detail: e.to_string(),
        })
}

impl Pinned {
    /// Parses `REGISTRY/REPO@sha256:HEX`; a tag without a digest is refused.
    pub fn parse(text: &str) -> Result<Pinned, ReferenceError> {
        let reference = parse_target(text)?;
        let Some(digest) = reference.digest() else {
            return Err(ReferenceError::Tag {
                text: text.to_string(),
            });
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(ReferenceError::Digest {
                text: text.to_string(),
            });
        }
        Ok(Pinned {
            registry: reference.registry().to_string(),
            repository: reference.repository().to_string(),
            digest: format!("sha256:{}", hex.to_ascii_lowercase()),
        })
    }

    /// The digest's 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.digest["sha256:".len()..]
    }

    /// The client's reference to the manifest.
    pub(super) fn reference(&self) -> Reference {
        Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            self.digest.clone(),
        )
    }
}

impl fmt::Display for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.registry, self.repository, self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "3f1c000000000000000000000000000000000000000000000000000000000abc";

    #[test]
    fn a_digest_pins_and_a_tag_alone_is_refused() {
        let p = Pinned::parse(&format!("127.0.0.1:5000/plugins/id@sha256:{HEX}")).unwrap();
        assert_eq!(p.registry, "127.0.0.1:5000");
        assert_eq!(p.repository, "plugins/id");
        assert_eq!(p.hex(), HEX);
        assert_eq!(
            p.to_string(),
            format!("127.0.0.1:5000/plugins/id@sha256:{HEX}")
        );
        let e = Pinned::parse("127.0.0.1:5000/plugins/id:v1").unwrap_err();
        assert!(matches!(e, ReferenceError::Tag { .. }), "{e}");
        assert!(e.to_string().contains("pin it by digest"), "{e}");
        let e = Pinned::parse("127.0.0.1:5000/plugins/id@sha256:abc").unwrap_err();
        assert!(!e.to_string().is_empty());
    }
}
