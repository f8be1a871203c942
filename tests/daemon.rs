//! End-to-end tests of `podstamp run` against a real kube-apiserver (the
//! harness's), with the real compiled plugins, and with the kubelet's own
//! static pod decoder checking what podstamp writes.
//!
//! Needs `bash tests/harness/build.sh` and `bash plugins/build.sh` first.

mod common;
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Node, PodTemplate};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use common::deploy::Deploy;
use support::*;

const CONVERGE: Duration = Duration::from_secs(20);

impl Kube {
    fn create<K>(&self, object: Value) -> K
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
        K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.ns);
        let object: K = serde_json::from_value(object).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap()
    }

    fn create_cluster<K>(&self, object: Value) -> K
    where
        K: kube::Resource<DynamicType = ()>,
        K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(self.client.clone());
        let object: K = serde_json::from_value(object).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap()
    }

    fn delete_template(&self, name: &str) {
        self.rt
            .block_on(self.templates().delete(name, &DeleteParams::default()))
            .unwrap();
    }

    fn patch_node(&self, name: &str, patch: Value) {
        let api: Api<Node> = Api::all(self.client.clone());
        self.rt
            .block_on(api.patch(name, &PatchParams::default(), &Patch::Merge(patch)))
            .unwrap();
    }

    fn events(&self) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        self.rt
            .block_on(api.list(&ListParams::default()))
            .unwrap()
            .items
    }
}

/// A PodTemplate selected by the default selector, whose pod goes through
/// `substitute` (placeholders) and `node-env` (env from the node).
fn template(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "labels": {"podstamp.io/enabled": "true"}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "main", "image": image,
                "command": ["serve", "--node=${node.name}", "--zone=${node.label[zone]}", "--say=${var.greeting}"]
            }]}
        }
    })
}

fn node(name: &str, zone: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": zone}}})
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// Waits until `path` exists and contains every one of `needles`; returns its content.
fn wait_content(daemon: &Daemon, path: &Path, needles: &[&str]) -> String {
    let what = format!("{} to contain {needles:?}", path.display());
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, CONVERGE, || {
            daemon.assert_running();
            read(path).filter(|text| needles.iter().all(|n| text.contains(n)))
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; it has:\n{}\npodstamp's log:\n{}",
            read(path).unwrap_or_else(|| "(no file)".into()),
            daemon.logs()
        )
    })
}

/// Prints (never asserts) how long a change took to reach the file: from
/// just before the API request to the manifest's mtime.
fn report_latency(what: &str, sent: std::time::SystemTime, path: &Path) {
    let written = fs::metadata(path).unwrap().modified().unwrap();
    let took = written.duration_since(sent).unwrap_or_default();
    eprintln!("measured: {what} -> manifest written in {took:?}");
}

fn wait_gone(daemon: &Daemon, path: &Path) {
    let what = format!("{} to be removed", path.display());
    let gone = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, CONVERGE, || {
            daemon.assert_running();
            (!path.exists()).then_some(())
        })
    }));
    if gone.is_err() {
        panic!(
            "timed out waiting for {what}; podstamp's log:\n{}",
            daemon.logs()
        );
    }
}

struct Setup {
    tmp: tempfile::TempDir,
    manifests: PathBuf,
    config: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let manifests = tmp.path().join("manifests");
    fs::create_dir(&manifests).unwrap();
    let config = write_config(tmp.path());
    Setup {
        tmp,
        manifests,
        config,
    }
}

/// A daemon for node `node`, its templates and (for isolation on the shared
/// server) its rollout Leases in namespace `ns`.
fn start_daemon(s: &Setup, kubeconfig: &Path, ns: &str, node: &str, dir: &Path) -> Daemon {
    start_daemon_with_env(s, kubeconfig, ns, node, dir, &[])
}

/// [`start_daemon`] with `env` set for the daemon besides.
fn start_daemon_with_env(
    s: &Setup,
    kubeconfig: &Path,
    ns: &str,
    node: &str,
    dir: &Path,
    env: &[(&str, &str)],
) -> Daemon {
    Daemon::start_with_env(
        &[
            "--config",
            s.config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            ns,
            "--rollout-namespace",
            ns,
            "--node-name",
            node,
            "--manifest-dir",
            dir.to_str().unwrap(),
        ],
        s.tmp
            .path()
            .join(format!("podstamp-{node}-{}.log", unique("log"))),
        env,
    )
}

#[test]
fn templates_become_manifests_and_follow_updates_deletes_and_the_node() {
    let server = shared_server();
    let ns = unique("life");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, "zone-a"));
    let s = setup();
    let dir = &s.manifests;
    let foreign = dir.join("foreign.yaml");
    fs::write(
        &foreign,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: foreign, namespace: kube-system}\nspec: {containers: [{name: c, image: busybox}]}\n",
    )
    .unwrap();
    let foreign_before = (fs::read(&foreign).unwrap(), identity(&foreign));
    kube.create::<PodTemplate>(template("web", "nginx:1.27"));

    let daemon = start_daemon(&s, &server.kubeconfig("admin"), &ns, &node_name, dir);
    let web = dir.join("web.yaml");
    let text = wait_content(
        &daemon,
        &web,
        &[
            "image: nginx:1.27",
            &format!("--node={node_name}"),
            "--zone=zone-a",
            "--say=hello",
            "name: ZONE",
            "value: zone-a",
            "name: NODE_NAME",
            &format!("podstamp.io/source: {ns}/web"),
            &format!("namespace: {ns}"),
        ],
    );
    assert!(
        !text.contains("${"),
        "placeholders are substituted:\n{text}"
    );
    daemon.wait_ready(CONVERGE);
    kubelet_accepts(&[dir], &node_name);
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&web).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    // An update is rendered and written.
    let sent = std::time::SystemTime::now();
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "nginx:1.28"}]}}}),
    );
    wait_content(&daemon, &web, &["image: nginx:1.28", "--zone=zone-a"]);
    report_latency("template update", sent, &web);
    kubelet_accepts(&[&web], &node_name);

    // An update that does not change the rendered bytes leaves the file alone.
    let before = identity(&web);
    let unchanged = daemon.metric("podstamp_renders_total{result=\"unchanged\"}");
    kube.patch_template(
        "web",
        json!({"metadata": {"annotations": {"owner": "team-a"}}}),
    );
    wait_for("an unchanged render", CONVERGE, || {
        (daemon.metric("podstamp_renders_total{result=\"unchanged\"}") > unchanged).then_some(())
    });
    assert_eq!(identity(&web), before, "same inode and mtime");

    // A node label change re-renders.
    let sent = std::time::SystemTime::now();
    kube.patch_node(
        &node_name,
        json!({"metadata": {"labels": {"zone": "zone-b"}}}),
    );
    wait_content(&daemon, &web, &["--zone=zone-b", "value: zone-b"]);
    report_latency("node label change", sent, &web);

    // A second template, deleted: its manifest goes.
    kube.create::<PodTemplate>(template("api", "busybox:1"));
    let api = dir.join("api.yaml");
    wait_content(&daemon, &api, &["image: busybox:1", "--zone=zone-b"]);
    kubelet_accepts(&[dir], &node_name);
    kube.delete_template("api");
    wait_gone(&daemon, &api);

    // A template that stops matching the selector: its manifest goes.
    kube.patch_template(
        "web",
        json!({"metadata": {"labels": {"podstamp.io/enabled": null}}}),
    );
    wait_gone(&daemon, &web);

    // A template not selected at all never gets a manifest.
    let mut other = template("unselected", "busybox:1");
    other["metadata"]["labels"] = json!({"podstamp.io/enabled": "false"});
    kube.create::<PodTemplate>(other);
    kube.create::<PodTemplate>(template("last", "busybox:2"));
    wait_content(&daemon, &dir.join("last.yaml"), &["image: busybox:2"]);
    assert!(!dir.join("unselected.yaml").exists());

    assert_eq!(
        (fs::read(&foreign).unwrap(), identity(&foreign)),
        foreign_before,
        "a foreign file is never touched"
    );
    // The metric is set after the pass that renamed the file syncs the
    // directory: it follows the file, it does not come with it.
    wait_for("podstamp_managed_manifests 1", CONVERGE, || {
        (daemon.metric("podstamp_managed_manifests") == 1.0).then_some(())
    });
    assert!(daemon.metric("podstamp_manifests_removed_total") >= 2.0);
    assert!(daemon.metric("podstamp_last_successful_sync_timestamp_seconds") > 1.0e9);
    let (code, body) = daemon.get("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains(
            "podstamp_plugin_call_duration_seconds_count{plugin=\"substitute\",result=\"ok\"}"
        ),
        "{body}"
    );
    assert_eq!(daemon.get("/healthz").unwrap().0, 200);
    let status = daemon.stop();
    assert!(status.success(), "exit on SIGTERM: {status}");
}

#[test]
fn a_failing_template_keeps_its_last_good_manifest_and_gets_an_event() {
    let server = shared_server();
    let ns = unique("fail");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, "zone-a"));
    let s = setup();
    let dir = &s.manifests;
    kube.create::<PodTemplate>(template("db", "postgres:17"));
    let daemon = start_daemon(&s, &server.kubeconfig("admin"), &ns, &node_name, dir);
    let db = dir.join("db.yaml");
    let good = wait_content(&daemon, &db, &["image: postgres:17", "--zone=zone-a"]);
    daemon.wait_ready(CONVERGE);
    let good_identity = identity(&db);

    // substitute fails on a label the node does not have.
    kube.patch_template(
        "db",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "postgres:18",
            "command": ["serve", "--rack=${node.label[rack]}"]}]}}}),
    );
    let event = wait_for("a RenderFailed Event on the PodTemplate", CONVERGE, || {
        kube.events().into_iter().find(|e| {
            e.reason.as_deref() == Some("RenderFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("db")
        })
    });
    let note = event.note.clone().unwrap_or_default();
    assert!(
        note.contains(&node_name) && note.contains("substitute") && note.contains("rack"),
        "{note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("PodTemplate")
    );
    assert_eq!(read(&db).unwrap(), good, "the last good manifest stays");
    assert_eq!(identity(&db), good_identity);
    assert!(daemon.metric("podstamp_renders_total{result=\"failed\"}") >= 1.0);
    assert!(daemon.metric("podstamp_render_failures_total{reason=\"RenderFailed\"}") >= 1.0);
    assert!(daemon.logs().contains("rack"), "the failure is logged");

    // Other templates keep rendering; one naming an unknown plugin fails alone.
    kube.create::<PodTemplate>(template("cache", "redis:8"));
    let mut unknown = template("odd", "busybox:1");
    unknown["metadata"]["annotations"] = json!({"podstamp.io/plugins": "node-env,nope"});
    kube.create::<PodTemplate>(unknown);
    let mut picked = template("plain", "busybox:1");
    picked["metadata"]["annotations"] = json!({"podstamp.io/plugins": "identity"});
    kube.create::<PodTemplate>(picked);
    wait_content(&daemon, &dir.join("cache.yaml"), &["image: redis:8"]);
    // Through identity only: the placeholders stay as they are.
    wait_content(
        &daemon,
        &dir.join("plain.yaml"),
        &["--zone=${node.label[zone]}"],
    );
    let event = wait_for("an UnknownPlugin Event", CONVERGE, || {
        kube.events().into_iter().find(|e| {
            e.reason.as_deref() == Some("UnknownPlugin")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("odd")
        })
    });
    assert!(event.note.unwrap_or_default().contains("\"nope\""));
    assert!(!dir.join("odd.yaml").exists());
    kubelet_accepts(&[dir], &node_name);

    // One Event per distinct failure, not one per render.
    let failed = |k: &Kube| {
        k.events()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("RenderFailed"))
            .count()
    };
    assert_eq!(failed(&kube), 1);

    // Fixed: rendered again.
    kube.patch_template(
        "db",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "postgres:18",
            "command": ["serve", "--zone=${node.label[zone]}"]}]}}}),
    );
    wait_content(&daemon, &db, &["image: postgres:18", "--zone=zone-a"]);
}

