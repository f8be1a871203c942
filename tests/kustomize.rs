//! deploy/ as an operator who lives in kubectl uses it: a kustomize base
//! that `kubectl apply -k deploy/` applies as it is, whose image is pointed
//! at a registry by the one command deploy/image/push.sh prints
//! (`kustomize edit set image podstamp=REGISTRY/podstamp@sha256:…`, run in
//! the component deploy/image/), for the DaemonSet and the static pod's
//! template alike.
//!
//! Real tools: kubectl's own kustomize builds, kubectl applies to the
//! harness's real kube-apiserver (a server of this test's own, stopped when
//! the test ends), and kustomize's own command edits (built by
//! `bash tests/harness/build-kustomize.sh`, as kubectl has no `edit`).
//!
//! Needs kubectl (1.27 or later: kustomize v5, components) on PATH, the Go
//! harness (`bash tests/harness/build.sh`), kustomize
//! (`bash tests/harness/build-kustomize.sh`) and the plugins (`bash
//! plugins/build.sh`); `bash tests/run.sh` builds them all.

mod common;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use common::{kubectl, run_ok};
use support::ApiServer;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What deploy/image/push.sh would print for an image it pushed.
const POINTED: &str = "registry.test:5000/team/podstamp@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// kustomize's own command, built by tests/harness/build-kustomize.sh.
fn kustomize() -> Command {
    let path = common::repo().join("target/harness/kustomize");
    assert!(
        path.is_file(),
        "{} is missing: build it with `bash tests/harness/build-kustomize.sh` (the test command `bash tests/run.sh` does it)",
        path.display()
    );
    Command::new(path)
}

/// `kubectl kustomize dir`, as objects.
fn build(dir: &Path) -> Vec<Value> {
    let text = run_ok(
        kubectl().arg("kustomize").arg(dir),
        &format!("kubectl kustomize {}", dir.display()),
    );
    documents(&text)
}

fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Every container image in `value`, wherever a pod spec is in it (a
/// DaemonSet's template, a PodTemplate's, a Pod's).
fn images(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if ["containers", "initContainers", "ephemeralContainers"].contains(&key.as_str())
                    && let Some(list) = v.as_array()
                {
                    for c in list {
                        out.push(c["image"].as_str().unwrap_or_default().to_string());
                    }
                }
                images(v, out);
            }
        }
        Value::Array(list) => list.iter().for_each(|v| images(v, out)),
        _ => {}
    }
}

fn all_images(objects: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    objects.iter().for_each(|o| images(o, &mut out));
    out
}

/// A copy of deploy/ under `to`.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// `kubectl kustomize static_pod | podstamp render -` with
/// deploy/static-pod-render.yaml, as its header says: the manifest.
fn render_static_pod(static_pod: &Path) -> String {
    let template = run_ok(
        kubectl().arg("kustomize").arg(static_pod),
        "kubectl kustomize deploy/static-pod",
    );
    common::plugin("substitute");
    let out = common::podstamp_in(
        &[
            "render",
            "-",
            "--node-name",
            "any",
            "--node-arch",
            "amd64",
            "--no-cache",
            "--config",
            "deploy/static-pod-render.yaml",
        ],
        Some(template.as_bytes()),
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    common::stdout(&out)
}

#[test]
fn the_base_holds_podstamps_objects_and_no_placeholder_registry() {
    let deploy = common::repo().join("deploy");
    for file in files(&deploy) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        assert!(
            !text.contains("example.invalid"),
            "{} still names the placeholder registry example.invalid: deploy/ names the image `podstamp` (deploy/image/kustomization.yaml points it)",
            file.display()
        );
    }
    let objects = build(&deploy);
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "FlowSchema",
        "PriorityLevelConfiguration",
        "ConfigMap",
        "DaemonSet",
    ] {
        assert!(kinds.contains(&kind), "deploy/ builds no {kind}: {kinds:?}");
    }
    // Node files, examples and the optional monitoring are not the base's.
    for kind in ["Pod", "PodTemplate", "PrometheusRule"] {
        assert!(!kinds.contains(&kind), "deploy/ builds a {kind}: {kinds:?}");
    }
    assert_eq!(
        all_images(&objects),
        [format!("podstamp:{VERSION}")],
        "the base's images, unpointed: the name deploy/image/build.sh gives"
    );
    // The static pod's template: the same image, from the same component.
    let static_pod = build(&deploy.join("static-pod"));
    assert_eq!(static_pod.len(), 1);
    assert_eq!(static_pod[0]["kind"], "PodTemplate");
    assert_eq!(all_images(&static_pod), [format!("podstamp:{VERSION}")]);
    // deploy/static-pod.yaml is that template rendered as
    // deploy/static-pod-render.yaml says.
    assert_eq!(
        render_static_pod(&deploy.join("static-pod")),
        fs::read_to_string(common::repo().join("deploy/static-pod.yaml")).unwrap(),
        "deploy/static-pod.yaml is not `kubectl kustomize deploy/static-pod | podstamp render -`: run the command in deploy/static-pod-render.yaml"
    );
}

