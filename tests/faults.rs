//! The fault and adversarial suite: bad plugins, bad templates and a failing
//! disk, through the real `podstamp run` daemon (directory source, so no API
//! server is needed), with the kubelet's own decoder checking what is left on
//! disk.
//!
//! Every fault tried is a row of [`FAULTS`]; the test that injects it checks
//! the outcome the row claims (what is kept, the failure reason counted in
//! the metrics and the message in the log), and
//! `docs_reliability_md_is_the_fault_table` checks that docs/reliability.md is
//! exactly this table, so the document cannot drift from what is tested.
//! Regenerate it with `PODSTAMP_BLESS=1 cargo test --test faults docs_`.
//!
//! The disk tests mount small tmpfs file systems, so they need root (or
//! CAP_SYS_ADMIN) and mount(8); they fail, saying so, without them.

mod common;
#[path = "daemon/support.rs"]
mod support;
#[path = "faults/wat.rs"]
mod wat;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

const CONVERGE: Duration = Duration::from_secs(30);

/// One fault and its outcome, as the test that injects it checks it.
struct Fault {
    id: &'static str,
    area: &'static str,
    fault: &'static str,
    /// What stays on disk (and what keeps working).
    kept: &'static str,
    /// `podstamp_render_failures_total{reason=...}` and the log's `reason=`;
    /// or how else it is reported.
    reported: &'static str,
    /// Text the log (or stderr) contains.
    says: &'static str,
    /// The test function that injects it.
    test: &'static str,
}

const PLUGIN_KEPT: &str = "last good manifest, unchanged (same inode and mtime); the daemon stays up; other templates keep rendering";

const RELOAD_KEPT: &str = "the catalog in use keeps serving (same `podstamp_catalog_info` digest; a template changed meanwhile renders with it); every manifest unchanged (same inode and mtime)";
const API_CATALOG_REFUSED: &str = "not a render failure: `podstamp_config_reloads_total{result=\"refused\"}`, an error in the log naming the ConfigMap, the key and the digests, and a `CatalogRefused` Event on the plugin ConfigMap at fault";
const RELOAD_REFUSED: &str = "not a render failure: `podstamp_config_reloads_total{result=\"refused\"}` and an error in the log naming the file and the field";

