//! podstamp's own container image, end to end: deploy/image/build.sh builds
//! it twice into fresh storage (same digest), the image holds a podstamp
//! that runs on the image's own libraries, the example plugins where
//! deploy/daemonset.yaml's catalog looks and the CA bundle, and
//! deploy/image/push.sh puts it into a real registry (tests/oci/registry.rs:
//! TLS, basic auth) under the same digest.
//!
//! The image is built from this test's own podstamp binary (cargo builds it
//! for the test) and the plugins of `bash plugins/build.sh`. Needs buildah,
//! skopeo and objcopy (`bash tests/harness/image-deps.sh` installs them as
//! root), and `bash tests/harness/registry-deps.sh` for the registry; a
//! missing tool fails the test saying how to install it.

mod common;
#[path = "oci/registry.rs"]
mod registry;
#[path = "daemon/support.rs"]
#[allow(unused_imports)]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use registry::{PASSWORD, TestRegistry, USER};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const PLUGINS: [&str; 4] = ["arch-image", "identity", "node-env", "substitute"];

use common::run_ok as run;

/// Makes sure buildah, skopeo and objcopy are there (installing them as root).
fn image_deps() {
    let deps = common::repo().join("tests/harness/image-deps.sh");
    let out = Command::new("bash").arg(&deps).output().unwrap();
    assert!(
        out.status.success(),
        "building the image needs buildah, skopeo and objcopy: run `bash {}` as root, or `apt-get install -y buildah skopeo binutils`\n{}",
        deps.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The directory of the example plugins (plugins/build.sh's output).
fn plugin_dir() -> PathBuf {
    for name in PLUGINS {
        common::plugin(name);
    }
    common::plugin("identity").parent().unwrap().to_path_buf()
}

/// One build's OCI layout and what build.sh printed.
struct Built {
    layout: PathBuf,
    digest: String,
    stdout: String,
}

/// `deploy/image/build.sh` with this test's binary, into `dir`/oci, with
/// its own buildah storage `dir`/storage.
fn build(dir: &Path) -> Built {
    let layout = dir.join("oci");
    let started = Instant::now();
    let stdout = run(
        Command::new("bash")
            .arg(common::repo().join("deploy/image/build.sh"))
            .arg("--bin")
            .arg(env!("CARGO_BIN_EXE_podstamp"))
            .arg("--plugins")
            .arg(plugin_dir())
            .arg("--kubecheck")
            .arg(common::kubecheck())
            .arg("--storage")
            .arg(dir.join("storage"))
            .arg("--out")
            .arg(&layout)
            .env_remove("SOURCE_DATE_EPOCH")
            .env_remove("PODSTAMP_IMAGE_REVISION"),
        "deploy/image/build.sh",
    );
    eprintln!(
        "build.sh took {:.1}s:\n{stdout}",
        started.elapsed().as_secs_f64()
    );
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("oci:{}:podstamp:{VERSION}", layout.display()).as_str()),
        "{stdout}"
    );
    let digest = lines
        .next()
        .and_then(|l| l.strip_prefix("digest: "))
        .unwrap_or_else(|| panic!("no `digest: ` line: {stdout}"))
        .to_string();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    for (line, key) in lines.zip(["compressed: ", "uncompressed: "]) {
        assert!(line.starts_with(key) && line.ends_with(" MiB)"), "{stdout}");
    }
    Built {
        layout,
        digest,
        stdout,
    }
}

/// The blob `sha256:HEX` of an OCI layout.
fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").unwrap();
    let bytes = fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(sha256_hex(&bytes), hex, "blob {digest} is not its digest");
    bytes
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// The image's manifest and config.
fn manifest_and_config(built: &Built) -> (Value, Value) {
    let index = json(&fs::read(built.layout.join("index.json")).unwrap());
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(manifests[0]["digest"], built.digest.as_str());
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("podstamp:{VERSION}")
    );
    let manifest = json(&blob(&built.layout, &built.digest));
    let config = json(&blob(
        &built.layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    (manifest, config)
}

/// The image's file paths, as written in deploy/daemonset.yaml's catalog.
fn daemonset_plugin_paths() -> Vec<String> {
    use serde::Deserialize;
    let text = fs::read_to_string(common::repo().join("deploy/daemonset.yaml")).unwrap();
    let mut paths = Vec::new();
    let mut image = None;
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).unwrap();
        if value["kind"] == "ConfigMap" {
            let config: Value =
                serde_norway::from_str(value["data"]["podstamp.yaml"].as_str().unwrap()).unwrap();
            for (_, entry) in config["plugins"].as_object().unwrap() {
                paths.push(entry["path"].as_str().unwrap().to_string());
            }
        }
        if value["kind"] == "DaemonSet" {
            image = value["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .map(str::to_string);
        }
    }
    let image = image.expect("deploy/daemonset.yaml has no DaemonSet container image");
    // The name build.sh gives, which `kustomize edit set image podstamp=…`
    // (deploy/image/kustomization.yaml) points at a registry.
    assert_eq!(
        image,
        format!("podstamp:{VERSION}"),
        "deploy/daemonset.yaml's image is not the name deploy/image/build.sh gives"
    );
    assert!(!paths.is_empty());
    paths
}

/// The dynamic loader and the library directory of this architecture, as
/// `ldd` names them on Debian.
fn loader_and_libs() -> (&'static str, &'static str) {
    if cfg!(target_arch = "aarch64") {
        ("lib/ld-linux-aarch64.so.1", "lib/aarch64-linux-gnu")
    } else {
        ("lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu")
    }
}

#[test]
fn two_builds_give_one_digest_and_the_image_holds_a_podstamp_that_runs_on_its_own_libraries() {
    image_deps();
    let tmp = tempfile::tempdir().unwrap();
    let first = build(&tmp.path().join("first"));
    let second = build(&tmp.path().join("second"));
    assert_eq!(
        first.digest, second.digest,
        "two builds of the same inputs differ:\n{}\n{}",
        first.stdout, second.stdout
    );
    assert_eq!(
        fs::read(first.layout.join("index.json")).unwrap(),
        fs::read(second.layout.join("index.json")).unwrap()
    );

    // The config: podstamp as the entrypoint, `run` by default (the
    // DaemonSet's args replace it), the labels, no time, no history.
    let (manifest, config) = manifest_and_config(&first);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/bin/podstamp"])
    );
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["run"]));
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.title"], "podstamp");
    assert!(
        labels["org.opencontainers.image.source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{labels}"
    );
    assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    assert!(config.get("history").is_none(), "{config}");
    assert_eq!(config["os"], "linux");

    // One gzipped layer; every entry root's, stamped 1970-01-01.
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = first.layout.join("blobs/sha256").join(
        layers[0]["digest"]
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap(),
    );
    blob(&first.layout, layers[0]["digest"].as_str().unwrap());
    let listing = run(
        Command::new("tar")
            .args(["-tvzf"])
            .arg(&layer)
            .args(["--numeric-owner", "--full-time"]),
        "tar -t",
    );
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "0/0", "not root's: {line}");
        assert_eq!(
            (fields[3], fields[4]),
            ("1970-01-01", "00:00:00"),
            "not stamped at 0: {line}"
        );
    }
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&layer)
            .arg("-C")
            .arg(&root),
        "tar -x",
    );

    // The binary, stripped; the plugins, byte for byte, where the
    // DaemonSet's catalog looks; Debian's CA bundle; a nobody user; /tmp.
    let binary = root.join("usr/bin/podstamp");
    let size = fs::metadata(&binary).unwrap().len();
    assert!(
        size < fs::metadata(env!("CARGO_BIN_EXE_podstamp")).unwrap().len(),
        "usr/bin/podstamp is not stripped ({size} bytes)"
    );
    for name in PLUGINS {
        assert_eq!(
            fs::read(root.join(format!("usr/lib/podstamp/plugins/{name}.wasm"))).unwrap(),
            fs::read(common::plugin(name)).unwrap(),
            "plugin {name}"
        );
    }
    assert_eq!(
        fs::read(root.join("usr/lib/podstamp/podstamp-kubecheck")).unwrap(),
        fs::read(common::kubecheck()).unwrap(),
        "usr/lib/podstamp/podstamp-kubecheck is not the pod check built"
    );
    for path in daemonset_plugin_paths() {
        assert!(
            root.join(path.trim_start_matches('/')).is_file(),
            "deploy/daemonset.yaml's catalog names {path}, which the image lacks"
        );
    }
    assert_eq!(
        fs::read(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
        fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap()
    );
    assert!(
        fs::read_to_string(root.join("etc/passwd"))
            .unwrap()
            .lines()
            .any(|l| l.starts_with("nobody:x:65534:")),
        "no nobody in /etc/passwd"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(root.join("tmp")).unwrap().permissions().mode() & 0o7777,
        0o1777
    );

    // The image's loader resolves every library of the binary inside the
    // image (not from this host), and runs it.
    let (loader, libs) = loader_and_libs();
    let (loader, libs) = (root.join(loader), root.join(libs));
    assert!(loader.is_file(), "the image has no {}", loader.display());
    let resolved = run(
        Command::new(&loader)
            .arg("--library-path")
            .arg(&libs)
            .arg("--list")
            .arg(&binary),
        "ld.so --list",
    );
    for line in resolved.lines() {
        if let Some((_, path)) = line.split_once(" => ") {
            assert!(
                path.trim().starts_with(root.to_str().unwrap()),
                "a library comes from outside the image: {line}\n{resolved}"
            );
        }
    }
    let version = run(
        Command::new(&loader)
            .arg("--library-path")
            .arg(&libs)
            .arg(&binary)
            .arg("--version"),
        "podstamp --version through the image's loader",
    );
    assert_eq!(version.trim(), format!("podstamp {VERSION}"));
}

