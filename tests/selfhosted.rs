//! podstamp self-hosted on a real kubelet (issue 14 part 5), end to end:
//!
//! 1. deploy/image/build.sh builds podstamp's image from this test's own
//!    podstamp binary and the plugins of `bash plugins/build.sh`, and
//!    deploy/image/push.sh pushes it to a real registry
//!    (tests/oci/registry.rs: TLS with the harness CA, basic auth);
//! 2. the test node's containerd (podstamp-node `--registry-hosts`) pulls
//!    from it through a `hosts.toml` naming the CA and carrying the
//!    credentials as an Authorization header (a static pod cannot have
//!    imagePullSecrets);
//! 3. `podstamp render` turns deploy/static-pod/podstamp.yaml into a
//!    static pod running that image by digest, with the node's manifest
//!    directory, a kubeconfig file (the harness API server, reached over the
//!    host network) and the configuration mounted from the host, and the
//!    real kubelet runs it;
//! 4. that podstamp renders the bundled pod-checkpointer PodTemplate
//!    (examples/pod-checkpointer.yaml) through deploy/daemonset.yaml's chain,
//!    with the plugins inside the image, into the same directory, and the
//!    kubelet runs the checkpointer (on the node's local busybox image);
//! 5. podstamp's container killed through the CRI (by id) is restarted by
//!    the kubelet, and the checkpointer's manifest and container are left
//!    alone.
//!
//! Needs buildah, skopeo (`bash tests/harness/image-deps.sh`),
//! docker-registry (`bash tests/harness/registry-deps.sh`), containerd, runc
//! and busybox-static (`bash tests/harness/node-deps.sh`), the Go harness
//! and the plugins; runs as root, holding the machine-wide kubelet lock.

mod common;
#[path = "kubelet/support.rs"]
mod node;
#[path = "oci/registry.rs"]
mod registry;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use node::{Container, Node, leftovers, serial};
use registry::{PASSWORD, TestRegistry, USER};
use support::{ApiServer, Kube, free_port, identity, kubelet_accepts, unique, wait_for};

/// The test node's name: its static pods are `NAME-selfhosted`.
const NODE: &str = "selfhosted";
/// The image the checkpointer runs: podstamp-node imports it into containerd.
const LOCAL_IMAGE: &str = "podstamp.test/busybox:1";
/// The kubelet pulling podstamp's image (tens of MiB: the test's debug
/// build) and starting it, or restarting a container after its back-off.
const START: Duration = Duration::from_secs(120);
/// podstamp ready, a manifest written, a container running.
const CONVERGE: Duration = Duration::from_secs(60);

use common::run_ok as run;

/// A host dependency script (tests/harness/*-deps.sh): installs what is
/// missing as root, else the test fails saying how.
fn deps(script: &str, what: &str) {
    let path = common::repo().join("tests/harness").join(script);
    let out = Command::new("bash").arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "{what}: run `bash {}` as root\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The directory of the example plugins (plugins/build.sh's output).
fn plugin_dir() -> PathBuf {
    for name in ["arch-image", "identity", "node-env", "substitute"] {
        common::plugin(name);
    }
    common::plugin("identity").parent().unwrap().to_path_buf()
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap()
}

/// One sample of podstamp's /metrics, None when it does not answer.
fn metric(port: u16, sample: &str) -> Option<f64> {
    let (_, body) = support::http_get(port, "/metrics")?;
    Some(common::sample_value(&body, sample).unwrap_or(0.0))
}

/// The logs of container `container` of static pod `pod` (every restart),
/// from the kubelet's pod log directory.
fn container_logs(node: &Node, pod: &str, container: &str) -> String {
    let mut out = String::new();
    let Ok(pods) = fs::read_dir(node.dir.join("logs/pods")) else {
        return out;
    };
    for entry in pods.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.contains(&format!("_{pod}_")) {
            continue;
        }
        let mut files: Vec<PathBuf> = fs::read_dir(entry.path().join(container))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for file in files {
            out += &format!(
                "--- {}\n{}\n",
                file.display(),
                fs::read_to_string(&file).unwrap_or_default()
            );
        }
    }
    out
}

/// What the test shows when a step fails: the node's containers and logs,
/// podstamp's container logs, the registry's log.
struct Report<'a> {
    node: &'a Node,
    registry: &'a TestRegistry,
}