#[test]
fn three_daemons_write_their_own_nodes_results() {
    let server = shared_server();
    let ns = unique("three");
    let kube = Kube::admin(server, &ns);
    let s = setup();
    kube.create::<PodTemplate>(template("agent", "agent:1"));
    let mut daemons = Vec::new();
    for i in 1..=3 {
        let name = unique(&format!("n{i}"));
        kube.create_cluster::<Node>(node(&name, &format!("zone-{i}")));
        let dir = s.tmp.path().join(format!("m{i}"));
        fs::create_dir(&dir).unwrap();
        let daemon = start_daemon(&s, &server.kubeconfig("admin"), &ns, &name, &dir);
        daemons.push((name, dir, daemon));
    }
    for (i, (name, dir, daemon)) in daemons.iter().enumerate() {
        let zone = format!("--zone=zone-{}", i + 1);
        wait_content(
            daemon,
            &dir.join("agent.yaml"),
            &[&format!("--node={name}"), &zone],
        );
        kubelet_accepts(&[dir], name);
    }
}

#[test]
fn an_api_outage_changes_nothing_on_disk_and_a_relist_catches_up() {
    let state = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(&state.path().join("apiserver"));
    let ns = unique("outage");
    let node_name = unique("node");
    let s = setup();
    let dir = &s.manifests;
    {
        let kube = Kube::admin(&server, &ns);
        kube.create_cluster::<Node>(node(&node_name, "zone-a"));
        kube.create::<PodTemplate>(template("etcd", "etcd:3.6"));
        kube.create::<PodTemplate>(template("gone", "busybox:1"));
    }
    let kubeconfig = server.kubeconfig("admin");
    let (etcd, gone) = (dir.join("etcd.yaml"), dir.join("gone.yaml"));

    let daemon = start_daemon(&s, &kubeconfig, &ns, &node_name, dir);
    wait_content(&daemon, &etcd, &["image: etcd:3.6"]);
    wait_content(&daemon, &gone, &["image: busybox:1"]);
    daemon.wait_ready(CONVERGE);
    let before = [identity(&etcd), identity(&gone)];

    // The API server goes away under a running daemon.
    server.kill();
    wait_for("a watch restart after the outage", CONVERGE, || {
        daemon.assert_running();
        (daemon.metric("podstamp_watch_restarts_total{watch=\"podtemplates\"}") >= 1.0)
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    daemon.assert_running();
    assert_eq!([identity(&etcd), identity(&gone)], before);
    assert_eq!(daemon.get("/healthz").unwrap().0, 200);
    assert!(daemon.stop().success());

    // While no daemon runs, a template is deleted.
    server = ApiServer::start(&state.path().join("apiserver"));
    Kube::new(&kubeconfig, &ns).delete_template("gone");
    server.kill();

    // Started with the API down: keeps what is on disk, is not ready.
    let daemon = start_daemon(&s, &kubeconfig, &ns, &node_name, dir);
    std::thread::sleep(Duration::from_secs(3));
    daemon.assert_running();
    assert_eq!(
        [identity(&etcd), identity(&gone)],
        before,
        "nothing changes while the API is down"
    );
    assert_eq!(daemon.get("/readyz").unwrap().0, 503);
    assert_eq!(daemon.metric("podstamp_managed_manifests"), 2.0);

    // Back: a relist removes the deleted template's manifest, and updates flow again.
    let restarted = std::time::Instant::now();
    server = ApiServer::start(&state.path().join("apiserver"));
    let ready = restarted.elapsed();
    wait_gone(&daemon, &gone);
    eprintln!(
        "measured: API server restart -> relisted and garbage-collected in {:?} (the server itself took {ready:?} to report ready)",
        restarted.elapsed()
    );
    daemon.wait_ready(CONVERGE);
    assert_eq!(identity(&etcd), before[0], "the rest stays untouched");
    Kube::new(&kubeconfig, &ns).patch_template(
        "etcd",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "etcd:3.7"}]}}}),
    );
    wait_content(&daemon, &etcd, &["image: etcd:3.7"]);
    kubelet_accepts(&[dir], &node_name);
    assert!(
        daemon.logs().contains("unreachable"),
        "the outage is logged"
    );
    drop(server);
}

/// Rules of the deploy/ RBAC objects, by kind: the ClusterRole's, or every
/// rule of the Roles the daemon's own namespaces get (kube-system's and
/// podstamp-rollouts', not default's), as the tests grant them in one
/// namespace, the templates' and the Leases' (see [`start_daemon`]).
fn deploy_rules(kind: &str) -> Value {
    let text = fs::read_to_string(common::repo().join("deploy/rbac.yaml")).unwrap();
    let mut rules = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).unwrap();
        let ns = value["metadata"]["namespace"].as_str().unwrap_or("");
        if value["kind"] == kind && ns != "default" {
            rules.extend(value["rules"].as_array().unwrap().iter().cloned());
        }
    }
    assert!(!rules.is_empty(), "deploy/rbac.yaml has no {kind}");
    Value::Array(rules)
}

use serde::Deserialize;

/// Grants `role_rules` in `ns` and `cluster_rules` cluster-wide (a rule
/// naming kube-system names `ns`) to the
/// harness's user "podstamp" of `server`, and waits until they are in
/// effect.
fn bind(server: &ApiServer, kube: &Kube, ns: &str, role_rules: Value, cluster_rules: Value) {
    let cluster_role = format!("podstamp-{ns}");
    // The Namespace rule names kube-system, which `ns` stands for here.
    let cluster_rules = common::for_namespace(cluster_rules, ns);
    // The same rules in the status records' namespace (`ns` is the
    // rollout namespace too, see start_daemon).
    let status_ns = podstamp::config::default_status_namespace(ns);
    for namespace in [ns, status_ns.as_str()] {
        let roles: Api<k8s_openapi::api::rbac::v1::Role> =
            Api::namespaced(kube.client.clone(), namespace);
        let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
            Api::namespaced(kube.client.clone(), namespace);
        let role = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "podstamp", "namespace": namespace}, "rules": role_rules}))
        .unwrap();
        let binding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "podstamp", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podstamp"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}))
        .unwrap();
        kube.rt.block_on(async {
            roles.create(&PostParams::default(), &role).await.unwrap();
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .unwrap();
        });
    }
    kube.create_cluster::<k8s_openapi::api::rbac::v1::ClusterRole>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": cluster_role}, "rules": cluster_rules}));
    kube.create_cluster::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": cluster_role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}));
    let podstamp = kube.rt.block_on(client(&server.kubeconfig("podstamp")));
    kube.rt.block_on(async {
        common::wait_for_grants(&podstamp, ns, &role_rules, CONVERGE).await;
        common::wait_for_grants(&podstamp, "", &cluster_rules, CONVERGE).await;
    });
}

/// A namespace named after `prefix` bound to deploy/'s Role and
/// ClusterRole for the `podstamp` user, and a Node in `zone`: the admin's
/// client, the namespace and the Node's name.
fn deployed_namespace(server: &ApiServer, prefix: &str, zone: &str) -> (Kube, String, String) {
    let ns = unique(prefix);
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, zone));
    bind(
        server,
        &kube,
        &ns,
        deploy_rules("Role"),
        deploy_rules("ClusterRole"),
    );
    (kube, ns, node_name)
}

#[test]
fn the_deploy_rbac_is_enough_and_a_missing_permission_is_named() {
    let server = shared_server();
    let (kube, ns, node_name) = deployed_namespace(server, "rbac", "zone-r");
    kube.create::<PodTemplate>(template("ok", "busybox:1"));
    let mut failing = template("broken", "busybox:1");
    failing["template"]["spec"]["containers"][0]["command"] = json!(["${node.label[none]}"]);
    kube.create::<PodTemplate>(failing);

    let s = setup();
    let daemon = start_daemon(
        &s,
        &server.kubeconfig("podstamp"),
        &ns,
        &node_name,
        &s.manifests,
    );
    wait_content(&daemon, &s.manifests.join("ok.yaml"), &["--zone=zone-r"]);
    daemon.wait_ready(CONVERGE);
    wait_for(
        "an Event written with the deploy/ permissions",
        CONVERGE,
        || {
            kube.events()
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("RenderFailed"))
        },
    );
    assert!(!daemon.logs().contains("forbidden"), "{}", daemon.logs());
    drop(daemon);

    // The same rules without `list` on podtemplates: the error names it.
    let ns2 = unique("rbac-nolist");
    let kube2 = Kube::admin(server, &ns2);
    let mut rules = deploy_rules("Role");
    for rule in rules.as_array_mut().unwrap() {
        if rule["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("podtemplates"))
        {
            rule["verbs"] = json!(["get", "watch"]);
        }
    }
    bind(server, &kube2, &ns2, rules, deploy_rules("ClusterRole"));
    let s2 = setup();
    let daemon = start_daemon(
        &s2,
        &server.kubeconfig("podstamp"),
        &ns2,
        &node_name,
        &s2.manifests,
    );
    let needle = format!(
        "cannot list resource \"podtemplates\" in API group \"\" in the namespace \"{ns2}\""
    );
    wait_for("the missing permission in the log", CONVERGE, || {
        daemon.assert_running();
        daemon.logs().contains(&needle).then_some(())
    });
    assert!(
        daemon.logs().contains("permission denied"),
        "{}",
        daemon.logs()
    );
    assert_eq!(daemon.get("/readyz").unwrap().0, 503);
}

/// Without `leases` in its Role, a daemon still installs, but an update
/// (which needs a rollout slot) waits, and the log names the permission.
#[test]
fn without_lease_permissions_updates_wait_and_the_permission_is_named() {
    let server = shared_server();
    let ns = unique("rbac-nolease");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, "zone-l"));
    let mut rules = deploy_rules("Role");
    rules.as_array_mut().unwrap().retain(|rule| {
        !rule["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("leases"))
    });
    // The rollout namespace's Lease rule and the status namespace's.
    assert_eq!(
        rules.as_array().unwrap().len() + 2,
        deploy_rules("Role").as_array().unwrap().len()
    );
    bind(server, &kube, &ns, rules, deploy_rules("ClusterRole"));
    kube.create::<PodTemplate>(template("web", "busybox:1"));
    let s = setup();
    let daemon = start_daemon(
        &s,
        &server.kubeconfig("podstamp"),
        &ns,
        &node_name,
        &s.manifests,
    );
    let path = s.manifests.join("web.yaml");
    wait_content(&daemon, &path, &["image: busybox:1"]);
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}),
    );
    let needle = "cannot list resource \"leases\" in API group \"coordination.k8s.io\"";
    wait_for("the missing lease permission in the log", CONVERGE, || {
        daemon.assert_running();
        let logs = daemon.logs();
        (logs.contains(needle) && logs.contains("update waits for a rollout slot")).then_some(())
    });
    assert!(
        read(&path).unwrap().contains("image: busybox:1"),
        "an update written without a slot"
    );
}

