//! One compromised node can only speak for itself: deploy/'s RBAC and
//! admission policies (deploy/node-identity.yaml) against the harness's
//! real kube-apiserver, with ServiceAccount tokens bound to two Nodes, as
//! an attacker holding node A's token would try them; and the daemon's
//! start-up refusal of a rollout namespace shared with the control plane.
//!
//! Every test applies its own copy of deploy/ (tests/common/deploy.rs: the
//! files' rules and CEL, the test's namespaces) and waits until the grants
//! and the policy are in effect before its first request.
//!
//! Needs `bash tests/harness/build.sh` (and `bash plugins/build.sh` for the
//! daemon tests) first.

mod common;
#[path = "daemon/support.rs"]
mod support;

use std::time::Duration;

use common::deploy::Deploy;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PodTemplate};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use support::*;

const CONVERGE: Duration = Duration::from_secs(30);

/// A namespace with deploy/ applied for it, and two Nodes.
struct Cluster {
    kube: Kube,
    deploy: Deploy,
    a: String,
    b: String,
}

fn cluster(server: &ApiServer, prefix: &str) -> Cluster {
    let ns = unique(prefix);
    let kube = Kube::admin(server, &ns);
    let (a, b) = (unique("node-a"), unique("node-b"));
    let nodes: Api<Node> = Api::all(kube.client.clone());
    for name in [&a, &b] {
        let node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"zone": "z1"}}}))
                .unwrap();
        kube.rt
            .block_on(nodes.create(&PostParams::default(), &node))
            .unwrap();
    }
    let deploy = Deploy::new(&server.kubeconfig("admin"), &ns, &format!("{ns}-rollouts"));
    kube.rt.block_on(deploy.apply(&kube.client, &a));
    Cluster { kube, deploy, a, b }
}

impl Cluster {
    /// A client with node `node`'s token.
    fn as_node(&self, node: &str) -> kube::Client {
        let token = self
            .kube
            .rt
            .block_on(self.deploy.token(&self.kube.client, node));
        self.kube.rt.block_on(self.deploy.client(&token))
    }

    fn leases(&self, client: &kube::Client) -> Api<Lease> {
        Api::namespaced(client.clone(), &self.deploy.rollouts)
    }

    fn create(&self, client: &kube::Client, lease: Value) -> Result<Lease, kube::Error> {
        let lease: Lease = serde_json::from_value(lease).unwrap();
        self.kube
            .rt
            .block_on(self.leases(client).create(&PostParams::default(), &lease))
    }

    /// Replaces the Lease as it is now (its resourceVersion) after `change`.
    fn replace(
        &self,
        client: &kube::Client,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Lease, kube::Error> {
        let admin = self.leases(&self.kube.client);
        let now = self.kube.rt.block_on(admin.get(name)).unwrap();
        let mut value = serde_json::to_value(now).unwrap();
        change(&mut value);
        let lease: Lease = serde_json::from_value(value).unwrap();
        self.kube.rt.block_on(
            self.leases(client)
                .replace(name, &PostParams::default(), &lease),
        )
    }
}

/// A node status record as the daemon writes it (host/src/daemon/
/// coordinator.rs, `status_lease`).
fn record(name: &str, holder: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"podstamp.io/lease": "node-status",
            "app.kubernetes.io/managed-by": "podstamp"},
            "annotations": {"podstamp.io/status": "{\"version\":1,\"templates\":{}}"}},
        "spec": {"holderIdentity": holder}
    })
}

/// A halt marker as the daemon writes it (`halt_lease`): target t1 of
/// ns/web failed on `holder`.
fn halt(name: &str, holder: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"podstamp.io/lease": "halt",
            "podstamp.io/lane": "halt", "app.kubernetes.io/managed-by": "podstamp"},
            "annotations": {"podstamp.io/template": "ns/web", "podstamp.io/target": "t1",
                "podstamp.io/failure": "{\"target\":\"t1\",\"reason\":\"CrashLoopBackOff\"}"}},
        "spec": {"holderIdentity": holder}
    })
}

/// A slot as the daemon writes it (`slot_lease`).
fn slot(name: &str, holder: Option<&str>, seconds: i32) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"podstamp.io/lease": "slot",
            "app.kubernetes.io/managed-by": "podstamp"},
            "annotations": {"podstamp.io/template": "ns/web", "podstamp.io/target": "t1"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds, "leaseTransitions": 0}
    })
}

