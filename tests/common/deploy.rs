//! deploy/'s manifests applied to the harness's API server as an operator
//! applies them (namespace.yaml, then rbac.yaml, then node-identity.yaml),
//! and podstamp's credentials as a node gets them: a ServiceAccount token
//! bound to the node.
//!
//! Tests share one API server, so each gets its own copy of deploy/: the
//! files' text with `kube-system` (where podstamp runs and its templates
//! are) and `podstamp-rollouts` (its Leases) replaced by the test's
//! namespaces everywhere they appear, the admission policies' username
//! included, and the test's suffix on the names of the objects that are
//! not in those namespaces (cluster-wide ones and those of `default`).
//! Nothing else is changed: the rules, the policies and their CEL are the
//! files'.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

/// The files, in the order they are applied.
pub const FILES: [&str; 3] = ["namespace.yaml", "rbac.yaml", "node-identity.yaml"];

/// How long a grant or a policy may take to be in effect.
const TAKE_EFFECT: Duration = Duration::from_secs(30);

/// One test's copy of deploy/.
pub struct Deploy {
    /// Stands for kube-system: podstamp's ServiceAccount, its templates.
    pub namespace: String,
    /// Stands for podstamp-rollouts: the rollout Leases.
    pub rollouts: String,
    /// The objects as applied, in order.
    pub objects: Vec<Value>,
    /// The harness's admin kubeconfig: the server and CA token clients use.
    admin: PathBuf,
}