/// The status records' namespace does not exist: first installs are
/// written, an update (which needs a rollout slot, and this node's record
/// says it waits for one first) waits, and the log names the namespace and
/// the two ways out.
#[test]
fn without_the_status_namespace_updates_wait_and_the_namespace_is_named() {
    let server = shared_server();
    let ns = unique("no-status-ns");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, "zone-s"));
    kube.create::<PodTemplate>(template("web", "busybox:1"));
    let missing = unique("missing-status");
    let s = setup();
    let daemon = start_daemon_with_env(
        &s,
        &server.kubeconfig("admin"),
        &ns,
        &node_name,
        &s.manifests,
        &[("PODSTAMP_STATUS_NAMESPACE", missing.as_str())],
    );
    let path = s.manifests.join("web.yaml");
    wait_content(&daemon, &path, &["image: busybox:1"]);
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}),
    );
    let needle = format!("namespaces \"{missing}\" not found");
    let way_out = "create the namespace (deploy/namespace.yaml), or name another with daemon.rollouts.statusNamespace (--status-namespace)";
    wait_for("the missing status namespace in the log", CONVERGE, || {
        daemon.assert_running();
        let logs = daemon.logs();
        (logs.contains(&needle)
            && logs.contains(way_out)
            && logs.contains("update waits for a rollout slot"))
        .then_some(())
    });
    assert!(
        read(&path).unwrap().contains("image: busybox:1"),
        "an update written without a slot"
    );
}

/// Everything in deploy/ as an operator applies it (namespace.yaml,
/// rbac.yaml, node-identity.yaml: tests/common/deploy.rs, for namespace
/// `ns` and rollout Leases in `ns`-rollouts; then daemonset.yaml and
/// example-podtemplate.yaml in `ns`); returns deploy/ and the objects as
/// the API server stored them.
fn apply_deploy(kube: &Kube, server: &ApiServer, ns: &str) -> (Deploy, Vec<Value>) {
    let deploy = Deploy::new(&server.kubeconfig("admin"), ns, &format!("{ns}-rollouts"));
    let mut applied = kube.rt.block_on(deploy.create_all(&kube.client));
    for file in ["daemonset.yaml", "example-podtemplate.yaml"] {
        let text = fs::read_to_string(common::repo().join("deploy").join(file)).unwrap();
        for document in serde_norway::Deserializer::from_str(&text) {
            let mut value = Value::deserialize(document).unwrap();
            value["metadata"]["namespace"] = json!(ns);
            applied.push(
                kube.rt
                    .block_on(common::deploy::create(&kube.client, &value)),
            );
        }
    }
    (deploy, applied)
}

#[test]
fn the_deploy_manifests_are_accepted_by_the_api_server() {
    let server = shared_server();
    let ns = unique("deploy");
    let kube = Kube::admin(server, &ns);
    let kinds: Vec<_> = apply_deploy(&kube, server, &ns)
        .1
        .into_iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
        "PodTemplate",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "deploy/ has no {kind}: {kinds:?}"
        );
    }
}

/// deploy/ applied, then `podstamp run` started as the DaemonSet's pod would
/// be: its args and env, and each volume prepared as the kubelet prepares
/// that volume type, at the mount path inside a directory standing for the
/// container's root (the config's and args' container paths are taken under
/// it). The kubelet's preparation, from its source: an emptyDir is
/// `MkdirAll` then `Chmod` to `perm = 0777` (pkg/volume/emptydir/empty_dir.go);
/// a hostPath of type DirectoryOrCreate is `os.MkdirAll(path, 0755)`, owned by
/// the kubelet, root (pkg/volume/hostpath/host_path.go); a configMap is its
/// keys as files. With the emptyDir the old manifest had, the cache check
/// refused the 0777 directory and `podstamp run` exited 2; its message
/// ends: "the kubelet makes an emptyDir world-writable".
#[test]
fn the_deploy_daemonset_starts_with_its_volumes_as_the_kubelet_makes_them() {
    let server = shared_server();
    let ns = unique("deployrun");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name, "labels": {
            "kubernetes.io/arch": "arm64", "topology.kubernetes.io/zone": "zone-d"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.9.8.7"}]}}));
    // podstamp runs as deploy/'s ServiceAccount, with a token bound to its
    // Node (as the pod's projected token is), under deploy/'s RBAC and
    // admission policies.
    let (deploy, objects) = apply_deploy(&kube, server, &ns);
    kube.rt
        .block_on(deploy.wait_in_effect(&kube.client, &node_name));
    let find = |kind: &str, name: Option<&str>| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && name.is_none_or(|n| o["metadata"]["name"] == n))
            .unwrap_or_else(|| panic!("deploy/ has no {kind} {name:?}"))
    };
    let pod = &find("DaemonSet", None)["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "the stored DaemonSet: {pod}"
    );
    let container = &pod["containers"][0];

    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    let inside = |path: &str| rootfs.join(path.strip_prefix('/').expect("an absolute path"));
    let mkdir = |dir: &Path, mode: u32| {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(mode)).unwrap();
    };
    mkdir(&rootfs, 0o755);
    // A Socket hostPath must exist on the node for the kubelet to start the
    // pod: the container runtime's socket, here a listening stand-in (not a
    // CRI runtime: local evidence says so in the log and changes nothing).
    let mut sockets = Vec::new();
    for mount in container["volumeMounts"].as_array().unwrap() {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let target = inside(mount["mountPath"].as_str().unwrap());
        // The image's directories above the mount point.
        mkdir(target.parent().unwrap(), 0o755);
        if let Some(config_map) = volume.get("configMap") {
            mkdir(&target, 0o755);
            let data = &find("ConfigMap", config_map["name"].as_str())["data"];
            for (key, text) in data.as_object().unwrap() {
                fs::write(target.join(key), text.as_str().unwrap()).unwrap();
            }
        } else if volume.get("emptyDir").is_some() {
            mkdir(&target, 0o777);
        } else if let Some(host_path) = volume.get("hostPath") {
            match host_path["type"].as_str() {
                Some("DirectoryOrCreate") => mkdir(&target, 0o755),
                Some("Socket") => {
                    let listener = std::os::unix::net::UnixListener::bind(&target).unwrap();
                    sockets.push((mount["mountPath"].as_str().unwrap().to_string(), listener));
                }
                other => panic!("hostPath type {other:?}: not prepared by this test"),
            }
        } else {
            panic!("volume {volume}: not prepared by this test");
        }
    }
    // The container paths in the configuration, under the stand-in root; the
    // plugin components are the image's files.
    let config_arg = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--config="))
        .next()
        .expect("the DaemonSet passes --config=FILE");
    let config_file = inside(config_arg);
    let mut config: Value =
        serde_norway::from_str(&fs::read_to_string(&config_file).unwrap()).unwrap();
    for plugin in config["plugins"].as_object_mut().unwrap().values_mut() {
        let path = inside(plugin["path"].as_str().unwrap());
        mkdir(path.parent().unwrap(), 0o755);
        fs::copy(
            common::plugin(path.file_stem().unwrap().to_str().unwrap()),
            &path,
        )
        .unwrap();
        plugin["path"] = json!(path);
    }
    let cache_dir = inside(config["cacheDir"].as_str().unwrap());
    config["cacheDir"] = json!(cache_dir);
    let manifests = inside(config["daemon"]["manifestDir"].as_str().unwrap());
    config["daemon"]["manifestDir"] = json!(manifests);
    let revisions = inside(config["daemon"]["revisionsDir"].as_str().unwrap());
    config["daemon"]["revisionsDir"] = json!(revisions);
    // daemon.criSocket (its default when the file leaves it out) is where
    // the socket is mounted.
    let cri = config["daemon"]["criSocket"]
        .as_str()
        .unwrap_or("/run/containerd/containerd.sock")
        .to_string();
    assert!(
        sockets.iter().any(|(path, _)| *path == cri),
        "daemon.criSocket {cri} is not a socket the DaemonSet mounts"
    );
    config["daemon"]["criSocket"] = json!(inside(&cri));
    fs::write(&config_file, serde_norway::to_string(&config).unwrap()).unwrap();

    let port = free_port();
    let mut args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            match a.strip_prefix("--config=") {
                Some(path) => format!("--config={}", inside(path).display()),
                None => a.to_string(),
            }
        })
        .collect();
    // What the cluster gives the pod in other ways: the API server and its
    // token bound to the node (the in-cluster config), its namespace (and
    // the test's copy of podstamp-rollouts), a port of its own on this
    // machine.
    let token = kube.rt.block_on(deploy.token(&kube.client, &node_name));
    let kubeconfig = tmp.path().join("in-cluster.kubeconfig");
    deploy.kubeconfig(&token, &kubeconfig);
    args.extend([
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--namespace".to_string(),
        ns.clone(),
        "--rollout-namespace".to_string(),
        deploy.rollouts.clone(),
        "--listen".to_string(),
        format!("127.0.0.1:{port}"),
    ]);
    let env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => node_name.clone(),
                Some(other) => panic!("env from {other}: not given by this test"),
                None => e["value"].as_str().unwrap().to_string(),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect();
    let daemon = Daemon::start_exact(&args, &env, port, tmp.path().join("podstamp.log"));
    let template = find("PodTemplate", None)["metadata"]["name"]
        .as_str()
        .unwrap();
    wait_content(
        &daemon,
        &manifests.join(format!("{template}.yaml")),
        &[
            &format!("checkpoint-of: {node_name}"),
            "--node-ip=10.9.8.7",
            "pod-checkpointer:v0.4.2-arm64",
        ],
    );
    daemon.wait_ready(CONVERGE);
    let cached = fs::read_dir(&cache_dir).unwrap().count();
    assert_eq!(
        cached, 3,
        "one cache entry per catalog plugin, for a warm restart"
    );
}

fn write_atomically(path: &Path, text: &str) {
    let temp = path.with_extension("tmp~");
    fs::write(&temp, text).unwrap();
    fs::rename(&temp, path).unwrap();
}

const DIR_TEMPLATE: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: boot}\ntemplate:\n  spec:\n    containers:\n    - name: main\n      image: IMAGE\n      command: [run, \"--zone=${node.label[zone]}\"]\n";

#[test]
fn the_directory_source_needs_no_api_server() {
    let s = setup();
    let templates = s.tmp.path().join("templates");
    fs::create_dir(&templates).unwrap();
    fs::write(
        templates.join("boot.yaml"),
        DIR_TEMPLATE.replace("IMAGE", "boot:1"),
    )
    .unwrap();
    fs::write(templates.join("README.md"), "not a template").unwrap();
    let node_file = s.tmp.path().join("node.yaml");
    fs::write(
        &node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: ignored, labels: {zone: lab}}\n",
    )
    .unwrap();
    let dir = &s.manifests;
    let foreign = dir.join("kube-apiserver.yaml");
    fs::write(
        &foreign,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: kube-apiserver}\n",
    )
    .unwrap();
    let foreign_before = identity(&foreign);
    let daemon = Daemon::start(
        &[
            "--config",
            s.config.to_str().unwrap(),
            "--source",
            &format!("dir:{}", templates.display()),
            "--node-name",
            "laptop",
            "--node-file",
            node_file.to_str().unwrap(),
            "--manifest-dir",
            dir.to_str().unwrap(),
        ],
        s.tmp.path().join("podstamp.log"),
    );
    let boot = dir.join("boot.yaml");
    wait_content(
        &daemon,
        &boot,
        &[
            "image: boot:1",
            "--zone=lab",
            "value: laptop",
            "namespace: kube-system",
            "podstamp.io/source: kube-system/boot",
        ],
    );
    daemon.wait_ready(CONVERGE);
    kubelet_accepts(&[&boot], "laptop");

    write_atomically(
        &templates.join("boot.yaml"),
        &DIR_TEMPLATE.replace("IMAGE", "boot:2"),
    );
    wait_content(&daemon, &boot, &["image: boot:2"]);

    // Broken: the last good manifest stays.
    let good = identity(&boot);
    fs::write(
        templates.join("boot.yaml"),
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: boot\n",
    )
    .unwrap();
    wait_for("the parse error in the log", CONVERGE, || {
        daemon.logs().contains("InvalidTemplate").then_some(())
    });
    assert_eq!(identity(&boot), good);

    // A second file with the same template name: the later one fails.
    write_atomically(
        &templates.join("boot.yaml"),
        &DIR_TEMPLATE.replace("IMAGE", "boot:3"),
    );
    wait_content(&daemon, &boot, &["image: boot:3"]);
    write_atomically(
        &templates.join("copy.yaml"),
        &DIR_TEMPLATE.replace("IMAGE", "copy:1"),
    );
    wait_for("the name conflict in the log", CONVERGE, || {
        daemon.logs().contains("NameConflict").then_some(())
    });
    assert!(read(&boot).unwrap().contains("image: boot:3"));
    // The first one goes: the other gets the name.
    fs::remove_file(templates.join("boot.yaml")).unwrap();
    wait_content(&daemon, &boot, &["image: copy:1"]);
    fs::remove_file(templates.join("copy.yaml")).unwrap();
    wait_gone(&daemon, &boot);
    assert_eq!(identity(&foreign), foreign_before);
    assert!(daemon.stop().success());
}

