//! What a component must export and may import to be a podstamp plugin,
//! checked before linking so that a mismatch says what to do: the host
//! interface, the shared types, and the WASI 0.2 interfaces of
//! `super::wasi`, which grant nothing; any other import is refused, named.

use wasmtime::Engine;
use wasmtime::component::Component;

use super::LoadError;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "podstamp:plugin@0.1.1";
/// The versions of the package whose components it loads: 0.1.1 added an
/// export (`settings-validator`) and changed nothing else.
pub(super) const VERSIONS: [&str; 2] = ["0.1.0", "0.1.1"];
pub(super) const EXPORT_PREFIX: &str = "podstamp:plugin/transformer@";
pub(super) const HOST_PREFIX: &str = "podstamp:plugin/host@";
/// The interface of shared types; it has no functions, so importing it grants nothing.
pub(super) const TYPES_PREFIX: &str = "podstamp:plugin/types@";
/// The optional export of 0.1.1, and its function.
pub(super) const SETTINGS_EXPORT: &str = "podstamp:plugin/settings-validator@0.1.1";
pub(super) const VALIDATE_SETTINGS: &str = "validate-settings";

/// `name` is `prefix` followed by a version this host loads.
fn of_ours(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|version| VERSIONS.contains(&version))
}

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
    if !exports.iter().any(|e| of_ours(e, EXPORT_PREFIX)) {
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
        if of_ours(import, HOST_PREFIX)
            || of_ours(import, TYPES_PREFIX)
            || super::wasi::is_granted(import)
        {
            continue;
        }
        if let Some(found) = [HOST_PREFIX, TYPES_PREFIX]
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
