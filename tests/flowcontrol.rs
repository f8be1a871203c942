//! deploy/flowcontrol.yaml against a real kube-apiserver with API Priority
//! and Fairness on (issue 28 part 4): podstamp's requests — its rollout
//! Leases above all — run on a priority level of their own, not on
//! `leader-election` beside the control plane's own leader election (where
//! the default FlowSchema `system-leader-election` puts every Lease write
//! of a kube-system ServiceAccount, as this test first shows), and no other
//! ServiceAccount is moved there.
//!
//! The API server names the FlowSchema and the priority level that
//! classified each request in the response headers
//! `X-Kubernetes-PF-FlowSchema-UID` and `X-Kubernetes-PF-PriorityLevel-UID`;
//! its metric `apiserver_flowcontrol_dispatched_requests_total` counts
//! them.
//!
//! Needs kubectl on PATH and the Go harness (`bash tests/harness/build.sh`).

mod common;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::time::Duration;

use common::deploy::Deploy;
use common::{kubectl, run_ok};
use serde_json::{Value, json};
use support::{ApiServer, wait_for};

/// The uid of a cluster object of `resource` (a flowcontrol kind).
fn uid(kubeconfig: &std::path::Path, resource: &str, name: &str) -> String {
    run_ok(
        kubectl().arg("--kubeconfig").arg(kubeconfig).args([
            "get",
            resource,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ]),
        &format!("kubectl get {resource} {name}"),
    )
}

/// `method path` (with `body`) as `client`: the status and the FlowSchema
/// uid that classified it.
async fn classified(client: &kube::Client, method: &str, path: &str, body: Value) -> (u16, String) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let schema = response
        .headers()
        .get("X-Kubernetes-PF-FlowSchema-UID")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (response.status().as_u16(), schema)
}

#[test]
fn podstamps_requests_run_on_a_priority_level_of_their_own() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start_with(
        &tmp.path().join("apiserver"),
        &["--", "--enable-priority-and-fairness=true"],
    );
    let admin = server.kubeconfig("admin");
    let deploy_dir = common::repo().join("deploy");
    // deploy/ as it is, flowcontrol.yaml aside for now.
    for file in ["namespace.yaml", "rbac.yaml", "node-identity.yaml"] {
        run_ok(
            kubectl()
                .arg("--kubeconfig")
                .arg(&admin)
                .args(["apply", "-f"])
                .arg(deploy_dir.join(file)),
            &format!("kubectl apply -f deploy/{file}"),
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deploy = Deploy::new(&admin, "kube-system", "podstamp-rollouts");
    let (podstamp, other) = rt.block_on(async {
        let client = server.admin().await;
        common::deploy::create(
            &client,
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .await;
        let token = deploy.token(&client, "n1").await;
        // Another ServiceAccount of kube-system, as the controllers have.
        common::deploy::create(
            &client,
            &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "other", "namespace": "kube-system"}}),
        )
        .await;
        let other = deploy.account_token(&client, "other").await;
        (deploy.client(&token).await, deploy.client(&other).await)
    });
    let leases = "/apis/coordination.k8s.io/v1/namespaces/podstamp-rollouts/leases";
    let record = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "podstamp-node.n1",
            "labels": {"podstamp.io/lease": "node-status", "app.kubernetes.io/managed-by": "podstamp"}},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 30}});

    // Without deploy/flowcontrol.yaml: podstamp's Lease calls share the
    // control plane's leader-election level.
    let leader_election = uid(&admin, "flowschema", "system-leader-election");
    let (status, schema) = rt.block_on(classified(&podstamp, "POST", leases, record.clone()));
    assert_eq!(status, 201, "podstamp creates its status record");
    assert_eq!(
        schema, leader_election,
        "a kube-system ServiceAccount's Lease write is system-leader-election's by default"
    );

    run_ok(
        kubectl()
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["apply", "-f"])
            .arg(deploy_dir.join("flowcontrol.yaml")),
        "kubectl apply -f deploy/flowcontrol.yaml",
    );
    let ours = uid(&admin, "flowschema", "podstamp");
    let level = uid(&admin, "prioritylevelconfiguration", "podstamp");
    let get = format!("{leases}/podstamp-node.n1");
    // The API server's APF controller takes the new configuration in its
    // own time (it watches the objects).
    wait_for(
        "podstamp's FlowSchema in effect",
        Duration::from_secs(60),
        || {
            let (_, schema) = rt.block_on(classified(&podstamp, "GET", &get, Value::Null));
            (schema == ours).then_some(())
        },
    );
    let mut updated = rt.block_on(async {
        let response = podstamp
            .request_text(http::Request::get(&get).body(Vec::new()).unwrap())
            .await
            .unwrap();
        serde_json::from_str::<Value>(&response).unwrap()
    });
    updated["spec"]["leaseDurationSeconds"] = json!(20);
    for (method, path, body) in [
        ("PUT", get.as_str(), updated),
        ("GET", leases, Value::Null),
        (
            "GET",
            "/api/v1/namespaces/kube-system/podtemplates",
            Value::Null,
        ),
        ("GET", "/api/v1/nodes/n1", Value::Null),
    ] {
        let (status, schema) = rt.block_on(classified(&podstamp, method, path, body));
        assert!(status < 300, "{method} {path}: {status}");
        assert_eq!(schema, ours, "{method} {path} as podstamp");
    }
    // Another ServiceAccount of kube-system keeps the default's.
    let (_, schema) = rt.block_on(classified(&other, "GET", &get, Value::Null));
    assert_eq!(
        schema, leader_election,
        "another ServiceAccount's Lease call"
    );

    // The API server's own count: podstamp's requests dispatched on its
    // level, none rejected.
    let metrics = rt.block_on(async {
        let client = server.admin().await;
        client
            .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
            .await
            .unwrap()
    });
    let dispatched: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_flowcontrol_dispatched_requests_total{")
                && l.contains("flow_schema=\"podstamp\"")
                && l.contains("priority_level=\"podstamp\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        dispatched >= 5.0,
        "dispatched on podstamp's level: {dispatched}"
    );
    assert!(
        !metrics.lines().any(
            |l| l.starts_with("apiserver_flowcontrol_rejected_requests_total{")
                && l.contains("priority_level=\"podstamp\"")
        ),
        "podstamp's requests rejected"
    );
    assert!(!level.is_empty());
}