#[test]
fn a_restart_keeps_hand_edits_out_and_foreign_files_in() {
    // Offline: a manifest of ours edited by hand is overwritten on the next
    // render; stray temp files of ours go; a file of another namespace's
    // podstamp is not ours.
    let s = setup();
    let templates = s.tmp.path().join("templates");
    fs::create_dir(&templates).unwrap();
    fs::write(
        templates.join("boot.yaml"),
        DIR_TEMPLATE.replace("IMAGE", "boot:1"),
    )
    .unwrap();
    let dir = &s.manifests;
    let node_file = s.tmp.path().join("node.yaml");
    fs::write(
        &node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: lab}}\n",
    )
    .unwrap();
    let args = |node: &str| -> Vec<String> {
        vec![
            "--node-file".into(),
            node_file.to_str().unwrap().into(),
            "--config".into(),
            s.config.to_str().unwrap().into(),
            "--source".into(),
            format!("dir:{}", templates.display()),
            "--node-name".into(),
            node.into(),
            "--manifest-dir".into(),
            dir.to_str().unwrap().into(),
        ]
    };
    let start = |node: &str, log: &str| {
        let mut a = args(node);
        a.extend(["--log-format".to_string(), "json".to_string()]);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        Daemon::start(&refs, s.tmp.path().join(log))
    };
    let daemon = start("n1", "1.log");
    let boot = dir.join("boot.yaml");
    let good = wait_content(&daemon, &boot, &["image: boot:1"]);
    assert!(daemon.stop().success());

    fs::write(&boot, good.replace("image: boot:1", "image: evil:1")).unwrap();
    let stray = dir.join(".podstamp-boot.yaml.1.0.tmp");
    fs::write(&stray, "half").unwrap();
    let other = dir.join("other.yaml");
    let other_text = good.replace(
        "podstamp.io/source: kube-system/boot",
        "podstamp.io/source: elsewhere/boot",
    );
    fs::write(&other, &other_text).unwrap();
    // A copy of ours under another name would be a second pod for the kubelet.
    let renamed = dir.join("boot-renamed.yaml");
    fs::write(&renamed, &good).unwrap();

    let daemon = start("n1", "2.log");
    wait_content(&daemon, &boot, &["image: boot:1"]);
    daemon.wait_ready(CONVERGE);
    wait_gone(&daemon, &renamed);
    kubelet_accepts(&[&boot], "n1");
    for line in daemon.logs().lines() {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "--log-format json: not JSON: {line}");
    }
    assert!(
        daemon.logs().contains("edited by hand"),
        "{}",
        daemon.logs()
    );
    assert!(!stray.exists(), "stray temp files of ours are removed");
    assert_eq!(
        read(&other).unwrap(),
        other_text,
        "another namespace's manifest is not ours"
    );
    fs::remove_file(templates.join("boot.yaml")).unwrap();
    wait_gone(&daemon, &boot);
    assert!(other.exists());
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    fs::write(&bad, "daemon:\n  nodeNmae: x\n").unwrap();
    let manifests = tmp.path().join("m");
    let m = manifests.to_str().unwrap();
    for (args, needle) in [
        (vec!["run", "--manifest-dir", m], "--node-name"),
        (
            vec![
                "run",
                "--node-name",
                "n",
                "--source",
                "ftp:x",
                "--manifest-dir",
                m,
            ],
            "--source",
        ),
        (
            vec!["run", "--node-name", "n", "--config", bad.to_str().unwrap()],
            "daemon.nodeNmae",
        ),
        (
            vec![
                "run",
                "--node-name",
                "n",
                "--source",
                "dir:/nonexistent",
                "--manifest-dir",
                m,
            ],
            "not a directory",
        ),
        (
            vec![
                "run",
                "--node-name",
                "n",
                "--namespace",
                "Bad_NS",
                "--manifest-dir",
                m,
            ],
            "namespace",
        ),
    ] {
        let out = common::podstamp(&args);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// The PodTemplate exactly as the bootkube discussion wrote it
/// (kubernetes-retired/bootkube#206), sent byte for byte as YAML to the API
/// server: `template.metadata` repeats the name and the namespace. The
/// daemon writes a manifest the kubelet accepts, and says nothing about
/// fields equal to what the manifest gets anyway.
#[test]
fn the_bootkube_discussion_template_through_the_api_server() {
    let server = shared_server();
    let node_name = unique("node");
    // The template names its namespace; no other test uses kube-system.
    let kube = Kube::new(&server.kubeconfig("admin"), "kube-system");
    kube.create_cluster::<Node>(node(&node_name, "zone-a"));
    let yaml =
        fs::read(common::repo().join("tests/fixtures/bootkube-206-podtemplate.yaml")).unwrap();
    let request = http::Request::post("/api/v1/namespaces/kube-system/podtemplates")
        .header("Content-Type", "application/yaml")
        .body(yaml)
        .unwrap();
    let created = kube
        .rt
        .block_on(kube.client.request_text(request))
        .expect("the API server accepts the template as written");
    assert!(
        created.contains("\"namespace\":\"kube-system\""),
        "{created}"
    );

    let s = setup();
    let daemon = Daemon::start(
        &[
            "--kubeconfig",
            server.kubeconfig("admin").to_str().unwrap(),
            "--namespace",
            "kube-system",
            // The template has no labels: select every template.
            "--selector=",
            // The checkpointer runs on the host network with host paths: a
            // control-plane template, granted level privileged
            // deliberately (kube-system has no enforce label here).
            "--pod-security",
            "privileged",
            "--node-name",
            &node_name,
            "--manifest-dir",
            s.manifests.to_str().unwrap(),
        ],
        s.tmp.path().join("podstamp.log"),
    );
    let manifest = s.manifests.join("pod-checkpointer.yaml");
    wait_content(
        &daemon,
        &manifest,
        &[
            "image: quay.io/coreos/pod-checkpointer:foo",
            "k8s-app: pod-checkpointer",
            "namespace: kube-system",
        ],
    );
    kubelet_accepts(&[&manifest], &node_name);
    daemon.wait_ready(CONVERGE);
    let logs = daemon.logs();
    assert!(!logs.contains("ignoring"), "{logs}");

    // Metadata copied from another namespace's pod is dropped with one
    // warning, not one per update of the template.
    let name = unique("copied");
    kube.create::<PodTemplate>(json!({
        "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
        "template": {
            "metadata": {"namespace": "team-a", "finalizers": ["example.com/keep"], "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1"}]}
        }
    }));
    let copied = s.manifests.join(format!("{name}.yaml"));
    wait_content(
        &daemon,
        &copied,
        &["image: busybox:1", "namespace: kube-system"],
    );
    kube.patch_template(
        &name,
        json!({"metadata": {"annotations": {"owner": "team-a"}}}),
    );
    kube.patch_template(
        &name,
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}),
    );
    wait_content(&daemon, &copied, &["image: busybox:2"]);
    kube.delete_template(&name);
    let logs = daemon.logs();
    let warning = format!(
        "PodTemplate kube-system/{name}: ignoring template.metadata.namespace, \
         template.metadata.finalizers (the manifest's namespace is \"kube-system\", not \
         \"team-a\"; a static pod's metadata is set by the kubelet); only labels and \
         annotations are kept"
    );
    assert_eq!(logs.matches(&warning).count(), 1, "{logs}");
}