/// The policy's refusal of a write, with the words expected in it.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, words: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("podstamp-node-leases")
                    || status.message.contains("podstamp-node-events"),
                "refused, but not by the policy: {status:?}"
            );
            assert!(
                status.message.contains(words),
                "refused without saying {words:?}: {}",
                status.message
            );
        }
        other => panic!("not refused ({words}): {other:?}"),
    }
}

#[track_caller]
fn written<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> T {
    result.unwrap_or_else(|e| panic!("a legitimate write refused: {e}"))
}

#[test]
fn a_node_writes_its_own_status_record_and_nothing_of_another_nodes() {
    let server = shared_server();
    let c = cluster(server, "idrec");
    let (a, b) = (c.as_node(&c.a), c.as_node(&c.b));

    // The token carries its node: the API server says so to its user.
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review: SelfSubjectReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}))
    .unwrap();
    let me = c
        .kube
        .rt
        .block_on(Api::<SelfSubjectReview>::all(a.clone()).create(&PostParams::default(), &review))
        .unwrap();
    let user = me.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some(c.deploy.user().as_str()));
    assert_eq!(
        user.extra.unwrap()["authentication.kubernetes.io/node-name"],
        vec![c.a.clone()]
    );

    let (mine, theirs) = (
        format!("podstamp-node.{}", c.a),
        format!("podstamp-node.{}", c.b),
    );
    // Its own record: created and updated.
    written(c.create(&a, record(&mine, &c.a)));
    written(c.replace(&a, &mine, |l| {
        l["metadata"]["annotations"]["podstamp.io/status"] =
            json!("{\"version\":1,\"templates\":{\"ns/web\":{\"phase\":\"ready\"}}}");
    }));
    written(c.create(&b, record(&theirs, &c.b)));

    // Another node's record: not created, not replaced, not relabelled,
    // not taken over.
    refused(
        c.create(
            &a,
            record(&format!("podstamp-node.{}", unique("node-c")), &c.a),
        ),
        "may write only its own status record",
    );
    refused(
        c.replace(&a, &theirs, |l| {
            l["metadata"]["annotations"]["podstamp.io/status"] = json!("{\"version\":1,\"templates\":{\"ns/web\":{\"phase\":\"failed\",\"failed\":{\"target\":\"t1\"}}}}");
        }),
        &format!("refused Lease {theirs} with holderIdentity \"{}\"", c.b),
    );
    refused(
        c.replace(&a, &theirs, |l| l["spec"]["holderIdentity"] = json!(c.a)),
        "may write only its own status record",
    );
    refused(
        c.replace(&a, &theirs, |l| {
            l["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove("podstamp.io/lease");
        }),
        "must be labelled podstamp.io/lease=slot, podstamp.io/lease=node-status or podstamp.io/lease=halt",
    );
    refused(
        c.replace(&a, &theirs, |l| {
            l["metadata"]["labels"]["podstamp.io/lease"] = json!("slot");
        }),
        "may set the holderIdentity of a slot",
    );
    // Its own record, with a holder or a label that is not its own.
    refused(
        c.replace(&a, &mine, |l| l["spec"]["holderIdentity"] = json!(c.b)),
        "may write only its own status record",
    );
    refused(
        c.replace(&a, &mine, |l| {
            l["metadata"]["labels"]["podstamp.io/node"] = json!(c.b);
        }),
        "may set only podstamp.io/lease, podstamp.io/lane and app.kubernetes.io/managed-by=podstamp",
    );
    // A Lease that is not podstamp's, and a name another node's record
    // would need: neither is created.
    let mut unlabelled = record("anything", &c.a);
    unlabelled["metadata"]["labels"] = json!({});
    refused(
        c.create(&a, unlabelled),
        "must be labelled podstamp.io/lease",
    );
    refused(
        c.create(
            &a,
            slot(
                &format!("podstamp-node.{}", unique("node-d")),
                Some(&c.a),
                30,
            ),
        ),
        "may set the holderIdentity of a slot (podstamp-slot.*) only to itself",
    );

    // No delete (RBAC grants none), and no Lease write in the namespace
    // podstamp runs in (kube-system's stand-in).
    let deleted = c
        .kube
        .rt
        .block_on(c.leases(&a).delete(&mine, &DeleteParams::default()));
    assert!(
        matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403),
        "{deleted:?}"
    );
    let elsewhere: Api<Lease> = Api::namespaced(a.clone(), &c.deploy.namespace);
    let created = c.kube.rt.block_on(elsewhere.create(
        &PostParams::default(),
        &serde_json::from_value(record(&mine, &c.a)).unwrap(),
    ));
    assert!(
        matches!(&created, Err(kube::Error::Api(s)) if s.code == 403),
        "a Lease written in {}: {created:?}",
        c.deploy.namespace
    );

    // A token of podstamp's ServiceAccount that names no node writes
    // nothing.
    let token = c.kube.rt.block_on(c.deploy.unbound_token(&c.kube.client));
    let unbound = c.kube.rt.block_on(c.deploy.client(&token));
    refused(
        c.replace(&unbound, &mine, |_| {}),
        "this token names no node",
    );
}