const FAULTS: &[Fault] = &[
    Fault {
        id: "plugin-infinite-loop",
        area: "plugin",
        fault: "infinite loop",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "deadline of 300 ms exceeded; the call was stopped",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-deep-recursion",
        area: "plugin",
        fault: "unbounded recursion (stack overflow)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "stack overflow",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-memory-growth",
        area: "plugin",
        fault: "memory.grow until the cap (16 MiB here)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "memory cap of 16 MiB exceeded",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-oversized-output",
        area: "plugin",
        fault: "output of 128 KiB, over `limits.maxManifestSize: 64Ki`",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned 131072 bytes, over the limit of 65536",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-invalid-utf8",
        area: "plugin",
        fault: "output that is not UTF-8",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned malformed data: invalid utf-8",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-invalid-json",
        area: "plugin",
        fault: "output that is not JSON",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned invalid JSON",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-deep-json",
        area: "plugin",
        fault: "output of 1500 nested JSON arrays",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "returned invalid JSON: recursion limit exceeded",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-rename",
        area: "plugin",
        fault: "output that renames the pod (to `kube-apiserver`)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "changed the pod's name from \"f-rename\" to \"kube-apiserver\"",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-namespace",
        area: "plugin",
        fault: "output that sets `metadata.namespace: ../../etc`",
        kept: "the manifest is written with the namespace forced back to the daemon's (`kube-system`); nothing is written outside the manifest directory",
        reported: "not a failure: the namespace is podstamp's to set",
        says: "namespace: kube-system",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-panic",
        area: "plugin",
        fault: "a panic (the guest logs the panic message, then traps)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "the plugin logged: panicked at src/lib.rs:7:5: boom in the guest",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-filesystem",
        area: "plugin",
        fault: "a WASI plugin that looks for a directory to open `/etc/passwd` in",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "no preopened directory: /etc/passwd cannot be opened",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-sockets",
        area: "plugin",
        fault: "a WASI plugin that makes a TCP socket to connect to 127.0.0.1",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "no TCP socket to connect to 127.0.0.1 with: access-denied",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-environment",
        area: "plugin",
        fault: "a WASI plugin that reads the environment, its arguments and stdin",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "empty environment and arguments, stdin closed",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-stdout",
        area: "plugin",
        fault: "a WASI plugin that writes 100 lines to stdout (then fails)",
        kept: "last good manifest, unchanged; the daemon stays up; the first 64 lines are in the log (`stdout: hello from stdout`), then one warning that the rest is dropped",
        reported: "RenderFailed",
        says: "wrote 100 lines to stdout",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-exit",
        area: "plugin",
        fault: "a WASI plugin that calls `exit`",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "called exit (status 1) instead of returning",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-clock",
        area: "plugin",
        fault: "a WASI plugin that sleeps until 10 ms have passed on the monotonic clock (which never moves)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "deadline of 300 ms exceeded; the call was stopped",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-wasi-unlisted",
        area: "plugin",
        fault: "a component importing a WASI interface outside WASI 0.2's `wasi:cli/imports` (`wasi:http/outgoing-handler`)",
        kept: "nothing is written: refused at load, `podstamp run` exits 2",
        reported: "exit code 2 and one line on stderr",
        says: "imports `wasi:http/outgoing-handler@0.2.0`, which podstamp does not provide",
        test: "plugins_importing_wasi_beyond_the_fixed_list_are_refused_at_load",
    },
    Fault {
        id: "plugin-huge-error",
        area: "plugin",
        fault: "an error as long as the memory cap allows (a 14 MiB message, a 1 MiB field)",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "… (cut: 14680064 bytes in all)",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-many-memories",
        area: "plugin",
        fault: "four linear memories, each under the cap (16 MiB here), together over it",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "memory cap of 16 MiB exceeded",
        test: "bad_plugins_keep_the_last_good_manifest",
    },
    Fault {
        id: "plugin-memory-reuse",
        area: "plugin",
        fault: "a plugin that looks for what an earlier call (of any template) left in its reused instance slot's memory, then leaves a secret there",
        kept: "every call finds zeros: a slot's memory is dropped between calls (`madvise(MADV_DONTNEED)`, which drops swapped-out pages too; the swapped case cannot be forced on a machine without swap, so it is not tested)",
        reported: "not a failure: there is nothing to find",
        says: "found nothing an earlier call left",
        test: "tests/sandbox.rs: a_call_never_sees_what_an_earlier_call_left_in_memory",
    },
    Fault {
        id: "catalog-configmap-digest-mismatch",
        area: "catalog",
        fault: "a plugin ConfigMap (plain or gzip), or a component file, holding another component than the catalog's `sha256` pins",
        kept: "the catalog is refused whole: nothing is rendered with it (`podstamp render --configmap` exits 1)",
        reported: "one line naming the catalog entry, the ConfigMap (namespace/name) and key or the file, and both digests",
        says: "but the catalog pins",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-gzip-truncated",
        area: "catalog",
        fault: "a plugin ConfigMap whose gzip component is cut short",
        kept: "the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap and key",
        says: "truncated gzip (the stream ends early: ",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-gzip-corrupt",
        area: "catalog",
        fault: "a plugin ConfigMap whose gzip component fails its CRC",
        kept: "the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap and key",
        says: "corrupt gzip (",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-gzip-bomb",
        area: "catalog",
        fault: "a plugin ConfigMap holding a gzip bomb (64 MiB + 1 of zeros, ~65 KiB compressed)",
        kept: "inflating stops at 64 MiB; the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap, key and the limit",
        says: "refused as a gzip bomb",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-key-missing",
        area: "catalog",
        fault: "a plugin ConfigMap without the key the catalog names",
        kept: "the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap and key, and the keys it has",
        says: "missing (binaryData has: other.wasm)",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-key-in-data",
        area: "catalog",
        fault: "a plugin ConfigMap with the component under `data` instead of `binaryData`",
        kept: "the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap and key, and the fix",
        says: "is under data, but a component is binary",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-missing",
        area: "catalog",
        fault: "the plugin ConfigMap the catalog names does not exist (or `podstamp render` was given no --configmap)",
        kept: "the catalog is refused whole (`podstamp render` exits 1; 2 without any --configmap)",
        reported: "one line naming the entry and the ConfigMap, and how to create it",
        says: "does not exist: create it (`podstamp plugin configmap FILE.wasm --name pn` prints it)",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-not-a-component",
        area: "catalog",
        fault: "a plugin ConfigMap holding pinned bytes that are no WebAssembly component",
        kept: "the catalog is refused whole (`podstamp render --configmap` exits 1)",
        reported: "one line naming the entry, ConfigMap and key",
        says: "not a valid WebAssembly component",
        test: "tests/render.rs: a_bad_plugin_configmap_is_refused_in_one_line_naming_configmap_key_and_digests",
    },
    Fault {
        id: "catalog-configmap-unpinned",
        area: "catalog",
        fault: "a catalog entry from a ConfigMap without `sha256`, with both `path` and `configMap`, with neither, or a pin that is not 64 hex digits",
        kept: "refused before anything is read or compiled (exit 2)",
        reported: "one line naming the entry and the fix",
        says: "must be pinned; add sha256:",
        test: "tests/render.rs: a_catalog_entry_names_one_pinned_source",
    },
    Fault {
        id: "catalog-configmap-catalog-invalid",
        area: "catalog",
        fault: "a catalog ConfigMap (`daemon.catalog.configMap`) that is missing, has an unknown field, a relative `path` or a `settingsFile`; or a file that gives both `daemon.catalog` and `plugins`/`chain`; or a ConfigMap given from another namespace",
        kept: "refused (exit 2)",
        reported: "one line naming the ConfigMap and key (or the file) and the field",
        says: "is relative, but a catalog in a ConfigMap has no directory",
        test: "tests/render.rs: a_catalog_from_a_configmap_renders_like_the_file",
    },
    Fault {
        id: "catalog-configmap-dir-source",
        area: "catalog",
        fault: "`podstamp run --source dir:` with `daemon.catalog.configMap` or a plugin from a ConfigMap",
        kept: "refused at start (exit 2), before the manifest directory is touched",
        reported: "one line naming the field",
        says: "a ConfigMap is read from the API, but the source is dir:",
        test: "tests/render.rs: a_catalog_from_a_configmap_renders_like_the_file",
    },
    Fault {
        id: "catalog-plugin-configmap-too-big",
        area: "catalog",
        fault: "`podstamp plugin configmap` of a file that is no plugin, or of a plugin whose gzip does not fit a ConfigMap (1 MiB)",
        kept: "nothing printed on stdout (exit 1)",
        reported: "one line naming the file and the sizes",
        says: "a ConfigMap holds: make the plugin smaller",
        test: "tests/render.rs: plugin_configmap_refuses_what_is_no_plugin_or_does_not_fit",
    },
    Fault {
        id: "catalog-oci-tag",
        area: "catalog",
        fault: "a catalog entry `oci: REGISTRY/REPO:TAG` without a digest",
        kept: "the catalog is refused whole before anything is pulled (at start: exit 2; on a reload: the catalog in use keeps serving)",
        reported: "one line naming the entry and the fix",
        says: "names a tag, which can be moved to another component: pin it by digest",
        test: "tests/oci.rs: a_tag_without_a_digest_is_refused_in_the_catalog",
    },
    Fault {
        id: "catalog-oci-refused-on-reload",
        area: "catalog",
        fault: "a running daemon's catalog (its configuration file) changed to an `oci:` component the registry does not have",
        kept: RELOAD_KEPT,
        reported: "`podstamp_config_reloads_total{result=\"refused\"}`, the loader's error line naming the entry and the reference, and a `CatalogRefused` Event on the daemon's Node (namespace `default`: no ConfigMap is at fault)",
        says: "the new plugin catalog is refused: ",
        test: "tests/oci.rs: a_catalog_the_registry_refuses_on_reload_keeps_the_one_in_use_and_says_so_on_the_node",
    },
    Fault {
        id: "catalog-oci-registry-down",
        area: "catalog",
        fault: "the registry of an `oci:` plugin does not answer when the node starts",
        kept: "with the component in the disk cache: nothing, the node starts and renders (a digest names fixed content, the registry is not asked); without it: the catalog is refused, nothing is written, manifests on disk are kept",
        reported: "one line naming the entry, the reference and the registry",
        says: "does not answer",
        test: "tests/oci.rs: the_daemon_renders_an_oci_plugin_and_starts_again_with_the_registry_down",
    },
    Fault {
        id: "catalog-oci-unauthorized",
        area: "catalog",
        fault: "the registry refuses the credentials of `daemon.registry` (401), or of `plugin push|pull --registry-config`",
        kept: "the catalog is refused whole; nothing is written (`plugin pull`: nothing written, exit 1)",
        reported: "one line naming the entry, the registry and where the credentials came from (file or Secret)",
        says: "refuses the credentials (401 Unauthorized; credentials from",
        test: "tests/oci.rs: wrong_registry_credentials_refuse_the_catalog_with_a_401_line",
    },
    Fault {
        id: "catalog-oci-unknown-digest",
        area: "catalog",
        fault: "an `oci:` reference whose digest the registry does not have (a typo, or never pushed)",
        kept: "nothing pulled or written (`plugin pull`: exit 1, no file; the catalog loader uses the same pull: the catalog is refused whole, manifests on disk are kept)",
        reported: "one line naming the reference and the fix",
        says: "not in the registry",
        test: "tests/oci.rs: an_unknown_digest_is_refused_in_one_line",
    },
    Fault {
        id: "catalog-oci-blob-mismatch",
        area: "catalog",
        fault: "the registry serves a layer whose bytes do not have the digest its manifest names (storage altered, same length)",
        kept: "the bytes are dropped, never cached or loaded (`plugin pull`: exit 1, no file; the catalog is refused whole)",
        reported: "one line naming the reference, both digests and what was refused",
        says: "the registry served other bytes",
        test: "tests/oci.rs: a_blob_that_does_not_match_its_digest_is_refused",
    },
    Fault {
        id: "catalog-oci-manifest-too-large",
        area: "catalog",
        fault: "the pinned manifest is over 64 KiB (a valid manifest the registry accepts, padded with annotations)",
        kept: "nothing past the limit is read from the registry (`plugin pull`: exit 1, no file; the catalog is refused whole)",
        reported: "one line naming the reference, its size (by its `Content-Length`) and the limit",
        says: "over the limit of 65536 bytes",
        test: "tests/oci.rs: a_manifest_over_the_size_limit_is_refused",
    },
    Fault {
        id: "catalog-oci-manifest-huge-length",
        area: "catalog",
        fault: "a hostile registry answers the pinned manifest with a 1 GiB body and an honest `Content-Length` (second security review, finding 6)",
        kept: "refused on its `Content-Length`, before the body is read; `podstamp render`'s peak RSS within 8 MiB of a render refused by a small 404 (the catalog is refused whole; the one in use keeps serving)",
        reported: "one line naming the reference, the length and the limit; `podstamp_oci_pulls_total{result=\"manifest_too_large\"}`",
        says: "bytes by its Content-Length, over the limit of 65536 bytes",
        test: "tests/oci.rs: a_registry_sending_a_gigabyte_is_refused_at_the_cap_in_the_memory_of_a_small_refusal",
    },
    Fault {
        id: "catalog-oci-manifest-huge-chunked",
        area: "catalog",
        fault: "a hostile registry answers the pinned manifest with 1 GiB chunked, without a length",
        kept: "reading stops at the chunk that passes 64 KiB and the connection is dropped (the registry managed to write at most a few MiB, socket buffers included); peak RSS as above",
        reported: "one line naming the reference and the limit; `podstamp_oci_pulls_total{result=\"manifest_too_large\"}`",
        says: "the manifest is more than 65536 bytes (read up to the limit)",
        test: "tests/oci.rs: a_registry_sending_a_gigabyte_is_refused_at_the_cap_in_the_memory_of_a_small_refusal",
    },
    Fault {
        id: "catalog-oci-layer-over-declared",
        area: "catalog",
        fault: "a hostile registry answers a pinned manifest's 1000-byte layer with 1 GiB chunked",
        kept: "reading stops past the size the (digest-checked) manifest declares; nothing cached or loaded; peak RSS as above",
        reported: "one line naming the reference and the declared size; `podstamp_oci_pulls_total{result=\"layer_too_large\"}`",
        says: "over the 1000 bytes its manifest declares",
        test: "tests/oci.rs: a_registry_sending_a_gigabyte_is_refused_at_the_cap_in_the_memory_of_a_small_refusal",
    },
    Fault {
        id: "catalog-oci-huge-error-or-token",
        area: "catalog",
        fault: "a hostile registry answers 404 with a 1 GiB body, or sends a Bearer challenge whose token realm answers 1 GiB",
        kept: "an error's text is read up to 4 KiB and the rest dropped; a token answer is refused past 64 KiB; peak RSS as above",
        reported: "one line (the 404's first 4 KiB; the realm and the limit)",
        says: "answered more than 65536 bytes",
        test: "tests/oci.rs: a_registry_sending_a_gigabyte_is_refused_at_the_cap_in_the_memory_of_a_small_refusal",
    },
    Fault {
        id: "oci-push-huge-answer",
        area: "catalog",
        fault: "a hostile registry answers `podstamp plugin push` with a 500 whose body is 1 GiB, or a Bearer challenge whose token realm answers 1 GiB",
        kept: "nothing pushed; the error's text is read up to 4 KiB, the token answer refused past 64 KiB; peak RSS of the push within 8 MiB of a push refused by a small 500",
        reported: "exit 1 and one line naming the registry",
        says: "500 Internal Server Error: xxxx",
        test: "tests/oci.rs: a_registry_answering_a_push_with_a_gigabyte_is_refused_at_the_cap",
    },
    Fault {
        id: "catalog-oci-slow-registry",
        area: "catalog",
        fault: "a registry that accepts connections and never answers",
        kept: "the pull stops at the registry timeout (`--registry-timeout`, `daemon.registry.timeout`, default 30s), nothing written (the catalog loader: refused whole, the catalog in use keeps serving)",
        reported: "one line naming the registry and the timeout's setting",
        says: "did not finish within 2s (registry timeout)",
        test: "tests/oci.rs: a_registry_that_never_answers_is_bounded_by_the_timeout",
    },
    Fault {
        id: "plugin-handle-limit",
        area: "plugin",
        fault: "a plugin that takes 120,000 resource handles (WASI stdout streams) and never drops them (reported as `returned malformed data` before)",
        kept: "the call is stopped at 10,000 live handles (`MAX_HANDLES_PER_CALL`); a plugin that drops each handle it takes may take as many; the runtime keeps working",
        reported: "RenderFailed",
        says: "held more than 10000 resource handles at once (the per-call limit)",
        test: "tests/sandbox.rs: a_plugin_holding_too_many_handles_is_stopped_at_the_handle_limit_named_as_such",
    },
    Fault {
        id: "files-test-update-link-outside",
        area: "files",
        fault: "a case directory given to `podstamp test --update` holding `expected.yaml` (or `expected.error`) as a link out of DIR, or a case directory that is such a link (a case from a pull request aiming at `~/.bashrc`; finding 7)",
        kept: "nothing written or removed, in any case (checked before any case runs); links inside DIR (shared goldens) are still written through, by a temporary file renamed beside the file they name",
        reported: "exit 2 and one line naming the link and where it points",
        says: "nothing written",
        test: "tests/test_command.rs: update_refuses_a_link_that_leaves_dir_and_writes_nothing",
    },
    Fault {
        id: "files-plugin-new-planted-staging",
        area: "files",
        fault: "a symbolic link planted at `plugin new`'s old staging name `.NAME.podstamp-new-PID` beside `--dir` (finding 8)",
        kept: "nothing written through it (it is left as it was): the project is staged in a directory this run creates, a random name, mode 0700, by `mkdir` (which fails on anything there, and another name is tried)",
        reported: "nothing to report: the project is made where it was asked",
        says: "created ",
        test: "tests/scaffold.rs: plugin_new_writes_nothing_through_a_link_planted_at_the_staging_name",
    },
    Fault {
        id: "rollout-status-untrusted-record",
        area: "rollouts",
        fault: "node status Leases forged by another writer: a generation of i64::MAX in a node's own record; a record named for one node and held by another (finding 9)",
        kept: "`podstamp status` takes the template's target and generation from trusted records only (name ↔ holder ↔ node: `podstamp::fleet::trust`); the others are listed, marked, and counted only as untrusted",
        reported: "`podstamp status`: an UNTRUSTED column, and each such node's reason (`untrusted` in `-o json`)",
        says: "UNTRUSTED: node n2 claims generation 9223372036854775807",
        test: "tests/rollouts.rs: status_shows_records_it_cannot_trust_as_such_not_as_the_newest",
    },
    Fault {
        id: "template-name-dotdot",
        area: "template",
        fault: "name `../escape`",
        kept: "nothing written, in the directory or outside it",
        reported: "InvalidTemplate",
        says: "metadata.name: \"../escape\" is not a valid DNS-1123 subdomain",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-slash",
        area: "template",
        fault: "name `etc/passwd`",
        kept: "nothing written, in the directory or outside it",
        reported: "InvalidTemplate",
        says: "metadata.name: \"etc/passwd\" is not a valid DNS-1123 subdomain",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-dot",
        area: "template",
        fault: "name `.hidden` (a file the kubelet would ignore)",
        kept: "nothing written",
        reported: "InvalidTemplate",
        says: "metadata.name: \".hidden\" is not a valid DNS-1123 subdomain",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-too-long",
        area: "template",
        fault: "name of 254 characters",
        kept: "nothing written",
        reported: "InvalidTemplate",
        says: "metadata.name: is 254 characters long, over the limit of 253",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-long",
        area: "template",
        fault: "name of 250 characters (the longest whose file name fits in 255 bytes)",
        kept: "written as `NAME.yaml`",
        reported: "not a failure",
        says: "wrote manifest",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-over-name-max",
        area: "template",
        fault: "name of 252 characters (valid, but `NAME.yaml` is over 255 bytes, and the kubelet's `NAME-n1` over 253)",
        kept: "nothing written",
        reported: "RenderFailed",
        says: "the kubelet names the pod \"<name>-n1\", 255 characters, over the limit of 253",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-name-with-node-over-253",
        area: "template",
        fault: "a valid name that, with `-<node name>` appended as the kubelet does, is over 253 characters",
        kept: "nothing written (the kubelet's decoder would reject the file)",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "the kubelet names the pod \"<name>-node-with-a-long-name-1234\", 277 characters, over the limit of 253",
        test: "a_name_too_long_for_the_kubelet_with_this_node_is_refused",
    },
    Fault {
        id: "template-no-containers",
        area: "template",
        fault: "`containers: []`",
        kept: "nothing written",
        reported: "RenderFailed",
        says: "spec.containers: must list at least one container",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-invalid-yaml",
        area: "template",
        fault: "invalid YAML in the directory source",
        kept: "nothing written; other files keep rendering",
        reported: "InvalidTemplate",
        says: "broken.yaml:4:1: did not find expected \u{27},\u{27} or \u{27}}\u{27}",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-deep-yaml",
        area: "template",
        fault: "10000 nested YAML sequences",
        kept: "nothing written; the daemon stays up (no stack overflow)",
        reported: "InvalidTemplate",
        says: "recursion limit exceeded",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-deep-json",
        area: "template",
        fault: "10000 nested JSON arrays (a `.json` file)",
        kept: "nothing written; the daemon stays up (no stack overflow)",
        reported: "InvalidTemplate",
        says: "recursion limit exceeded",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-yaml-bomb",
        area: "template",
        fault: "a YAML alias bomb (\"billion laughs\", 9^10 strings)",
        kept: "nothing written; memory stays bounded",
        reported: "InvalidTemplate",
        says: "repetition limit exceeded",
        test: "bad_templates_are_refused_and_never_leave_the_directory",
    },
    Fault {
        id: "template-10mib",
        area: "template",
        fault: "a 10 MiB template, no plugins",
        kept: "last good manifest, unchanged; refused before it is rendered (its size, counted as JSON, is over `maxManifestSize`)",
        reported: "RenderFailed",
        says: "bytes, over the limit of 65536 (limits.maxManifestSize) for a manifest; it is not rendered",
        test: "huge_duplicate_and_flapping_templates_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-10mib-through-plugins",
        area: "template",
        fault: "a 10 MiB template, through a plugin",
        kept: "last good manifest, unchanged; no plugin is called",
        reported: "RenderFailed",
        says: "over the limit of 65536 (limits.maxManifestSize) for a manifest; it is not rendered",
        test: "huge_duplicate_and_flapping_templates_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-17mib-file",
        area: "template",
        fault: "a 17 MiB template file in the directory source",
        kept: "last good manifest, unchanged; the file is read no further than 16 MiB",
        reported: "InvalidTemplate",
        says: "over 16 MiB; a template file is at most that large",
        test: "huge_duplicate_and_flapping_templates_keep_the_last_good_manifest",
    },
    Fault {
        id: "render-over-max-manifest-size",
        area: "template",
        fault: "`podstamp render` of a 2 MiB template without plugins (default `maxManifestSize`, 1 MiB)",
        kept: "no output file (nor temp file)",
        reported: "exit code 1 and one line on stderr",
        says: "over the limit of 1048576 (limits.maxManifestSize) for a manifest; it is not rendered",
        test: "podstamp_render_refuses_a_manifest_over_the_size_limit",
    },
    Fault {
        id: "golden-case-differs",
        area: "podstamp test",
        fault: "a case whose render differs from its `expected.yaml` (or `expected.error`), or renders a manifest where an error is expected and the other way round",
        kept: "the expectation files, unchanged (only `--update` writes them)",
        reported: "exit code 1, a unified diff (or both error lines) under `FAILED  CASE` on stdout, one line on stderr",
        says: "the manifest differs from expected.yaml",
        test: "tests/test_command.rs: a_failing_case_prints_a_unified_diff_or_both_error_lines",
    },
    Fault {
        id: "golden-case-malformed",
        area: "podstamp test",
        fault: "a case with no `node.yaml` (or template) in it or above it, with both `expected.yaml` and `expected.error`, or a case name that is not there",
        kept: "no case runs",
        reported: "exit code 2, one line on stderr",
        says: "no node.yaml in it or above it up to .: add the Node to render for",
        test: "tests/test_command.rs: a_malformed_case_stops_the_run_with_one_line_and_exit_2",
    },
    Fault {
        id: "golden-case-unrecorded",
        area: "podstamp test",
        fault: "a case without an expectation",
        kept: "nothing written until `--update`",
        reported: "exit code 1, `FAILED  CASE` on stdout",
        says: "record what it renders with `podstamp test --update`",
        test: "tests/test_command.rs: update_records_what_renders_and_then_every_case_passes",
    },
    Fault {
        id: "plugin-new-refused",
        area: "podstamp plugin new",
        fault: "a name that is not a package name, a `--dir` that exists and is not empty, a `--plugins` directory without the language's SDK",
        kept: "the directory given, untouched; no staging directory left",
        reported: "exit code 2, one line on stderr",
        says: "exists and is not empty; choose another directory",
        test: "tests/scaffold.rs: plugin_new_refuses_with_one_line_and_writes_nothing",
    },
    Fault {
        id: "plugin-settings-refused-at-load",
        area: "plugin",
        fault: "settings a plugin refuses (its WIT 0.1.1 `validate-settings`: the SDK's type check, or the plugin's own, as `arch-image`'s empty image), given to `podstamp render` by `--plugin` or a catalog entry, even one no chain uses",
        kept: "nothing rendered; no output file",
        reported: "exit code 2, one line on stderr naming the entry and the field inside the settings",
        says: "an empty image; give the image for this architecture, or remove the entry",
        test: "tests/render.rs: settings_a_plugin_refuses_are_refused_at_load_naming_the_field",
    },
    Fault {
        id: "plugin-validate-settings-fails",
        area: "plugin",
        fault: "a `validate-settings` that traps or loops",
        kept: "the catalog is refused (`render`: exit 1); the call is stopped at its deadline like any call",
        reported: "exit code 1 and one line on stderr; `CallFailure::Trap` / `DeadlineExceeded` from the library",
        says: "validate-settings failed: trapped",
        test: "tests/render.rs: settings_a_plugin_refuses_are_refused_at_load_naming_the_field",
    },
    Fault {
        id: "template-duplicate-name",
        area: "template",
        fault: "two files with the same pod name",
        kept: "the first template's manifest, unchanged; the later one is not written",
        reported: "NameConflict",
        says: "pod name \"dup\" is already produced by PodTemplate kube-system/dup",
        test: "huge_duplicate_and_flapping_templates_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-flapping",
        area: "template",
        fault: "a template flipping between valid and invalid (5 times)",
        kept: "each valid version is written; each invalid one keeps the last good manifest, unchanged",
        reported: "InvalidTemplate",
        says: "containerz",
        test: "huge_duplicate_and_flapping_templates_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-long-map-key",
        area: "template",
        fault: "a map key over 1024 characters (a 1100-character `flexVolume.options` key, which the kubelet allows), then a daemon restart",
        kept: "written with the key as a YAML explicit key (`? key`), which the kubelet's decoder accepts; after the restart the file is recognised as podstamp's (not foreign) and updated",
        reported: "not a failure",
        says: "found manifests of ours",
        test: "a_key_over_1024_characters_is_written_readably_and_read_back_after_a_restart",
    },
    Fault {
        id: "template-manifest-unreadable",
        area: "template",
        fault: "a manifest whose YAML would not read back as the pod (as a key over 1024 characters once did); every manifest is read back before it is written",
        kept: "nothing written; the last good manifest stays",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "podstamp cannot read back the manifest it made for the pod, so it is not written",
        test: "a_manifest_that_does_not_read_back_is_refused",
    },
    Fault {
        id: "template-node-selector-value",
        area: "template",
        fault: "a `nodeSelector` value the kubelet refuses as a label value (`\"a\\u2028b\"`)",
        kept: "nothing written (the kubelet's decoder refuses the file)",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "spec.nodeSelector.disk: value \"a\\u{2028}b\": may only contain letters, digits, \u{27}-\u{27}, \u{27}_\u{27} and \u{27}.\u{27}",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "template-api-reference",
        area: "template",
        fault: "a reference to an API object (a ConfigMap volume; also Secrets, ServiceAccounts, claims, CSI, projected tokens), which a static pod may not have",
        kept: "nothing written (the kubelet's decoder refuses the file)",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "spec.volumes[0].configMap: a static pod may not reference a ConfigMap",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "template-policy-typo",
        area: "template",
        fault: "an enumerated field misspelt (`imagePullPolicy: always`; also `restartPolicy`, `dnsPolicy`, a port\u{27}s `protocol`), or an environment variable name with `=` or a non-ASCII character",
        kept: "nothing written (the kubelet's decoder refuses the file)",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "spec.containers[0].imagePullPolicy: \"always\" is not one of Always, Never, IfNotPresent",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "template-mount-unknown-volume",
        area: "template",
        fault: "a `volumeMounts` entry naming no volume of the pod (also duplicate or invalid volume names, an empty or repeated mount path)",
        kept: "nothing written (the kubelet's decoder refuses the file)",
        reported: "RenderFailed (exit 1 for `podstamp render`)",
        says: "spec.containers[0].volumeMounts[0].name: \"cfg\" names no volume in spec.volumes",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "template-chain-repeat",
        area: "template",
        fault: "`podstamp.io/plugins: identity, identity` (a plugin named twice)",
        kept: "last good manifest, unchanged; other templates keep rendering",
        reported: "InvalidChain",
        says: "metadata.annotations[\"podstamp.io/plugins\"]: names plugin \"identity\" more than once; a chain runs each plugin at most once: list it once",
        test: "long_repeated_and_slow_chains_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-chain-too-long",
        area: "template",
        fault: "`podstamp.io/plugins` naming 24,000 plugins (`identity,` 24,000 times, 216 KB), with 19 in the catalog",
        kept: "last good manifest, unchanged; no plugin is called; other templates keep rendering",
        reported: "InvalidChain",
        says: "names 24000 plugins, but a chain runs each catalog plugin at most once and the catalog has 19",
        test: "long_repeated_and_slow_chains_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-chain-over-budget",
        area: "template",
        fault: "a chain (`identity,loop`) over the render's time budget, `limits.renderTimeout: 300ms`, equal to the per-call `timeout`: the loop gets only what is left of the budget",
        kept: "last good manifest, unchanged; the call stopped when the budget ran out; other templates keep rendering",
        reported: "RenderFailed",
        says: "plugin 2 of 2 `loop` (wat 0.0.1): the render's time budget of 300 ms (limits.renderTimeout) ran out at this plugin; the render was stopped",
        test: "long_repeated_and_slow_chains_keep_the_last_good_manifest",
    },
    Fault {
        id: "template-mandatory-opt-out",
        area: "template",
        fault: "a template that opts out of a `mandatory: true` plugin (`podstamp.io/plugins: \"\"`), or picks a plugin that would undo it (`podstamp render`)",
        kept: "the manifest has the mandatory plugin's output: it runs after the template's own plugins, for every template",
        reported: "not a failure (without `mandatory`, the template's choice wins: plugins are transforms, not a policy)",
        says: "image: policy:1",
        test: "mandatory_plugins_run_last_whatever_the_template_picks",
    },
    Fault {
        id: "template-settings-not-in-chain",
        area: "template",
        fault: "a `podstamp.io/settings` annotation with settings for a plugin that is not in the template's chain",
        kept: "last good manifest, unchanged (same inode and mtime); other templates keep rendering; fixed, it renders again",
        reported: "InvalidSettings",
        says: "metadata.annotations[\"podstamp.io/settings\"].loop: plugin \"loop\" is not in this template's chain (identity)",
        test: "a_bad_settings_annotation_fails_its_template_only",
    },
    Fault {
        id: "template-settings-invalid",
        area: "template",
        fault: "a `podstamp.io/settings` annotation that is not YAML, not a mapping, names an unknown plugin, one not in the chain, or a `mandatory` one (`podstamp render`)",
        kept: "nothing rendered for that template; `podstamp render` exits 1 (the daemon: as the row above)",
        reported: "one line naming the template, the annotation, the plugin and the field",
        says: "is mandatory: its settings are the platform's (the catalog's) and a template cannot change them",
        test: "tests/render.rs: a_bad_settings_annotation_names_the_annotation_the_plugin_and_the_field",
    },
    Fault {
        id: "plugin-output-kubelet-refuses",
        area: "plugin",
        fault: "output the kubelet refuses: a host alias IP (from the `substitute` plugin's settings) that is not an IP",
        kept: PLUGIN_KEPT,
        reported: "RenderFailed",
        says: "would refuse it, and stop the pod running from it: spec.hostAliases[0].ip: \"registry.local\" is invalid: must be a valid IP address",
        test: "a_plugin_output_the_kubelet_refuses_keeps_the_last_good_manifest",
    },
    Fault {
        id: "template-kubelet-probe",
        area: "template",
        fault: "a liveness probe with `successThreshold: 5` (the kubelet's rule, beyond podstamp's own checks; `podstamp render`)",
        kept: "nothing written; exit 1",
        reported: "one line naming the template and the field, with what it must be",
        says: "spec.containers[0].livenessProbe.successThreshold: 5 is invalid: must be 1",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "template-kubelet-toleration",
        area: "template",
        fault: "a `tolerationSeconds` on a `NoSchedule` toleration (`podstamp render`)",
        kept: "nothing written; exit 1",
        reported: "one line naming the template and the field, with what it must be",
        says: "spec.tolerations[0].effect: \"NoSchedule\" is invalid: effect must be 'NoExecute' when `tolerationSeconds` is set",
        test: "fields_the_kubelet_refuses_are_refused_naming_the_field",
    },
    Fault {
        id: "kubelet-newer-fields",
        area: "template",
        fault: "a field newer than the node's kubelet (`restartPolicyRules` for a v1.34.0 kubelet, from the Node's `status.nodeInfo.kubeletVersion`)",
        kept: "written (that kubelet runs the pod without the field), with a warning naming the fields; with `PODSTAMP_REFUSE_NEWER_FIELDS=true`, refused and the last good manifest kept",
        reported: "`podstamp_kubelet_newer_fields_total{node=...}`; refused: RenderFailed",
        says: "fields newer than the node's kubelet, which runs the pod without them",
        test: "fields_newer_than_the_nodes_kubelet_are_a_warning_or_a_refusal",
    },
    Fault {
        id: "kubecheck-cannot-run",
        area: "pod check",
        fault: "the pod check (`podstamp-kubecheck`) cannot load: missing (`PODSTAMP_KUBECHECK` names no file), or not the pod check (a program that exits at once)",
        kept: "nothing is written unchecked: `podstamp render` exits 1; the daemon keeps the last good manifest (same inode and mtime), and a manifest equal to the render is left as it is",
        reported: "RenderFailed",
        says: "podstamp cannot check the pod as the kubelet would, so it is not written",
        test: "a_pod_check_that_cannot_run_writes_nothing",
    },
    Fault {
        id: "pod-security-violated",
        area: "pod security",
        fault: "a rendered pod below its Pod Security level (a template, or a plugin's output such as the attacker's of issue 26: hostPID, hostNetwork, a hostPath `/` at /host, privileged)",
        kept: "nothing written: `podstamp render` exits 1 and prints no manifest; the level's checks are Kubernetes' own (k8s.io/pod-security-admission/policy)",
        reported: "exit 1; one line naming the template, the level, where the level came from and every check that failed",
        says: "does not meet Pod Security level baseline:latest (from podstamp's default (podSecurity)): forbidden: host namespaces",
        test: "tests/pod_security.rs: render_holds_the_pod_to_the_configured_level_and_says_which",
    },
    Fault {
        id: "pod-security-helper-too-old",
        area: "pod security",
        fault: "the pod check predates the Pod Security request (its greeting has no `podSecurity`)",
        kept: "it is never sent the request (it would read it as a node name); the check fails, nothing is written",
        reported: "the render's error (a check that could not run, not a pass)",
        says: "has no Pod Security check",
        test: "tests/pod_security.rs: a_helper_without_the_pod_security_check_is_a_check_that_fails",
    },
    Fault {
        id: "kubecheck-prefetch-fails",
        area: "pod check",
        fault: "the pod check cannot start, or fails, while a pass sends it many manifests at once (the prefetch, several requests in flight)",
        kept: "the prefetch only fills the check's memo: the helper is stopped (answers may be left in its pipe), and each template's own check before its write asks again or fails as without it; nothing is written unchecked",
        reported: "as `kubecheck-cannot-run` when the template's own check fails too (RenderFailed)",
        says: "build-kubecheck.sh",
        test: "tests/pod_security.rs: a_prefetch_sends_what_the_checks_would_and_they_then_send_nothing",
    },
    Fault {
        id: "pod-security-bad-level",
        area: "pod security",
        fault: "a level that is no level or version: the template's `podstamp.io/pod-security` annotation, or `--pod-security` / `PODSTAMP_POD_SECURITY` / `podSecurity`",
        kept: "never read as another level: the template is not rendered (annotation, exit 1), podstamp does not start its render (setting, exit 2)",
        reported: "one line naming the object or setting, the field and the accepted values",
        says: "is not a Pod Security level",
        test: "tests/pod_security.rs: a_level_that_is_no_level_is_refused_where_it_was_given",
    },
    Fault {
        id: "pod-security-loosening-annotation",
        area: "pod security",
        fault: "a template's annotation asks for a level less strict than its namespace's or the configuration's (`podstamp.io/pod-security: privileged`)",
        kept: "not applied: the stricter level holds, and its refusal says the annotation asked for less",
        reported: "exit 1 when the pod does not meet the stricter level",
        says: "which only a namespace label or podstamp's configuration can grant",
        test: "tests/pod_security.rs: a_templates_annotation_only_makes_the_level_stricter",
    },
    Fault {
        id: "pod-security-namespace-label",
        area: "pod security",
        fault: "the daemon renders a template whose plugin chain's output is baseline but not restricted, in a Namespace labelled `pod-security.kubernetes.io/enforce: restricted`",
        kept: "the last good manifest (same bytes, inode and mtime); relabelled `baseline`, the render is written with no edit of the template",
        reported: "RenderFailed; an Event on the template and a warning naming the level, the Namespace's label it came from and every check that failed",
        says: "does not meet Pod Security level restricted:latest (from the namespace ",
        test: "tests/daemon.rs: the_namespace_label_holds_every_render_to_its_pod_security_level",
    },
    Fault {
        id: "pod-security-namespace-unreadable",
        area: "pod security",
        fault: "the daemon cannot read its Namespace's Pod Security labels (RBAC without get/list/watch on namespaces, resourceNames [its namespace])",
        kept: "nothing renders (no pod is written at a level looser than the label's for want of reading it); manifests on disk are kept; once read, the labels last read hold through a later watch failure",
        reported: "a warning naming the permission (deploy/rbac.yaml) and the API server's refusal; `podstamp_watch_restarts_total{watch=\"namespace\"}`",
        says: "nothing is rendered until its Pod Security labels",
        test: "tests/daemon.rs: the_namespace_label_holds_every_render_to_its_pod_security_level",
    },
    Fault {
        id: "pod-security-namespace-watch-lost",
        area: "pod security",
        fault: "the Namespace watch fails after its first read (the permission to read the Namespace taken away; the watch renewed and refused)",
        kept: "the Pod Security labels last read stay in force: a template changed after the failure is still held to the namespace's level (refused at restricted, where the configured baseline would write it); manifests on disk are kept",
        reported: "the watch's refusal, naming the permission; a warning that the labels as last read hold; `podstamp_watch_restarts_total{watch=\"namespace\"}`",
        says: "its Pod Security labels as last read hold until it is watched again",
        test: "tests/daemon.rs: a_namespace_watch_that_fails_after_its_first_read_keeps_the_last_level",
    },
    Fault {
        id: "pod-security-reload-over-level",
        area: "pod security",
        fault: "a reload of the configuration brings a plugin granted the field it changes (the attacker of issue 26 with `scope: [spec.hostPID]`) whose output fails the level of the template's namespace (labelled `enforce: baseline` after its pod was written at privileged)",
        kept: "the running manifest (same bytes) and the real kubelet's container (same id), the mirror pod Ready at its revision; the pod already in place is not refused by the stricter label",
        reported: "RenderFailed; an Event on the template naming the level, the namespace's label it came from and every check that failed",
        says: "host namespaces (hostNetwork=true, hostPID=true)",
        test: "tests/kubelet.rs: a_reload_bringing_a_plugin_over_the_pod_security_level_leaves_the_running_pod_alone",
    },
    Fault {
        id: "disk-dir-missing",
        area: "disk",
        fault: "manifest directory missing at start",
        kept: "created (with its parents), then filled",
        reported: "not a failure",
        says: "wrote manifest",
        test: "a_missing_or_vanished_manifest_dir",
    },
    Fault {
        id: "disk-dir-removed",
        area: "disk",
        fault: "manifest directory removed while running",
        kept: "not recreated by podstamp; filled again at the next resync once it exists",
        reported: "WriteFailed",
        says: "No such file or directory",
        test: "a_missing_or_vanished_manifest_dir",
    },
    Fault {
        id: "disk-read-only",
        area: "disk",
        fault: "manifest directory read-only (tmpfs remounted `ro`)",
        kept: "last good manifest, unchanged; the new version is written at the next resync after `rw`",
        reported: "WriteFailed",
        says: "Read-only file system",
        test: "a_read_only_manifest_dir_keeps_the_last_good_manifest",
    },
    Fault {
        id: "disk-full",
        area: "disk",
        fault: "disk full (a 64 KiB tmpfs, filled)",
        kept: "last good manifest, unchanged; no temp file left; written at the next resync once there is room",
        reported: "WriteFailed",
        says: "No space left on device",
        test: "a_full_disk_keeps_the_last_good_manifest_and_no_temp_file",
    },
    Fault {
        id: "disk-symlink-planted",
        area: "disk",
        fault: "a symlink planted where a manifest goes",
        kept: "the symlink and its target, untouched",
        reported: "ForeignFile",
        says: "exists and is not podstamp's; it is left alone",
        test: "symlinks_where_manifests_go_are_never_followed",
    },
    Fault {
        id: "disk-symlink-replacing-ours",
        area: "disk",
        fault: "our manifest replaced by a symlink while running",
        kept: "the symlink and its target, untouched",
        reported: "WriteFailed",
        says: "is a symlink; refusing to replace it",
        test: "symlinks_where_manifests_go_are_never_followed",
    },
    Fault {
        id: "disk-pass-staged-not-renamed",
        area: "disk",
        fault: "the daemon killed between a pass's staged, fsynced `.podstamp-*` files and their renames (host/src/daemon/reconcile/batch.rs; the state is planted on disk, since the window cannot be hit from outside)",
        kept: "every manifest byte for byte as before the pass, accepted by the kubelet's decoder; the restart removes the temp files (which the kubelet ignores) and writes the new versions",
        reported: "not a failure (the process is killed); an info line at the restart",
        says: "removed stale temporary files",
        test: "a_pass_killed_between_its_staged_files_and_their_renames_keeps_every_old_manifest",
    },
    Fault {
        id: "disk-kill-9",
        area: "disk",
        fault: "`kill -9` of the daemon during a burst of updates, then a restart",
        kept: "every non-dot file is whole and accepted by the kubelet's decoder; only `.podstamp-*` temp files (ignored by the kubelet) can be left, and the restart removes them; the restarted daemon converges on the last versions",
        reported: "not a failure (the process is killed)",
        says: "first sync done",
        test: "kill_9_during_a_burst_leaves_only_whole_manifests_and_a_restart_converges",
    },
    Fault {
        id: "cache-parent-writable",
        area: "disk",
        fault: "code cache directory (ours, 0700) inside a directory others can write (0777, not sticky), where it could be renamed away and replaced",
        kept: "nothing written; refused at start: `podstamp render` exits 1, `podstamp run` exits 2",
        reported: "exit code and one line on stderr naming the directory and the fix",
        says: "is writable by group or others (mode 0777) and not sticky",
        test: "tests/render.rs: an_unsafe_cache_dir_is_refused_with_what_to_do",
    },
    Fault {
        id: "cache-dir-writable",
        area: "disk",
        fault: "code cache directory itself world-writable (0777, as the kubelet makes an emptyDir)",
        kept: "nothing written; refused at start: `podstamp render` exits 1, `podstamp run` exits 2",
        reported: "exit code and one line on stderr naming the directory and the fix",
        says: "run `chmod 0700",
        test: "tests/render.rs: an_unsafe_cache_dir_is_refused_with_what_to_do",
    },
    Fault {
        id: "cache-dir-foreign-owner",
        area: "disk",
        fault: "code cache directory owned by another user",
        kept: "nothing written; refused at start: `podstamp render` exits 1, `podstamp run` exits 2",
        reported: "exit code and one line on stderr naming the directory and the fix",
        says: "belongs to uid 65534, not to this user",
        test: "tests/render.rs: an_unsafe_cache_dir_is_refused_with_what_to_do",
    },
    Fault {
        id: "cache-dir-symlink",
        area: "disk",
        fault: "code cache directory given as a symlink (to a good directory)",
        kept: "nothing written; refused at start: `podstamp render` exits 1, `podstamp run` exits 2; the link is not followed",
        reported: "exit code and one line on stderr naming the directory and the fix",
        says: "is a symbolic link, which the code cache does not follow",
        test: "tests/render.rs: an_unsafe_cache_dir_is_refused_with_what_to_do",
    },
    Fault {
        id: "cache-entry-copied",
        area: "disk",
        fault: "one plugin's compiled code copied under another plugin's cache entry name",
        kept: "the right plugin's code runs: the entry is recompiled and replaced; output unchanged",
        reported: "a warning naming the entry",
        says: "holds the code of component sha256",
        test: "tests/render.rs: a_cache_entry_copied_or_linked_under_another_plugins_name_is_not_run",
    },
    Fault {
        id: "cache-entry-symlink",
        area: "disk",
        fault: "a cache entry replaced by a symlink to another plugin's entry",
        kept: "the right plugin's code runs: the entry is recompiled and replaced; output unchanged; the link is not followed",
        reported: "a warning naming the entry",
        says: "is a symbolic link",
        test: "tests/render.rs: a_cache_entry_copied_or_linked_under_another_plugins_name_is_not_run",
    },
    Fault {
        id: "cache-entry-foreign-owner",
        area: "disk",
        fault: "a cache entry owned by another user",
        kept: "the right plugin's code runs: the entry is recompiled and replaced; output unchanged",
        reported: "a warning naming the entry",
        says: "belongs to uid 65534",
        test: "tests/render.rs: a_cache_entry_copied_or_linked_under_another_plugins_name_is_not_run",
    },
    Fault {
        id: "cache-sudo-home",
        area: "disk",
        fault: "`sudo -E podstamp render`: root with the invoking user's `$HOME` and `$XDG_CACHE_HOME`",
        kept: "the user's cache is neither read nor written: root's default is /var/cache/podstamp",
        reported: "not a failure",
        says: "root's default cache is /var/cache/podstamp",
        test: "tests/render.rs: root_never_uses_the_invoking_users_cache",
    },
    Fault {
        id: "daemon-connection-flood",
        area: "daemon",
        fault: "400 idle connections held open to the metrics port, the daemon started with an open file limit of 64 (soft) / 256 (hard)",
        kept: "the soft limit raised to the hard one; at most 64 connections held (a new one closes the oldest); /healthz answers; a template written meanwhile is rendered; no `Too many open files`",
        reported: "not a failure; the raised limit and the connection cap are logged at start",
        says: "raised the open file limit (RLIMIT_NOFILE) from 64 to 256",
        test: "a_connection_flood_on_the_metrics_port_takes_no_descriptors_from_rendering",
    },
    Fault {
        id: "daemon-template-unreadable",
        area: "daemon",
        fault: "a template file edited while it cannot be read: `Too many open files` (the running daemon's open file limit lowered to what it has open, with prlimit(2))",
        kept: "last good manifest, unchanged; the file is read again with backoff (not only at resync) and the edit is rendered once the limit is back, with no further change to the file",
        reported: "ReadFailed",
        says: "cannot read the template file: Too many open files",
        test: "an_unreadable_template_file_is_retried_and_is_not_its_fault",
    },
    Fault {
        id: "daemon-template-dir-gone",
        area: "daemon",
        fault: "the template directory of the `dir:` source moved away, then back with an edited template",
        kept: "every manifest, untouched while the directory is gone (nothing is garbage-collected without a complete listing); the directory is watched and listed again with backoff, and the edit is rendered once it is back",
        reported: "log",
        says: "the template directory went away; keeping the manifests as they are, and trying again",
        test: "a_template_directory_that_goes_away_and_comes_back_is_followed_again",
    },
    Fault {
        id: "reload-config-bad-yaml",
        area: "daemon",
        fault: "the configuration file of a running daemon edited in place into YAML that does not parse",
        kept: RELOAD_KEPT,
        reported: RELOAD_REFUSED,
        says: "did not find expected ',' or ']'",
        test: "tests/daemon.rs: a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest",
    },
    Fault {
        id: "reload-plugin-missing",
        area: "daemon",
        fault: "a catalog entry's `path` changed, in a running daemon's configuration file, to a file that does not exist",
        kept: RELOAD_KEPT,
        reported: RELOAD_REFUSED,
        says: "cannot read plugin: No such file or directory",
        test: "tests/daemon.rs: a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest",
    },
    Fault {
        id: "reload-plugin-not-a-component",
        area: "daemon",
        fault: "a catalog entry's `path` changed, in a running daemon's configuration file, to a file that is not a WebAssembly component",
        kept: RELOAD_KEPT,
        reported: RELOAD_REFUSED,
        says: "not a valid WebAssembly component",
        test: "tests/daemon.rs: a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest",
    },
    Fault {
        id: "reload-plugin-settings-refused",
        area: "daemon",
        fault: "a catalog entry's settings changed, in a running daemon's configuration file, to a value the plugin's `validate-settings` refuses (WIT 0.1.1)",
        kept: RELOAD_KEPT,
        reported: RELOAD_REFUSED,
        says: "plugins.substitute: settings.vars.greeting: invalid type: sequence, expected a string (refused by the plugin substitute 0.1.0's validate-settings; fix the settings)",
        test: "tests/daemon.rs: a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest",
    },
    Fault {
        id: "reload-configmap-swap-bad-chain",
        area: "daemon",
        fault: "the configuration file mounted from a ConfigMap, swapped by the kubelet (`..data`) to a catalog whose chain names an unknown plugin",
        kept: RELOAD_KEPT,
        reported: RELOAD_REFUSED,
        says: "chain: unknown plugin \"nope\"",
        test: "tests/daemon.rs: the_config_file_reloads_when_renamed_into_place_or_swapped_by_the_kubelet",
    },
    Fault {
        id: "reload-node-local-setting",
        area: "daemon",
        fault: "a node-local setting (`namespace`) changed in a running daemon's configuration file",
        kept: "the value in use (manifests keep `namespace: kube-system`); the catalog in use and every manifest unchanged",
        reported: "a warning in the log, once per new value; `podstamp_config_reloads_total{result=\"unchanged\"}`",
        says: "needs a restart to take effect; still using",
        test: "tests/daemon.rs: a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest",
    },
    Fault {
        id: "reload-configmap-digest-mismatch",
        area: "daemon",
        fault: "a plugin ConfigMap the catalog pins (API source) now holds another component: its sha256 differs from the pin",
        kept: RELOAD_KEPT,
        reported: API_CATALOG_REFUSED,
        says: "but the catalog pins",
        test: "tests/daemon.rs: a_catalog_and_plugins_from_configmaps_render_reload_and_refuse",
    },
    Fault {
        id: "reload-configmap-missing-key",
        area: "daemon",
        fault: "the catalog ConfigMap names a key its plugin ConfigMap does not have",
        kept: RELOAD_KEPT,
        reported: API_CATALOG_REFUSED,
        says: "missing (binaryData has: plugin.wasm)",
        test: "tests/daemon.rs: a_catalog_and_plugins_from_configmaps_render_reload_and_refuse",
    },
    Fault {
        id: "reload-catalog-configmap-broken",
        area: "daemon",
        fault: "the catalog ConfigMap (`daemon.catalog.configMap`) edited to a `catalog.yaml` that does not parse",
        kept: RELOAD_KEPT,
        reported: "`podstamp_config_reloads_total{result=\"refused\"}`, an error in the log naming the ConfigMap and key, and a `CatalogRefused` Event on the catalog ConfigMap",
        says: "key catalog.yaml",
        test: "tests/daemon.rs: a_catalog_and_plugins_from_configmaps_render_reload_and_refuse",
    },
    Fault {
        id: "reload-plugin-configmap-deleted",
        area: "daemon",
        fault: "a plugin ConfigMap the catalog in use pins is deleted",
        kept: "the catalog in use keeps serving (its compiled component stays loaded); every manifest stays, and templates that change meanwhile still render",
        reported: "`podstamp_config_reloads_total{result=\"refused\"}`, an error in the log saying which ConfigMap does not exist, and a `CatalogRefused` Event on the catalog ConfigMap",
        says: "does not exist",
        test: "tests/daemon.rs: a_catalog_and_plugins_from_configmaps_render_reload_and_refuse",
    },
    Fault {
        id: "reload-catalog-configmap-deleted",
        area: "daemon",
        fault: "the catalog ConfigMap (`daemon.catalog.configMap`) is deleted while the daemon runs, then created again",
        kept: "the catalog in use keeps serving (templates that change meanwhile still render through its plugins); nothing rewritten or removed; the ConfigMap created again is applied",
        reported: "`podstamp_config_reloads_total{result=\"refused\"}` and one error line saying the ConfigMap does not exist and that the catalog in use keeps serving (no Event: the object it would go on is gone)",
        says: "does not exist: create it (its key catalog.yaml holds plugins and chain)",
        test: "tests/daemon.rs: the_catalog_config_map_deleted_keeps_the_catalog_in_use_until_it_is_back",
    },
    Fault {
        id: "reload-configmap-not-granted",
        area: "daemon",
        fault: "the catalog pins a ConfigMap that the Role's `resourceNames` does not grant",
        kept: RELOAD_KEPT,
        reported: "`podstamp_config_reloads_total{result=\"refused\"}` and an error in the log naming the ConfigMap and the permission to add (its name in the Role's resourceNames)",
        says: "resourceNames",
        test: "tests/daemon.rs: a_catalog_and_plugins_from_configmaps_render_reload_and_refuse",
    },
    Fault {
        id: "start-api-down-remembered-catalog",
        area: "daemon",
        fault: "`podstamp run` starts with a catalog from a ConfigMap while the API server does not answer, after a catalog from the API was applied on this node",
        kept: "runs the remembered catalog (same digest), its components from the code cache; every manifest kept; the API's catalog replaces it when the API server answers",
        reported: "a warning naming the catalog digest and that it runs from disk",
        says: "running from disk",
        test: "tests/daemon.rs: with_the_api_down_at_start_the_daemon_runs_the_remembered_catalog",
    },
    Fault {
        id: "start-api-down-no-record",
        area: "daemon",
        fault: "the same with no remembered catalog (a fresh code cache) or a pinned component not in the cache",
        kept: "nothing rendered and nothing removed (manifests on disk kept); not ready; the catalog loads when the API server answers",
        reported: "`podstamp_config_reloads_total{result=\"refused\"}` and an error saying what is missing and that nothing is rendered until the API server answers",
        says: "no catalog from ConfigMap",
        test: "tests/daemon.rs: with_the_api_down_at_start_the_daemon_runs_the_remembered_catalog",
    },
    Fault {
        id: "api-401",
        area: "API server",
        fault: "a bearer token the API server does not know (401)",
        kept: "every manifest, ours and foreign, untouched; not ready; retried with backoff",
        reported: "unauthorized",
        says: "check the bearer token or client certificate of the kubeconfig (--kubeconfig) or the ServiceAccount token",
        test: "rejected_credentials_or_missing_permissions_are_named_and_touch_nothing",
    },
    Fault {
        id: "api-403",
        area: "API server",
        fault: "an authenticated user without any RBAC binding (403)",
        kept: "every manifest, ours and foreign, untouched; not ready; retried with backoff",
        reported: "permission denied",
        says: "User \"nobody\" cannot list resource \"podtemplates\" in API group \"\" in the namespace \"NS\"",
        test: "rejected_credentials_or_missing_permissions_are_named_and_touch_nothing",
    },
    Fault {
        id: "api-410-gone",
        area: "API server",
        fault: "watch history compacted (`--etcd-compaction-interval=1s --watch-cache=false`, watches renewed every 2 s by `--watch-timeout 2s`): resourceVersion expired, 410 Gone",
        kept: "the manifest untouched by the relist (same inode and mtime); still ready; later updates flow",
        reported: "a warning; `podstamp_watch_restarts_total`; one more list in `podstamp_watch_lists_total` (and in the API server's count of LIST requests)",
        says: "watch history expired (410 Gone",
        test: "an_expired_watch_history_is_a_relist_that_changes_nothing",
    },
    Fault {
        id: "api-slow",
        area: "API server",
        fault: "slow responses (every chunk delayed 300 ms by a proxy), then stalled for 3 s, then slow again",
        kept: "converges through the slow path; while stalled nothing on disk changes and /healthz stays 200; the held update is applied once it arrives",
        reported: "not a failure",
        says: "wrote manifest",
        test: "slow_and_stalled_api_responses_converge_and_change_nothing_meanwhile",
    },
    Fault {
        id: "api-killed-mid-watch",
        area: "API server",
        fault: "killed (SIGKILL) under a running daemon, a template deleted while it is down, started with the API down, then restarted",
        kept: "every manifest untouched while it is down (not ready when started without it); after the restart a relist removes the deleted template's manifest and updates flow again",
        reported: "`podstamp_watch_restarts_total{watch=\"podtemplates\"}`; a warning",
        says: "unreachable",
        test: "tests/daemon.rs: an_api_outage_changes_nothing_on_disk_and_a_relist_catches_up",
    },
    Fault {
        id: "api-403-one-verb",
        area: "API server",
        fault: "the deploy/ RBAC without `list` on podtemplates",
        kept: "nothing written; not ready",
        reported: "permission denied",
        says: "cannot list resource",
        test: "tests/daemon.rs: the_deploy_rbac_is_enough_and_a_missing_permission_is_named",
    },
    Fault {
        id: "api-undecodable-template",
        area: "API server",
        fault: "a PodTemplate the API server stores but the typed model (k8s-openapi) cannot decode: `template.metadata.creationTimestamp: 9999-12-31T23:59:59Z`, past the time library's range",
        kept: "each template is read on its own: this one is written with the field dropped, the others are written and their later edits applied; ready; no template's content in the log",
        reported: "a warning naming the template and the field (the field means nothing for a static pod)",
        says: "ignoring template.metadata.creationTimestamp",
        test: "an_undecodable_template_is_read_alone",
    },
    Fault {
        id: "api-undecodable-node",
        area: "API server",
        fault: "the Node has a field the typed model cannot decode (a taint's `timeAdded: 9999-12-31T23:59:59Z`)",
        kept: "rendering goes on; a change of the Node's labels is applied; ready",
        reported: "a warning naming the Node and the field",
        says: "spec.taints[0].timeAdded",
        test: "an_undecodable_node_field_stops_nothing",
    },
    Fault {
        id: "template-node-selector-bad",
        area: "template",
        fault: "a `podstamp.io/node-selector` that does not parse (`role in (cp`: the values not closed)",
        kept: "nothing written for the template on any node, and nothing removed for it (a manifest already in place stays, as for any failed render); other templates keep rendering",
        reported: "InvalidTemplate (an Event on the PodTemplate naming the annotation, the character and the fix)",
        says: "give a label selector as kubectl takes it",
        test: "tests/daemon.rs: a_template_is_written_only_on_the_nodes_its_node_selector_selects",
    },
    Fault {
        id: "render-not-for-this-node",
        area: "template",
        fault: "`podstamp render` of a template whose `podstamp.io/node-selector` does not select the node given (`--node`, `--node-label`)",
        kept: "nothing printed, no output file",
        reported: "exit code 3 and one line on stderr naming the template, the node and the selector",
        says: "does not select the node's labels; nothing is rendered (exit code 3)",
        test: "tests/render.rs: a_template_not_for_this_node_renders_nothing_and_says_so",
    },
    Fault {
        id: "api-node-watch-down",
        area: "API server",
        fault: "the Node watch down (the API server gone) with templates whose `podstamp.io/node-selector` selects the node",
        kept: "every manifest as it was (same inode and mtime): the Node's labels as last seen decide which templates are for it; nothing is installed or removed for a label change until the watch lists or resumes",
        reported: "a warning once per outage, and `the Node is watched again` after; `podstamp_watch_restarts_total{watch=\"node\"}`",
        says: "the Node cannot be watched: its labels as last seen decide",
        test: "tests/daemon.rs: the_node_watch_down_keeps_what_the_selector_wrote_and_says_so",
    },
    Fault {
        id: "api-watch-dropped",
        area: "API server",
        fault: "every connection to the API server cut (by a proxy that also refuses new ones) until each watch has failed to resume; meanwhile a template is deleted and another changed",
        kept: "every manifest untouched while cut; each watch (templates, Node, pods) resumes from the last resourceVersion it saw, without a new list (the API server's own count of LIST requests is unchanged): the deletion and the change arrive as watch events and are applied; still ready",
        reported: "`podstamp_watch_restarts_total`; `podstamp_watch_lists_total` unchanged; a warning for each failed attempt",
        says: "watch resumed where it stopped",
        test: "a_dropped_watch_resumes_where_it_stopped_without_a_list",
    },
    Fault {
        id: "kubelet-crash-loop",
        area: "kubelet",
        fault: "an update whose container exits 1, run by the real kubelet (its `CrashLoopBackOff`; the container is Ready for a moment first)",
        kept: "the previous good revision, written back from the revision history and Ready again; the failed revision is held (not written again while the template renders it)",
        reported: "`RolloutFailed` Event with the kubelet's reason and the last exit code; `podstamp_rollouts_total{result=\"failed\"}` and `{result=\"rolled_back\"}`; `podstamp_template_revision{phase}`",
        says: "CrashLoopBackOff",
        test: "tests/kubelet.rs: a_failing_update_is_rolled_back_with_the_kubelets_reason",
    },
    Fault {
        id: "kubelet-image-not-present",
        area: "kubelet",
        fault: "an update to an image the node does not have, with `imagePullPolicy: Never`",
        kept: "the previous good revision, written back and Ready again",
        reported: "`RolloutFailed` Event with the kubelet's reason",
        says: "ErrImageNeverPull",
        test: "tests/kubelet.rs: a_failing_update_is_rolled_back_with_the_kubelets_reason",
    },
    Fault {
        id: "kubelet-first-revision-fails",
        area: "kubelet",
        fault: "the first revision ever written for a template fails on the node (an image it does not have)",
        kept: "that revision: there is nothing to fall back to",
        reported: "`RolloutFailed` Event; `podstamp_template_revision{phase=\"failed\"}`",
        says: "nothing to fall back to: it stays",
        test: "tests/kubelet.rs: a_first_revision_that_fails_stays_and_is_reported",
    },
    Fault {
        id: "cri-socket-unreachable",
        area: "rollouts",
        fault: "the container runtime's CRI socket is missing, or is not a CRI runtime's (`daemon.criSocket`)",
        kept: "everything as before: rollouts are followed through the mirror pods only (none judged while the API server is down); the connection is tried again every second",
        reported: "one warning (`no local evidence of rollouts`), said once until it changes, naming the socket and the setting",
        says: "set daemon.criSocket",
        test: "host/src/daemon/cri/client.rs: a_missing_socket_is_named_with_the_setting_that_fixes_it",
    },
    Fault {
        id: "probe-unreachable",
        area: "rollouts",
        fault: "a host-network pod's startup or readiness probe finds nothing listening, judged while the API server is down",
        kept: "counted against the probe's own `failureThreshold`; at it, the revision fails (`ProbeFailed`) and is rolled back as any failed revision; not run while its container does not run, nor before its startup probe passed",
        reported: "`RolloutFailed` with `ProbeFailed`, the probe, the failures in a row and the connection's error",
        says: "refused",
        test: "host/src/daemon/probes/mod.rs: readiness_waits_for_startup_and_only_a_running_container_is_probed",
    },
    Fault {
        id: "probe-grpc-not-serving",
        area: "rollouts",
        fault: "a host-network pod's `grpc` startup or readiness probe, judged while the API server is down, answers other than `SERVING` (`NOT_SERVING`, an unknown service, a server without the gRPC health protocol, nothing listening)",
        kept: "counted against the probe's own `failureThreshold` like any probe podstamp runs; at it, the revision fails (`ProbeFailed`) and is rolled back; a real etcd's health service passes it",
        reported: "`RolloutFailed` with `ProbeFailed`, the probe and what the server answered (`grpc 127.0.0.1:PORT service \"…\": NOT_SERVING`)",
        says: "NOT_SERVING",
        test: "host/src/daemon/probes/run.rs: grpc_passes_when_its_service_is_serving_and_says_what_it_is_otherwise",
    },
    Fault {
        id: "api-down-bad-revision",
        area: "kubelet",
        fault: "the API server stops (SIGKILL) right after a bad revision (a container that exits 1) is written: the mirror pod cannot be followed",
        kept: "judged from the node itself (the CRI: exited non-zero, restarted by the kubelet), rolled back and held with the API down; the good container runs again",
        reported: "the log's `rollout failed` (\"seen on the node\"); the `RolloutFailed` Event is kept on disk and published once the API server answers again; `podstamp status` shows the failed revision",
        says: "seen on the node",
        test: "tests/kubelet.rs: with_the_api_server_down_a_bad_revision_is_rolled_back_from_the_node_itself",
    },
    Fault {
        id: "api-down-restart-mid-rollout",
        area: "kubelet",
        fault: "podstamp killed (-9) while a bad revision it wrote is in place and the API server is down, then started again with the API server still down",
        kept: "the revision in place followed from its rollout state alone (`rollout-states.jsonl` `pending`: its own write), judged from the node, rolled back from the history and held, before the API answers",
        reported: "the log's `rollout failed` (\"seen on the node\"); the `RolloutFailed` Event kept on disk, published once the API server answers",
        says: "seen on the node",
        test: "tests/kubelet.rs: killed_while_the_api_server_is_down_podstamp_still_rolls_back_after_a_restart",
    },
    Fault {
        id: "rollout-event-not-reported",
        area: "rollouts",
        fault: "a rollout Event (`RolloutFailed`, `RolloutSucceeded`, `RolloutHalted`) the API server does not take",
        kept: "on disk in the template's directory of the history (`events.json`, at most 16, the oldest dropped first), tried again every 2 s, published in order once the API answers, also after a restart",
        reported: "a warning `cannot publish Event: ...; kept on disk`; the Event's note ends with when it happened",
        says: "reported once the API server answered again",
        test: "tests/kubelet.rs: with_the_api_server_down_a_bad_revision_is_rolled_back_from_the_node_itself",
    },
    Fault {
        id: "rollout-slot-taken",
        area: "rollouts",
        fault: "a template update while another node is updating it (`podstamp.io/max-unavailable: 1`)",
        kept: "the manifest in place, until the updating node's new revision is Ready for 10 s and its slot is freed",
        reported: "`update waits for a rollout slot` in the log; phase `waiting` in `podstamp status`",
        says: "waiting",
        test: "tests/rollouts.rs: an_update_rolls_one_node_at_a_time_and_a_failure_halts_it_everywhere",
    },
    Fault {
        id: "rollout-holder-killed",
        area: "rollouts",
        fault: "the daemon holding a template's rollout slot killed with -9 mid-update (or its node gone)",
        kept: "every other node's manifest until the slot's Lease has gone unrenewed for its duration (`--slot-lease-duration`); then the next node takes the slot and the rollout goes on; the killed node catches up when it is back",
        reported: "`took a rollout slot` on the next node; `podstamp_rollout_api_writes_total{object=\"slot\"}`",
        says: "took a rollout slot",
        test: "tests/rollouts.rs: a_killed_slot_holder_delays_the_rollout_by_its_lease_and_a_newer_target_supersedes",
    },
    Fault {
        id: "rollout-api-outage",
        area: "rollouts",
        fault: "the API server away for longer than a slot's lease while a node holds it mid-rollout (nobody can renew or read it)",
        kept: "the slot stays its holder's: no node takes a slot while its Lease watch does not follow, nor before it watched it unrenewed for a whole lease after coming back; the others keep their manifests",
        reported: "the watches' `the API server may be unreachable`; phase `waiting` for the others in `podstamp status`",
        says: "waiting",
        test: "tests/rollouts.rs: an_api_server_outage_mid_rollout_takes_no_slot_from_its_holder",
    },
    Fault {
        id: "rollout-no-lease-permission",
        area: "rollouts",
        fault: "a Role without `leases` (coordination.k8s.io) in the rollout namespace",
        kept: "first installs are written; an update of a manifest in place waits (never written without a slot)",
        reported: "the watch's and the write's `permission denied` naming leases and deploy/rbac.yaml; `update waits for a rollout slot`",
        says: "update waits for a rollout slot",
        test: "tests/daemon.rs: without_lease_permissions_updates_wait_and_the_permission_is_named",
    },
    Fault {
        id: "rollout-status-namespace-missing",
        area: "rollouts",
        fault: "the namespace of the nodes' status records (`daemon.rollouts.statusNamespace`, by default the rollout namespace's name and `-status`) does not exist: deploy/namespace.yaml not applied after an upgrade, or a rollout namespace renamed without it",
        kept: "first installs are written; an update of a manifest in place waits (the node's record says it waits for a slot before it takes one, and it cannot be written); nothing else is written in the rollout namespace meanwhile",
        reported: "`cannot write a rollout Lease: namespaces \"…\" not found; create the namespace (deploy/namespace.yaml), or name another with daemon.rollouts.statusNamespace (--status-namespace)`, once per distinct message, tried again with backoff; `update waits for a rollout slot`",
        says: "create the namespace (deploy/namespace.yaml), or name another with daemon.rollouts.statusNamespace (--status-namespace)",
        test: "tests/daemon.rs: without_the_status_namespace_updates_wait_and_the_namespace_is_named",
    },
    Fault {
        id: "rollout-namespace-of-the-control-plane",
        area: "rollouts",
        fault: "the rollout namespace is one where the control plane keeps its Leases: `kube-system` or `kube-node-lease` by name, or a namespace holding a `kube-scheduler`, `kube-controller-manager` or `cloud-controller-manager` Lease",
        kept: "nothing is written: by name, `podstamp run` exits 2 before it starts; by a Lease found, it exits 2 before its first rollout Lease write; with `--allow-control-plane-namespace` (`daemon.rollouts.allowControlPlaneNamespace`) it runs and says so once",
        reported: "exit code 2 and one line naming the namespace (and the Lease found), the default `podstamp-rollouts` and `--allow-control-plane-namespace`",
        says: "--allow-control-plane-namespace",
        test: "tests/node_identity.rs: a_rollout_namespace_shared_with_the_control_plane_is_refused_at_start",
    },
    Fault {
        id: "rollout-write-refused-by-the-node-policy",
        area: "rollouts",
        fault: "a rollout Lease write that deploy/node-identity.yaml refuses: a token bound to another node than `--node-name` (a misconfigured or compromised node: another node's record, a slot given to or freed for another node, foreign labels, a duration over 300 s)",
        kept: "manifests in place and first installs; updates that need a slot wait; nothing is written in another node's name",
        reported: "`cannot write a rollout Lease: … ValidatingAdmissionPolicy 'podstamp-node-leases' … denied request: node N may write only its own status record, …`, once per distinct message, tried again with backoff; `podstamp_rollout_api_writes_total{result=\"error\"}`",
        says: "may write only its own status record",
        test: "tests/node_identity.rs: a_daemon_speaking_for_another_node_is_refused_and_says_so",
    },
    Fault {
        id: "rollout-record-not-its-nodes",
        area: "rollouts",
        fault: "another node's halt marker or status Lease that its own node cannot have written (named for one node, held by another or by nobody; a marker for another template than its name says): forged, or left by a misconfigured node, in a cluster without the admission policy",
        kept: "every rollout: the marker halts nothing and decides nothing; other nodes' status records are not watched at all (only `podstamp status` reads them)",
        reported: "`halt marker ignored: halt marker … is held by …` in the log, once per Lease; `podstamp status` lists a status record as UNTRUSTED",
        says: "halt marker ignored",
        test: "host/src/daemon/coordinator/ledger.rs: a_record_its_own_node_cannot_have_written_halts_nothing",
    },
    Fault {
        id: "rollout-records-flood",
        area: "rollouts",
        fault: "a thousand status Leases of 236 KiB each in the rollout namespace (written by anyone who may write Leases there, named and held as honest nodes' records), listed by a daemon as it starts",
        kept: "the daemon's memory: since the fleet design (issue 28) no daemon lists or watches other nodes' status records (it watches halt markers, at most 16 per node and 4,096 kept, and its lanes' slots); before it, the Leases were listed 32 a page and each record cut to its failures before it was queued (peak RSS 89 MiB, where pages of 500 and whole records queued took it to 545 MiB, over the DaemonSet's 256 MiB limit); the rollout goes on",
        reported: "nothing of its own: the records count as their first 16 failures",
        says: "peak RSS",
        test: "tests/rollouts.rs: a_thousand_forged_records_leave_a_starting_daemon_within_its_memory",
    },
    Fault {
        id: "rollout-share-uncounted",
        area: "rollouts",
        fault: "podstamp.io/max-unavailable given as a percentage, and the nodes the template is for cannot be counted (no permission to list nodes, the API server slow or down)",
        kept: "the manifests in place; the share stays of the last count, or of one node until a count comes in: never more nodes updating at once than asked",
        reported: "a warning, once per count asked (once per target a node waits for): cannot count the nodes for podstamp.io/max-unavailable as a percentage, with the API's error",
        says: "count: None",
        test: "host/src/daemon/rollout/slots.rs: a_share_of_the_nodes_is_counted_once_per_target_and_one_node_until_then",
    },
    Fault {
        id: "quorum-member-unconfirmed",
        area: "rollouts",
        fault: "a quorum member's template (podstamp.io/quorum: \"true\") whose slot holder stops renewing (its daemon killed, its API server the one restarting, its node gone), or whose revision failed and was rolled back",
        kept: "every other node's manifest in place: the slot never expires, and after a failure it is kept until the revision rolled back to is Ready (a rollback that fails too keeps it for good); the holder itself goes on, a newer target included",
        reported: "the others log that the update waits for a rollout slot and show waiting in podstamp status, the holder its phase and since when; docs/daemon.md says how an operator frees the slot of a node gone for good (delete its slot Lease)",
        says: "was unconfirmed",
        test: "tests/rollouts.rs: a_quorum_member_is_never_replaced_on_a_second_node_while_one_is_unconfirmed",
    },
    Fault {
        id: "rollout-record-oversized",
        area: "rollouts",
        fault: "another node's status record of hundreds of KiB, or of a thousand failed templates",
        kept: "the daemon's memory: a record over 256 KiB is not parsed, and of the others only their failures are kept (at most 16, each cut to 256 bytes)",
        reported: "nothing of its own: the record counts as empty or as its first failures",
        says: "MAX_RECORD_BYTES",
        test: "host/src/daemon/coordinator/ledger.rs: what_is_kept_of_another_nodes_record_is_bounded",
    },
    Fault {
        id: "rollout-slot-long-duration",
        area: "rollouts",
        fault: "a slot Lease whose `leaseDurationSeconds` is longer than this node's lease duration (2^31-1 s: a slot held for good)",
        kept: "the rollout: the slot is judged unrenewed after this node's duration, and taken as an expired one",
        reported: "`took a rollout slot` on the node that takes it",
        says: "i32::MAX",
        test: "host/src/daemon/coordinator/ledger.rs: a_slot_whose_object_claims_a_longer_duration_expires_by_this_nodes",
    },
    Fault {
        id: "rollout-halt-unwritable",
        area: "rollouts",
        fault: "a node whose update failed cannot write its halt marker (the API server away, or the write refused: a deploy/node-identity.yaml from before halt markers)",
        kept: "the failed target stays unstarted everywhere: the node renews its slot and frees none until the marker is written, so no other node takes the slot and writes the target; the rollout waits",
        reported: "`cannot write a rollout Lease: …` once per distinct message, tried again with backoff; `podstamp_rollout_api_writes_total{object=\"halt\",result=\"error\"}`; phase `failed` on that node in `podstamp status`",
        says: "no release before the marker",
        test: "host/src/daemon/coordinator/ledger.rs: the_record_and_the_halt_marker_are_written_before_the_release",
    },
    Fault {
        id: "rollout-waiter-starved",
        area: "rollouts",
        fault: "a node waiting for a rollout slot whose turn keeps coming after other waiters' (slots freed and taken before its turn, for longer than 4 lease durations), or that lost races and backed off",
        kept: "its place: past 4 lease durations it tries a freed slot within the first 250 ms, ahead of every waiter not starved, its backoff dropped; starved waiters keep their turns among themselves (not all at once: they would all race); the rollout's bound (at most max-unavailable nodes at once) holds",
        reported: "`waited for a rollout slot longer than …: trying freed slots ahead of the other waiters' turns` in the log, once per ask",
        says: "waited for a rollout slot",
        test: "host/src/daemon/coordinator/ledger.rs: waiters_for_a_freed_slot_try_it_one_after_the_other_and_a_starved_one_ahead",
    },
    Fault {
        id: "watch-list-unanswered",
        area: "daemon",
        fault: "a list page the API server never answers (an overloaded server whose handler timed out without a response reaching the client: seen in the fleet bench with 500 daemons starting at once)",
        kept: "the watch: the page is given up after 70 s (`LIST_TIMEOUT`, past the API server's own 60 s) and the list made again with backoff, instead of waiting for good (a rollout coordinator that never lists never writes its record, never takes a slot)",
        reported: "`podstamp_watch_restarts_total` and `podstamp_watch_lists_total`; the watch's failure `a list page got no answer within 70s` in the log",
        says: "two lists",
        test: "host/src/daemon/watch.rs: a_list_that_gets_no_answer_is_given_up_and_made_again",
    },
    Fault {
        id: "rollout-write-unanswered",
        area: "rollouts",
        fault: "a rollout Lease write (take, renew, release) that gets no answer within the coordinator's 10 s call timeout (an API server overloaded, or its queue full), though it may have gone through",
        kept: "one write, not two: the Lease is read back by name first; when it shows this node's take, renewal or release it counts as done (tried against the version it replaced it would be refused, or written twice); otherwise it is tried again after a backoff",
        reported: "`podstamp_rollout_api_writes_total{result=\"ok\"}` when it landed, `{result=\"error\"}` and `cannot write a rollout Lease: no answer within 10s` otherwise",
        says: "this node's take went through",
        test: "host/src/daemon/coordinator/ledger.rs: a_write_unanswered_in_time_counts_as_done_when_read_back_so",
    },
    Fault {
        id: "rollout-own-record-during-relist",
        area: "rollouts",
        fault: "the Lease watch relists (a gap, a 410, a list refused for load and made again) while this node writes its own status record",
        kept: "the record's version just written or read back: it is never listed (not watched), so it is kept apart from the list being made and not written again on the version it replaced (which the API server refuses, 409, for as long as the list takes)",
        reported: "nothing: no write is refused; `podstamp_rollout_api_writes_total{object=\"status\",result=\"conflict\"}` stays as it was",
        says: "written again during the relist",
        test: "host/src/daemon/coordinator/ledger.rs: this_nodes_record_written_during_a_relist_is_written_next_on_its_new_version",
    },
    Fault {
        id: "rollout-record-held-back",
        area: "rollouts",
        fault: "this node's phases change faster than its status record is written (a pod written, running and ready within a second, as in a fleet of fast pods), or the daemon stops within 2 s of a change",
        kept: "the API server's writes: the progress on a target within 2 s of the first change not written is one write (`record::HOLD`); a new target wanted (waiting, halted) and a change of what failed here are written at once, and the record before a slot is freed, so the halt marker and the release still come after it",
        reported: "`podstamp status` shows a phase up to 2 s late; a daemon stopped in that time leaves the phase before in its record until it starts again and reports its phases anew",
        says: "written at once",
        test: "host/src/daemon/coordinator/ledger.rs: phases_reported_within_the_hold_are_one_write_and_a_release_takes_the_record_first",
    },
    Fault {
        id: "rollout-waiter-lost-races",
        area: "rollouts",
        fault: "a node waiting for a rollout slot whose takes keep being refused (409): the winner's take is slow to reach the other waiters (a loaded API server or watch), so several try one freed slot",
        kept: "the rollout, with fewer refused writes: each race lost doubles that waiter's spread (up to 8×: its turn comes later at the next freed slot), kept for the same target; every waiter's spread also widens with how slowly its own writes are answered (over 100 ms, in proportion, up to 8 s), so that on a loaded API server fewer race at all; past 4 lease durations the starved rule puts it ahead again",
        reported: "`podstamp_rollout_api_writes_total{object=\"slot\",result=\"conflict\"}`",
        says: "one race lost",
        test: "host/src/daemon/coordinator/ledger.rs: a_waiter_that_lost_races_waits_longer_at_the_next_freed_slot",
    },
    Fault {
        id: "rollout-own-record-remade",
        area: "rollouts",
        fault: "this node's own status record deleted and made again by someone else (another holder, without the label the Lease watch selects), so that its create or replace conflicts",
        kept: "the node's voice: the record is read back by name and replaced with its own after a backoff, never left to a watch that may not show it",
        reported: "`podstamp_rollout_api_writes_total{result=\"conflict\"}`; a warning if the record cannot be read back",
        says: "the node's own record again",
        test: "tests/rollouts.rs: a_node_whose_record_was_remade_by_someone_else_writes_its_own_again",
    },
    Fault {
        id: "rollout-failed-elsewhere",
        area: "rollouts",
        fault: "an update whose container crashes (`CrashLoopBackOff`) on the first node that writes it",
        kept: "on that node, the previous revision (rolled back); on every other node, its manifest: the failed target is never written there until the template changes",
        reported: "`RolloutFailed` on the failing node, `RolloutHalted` Events from the others; `podstamp status`: failed 1, the others `halted` with the node and reason",
        says: "halted",
        test: "tests/rollouts.rs: an_update_rolls_one_node_at_a_time_and_a_failure_halts_it_everywhere",
    },
    Fault {
        id: "rollout-halt-per-node-settings",
        area: "rollouts",
        fault: "an update that fails on the first node that writes it, where the nodes' plugin settings differ (per-node `vars`, e.g. each control-plane member's address), so each node rolls a target of its own",
        kept: "on that node, the previous revision (rolled back, its failed target held); on every other node, its manifest: the halt marker names the failed change (`podstamp.io/change`: the template and the chain without its settings), and another node's target of that change is never written there until the template or the chain changes, or the failing node confirms a target of the change once its own settings are fixed (its marker then names the target only)",
        reported: "`RolloutFailed` on the failing node; on the others `update halted: change … (target … here) failed on node …` in the log, a `RolloutHalted` Event, phase `halted` in `podstamp status` with that message",
        says: "update halted: change ",
        test: "tests/rollouts.rs: a_change_that_failed_on_one_node_is_never_written_on_one_whose_settings_differ",
    },
    Fault {
        id: "rollout-halt-marker-without-change",
        area: "rollouts",
        fault: "a halt marker without `podstamp.io/change`: written by a daemon from before changes (a rolling upgrade of podstamp itself), or rewritten by its node once it confirmed a fixed target of the change",
        kept: "the halt of that marker's own target only, as before changes: a node rolling another target of the template is not halted by it",
        reported: "phase `halted` and `target … failed on node …` on a node rolling that very target; nothing on the others",
        says: "no change known: by target",
        test: "host/src/daemon/coordinator/ledger.rs: a_marker_halts_its_change_on_the_others_and_without_one_its_target_only",
    },
    Fault {
        id: "revisions-dir-in-manifest-dir",
        area: "kubelet",
        fault: "`--revisions-dir` inside the manifest directory (where the kubelet would run every kept revision)",
        kept: "nothing created or written; the daemon does not start (exit 2)",
        reported: "one line on stderr",
        says: "is the manifest directory or inside it",
        test: "an_unsafe_revisions_dir_is_refused_at_start",
    },
    Fault {
        id: "revisions-dir-open",
        area: "kubelet",
        fault: "`--revisions-dir` that others can write (mode 0777)",
        kept: "nothing written; the daemon does not start (exit 2)",
        reported: "one line on stderr",
        says: "others can write it; chmod go-w it",
        test: "an_unsafe_revisions_dir_is_refused_at_start",
    },
    Fault {
        id: "kubelet-hand-edit",
        area: "kubelet",
        fault: "a manifest of podstamp's edited by hand (another command, the same revision label), while podstamp is stopped or running; the real kubelet runs the edit",
        kept: "podstamp's manifest written back, at start or at the next pass (`resync`), and the kubelet runs it again (mirror pod Ready with the revision)",
        reported: "a warning at start",
        says: "edited by hand",
        test: "tests/kubelet.rs: a_hand_edit_of_the_manifest_is_restored_and_the_kubelet_runs_it_again",
    },
    Fault {
        id: "kubelet-api-outage",
        area: "kubelet",
        fault: "the API server killed while a real kubelet runs podstamp's pods",
        kept: "the same containers keep running; the manifest, the history and the rollout state unchanged (same inode and mtime); podstamp stays up (`/healthz` 200) and no rollout is judged; once the API server is back, an update is written, run and confirmed",
        reported: "`podstamp_watch_restarts_total{watch=\"podtemplates\"}` and `{watch=\"pods\"}`; a warning per failed watch",
        says: "the API server may be unreachable",
        test: "tests/kubelet.rs: an_api_outage_leaves_the_node_running_and_podstamp_catches_up",
    },
    Fault {
        id: "kubelet-kill-9-mid-update",
        area: "kubelet",
        fault: "podstamp killed with SIGKILL in the middle of updates (as a template changes; with a new revision written and not yet judged), leaving a torn temp file in the kubelet's directory and in the history",
        kept: "the kubelet reads whole manifests only (temp files are dot-files it skips); after a restart the temp files are removed and the latest revision is written, run and confirmed; the history keeps at most N, the newest the manifest in place",
        reported: "`RolloutSucceeded` Event, also for the revision the killed podstamp wrote; the log counts the temp files removed",
        says: "removed stale temporary files",
        test: "tests/kubelet.rs: podstamp_killed_mid_update_leaves_whole_manifests_and_converges_after_restart",
    },
    Fault {
        id: "kubelet-restart-mid-rollout",
        area: "kubelet",
        fault: "podstamp stopped between writing a failing revision (a container that exits 1) and its verdict, then restarted; and restarted again once it was rolled back",
        kept: "the restarted podstamp follows the revision in place as its own, rolls it back to the last revision that succeeded and holds it; the hold outlives a restart (`rollout-states.jsonl` in the revisions directory): the failed revision is not written again (manifest unchanged, same container) until the template changes",
        reported: "`RolloutFailed` Event with the kubelet's reason, from the restarted podstamp",
        says: "rolled back to revision",
        test: "tests/kubelet.rs: a_restart_mid_rollout_still_rolls_back_and_a_held_revision_stays_held",
    },
    Fault {
        id: "rollout-state-damaged",
        area: "kubelet",
        fault: "a template's line of `rollout-states.jsonl` in the revisions directory that does not parse (edited by hand), or an earlier podstamp's `rollout.json` of a template that does not",
        kept: "that template's state read as empty (nothing held): its manifest is written and later changes too; the other templates' lines are read as they are; the line is left out at the next write of the file",
        reported: "an error in the log naming the file and the line",
        says: "cannot read the rollout state",
        test: "a_damaged_rollout_state_is_named_and_read_as_empty",
    },
    Fault {
        id: "revision-history-write-fails",
        area: "kubelet",
        fault: "a revision that the history's writer, behind the pass, cannot write (the template's directory in the revisions directory replaced by a file; a full or failing disk)",
        kept: "the manifest in place and running (written before its revision is kept, as always); the other templates' revisions written; that template's history read again from disk before its next revision is recorded, and written then",
        reported: "an error in the log naming the template, the revision, the directory and the error; `podstamp_revision_history_writes_total{result=\"failed\"}`",
        says: "cannot keep the revision",
        test: "host/src/daemon/revisions/writer.rs: a_write_that_fails_behind_is_read_again_from_disk",
    },
    Fault {
        id: "deploy-cache-volume",
        area: "deploy",
        fault: "deploy/'s DaemonSet started with each volume as the kubelet makes it (its cache was an emptyDir, 0777: `podstamp run` exited 2)",
        kept: "the cache is a hostPath (DirectoryOrCreate, 0755 root, kept across restarts): the daemon becomes ready, writes the example template's manifest and fills the cache; the DaemonSet (with seccompProfile RuntimeDefault) is accepted by the API server",
        reported: "exit code 2 and one line on stderr, for a 0777 cache directory",
        says: "the kubelet makes an emptyDir world-writable",
        test: "tests/daemon.rs: the_deploy_daemonset_starts_with_its_volumes_as_the_kubelet_makes_them",
    },
    Fault {
        id: "deploy-static-pod-own-source",
        area: "deploy",
        fault: "podstamp's own static pod manifest (from `podstamp render`) whose `podstamp.io/source` names a PodTemplate of the namespace `podstamp run` serves, with no such template in it",
        kept: "nothing: after the first complete list podstamp removes it as its template's manifest, and the kubelet stops podstamp. Rendered from a PodTemplate of another namespace (deploy/static-pod/podstamp.yaml: `podstamp-static`, as deploy/static-pod.yaml), it is not podstamp's and stays (same inode and mtime)",
        reported: "`podstamp_manifests_removed_total` and an info line in the log",
        says: "removed manifest: its template is gone",
        test: "podstamp_removes_its_own_static_pod_manifest_when_its_source_is_in_its_namespace",
    },
    Fault {
        id: "controlplane-bootstrap-as-written",
        area: "deploy",
        fault: "a self-hosted control plane's first manifest rendered (`podstamp render`) from its PodTemplate as written, not as the API server stored it (with its defaults: `dnsPolicy`, `restartPolicy`, probe `timeoutSeconds`...)",
        kept: "the pod runs until podstamp starts; podstamp's first pass renders the stored template, finds the file differs and writes it as an update (a rollout like any other), so on a real node the kubelet restarts the API server once, for nothing (18-22 s of downtime on the harness). Rendered from the stored template (`kubectl get podtemplate NAME -o yaml | podstamp render -`), the file is kept (same inode and mtime) and nothing restarts (tests/controlplane.rs checks the container too)",
        reported: "an ordinary update: `podstamp_renders_total{result=\"written\"}`, the rollout's Events; docs/daemon.md (A self-hosted control plane) says which to render",
        says: "wrote manifest",
        test: "tests/controlplane.rs: a_first_manifest_rendered_from_the_template_as_written_is_rewritten_and_from_the_stored_one_kept",
    },
    Fault {
        id: "controlplane-member-bad-revision",
        area: "rollouts",
        fault: "a bad revision (a flag the API server refuses) of an API server member of a two-node control plane on one etcd (`podstamp.io/quorum: \"true\"`), each node's kubelet and podstamp talking to its own node's member",
        kept: "the first node to write it sees its member crash, judges it from the node while its own API server is down and rolls it back; the other node never writes it (halted by the failure, and the slot is kept until the rolled-back member is Ready), and its member answers throughout (every 100 ms sample), so the cluster keeps its API",
        reported: "on the first node, once its member answers: `RolloutFailed` (CrashLoopBackOff, exited with code 2) and the failed revision in `podstamp status`; on the other: phase `halted` in `podstamp status`",
        says: "halted",
        test: "tests/controlplane.rs: a_bad_member_revision_is_rolled_back_on_its_node_and_never_written_on_the_other",
    },
    Fault {
        id: "controlplane-kubelet-restarted-api-down",
        area: "rollouts",
        fault: "the node's kubelet restarted while a bad revision of the self-hosted API server is in place and the API is down (kubernetes/kubernetes#105543): the real 1.37 kubelet runs the bad revision it finds at its start, but never starts the revision podstamp rolls back to (no sandbox: its API source never becomes ready, so the stopped pod of the same name is never cleaned up)",
        kept: "the bad revision judged from the node (crash loop) and rolled back, the good manifest in place and the bad one held; the revision rolled back to is not failed nor rolled back further (nothing would help: the kubelet acts on no changed file), and is judged anew, its deadline counted again, once the kubelet starts it (after the kubelet is restarted again: tested)",
        reported: "after the progress deadline, the warning `the kubelet has not started revision X: no sandbox after N s; kubernetes/kubernetes#105543`, `podstamp_kubelet_not_started{template}` 1, a `KubeletNotStarted` Event kept on disk and published once the API answers, the node's status message in `podstamp status`; `the kubelet started the revision after all` once it does. A new revision the kubelet never started fails as `KubeletNotStarted` (the same words) and is rolled back",
        says: "kubernetes/kubernetes#105543",
        test: "tests/controlplane.rs: the_kubelet_restarted_with_the_bad_api_server_in_place_and_the_api_down",
    },
    Fault {
        id: "fuzz-templates",
        area: "fuzzing",
        fault: "random PodTemplates (names with `/`, `..`, dots, upper case, any Unicode; tricky YAML strings in labels, annotations, images, args, env)",
        kept: "refused with a message, or a file name `NAME.yaml` with no `/`, no leading dot, and YAML that serde_norway reads back as exactly the validated pod (and that writes back byte for byte)",
        reported: "a failing input is saved in tests/fuzz.proptest-regressions (replayed first on every run; commit it)",
        says: "PROPTEST_CASES (default 256)",
        test: "tests/fuzz.rs: templates_are_refused_or_written_safely",
    },
    Fault {
        id: "fuzz-yaml",
        area: "fuzzing",
        fault: "random JSON values through the YAML writer",
        kept: "serde_norway reads back the same value",
        reported: "as above",
        says: "PROPTEST_CASES (default 256)",
        test: "tests/fuzz.rs: the_yaml_writer_round_trips_through_serde_norway",
    },
    Fault {
        id: "fuzz-kubelet",
        area: "fuzzing",
        fault: "random PodTemplates (probes, ports, resources, security contexts, tolerations, affinity, DNS, host aliases among their fields), each pod's manifest read by the kubelet's own static pod decoder",
        kept: "podstamp's verdict equals the kubelet's for every one: what it writes the kubelet accepts, what it refuses the kubelet refuses (counts printed, zero disagreements)",
        reported: "the decoder's verdict per file",
        says: "podstamp-manifestcheck",
        test: "tests/fuzz.rs: podstamp_and_the_kubelet_agree_on_random_templates",
    },
    Fault {
        id: "scope-reload-overstep",
        area: "plugin scope",
        fault: "a reload of the configuration brings a plugin (the attacker of issue 26, built from source) that adds `hostPID` with the default scope, in the default chain",
        kept: "the running manifest (same bytes) and the real kubelet's container (same id), the mirror pod Ready at its revision",
        reported: "RenderFailed; an Event on the template naming the plugin, its sha256, the field and the grant that would allow it; `podstamp_plugin_scope_refusals_total{plugin}`",
        says: "spec.hostPID: added, outside the plugin's scope",
        test: "tests/kubelet.rs: a_reload_bringing_a_plugin_that_oversteps_its_scope_leaves_the_running_pod_alone",
    },
    Fault {
        id: "scope-default-refuses-attacker",
        area: "plugin scope",
        fault: "a plugin without `scope:` returns a restricted pod with host namespaces, a hostPath `/` mount, a privileged container and a command (each alone, and all together)",
        kept: "nothing written (`podstamp render` exits 1); with every field granted it renders, one grant fewer and it is refused again",
        reported: "one line naming the plugin, its sha256, the first field changed outside the scope and `scope: [FIELD]` to grant it",
        says: "outside the plugin's scope",
        test: "tests/scopes.rs: each_overstep_is_refused_on_its_own_by_the_default_scope",
    },
    Fault {
        id: "scope-chain-undoes-restriction",
        area: "plugin scope",
        fault: "the second plugin of a chain makes privileged again the container the first held to the restricted profile, outside its own grant",
        kept: "nothing written; the first plugin alone renders",
        reported: "one line blaming the second plugin (`plugin 2 of 2`), not the first",
        says: "plugin 2 of 2 `undo` (attacker 0.1.0)",
        test: "tests/scopes.rs: a_chain_whose_second_plugin_undoes_the_first_is_refused_at_the_second",
    },
    Fault {
        id: "scope-template-widens",
        area: "plugin scope",
        fault: "a template's `podstamp.io/settings` makes a plugin do more than its catalog settings (and scope) meant",
        kept: "nothing written: the scope is the catalog entry's, and settings from a template never change it",
        reported: "the same refusal as without the annotation",
        says: "outside the plugin's scope",
        test: "tests/scopes.rs: a_template_cannot_widen_a_scope_with_its_settings_annotation",
    },
    Fault {
        id: "scope-declared-not-granted",
        area: "plugin scope",
        fault: "a plugin declares a change (the SDK's `scope!`: arch-image, `spec.containers[*].image`) that its catalog entry does not grant (the default scope), and makes it",
        kept: "nothing written: the grant is the catalog's, a declaration grants nothing",
        reported: "the scope refusal, ending with whether the plugin declared the change and what it declares; `render --explain` shows what it declares, what it is granted and what is declared but not granted",
        says: "the plugin declares this change (it declares: ",
        test: "tests/scopes.rs: a_plugins_declared_scope_is_shown_beside_its_grant_and_named_in_a_refusal",
    },
    Fault {
        id: "scope-declaration-malformed",
        area: "plugin scope",
        fault: "a component's `podstamp:scope` custom section (its declared scope) is not `podstamp-scope 1` then one grant a line, or not UTF-8",
        kept: "the plugin is refused at load (a declaration is never half read), as any component that cannot be loaded",
        reported: "the load error, naming the component and its custom section",
        says: "podstamp-scope 1",
        test: "host/src/plugin/declared.rs: a_declaration_is_found_in_a_nested_module_and_read_whole",
    },
    Fault {
        id: "scope-sdk-declaration-malformed",
        area: "plugin scope",
        fault: "a Python or JavaScript plugin's declared scope (app.py's `PODSTAMP_SCOPE`, package.json's `podstamp.scope`) is not a list of grants, or a grant is empty, has surrounding blanks or a line break",
        kept: "no component is built (checked before componentize; plugins/scope-section.py writes only well-formed declarations); a component built before is left as it was",
        reported: "the build fails (exit 1) with one line naming the file, the field and the fix",
        says: "PODSTAMP_SCOPE must be a list of string literals",
        test: "tests/plugin_python.rs: a_python_plugin_whose_declared_scope_is_not_a_list_of_grants_is_refused_by_the_build",
    },
    Fault {
        id: "scope-grant-invalid",
        area: "plugin scope",
        fault: "a catalog entry's `scope:` holds a grant that is not a field path (`spec..x`, `[*]`, `spec.containers[]`)",
        kept: "the catalog is refused whole at load (at start: exit 2; on a reload: the catalog in use keeps serving)",
        reported: "one line naming `plugins.NAME.scope`, the grant and examples of the syntax",
        says: "is not a field path",
        test: "tests/scopes.rs: a_grant_that_is_not_a_field_path_is_refused_at_load",
    },
];