/// The catalog's ConfigMaps are watched one by one, by name, with the
/// permissions of the `podstamp` user only on those names: what is known
/// follows creation, update and deletion, each change is told once, and a
/// ConfigMap the Role does not name is an error saying which permission to
/// grant, not a wait.
#[test]
fn configmaps_are_watched_by_name_and_a_missing_permission_is_named() {
    use podstamp::daemon::configmaps::{ConfigMapError, ConfigMapWatches};
    use std::sync::{Arc, Mutex};

    let server = shared_server();
    let ns = unique("cm");
    let kube = Kube::admin(server, &ns);
    kube.create::<k8s_openapi::api::rbac::v1::Role>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "podstamp"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["catalog"], "verbs": ["get", "list", "watch"]}]}));
    kube.create::<k8s_openapi::api::rbac::v1::RoleBinding>(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "podstamp"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podstamp"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "podstamp"}]}));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(client(&server.kubeconfig("podstamp")));
    // A new binding takes effect when the API server's authorizer has seen
    // it: a read right after may still be refused (about once in five full
    // runs), which is not what this test is about. Every verb the watches
    // use, as the authorizer answers the user itself.
    rt.block_on(common::wait_for_grants(
        &client,
        &ns,
        &json!([{"apiGroups": [""], "resources": ["configmaps"],
                 "resourceNames": ["catalog"], "verbs": ["get", "list", "watch"]}]),
        CONVERGE,
    ));
    let told = Arc::new(Mutex::new(Vec::<String>::new()));
    let watches = {
        let told = told.clone();
        ConfigMapWatches::new(
            client,
            ns.clone(),
            Some(2),
            rt.handle().clone(),
            Arc::new(podstamp::daemon::metrics::Metrics::default()),
            move |name| told.lock().unwrap().push(name.to_string()),
        )
    };
    let wait = Duration::from_secs(10);
    assert_eq!(
        watches.get("catalog", wait).unwrap(),
        None,
        "not created yet"
    );

    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(kube.client.clone(), &ns);
    let catalog = |version: &str| {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "catalog"}, "data": {"catalog.yaml": version}}))
        .unwrap()
    };
    kube.rt
        .block_on(api.create(&PostParams::default(), &catalog("chain: []")))
        .unwrap();
    let data = |watches: &ConfigMapWatches| {
        watches.get("catalog", wait).unwrap().map(|cm| {
            cm["data"]["catalog.yaml"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    };
    wait_for("the created ConfigMap", CONVERGE, || {
        (data(&watches).as_deref() == Some("chain: []")).then_some(())
    });
    kube.rt
        .block_on(api.replace("catalog", &PostParams::default(), &{
            let mut current = kube.rt.block_on(api.get("catalog")).unwrap();
            current.data = Some([("catalog.yaml".to_string(), "chain: [a]".to_string())].into());
            current
        }))
        .unwrap();
    wait_for("the updated ConfigMap", CONVERGE, || {
        (data(&watches).as_deref() == Some("chain: [a]")).then_some(())
    });
    // Renewed watches (a 2 s timeout) tell nothing new.
    std::thread::sleep(Duration::from_secs(5));
    let catalog_told = |told: &Arc<Mutex<Vec<String>>>| {
        told.lock()
            .unwrap()
            .iter()
            .filter(|n| *n == "catalog")
            .count()
    };
    assert_eq!(catalog_told(&told), 3, "absent, created, updated: {told:?}");

    // A name the Role does not grant: refused at once, naming what to do.
    let e = watches.get("other", wait).unwrap_err();
    match &e {
        ConfigMapError::Refused { name, message, .. } => {
            assert_eq!(name, "other");
            assert!(message.contains("resourceNames"), "{message}");
            assert!(message.contains("configmaps"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.to_string().lines().count(), 1, "{e}");

    kube.rt
        .block_on(api.delete("catalog", &DeleteParams::default()))
        .unwrap();
    wait_for("the deleted ConfigMap", CONVERGE, || {
        (data(&watches).is_none()).then_some(())
    });
    watches.keep([]);
}

// ------------------------------------------------------------------ reload

/// A template reading `substitute`'s settings (the default chain).
const RELOAD_A: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: a}\ntemplate:\n  spec:\n    containers:\n    - name: main\n      image: IMAGE\n      command: [run, \"--say=${var.greeting}\"]\n";
/// A template with its own chain, `node-env` alone: `substitute`'s settings
/// are nothing to it.
const RELOAD_B: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: b, annotations: {podstamp.io/plugins: node-env}}\ntemplate:\n  spec:\n    containers:\n    - name: main\n      image: b:1\n      command: [run]\n";

/// The configuration for the reload tests: `substitute` says `greeting`;
/// `extra` is appended as is.
fn reload_config(greeting: &str, extra: &str) -> String {
    use common::plugin;
    format!(
        "plugins:\n  substitute:\n    path: {}\n    settings: {{vars: {{greeting: {greeting}}}}}\n    scope: [metadata, spec]\n  node-env:\n    path: {}\n    settings: {{nodeIP: \"\", labels: {{ZONE: zone}}}}\nchain: [substitute, node-env]\nlimits: {{timeout: 2s}}\n{extra}",
        plugin("substitute").display(),
        plugin("node-env").display(),
    )
}

/// Templates `a` and `b` in a directory, and a node file.
struct ReloadSetup {
    tmp: tempfile::TempDir,
    templates: PathBuf,
    node_file: PathBuf,
    manifests: PathBuf,
}

fn reload_setup() -> ReloadSetup {
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    let manifests = tmp.path().join("manifests");
    fs::create_dir(&templates).unwrap();
    fs::create_dir(&manifests).unwrap();
    fs::write(templates.join("a.yaml"), RELOAD_A.replace("IMAGE", "a:1")).unwrap();
    fs::write(templates.join("b.yaml"), RELOAD_B).unwrap();
    let node_file = tmp.path().join("node.yaml");
    fs::write(
        &node_file,
        "apiVersion: v1\nkind: Node\nmetadata: {name: ignored, labels: {zone: lab}}\n",
    )
    .unwrap();
    ReloadSetup {
        tmp,
        templates,
        node_file,
        manifests,
    }
}

impl ReloadSetup {
    /// `podstamp run` on the directory source with `config`; waits until
    /// both manifests are written and the daemon is ready.
    fn start(&self, config: &Path) -> Daemon {
        let daemon = Daemon::start(
            &[
                "--config",
                config.to_str().unwrap(),
                "--source",
                &format!("dir:{}", self.templates.display()),
                "--node-name",
                "laptop",
                "--node-file",
                self.node_file.to_str().unwrap(),
                "--manifest-dir",
                self.manifests.to_str().unwrap(),
            ],
            self.tmp.path().join(format!("{}.log", unique("podstamp"))),
        );
        wait_content(&daemon, &self.a(), &["--say=hello"]);
        wait_content(&daemon, &self.b(), &["value: lab"]);
        daemon.wait_ready(CONVERGE);
        daemon
    }

    fn a(&self) -> PathBuf {
        self.manifests.join("a.yaml")
    }

    fn b(&self) -> PathBuf {
        self.manifests.join("b.yaml")
    }
}

/// The digest of the catalog in use, from `podstamp_catalog_info`.
fn catalog_in_use(daemon: &Daemon) -> String {
    let (_, body) = daemon.get("/metrics").unwrap_or_default();
    let digests: Vec<&str> = body
        .lines()
        .filter_map(|l| {
            l.strip_prefix("podstamp_catalog_info{digest=\"")?
                .strip_suffix("\"} 1")
        })
        .collect();
    assert_eq!(digests.len(), 1, "one catalog in use:\n{body}");
    digests[0].to_string()
}

/// Waits until `podstamp_config_reloads_total{result}` is `n`.
fn wait_reloads(daemon: &Daemon, result: &str, n: u32) {
    let sample = format!("podstamp_config_reloads_total{{result=\"{result}\"}}");
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("{sample} to be {n}"), CONVERGE, || {
            daemon.assert_running();
            (daemon.metric(&sample) == f64::from(n)).then_some(())
        })
    }));
    if found.is_err() {
        panic!(
            "timed out waiting for {sample} to be {n}; it is {}; podstamp's log:\n{}",
            daemon.metric(&sample),
            daemon.logs()
        );
    }
}

const REFUSED: &str = "the new plugin catalog is refused";
const NEEDS_RESTART: &str = "needs a restart to take effect; still using";

#[test]
fn a_settings_change_in_the_config_file_rewrites_only_the_affected_manifest() {
    let s = reload_setup();
    let config = s.tmp.path().join("podstamp.yaml");
    fs::write(&config, reload_config("hello", "")).unwrap();
    let daemon = s.start(&config);
    let first = catalog_in_use(&daemon);
    let b = identity(&s.b());
    let unchanged = "podstamp_renders_total{result=\"unchanged\"}";
    let renders = daemon.metric(unchanged);

    // Edited in place: only `a` goes through `substitute`.
    fs::write(&config, reload_config("bonjour", "")).unwrap();
    wait_content(&daemon, &s.a(), &["--say=bonjour"]);
    wait_reloads(&daemon, "applied", 1);
    assert_eq!(identity(&s.b()), b, "b's chain did not change");
    assert_eq!(
        daemon.metric(unchanged),
        renders,
        "b was not even rendered again"
    );
    let second = catalog_in_use(&daemon);
    assert_ne!(second, first);

    // Broken four ways: each refused whole, nothing rewritten.
    let not_a_component = s.tmp.path().join("not-a-component.wasm");
    fs::write(&not_a_component, b"\0asm but not really").unwrap();
    let good = reload_config("bonjour", "");
    let broken = [
        (
            "plugins: [substitute\n".to_string(),
            "did not find expected ',' or ']'",
        ),
        (
            good.replace(
                common::plugin("substitute").to_str().unwrap(),
                "/nonexistent/substitute.wasm",
            ),
            "plugins.substitute: /nonexistent/substitute.wasm: cannot read plugin: No such file or directory",
        ),
        (
            good.replace(
                common::plugin("substitute").to_str().unwrap(),
                not_a_component.to_str().unwrap(),
            ),
            "plugins.substitute: NOT_A_COMPONENT: not a valid WebAssembly component",
        ),
        // Settings the plugin refuses (its validate-settings, WIT 0.1.1):
        // refused at reload, not at the first render.
        (
            reload_config("[1]", ""),
            "plugins.substitute: settings.vars.greeting: invalid type: sequence, expected a string (refused by the plugin substitute 0.1.0's validate-settings; fix the settings)",
        ),
    ];
    let manifests = (identity(&s.a()), identity(&s.b()));
    for (n, (text, names)) in broken.iter().enumerate() {
        fs::write(&config, text).unwrap();
        wait_reloads(&daemon, "refused", n as u32 + 1);
        let logs = daemon.logs();
        let line = logs
            .lines()
            .filter(|l| l.contains(REFUSED))
            .nth(n)
            .unwrap_or_else(|| panic!("no refusal #{n} in the log:\n{logs}"));
        let says = names.replace("NOT_A_COMPONENT", not_a_component.to_str().unwrap());
        assert!(line.contains(&says), "{says:?} not in {line}");
        assert_eq!(catalog_in_use(&daemon), second);
        assert_eq!((identity(&s.a()), identity(&s.b())), manifests);
    }
    // The old catalog still serves a template that changes meanwhile.
    write_atomically(
        &s.templates.join("a.yaml"),
        &RELOAD_A.replace("IMAGE", "a:2"),
    );
    wait_content(&daemon, &s.a(), &["image: a:2", "--say=bonjour"]);
    let b = identity(&s.b());

    // Fixed: applied.
    fs::write(&config, reload_config("salut", "")).unwrap();
    wait_content(&daemon, &s.a(), &["--say=salut"]);
    wait_reloads(&daemon, "applied", 2);
    assert_eq!(identity(&s.b()), b);
    let third = catalog_in_use(&daemon);

    // A node-local setting: reported as needing a restart, once; not used.
    let a = identity(&s.a());
    fs::write(&config, reload_config("salut", "namespace: elsewhere\n")).unwrap();
    wait_reloads(&daemon, "unchanged", 1);
    fs::write(
        &config,
        reload_config("salut", "namespace: elsewhere\n# same again\n"),
    )
    .unwrap();
    wait_reloads(&daemon, "unchanged", 2);
    let logs = daemon.logs();
    let said: Vec<&str> = logs.lines().filter(|l| l.contains(NEEDS_RESTART)).collect();
    assert_eq!(said.len(), 1, "said once:\n{logs}");
    assert!(
        said[0].contains("namespace changed to \"elsewhere\"")
            && said[0].contains("still using kube-system"),
        "{}",
        said[0]
    );
    assert_eq!(catalog_in_use(&daemon), third);
    assert_eq!((identity(&s.a()), identity(&s.b())), (a, b));
    write_atomically(
        &s.templates.join("a.yaml"),
        &RELOAD_A.replace("IMAGE", "a:3"),
    );
    wait_content(
        &daemon,
        &s.a(),
        &["image: a:3", "--say=salut", "namespace: kube-system"],
    );
    assert!(daemon.stop().success());
}

/// Lays `files` out in `dir` as the kubelet's AtomicWriter does for a
/// mounted ConfigMap: the files in a new `..<timestamp>.<random>` directory,
/// each visible as `NAME -> ..data/NAME`, and `..data` pointing at the new
/// directory through a `..data_tmp` symlink renamed over it; then the old
/// directory goes.
fn kubelet_atomic_write(dir: &Path, files: &[(&str, &str)]) {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let data = dir.join("..data");
    let old = fs::read_link(&data).ok();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let secs = now.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let ts = format!(
        "..{year:04}_{month:02}_{day:02}_{:02}_{:02}_{:02}.{}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        now.subsec_nanos()
    );
    let ts_dir = dir.join(&ts);
    fs::create_dir(&ts_dir).unwrap();
    fs::set_permissions(&ts_dir, fs::Permissions::from_mode(0o755)).unwrap();
    for (name, text) in files {
        fs::write(ts_dir.join(name), text).unwrap();
        fs::set_permissions(ts_dir.join(name), fs::Permissions::from_mode(0o644)).unwrap();
        let visible = dir.join(name);
        if fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new("..data").join(name), &visible).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    symlink(&ts, &tmp).unwrap();
    fs::rename(&tmp, &data).unwrap();
    if let Some(old) = old {
        fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

#[test]
fn the_config_file_reloads_when_renamed_into_place_or_swapped_by_the_kubelet() {
    // Replaced by rename, as `kubectl cp`, an editor or a config tool does.
    let s = reload_setup();
    let config = s.tmp.path().join("podstamp.yaml");
    fs::write(&config, reload_config("hello", "")).unwrap();
    let daemon = s.start(&config);
    let b = identity(&s.b());
    write_atomically(&config, &reload_config("renamed", ""));
    wait_content(&daemon, &s.a(), &["--say=renamed"]);
    wait_reloads(&daemon, "applied", 1);
    assert_eq!(identity(&s.b()), b);
    assert!(daemon.stop().success());

    // A ConfigMap mounted by the kubelet, updated by its `..data` swap.
    let s = reload_setup();
    let mounted = s.tmp.path().join("configmap");
    fs::create_dir(&mounted).unwrap();
    kubelet_atomic_write(&mounted, &[("config.yaml", &reload_config("hello", ""))]);
    let config = mounted.join("config.yaml");
    assert!(fs::symlink_metadata(&config).unwrap().is_symlink());
    let daemon = s.start(&config);
    let b = identity(&s.b());
    kubelet_atomic_write(&mounted, &[("config.yaml", &reload_config("swapped", ""))]);
    wait_content(&daemon, &s.a(), &["--say=swapped"]);
    wait_reloads(&daemon, "applied", 1);
    assert_eq!(identity(&s.b()), b);
    // Broken, then fixed, the same way.
    let a = identity(&s.a());
    kubelet_atomic_write(&mounted, &[("config.yaml", "chain: [nope]\n")]);
    wait_reloads(&daemon, "refused", 1);
    let logs = daemon.logs();
    assert!(
        logs.contains(REFUSED) && logs.contains(r#"chain: unknown plugin "nope""#),
        "{logs}"
    );
    assert_eq!((identity(&s.a()), identity(&s.b())), (a, b));
    kubelet_atomic_write(&mounted, &[("config.yaml", &reload_config("fixed", ""))]);
    wait_content(&daemon, &s.a(), &["--say=fixed"]);
    wait_reloads(&daemon, "applied", 2);
    assert_eq!(identity(&s.b()), b);
    assert!(daemon.stop().success());
}

// ---------------------------------------------------- catalog from the API

const CATALOG_CM: &str = "podstamp-catalog";
const SUBSTITUTE_CM: &str = "podstamp-plugin-substitute";
const NODE_ENV_CM: &str = "podstamp-plugin-node-env";

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A ConfigMap holding `bytes` under `binaryData[key]`, gzip-compressed or not.
fn plugin_config_map(name: &str, key: &str, bytes: &[u8], gzip: bool) -> Value {
    use std::io::Write;
    let data = if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    } else {
        bytes.to_vec()
    };
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
        "binaryData": {key: k8s_openapi::ByteString(data)}})
}