#[test]
fn a_node_writes_its_own_halt_markers_and_none_in_another_nodes_name() {
    let server = shared_server();
    let c = cluster(server, "idhalt");
    let a = c.as_node(&c.a);
    let (mine, theirs) = (
        format!("podstamp-halt.{}.ns.web", c.a),
        format!("podstamp-halt.{}.ns.web", c.b),
    );
    // Its own: created, and updated for another failed target.
    written(c.create(&a, halt(&mine, &c.a)));
    written(c.replace(&a, &mine, |l| {
        l["metadata"]["annotations"]["podstamp.io/target"] = json!("t2");
    }));
    // In another node's name, or its own name held by another: refused;
    // so is one held by another under its own name.
    refused(
        c.create(&a, halt(&theirs, &c.a)),
        "may write only its own halt markers",
    );
    refused(
        c.create(&a, halt(&theirs, &c.b)),
        "may write only its own halt markers",
    );
    refused(
        c.replace(&a, &mine, |l| l["spec"]["holderIdentity"] = json!(c.b)),
        "may write only its own halt markers",
    );
    // Written by someone the policy does not hold (the admin here): the
    // daemons' own reading ignores it (fleet::trust::halt_owner, the same
    // rule), so it halts nothing; host/src/daemon/coordinator/ledger.rs
    // tests that reading.
    written(c.create(&c.kube.client, halt(&theirs, &c.a)));
}

#[test]
fn a_node_takes_and_frees_slots_for_itself_only_within_the_duration_limit() {
    let server = shared_server();
    let c = cluster(server, "idslot");
    let (a, b) = (c.as_node(&c.a), c.as_node(&c.b));
    let name = "podstamp-slot.ns.web.0";

    // A slot taken for another node: refused.
    refused(
        c.create(&a, slot(name, Some(&c.b), 30)),
        &format!("refused Lease {name}, holderIdentity \"\" -> \"{}\"", c.b),
    );
    // Taken, renewed, its duration at the limit and not over it, freed.
    written(c.create(&a, slot(name, Some(&c.a), 30)));
    written(c.replace(&a, name, |l| {
        l["spec"]["renewTime"] = json!("2026-12-06T00:00:00.000000Z")
    }));
    written(c.replace(&a, name, |l| l["spec"]["leaseDurationSeconds"] = json!(300)));
    refused(
        c.replace(&a, name, |l| l["spec"]["leaseDurationSeconds"] = json!(301)),
        "leaseDurationSeconds 301 is over 300",
    );
    refused(
        c.replace(&a, name, |l| {
            l["spec"]["leaseDurationSeconds"] = json!(i32::MAX)
        }),
        "is over 300",
    );
    written(c.replace(&a, name, |l| l["spec"]["holderIdentity"] = Value::Null));

    // Freed, it goes to one of two takers: both write against the version
    // they read, the API server lets one through and refuses the other
    // (409), as the policy lets each take it for itself.
    let admin = c.leases(&c.kube.client);
    let free = c.kube.rt.block_on(admin.get(name)).unwrap();
    let take = |client: &kube::Client, node: &str| {
        let mut lease = free.clone();
        lease.spec.as_mut().unwrap().holder_identity = Some(node.to_string());
        c.kube.rt.block_on(
            c.leases(client)
                .replace(name, &PostParams::default(), &lease),
        )
    };
    let first = take(&b, &c.b);
    let second = take(&a, &c.a);
    written(first);
    assert!(
        matches!(&second, Err(kube::Error::Api(s)) if s.code == 409),
        "two holders of one slot: {second:?}"
    );

    // B holds it: A can neither free it for B nor hand it to a third node.
    refused(
        c.replace(&a, name, |l| l["spec"]["holderIdentity"] = Value::Null),
        &format!("holderIdentity \"{}\" -> \"\"", c.b),
    );
    refused(
        c.replace(&a, name, |l| l["spec"]["holderIdentity"] = json!("node-c")),
        "only to itself",
    );
    // What the policy cannot judge is time (CEL has no clock): A may take
    // the slot over, as a node takes an expired one; whether it had
    // expired is for the readers to judge, by their own duration.
    written(c.replace(&a, name, |l| l["spec"]["holderIdentity"] = json!(c.a)));

    // A node taken out of the cluster: its bound tokens die with its Node.
    let nodes: Api<Node> = Api::all(c.kube.client.clone());
    c.kube
        .rt
        .block_on(nodes.delete(&c.b, &DeleteParams::default()))
        .unwrap();
    wait_for("node B's token refused", CONVERGE, || {
        match c.kube.rt.block_on(c.leases(&b).get(name)) {
            Err(kube::Error::Api(s)) if s.code == 401 => Some(()),
            _ => None,
        }
    });
}