fn row(id: &str) -> &'static Fault {
    FAULTS
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no fault {id:?} in FAULTS"))
}

fn render_table() -> String {
    let mut out = String::from(
        "# Reliability: faults tried and their outcomes\n\n\
         Generated from the fault suite (`tests/faults.rs`, table `FAULTS`); a test\n\
         checks that this file matches it, and each row's test checks the outcome\n\
         the row states (a test named with its file checks it with its own\n\
         assertions). Regenerate: `PODSTAMP_BLESS=1 cargo test --test faults docs_`.\n\n\
         *Reported* is the `reason` label of `podstamp_render_failures_total` and of\n\
         the warning in the log (and of the Event, with the API source), unless it\n\
         says otherwise; *Message* is text the log line contains (`NS`: the\n\
         test's namespace).\n\n\
         | Area | Fault | Kept | Reported | Message | Test |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for f in FAULTS {
        let says = f.says.replace('|', "\\|");
        // A code span that holds backticks needs double ones around it.
        let says = if says.contains('`') {
            format!("`` {says} ``")
        } else {
            format!("`{says}`")
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {says} | `{}` |\n",
            f.area, f.fault, f.kept, f.reported, f.test
        ));
    }
    out
}

#[test]
fn docs_reliability_md_is_the_fault_table() {
    let source = include_str!("faults.rs");
    for f in FAULTS {
        // A test elsewhere checks the outcome with its own assertions.
        if let Some((file, test)) = f.test.split_once(": ") {
            let other = match file {
                "tests/daemon.rs" => include_str!("daemon.rs"),
                "tests/fuzz.rs" => include_str!("fuzz.rs"),
                "tests/sandbox.rs" => include_str!("sandbox.rs"),
                "tests/render.rs" => include_str!("render.rs"),
                "tests/kubelet.rs" => include_str!("kubelet.rs"),
                "tests/rollouts.rs" => include_str!("rollouts.rs"),
                "host/src/daemon/coordinator/ledger.rs" => {
                    include_str!("../host/src/daemon/coordinator/ledger.rs")
                }
                "host/src/daemon/rollout/slots.rs" => {
                    include_str!("../host/src/daemon/rollout/slots.rs")
                }
                "tests/node_identity.rs" => include_str!("node_identity.rs"),
                "tests/oci.rs" => include_str!("oci.rs"),
                "tests/test_command.rs" => include_str!("test_command.rs"),
                "tests/pod_security.rs" => include_str!("pod_security.rs"),
                "tests/scaffold.rs" => include_str!("scaffold.rs"),
                "tests/scopes.rs" => include_str!("scopes.rs"),
                "tests/plugin_python.rs" => include_str!("plugin_python.rs"),
                "tests/controlplane.rs" => include_str!("controlplane.rs"),
                "host/src/daemon/cri/client.rs" => {
                    include_str!("../host/src/daemon/cri/client.rs")
                }
                "host/src/daemon/probes/mod.rs" => {
                    include_str!("../host/src/daemon/probes/mod.rs")
                }
                "host/src/daemon/probes/run.rs" => {
                    include_str!("../host/src/daemon/probes/run.rs")
                }
                "host/src/plugin/declared.rs" => include_str!("../host/src/plugin/declared.rs"),
                "host/src/daemon/watch.rs" => include_str!("../host/src/daemon/watch.rs"),
                "host/src/daemon/revisions/writer.rs" => {
                    include_str!("../host/src/daemon/revisions/writer.rs")
                }
                other => panic!("fault {}: unknown file {other}", f.id),
            };
            assert!(
                other.contains(&format!("fn {test}(")) && other.contains(f.says),
                "fault {}: {file} has no fn {test} or does not mention {:?}",
                f.id,
                f.says
            );
            continue;
        }
        assert!(
            source.contains(&format!("fn {}()", f.test)),
            "fault {}: no test fn {}",
            f.id,
            f.test
        );
        assert!(
            source.matches(&format!("\"{}\"", f.id)).count() >= 2,
            "fault {}: no test checks it (expected a row({:?}) outside FAULTS)",
            f.id,
            f.id
        );
    }
    let path = common::repo().join("docs/reliability.md");
    let table = render_table();
    if std::env::var_os("PODSTAMP_BLESS").is_some() {
        fs::write(&path, &table).unwrap();
        return;
    }
    let doc = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        doc == table,
        "{} does not match the fault table in tests/faults.rs; regenerate it with PODSTAMP_BLESS=1 cargo test --test faults docs_",
        path.display()
    );
}