#[test]
fn push_puts_the_image_into_a_registry_with_tls_and_auth_under_the_same_digest() {
    image_deps();
    let tmp = tempfile::tempdir().unwrap();
    let built = build(&tmp.path().join("build"));

    // A CA of this test's own: no harness API server needed.
    let registry = TestRegistry::start_with_own_ca(&tmp.path().join("registry"));
    // skopeo's --dest-cert-dir: a directory whose *.crt are CAs.
    let certs = tmp.path().join("certs");
    fs::create_dir(&certs).unwrap();
    fs::copy(&registry.ca, certs.join("ca.crt")).unwrap();

    let push = |password: &str, target: &str| {
        Command::new("bash")
            .arg(common::repo().join("deploy/image/push.sh"))
            .arg("--layout")
            .arg(&built.layout)
            .arg(format!("{}/{target}", registry.host))
            .arg("--dest-cert-dir")
            .arg(&certs)
            .arg("--dest-creds")
            .arg(format!("{USER}:{password}"))
            .output()
            .unwrap()
    };
    let out = push(PASSWORD, "podstamp");
    assert!(
        out.status.success(),
        "push.sh: {}\n{}\nregistry log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        registry.log()
    );
    let reference = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        reference.trim(),
        format!("{}/podstamp@{}", registry.host, built.digest)
    );
    // And the command that points deploy/ at it (tests/kustomize.rs runs it).
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "\npush.sh:   kustomize edit set image podstamp={}\n",
            reference.trim()
        )),
        "push.sh did not print the kustomize command: {said}"
    );

    // The registry holds the layout's manifest, byte for byte, under the
    // version's tag: read back over TLS with the credentials.
    let raw = Command::new("skopeo")
        .args(["inspect", "--raw", "--cert-dir"])
        .arg(&certs)
        .arg("--creds")
        .arg(format!("{USER}:{PASSWORD}"))
        .arg(format!("docker://{}/podstamp:{VERSION}", registry.host))
        .output()
        .unwrap();
    assert!(
        raw.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&raw.stderr)
    );
    assert_eq!(
        format!("sha256:{}", sha256_hex(&raw.stdout)),
        built.digest,
        "the registry's manifest is not the built one"
    );
    assert_eq!(raw.stdout, blob(&built.layout, &built.digest));
    let stored =
        fs::read(registry.blob_file(built.digest.strip_prefix("sha256:").unwrap())).unwrap();
    assert_eq!(stored, raw.stdout);

    // Wrong credentials: refused, and said so in one error line.
    let out = push("not-the-password", "podstamp-denied");
    assert!(!out.status.success(), "a push with a wrong password passed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("push.sh: error: skopeo copy ") && last.ends_with("failed (above)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("unauthorized") || stderr.contains("401"),
        "{stderr}"
    );
}