impl Deploy {
    /// deploy/'s objects for `namespace` and `rollouts` (not applied), on
    /// the server of the admin kubeconfig `admin`.
    pub fn new(admin: &Path, namespace: &str, rollouts: &str) -> Deploy {
        let suffix = namespace;
        let mut objects = Vec::new();
        for file in FILES {
            let path = super::repo().join("deploy").join(file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .replace("podstamp-rollouts", rollouts)
                .replace("kube-system", namespace);
            for document in serde_norway::Deserializer::from_str(&text) {
                let value = Value::deserialize(document).unwrap();
                if !value.is_null() {
                    objects.push(value);
                }
            }
        }
        // Objects outside the test's namespaces get the test's suffix, and
        // so do the references to them.
        let own = |o: &Value| {
            o["kind"] == "Namespace"
                || [namespace, rollouts]
                    .contains(&o["metadata"]["namespace"].as_str().unwrap_or(""))
        };
        let renamed: Vec<(String, String)> = objects
            .iter()
            .filter(|o| !own(o))
            .map(|o| {
                (
                    o["kind"].as_str().unwrap().to_string(),
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let new_name = |kind: &str, name: &str| {
            if renamed.iter().any(|(k, n)| k == kind && n == name) {
                format!("{name}-{suffix}")
            } else {
                name.to_string()
            }
        };
        for o in &mut objects {
            let kind = o["kind"].as_str().unwrap().to_string();
            let name = o["metadata"]["name"].as_str().unwrap().to_string();
            o["metadata"]["name"] = json!(new_name(&kind, &name));
            if let Some(role) = o.get("roleRef").cloned() {
                let renamed = new_name(
                    role["kind"].as_str().unwrap(),
                    role["name"].as_str().unwrap(),
                );
                o["roleRef"]["name"] = json!(renamed);
            }
            if kind == "ValidatingAdmissionPolicyBinding" {
                let policy = o["spec"]["policyName"].as_str().unwrap().to_string();
                o["spec"]["policyName"] = json!(new_name("ValidatingAdmissionPolicy", &policy));
            }
        }
        Deploy {
            namespace: namespace.to_string(),
            rollouts: rollouts.to_string(),
            objects,
            admin: admin.to_path_buf(),
        }
    }

    /// The rules of the Role or ClusterRole `name` as deploy/ names it, and
    /// the namespace it grants in (empty: cluster-wide).
    pub fn rules(&self, kind: &str, name: &str) -> (Value, String) {
        let o = self
            .objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n == name || n.starts_with(&format!("{name}-")))
            })
            .unwrap_or_else(|| panic!("deploy/ has no {kind} {name}"));
        (
            o["rules"].clone(),
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    }

    /// podstamp's ServiceAccount's user name.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:podstamp", self.namespace)
    }

    /// Creates every object as the admin `client` (the templates' namespace
    /// must exist); returns them as the API server stored them.
    pub async fn create_all(&self, client: &kube::Client) -> Vec<Value> {
        let mut stored = Vec::new();
        for object in &self.objects {
            stored.push(create(client, object).await);
        }
        stored
    }

    /// [`Deploy::create_all`], then waits until node `node`'s token (as
    /// [`Deploy::token`] makes it) has every grant of deploy/'s Roles and
    /// ClusterRoles and the lease policy refuses what it must: a policy, like
    /// a binding, takes effect once the API server has seen it.
    pub async fn apply(&self, client: &kube::Client, node: &str) {
        self.create_all(client).await;
        self.wait_in_effect(client, node).await;
    }

    /// Waits until deploy/'s grants and lease policy are in effect for node
    /// `node`'s token.
    pub async fn wait_in_effect(&self, client: &kube::Client, node: &str) {
        let token = self.token(client, node).await;
        let as_node = self.client(&token).await;
        for o in &self.objects {
            if o["kind"] == "Role" || o["kind"] == "ClusterRole" {
                let namespace = o["metadata"]["namespace"].as_str().unwrap_or("");
                super::wait_for_grants(&as_node, namespace, &o["rules"], TAKE_EFFECT).await;
            }
        }
        self.wait_for_policy(&as_node, node).await;
    }

    /// Waits until a write the lease policy refuses is refused: a status
    /// record for another node, tried as a dry run (admission runs, nothing
    /// is stored).
    async fn wait_for_policy(&self, as_node: &kube::Client, node: &str) {
        use k8s_openapi::api::coordination::v1::Lease;
        let forged: Lease = serde_json::from_value(json!({
            "metadata": {"name": "podstamp-node.nobody", "labels": {"podstamp.io/lease": "node-status"}},
            "spec": {"holderIdentity": node}
        }))
        .unwrap();
        let api: kube::Api<Lease> = kube::Api::namespaced(as_node.clone(), &self.rollouts);
        let dry_run = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        let start = Instant::now();
        loop {
            match api.create(&dry_run, &forged).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("podstamp-node-leases") =>
                {
                    return;
                }
                other => assert!(
                    start.elapsed() < TAKE_EFFECT,
                    "the lease policy is not in effect after {TAKE_EFFECT:?}: a forged record gets {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A token of podstamp's ServiceAccount bound to Node `node` (a
    /// TokenRequest with the Node as its bound object, as a DaemonSet
    /// pod's projected token is bound to its Pod on that Node): it carries
    /// the node's name, and dies with the Node.
    pub async fn token(&self, client: &kube::Client, node: &str) -> String {
        use k8s_openapi::api::core::v1::Node;
        let uid = kube::Api::<Node>::all(client.clone())
            .get(node)
            .await
            .unwrap_or_else(|e| panic!("Node {node}: {e}"))
            .metadata
            .uid;
        self.request_token(
            client,
            "podstamp",
            json!({"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}),
        )
        .await
    }

    /// A token of podstamp's ServiceAccount bound to no object: it names no
    /// node.
    pub async fn unbound_token(&self, client: &kube::Client) -> String {
        self.request_token(client, "podstamp", Value::Null).await
    }

    /// A token of ServiceAccount `account` of podstamp's namespace, bound
    /// to no object (another workload's credentials beside podstamp's).
    pub async fn account_token(&self, client: &kube::Client, account: &str) -> String {
        self.request_token(client, account, Value::Null).await
    }

    async fn request_token(&self, client: &kube::Client, account: &str, bound: Value) -> String {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::ServiceAccount;
        let mut spec = json!({"audiences": [], "expirationSeconds": 3600});
        if !bound.is_null() {
            spec["boundObjectRef"] = bound;
        }
        let request: TokenRequest =
            serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {}, "spec": spec})).unwrap();
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), &self.namespace);
        let answered: TokenRequest = api
            .create_subresource("token", account, &Default::default(), &request)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "TokenRequest for system:serviceaccount:{}:{account}: {e}",
                    self.namespace
                )
            });
        answered
            .status
            .and_then(|s| s.token)
            .expect("a TokenRequest answered with a token")
    }

    /// A kubeconfig for `token` (the admin one's server and CA), at `path`.
    pub fn kubeconfig(&self, token: &str, path: &Path) {
        let text = std::fs::read_to_string(&self.admin).unwrap();
        assert!(text.contains("admin-token"), "{}", self.admin.display());
        std::fs::write(path, text.replace("admin-token", token)).unwrap();
    }

    /// A client authenticated by `token`.
    pub async fn client(&self, token: &str) -> kube::Client {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token.kubeconfig");
        self.kubeconfig(token, &path);
        let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

/// Creates `object` (any kind deploy/ holds) as `client`; returns it as
/// the API server stored it (a Namespace that was there: as given).
pub async fn create(client: &kube::Client, object: &Value) -> Value {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let kind = object["kind"].as_str().unwrap();
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let plural = match kind {
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
        "ConfigMap" => "configmaps",
        "DaemonSet" => "daemonsets",
        "PodTemplate" => "podtemplates",
        "Node" => "nodes",
        other => panic!("deploy/: a {other} is not created by the tests"),
    };
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    let typed: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let api: kube::Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    };
    match api.create(&Default::default(), &typed).await {
        Ok(stored) => serde_json::to_value(stored).unwrap(),
        // A shared namespace (deploy/'s own podstamp-rollouts) made before.
        Err(kube::Error::Api(s)) if s.code == 409 && kind == "Namespace" => object.clone(),
        Err(e) => panic!("deploy/ {kind} {}: {e}", object["metadata"]["name"]),
    }
}