// ---------------------------------------------------------------- helpers

struct Env {
    tmp: tempfile::TempDir,
    templates: PathBuf,
    manifests: PathBuf,
    config: PathBuf,
    node_file: PathBuf,
}

/// A temp dir with templates/, manifests/ and a config whose catalog is the
/// hostile plugins; the default chain is the identity plugin.
fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    let manifests = tmp.path().join("manifests");
    fs::create_dir(&templates).unwrap();
    fs::create_dir(&manifests).unwrap();
    let plugins = tmp.path().join("plugins");
    fs::create_dir(&plugins).unwrap();
    let mut catalog = String::new();
    for name in [
        "identity",
        "loop",
        "recurse",
        "memory",
        "huge",
        "utf8",
        "notjson",
        "deepjson",
        "rename",
        "namespace",
        "panic",
        "longerror",
        "memories",
        "wasi-files",
        "wasi-socket",
        "wasi-env",
        "wasi-stdout",
        "wasi-exit",
        "wasi-clock",
    ] {
        let path = wat::write(&plugins, name, &wat::hostile(name));
        // Granted every field: these rows are the sandbox's faults, which
        // must hold whatever a catalog grants (the scope's are rows of their own).
        catalog.push_str(&format!(
            "  {name}:\n    path: {}\n    scope: [metadata, spec]\n",
            path.display()
        ));
    }
    let config = tmp.path().join("podstamp.yaml");
    fs::write(
        &config,
        format!(
            "plugins:\n{catalog}chain: [identity]\nlimits: {{timeout: 300ms, memory: 16Mi, maxManifestSize: 64Ki}}\n"
        ),
    )
    .unwrap();
    let node_file = tmp.path().join("node.yaml");
    fs::write(
        &node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: lab}}\n",
    )
    .unwrap();
    Env {
        tmp,
        templates,
        manifests,
        config,
        node_file,
    }
}