fn catalog_config_map(text: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CATALOG_CM},
        "data": {"catalog.yaml": text}})
}

/// The catalog of the API tests: `substitute` (plain, key substitute.wasm)
/// saying `greeting`, then `node-env` (gzip, default key); `node_env_key`
/// overrides node-env's key.
fn api_catalog(greeting: &str, node_env_key: Option<&str>) -> String {
    let pin = |name: &str| sha256_hex(&fs::read(common::plugin(name)).unwrap());
    let key = node_env_key.map_or(String::new(), |k| format!(", key: {k}"));
    format!(
        "plugins:\n  substitute:\n    configMap: {{name: {SUBSTITUTE_CM}, key: substitute.wasm}}\n    sha256: {}\n    settings: {{vars: {{greeting: {greeting}}}}}\n    scope: [metadata, spec]\n  node-env:\n    configMap: {{name: {NODE_ENV_CM}{key}}}\n    sha256: {}\n    settings: {{nodeIP: \"\", labels: {{ZONE: zone}}}}\nchain: [substitute, node-env]\n",
        pin("substitute"),
        pin("node-env"),
    )
}

impl Kube {
    fn config_maps(&self) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates or replaces a ConfigMap (server-side apply).
    fn apply_config_map(&self, object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        self.rt
            .block_on(self.config_maps().patch(
                &name,
                &PatchParams::apply("podstamp-tests").force(),
                &Patch::Apply(object),
            ))
            .unwrap();
    }

    fn delete_config_map(&self, name: &str) {
        self.rt
            .block_on(self.config_maps().delete(name, &DeleteParams::default()))
            .unwrap();
    }

    /// The `CatalogRefused` Events on ConfigMap `name`.
    fn catalog_events(&self, name: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("CatalogRefused")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ConfigMap")
            })
            .collect()
    }
}

/// The deploy/ Role, with `extra` ConfigMap names added to its configmaps
/// rule's resourceNames, as docs/daemon.md says to do for a plugin.
fn deploy_role_with(extra: &[&str]) -> Value {
    let mut rules = deploy_rules("Role");
    let rule = rules
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["resources"] == json!(["configmaps"]))
        .expect("deploy/rbac.yaml grants configmaps");
    assert_eq!(rule["resourceNames"], json!([CATALOG_CM]));
    for name in extra {
        rule["resourceNames"]
            .as_array_mut()
            .unwrap()
            .push(json!(name));
    }
    rules
}

/// A namespace with the deploy/ RBAC (plus the plugin ConfigMaps), a Node,
/// the plugin ConfigMaps, the catalog ConfigMap, templates `a` (the default
/// chain) and `b` (node-env only), and a configuration file naming the
/// catalog ConfigMap.
struct ApiCatalogSetup {
    kube: Kube,
    ns: String,
    node: String,
    s: Setup,
}

fn api_catalog_setup(server: &ApiServer) -> ApiCatalogSetup {
    let ns = unique("apicat");
    let node_name = unique("node");
    let kube = Kube::admin(server, &ns);
    kube.create_cluster::<Node>(node(&node_name, "zone-c"));
    bind(
        server,
        &kube,
        &ns,
        deploy_role_with(&[SUBSTITUTE_CM, NODE_ENV_CM]),
        deploy_rules("ClusterRole"),
    );
    let substitute = fs::read(common::plugin("substitute")).unwrap();
    let node_env = fs::read(common::plugin("node-env")).unwrap();
    // node-env goes gzipped (how a large plugin fits in a ConfigMap: a
    // Python one is 18 MB, 6 MB gzipped), substitute plain.
    kube.apply_config_map(plugin_config_map(
        SUBSTITUTE_CM,
        "substitute.wasm",
        &substitute,
        false,
    ));
    kube.apply_config_map(plugin_config_map(
        NODE_ENV_CM,
        "plugin.wasm",
        &node_env,
        true,
    ));
    kube.apply_config_map(catalog_config_map(&api_catalog("hello", None)));
    kube.create::<PodTemplate>(template("a", "a:1"));
    let mut b = template("b", "b:1");
    b["metadata"]["annotations"] = json!({"podstamp.io/plugins": "node-env"});
    b["template"]["spec"]["containers"][0]["command"] = json!(["run"]);
    kube.create::<PodTemplate>(b);
    let s = setup();
    fs::write(
        &s.config,
        format!("daemon: {{catalog: {{configMap: {CATALOG_CM}}}}}\nlimits: {{timeout: 2s}}\n"),
    )
    .unwrap();
    ApiCatalogSetup {
        kube,
        ns,
        node: node_name,
        s,
    }
}

/// An [`api_catalog_setup`] with podstamp running on it (podstamp's own
/// credentials): both components from their ConfigMaps (gzip and plain,
/// pinned) rendered into `a` and `b`, the daemon ready, the catalog applied
/// once.
fn api_catalog_started(server: &ApiServer) -> (ApiCatalogSetup, Daemon) {
    let t = api_catalog_setup(server);
    let daemon = start_daemon(
        &t.s,
        &server.kubeconfig("podstamp"),
        &t.ns,
        &t.node,
        &t.s.manifests,
    );
    let (a, b) = (t.s.manifests.join("a.yaml"), t.s.manifests.join("b.yaml"));
    wait_content(&daemon, &a, &["--say=hello", "--zone=zone-c", "ZONE"]);
    wait_content(&daemon, &b, &["ZONE"]);
    daemon.wait_ready(CONVERGE);
    wait_reloads(&daemon, "applied", 1);
    (t, daemon)
}

/// Waits for a refusal line of the log that contains `needle`; returns it.
/// (Matched by content, not counted: a periodic re-read may refuse the
/// same catalog again.)
fn wait_refusal(daemon: &Daemon, needle: &str) -> String {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("a refusal saying {needle:?}"), CONVERGE, || {
            daemon.assert_running();
            daemon
                .logs()
                .lines()
                .find(|l| l.contains(REFUSED) && l.contains(needle))
                .map(str::to_string)
        })
    }));
    found.unwrap_or_else(|_| {
        panic!(
            "no refusal saying {needle:?}; podstamp's log:\n{}",
            daemon.logs()
        )
    })
}

#[test]
fn a_catalog_and_plugins_from_configmaps_render_reload_and_refuse() {
    let server = shared_server();
    let (t, daemon) = api_catalog_started(server);
    let (kube, ns) = (&t.kube, &t.ns);
    let (a, b) = (t.s.manifests.join("a.yaml"), t.s.manifests.join("b.yaml"));
    let first = catalog_in_use(&daemon);
    kubelet_accepts(&[&t.s.manifests], &t.node);

    // A settings change in the catalog ConfigMap: only `a` is rewritten.
    let b_was = identity(&b);
    kube.apply_config_map(catalog_config_map(&api_catalog("bonjour", None)));
    wait_content(&daemon, &a, &["--say=bonjour"]);
    wait_reloads(&daemon, "applied", 2);
    assert_eq!(identity(&b), b_was, "b's chain did not change");
    let second = catalog_in_use(&daemon);
    assert_ne!(second, first);
    let manifests = (identity(&a), identity(&b));
    let unchanged_since = |daemon: &Daemon| {
        assert_eq!(catalog_in_use(daemon), second, "the old catalog serves");
        assert_eq!((identity(&a), identity(&b)), manifests, "nothing rewritten");
    };

    // The substitute ConfigMap now holds another component: a digest
    // mismatch, refused in one line; an Event on that ConfigMap.
    let identity_bytes = fs::read(common::plugin("identity")).unwrap();
    kube.apply_config_map(plugin_config_map(
        SUBSTITUTE_CM,
        "substitute.wasm",
        &identity_bytes,
        false,
    ));
    let substitute_pin = sha256_hex(&fs::read(common::plugin("substitute")).unwrap());
    let says = format!(
        "plugins.substitute: ConfigMap {ns}/{SUBSTITUTE_CM} key substitute.wasm: sha256 is {}, but the catalog pins {substitute_pin}",
        sha256_hex(&identity_bytes)
    );
    let line = wait_refusal(&daemon, &says);
    assert_eq!(line.matches(" sha256 is ").count(), 1, "one line: {line}");
    unchanged_since(&daemon);
    let event = wait_for("an Event on the plugin ConfigMap", CONVERGE, || {
        kube.catalog_events(SUBSTITUTE_CM).into_iter().next()
    });
    assert!(
        event.note.as_deref().unwrap_or_default().contains(&says),
        "{event:?}"
    );
    // Put back: the catalog loads to the one in use.
    let unchanged = "podstamp_config_reloads_total{result=\"unchanged\"}";
    let before = daemon.metric(unchanged);
    let substitute = fs::read(common::plugin("substitute")).unwrap();
    kube.apply_config_map(plugin_config_map(
        SUBSTITUTE_CM,
        "substitute.wasm",
        &substitute,
        false,
    ));
    wait_for("the put-back component to load", CONVERGE, || {
        daemon.assert_running();
        (daemon.metric(unchanged) > before).then_some(())
    });

    // A key the plugin ConfigMap does not have: refused, naming both.
    kube.apply_config_map(catalog_config_map(&api_catalog(
        "bonjour",
        Some("wrong.wasm"),
    )));
    wait_refusal(
        &daemon,
        &format!(
            "plugins.node-env: ConfigMap {ns}/{NODE_ENV_CM} key wrong.wasm: missing (binaryData has: plugin.wasm)"
        ),
    );
    unchanged_since(&daemon);

    // The catalog ConfigMap broken: refused, an Event on it.
    kube.apply_config_map(catalog_config_map("plugins: [substitute\n"));
    wait_refusal(
        &daemon,
        &format!("ConfigMap {ns}/{CATALOG_CM} key catalog.yaml"),
    );
    unchanged_since(&daemon);
    wait_for("an Event on the catalog ConfigMap", CONVERGE, || {
        kube.catalog_events(CATALOG_CM).into_iter().next()
    });

    // Fixed: applied, only `a` rewritten.
    kube.apply_config_map(catalog_config_map(&api_catalog("salut", None)));
    wait_content(&daemon, &a, &["--say=salut"]);
    wait_reloads(&daemon, "applied", 3);
    assert_eq!(identity(&b), manifests.1);
    let third = catalog_in_use(&daemon);

    // A plugin ConfigMap deleted: refused, saying what is missing; every
    // manifest stays.
    let manifests = (identity(&a), identity(&b));
    kube.delete_config_map(SUBSTITUTE_CM);
    let says = format!("plugins.substitute: ConfigMap {ns}/{SUBSTITUTE_CM} does not exist");
    wait_refusal(&daemon, &says);
    // A deleted ConfigMap cannot carry the Event: the catalog's does.
    let on_catalog = |needle: &str| {
        wait_for(
            &format!("an Event on the catalog ConfigMap saying {needle:?}"),
            CONVERGE,
            || {
                kube.catalog_events(CATALOG_CM)
                    .into_iter()
                    .find(|e| e.note.as_deref().unwrap_or_default().contains(needle))
            },
        )
    };
    on_catalog(&says);
    assert_eq!(catalog_in_use(&daemon), third);
    kube.patch_template(
        "b",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "b:2"}]}}}),
    );
    // The old catalog still renders what changes meanwhile.
    wait_content(&daemon, &b, &["image: b:2"]);
    assert_eq!(identity(&a), manifests.0);

    // A ConfigMap outside the Role's resourceNames: the permission is named.
    let not_granted = api_catalog("salut", None).replace(SUBSTITUTE_CM, "not-granted");
    kube.apply_config_map(catalog_config_map(&not_granted));
    let line = wait_refusal(&daemon, &format!("ConfigMap {ns}/not-granted"));
    assert!(line.contains("resourceNames"), "{line}");
    on_catalog("not-granted: cannot be read: permission denied");
    assert!(a.exists() && b.exists());
    assert_eq!(catalog_in_use(&daemon), third);
    assert!(daemon.stop().success());
}

