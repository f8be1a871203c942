//! Gzip for plugin components held in ConfigMaps.
//!
//! Invariants: gzip is recognised by its magic bytes (1f 8b), never by a
//! key's name, so a plain component under `x.wasm.gz` still loads; inflating
//! never produces more than [`MAX_COMPONENT_BYTES`], whatever the input
//! claims, so a small "gzip bomb" cannot exhaust the node's memory; and
//! [`compress`] is deterministic (no file name, mtime 0, fixed OS byte), so
//! the same component always gives the same ConfigMap bytes.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::GzDecoder;

/// The largest component podstamp inflates: above a Python or JavaScript
/// plugin (12–18 MB) and far below what would hurt a node.
pub const MAX_COMPONENT_BYTES: usize = 64 << 20;

/// Whether `bytes` start with the gzip magic number.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// Why a gzip stream could not be inflated.
#[derive(Debug, thiserror::Error)]
pub enum GzipError {
    #[error("truncated gzip (the stream ends early: {0}); copy the whole file again")]
    Truncated(#[source] std::io::Error),
    #[error("corrupt gzip ({0})")]
    Corrupt(#[source] std::io::Error),
    #[error(
        "gzip inflates to more than {limit} bytes (the limit for a component, 64 MiB): refused as a gzip bomb",
        limit = MAX_COMPONENT_BYTES
    )]
    TooLarge,
}

/// Inflates one gzip member, stopping past `limit` bytes.
pub fn inflate(bytes: &[u8], limit: usize) -> Result<Vec<u8>, GzipError> {
    let mut out = Vec::new();
    // One byte more than the limit tells "exactly the limit" from "more".
    let mut reader = GzDecoder::new(bytes).take(limit as u64 + 1);
    reader.read_to_end(&mut out).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            GzipError::Truncated(e)
        } else {
            GzipError::Corrupt(e)
        }
    })?;
    if out.len() > limit {
        return Err(GzipError::TooLarge);
    }
    Ok(out)
}

/// Compresses `bytes` to a gzip stream that depends on the bytes only.
pub fn compress(bytes: &[u8]) -> Vec<u8> {
    // GzBuilder writes no name or comment, and mtime 0, unless told to.
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), Compression::best());
    // Writing to a Vec cannot fail.
    encoder.write_all(bytes).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_deterministic() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let a = compress(&data);
        assert!(is_gzip(&a));
        assert_eq!(a, compress(&data), "same input, same bytes");
        assert_eq!(inflate(&a, MAX_COMPONENT_BYTES).unwrap(), data);
        assert!(!is_gzip(b"\0asm"));
    }

    #[test]
    fn truncated_corrupt_and_oversized_are_told_apart() {
        let data = vec![7u8; 10_000];
        let gz = compress(&data);
        let truncated = &gz[..gz.len() / 2];
        assert!(
            matches!(
                inflate(truncated, MAX_COMPONENT_BYTES),
                Err(GzipError::Truncated(_))
            ),
            "{:?}",
            inflate(truncated, MAX_COMPONENT_BYTES)
        );
        // Only the trailer (CRC, size) cut off: still truncated.
        let no_trailer = &gz[..gz.len() - 4];
        assert!(matches!(
            inflate(no_trailer, MAX_COMPONENT_BYTES),
            Err(GzipError::Truncated(_))
        ));
        let mut corrupt = gz.clone();
        let crc = corrupt.len() - 8;
        corrupt[crc] ^= 0xff;
        assert!(
            matches!(
                inflate(&corrupt, MAX_COMPONENT_BYTES),
                Err(GzipError::Corrupt(_))
            ),
            "{:?}",
            inflate(&corrupt, MAX_COMPONENT_BYTES)
        );
        let mut bad_block = gz.clone();
        bad_block[10] = 0xff;
        assert!(inflate(&bad_block, MAX_COMPONENT_BYTES).is_err());
        // Exactly the limit passes, one byte more is a bomb.
        assert_eq!(inflate(&gz, data.len()).unwrap(), data);
        assert!(matches!(
            inflate(&gz, data.len() - 1),
            Err(GzipError::TooLarge)
        ));
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 64 MiB + 1 of zeros compresses to ~64 KiB.
        let bomb = compress(&vec![0u8; MAX_COMPONENT_BYTES + 1]);
        assert!(bomb.len() < 1 << 20);
        assert!(matches!(
            inflate(&bomb, MAX_COMPONENT_BYTES),
            Err(GzipError::TooLarge)
        ));
    }
}