impl Env {
    fn start(&self, extra: &[&str], log: &str) -> Daemon {
        self.start_with_env(extra, log, &[])
    }

    /// [`Env::start`], with `env` set for the daemon.
    fn start_with_env(&self, extra: &[&str], log: &str, env: &[(&str, &str)]) -> Daemon {
        let source = format!("dir:{}", self.templates.display());
        let mut args = vec![
            "--config",
            self.config.to_str().unwrap(),
            "--source",
            &source,
            "--node-name",
            "n1",
            "--node-file",
            self.node_file.to_str().unwrap(),
            "--manifest-dir",
            self.manifests.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Daemon::start_with_env(&args, self.tmp.path().join(log), env)
    }

    /// Writes templates/`file` by rename, as an editor would.
    fn put(&self, file: &str, text: &str) {
        let path = self.templates.join(file);
        let temp = self.templates.join(format!(".{file}.tmp"));
        fs::write(&temp, text).unwrap();
        fs::rename(&temp, &path).unwrap();
    }

    fn manifest(&self, name: &str) -> PathBuf {
        self.manifests.join(format!("{name}.yaml"))
    }
}

/// A PodTemplate named `name`, with chain `plugins` (None: the default chain).
fn template(name: &str, plugins: Option<&str>, image: &str) -> String {
    let annotations = match plugins {
        Some(p) => format!("\n  annotations: {{podstamp.io/plugins: \"{p}\"}}"),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: {name}{annotations}\ntemplate:\n  spec:\n    containers:\n    - {{name: main, image: \"{image}\"}}\n"
    )
}

/// [`wait_for`], but a timeout shows the daemon's log.
fn wait_logged<T>(daemon: &Daemon, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        daemon.assert_running();
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "timed out after {CONVERGE:?} waiting for {what}; the daemon's log:\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

fn wait_content(daemon: &Daemon, path: &Path, needle: &str) -> String {
    wait_logged(
        daemon,
        &format!("{} to contain {needle:?}", path.display()),
        || read(path).filter(|t| t.contains(needle)),
    )
}

/// Waits for the warning about template `name` with `fault`'s reason and
/// message, and checks the failure is counted.
fn expect_failure(daemon: &Daemon, name: &str, fault: &Fault) -> String {
    let template = format!("template=kube-system/{name}");
    let reason = format!("reason=\"{}\"", fault.reported);
    let line = wait_logged(
        daemon,
        &format!("the log to report {} for {name}", fault.id),
        || {
            daemon
                .logs()
                .lines()
                .find(|l| {
                    l.contains("WARN")
                        && l.contains(&template)
                        && l.contains(&reason)
                        && l.contains(fault.says)
                })
                .map(str::to_string)
        },
    );
    let counted = daemon.metric(&format!(
        "podstamp_render_failures_total{{reason=\"{}\"}}",
        fault.reported
    ));
    assert!(counted >= 1.0, "{}: not counted in /metrics", fault.id);
    assert!(
        line.contains("the last good manifest stays"),
        "{}: {line}",
        fault.id
    );
    line
}

/// The kubelet's decoder, reading `dir` as its static pod path (it skips
/// dot-files itself), accepts every file in it.
fn kubelet_accepts_dir(dir: &Path) {
    kubelet_accepts(&[dir], "n1");
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------- plugins

/// (fault id, hostile plugin) for the render-time plugin faults.
const BAD_PLUGINS: &[(&str, &str)] = &[
    ("plugin-infinite-loop", "loop"),
    ("plugin-deep-recursion", "recurse"),
    ("plugin-memory-growth", "memory"),
    ("plugin-oversized-output", "huge"),
    ("plugin-invalid-utf8", "utf8"),
    ("plugin-invalid-json", "notjson"),
    ("plugin-deep-json", "deepjson"),
    ("plugin-rename", "rename"),
    ("plugin-panic", "panic"),
    ("plugin-huge-error", "longerror"),
    ("plugin-many-memories", "memories"),
    ("plugin-wasi-filesystem", "wasi-files"),
    ("plugin-wasi-sockets", "wasi-socket"),
    ("plugin-wasi-environment", "wasi-env"),
    ("plugin-wasi-stdout", "wasi-stdout"),
    ("plugin-wasi-exit", "wasi-exit"),
    ("plugin-wasi-clock", "wasi-clock"),
];

/// The longest warning a failure may log: the plugin's error text is cut
/// to 4 KiB (message and field each), whatever it returned.
const MAX_FAILURE_LINE: usize = 12 << 10;

#[test]
fn bad_plugins_keep_the_last_good_manifest() {
    let e = env();
    // One template per fault, first rendered through the good plugin.
    for (id, _) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        e.put(&format!("{name}.yaml"), &template(&name, None, "good:1"));
    }
    e.put("f-namespace.yaml", &template("f-namespace", None, "good:1"));
    e.put("control.yaml", &template("control", None, "control:1"));
    let daemon = e.start(&[], "plugins.log");
    daemon.wait_ready(CONVERGE);
    let mut before = Vec::new();
    for (id, _) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        wait_content(&daemon, &e.manifest(&name), "image: good:1");
        before.push((name.clone(), identity(&e.manifest(&name))));
    }
    wait_content(&daemon, &e.manifest("control"), "image: control:1");
    kubelet_accepts_dir(&e.manifests);

    // Now each picks its hostile plugin (and asks for a new image).
    for (id, plugin) in BAD_PLUGINS {
        let name = format!("f-{}", id.trim_start_matches("plugin-"));
        e.put(
            &format!("{name}.yaml"),
            &template(&name, Some(plugin), "bad:1"),
        );
    }
    for ((id, _), (name, was)) in BAD_PLUGINS.iter().zip(&before) {
        let line = expect_failure(&daemon, name, row(id));
        assert!(
            line.len() <= MAX_FAILURE_LINE,
            "{id}: a warning of {} bytes: {}...",
            line.len(),
            &line[..400]
        );
        assert_eq!(
            identity(&e.manifest(name)),
            *was,
            "{id}: the last good manifest was touched"
        );
        assert!(read(&e.manifest(name)).unwrap().contains("image: good:1"));
    }
    assert!(
        !e.manifests.join("kube-apiserver.yaml").exists(),
        "plugin-rename: no manifest under the stolen name"
    );
    // A WASI plugin's stdout is in the log, as many lines as `log` allows.
    let logs = daemon.logs();
    let printed = logs
        .lines()
        .filter(|l| l.contains("stdout: hello from stdout"))
        .count();
    assert!(printed >= 64, "plugin-wasi-stdout: {printed} lines logged");
    assert!(
        logs.contains("plugin logged over 64 lines in one call; dropping the rest"),
        "plugin-wasi-stdout: no word of the dropped lines"
    );

    // The namespace is podstamp's: forced back, nothing outside the directory.
    let ns = row("plugin-namespace");
    e.put(
        "f-namespace.yaml",
        &template("f-namespace", Some("namespace"), "good:1"),
    );
    let text = wait_content(&daemon, &e.manifest("f-namespace"), "image: evil:1");
    assert!(text.contains(ns.says), "{text}");
    assert!(!text.contains("../"), "{text}");
    assert_eq!(
        names_in(e.tmp.path()),
        [
            "manifests",
            "node.yaml",
            "plugins",
            "plugins.log",
            "podstamp.yaml",
            "templates"
        ],
        "nothing written outside the manifest directory"
    );

    // Other templates keep rendering, and the daemon is still up.
    e.put("control.yaml", &template("control", None, "control:2"));
    wait_content(&daemon, &e.manifest("control"), "image: control:2");
    kubelet_accepts_dir(&e.manifests);
    daemon.assert_running();
    assert_eq!(daemon.get("/healthz").map(|r| r.0), Some(200));

    // A failing template recovers when its plugin is fixed.
    let name = "f-infinite-loop";
    e.put(&format!("{name}.yaml"), &template(name, None, "good:2"));
    wait_content(&daemon, &e.manifest(name), "image: good:2");
    assert!(daemon.stop().success());
}

#[test]
fn plugins_importing_wasi_beyond_the_fixed_list_are_refused_at_load() {
    let id = "plugin-wasi-unlisted";
    let fault = row(id);
    let e = env();
    let path = wat::write(
        e.tmp.path(),
        "wasi",
        &wat::importing("wasi:http@0.2.0", "outgoing-handler", "handle"),
    );
    fs::write(
        &e.config,
        format!(
            "plugins:\n  wasi:\n    path: {}\n    scope: [metadata, spec]\nchain: [wasi]\n",
            path.display()
        ),
    )
    .unwrap();
    e.put("boot.yaml", &template("boot", None, "boot:1"));
    let out = common::podstamp(&[
        "run",
        "--config",
        e.config.to_str().unwrap(),
        "--source",
        &format!("dir:{}", e.templates.display()),
        "--node-name",
        "n1",
        "--manifest-dir",
        e.manifests.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{id}: {err}");
    assert!(err.contains(fault.says), "{id}: {err}");
    assert!(
        err.contains("WASI 0.2's io, clocks, random, cli, filesystem and sockets interfaces, which grant nothing"),
        "{id}: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{id}: one line: {err}");
    assert!(names_in(&e.manifests).is_empty(), "{id}: nothing written");
}

// ---------------------------------------------------------------- templates

/// A PodTemplate named `name` with this pod `spec` (YAML flow).
fn template_spec(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: \"{name}\"\ntemplate:\n  spec: {spec}\n"
    )
}

/// Nine aliases of nine aliases of ... "lol": 9^10 strings if expanded.
fn yaml_bomb() -> String {
    let mut text = String::from(
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: bomb}\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text + "template: {spec: {containers: [{name: m, image: x, args: *a9}]}}\n"
}

#[test]
fn bad_templates_are_refused_and_never_leave_the_directory() {
    let e = env();
    e.put("control.yaml", &template("control", None, "control:1"));
    let long_ok = format!("{0}.{0}.{0}.{1}", "a".repeat(62), "b".repeat(61));
    assert_eq!(long_ok.len(), 250);
    let too_long = "a".repeat(254);
    let cases: Vec<(&str, String, String)> = vec![
        (
            "template-name-dotdot",
            "dotdot.yaml".into(),
            template_spec("../escape", "{containers: [{name: m, image: x}]}"),
        ),
        (
            "template-name-slash",
            "slash.yaml".into(),
            template_spec("etc/passwd", "{containers: [{name: m, image: x}]}"),
        ),
        (
            "template-name-dot",
            "dot.yaml".into(),
            template_spec(".hidden", "{containers: [{name: m, image: x}]}"),
        ),
        (
            "template-name-too-long",
            "long.yaml".into(),
            template_spec(&too_long, "{containers: [{name: m, image: x}]}"),
        ),
        (
            "template-no-containers",
            "empty.yaml".into(),
            template_spec("empty", "{containers: []}"),
        ),
        (
            "template-invalid-yaml",
            "broken.yaml".into(),
            "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: broken\n".into(),
        ),
        (
            "template-deep-yaml",
            "deep.yaml".into(),
            format!(
                "apiVersion: v1\nkind: PodTemplate\nmetadata: {{name: deep}}\ntemplate: {}{}\n",
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
        ),
        (
            "template-deep-json",
            "deep.json".into(),
            format!(
                "{{\"apiVersion\": \"v1\", \"template\": {}{}}}\n",
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
        ),
        ("template-yaml-bomb", "bomb.yaml".into(), yaml_bomb()),
    ];
    for (_, file, text) in &cases {
        e.put(file, text);
    }
    e.put("longname.yaml", &template(&long_ok, None, "long:1"));
    let daemon = e.start(&[], "templates.log");
    daemon.wait_ready(CONVERGE);
    wait_content(&daemon, &e.manifest("control"), "image: control:1");
    for (id, file, _) in &cases {
        let fault = row(id);
        let path = e.templates.join(file).display().to_string();
        let line = wait_logged(&daemon, &format!("{id} reported"), || {
            daemon
                .logs()
                .lines()
                .find(|l| {
                    l.contains("WARN")
                        && (l.contains(&path) || l.contains("template=kube-system/empty"))
                        && l.contains(fault.says)
                })
                .map(str::to_string)
        });
        assert!(
            line.contains(&format!("reason=\"{}\"", fault.reported)),
            "{id}: {line}"
        );
    }
    let long = row("template-name-long");
    let line = wait_logged(&daemon, "the long name's outcome", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains(&long_ok) && l.contains(long.says))
            .map(str::to_string)
    });
    assert!(line.contains("INFO"), "{line}");
    wait_content(&daemon, &e.manifest(&long_ok), "image: long:1");
    // 251 to 253 characters are valid names, but NAME.yaml is over NAME_MAX.
    let over = row("template-name-over-name-max");
    let name_252 = format!("{}.b", long_ok);
    e.put("longer.yaml", &template(&name_252, None, "long:1"));
    expect_failure(&daemon, &name_252, over);
    // Nothing but the good manifests, and nothing outside the directory.
    assert_eq!(
        names_in(&e.manifests),
        [format!("{long_ok}.yaml"), "control.yaml".to_string()]
    );
    assert_eq!(
        names_in(e.tmp.path()),
        [
            "manifests",
            "node.yaml",
            "plugins",
            "podstamp.yaml",
            "templates",
            "templates.log"
        ],
    );
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

/// The kubelet's decoder, reading the one file `path` as node n1's would:
/// its reason for refusing it (panics if it accepts it).
fn kubelet_refuses(path: &Path) -> String {
    let out = std::process::Command::new(common::harness_bin("podstamp-manifestcheck"))
        .args(["--node-name", "n1"])
        .arg(path)
        .output()
        .expect("run podstamp-manifestcheck");
    let verdict = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the kubelet's decoder accepts {}: {verdict}",
        path.display()
    );
    verdict
}

#[test]
fn a_key_over_1024_characters_is_written_readably_and_read_back_after_a_restart() {
    let fault = row("template-long-map-key");
    let e = env();
    // flexVolume options are a map whose keys the kubelet does not limit.
    let key = "k".repeat(1100);
    let flex = |image: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "flex"},
            "template": {"spec": {
                "containers": [{"name": "main", "image": image}],
                "volumes": [{"name": "opts",
                             "flexVolume": {"driver": "example.com/fv", "options": {&key: "v"}}}]
            }}
        })
        .to_string()
    };
    e.put("flex.json", &flex("flex:1"));
    let daemon = e.start(&[], "long-key-1.log");
    daemon.wait_ready(CONVERGE);
    let text = wait_content(&daemon, &e.manifest("flex"), "image: flex:1");
    kubelet_accepts_dir(&e.manifests);
    let own = podstamp::manifest::ownership(text.as_bytes()).expect("podstamp reads its own file");
    assert!(own.intact && own.source == "kube-system/flex", "{own:?}");
    assert!(daemon.stop().success());