/// An Event written as the daemon's recorder writes it (host/src/daemon/
/// events.rs): reported by podstamp from node `from`, about `regarding`.
fn event(name: &str, namespace: &str, from: &str, regarding: Value) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "eventTime": "2026-12-06T00:00:00.000000Z",
        "reportingController": "podstamp.io/podstamp",
        "reportingInstance": format!("podstamp-{from}"),
        "action": "Render", "reason": "RenderFailed", "type": "Warning",
        "note": "test", "regarding": regarding
    }))
    .unwrap()
}

#[test]
fn a_node_reports_events_as_itself_only() {
    let server = shared_server();
    let c = cluster(server, "idevt");
    let (a, b) = (c.as_node(&c.a), c.as_node(&c.b));
    let ns = c.deploy.namespace.clone();
    let template =
        json!({"kind": "PodTemplate", "apiVersion": "v1", "namespace": ns, "name": "web"});
    let events = |client: &kube::Client, namespace: &str| -> Api<Event> {
        Api::namespaced(client.clone(), namespace)
    };
    let create = |client: &kube::Client, e: Event| {
        let namespace = e.metadata.namespace.clone().unwrap();
        c.kube
            .rt
            .block_on(events(client, &namespace).create(&PostParams::default(), &e))
    };
    // As itself, about a template and about its own Node (in default).
    written(create(&a, event("web.a1", &ns, &c.a, template.clone())));
    let own_node = json!({"kind": "Node", "apiVersion": "v1", "name": c.a});
    let on_node = format!("{}.a2", c.a);
    written(create(&a, event(&on_node, "default", &c.a, own_node)));
    // A repeat patches its Event's series: its own, not another node's.
    let series = json!({"series": {"count": 2, "lastObservedTime": "2026-12-06T00:00:01.000000Z"}});
    let patch = |client: &kube::Client, namespace: &str, name: &str| {
        c.kube.rt.block_on(events(client, namespace).patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&series),
        ))
    };
    written(patch(&a, &ns, "web.a1"));
    written(create(&b, event("web.b1", &ns, &c.b, template.clone())));
    refused(patch(&a, &ns, "web.b1"), "may write only Events it reports");
    // Not as another node, nor about another node.
    refused(
        create(&a, event("web.a3", &ns, &c.b, template)),
        "may write only Events it reports",
    );
    let other_node = json!({"kind": "Node", "apiVersion": "v1", "name": c.b});
    refused(
        create(
            &a,
            event(&format!("{}.a4", c.b), "default", &c.a, other_node),
        ),
        "about PodTemplates, ConfigMaps and its own Node only",
    );
}

// ------------------------------------------------------------------ daemon

fn template_object() -> PodTemplate {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"podstamp.io/enabled": "true"}},
        "template": {"spec": {"containers": [{"name": "main", "image": "web:1"}]}}
    }))
    .unwrap()
}

