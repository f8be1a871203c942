//! What a component must export and may import to be a podstamp plugin,
//! checked before linking so that a mismatch says what to do: the host
//! interface, the shared types, and the WASI 0.2 interfaces of
//! `super::wasi`, which grant nothing; any other import is refused, named.

use wasmtime::Engine;
use wasmtime::component::Component;

use super::LoadError;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "podstamp:plugin@0.1.0";
pub(super) const EXPORT_NAME: &str = "podstamp:plugin/transformer@0.1.0";
pub(super) const EXPORT_PREFIX: &str = "podstamp:plugin/transformer@";
pub(super) const HOST_IMPORT: &str = "podstamp:plugin/host@0.1.0";
/// The interface of shared types; it has no functions, so importing it grants nothing.
pub(super) const TYPES_IMPORT: &str = "podstamp:plugin/types@0.1.0";

/// What a component imports and exports, whether or not it is a plugin.
#[derive(Debug, Clone)]
pub struct Interface {
    pub sha256: String,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Checks the component's imports and exports against our WIT package before
/// linking, so that a mismatch gets a message that says what to do.
pub(super) fn check_interface(
    engine: &Engine,
    component: &Component,
    origin: &str,
) -> Result<(), LoadError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    if !exports.contains(&EXPORT_NAME) {
        if let Some(found) = exports.iter().find_map(|e| e.strip_prefix(EXPORT_PREFIX)) {
            return Err(LoadError::WrongVersion {
                origin: origin.to_string(),
                found: found.to_string(),
            });
        }
        return Err(LoadError::NotAPlugin {
            origin: origin.to_string(),
            exports: if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            },
        });
    }
    for (import, _) in ty.imports(engine) {
        if import == HOST_IMPORT || import == TYPES_IMPORT || super::wasi::is_granted(import) {
            continue;
        }
        if let Some(found) = ["podstamp:plugin/host@", "podstamp:plugin/types@"]
            .iter()
            .find_map(|prefix| import.strip_prefix(prefix))
        {
            return Err(LoadError::WrongVersion {
                origin: origin.to_string(),
                found: found.to_string(),
            });
        }
        return Err(LoadError::ForbiddenImport {
            origin: origin.to_string(),
            import: import.to_string(),
        });
    }
    Ok(())
}