    // A restart finds the file its own, and keeps updating it.
    let daemon = e.start(&[], "long-key-2.log");
    daemon.wait_ready(CONVERGE);
    e.put("flex.json", &flex("flex:2"));
    wait_content(&daemon, &e.manifest("flex"), "image: flex:2");
    let logs = daemon.logs();
    let found = logs
        .lines()
        .find(|l| l.contains(fault.says))
        .unwrap_or_else(|| panic!("no {:?} in the log:\n{logs}", fault.says));
    assert!(found.contains("managed=1"), "{found}");
    assert!(
        !logs.contains("ForeignFile") && !logs.contains("WARN"),
        "{logs}"
    );
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

#[test]
fn a_manifest_that_does_not_read_back_is_refused() {
    use podstamp::manifest::{Unreadable, read_back};
    use podstamp::render::{RenderError, Stage};
    let fault = row("template-manifest-unreadable");
    // What the writer once made of a key over 1024 characters: a plain key,
    // which no YAML reader takes.
    let key = "k".repeat(1100);
    let meant = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "flex"}, "spec": {"nodeSelector": {&key: "v"}}});
    let old = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: flex\nspec:\n  nodeSelector:\n    {key}: v\n"
    );
    let e = read_back(old.as_bytes(), &meant).unwrap_err();
    assert!(matches!(e, Unreadable::Parse(_)), "{e}");
    let message = RenderError {
        template: "kube-system/flex".into(),
        stage: Stage::Manifest(e),
    }
    .to_string();
    assert!(message.contains(fault.says), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    // What the writer makes of it now reads back.
    let text = podstamp::yaml::to_yaml(&meant);
    read_back(text.as_bytes(), &meant).unwrap();
}

#[test]
fn fields_the_kubelet_refuses_are_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    // (row, a field set on a valid pod at `at`, what the kubelet says of it)
    let cases: [(&str, &str, serde_json::Value, &str); 6] = [
        (
            "template-node-selector-value",
            "/spec/nodeSelector",
            serde_json::json!({"disk": "a\u{2028}b"}),
            "spec.nodeSelector: Invalid value",
        ),
        (
            "template-api-reference",
            "/spec/volumes",
            serde_json::json!([{"name": "cm", "configMap": {"name": "settings"}}]),
            "static pods may not reference configmaps",
        ),
        (
            "template-policy-typo",
            "/spec/containers/0/imagePullPolicy",
            serde_json::json!("always"),
            "spec.containers[0].imagePullPolicy: Unsupported value",
        ),
        (
            "template-mount-unknown-volume",
            "/spec/containers/0/volumeMounts",
            serde_json::json!([{"name": "cfg", "mountPath": "/etc/app"}]),
            "spec.containers[0].volumeMounts[0].name: Not found",
        ),
        // The kubelet's rules beyond podstamp's own: its check says them.
        (
            "template-kubelet-probe",
            "/spec/containers/0/livenessProbe",
            serde_json::json!({"exec": {"command": ["true"]}, "successThreshold": 5}),
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 5: must be 1",
        ),
        (
            "template-kubelet-toleration",
            "/spec/tolerations",
            serde_json::json!([{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ),
    ];
    let good = tmp.path().join("good.yaml");
    fs::write(&good, template("web", None, "nginx:1")).unwrap();
    let out = common::podstamp(&["render", good.to_str().unwrap(), "--node-name", "n1"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let manifest: serde_json::Value = serde_norway::from_str(&common::stdout(&out)).unwrap();
    for (id, at, value, kubelet_says) in cases {
        let fault = row(id);
        // The template with the field...
        let mut object: serde_json::Value =
            serde_norway::from_str(&template("web", None, "nginx:1")).unwrap();
        let (parent, field) = at.rsplit_once('/').unwrap();
        object
            .pointer_mut(&format!("/template{parent}"))
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(field.into(), value.clone());
        let input = tmp.path().join(format!("{id}.json"));
        fs::write(&input, object.to_string()).unwrap();
        let output = tmp.path().join(format!("{id}.out.yaml"));
        let out = render_to(&input, &output);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{id}: {err}");
        assert!(err.contains(fault.says), "{id}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{id}: one line: {err}");
        assert!(!output.exists(), "{id}");
        // ... and the kubelet refuses the pod it would have made.
        let mut pod = manifest.clone();
        let (parent, field) = at.rsplit_once('/').unwrap();
        pod.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(field.into(), value);
        let dir = tmp.path().join(id);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("web.yaml"), podstamp::yaml::to_yaml(&pod)).unwrap();
        let verdict = kubelet_refuses(&dir.join("web.yaml"));
        assert!(verdict.contains(kubelet_says), "{id}: {verdict}");
    }
}

/// A template whose host alias IP comes from the `substitute` plugin's
/// settings (`podstamp.io/settings`), `ip`.
fn aliased(ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: registry\n  annotations: {{podstamp.io/settings: \"substitute: {{vars: {{REGISTRY_IP: '{ip}'}}}}\"}}\ntemplate:\n  spec:\n    hostAliases:\n    - {{ip: \"${{var.REGISTRY_IP}}\", hostnames: [registry.example.com]}}\n    containers:\n    - {{name: main, image: \"nginx:1\"}}\n"
    )
}

#[test]
fn a_plugin_output_the_kubelet_refuses_keeps_the_last_good_manifest() {
    let fault = row("plugin-output-kubelet-refuses");
    let tmp = tempfile::tempdir().unwrap();
    let (templates, manifests) = (tmp.path().join("templates"), tmp.path().join("manifests"));
    fs::create_dir(&templates).unwrap();
    fs::create_dir(&manifests).unwrap();
    let config = tmp.path().join("podstamp.yaml");
    fs::write(
        &config,
        format!(
            "plugins:\n  substitute:\n    path: {}\n    settings: {{vars: {{REGISTRY_IP: '10.0.0.1'}}}}\n    scope: [metadata, spec]\nchain: [substitute]\n",
            common::plugin("substitute").display()
        ),
    )
    .unwrap();
    let put = |text: &str| {
        let temp = templates.join(".registry.yaml.tmp");
        fs::write(&temp, text).unwrap();
        fs::rename(&temp, templates.join("registry.yaml")).unwrap();
    };
    put(&aliased("10.0.0.5"));
    let source = format!("dir:{}", templates.display());
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--source",
            &source,
            "--node-name",
            "n1",
            "--manifest-dir",
            manifests.to_str().unwrap(),
        ],
        tmp.path().join("daemon.log"),
    );
    daemon.wait_ready(CONVERGE);
    let manifest = manifests.join("registry.yaml");
    let good = wait_content(&daemon, &manifest, "ip: \"10.0.0.5\"");
    let was = identity(&manifest);
    kubelet_accepts_dir(&manifests);

    // The plugin now writes a name where the kubelet wants an address.
    put(&aliased("registry.local"));
    let line = expect_failure(&daemon, "registry", fault);
    assert!(line.contains("plugin"), "{line}");
    assert_eq!(
        identity(&manifest),
        was,
        "the last good manifest was touched"
    );
    assert_eq!(read(&manifest).as_deref(), Some(good.as_str()));
    kubelet_accepts_dir(&manifests);
    // What was refused is what the kubelet refuses.
    let refused = tmp.path().join("refused");
    fs::create_dir(&refused).unwrap();
    fs::write(
        refused.join("registry.yaml"),
        good.replace("ip: \"10.0.0.5\"", "ip: registry.local"),
    )
    .unwrap();
    let verdict = kubelet_refuses(&refused.join("registry.yaml"));
    assert!(
        verdict.contains("spec.hostAliases[0].ip: Invalid value: \\\"registry.local\\\""),
        "{verdict}"
    );

    // Fixed, it renders again.
    put(&aliased("10.0.0.6"));
    wait_content(&daemon, &manifest, "ip: \"10.0.0.6\"");
    assert!(daemon.stop().success());
}

#[test]
fn a_pod_check_that_cannot_run_writes_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let fault = row("kubecheck-cannot-run");
    let tmp = tempfile::tempdir().unwrap();
    let exits = tmp.path().join("exits-at-once");
    fs::write(&exits, "#!/bin/sh\nexit 3\n").unwrap();
    fs::set_permissions(&exits, fs::Permissions::from_mode(0o755)).unwrap();
    let missing = tmp.path().join("no/podstamp-kubecheck");
    let input = tmp.path().join("web.yaml");
    fs::write(&input, template("web", None, "nginx:1")).unwrap();
    for (helper, also_says) in [
        (&missing, "No such file or directory"),
        (&exits, "the pod check's process ended (exit status: 3)"),
    ] {
        let output = tmp.path().join("out.yaml");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"))
            .args(["render", input.to_str().unwrap(), "--node-name", "n1", "-o"])
            .arg(&output)
            .env("PODSTAMP_KUBECHECK", helper)
            .output()
            .unwrap();
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(fault.says) && err.contains(also_says), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!output.exists());
    }

    // The daemon: a manifest written with the check, then a restart without
    // it; a change is refused and the manifest kept.
    let e = env();
    e.put("web.yaml", &template("web", None, "good:1"));
    let daemon = e.start(&[], "checked.log");
    wait_content(&daemon, &e.manifest("web"), "image: good:1");
    assert!(daemon.stop().success());
    let was = identity(&e.manifest("web"));
    let daemon = e.start_with_env(
        &[],
        "unchecked.log",
        &[("PODSTAMP_KUBECHECK", missing.to_str().unwrap())],
    );
    daemon.wait_ready(CONVERGE);
    e.put("web.yaml", &template("web", None, "good:2"));
    expect_failure(&daemon, "web", fault);
    assert_eq!(
        identity(&e.manifest("web")),
        was,
        "the manifest was touched"
    );
    daemon.assert_running();
    assert!(daemon.stop().success());
}

#[test]
fn fields_newer_than_the_nodes_kubelet_are_a_warning_or_a_refusal() {
    let fault = row("kubelet-newer-fields");
    let e = env();
    fs::write(
        &e.node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus:\n  nodeInfo: {kubeletVersion: v1.34.0, architecture: amd64, operatingSystem: linux, bootID: '', containerRuntimeVersion: '', kernelVersion: '', kubeProxyVersion: '', machineID: '', osImage: '', systemUUID: ''}\n",
    )
    .unwrap();
    let with_rules = |image: &str| {
        template("newer", None, image).replace(
            "    - {name: main, image:",
            "    - {restartPolicy: Always, restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}], name: main, image:",
        )
    };
    e.put("newer.yaml", &with_rules("good:1"));
    let daemon = e.start(&[], "newer.log");
    wait_content(&daemon, &e.manifest("newer"), "restartPolicyRules");
    wait_logged(&daemon, "the warning", || {
        daemon
            .logs()
            .lines()
            .find(|l| {
                l.contains("WARN") && l.contains(fault.says) && l.contains("restartPolicyRules")
            })
            .map(str::to_string)
    });
    assert!(daemon.metric("podstamp_kubelet_newer_fields_total{node=\"n1\"}") >= 1.0);
    assert!(daemon.stop().success());
    let was = identity(&e.manifest("newer"));

    // Refused by the setting: the last good manifest stays.
    let daemon = e.start_with_env(
        &[],
        "refuse.log",
        &[("PODSTAMP_REFUSE_NEWER_FIELDS", "true")],
    );
    daemon.wait_ready(CONVERGE);
    e.put("newer.yaml", &with_rules("good:2"));
    let refused = Fault {
        reported: "RenderFailed",
        says: "spec.containers[0].restartPolicyRules: is newer than the node's kubelet v1.34.0",
        ..*fault
    };
    expect_failure(&daemon, "newer", &refused);
    assert_eq!(
        identity(&e.manifest("newer")),
        was,
        "the manifest was touched"
    );
    assert!(daemon.stop().success());
}

#[test]
fn huge_duplicate_and_flapping_templates_keep_the_last_good_manifest() {
    let e = env();
    e.put("big.yaml", &template("big", Some(""), "big:1"));
    e.put("big-chain.yaml", &template("big-chain", None, "big:1"));
    e.put("dup-a.yaml", &template("dup", None, "dup:a"));
    e.put("flap.yaml", &template("flap", None, "flap:0"));
    let daemon = e.start(&[], "big.log");
    daemon.wait_ready(CONVERGE);
    for name in ["big", "big-chain"] {
        wait_content(&daemon, &e.manifest(name), "image: big:1");
    }
    wait_content(&daemon, &e.manifest("dup"), "image: dup:a");
    wait_content(&daemon, &e.manifest("flap"), "image: flap:0");

    // 10 MiB: with no plugins, and through the (identity) chain.
    let filler = "x".repeat(10 << 20);
    let huge = |name: &str, plugins: Option<&str>| {
        template(name, plugins, "big:2").replace(
            "image: \"big:2\"}",
            &format!("image: \"big:2\", args: [\"{filler}\"]}}"),
        )
    };
    for (name, plugins, id) in [
        ("big", Some(""), "template-10mib"),
        ("big-chain", None, "template-10mib-through-plugins"),
    ] {
        let before = identity(&e.manifest(name));
        let text = huge(name, plugins);
        assert!(text.len() > 10 << 20);
        e.put(&format!("{name}.yaml"), &text);
        expect_failure(&daemon, name, row(id));
        assert_eq!(identity(&e.manifest(name)), before, "{id}");
    }

    // A template file over 16 MiB is not even read whole.
    let before = identity(&e.manifest("big"));
    e.put(
        "big.yaml",
        &template("big", Some(""), "big:3").replace(
            "image: \"big:3\"}",
            &format!("image: \"big:3\", args: [\"{}\"]}}", "x".repeat(17 << 20)),
        ),
    );
    let fault = row("template-17mib-file");
    let path = e.templates.join("big.yaml").display().to_string();
    wait_logged(&daemon, "the 17 MiB file refused", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains(&path) && l.contains(fault.says))
            .map(|l| assert!(l.contains("reason=\"InvalidTemplate\""), "{l}"))
    });
    assert_eq!(identity(&e.manifest("big")), before);

    // Two files, one pod name: the first keeps it.
    let dup = row("template-duplicate-name");
    let before = identity(&e.manifest("dup"));
    e.put("dup-b.yaml", &template("dup", None, "dup:b"));
    let line = wait_logged(&daemon, "the name conflict", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains("WARN") && l.contains(dup.says))
            .map(str::to_string)
    });
    assert!(
        line.contains(&format!("reason=\"{}\"", dup.reported)),
        "{line}"
    );
    assert_eq!(identity(&e.manifest("dup")), before);

    // Valid, invalid, valid...: each valid version is written, each invalid one keeps it.
    let flap = row("template-flapping");
    for i in 1..=5 {
        let image = format!("flap:{i}");
        e.put("flap.yaml", &template("flap", None, &image));
        wait_content(&daemon, &e.manifest("flap"), &format!("image: {image}"));
        let good = identity(&e.manifest("flap"));
        let failed = daemon.metric("podstamp_render_failures_total{reason=\"InvalidTemplate\"}");
        e.put(
            "flap.yaml",
            &template("flap", None, &image).replace("containers:", "containerz:"),
        );
        wait_logged(&daemon, "the invalid version to be counted", || {
            (daemon.metric("podstamp_render_failures_total{reason=\"InvalidTemplate\"}") > failed)
                .then_some(())
        });
        assert_eq!(identity(&e.manifest("flap")), good, "flap {i}");
    }
    assert!(daemon.logs().contains(flap.says), "{}", daemon.logs());
    kubelet_accepts_dir(&e.manifests);
    let mut expected = ["big.yaml", "big-chain.yaml", "dup.yaml", "flap.yaml"];
    expected.sort();
    assert_eq!(names_in(&e.manifests), expected);
    assert!(daemon.stop().success());
}

/// Chains a template's annotation may not have: a plugin twice, more plugins
/// than the catalog (the 24,000 steps a 256 KiB annotation fits), and one
/// whose calls together outlast the render's time budget.
#[test]
fn long_repeated_and_slow_chains_keep_the_last_good_manifest() {
    let e = env();
    // The budget equals the per-call timeout: whatever time the first step
    // took, the loop gets less than its own timeout, so the budget is what
    // stops it, on any machine.
    let config = fs::read_to_string(&e.config).unwrap();
    let budgeted = config.replace(
        "maxManifestSize: 64Ki}",
        "maxManifestSize: 64Ki, renderTimeout: 300ms}",
    );
    assert_ne!(config, budgeted);
    fs::write(&e.config, budgeted).unwrap();
    let long = "identity,".repeat(24_000);
    let cases = [
        ("template-chain-repeat", "c-repeat", "identity, identity"),
        ("template-chain-too-long", "c-long", long.as_str()),
        ("template-chain-over-budget", "c-slow", "identity,loop"),
    ];
    for (_, name, _) in &cases {
        e.put(&format!("{name}.yaml"), &template(name, None, "good:1"));
    }
    e.put("control.yaml", &template("control", None, "control:1"));
    let daemon = e.start(&[], "chains.log");
    daemon.wait_ready(CONVERGE);
    let mut before = Vec::new();
    for (_, name, _) in &cases {
        wait_content(&daemon, &e.manifest(name), "image: good:1");
        before.push(identity(&e.manifest(name)));
    }
    wait_content(&daemon, &e.manifest("control"), "image: control:1");

    for (_, name, chain) in &cases {
        e.put(
            &format!("{name}.yaml"),
            &template(name, Some(chain), "bad:1"),
        );
    }
    for ((id, name, _), was) in cases.iter().zip(&before) {
        let line = expect_failure(&daemon, name, row(id));
        assert_eq!(identity(&e.manifest(name)), *was, "{id}: {line}");
        assert!(read(&e.manifest(name)).unwrap().contains("image: good:1"));
    }
    // Refused before anything ran: the identity plugin was called once per
    // good render, never for the 24,000-step chain.
    let identity_calls = daemon
        .metric("podstamp_plugin_call_duration_seconds_count{plugin=\"identity\",result=\"ok\"}");
    assert!(identity_calls < 100.0, "{identity_calls} identity calls");

    // Other templates keep rendering, and the daemon is still up.
    e.put("control.yaml", &template("control", None, "control:2"));
    wait_content(&daemon, &e.manifest("control"), "image: control:2");
    kubelet_accepts_dir(&e.manifests);
    assert_eq!(daemon.get("/healthz").map(|r| r.0), Some(200));

    // A chain within the rules and the budget renders again.
    e.put(
        "c-long.yaml",
        &template("c-long", Some(" identity "), "good:2"),
    );
    e.put(
        "c-slow.yaml",
        &template("c-slow", Some("identity"), "good:2"),
    );
    wait_content(&daemon, &e.manifest("c-long"), "image: good:2");
    wait_content(&daemon, &e.manifest("c-slow"), "image: good:2");
    assert!(daemon.stop().success());
}

/// A pod named `m` with one container of this `image`, as a fixed plugin output.
fn fixed_pod(image: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"m"}},"spec":{{"containers":[{{"name":"main","image":"{image}"}}]}}}}"#
    )
}

/// A plugin that returns `fixed_pod(image)`, whatever it is given.
fn setting_image(dir: &Path, name: &str, image: &str) -> PathBuf {
    let (body, extra) = wat::returning(fixed_pod(image).as_bytes());
    wat::write(
        dir,
        name,
        &wat::componentize(&wat::core_module("", &body, &extra), &[wat::WIT]),
    )
}

#[test]
fn mandatory_plugins_run_last_whatever_the_template_picks() {
    let fault = row("template-mandatory-opt-out");
    let tmp = tempfile::tempdir().unwrap();
    let policy = setting_image(tmp.path(), "policy", "policy:1");
    let author = setting_image(tmp.path(), "author", "author:1");
    let identity = wat::write(tmp.path(), "identity", &wat::hostile("identity"));
    let config = tmp.path().join("podstamp.yaml");
    let write_config = |mandatory: &str, chain: &str| {
        fs::write(
            &config,
            format!(
                "plugins:\n  identity: {{path: {}}}\n  author: {{path: {}, scope: [metadata, spec]}}\n  policy: {{path: {}, scope: [metadata, spec]{mandatory}}}\nchain: [{chain}]\n",
                identity.display(),
                author.display(),
                policy.display()
            ),
        )
        .unwrap();
    };
    let render = |plugins: Option<&str>| {
        let input = tmp.path().join("m.yaml");
        fs::write(&input, template("m", plugins, "template:1")).unwrap();
        common::podstamp(&[
            "render",
            input.to_str().unwrap(),
            "--node-name",
            "n1",
            "--config",
            config.to_str().unwrap(),
            "--no-cache",
        ])
    };
    let image = |plugins: Option<&str>| {
        let out = render(plugins);
        let err = common::stderr(&out);
        assert!(out.status.success(), "{plugins:?}: {err}");
        let manifest = common::stdout(&out);
        manifest
            .lines()
            .find_map(|l| l.trim().trim_start_matches("- ").strip_prefix("image: "))
            .unwrap_or_else(|| panic!("{manifest}"))
            .to_string()
    };

    // By default a template's annotation is the whole chain: it can leave
    // the default chain out, or pick a plugin that undoes it.
    write_config("", "identity, policy");
    assert_eq!(image(None), "policy:1");
    assert_eq!(image(Some("")), "template:1");
    assert_eq!(image(Some("policy, author")), "author:1");

    // Mandatory: the policy plugin runs last for every template, named or not.
    write_config(", mandatory: true", "identity, policy");
    for plugins in [
        None,
        Some(""),
        Some("author"),
        Some("policy, author"),
        Some("identity"),
    ] {
        assert_eq!(
            format!("image: {}", image(plugins)),
            fault.says,
            "{plugins:?}"
        );
    }
    // A template may still not name a plugin twice, mandatory or not.
    let out = render(Some("author, author"));
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));

    // A mandatory plugin must end the default chain, so that a template
    // without the annotation runs it last too.
    for (chain, says) in [
        (
            "identity",
            "plugins.policy: is mandatory, so it must be in chain",
        ),
        (
            "policy, identity",
            "chain: \"policy\" is mandatory and \"identity\" is not, but mandatory plugins run last",
        ),
    ] {
        write_config(", mandatory: true", chain);
        let out = render(None);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{chain}: {err}");
        assert!(err.contains(says), "{chain}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{chain}: one line: {err}");
    }
}

