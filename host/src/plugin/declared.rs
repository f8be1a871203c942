//! The scope a plugin declares it needs: the custom section
//! [`SECTION`] of its component (the SDK's `podstamp_plugin::scope!`
//! writes it), read when the plugin is loaded.
//!
//! A declaration grants nothing: the catalog entry's `scope:` (or the
//! default) is what the host enforces ([`crate::scope`]). It is shown beside
//! the grant (`podstamp render --explain`) and named in a refusal, so that
//! whoever approves a plugin sees what it says it changes and what the
//! catalog lets it change.
//!
//! Invariants:
//! - The section is found in the component itself or in any module or
//!   component nested in it, at any depth, walked by the binary format's
//!   section headers only (nothing is decoded but section names); the walk
//!   is bounded by the bytes, and a malformed header ends it as "no
//!   declaration" (the component was compiled before, so it is well formed).
//! - A section that is there but is not `podstamp-scope 1` followed by one
//!   grant a line, in UTF-8, is an error (the plugin is refused at load):
//!   a declaration is never half read.

/// The custom section's name.
pub const SECTION: &str = "podstamp:scope";
/// Its first line: the format's version.
const HEADER: &str = "podstamp-scope 1";

/// The grants the component `bytes` declares; None: it declares nothing
/// (no section). Err: the section is there but not a declaration.
pub fn declared_scope(bytes: &[u8]) -> Result<Option<Vec<String>>, String> {
    let Some(data) = find_section(bytes, 0) else {
        return Ok(None);
    };
    let text = std::str::from_utf8(data)
        .map_err(|_| format!("its custom section {SECTION} is not UTF-8"))?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!(
            "its custom section {SECTION} does not start with {HEADER:?} (build it with the SDK's scope!)"
        ));
    }
    Ok(Some(
        lines
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
    ))
}

/// Reads an unsigned LEB128 u32 at `at`, moving it past.
fn leb_u32(bytes: &[u8], at: &mut usize) -> Option<u32> {
    let mut value = 0u32;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u32::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The payload of the custom section [`SECTION`] in the module or
/// component `bytes` (with its 8-byte preamble), or in one nested in it.
fn find_section(bytes: &[u8], depth: u32) -> Option<&[u8]> {
    // Components nest a few levels at most; the bound keeps a crafted one
    // from recursing deep.
    if depth > 16 || bytes.get(..4)? != b"\0asm" {
        return None;
    }
    // A component's preamble says layer 1 in its last two bytes.
    let component = bytes.get(6..8)? == [1, 0];
    let mut at = 8;
    while at < bytes.len() {
        let id = bytes[at];
        at += 1;
        let size = leb_u32(bytes, &mut at)? as usize;
        let payload = bytes.get(at..at.checked_add(size)?)?;
        at += size;
        match id {
            0 => {
                let mut name_at = 0;
                let len = leb_u32(payload, &mut name_at)? as usize;
                let name = payload.get(name_at..name_at.checked_add(len)?)?;
                if name == SECTION.as_bytes() {
                    return Some(&payload[name_at + len..]);
                }
            }
            // A core module (1) or a component (4) nested in a component.
            1 | 4 if component => {
                if let Some(found) = find_section(payload, depth + 1) {
                    return Some(found);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom(name: &str, data: &[u8]) -> Vec<u8> {
        let mut payload = vec![name.len() as u8];
        payload.extend_from_slice(name.as_bytes());
        payload.extend_from_slice(data);
        let mut section = vec![0, payload.len() as u8];
        section.extend(payload);
        section
    }

    #[test]
    fn a_declaration_is_found_in_a_nested_module_and_read_whole() {
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        module.extend(custom("name", b"x"));
        module.extend(custom(
            SECTION,
            b"podstamp-scope 1\nspec.containers[*].image\n",
        ));
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        component.push(1);
        component.push(module.len() as u8);
        component.extend(&module);
        assert_eq!(
            declared_scope(&component).unwrap(),
            Some(vec!["spec.containers[*].image".to_string()])
        );
        // Nothing declared: no section; declared nothing: the header alone.
        assert_eq!(declared_scope(b"\0asm\x0d\0\x01\0").unwrap(), None);
        let mut empty = b"\0asm\x01\0\0\0".to_vec();
        empty.extend(custom(SECTION, b"podstamp-scope 1\n"));
        assert_eq!(declared_scope(&empty).unwrap(), Some(vec![]));
        let mut bad = b"\0asm\x01\0\0\0".to_vec();
        bad.extend(custom(SECTION, b"spec\n"));
        assert!(
            declared_scope(&bad)
                .unwrap_err()
                .contains("podstamp-scope 1")
        );
        // Truncated: no declaration, no panic.
        assert_eq!(
            declared_scope(&component[..component.len() - 3]).unwrap(),
            None
        );
    }
}