impl Report<'_> {
    fn text(&self) -> String {
        format!(
            "containers: {:#?}\n{}\npodstamp's container logs:\n{}\npod-checkpointer's container logs:\n{}\nregistry log (last lines):\n{}",
            self.node.containers(),
            self.node.logs(),
            container_logs(self.node, &format!("podstamp-{NODE}"), "podstamp"),
            container_logs(
                self.node,
                &format!("pod-checkpointer-{NODE}"),
                "pod-checkpointer"
            ),
            tail(&self.registry.log(), 20),
        )
    }

    /// [`wait_for`], and on a timeout everything the node says.
    fn wait<T>(&self, what: &str, limit: Duration, probe: impl FnMut() -> Option<T>) -> T {
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(what, limit, probe)
        }));
        found.unwrap_or_else(|_| {
            panic!(
                "timed out after {limit:?} waiting for {what}\n{}",
                self.text()
            )
        })
    }

    /// Asserts `ok`, with everything the node says when it is false.
    fn check(&self, ok: bool, what: &str) {
        if !ok {
            panic!("{what}\n{}", self.text());
        }
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The running container `name` of static pod `pod`, if exactly one runs.
fn running(node: &Node, pod: &str, name: &str) -> Option<Container> {
    let mut found: Vec<Container> = node
        .running(pod)
        .into_iter()
        .filter(|c| c.name == name)
        .collect();
    (found.len() == 1).then(|| found.remove(0))
}

/// deploy/image/build.sh with this test's binary, then deploy/image/push.sh
/// to `registry` over TLS with the credentials: the pushed reference,
/// `REGISTRY/podstamp@sha256:…`.
fn build_and_push(work: &Path, registry: &TestRegistry) -> String {
    let layout = work.join("oci");
    let started = Instant::now();
    let built = run(
        Command::new("bash")
            .arg(common::repo().join("deploy/image/build.sh"))
            .arg("--bin")
            .arg(env!("CARGO_BIN_EXE_podstamp"))
            .arg("--plugins")
            .arg(plugin_dir())
            .arg("--kubecheck")
            .arg(common::kubecheck())
            .arg("--storage")
            .arg(work.join("storage"))
            .arg("--out")
            .arg(&layout),
        "deploy/image/build.sh",
    );
    eprintln!(
        "build.sh took {:.1}s:\n{built}",
        started.elapsed().as_secs_f64()
    );
    let digest = built
        .lines()
        .find_map(|l| l.strip_prefix("digest: "))
        .unwrap_or_else(|| panic!("build.sh printed no digest: {built}"))
        .to_string();
    // skopeo's --dest-cert-dir: a directory whose *.crt are CAs.
    let certs = work.join("certs");
    fs::create_dir_all(&certs).unwrap();
    fs::copy(&registry.ca, certs.join("ca.crt")).unwrap();
    let pushed = run(
        Command::new("bash")
            .arg(common::repo().join("deploy/image/push.sh"))
            .arg("--layout")
            .arg(&layout)
            .arg(format!("{}/podstamp", registry.host))
            .arg("--dest-cert-dir")
            .arg(&certs)
            .arg("--dest-creds")
            .arg(format!("{USER}:{PASSWORD}")),
        "deploy/image/push.sh",
    );
    let reference = pushed.trim().to_string();
    assert_eq!(reference, format!("{}/podstamp@{digest}", registry.host));
    reference
}

/// containerd's registry configuration (`config_path`): for the test
/// registry, its CA and its credentials as a header on every request.
fn registry_hosts(dir: &Path, registry: &TestRegistry) -> PathBuf {
    let host_dir = dir.join(&registry.host);
    fs::create_dir_all(&host_dir).unwrap();
    // base64, as the registry module writes a docker config.
    let basic = serde_json::to_value(k8s_openapi::ByteString(
        format!("{USER}:{PASSWORD}").into_bytes(),
    ))
    .unwrap();
    let url = format!("https://{}", registry.host);
    fs::write(
        host_dir.join("hosts.toml"),
        format!(
            "server = \"{url}\"\n\n[host.\"{url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{ca}\"\n  [host.\"{url}\".header]\n    Authorization = \"Basic {basic}\"\n",
            ca = registry.ca.display(),
            basic = basic.as_str().unwrap(),
        ),
    )
    .unwrap();
    dir.to_path_buf()
}

/// deploy/daemonset.yaml's configuration (the catalog of the plugins in the
/// image, the example chain), for this test: the templates' namespace, the
/// checkpointer's image the node's local one, a listener on a free port of
/// the host network, and a call timeout for the debug build in the image.
fn daemon_config(ns: &str, port: u16) -> String {
    use serde::Deserialize;
    let text = fs::read_to_string(common::repo().join("deploy/daemonset.yaml")).unwrap();
    let mut config = None;
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).unwrap();
        if value["kind"] == "ConfigMap" {
            config = Some(yaml(value["data"]["podstamp.yaml"].as_str().unwrap()));
        }
    }
    let mut config = config.expect("deploy/daemonset.yaml has no ConfigMap");
    for entry in config["plugins"].as_object().unwrap().values() {
        let path = entry["path"].as_str().unwrap();
        assert!(
            path.starts_with("/usr/lib/podstamp/plugins/"),
            "deploy/daemonset.yaml's catalog names {path}, not a plugin of the image"
        );
    }
    config["namespace"] = json!(ns);
    // The test's copy of deploy/namespace.yaml's namespace.
    config["daemon"]["rollouts"] = json!({"namespace": format!("{ns}-rollouts")});
    config["plugins"]["arch-image"]["settings"]["images"]["pod-checkpointer"] =
        json!({"amd64": LOCAL_IMAGE, "arm64": LOCAL_IMAGE});
    config["limits"]["timeout"] = json!("2s");
    config["daemon"]["listen"] = json!(format!("127.0.0.1:{port}"));
    serde_norway::to_string(&config).unwrap()
}