#[test]
fn a_bad_settings_annotation_fails_its_template_only() {
    let fault = row("template-settings-not-in-chain");
    let e = env();
    let with_settings = |name: &str, settings: &str, image: &str| {
        template(name, None, image).replace(
            &format!("name: {name}\n"),
            &format!(
                "name: {name}\n  annotations: {{podstamp.io/settings: {}}}\n",
                serde_json::Value::from(settings)
            ),
        )
    };
    e.put(
        "s.yaml",
        &with_settings("s", "identity: {any: 1}", "good:1"),
    );
    e.put("control.yaml", &template("control", None, "control:1"));
    let daemon = e.start(&[], "settings.log");
    daemon.wait_ready(CONVERGE);
    wait_content(&daemon, &e.manifest("s"), "image: good:1");
    wait_content(&daemon, &e.manifest("control"), "image: control:1");
    let was = identity(&e.manifest("s"));

    e.put("s.yaml", &with_settings("s", "loop: {x: 1}", "bad:1"));
    expect_failure(&daemon, "s", fault);
    assert_eq!(
        identity(&e.manifest("s")),
        was,
        "the last good manifest was touched"
    );

    e.put("control.yaml", &template("control", None, "control:2"));
    wait_content(&daemon, &e.manifest("control"), "image: control:2");
    e.put("s.yaml", &with_settings("s", "identity: null", "good:2"));
    wait_content(&daemon, &e.manifest("s"), "image: good:2");
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

// ---------------------------------------------------------------- disk

/// A tmpfs mounted by the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
            at.to_str().unwrap(),
        ]);
        Tmpfs(at.to_path_buf())
    }

    fn remount(&self, options: &str) {
        mount(&[
            "-o",
            &format!("remount,{options}"),
            self.0.to_str().unwrap(),
        ]);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn mount(args: &[&str]) {
    let out = std::process::Command::new("mount")
        .args(args)
        .output()
        .expect(
            "run mount(8): the disk fault tests need util-linux's mount (apt-get install mount)",
        );
    assert!(
        out.status.success(),
        "mount {args:?} failed: {}the disk fault tests mount small tmpfs file systems and need root or CAP_SYS_ADMIN (in a container: --privileged or --cap-add SYS_ADMIN)",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for a `fault` warning about template `name` (any message position).
fn expect_write_failure(daemon: &Daemon, name: &str, fault: &Fault) {
    let template = format!("template=kube-system/{name}");
    let reason = format!("reason=\"{}\"", fault.reported);
    wait_logged(daemon, &format!("{} for {name}", fault.id), || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains(&template) && l.contains(&reason) && l.contains(fault.says))
            .map(|_| ())
    });
}

fn temp_files(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.starts_with(".podstamp-"))
        .collect()
}

#[test]
fn a_missing_or_vanished_manifest_dir() {
    let mut e = env();
    e.manifests = e.tmp.path().join("missing/manifests");
    e.put("boot.yaml", &template("boot", None, "boot:1"));
    let daemon = e.start(&["--resync", "1s"], "missing.log");
    wait_content(&daemon, &e.manifest("boot"), "image: boot:1");
    assert!(row("disk-dir-missing").kept.starts_with("created"));

    fs::remove_dir_all(&e.manifests).unwrap();
    e.put("boot.yaml", &template("boot", None, "boot:2"));
    expect_write_failure(&daemon, "boot", row("disk-dir-removed"));
    assert!(
        !e.manifests.exists(),
        "podstamp does not recreate it behind the admin's back"
    );
    fs::create_dir(&e.manifests).unwrap();
    wait_content(&daemon, &e.manifest("boot"), "image: boot:2");
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

#[test]
fn a_read_only_manifest_dir_keeps_the_last_good_manifest() {
    let e = env();
    let fs_ = Tmpfs::mount(&e.manifests, "1m");
    e.put("boot.yaml", &template("boot", None, "boot:1"));
    let daemon = e.start(&["--resync", "1s"], "ro.log");
    wait_content(&daemon, &e.manifest("boot"), "image: boot:1");
    let good = identity(&e.manifest("boot"));
    fs_.remount("ro");
    e.put("boot.yaml", &template("boot", None, "boot:2"));
    expect_write_failure(&daemon, "boot", row("disk-read-only"));
    assert_eq!(identity(&e.manifest("boot")), good);
    fs_.remount("rw");
    wait_content(&daemon, &e.manifest("boot"), "image: boot:2");
    assert!(temp_files(&e.manifests).is_empty());
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

#[test]
fn a_full_disk_keeps_the_last_good_manifest_and_no_temp_file() {
    let e = env();
    let _fs = Tmpfs::mount(&e.manifests, "64k");
    e.put("boot.yaml", &template("boot", None, "boot:1"));
    let daemon = e.start(&["--resync", "1s"], "full.log");
    wait_content(&daemon, &e.manifest("boot"), "image: boot:1");
    let good = identity(&e.manifest("boot"));
    // Fill the rest (a dot-file: the kubelet ignores it, podstamp leaves it alone).
    let filler = e.manifests.join(".filler");
    {
        use std::io::Write;
        let mut f = fs::File::create(&filler).unwrap();
        let chunk = [0u8; 4096];
        let mut full = false;
        for _ in 0..64 {
            if f.write_all(&chunk).and_then(|()| f.sync_all()).is_err() {
                full = true;
                break;
            }
        }
        assert!(full, "a 64k tmpfs took 256k");
    }
    let big = template("boot", None, "boot:2").replace(
        "image: \"boot:2\"}",
        &format!("image: \"boot:2\", args: [\"{}\"]}}", "y".repeat(20 << 10)),
    );
    e.put("boot.yaml", &big);
    expect_write_failure(&daemon, "boot", row("disk-full"));
    assert_eq!(identity(&e.manifest("boot")), good);
    assert!(read(&e.manifest("boot")).unwrap().contains("image: boot:1"));
    assert!(
        temp_files(&e.manifests).is_empty(),
        "{:?}",
        names_in(&e.manifests)
    );
    fs::remove_file(&filler).unwrap();
    wait_content(&daemon, &e.manifest("boot"), "image: boot:2");
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

#[test]
fn symlinks_where_manifests_go_are_never_followed() {
    let e = env();
    let outside = e.tmp.path().join("outside.txt");
    fs::write(&outside, "precious\n").unwrap();
    std::os::unix::fs::symlink(&outside, e.manifest("planted")).unwrap();
    e.put("planted.yaml", &template("planted", None, "p:1"));
    e.put("ours.yaml", &template("ours", None, "o:1"));
    let daemon = e.start(&[], "symlink.log");
    expect_write_failure(&daemon, "planted", row("disk-symlink-planted"));
    wait_content(&daemon, &e.manifest("ours"), "image: o:1");
    // Our own manifest replaced by a symlink while running.
    fs::remove_file(e.manifest("ours")).unwrap();
    std::os::unix::fs::symlink(&outside, e.manifest("ours")).unwrap();
    e.put("ours.yaml", &template("ours", None, "o:2"));
    expect_write_failure(&daemon, "ours", row("disk-symlink-replacing-ours"));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "precious\n");
    for name in ["planted", "ours"] {
        assert!(
            fs::symlink_metadata(e.manifest(name))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
    daemon.assert_running();
    assert!(daemon.stop().success());
}

#[test]
fn kill_9_during_a_burst_leaves_only_whole_manifests_and_a_restart_converges() {
    let fault = row("disk-kill-9");
    let e = env();
    let names = ["a", "b", "c"];
    let version = |name: &str, i: usize| {
        // ~30 KiB each, so that writes take a while.
        template(name, None, &format!("{name}:{i}")).replace(
            "}\n",
            &format!(", args: [\"{}\"]}}\n", "z".repeat(30 << 10)),
        )
    };
    for name in names {
        e.put(&format!("{name}.yaml"), &version(name, 0));
    }
    // Three rounds: start (a restart after the first), converge, burst, SIGKILL.
    let mut last = 0;
    for (round, burst) in [40, 120, 200].into_iter().enumerate() {
        let daemon = e.start(&[], &format!("burst-{round}.log"));
        daemon.wait_ready(CONVERGE);
        for name in names {
            wait_content(
                &daemon,
                &e.manifest(name),
                &format!("image: {name}:{last}\n"),
            );
        }
        assert!(
            temp_files(&e.manifests).is_empty(),
            "{:?}",
            names_in(&e.manifests)
        );
        for i in last + 1..=last + burst {
            for name in names {
                e.put(&format!("{name}.yaml"), &version(name, i));
            }
        }
        last += burst;
        // Dropping the Daemon is SIGKILL, while it works through the burst.
        drop(daemon);
        for name in names_in(&e.manifests) {
            assert!(
                !name.starts_with('.') || name.starts_with(".podstamp-"),
                "unexpected file {name}"
            );
        }
        kubelet_accepts_dir(&e.manifests);
        let caught_up = names
            .iter()
            .filter(|n| {
                read(&e.manifest(n)).is_some_and(|t| t.contains(&format!("image: {n}:{last}\n")))
            })
            .count();
        eprintln!(
            "round {round}: killed with {caught_up} of 3 manifests at the burst's last version, temp files left: {:?}",
            temp_files(&e.manifests)
        );
        for name in names {
            let text = read(&e.manifest(name)).expect("a manifest never disappears");
            assert!(text.ends_with('\n'), "whole file");
            let own = podstamp::manifest::ownership(text.as_bytes()).expect("ours");
            assert!(
                own.intact,
                "{name}: the content matches its hash, so it is whole"
            );
        }
    }

    let daemon = e.start(&[], "burst-final.log");
    daemon.wait_ready(CONVERGE);
    for name in names {
        wait_content(
            &daemon,
            &e.manifest(name),
            &format!("image: {name}:{last}\n"),
        );
    }
    assert!(
        temp_files(&e.manifests).is_empty(),
        "{:?}",
        names_in(&e.manifests)
    );
    assert!(daemon.logs().contains(fault.says));
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

/// What a daemon killed between a pass's fsyncs and its renames
/// (host/src/daemon/reconcile/batch.rs, step 2 → 3) leaves: each new
/// manifest in a synced `.podstamp-*` file beside its target, no rename
/// done. Planted as that state on disk: the window cannot be hit on purpose
/// from outside the process.
#[test]
fn a_pass_killed_between_its_staged_files_and_their_renames_keeps_every_old_manifest() {
    let fault = row("disk-pass-staged-not-renamed");
    let e = env();
    let names: Vec<String> = (0..20).map(|i| format!("p{i:02}")).collect();
    for n in &names {
        e.put(
            &format!("{n}.yaml"),
            &template(n, None, &format!("{n}:old")),
        );
    }
    let daemon = e.start(&[], "staged-1.log");
    daemon.wait_ready(CONVERGE);
    for n in &names {
        wait_content(&daemon, &e.manifest(n), &format!("image: {n}:old\n"));
    }
    assert!(daemon.stop().success());
    let before: Vec<Vec<u8>> = names
        .iter()
        .map(|n| fs::read(e.manifest(n)).unwrap())
        .collect();
    // The pass of the new versions, killed after its fsyncs: every new
    // manifest staged, none renamed.
    for (i, n) in names.iter().enumerate() {
        e.put(
            &format!("{n}.yaml"),
            &template(n, None, &format!("{n}:new")),
        );
        let staged = String::from_utf8(before[i].clone())
            .unwrap()
            .replace(&format!("{n}:old"), &format!("{n}:new"));
        let temp = e.manifests.join(format!(".podstamp-{n}.yaml.4242.{i}.tmp"));
        fs::write(&temp, staged).unwrap();
        fs::File::open(&temp).unwrap().sync_all().unwrap();
    }
    assert_eq!(temp_files(&e.manifests).len(), names.len());
    for (n, old) in names.iter().zip(&before) {
        assert_eq!(
            &fs::read(e.manifest(n)).unwrap(),
            old,
            "{n}: as before the pass"
        );
    }
    kubelet_accepts_dir(&e.manifests);

    let daemon = e.start(&[], "staged-2.log");
    daemon.wait_ready(CONVERGE);
    for n in &names {
        wait_content(&daemon, &e.manifest(n), &format!("image: {n}:new\n"));
    }
    assert!(
        temp_files(&e.manifests).is_empty(),
        "{:?}",
        names_in(&e.manifests)
    );
    assert!(daemon.logs().contains(fault.says), "{}", daemon.logs());
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

// ---------------------------------------------------------------- daemon

/// The descriptors open in process `pid`.
fn open_fds(pid: u32) -> Vec<(u64, String)> {
    let mut fds: Vec<(u64, String)> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_str()?.parse().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            Some((n, target.to_string_lossy().into_owned()))
        })
        .collect();
    fds.sort();
    fds
}

#[test]
fn a_connection_flood_on_the_metrics_port_takes_no_descriptors_from_rendering() {
    let fault = row("daemon-connection-flood");
    let e = env();
    e.put("first.yaml", &template("first", None, "first:1"));
    let source = format!("dir:{}", e.templates.display());
    let daemon = Daemon::start_with_file_limit(
        &[
            "--config",
            e.config.to_str().unwrap(),
            "--source",
            &source,
            "--node-name",
            "n1",
            "--node-file",
            e.node_file.to_str().unwrap(),
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
        ],
        e.tmp.path().join("flood.log"),
        (64, 256),
    );
    wait_content(&daemon, &e.manifest("first"), "image: first:1");
    daemon.wait_ready(CONVERGE);
    let sockets = || {
        open_fds(daemon.pid())
            .into_iter()
            .filter(|(_, target)| target.starts_with("socket:"))
            .count()
    };
    // The listener, and the runtime's own (its signal handling).
    let idle = sockets();

    // Idle clients that never send a request, more than the descriptors.
    let flood: Vec<std::net::TcpStream> = (0..400)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap())
        .collect();
    e.put("second.yaml", &template("second", None, "second:1"));
    wait_content(&daemon, &e.manifest("second"), "image: second:1");
    let healthz = wait_logged(&daemon, "/healthz during the flood", || {
        daemon.get("/healthz")
    });
    assert_eq!(healthz.0, 200);
    let flooded = sockets();
    // The soft limit was raised to the hard one; the cap held.
    assert!(daemon.logs().contains(fault.says), "{}", daemon.logs());
    let limits = fs::read_to_string(format!("/proc/{}/limits", daemon.pid())).unwrap();
    let nofile: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(nofile[3..5], ["256", "256"], "{limits}");
    let cap: usize = daemon
        .logs()
        .split_once("at most ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .expect("the connection cap is logged");
    eprintln!(
        "measured: {idle} sockets open idle, {flooded} during a flood of 400 connections (cap {cap})"
    );
    assert!(
        flooded <= idle + cap,
        "{flooded} sockets open: more than {idle} without connections and {cap} connections"
    );
    assert!(
        !daemon.logs().contains("Too many open files"),
        "{}",
        daemon.logs()
    );
    drop(flood);
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

/// Sets process `pid`'s soft open file limit; returns the old one.
fn set_soft_file_limit(pid: u32, soft: u64) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs; prlimit on our own child.
    let r = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    let r = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    old.rlim_cur
}

#[test]
fn a_template_directory_that_goes_away_and_comes_back_is_followed_again() {
    let fault = row("daemon-template-dir-gone");
    let e = env();
    e.put("a.yaml", &template("a", None, "a:1"));
    e.put("b.yaml", &template("b", None, "b:1"));
    let daemon = e.start(&[], "dir-gone.log");
    wait_content(&daemon, &e.manifest("a"), "image: a:1");
    wait_content(&daemon, &e.manifest("b"), "image: b:1");
    daemon.wait_ready(CONVERGE);
    let (a, b) = (identity(&e.manifest("a")), identity(&e.manifest("b")));

    let away = e.tmp.path().join("templates.away");
    fs::rename(&e.templates, &away).unwrap();
    wait_logged(&daemon, "the directory gone, in the log", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains("ERROR") && l.contains(fault.says))
            .map(str::to_string)
    });
    // Tried again while it is gone: still nothing removed.
    std::thread::sleep(Duration::from_secs(2));
    daemon.assert_running();
    assert_eq!(identity(&e.manifest("a")), a);
    assert_eq!(identity(&e.manifest("b")), b);

    // Back, with one template edited while away: followed again.
    let edited = away.join(".a.yaml.tmp");
    fs::write(&edited, template("a", None, "a:2")).unwrap();
    fs::rename(&edited, away.join("a.yaml")).unwrap();
    fs::rename(&away, &e.templates).unwrap();
    wait_content(&daemon, &e.manifest("a"), "image: a:2");
    assert_eq!(
        identity(&e.manifest("b")),
        b,
        "the other one is not rewritten"
    );
    // And watched again: a later edit is applied too.
    e.put("b.yaml", &template("b", None, "b:2"));
    wait_content(&daemon, &e.manifest("b"), "image: b:2");
    assert!(daemon.stop().success());
}

#[test]
fn an_unreadable_template_file_is_retried_and_is_not_its_fault() {
    let fault = row("daemon-template-unreadable");
    let e = env();
    e.put("edited.yaml", &template("edited", None, "edited:1"));
    let daemon = e.start(&[], "unreadable.log");
    let manifest = e.manifest("edited");
    wait_content(&daemon, &manifest, "image: edited:1");
    daemon.wait_ready(CONVERGE);
    let good = identity(&manifest);

    // The idle daemon's lowest free descriptor becomes its limit: it can
    // open nothing more, and the edit below cannot be read. A descriptor it
    // closes meanwhile (the socket of the readiness check above) would leave
    // room below the limit: lower it again until the free slot stays.
    let lowest_free = || {
        let used: Vec<u64> = open_fds(daemon.pid()).into_iter().map(|(n, _)| n).collect();
        (0..).find(|n| !used.contains(n)).unwrap()
    };
    let mut limit = lowest_free();
    let before = set_soft_file_limit(daemon.pid(), limit);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let free = lowest_free();
        if free == limit {
            break;
        }
        limit = free;
        set_soft_file_limit(daemon.pid(), limit);
    }
    assert_eq!(
        lowest_free(),
        limit,
        "the daemon's descriptors did not settle"
    );
    e.put("edited.yaml", &template("edited", None, "edited:2"));
    let file = identity(&e.templates.join("edited.yaml"));
    let line = wait_logged(&daemon, "the read failure in the log", || {
        daemon
            .logs()
            .lines()
            .find(|l| {
                l.contains("WARN")
                    && l.contains("template=kube-system/edited")
                    && l.contains(&format!("reason=\"{}\"", fault.reported))
                    && l.contains(fault.says)
            })
            .map(str::to_string)
    });
    assert!(line.contains("not the template's fault"), "{line}");
    assert_eq!(identity(&manifest), good, "the last good manifest stays");

    // The limit back: the file is read again, untouched.
    set_soft_file_limit(daemon.pid(), before);
    wait_content(&daemon, &manifest, "image: edited:2");
    assert_eq!(identity(&e.templates.join("edited.yaml")), file);
    assert!(daemon.metric("podstamp_render_failures_total{reason=\"ReadFailed\"}") >= 1.0);
    assert_eq!(
        daemon.metric("podstamp_render_failures_total{reason=\"InvalidTemplate\"}"),
        0.0,
        "an I/O error is not the template's fault"
    );
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

// ---------------------------------------------------------------- API server

/// A kubeconfig like `user`'s whose bearer token the API server does not know.
fn bad_token_kubeconfig(server: &ApiServer, dir: &Path) -> PathBuf {
    let text = fs::read_to_string(server.kubeconfig("podstamp")).unwrap();
    let replaced: Vec<String> = text
        .lines()
        .map(|l| match l.split_once("token:") {
            Some((indent, _)) => format!("{indent}token: not-a-token-the-server-knows"),
            None => l.to_string(),
        })
        .collect();
    assert_ne!(
        replaced.join("\n"),
        text.trim_end(),
        "the kubeconfig has a token"
    );
    let path = dir.join("bad-token.kubeconfig");
    fs::write(&path, replaced.join("\n") + "\n").unwrap();
    path
}

#[test]
fn rejected_credentials_or_missing_permissions_are_named_and_touch_nothing() {
    let server = shared_server();
    for id in ["api-401", "api-403"] {
        let fault = row(id);
        let e = env();
        let ns = unique("auth");
        let kubeconfig = match id {
            "api-401" => bad_token_kubeconfig(server, e.tmp.path()),
            _ => server.kubeconfig("nobody"),
        };
        // A manifest of ours from an earlier run, and a foreign one.
        let seed = e.tmp.path().join("seed.yaml");
        fs::write(
            &seed,
            template("seed", Some(""), "seed:1").replace(
                "  name: seed\n",
                &format!("  name: seed\n  namespace: {ns}\n"),
            ),
        )
        .unwrap();
        let ours = e.manifest("seed");
        let out = common::podstamp(&[
            "render",
            seed.to_str().unwrap(),
            "--node-name",
            "n1",
            "--namespace",
            &ns,
            "-o",
            ours.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert!(
            read(&ours)
                .unwrap()
                .contains(&format!("podstamp.io/source: {ns}/seed"))
        );
        let foreign = e.manifest("kube-apiserver");
        fs::write(
            &foreign,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: kube-apiserver}\n",
        )
        .unwrap();
        let before = (identity(&ours), identity(&foreign));

        let daemon = Daemon::start(
            &[
                "--config",
                e.config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &ns,
                "--node-name",
                "n1",
                "--manifest-dir",
                e.manifests.to_str().unwrap(),
            ],
            e.tmp.path().join(format!("{id}.log")),
        );
        let says = fault.says.replace("NS", &ns);
        wait_logged(&daemon, &format!("{id} in the log"), || {
            daemon.logs().contains(&says).then_some(())
        });
        assert!(
            daemon.logs().contains(fault.reported),
            "{id}: {}",
            daemon.logs()
        );
        // It keeps retrying (with backoff) and never touches the directory.
        wait_logged(&daemon, &format!("{id}: a second attempt"), || {
            (daemon.metric("podstamp_watch_restarts_total{watch=\"podtemplates\"}") >= 2.0)
                .then_some(())
        });
        assert_eq!((identity(&ours), identity(&foreign)), before, "{id}");
        assert_eq!(names_in(&e.manifests), ["kube-apiserver.yaml", "seed.yaml"]);
        assert_eq!(daemon.get("/readyz").map(|r| r.0), Some(503), "{id}");
        assert!(daemon.stop().success());
    }
}

#[test]
fn an_expired_watch_history_is_a_relist_that_changes_nothing() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, PodTemplate};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let fault = row("api-410-gone");
    let state = tempfile::tempdir().unwrap();
    // History compacted every second, and no watch cache to serve old versions from.
    let server = ApiServer::start_with(
        &state.path().join("apiserver"),
        &["--etcd-compaction-interval=1s", "--watch-cache=false"],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(server.admin());
    let ns = "expired";
    let pp = PostParams::default();
    fn from<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let template_object = |image: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "etcd", "namespace": ns, "labels": {"podstamp.io/enabled": "true"}},
            "template": {"spec": {"containers": [{"name": "main", "image": image}]}}})
    };
    rt.block_on(async {
        Api::<Namespace>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": ns}})))
            .await
            .unwrap();
        Api::<Node>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": "n1"}})))
            .await
            .unwrap();
        templates
            .create(&pp, &from(template_object("etcd:1")))
            .await
            .unwrap();
    });
    let e = env();
    let daemon = Daemon::start(
        &[
            "--config",
            e.config.to_str().unwrap(),
            "--kubeconfig",
            server.kubeconfig("admin").to_str().unwrap(),
            "--namespace",
            ns,
            "--node-name",
            "n1",
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
            "--watch-timeout",
            "2s",
        ],
        e.tmp.path().join("gone.log"),
    );
    let etcd = e.manifest("etcd");
    wait_content(&daemon, &etcd, "image: etcd:1");
    daemon.wait_ready(CONVERGE);
    let before = identity(&etcd);
    let lists = "podstamp_watch_lists_total{watch=\"podtemplates\"}";
    assert_eq!(daemon.metric(lists), 1.0);
    let served = server_lists(&rt, &client, "podtemplates");

    // Other writes move the revision on; each 2 s watch is renewed from a
    // resourceVersion that compaction has meanwhile removed.
    let mut n = 0;
    wait_logged(&daemon, "a 410 Gone and a relist", || {
        n += 1;
        rt.block_on(config_maps.create(
            &pp,
            &from(serde_json::json!({"metadata": {"name": format!("cm-{n}")}, "data": {"n": n.to_string()}})),
        ))
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        daemon.logs().contains(fault.says).then_some(())
    });
    wait_logged(&daemon, "the relist to restart the watch", || {
        (daemon.metric("podstamp_watch_restarts_total{watch=\"podtemplates\"}") >= 1.0)
            .then_some(())
    });
    // 410 Gone is listed again: counted by the daemon and by the server.
    wait_logged(&daemon, "a second list", || {
        (daemon.metric(lists) >= 2.0).then_some(())
    });
    wait_logged(&daemon, "the server to count a second list", || {
        (server_lists(&rt, &client, "podtemplates") > served).then_some(())
    });
    assert_eq!(identity(&etcd), before, "a relist rewrites nothing");
    assert_eq!(daemon.get("/readyz").map(|r| r.0), Some(200));
    rt.block_on(templates.patch(
        "etcd",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"template": {"spec": {"containers": [{"name": "main", "image": "etcd:2"}]}}})),
    ))
    .unwrap();
    wait_content(&daemon, &etcd, "image: etcd:2");
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