/// A daemon whose token is bound to another node than the one it says it
/// is: its writes are refused by the policy, and it says so, naming the
/// Lease and the rule; what it renders is still written.
#[test]
fn a_daemon_speaking_for_another_node_is_refused_and_says_so() {
    let server = shared_server();
    let c = cluster(server, "iddaemon");
    c.kube
        .rt
        .block_on(
            c.kube
                .templates()
                .create(&PostParams::default(), &template_object()),
        )
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path());
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    // Node A's token, saying it is node B.
    let token = c.kube.rt.block_on(c.deploy.token(&c.kube.client, &c.a));
    let kubeconfig = tmp.path().join("a.kubeconfig");
    c.deploy.kubeconfig(&token, &kubeconfig);
    let daemon = Daemon::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &c.deploy.namespace,
            "--rollout-namespace",
            &c.deploy.rollouts,
            "--node-name",
            &c.b,
            "--manifest-dir",
            manifests.to_str().unwrap(),
        ],
        tmp.path().join("podstamp.log"),
    );
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the refusal in the log", CONVERGE, || {
            daemon.assert_running();
            daemon
                .logs()
                .lines()
                .find(|l| l.contains("cannot write a rollout Lease"))
                .map(str::to_string)
        })
    }));
    let line = found.unwrap_or_else(|_| panic!("no refusal; podstamp's log:\n{}", daemon.logs()));
    assert!(
        line.contains(&format!(
            "node {} may write only its own status record, Lease podstamp-node.{}",
            c.a, c.a
        )),
        "{line}"
    );
    assert!(line.contains("podstamp-node-leases"), "{line}");
    assert!(
        std::fs::read_to_string(manifests.join("web.yaml"))
            .unwrap()
            .contains("image: web:1"),
        "the first install is not held back"
    );
    assert!(
        daemon.metric("podstamp_rollout_api_writes_total{object=\"status\",result=\"error\"}")
            >= 1.0
    );
    let records = c
        .kube
        .rt
        .block_on(c.leases(&c.kube.client).list(&Default::default()))
        .unwrap();
    assert!(records.items.is_empty(), "{:?}", records.items);
}

/// A rollout namespace shared with the control plane is refused at start,
/// in one line naming it and the way out: by its name (kube-system), or by
/// a leader-election Lease of the control plane found in it; explicitly
/// allowed, it is said once and the daemon runs.
#[test]
fn a_rollout_namespace_shared_with_the_control_plane_is_refused_at_start() {
    let server = shared_server();
    let ns = unique("idshared");
    let kube = Kube::admin(server, &ns);
    let node = unique("node");
    let nodes: Api<Node> = Api::all(kube.client.clone());
    kube.rt
        .block_on(nodes.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": node}})).unwrap(),
        ))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path());
    let kubeconfig = server.kubeconfig("admin");
    let args = |rollouts: &str| -> Vec<String> {
        [
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &ns,
            "--rollout-namespace",
            rollouts,
            "--node-name",
            &node,
            "--manifest-dir",
            tmp.path().join("manifests").to_str().unwrap(),
        ]
        .map(str::to_string)
        .to_vec()
    };

    // By its name: refused before anything starts.
    let mut run = vec!["run".to_string()];
    run.extend(args("kube-system"));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = common::podstamp(&run);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "--rollout-namespace \"kube-system\": the control plane keeps its own Leases there"
        ),
        "{err}"
    );

    // By a leader-election Lease in it: refused once the daemon has looked.
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "kube-scheduler"},
        "spec": {"holderIdentity": "control-plane-1_0f1e2d", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    kube.rt
        .block_on(
            Api::<Lease>::namespaced(kube.client.clone(), &ns)
                .create(&PostParams::default(), &lease),
        )
        .unwrap();
    let shared = args(&ns);
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&shared, tmp.path().join("shared.log"));
    let status = daemon.exited_within(CONVERGE);
    let logs = daemon.logs();
    assert_eq!(status.code(), Some(2), "{logs}");
    let line = logs
        .lines()
        .find(|l| l.starts_with("podstamp: error:"))
        .unwrap_or_else(|| panic!("no error line:\n{logs}"));
    assert!(
        line.contains(&format!("{ns}: it holds Lease {ns}/kube-scheduler"))
            && line.contains("--allow-control-plane-namespace"),
        "{line}"
    );

    // Allowed: said once, and the daemon runs.
    let mut allowed = shared.clone();
    allowed.push("--allow-control-plane-namespace");
    let daemon = Daemon::start(&allowed, tmp.path().join("allowed.log"));
    daemon.wait_ready(CONVERGE);
    wait_for("the warning", CONVERGE, || {
        daemon.assert_running();
        daemon
            .logs()
            .contains("rollout Leases shared with the control plane, as allowed")
            .then_some(())
    });
}