/// The bundled pod-checkpointer PodTemplate, in the test's namespace, for
/// this node: its command becomes a `sleep` in busybox (the original
/// command kept as the shell's arguments, so that what substitute filled in
/// shows in the container), its host paths directories of the test.
fn checkpointer_template(ns: &str, host: &Path) -> Value {
    let text = fs::read_to_string(common::repo().join("examples/pod-checkpointer.yaml")).unwrap();
    let mut template = yaml(&text);
    template["metadata"]["namespace"] = json!(ns);
    let spec = &mut template["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = json!(1);
    let container = &mut spec["containers"][0];
    assert_eq!(container["name"], "pod-checkpointer");
    let mut command = vec![json!("/bin/sh"), json!("-c"), json!("exec sleep 3600")];
    command.extend(container["command"].as_array().unwrap().iter().cloned());
    container["command"] = json!(command);
    for volume in spec["volumes"].as_array_mut().unwrap() {
        let name = volume["name"].as_str().unwrap().to_string();
        let dir = host.join("checkpointer").join(&name);
        fs::create_dir_all(&dir).unwrap();
        volume["hostPath"]["path"] = json!(dir.to_str().unwrap());
    }
    template
}

#[test]
fn deploy_static_pod_is_the_fixture_rendered() {
    // deploy/static-pod.yaml is deploy/static-pod/podstamp.yaml
    // rendered with deploy/static-pod-render.yaml (the command is in it).
    let out = common::podstamp(&[
        "render",
        "deploy/static-pod/podstamp.yaml",
        "--node-name",
        "any",
        "--node-arch",
        "amd64",
        "--no-cache",
        "--config",
        "deploy/static-pod-render.yaml",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let expected = fs::read_to_string(common::repo().join("deploy/static-pod.yaml")).unwrap();
    assert_eq!(
        common::stdout(&out),
        expected,
        "deploy/static-pod.yaml is not the fixture rendered: run the command in deploy/static-pod-render.yaml"
    );
    kubelet_accepts(&[&common::repo().join("deploy/static-pod.yaml")], "any");
}

#[test]
fn podstamp_runs_as_a_static_pod_from_its_own_image_on_a_real_kubelet() {
    let started = Instant::now();
    deps(
        "image-deps.sh",
        "building the image needs buildah, skopeo and objcopy",
    );
    deps(
        "node-deps.sh",
        "the test node needs containerd, runc and busybox-static",
    );
    let _serial = serial();
    // Fixed places (short, for containerd's socket), emptied first: a run
    // whose node was SIGKILLed is swept by podstamp-node's next start.
    let base = common::repo().join("target/selfhosted-test");
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base).unwrap();
    let base = base.canonicalize().unwrap();
    let node_dir = common::repo().join("target/kubelet-tests").join(NODE);
    fs::create_dir_all(&node_dir).unwrap();
    let node_dir = node_dir.canonicalize().unwrap();
    let work = tempfile::tempdir().unwrap();

    let server = ApiServer::start(&base.join("apiserver"));
    // The harness CA signs the registry's certificate.
    let registry = TestRegistry::start(&base.join("registry"), &server.dir);
    let reference = build_and_push(work.path(), &registry);
    eprintln!(
        "image pushed: {reference} ({:.1}s)",
        started.elapsed().as_secs_f64()
    );

    let hosts = registry_hosts(&base.join("registry-hosts"), &registry);
    let mut node = Node::start_with(
        &node_dir,
        &server.kubeconfig("admin"),
        NODE,
        &["--registry-hosts", hosts.to_str().unwrap()],
    );
    let report = Report {
        node: &node,
        registry: &registry,
    };

    // The checkpointer's chain (node-env) reads the node's zone label.
    let ns = unique("selfhosted");
    let kube = Kube::admin(&server, &ns);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(kube.client.clone());
    kube.rt
        .block_on(nodes.patch(
            NODE,
            &Default::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-a"}}}),
            ),
        ))
        .unwrap();

    // What the host gives podstamp's container: its configuration, a
    // kubeconfig file, its cache and revisions directories. The kubeconfig
    // holds a token of deploy/'s ServiceAccount bound to this Node, under
    // deploy/'s RBAC and admission policies (applied for the test's
    // namespace, tests/common/deploy.rs).
    let host = base.join("host");
    let config_dir = host.join("config");
    fs::create_dir_all(&config_dir).unwrap();
    let port = free_port();
    fs::write(config_dir.join("podstamp.yaml"), daemon_config(&ns, port)).unwrap();
    let kubeconfig = host.join("podstamp.kubeconfig");
    let deploy =
        common::deploy::Deploy::new(&server.kubeconfig("admin"), &ns, &format!("{ns}-rollouts"));
    kube.rt.block_on(deploy.apply(&kube.client, NODE));
    let token = kube.rt.block_on(deploy.token(&kube.client, NODE));
    deploy.kubeconfig(&token, &kubeconfig);
    for dir in ["cache", "revisions"] {
        fs::create_dir_all(host.join(dir)).unwrap();
        fs::set_permissions(host.join(dir), fs::Permissions::from_mode(0o755)).unwrap();
    }

    // The checkpointer's template, in the API before podstamp starts.
    let template = checkpointer_template(&ns, &host);
    kube.rt
        .block_on(kube.templates().create(
            &Default::default(),
            &serde_json::from_value(template).unwrap(),
        ))
        .unwrap();

    // podstamp's own static pod: `podstamp render` of the fixture, its
    // image the pushed one, by digest; its host paths the test's.
    let render_config = base.join("render.yaml");
    let render = json!({
        "plugins": {
            "arch-image": {
                "path": common::plugin("arch-image"),
                "settings": {"images": {"podstamp": {"amd64": reference, "arm64": reference}}},
                "scope": ["spec.containers[podstamp].image"],
            },
            "substitute": {
                "path": common::plugin("substitute"),
                "settings": {"vars": {
                    "configDir": config_dir,
                    "kubeconfig": kubeconfig,
                    "manifestDir": node.manifests(),
                    "cacheDir": host.join("cache"),
                    "revisionsDir": host.join("revisions"),
                    "criSocket": node.dir.join("run/containerd.sock"),
                }},
                "scope": ["spec.volumes[*].hostPath.path"],
            },
        },
        "chain": ["arch-image", "substitute"],
        // podstamp's own static pod runs on the host network with host
        // paths: granted level privileged, as deploy/static-pod-render.yaml
        // grants it.
        "podSecurity": "privileged",
    });
    fs::write(&render_config, serde_norway::to_string(&render).unwrap()).unwrap();
    let own = node.manifests().join("podstamp.yaml");
    let out = common::podstamp(&[
        "render",
        "deploy/static-pod/podstamp.yaml",
        "--node-name",
        NODE,
        "--no-cache",
        "--config",
        render_config.to_str().unwrap(),
        "-o",
        own.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "podstamp render: {}",
        common::stderr(&out)
    );
    let own_text = fs::read_to_string(&own).unwrap();
    assert!(
        own_text.contains(&format!("image: {reference}\n")),
        "{own_text}"
    );
    kubelet_accepts(&[&own], NODE);
    let own_identity = identity(&own);

    // 3. The kubelet pulls the image from the registry and runs podstamp.
    let own_pod = format!("podstamp-{NODE}");
    let first = report.wait("the kubelet to run podstamp from its image", START, || {
        running(&node, &own_pod, "podstamp")
    });
    let args = first.args.clone().unwrap_or_default();
    report.check(
        args.first().map(String::as_str) == Some("/usr/bin/podstamp")
            && args.contains(&format!("--node-name={NODE}")),
        &format!("podstamp's container runs {args:?}"),
    );
    // containerd pulled it with the credentials of hosts.toml (the
    // registry answers 401 without them).
    let digest = reference.split_once('@').unwrap().1;
    let manifest_request = format!("\"GET /v2/podstamp/manifests/{digest} HTTP/1.1\" 200 ");
    report.check(
        registry
            .log()
            .lines()
            .any(|l| l.contains(&manifest_request) && l.contains("\"containerd/")),
        "the registry's access log has no 200 for containerd's pull of the image's manifest",
    );
    report.wait("podstamp's /readyz", CONVERGE, || {
        (support::http_get(port, "/readyz")?.0 == 200).then_some(())
    });

    // 4. It rendered the checkpointer, and the kubelet runs it.
    let checkpointer_manifest = node.manifests().join("pod-checkpointer.yaml");
    let text = report.wait("the checkpointer's manifest", CONVERGE, || {
        fs::read_to_string(&checkpointer_manifest).ok()
    });
    report.check(
        text.contains(&format!("image: {LOCAL_IMAGE}\n"))
            && text.contains(&format!("podstamp.io/source: {ns}/pod-checkpointer\n")),
        &format!("the checkpointer's manifest:\n{text}"),
    );
    let checkpointer_pod = format!("pod-checkpointer-{NODE}");
    let checkpointer = report.wait("the kubelet to run the checkpointer", CONVERGE, || {
        running(&node, &checkpointer_pod, "pod-checkpointer")
    });
    let cargs = checkpointer.args.clone().unwrap_or_default();
    report.check(
        cargs.iter().any(|a| {
            a.strip_prefix("--node-ip=")
                .is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        }) && checkpointer.has_env(&format!("NODE_NAME={NODE}"))
            && checkpointer.has_env("NODE_ZONE=zone-a"),
        &format!(
            "the checkpointer did not go through the chain: args {cargs:?}, env {:?}",
            checkpointer.env
        ),
    );
    // podstamp's own manifest is not its: its source is not a template of
    // the namespace it serves.
    report.check(
        metric(port, "podstamp_managed_manifests") == Some(1.0),
        &format!(
            "podstamp manages {:?} manifests, not 1",
            metric(port, "podstamp_managed_manifests")
        ),
    );
    let checkpointer_identity = identity(&checkpointer_manifest);

    // 5. podstamp's container killed: the kubelet starts a new one, which
    // finds the checkpointer's manifest as it should be and leaves it.
    node.kill_container(&first.id);
    let second = report.wait("the kubelet to restart podstamp's container", START, || {
        running(&node, &own_pod, "podstamp").filter(|c| c.id != first.id)
    });
    report.wait("the restarted podstamp's /readyz", CONVERGE, || {
        (support::http_get(port, "/readyz")?.0 == 200).then_some(())
    });
    report.wait(
        "the restarted podstamp to render the checkpointer (unchanged)",
        CONVERGE,
        || (metric(port, "podstamp_renders_total{result=\"unchanged\"}")? >= 1.0).then_some(()),
    );
    report.check(
        metric(port, "podstamp_renders_total{result=\"written\"}") == Some(0.0),
        "the restarted podstamp wrote a manifest",
    );
    report.check(
        identity(&checkpointer_manifest) == checkpointer_identity,
        "the checkpointer's manifest was rewritten (inode or mtime changed)",
    );
    report.check(
        identity(&own) == own_identity,
        "podstamp's own manifest was touched",
    );
    let checkpointers: Vec<Container> = node
        .containers()
        .into_iter()
        .filter(|c| c.pod_name == checkpointer_pod)
        .collect();
    report.check(
        checkpointers.len() == 1
            && checkpointers[0].id == checkpointer.id
            && checkpointers[0].running(),
        "the checkpointer's container was restarted",
    );
    report.check(
        second.attempt > first.attempt,
        &format!(
            "the new podstamp container's attempt is {}, the old one's {}",
            second.attempt, first.attempt
        ),
    );
    let logs = container_logs(&node, &own_pod, "podstamp");
    eprintln!("podstamp's container logs:\n{}", tail(&logs, 30));

    // Teardown: the node stops everything it started and leaves nothing.
    let status = node.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "podstamp-node's teardown: {status:?}\n{}",
        node.logs()
    );
    let left = leftovers(&node.dir, &node.cgroup_root);
    assert!(left.is_empty(), "the node left: {left:#?}");
    // The registry's blobs and the API server's data: kept for a failed
    // run to look at, removed after a passing one.
    drop(registry);
    drop(server);
    fs::remove_dir_all(&base).unwrap();
    eprintln!(
        "self-hosted test took {:.1}s",
        started.elapsed().as_secs_f64()
    );
}