/// LIST requests for `resource` that the API server has served, whoever
/// made them (its own `apiserver_request_total`).
fn server_lists(rt: &tokio::runtime::Runtime, client: &kube::Client, resource: &str) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = rt.block_on(client.request_text(request)).unwrap();
    let resource = format!("resource=\"{resource}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("verb=\"LIST\"")
                && l.contains(&resource)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_dropped_watch_resumes_where_it_stopped_without_a_list() {
    use k8s_openapi::api::core::v1::{Namespace, Node, PodTemplate};
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    fn from<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }
    let fault = row("api-watch-dropped");
    // A server of its own: the LIST requests it counts are this daemon's.
    let state = tempfile::tempdir().unwrap();
    let server = ApiServer::start(&state.path().join("apiserver"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(server.admin());
    let ns = "dropped";
    let pp = PostParams::default();
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let template = |name: &str, image: &str| {
        serde_json::json!({"metadata": {"name": name, "labels": {"podstamp.io/enabled": "true"}},
            "template": {"spec": {"containers": [{"name": "main", "image": image}]}}})
    };
    rt.block_on(async {
        Api::<Namespace>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": ns}})))
            .await
            .unwrap();
        Api::<Node>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": "n1"}})))
            .await
            .unwrap();
        for (name, image) in [("keep", "etcd:1"), ("gone", "busybox:1")] {
            templates
                .create(&pp, &from(template(name, image)))
                .await
                .unwrap();
        }
    });
    let target: std::net::SocketAddr = server.url.trim_start_matches("https://").parse().unwrap();
    let proxy = SlowProxy::start(target, Duration::ZERO);
    let e = env();
    let kubeconfig = proxy.kubeconfig(&server, "admin", &e.tmp.path().join("cut.kubeconfig"));
    let daemon = Daemon::start(
        &[
            "--config",
            e.config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            ns,
            "--node-name",
            "n1",
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
        ],
        e.tmp.path().join("dropped.log"),
    );
    let (keep, gone) = (e.manifest("keep"), e.manifest("gone"));
    wait_content(&daemon, &keep, "image: etcd:1");
    wait_content(&daemon, &gone, "image: busybox:1");
    daemon.wait_ready(CONVERGE);
    // Each watch and the resource it lists.
    let watches = [
        ("podtemplates", "podtemplates"),
        ("node", "nodes"),
        ("pods", "pods"),
    ];
    let metric = |name: &str, watch: &str| daemon.metric(&format!("{name}{{watch=\"{watch}\"}}"));
    let lists = || {
        watches.map(|(watch, resource)| {
            (
                metric("podstamp_watch_lists_total", watch),
                server_lists(&rt, &client, resource),
            )
        })
    };
    let before = lists();
    for ((watch, _), (ours, served)) in watches.iter().zip(before) {
        assert_eq!((ours, served), (1.0, 1.0), "{watch}: listed once");
    }

    // Cut, until every watch has failed to resume at least twice.
    proxy.cut(true);
    wait_logged(&daemon, "failed attempts to resume", || {
        watches
            .iter()
            .all(|(watch, _)| metric("podstamp_watch_restarts_total", watch) >= 2.0)
            .then_some(())
    });
    let on_disk = (identity(&keep), identity(&gone));
    rt.block_on(async {
        templates
            .delete("gone", &DeleteParams::default())
            .await
            .unwrap();
        let image = serde_json::json!({"template": {"spec": {"containers": [{"name": "main", "image": "etcd:2"}]}}});
        templates
            .patch("keep", &PatchParams::default(), &Patch::Merge(image))
            .await
            .unwrap();
    });
    assert_eq!((identity(&keep), identity(&gone)), on_disk, "{}", fault.id);
    assert_eq!(daemon.get("/readyz").map(|r| r.0), Some(200));

    // Back: what happened meanwhile arrives on the resumed watch.
    proxy.cut(false);
    wait_content(&daemon, &keep, "image: etcd:2");
    wait_logged(&daemon, "gone.yaml removed", || {
        (!gone.exists()).then_some(())
    });
    wait_logged(&daemon, "every watch resumed", || {
        let resumed = daemon.logs().matches(fault.says).count();
        (resumed >= watches.len()).then_some(())
    });
    assert_eq!(lists(), before, "no watch listed again");
    assert_eq!(daemon.get("/readyz").map(|r| r.0), Some(200));
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

/// A TCP proxy on 127.0.0.1 that delays every chunk it forwards, or holds
/// them all while stalled, or, while cut, closes every connection it has
/// and each new one at once. TLS passes through it untouched.
struct SlowProxy {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SlowProxy {
    fn start(target: std::net::SocketAddr, delay: Duration) -> SlowProxy {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let (stop2, stalled2, cut2) = (stop.clone(), stalled.clone(), cut.clone());
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) if cut2.load(Ordering::Relaxed) => drop(client),
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(upstream) = std::net::TcpStream::connect(target) else {
                            continue;
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                            (upstream, client),
                        ] {
                            let (stop, stalled, cut) =
                                (stop2.clone(), stalled2.clone(), cut2.clone());
                            std::thread::spawn(move || {
                                pipe(from, to, delay, &stop, &stalled, &cut)
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        SlowProxy {
            port,
            stop,
            stalled,
            cut,
        }
    }

    fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn cut(&self, on: bool) {
        self.cut.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// A copy of `server`'s kubeconfig `user` that goes through the proxy.
    fn kubeconfig(&self, server: &ApiServer, user: &str, to: &Path) -> PathBuf {
        let text = fs::read_to_string(server.kubeconfig(user)).unwrap();
        let proxied = text.replace(&server.url, &format!("https://127.0.0.1:{}", self.port));
        assert_ne!(proxied, text, "the kubeconfig names {}", server.url);
        fs::write(to, proxied).unwrap();
        to.to_path_buf()
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, each chunk after `delay`, holding it while
/// `stalled`; ends at EOF, on an error, or when `stop` or `cut` is set.
fn pipe(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    delay: Duration,
    stop: &std::sync::atomic::AtomicBool,
    stalled: &std::sync::atomic::AtomicBool,
    cut: &std::sync::atomic::AtomicBool,
) {
    use std::io::{ErrorKind, Read, Write};
    use std::sync::atomic::Ordering;
    from.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 16 << 10];
    let over = || stop.load(Ordering::Relaxed) || cut.load(Ordering::Relaxed);
    while !over() {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        std::thread::sleep(delay);
        while stalled.load(Ordering::Relaxed) && !over() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if over() || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

#[test]
fn slow_and_stalled_api_responses_converge_and_change_nothing_meanwhile() {
    use k8s_openapi::api::core::v1::{Namespace, Node, PodTemplate};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    fn from<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }
    let fault = row("api-slow");
    let server = shared_server();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(server.admin());
    let ns = unique("slow");
    let node = unique("node");
    let pp = PostParams::default();
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), &ns);
    let image = |i: &str| serde_json::json!({"template": {"spec": {"containers": [{"name": "main", "image": i}]}}});
    rt.block_on(async {
        Api::<Namespace>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": ns}})))
            .await
            .unwrap();
        Api::<Node>::all(client.clone())
            .create(&pp, &from(serde_json::json!({"metadata": {"name": node}})))
            .await
            .unwrap();
        let mut t = image("etcd:1");
        t["metadata"] =
            serde_json::json!({"name": "etcd", "labels": {"podstamp.io/enabled": "true"}});
        templates.create(&pp, &from(t)).await.unwrap();
    });
    let target: std::net::SocketAddr = server.url.trim_start_matches("https://").parse().unwrap();
    let proxy = SlowProxy::start(target, Duration::from_millis(300));
    let e = env();
    let kubeconfig = proxy.kubeconfig(server, "admin", &e.tmp.path().join("slow.kubeconfig"));
    let daemon = Daemon::start(
        &[
            "--config",
            e.config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &ns,
            "--node-name",
            &node,
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
        ],
        e.tmp.path().join("slow.log"),
    );
    let etcd = e.manifest("etcd");
    wait_content(&daemon, &etcd, "image: etcd:1");
    daemon.wait_ready(CONVERGE);
    let patch = |i: &str| {
        rt.block_on(templates.patch("etcd", &PatchParams::default(), &Patch::Merge(image(i))))
            .unwrap();
    };
    patch("etcd:2");
    wait_content(&daemon, &etcd, "image: etcd:2");

    // Stalled: the update is held; nothing on disk changes; the daemon is up.
    proxy.stall(true);
    let before = identity(&etcd);
    patch("etcd:3");
    std::thread::sleep(Duration::from_secs(3));
    daemon.assert_running();
    assert_eq!(daemon.get("/healthz").map(|r| r.0), Some(200));
    assert_eq!(identity(&etcd), before, "{}", fault.id);
    proxy.stall(false);
    wait_content(&daemon, &etcd, "image: etcd:3");
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.logs().contains(fault.says));
    assert!(daemon.stop().success());
}

/// A current-thread runtime and an admin client of the shared API server,
/// with a fresh namespace and Node.
fn api_setup(
    prefix: &str,
    node: serde_json::Value,
) -> (tokio::runtime::Runtime, kube::Client, String, String) {
    use k8s_openapi::api::core::v1::{Namespace, Node};
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(shared_server().admin());
    let ns = unique(prefix);
    let name = unique("node");
    let mut node = node;
    node["apiVersion"] = serde_json::json!("v1");
    node["kind"] = serde_json::json!("Node");
    node["metadata"]["name"] = serde_json::json!(name);
    let pp = PostParams::default();
    rt.block_on(async {
        Api::<Namespace>::all(client.clone())
            .create(
                &pp,
                &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
        // Untyped, so that fields the typed model cannot hold go through.
        Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<Node>(&()))
            .create(&pp, &serde_json::from_value(node).unwrap())
            .await
            .unwrap();
    });
    (rt, client, ns, name)
}

fn api_daemon(e: &Env, config: &Path, ns: &str, node: &str, log: &str) -> Daemon {
    Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            shared_server().kubeconfig("admin").to_str().unwrap(),
            "--namespace",
            ns,
            "--node-name",
            node,
            "--manifest-dir",
            e.manifests.to_str().unwrap(),
        ],
        e.tmp.path().join(log),
    )
}

/// Past the range of the time library k8s-openapi uses, valid for Go's.
const FAR_FUTURE: &str = "9999-12-31T23:59:59Z";

#[test]
fn an_undecodable_template_is_read_alone() {
    use k8s_openapi::api::core::v1::PodTemplate;
    use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;
    let fault = row("api-undecodable-template");
    let (rt, client, ns, node) = api_setup("undecodable", json!({"metadata": {}}));
    // Content that no log line may show.
    let secret = unique("do-not-log");
    let object = |name: &str, image: &str| {
        json!({"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "labels": {"podstamp.io/enabled": "true"}},
            "template": {"spec": {"containers": [{"name": "main", "image": image, "args": [format!("--token={secret}")]}]}}})
    };
    let mut bad = object("bad", "bad:1");
    bad["template"]["metadata"] = json!({"creationTimestamp": FAR_FUTURE});
    let templates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<PodTemplate>(&()));
    let pp = PostParams::default();
    for t in [object("good", "good:1"), bad] {
        rt.block_on(templates.create(&pp, &serde_json::from_value(t).unwrap()))
            .unwrap();
    }
    // The premise: stored as sent, and a typed list of them cannot be decoded.
    let stored = rt.block_on(templates.get("bad")).unwrap();
    assert_eq!(
        stored.data["template"]["metadata"]["creationTimestamp"],
        FAR_FUTURE
    );
    let typed: Api<PodTemplate> = Api::namespaced(client.clone(), &ns);
    assert!(rt.block_on(typed.list(&ListParams::default())).is_err());

    let e = env();
    let daemon = api_daemon(&e, &e.config, &ns, &node, "undecodable.log");
    let good = e.manifest("good");
    wait_content(&daemon, &good, "image: good:1");
    daemon.wait_ready(CONVERGE);
    // Read on its own, the template is fine: the field it cannot decode is
    // one a static pod has no use for, dropped with a warning.
    wait_content(&daemon, &e.manifest("bad"), "image: bad:1");
    let template = format!("PodTemplate {ns}/bad:");
    wait_logged(
        &daemon,
        "the warning about the bad template's field",
        || {
            daemon
                .logs()
                .lines()
                .find(|l| l.contains("WARN") && l.contains(&template) && l.contains(fault.says))?;
            Some(())
        },
    );
    assert_eq!(
        daemon.metric("podstamp_render_failures_total{reason=\"InvalidTemplate\"}"),
        0.0
    );

    // Later edits of the other template are applied.
    let mut edit = object("good", "good:2");
    edit.as_object_mut().unwrap().remove("metadata");
    rt.block_on(templates.patch("good", &PatchParams::default(), &Patch::Merge(edit)))
        .unwrap();
    wait_content(&daemon, &good, "image: good:2");
    let logs = daemon.logs();
    assert!(
        !logs.contains(&secret),
        "template content in the log:\n{logs}"
    );
    assert!(!logs.contains("unreachable"), "{logs}");
    assert_eq!(daemon.get("/readyz").map(|r| r.0), Some(200));
    kubelet_accepts_dir(&e.manifests);
    assert!(daemon.stop().success());
}

#[test]
fn an_undecodable_node_field_stops_nothing() {
    use k8s_openapi::api::core::v1::{Node, PodTemplate};
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
    use serde_json::json;
    let fault = row("api-undecodable-node");
    let (rt, client, ns, node) = api_setup(
        "badnode",
        json!({"metadata": {"labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "example.com/k", "effect": "NoSchedule", "timeAdded": FAR_FUTURE}]}}),
    );
    let nodes: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Node>(&()));
    // The premise: stored as sent, and the typed model cannot read it.
    let stored = rt.block_on(nodes.get(&node)).unwrap();
    assert_eq!(stored.data["spec"]["taints"][0]["timeAdded"], FAR_FUTURE);
    assert!(
        rt.block_on(Api::<Node>::all(client.clone()).get(&node))
            .is_err()
    );
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), &ns);
    let t = json!({"metadata": {"name": "zoned", "labels": {"podstamp.io/enabled": "true"}},
        "template": {"spec": {"containers": [{"name": "main", "image": "z:1",
            "command": ["serve", "--zone=${node.label[zone]}"]}]}}});
    rt.block_on(templates.create(&PostParams::default(), &serde_json::from_value(t).unwrap()))
        .unwrap();

    // The real plugins: substitute reads the node's labels.
    let e = env();
    let config = write_config(e.tmp.path());
    let daemon = api_daemon(&e, &config, &ns, &node, "badnode.log");
    let zoned = e.manifest("zoned");
    wait_content(&daemon, &zoned, "--zone=a");
    daemon.wait_ready(CONVERGE);
    let line = wait_logged(&daemon, "the Node's field in the log", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains("WARN") && l.contains(&node) && l.contains(fault.says))
            .map(str::to_string)
    });
    assert!(line.contains("goes on rendering"), "{line}");
    rt.block_on(nodes.patch(
        &node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"zone": "b"}}})),
    ))
    .unwrap();
    wait_content(&daemon, &zoned, "--zone=b");
    kubelet_accepts(&[&e.manifests], &node);
    assert!(daemon.stop().success());
}

#[test]
fn podstamp_render_refuses_a_manifest_over_the_size_limit() {
    let fault = row("render-over-max-manifest-size");
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("big.yaml");
    fs::write(
        &input,
        template("big", None, "big:1").replace(
            "image: \"big:1\"}",
            &format!("image: \"big:1\", args: [\"{}\"]}}", "x".repeat(2 << 20)),
        ),
    )
    .unwrap();
    let output = tmp.path().join("big.out.yaml");
    let out = render_to(&input, &output);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(fault.says), "{err}");
    assert!(!output.exists());
    assert_eq!(names_in(tmp.path()), ["big.yaml"], "no temp file either");
}

#[test]
fn a_name_too_long_for_the_kubelet_with_this_node_is_refused() {
    let fault = row("template-name-with-node-over-253");
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("{0}.{0}.{0}.{1}", "a".repeat(62), "b".repeat(61));
    let input = tmp.path().join("long.yaml");
    fs::write(&input, template(&name, None, "x:1")).unwrap();
    let render = |node: &str, output: &Path| {
        common::podstamp(&[
            "render",
            input.to_str().unwrap(),
            "--node-name",
            node,
            "-o",
            output.to_str().unwrap(),
        ])
    };
    // 250 + "-n1" is 253: the kubelet takes it.
    let ok_dir = tmp.path().join("ok");
    fs::create_dir(&ok_dir).unwrap();
    let out = render("n1", &ok_dir.join("long.yaml"));
    assert!(out.status.success(), "{}", common::stderr(&out));
    kubelet_accepts(&[&ok_dir], "n1");
    // With a 26-character node name it would be 277: refused, nothing written.
    let node = "node-with-a-long-name-1234";
    let bad_dir = tmp.path().join("bad");
    fs::create_dir(&bad_dir).unwrap();
    let out = render(node, &bad_dir.join("long.yaml"));
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(fault.says), "{err}");
    assert!(names_in(&bad_dir).is_empty());
}

/// `podstamp render INPUT --node-name n1 -o OUTPUT`.
fn render_to(input: &Path, output: &Path) -> std::process::Output {
    common::podstamp(&[
        "render",
        input.to_str().unwrap(),
        "--node-name",
        "n1",
        "-o",
        output.to_str().unwrap(),
    ])
}

#[test]
fn an_unsafe_revisions_dir_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let (templates, manifests) = (tmp.path().join("templates"), tmp.path().join("manifests"));
    fs::create_dir(&templates).unwrap();
    fs::create_dir(&manifests).unwrap();
    let open = tmp.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let source = format!("dir:{}", templates.display());
    for (id, dir) in [
        ("revisions-dir-in-manifest-dir", manifests.join("revisions")),
        ("revisions-dir-open", open),
    ] {
        let fault = row(id);
        let out = common::podstamp(&[
            "run",
            "--source",
            &source,
            "--node-name",
            "n1",
            "--listen",
            "127.0.0.1:0",
            "--manifest-dir",
            manifests.to_str().unwrap(),
            "--revisions-dir",
            dir.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{id}: {stderr}");
        assert!(stderr.contains(fault.says), "{id}: {stderr}");
        assert!(stderr.contains(dir.to_str().unwrap()), "{id}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{id}: {stderr}");
    }
    // Nothing was created in the manifest directory.
    assert_eq!(fs::read_dir(&manifests).unwrap().count(), 0);
}

#[test]
fn a_damaged_rollout_state_is_named_and_read_as_empty() {
    let fault = row("rollout-state-damaged");
    let env = env();
    let history = env.tmp.path().join("history");
    fs::create_dir_all(&history).unwrap();
    let state = history.join("rollout-states.jsonl");
    // web's line damaged; another template's line, read as it is.
    fs::write(
        &state,
        "{\"template\":\"kube-system/other\",\"state\":{\"held\":\"abcd\"}}\n\
         {\"template\":\"kube-system/web\",\"state\":{\"held\":3}}\n",
    )
    .unwrap();
    env.put("web.yaml", &template("web", None, "busybox:1"));
    let daemon = env.start(
        &["--revisions-dir", history.to_str().unwrap()],
        "podstamp.log",
    );
    wait_content(&daemon, &env.manifest("web"), "image: busybox:1");
    let line = wait_logged(&daemon, "the damaged state reported", || {
        daemon
            .logs()
            .lines()
            .find(|l| l.contains(fault.says))
            .map(str::to_string)
    });
    assert!(
        line.contains(&format!("{} line 2", state.display())) && line.contains("delete the line"),
        "{line}"
    );
    // Replaced by a readable line as the rollout state changes; the other
    // template's line is kept.
    env.put("web.yaml", &template("web", None, "busybox:2"));
    wait_content(&daemon, &env.manifest("web"), "image: busybox:2");
    let value = wait_logged(&daemon, "a readable rollout state", || {
        let value = common::rollout_state(&history, "kube-system/web");
        value["pending"].is_string().then_some(value)
    });
    assert!(value["pending"].is_string(), "{value}");
    assert_eq!(
        common::rollout_state(&history, "kube-system/other"),
        serde_json::json!({"held": "abcd"})
    );
    assert!(daemon.stop().success());
}

#[test]
fn podstamp_removes_its_own_static_pod_manifest_when_its_source_is_in_its_namespace() {
    let fault = row("deploy-static-pod-own-source");
    let env = env();
    // podstamp's static pod, rendered as deploy/static-pod.yaml is: its
    // source is podstamp-static/podstamp, not a template of kube-system.
    let render = |template: &Path, out: &Path| {
        let out = common::podstamp(&[
            "render",
            template.to_str().unwrap(),
            "--node-name",
            "n1",
            "--node-arch",
            "amd64",
            "--no-cache",
            "--config",
            "deploy/static-pod-render.yaml",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", common::stderr(&out));
    };
    let fixture = common::repo().join("deploy/static-pod/podstamp.yaml");
    let kept = env.manifests.join("podstamp.yaml");
    render(&fixture, &kept);
    // The same, from a template of the namespace podstamp serves.
    let text = fs::read_to_string(&fixture).unwrap();
    assert!(text.contains("\n  namespace: podstamp-static\n"));
    let in_ns = env.tmp.path().join("podstamp-in-kube-system.yaml");
    fs::write(
        &in_ns,
        text.replace(
            "\n  namespace: podstamp-static\n",
            "\n  namespace: kube-system\n",
        ),
    )
    .unwrap();
    let removed = env.manifests.join("podstamp-in-kube-system.yaml");
    render(&in_ns, &removed);
    assert!(
        fs::read_to_string(&removed)
            .unwrap()
            .contains("podstamp.io/source: kube-system/podstamp\n")
    );
    let before = identity(&kept);

    // podstamp serving kube-system, with no templates.
    let daemon = env.start(&["--namespace", "kube-system"], "podstamp.log");
    daemon.wait_ready(CONVERGE);
    wait_logged(&daemon, "the manifest of its own source removed", || {
        (!removed.exists()).then_some(())
    });
    assert_eq!(daemon.metric("podstamp_manifests_removed_total"), 1.0);
    let log = daemon.logs();
    assert!(
        log.lines().any(|l| l.contains(fault.says)
            && l.contains("file=podstamp-in-kube-system.yaml")
            && l.contains("template=kube-system/podstamp")),
        "{log}"
    );
    // The other one is not podstamp's: left alone.
    assert_eq!(identity(&kept), before);
    assert_eq!(daemon.metric("podstamp_managed_manifests"), 0.0);
    assert!(daemon.stop().success());
}