#[test]
fn kubectl_apply_k_deploy_is_accepted_by_the_api_server() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(&tmp.path().join("apiserver"));
    let kubeconfig = server.kubeconfig("admin");
    let deploy = common::repo().join("deploy");
    let apply = |extra: &[&str]| {
        run_ok(
            kubectl()
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("apply")
                .arg("-k")
                .arg(&deploy)
                .args(extra),
            &format!("kubectl apply -k deploy/ {}", extra.join(" ")),
        )
    };
    let built = build(&deploy);
    // The API server's own checks first (admission included: the policies'
    // CEL is compiled), nothing stored; then as an operator applies it.
    let dry = apply(&["--server-side", "--dry-run=server"]);
    assert_eq!(
        dry.lines()
            .filter(|l| l.contains("serverside-applied"))
            .count(),
        built.len(),
        "{dry}"
    );
    let first = apply(&[]);
    assert_eq!(
        first.lines().filter(|l| l.ends_with(" created")).count(),
        // The namespaces of deploy/namespace.yaml (the rollouts' and the
        // status records'): the harness creates them at start, as a
        // cluster podstamp runs in has them.
        built.len() - built.iter().filter(|o| o["kind"] == "Namespace").count(),
        "{first}"
    );
    // Every object is stored, as built.
    let stored = || -> Vec<Value> {
        let text = run_ok(
            kubectl()
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["get", "-o", "json", "-k"])
                .arg(&deploy),
            "kubectl get -k deploy/",
        );
        let list: Value = serde_json::from_str(&text).unwrap();
        list["items"].as_array().unwrap().clone()
    };
    let items = stored();
    assert_eq!(items.len(), built.len());
    for object in &built {
        assert!(
            items.iter().any(|i| i["kind"] == object["kind"]
                && i["metadata"]["name"] == object["metadata"]["name"]
                && i["metadata"]["namespace"] == object["metadata"]["namespace"]),
            "not stored: {} {}",
            object["kind"],
            object["metadata"]["name"]
        );
    }
    // Applied again, as it is: nothing changes (kubectl's client-side apply
    // sends the policies a patch that changes nothing, and says
    // "configured": the stored versions are what tell).
    apply(&[]);
    let version = |items: &[Value]| -> Vec<String> {
        items
            .iter()
            .map(|i| {
                format!(
                    "{} {} {}",
                    i["kind"], i["metadata"]["name"], i["metadata"]["resourceVersion"]
                )
            })
            .collect()
    };
    assert_eq!(
        version(&stored()),
        version(&items),
        "a second apply changed objects"
    );
    drop(server);
}

#[test]
fn kustomize_edit_set_image_points_every_podstamp_image() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("deploy");
    copy_tree(&common::repo().join("deploy"), &copy);
    let before = (build(&copy), build(&copy.join("static-pod")));

    // What deploy/image/push.sh prints, where deploy/image's component is.
    run_ok(
        kustomize()
            .args(["edit", "set", "image"])
            .arg(format!("podstamp={POINTED}"))
            .current_dir(copy.join("image")),
        "kustomize edit set image",
    );

    let after = (build(&copy), build(&copy.join("static-pod")));
    for (was, now, what) in [
        (&before.0, &after.0, "deploy/"),
        (&before.1, &after.1, "deploy/static-pod"),
    ] {
        let images = all_images(now);
        assert!(!images.is_empty(), "{what} has no image");
        assert!(
            images.iter().all(|i| i == POINTED),
            "{what}: images not pointed: {images:?}"
        );
        assert_eq!(images.len(), all_images(was).len());
        // Nothing else changed.
        let unpointed: Vec<Value> = now
            .iter()
            .map(|o| {
                serde_json::from_str(
                    &o.to_string()
                        .replace(POINTED, &format!("podstamp:{VERSION}")),
                )
                .unwrap()
            })
            .collect();
        assert_eq!(&unpointed, was, "{what}: more than the image changed");
    }
    // The static pod's manifest takes the image through `podstamp render`.
    let manifest = render_static_pod(&copy.join("static-pod"));
    assert!(
        manifest.contains(&format!("\n    image: {POINTED}\n")),
        "{manifest}"
    );
}