/// The catalog ConfigMap deleted while the daemon runs: the catalog in use
/// keeps serving, nothing is rewritten or removed, one line says why; the
/// ConfigMap created again is applied.
#[test]
fn the_catalog_config_map_deleted_keeps_the_catalog_in_use_until_it_is_back() {
    let server = shared_server();
    let (t, daemon) = api_catalog_started(server);
    let (kube, ns) = (&t.kube, &t.ns);
    let (a, b) = (t.s.manifests.join("a.yaml"), t.s.manifests.join("b.yaml"));
    let in_use = catalog_in_use(&daemon);
    let manifests = (identity(&a), identity(&b));

    kube.delete_config_map(CATALOG_CM);
    let says = format!(
        "daemon.catalog.configMap: ConfigMap {ns}/{CATALOG_CM} does not exist: create it (its key catalog.yaml holds plugins and chain)"
    );
    let line = wait_refusal(&daemon, &says);
    assert_eq!(
        line.matches(" does not exist").count(),
        1,
        "one line: {line}"
    );
    assert!(line.contains("the one in use keeps serving"), "{line}");
    assert!(
        daemon.metric("podstamp_config_reloads_total{result=\"refused\"}") >= 1.0,
        "the refusal is counted"
    );
    assert_eq!(catalog_in_use(&daemon), in_use, "the catalog in use serves");
    assert_eq!(
        (identity(&a), identity(&b)),
        manifests,
        "nothing rewritten or removed"
    );
    // It still renders what changes meanwhile, with its plugins.
    kube.patch_template(
        "a",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "a:2"}]}}}),
    );
    wait_content(&daemon, &a, &["image: a:2", "--say=hello", "ZONE"]);
    assert_eq!(identity(&b), manifests.1, "b did not change");

    // Created again, with other settings: applied.
    kube.apply_config_map(catalog_config_map(&api_catalog("again", None)));
    wait_content(&daemon, &a, &["image: a:2", "--say=again"]);
    wait_reloads(&daemon, "applied", 2);
    assert_ne!(catalog_in_use(&daemon), in_use);
    assert_eq!(identity(&b), manifests.1, "b's chain did not change");
    assert!(daemon.stop().success());
}

#[test]
fn with_the_api_down_at_start_the_daemon_runs_the_remembered_catalog() {
    let state = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(&state.path().join("apiserver"));
    let t = api_catalog_setup(&server);
    let kubeconfig = server.kubeconfig("podstamp");
    let cache = state.path().join("cache");
    let start = |cache: &Path, name: &str| {
        Daemon::start(
            &[
                "--config",
                t.s.config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &t.ns,
                "--rollout-namespace",
                &t.ns,
                "--node-name",
                &t.node,
                "--manifest-dir",
                t.s.manifests.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            state.path().join(format!("{name}.log")),
        )
    };
    let a = t.s.manifests.join("a.yaml");
    let daemon = start(&cache, "first");
    wait_content(&daemon, &a, &["--say=hello"]);
    wait_reloads(&daemon, "applied", 1);
    let digest = catalog_in_use(&daemon);
    assert!(daemon.stop().success());
    let kept = identity(&a);

    // The API server is down: the daemon runs the remembered catalog.
    server.kill();
    let daemon = start(&cache, "from-disk");
    wait_for("the catalog from disk", CONVERGE, || {
        daemon.assert_running();
        daemon.logs().contains("running from disk").then_some(())
    });
    assert_eq!(catalog_in_use(&daemon), digest);
    let logs = daemon.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("running from disk"))
        .unwrap();
    assert!(line.contains(&digest), "{line}");
    assert_eq!(identity(&a), kept, "the manifest is kept");

    // Without a record (another cache), nothing renders; the manifest stays.
    let empty = start(&state.path().join("empty-cache"), "no-record");
    let line = wait_refusal(&empty, "no catalog from ConfigMap");
    assert!(
        line.contains("nothing is rendered (manifests on disk are kept)"),
        "{line}"
    );
    assert_eq!(identity(&a), kept);
    assert_eq!(empty.get("/readyz").unwrap().0, 503);
    drop(empty);

    // A pinned component not in the code cache: nothing renders either.
    let pin = sha256_hex(&fs::read(common::plugin("substitute")).unwrap());
    let mut removed = 0;
    for entry in fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&pin)
        {
            fs::remove_file(path).unwrap();
            removed += 1;
        }
    }
    assert_eq!(removed, 1, "substitute's compiled code was in the cache");
    let uncached = start(&cache, "not-cached");
    let line = wait_refusal(
        &uncached,
        &format!("the compiled-code cache has no component with sha256 {pin}"),
    );
    assert!(
        line.contains("plugins.substitute")
            && line.contains("nothing is rendered (manifests on disk are kept)"),
        "{line}"
    );
    assert_eq!(identity(&a), kept);
    drop(uncached);

    // Back: the API's catalog is used, and its changes flow.
    server = ApiServer::start(&state.path().join("apiserver"));
    daemon.wait_ready(CONVERGE);
    let kube = Kube::new(&server.kubeconfig("admin"), &t.ns);
    kube.apply_config_map(catalog_config_map(&api_catalog("back", None)));
    wait_content(&daemon, &a, &["--say=back"]);
    assert_ne!(catalog_in_use(&daemon), digest);
    assert!(daemon.stop().success());
}

/// Each node of template `name` in a status view, with its phase.
fn status_nodes(view: &Value, ns: &str, name: &str) -> Vec<(String, String)> {
    let id = format!("{ns}/{name}");
    view["templates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["template"] == id.as_str())
        .flat_map(|t| t["nodes"].as_array().cloned().unwrap_or_default())
        .map(|n| {
            (
                n["node"].as_str().unwrap_or_default().to_string(),
                n["phase"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Issue 27, Deliver 0: two daemons on nodes with different labels; a
/// template with `podstamp.io/node-selector` is written on the node it
/// selects only; relabelled, the node that leaves removes it and the one
/// that joins installs it; a bad selector is an `InvalidTemplate` Event
/// and nothing is written; `podstamp status` counts the selected nodes and
/// lists one that never reported (no daemon there) as pending.
#[test]
fn a_template_is_written_only_on_the_nodes_its_node_selector_selects() {
    let server = shared_server();
    let ns = unique("target");
    let kube = Kube::admin(server, &ns);
    let s = setup();
    // Labels of this test's own: the shared server has other tests' nodes.
    let scene = "test.podstamp.io/scene";
    let labels = |role: Option<&str>| {
        let mut labels = json!({"zone": "zone-a", scene: ns});
        if let Some(role) = role {
            labels["role"] = json!(role);
        }
        labels
    };
    let (cp, worker, silent) = (unique("cp"), unique("worker"), unique("silent"));
    for (name, role) in [(&cp, Some("cp")), (&worker, None), (&silent, Some("cp"))] {
        kube.create_cluster::<Node>(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels(role)}}));
    }
    let with_selector = |name: &str, selector: &str| {
        let mut t = template(name, &format!("{name}:1"));
        t["metadata"]["annotations"] = json!({"podstamp.io/node-selector": selector});
        t
    };
    let selector = format!("{scene}={ns},role in (cp)");
    kube.create::<PodTemplate>(with_selector("api", &selector));
    kube.create::<PodTemplate>(template("all", "all:1"));
    let dir_of = |name: &str| {
        let dir = s.tmp.path().join(format!("manifests-{name}"));
        fs::create_dir(&dir).unwrap();
        dir
    };
    let (cp_dir, worker_dir) = (dir_of(&cp), dir_of(&worker));
    let kubeconfig = server.kubeconfig("admin");
    let cp_daemon = start_daemon(&s, &kubeconfig, &ns, &cp, &cp_dir);
    let worker_daemon = start_daemon(&s, &kubeconfig, &ns, &worker, &worker_dir);
    wait_content(&cp_daemon, &cp_dir.join("api.yaml"), &["image: api:1"]);
    wait_content(&cp_daemon, &cp_dir.join("all.yaml"), &["image: all:1"]);
    wait_content(
        &worker_daemon,
        &worker_dir.join("all.yaml"),
        &["image: all:1"],
    );
    worker_daemon.wait_ready(CONVERGE);
    // Both templates are rendered in the worker's first pass: `all` is
    // there, so `api` was judged, and not written.
    assert!(!worker_dir.join("api.yaml").exists());
    assert!(
        worker_daemon.logs().contains("not for this node"),
        "{}",
        worker_daemon.logs()
    );
    kubelet_accepts(&[&cp_dir, &worker_dir], &cp);

    // Status: the selected nodes only; the one without a daemon pending.
    let view = wait_for("api reported by the control-plane node", CONVERGE, || {
        let view = status_json(server, &ns, &ns);
        status_nodes(&view, &ns, "api")
            .iter()
            .any(|(n, _)| n == &cp)
            .then_some(view)
    });
    let mut nodes = status_nodes(&view, &ns, "api");
    nodes.retain(|(n, _)| n != &cp);
    assert_eq!(nodes, [(silent.clone(), "pending".to_string())], "{view:#}");
    let api = view["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["template"] == format!("{ns}/api").as_str())
        .unwrap();
    assert_eq!(
        (&api["updated"], &api["pending"]),
        (&json!(1), &json!(1)),
        "{view:#}"
    );
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_podstamp"))
        .args([
            "status",
            "api",
            "-n",
            &ns,
            "--rollout-namespace",
            &ns,
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("1/2") && table.contains(&silent) && table.contains("never reported"),
        "{table}"
    );

    // A bad selector: an Event naming the annotation, nothing written.
    kube.create::<PodTemplate>(with_selector("bad", "role in (cp"));
    let event = wait_for("the InvalidTemplate Event", CONVERGE, || {
        kube.events().into_iter().find(|e| {
            e.reason.as_deref() == Some("InvalidTemplate")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad")
        })
    });
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(
            "metadata.annotations.podstamp.io/node-selector: \"role in (cp\" at character 12"
        ) && note.contains("give a label selector as kubectl takes it"),
        "{note}"
    );
    assert!(!cp_dir.join("bad.yaml").exists() && !worker_dir.join("bad.yaml").exists());

    // Relabelled: the worker joins, the control-plane node leaves.
    kube.patch_node(&worker, json!({"metadata": {"labels": {"role": "cp"}}}));
    wait_content(
        &worker_daemon,
        &worker_dir.join("api.yaml"),
        &["image: api:1"],
    );
    let kept = identity(&cp_dir.join("all.yaml"));
    kube.patch_node(&cp, json!({"metadata": {"labels": {"role": null}}}));
    wait_gone(&cp_daemon, &cp_dir.join("api.yaml"));
    assert_eq!(
        identity(&cp_dir.join("all.yaml")),
        kept,
        "the rest untouched"
    );
    assert!(cp_daemon.logs().contains("not for this node"));
    // Its record of the template goes with it; the joiner's comes.
    let view = wait_for("status after the relabel", CONVERGE, || {
        let view = status_json(server, &ns, &ns);
        let mut nodes: Vec<String> = status_nodes(&view, &ns, "api")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        nodes.sort();
        let mut want = vec![worker.clone(), silent.clone()];
        want.sort();
        (nodes == want).then_some(view)
    });
    assert_eq!(
        status_nodes(&view, &ns, "api")
            .iter()
            .filter(|(_, p)| p == "pending")
            .count(),
        1,
        "{view:#}"
    );
    kubelet_accepts(&[&worker_dir], &worker);
}

/// The Node watch down (the API server gone): the manifests of templates
/// for this node stay, and the daemon says its labels as last seen decide.
#[test]
fn the_node_watch_down_keeps_what_the_selector_wrote_and_says_so() {
    let state = tempfile::tempdir().unwrap();
    let mut server = ApiServer::start(&state.path().join("apiserver"));
    let ns = unique("nodewatch");
    let node_name = unique("node");
    let s = setup();
    let kube = Kube::admin(&server, &ns);
    kube.create_cluster::<Node>(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name, "labels": {"zone": "zone-a", "role": "cp"}}}));
    let mut api = template("api", "api:1");
    api["metadata"]["annotations"] = json!({"podstamp.io/node-selector": "role=cp"});
    kube.create::<PodTemplate>(api);
    let daemon = start_daemon(
        &s,
        &server.kubeconfig("admin"),
        &ns,
        &node_name,
        &s.manifests,
    );
    let file = s.manifests.join("api.yaml");
    wait_content(&daemon, &file, &["image: api:1"]);
    daemon.wait_ready(CONVERGE);
    let before = identity(&file);
    drop(kube);
    server.kill();
    let says = "the Node cannot be watched: its labels as last seen decide which templates are for this node";
    wait_for("the Node watch down, said", CONVERGE, || {
        daemon.assert_running();
        daemon.logs().contains(says).then_some(())
    });
    assert!(daemon.metric("podstamp_watch_restarts_total{watch=\"node\"}") >= 1.0);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(identity(&file), before, "kept as it was");
    daemon.assert_running();
}

/// Labels the Namespace `ns` with Pod Security level `level` (enforce).
fn label_level(kube: &Kube, ns: &str, level: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(kube.client.clone());
    let patch = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}});
    kube.rt
        .block_on(api.patch(ns, &PatchParams::default(), &Patch::Merge(patch)))
        .unwrap();
}

