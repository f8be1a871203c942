//! How the `podstamp` binary is linked: its relative relocations packed
//! (`-z pack-relative-relocs`, ELF's DT_RELR).
//!
//! A position-independent executable carries a 24-byte record for every
//! absolute address in its data (62,000 in podstamp's release build, 1.5 MB
//! of `.rela.dyn`). The dynamic loader reads them all at every start, so
//! they stay in the process's resident set for its life: 1.4 MiB of the
//! daemon's RSS after a 1,000-template sync (docs/performance.md §3.6).
//! Packed, they take a few KB; the binary stays position-independent.
//!
//! Invariants:
//! - Only where the C library the binary links against loads DT_RELR:
//!   glibc 2.36 or later, on Linux. The linker then records a need for
//!   the version `GLIBC_ABI_DT_RELR`, so an older glibc refuses the binary
//!   with that name rather than running it unrelocated.
//! - Only when the target is the machine that builds (the C library asked
//!   is the one linked); a cross build links as before.
//! - Only the binary: the library and the tests link as before.

use std::process::Command;

/// The first glibc whose loader applies DT_RELR.
const GLIBC_WITH_RELR: (u32, u32) = (2, 36);

pub fn pack_relocations() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native = var("TARGET") == var("HOST");
    let linux_gnu = var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu";
    if native && linux_gnu && glibc().is_some_and(|version| version >= GLIBC_WITH_RELR) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The build machine's glibc, as `getconf GNU_LIBC_VERSION` says
/// (`glibc 2.36`); None when it cannot say.
fn glibc() -> Option<(u32, u32)> {
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}