/// The deploy/ RBAC reads the daemon's one Namespace, by name: a list or
/// watch of Namespaces is allowed only with the field selector on that
/// name (the API server authorizes it against resourceNames), a list of
/// all of them and a read of another are refused. Under it, the daemon
/// holds every rendered pod to the level the Namespace's label enforces: a
/// template whose plugin chain's output is baseline but not restricted,
/// in a Namespace labelled `enforce: restricted`, is refused in one line
/// naming the label, its last good manifest stays, and an Event is on the
/// template; relabelled `baseline`, it is written without any edit of the
/// template.
#[test]
fn the_namespace_label_holds_every_render_to_its_pod_security_level() {
    use k8s_openapi::api::core::v1::Namespace;
    let server = shared_server();
    let (kube, ns, node_name) = deployed_namespace(server, "psa", "zone-p");

    // The narrowest rule: only with the name's field selector.
    let podstamp = kube.rt.block_on(client(&server.kubeconfig("podstamp")));
    let namespaces: Api<Namespace> = Api::all(podstamp);
    let by_name = ListParams::default().fields(&format!("metadata.name={ns}"));
    let listed = kube.rt.block_on(namespaces.list(&by_name)).unwrap();
    assert_eq!(listed.items.len(), 1);
    let forbidden = |result: Result<_, kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{what}: {status:?}"),
        other => panic!("{what} is not refused: {other:?}"),
    };
    forbidden(
        kube.rt
            .block_on(namespaces.list(&ListParams::default()))
            .map(drop),
        "a list of every Namespace",
    );
    forbidden(
        kube.rt.block_on(namespaces.get("default")).map(drop),
        "a read of another Namespace",
    );
    forbidden(
        kube.rt
            .block_on(namespaces.list(&ListParams::default().fields("metadata.name=default")))
            .map(drop),
        "a list of another Namespace by name",
    );

    let mut web = template("web", "busybox:1");
    web["template"]["spec"]["containers"][0]["command"] = json!(["serve", "--node=${node.name}"]);
    kube.create::<PodTemplate>(web);
    let s = setup();
    let daemon = start_daemon(
        &s,
        &server.kubeconfig("podstamp"),
        &ns,
        &node_name,
        &s.manifests,
    );
    let file = s.manifests.join("web.yaml");
    let good = wait_content(&daemon, &file, &["image: busybox:1", &node_name]);
    daemon.wait_ready(CONVERGE);
    let good_identity = identity(&file);
    assert!(daemon.metric("podstamp_watch_lists_total{watch=\"namespace\"}") >= 1.0);

    // Restricted: the next render (a new image) is refused.
    label_level(&kube, &ns, "restricted");
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2",
            "command": ["serve", "--node=${node.name}"]}]}}}),
    );
    let source = format!(
        "does not meet Pod Security level restricted:latest (from the namespace {ns}'s label pod-security.kubernetes.io/enforce)"
    );
    let event = wait_for("a RenderFailed Event naming the level", CONVERGE, || {
        kube.events().into_iter().find(|e| {
            e.reason.as_deref() == Some("RenderFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                && e.note.as_deref().is_some_and(|n| n.contains(&source))
        })
    });
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("the pod returned by the plugin chain") && note.contains("runAsNonRoot"),
        "{note}"
    );
    let line = daemon
        .logs()
        .lines()
        .find(|l| l.contains(&source))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no log line says {source:?}:\n{}", daemon.logs()));
    assert!(line.contains("the last good manifest stays"), "{line}");
    assert_eq!(read(&file).unwrap(), good, "the last good manifest stays");
    assert_eq!(identity(&file), good_identity);

    // Baseline again: written, with no edit of the template.
    label_level(&kube, &ns, "baseline");
    wait_content(&daemon, &file, &["image: busybox:2"]);
    assert!(daemon.stop().success());

    // The same rules without the Namespace's: nothing renders (no pod is
    // written at a level looser than the label's for want of reading it),
    // and the log names the permission.
    let ns2 = unique("psa-noread");
    let kube2 = Kube::admin(server, &ns2);
    let mut cluster_rules = deploy_rules("ClusterRole");
    cluster_rules.as_array_mut().unwrap().retain(|rule| {
        !rule["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("namespaces"))
    });
    bind(server, &kube2, &ns2, deploy_rules("Role"), cluster_rules);
    kube2.create::<PodTemplate>(template("web", "busybox:1"));
    let s2 = setup();
    let daemon = start_daemon(
        &s2,
        &server.kubeconfig("podstamp"),
        &ns2,
        &node_name,
        &s2.manifests,
    );
    wait_for("the unread Namespace in the log", CONVERGE, || {
        daemon.assert_running();
        let logs = daemon.logs();
        (logs.contains("nothing is rendered until its Pod Security labels")
            && logs.contains("not rendering (manifests on disk are kept)"))
        .then_some(())
    });
    assert!(
        daemon
            .logs()
            .contains("cannot list resource \"namespaces\""),
        "{}",
        daemon.logs()
    );
    assert!(!s2.manifests.join("web.yaml").exists());
}

/// The Namespace watch failing after its first read: the labels last read
/// stay in force. The namespace is labelled restricted and read; then the
/// daemon's permission to read it is taken away (the ClusterRole loses its
/// Namespace rule, so the watch, renewed every 2 s, is refused). A template
/// changed after that is still held to restricted (refused: at the
/// configured baseline it would be written), and the failure is counted.
#[test]
fn a_namespace_watch_that_fails_after_its_first_read_keeps_the_last_level() {
    let server = shared_server();
    let (kube, ns, node_name) = deployed_namespace(server, "psa-lost", "zone-l");
    label_level(&kube, &ns, "restricted");
    kube.create::<PodTemplate>(template("web", "busybox:1"));
    let s = setup();
    let log = s.tmp.path().join(format!("podstamp-{}.log", unique("log")));
    let daemon = Daemon::start(
        &[
            "--config",
            s.config.to_str().unwrap(),
            "--kubeconfig",
            server.kubeconfig("podstamp").to_str().unwrap(),
            "--namespace",
            &ns,
            "--rollout-namespace",
            &ns,
            "--node-name",
            &node_name,
            "--manifest-dir",
            s.manifests.to_str().unwrap(),
            "--watch-timeout",
            "2s",
        ],
        log,
    );
    let source = format!(
        "does not meet Pod Security level restricted:latest (from the namespace {ns}'s label pod-security.kubernetes.io/enforce)"
    );
    let refusals = |daemon: &Daemon| {
        daemon
            .logs()
            .lines()
            .filter(|l| l.contains(&source) && l.contains("the last good manifest stays"))
            .count()
    };
    wait_for("the first render refused at restricted", CONVERGE, || {
        daemon.assert_running();
        (refusals(&daemon) >= 1).then_some(())
    });

    // The Namespace rule taken away: the next watch renewal is refused.
    let mut cluster_rules = common::for_namespace(deploy_rules("ClusterRole"), &ns);
    cluster_rules.as_array_mut().unwrap().retain(|rule| {
        !rule["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("namespaces"))
    });
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(kube.client.clone());
    kube.rt
        .block_on(roles.patch(
            &format!("podstamp-{ns}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": cluster_rules})),
        ))
        .unwrap();
    wait_for("the Namespace watch failing", CONVERGE, || {
        daemon.assert_running();
        (daemon.metric("podstamp_watch_restarts_total{watch=\"namespace\"}") >= 1.0).then_some(())
    });

    // A change after the failure (a container `changed` merged in, so that
    // its refusal is a new line, not the same one again): still held to
    // restricted, not written.
    let before = refusals(&daemon);
    kube.patch_template(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "changed", "image": "busybox:2"}]}}}),
    );
    let deadline = std::time::Instant::now() + CONVERGE;
    while refusals(&daemon) <= before {
        daemon.assert_running();
        assert!(
            std::time::Instant::now() < deadline,
            "the changed template was not refused again:\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!s.manifests.join("web.yaml").exists());
    let logs = daemon.logs();
    assert!(
        logs.lines()
            .rfind(|l| l.contains(&source))
            .is_some_and(|l| l.contains("\"changed\"")),
        "the last refusal is not the changed template's:\n{logs}"
    );
    // Reported: the watch's refusal, and that the last labels hold.
    assert!(
        logs.contains("its Pod Security labels as last read hold until it is watched again"),
        "{logs}"
    );
    assert!(daemon.stop().success());
}
