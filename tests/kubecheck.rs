//! podstamp's verdict on a pod equals the kubelet's, field by field.
//!
//! The fixture (tests/fixtures/kubecheck/full.yaml) is Kubernetes' own
//! PodTemplate with every field set, made a valid static pod; each case
//! below changes one field of it into a value the kubelet refuses: every
//! enumerated field, every mutually exclusive pair and every numeric bound
//! the issue lists, and more. Each case is rendered by podstamp (no plugins)
//! and its manifest bytes are also given to the kubelet's own static pod file
//! source (the harness's podstamp-manifestcheck, run once over all of them);
//! the two verdicts must agree for every case, and where both refuse in the
//! kubelet's validation, with the kubelet's own error text. A case that the
//! kubelet accepts is a mistake of the case (it tests nothing) and fails too.
//! The counts are printed.
//!
//! Needs target/kubecheck/podstamp-kubecheck (tests/harness/build-kubecheck.sh)
//! and target/harness/podstamp-manifestcheck (tests/harness/build.sh).

mod common;

use podstamp::chain::Chain;
use podstamp::kube_check::KubeCheck;
use podstamp::manifest;
use podstamp::node::NodeContext;
use podstamp::render::{self, Stage};
use podstamp::template::Template;
use serde_json::{Value, json};

const NODE: &str = "n1";
const S: &str = "/template/spec";
const C: &str = "/template/spec/containers/0";
const I: &str = "/template/spec/initContainers/0";

fn fixture() -> Value {
    let path = common::repo().join("tests/fixtures/kubecheck/full.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

enum Op {
    Set(String, Value),
    Remove(String),
}

fn set(pointer: impl Into<String>, value: Value) -> Op {
    Op::Set(pointer.into(), value)
}

/// Sets `pointer` in `doc` to `value`, making missing objects on the way.
fn apply(doc: &mut Value, op: &Op) {
    match op {
        Op::Set(pointer, value) => {
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            let mut at = doc;
            for part in parent.split('/').skip(1) {
                at = match at {
                    Value::Array(items) => &mut items[part.parse::<usize>().expect("an index")],
                    other => other
                        .as_object_mut()
                        .unwrap_or_else(|| panic!("{pointer}: {part} is not an object"))
                        .entry(part)
                        .or_insert_with(|| json!({})),
                };
            }
            match at {
                Value::Array(items) => {
                    items[key.parse::<usize>().expect("an index")] = value.clone()
                }
                other => {
                    other
                        .as_object_mut()
                        .unwrap_or_else(|| panic!("{pointer}: not an object"))
                        .insert(key.to_string(), value.clone());
                }
            }
        }
        Op::Remove(pointer) => {
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            doc.pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .and_then(|o| o.remove(key))
                .unwrap_or_else(|| panic!("{pointer}: nothing to remove"));
        }
    }
}

/// One field (or one pair) of the fixture made invalid.
fn mutations() -> Vec<(&'static str, Vec<Op>)> {
    let one = |name, pointer: String, value| (name, vec![set(pointer, value)]);
    vec![
        // Every enumerated field, misspelt or unknown.
        one(
            "restartPolicy",
            format!("{S}/restartPolicy"),
            json!("always"),
        ),
        one(
            "dnsPolicy",
            format!("{S}/dnsPolicy"),
            json!("ClusterFirstWithHostnet"),
        ),
        one(
            "preemptionPolicy",
            format!("{S}/preemptionPolicy"),
            json!("Sometimes"),
        ),
        one("os.name", format!("{S}/os/name"), json!("plan9")),
        one(
            "imagePullPolicy",
            format!("{C}/imagePullPolicy"),
            json!("IfNotPresnt"),
        ),
        one(
            "terminationMessagePolicy",
            format!("{C}/terminationMessagePolicy"),
            json!("Logs"),
        ),
        one(
            "ports.protocol",
            format!("{C}/ports/0/protocol"),
            json!("tcp"),
        ),
        one(
            "mountPropagation",
            format!("{C}/volumeMounts/1/mountPropagation"),
            json!("Shared"),
        ),
        one(
            "recursiveReadOnly",
            format!("{C}/volumeMounts/0/recursiveReadOnly"),
            json!("Always"),
        ),
        one(
            "resizePolicy.resourceName",
            format!("{C}/resizePolicy/0/resourceName"),
            json!("gpu"),
        ),
        one(
            "resizePolicy.restartPolicy",
            format!("{C}/resizePolicy/0/restartPolicy"),
            json!("Sometimes"),
        ),
        one(
            "procMount",
            format!("{C}/securityContext/procMount"),
            json!("Masked"),
        ),
        one(
            "seccompProfile.type",
            format!("{C}/securityContext/seccompProfile"),
            json!({"type": "runtimeDefault"}),
        ),
        one(
            "appArmorProfile.type",
            format!("{C}/securityContext/appArmorProfile"),
            json!({"type": "Enforce"}),
        ),
        one(
            "pod seccompProfile.type",
            format!("{S}/securityContext/seccompProfile/type"),
            json!("Default"),
        ),
        one(
            "fsGroupChangePolicy",
            format!("{S}/securityContext/fsGroupChangePolicy"),
            json!("Never"),
        ),
        one(
            "supplementalGroupsPolicy",
            format!("{S}/securityContext/supplementalGroupsPolicy"),
            json!("Replace"),
        ),
        one(
            "seLinuxChangePolicy",
            format!("{S}/securityContext/seLinuxChangePolicy"),
            json!("Relabel"),
        ),
        one(
            "tolerations.operator",
            format!("{S}/tolerations/0/operator"),
            json!("Contains"),
        ),
        one(
            "tolerations.effect",
            format!("{S}/tolerations/0/effect"),
            json!("NoRun"),
        ),
        one(
            "nodeAffinity operator",
            format!(
                "{S}/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/0/operator"
            ),
            json!("Equals"),
        ),
        one(
            "podAffinity operator",
            format!(
                "{S}/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/0/labelSelector/matchExpressions/0/operator"
            ),
            json!("Equals"),
        ),
        one(
            "topologySpread whenUnsatisfiable",
            format!("{S}/topologySpreadConstraints/0/whenUnsatisfiable"),
            json!("Sometimes"),
        ),
        one(
            "topologySpread nodeAffinityPolicy",
            format!("{S}/topologySpreadConstraints/0/nodeAffinityPolicy"),
            json!("Maybe"),
        ),
        one(
            "topologySpread nodeTaintsPolicy",
            format!("{S}/topologySpreadConstraints/0/nodeTaintsPolicy"),
            json!("Maybe"),
        ),
        one(
            "httpGet.scheme",
            format!("{C}/readinessProbe/httpGet/scheme"),
            json!("FTP"),
        ),
        one(
            "restartPolicyRules.action",
            format!("{C}/restartPolicyRules/0/action"),
            json!("Explode"),
        ),
        one(
            "restartPolicyRules.exitCodes.operator",
            format!("{C}/restartPolicyRules/0/exitCodes/operator"),
            json!("Equals"),
        ),
        one(
            "hostPath.type",
            format!("{S}/volumes/0/hostPath/type"),
            json!("Folder"),
        ),
        one(
            "image volume pullPolicy",
            format!("{S}/volumes/4/image/pullPolicy"),
            json!("Sometimes"),
        ),
        one(
            "lifecycle.stopSignal",
            format!("{C}/lifecycle/stopSignal"),
            json!("SIGBOGUS"),
        ),
        one(
            "container restartPolicy",
            format!("{C}/restartPolicy"),
            json!("Sometimes"),
        ),
        one(
            "sidecar restartPolicy with probes",
            format!("{I}/restartPolicy"),
            json!("Never"),
        ),
        // Mutually exclusive pairs.
        one(
            "probe with two handlers",
            format!("{C}/livenessProbe/httpGet"),
            json!({"port": 8443}),
        ),
        one(
            "postStart with two handlers",
            format!("{C}/lifecycle/postStart/tcpSocket"),
            json!({"port": 1}),
        ),
        one(
            "volume with two sources",
            format!("{S}/volumes/1/hostPath"),
            json!({"path": "/x"}),
        ),
        one(
            "shareProcessNamespace with hostPID",
            format!("{S}/shareProcessNamespace"),
            json!(true),
        ),
        one(
            "env value and valueFrom",
            format!("{C}/env/0/valueFrom"),
            json!({"fieldRef": {"fieldPath": "metadata.name"}}),
        ),
        one(
            "subPath with subPathExpr",
            format!("{C}/volumeMounts/0/subPathExpr"),
            json!("$(NODE)"),
        ),
        one(
            "localhostProfile without Localhost",
            format!("{C}/securityContext/seccompProfile/type"),
            json!("RuntimeDefault"),
        ),
        one(
            "recursiveReadOnly with propagation",
            format!("{C}/volumeMounts/0/mountPropagation"),
            json!("HostToContainer"),
        ),
        one(
            "hostnameOverride with hostNetwork",
            format!("{S}/hostnameOverride"),
            json!("other"),
        ),
        one(
            "privileged without escalation",
            format!("{C}/securityContext/allowPrivilegeEscalation"),
            json!(false),
        ),
        one(
            "windowsOptions on linux",
            format!("{S}/securityContext/windowsOptions"),
            json!({"runAsUserName": "x"}),
        ),
        one(
            "readinessProbe grace period",
            format!("{C}/readinessProbe/terminationGracePeriodSeconds"),
            json!(5),
        ),
        // Numeric bounds.
        one(
            "liveness successThreshold",
            format!("{C}/livenessProbe/successThreshold"),
            json!(5),
        ),
        one(
            "startup successThreshold",
            format!("{C}/startupProbe/successThreshold"),
            json!(2),
        ),
        one(
            "probe timeoutSeconds",
            format!("{C}/livenessProbe/timeoutSeconds"),
            json!(-1),
        ),
        one(
            "probe periodSeconds",
            format!("{C}/livenessProbe/periodSeconds"),
            json!(-1),
        ),
        one(
            "probe failureThreshold",
            format!("{C}/livenessProbe/failureThreshold"),
            json!(-1),
        ),
        one(
            "probe initialDelaySeconds",
            format!("{C}/livenessProbe/initialDelaySeconds"),
            json!(-1),
        ),
        one(
            "probe terminationGracePeriodSeconds",
            format!("{C}/livenessProbe/terminationGracePeriodSeconds"),
            json!(0),
        ),
        (
            "containerPort over 65535",
            vec![
                set(format!("{C}/ports/0/containerPort"), json!(70000)),
                set(format!("{C}/ports/0/hostPort"), json!(70000)),
            ],
        ),
        one(
            "hostPort other than containerPort with hostNetwork",
            format!("{C}/ports/0/hostPort"),
            json!(8080),
        ),
        one(
            "requests above limits",
            format!("{C}/resources/requests/cpu"),
            json!("1"),
        ),
        one(
            "negative limit",
            format!("{C}/resources/limits/cpu"),
            json!("-1"),
        ),
        one(
            "preStop sleep past the grace period",
            format!("{C}/lifecycle/preStop/sleep/seconds"),
            json!(10),
        ),
        one(
            "activeDeadlineSeconds",
            format!("{S}/activeDeadlineSeconds"),
            json!(0),
        ),
        one(
            "runAsUser",
            format!("{C}/securityContext/runAsUser"),
            json!(-1),
        ),
        one("fsGroup", format!("{S}/securityContext/fsGroup"), json!(-1)),
        one(
            "maxSkew",
            format!("{S}/topologySpreadConstraints/0/maxSkew"),
            json!(0),
        ),
        one(
            "minDomains",
            format!("{S}/topologySpreadConstraints/0/minDomains"),
            json!(0),
        ),
        one(
            "tolerationSeconds on NoSchedule",
            format!("{S}/tolerations/0"),
            json!({"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}),
        ),
        one(
            "emptyDir sizeLimit",
            format!("{S}/volumes/1/emptyDir/sizeLimit"),
            json!("-1Mi"),
        ),
        one(
            "downwardAPI defaultMode",
            format!("{S}/volumes/2/downwardAPI/defaultMode"),
            json!(4096),
        ),
        one(
            "downwardAPI item mode",
            format!("{S}/volumes/2/downwardAPI/items/0/mode"),
            json!(4096),
        ),
        one(
            "port name over 15 characters",
            format!("{C}/ports/0/name"),
            json!("https-port-too-long"),
        ),
        one(
            "port name with capitals",
            format!("{C}/ports/0/name"),
            json!("HTTPS"),
        ),
        one(
            "unqualified resource name",
            format!("{C}/resources/limits/foo"),
            json!("1"),
        ),
        one(
            "overhead negative",
            format!("{S}/overhead/cpu"),
            json!("-10m"),
        ),
        // Addresses and names a node-specific plugin fills in.
        one(
            "DNS nameserver not an IP",
            format!("{S}/dnsConfig/nameservers"),
            json!(["dns.example.com"]),
        ),
        one(
            "more than 3 nameservers",
            format!("{S}/dnsConfig/nameservers"),
            json!(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]),
        ),
        one(
            "DNS search not a name",
            format!("{S}/dnsConfig/searches"),
            json!(["bad search!"]),
        ),
        one(
            "host alias IP",
            format!("{S}/hostAliases/0/ip"),
            json!("registry"),
        ),
        one(
            "host alias hostname",
            format!("{S}/hostAliases/0/hostnames"),
            json!(["Not_A_Host"]),
        ),
        one(
            "sysctl name",
            format!("{S}/securityContext/sysctls/0/name"),
            json!("kernel..bad"),
        ),
        one(
            "resourceFieldRef resource",
            format!("{C}/env/2/valueFrom/resourceFieldRef/resource"),
            json!("limits.gpu"),
        ),
        one(
            "fieldRef fieldPath",
            format!("{C}/env/1/valueFrom/fieldRef/fieldPath"),
            json!("spec.bogus"),
        ),
        one(
            "readinessGates conditionType",
            format!("{S}/readinessGates/0/conditionType"),
            json!("not a condition"),
        ),
        one("hostname", format!("{S}/hostname"), json!("Host_Name")),
        one(
            "priorityClassName",
            format!("{S}/priorityClassName"),
            json!("Critical!"),
        ),
        // podstamp's own rules (validate.rs), which come first.
        one("image missing", format!("{C}/image"), json!("")),
        one("container name", format!("{C}/name"), json!("Main")),
        one(
            "mount of no volume",
            format!("{C}/volumeMounts/0/name"),
            json!("hots"),
        ),
        one("env name empty", format!("{C}/env/0/name"), json!("")),
        one(
            "duplicate container name",
            format!("{I}/name"),
            json!("main"),
        ),
        one(
            "node selector key",
            format!("{S}/nodeSelector"),
            json!({"bad key!": "v"}),
        ),
        one(
            "static pod with a ServiceAccount",
            format!("{S}/serviceAccountName"),
            json!("default"),
        ),
        one(
            "static pod with a ConfigMap volume",
            format!("{S}/volumes/1"),
            json!({"name": "scratch", "configMap": {"name": "x"}}),
        ),
        // The decoder's own refusal.
        one(
            "quantity that is no quantity",
            format!("{C}/resources/requests/memory"),
            json!("lots"),
        ),
        (
            "no containers left",
            vec![
                set(format!("{S}/containers"), json!([])),
                Op::Remove(format!("{S}/initContainers")),
            ],
        ),
    ]
}

/// podstamp's verdict on one case, and the bytes the kubelet is asked about.
struct Case {
    name: String,
    podstamp: Result<(), String>,
    /// Refused by podstamp's own rules (validate.rs), before the kubelet's check.
    own_rule: bool,
    bytes: Vec<u8>,
}

fn case(name: &str, index: usize, mut doc: Value) -> Case {
    let pod_name = format!("full-{index:03}");
    doc["metadata"]["name"] = json!(pod_name);
    let template = Template::from_value(&doc)
        .unwrap_or_else(|e| panic!("case {name:?}: not a v1 PodTemplate podstamp reads: {e}"));
    // The bytes of the manifest, as podstamp writes it (a render without
    // plugins forces the namespace and writes this).
    let mut pod = template.pod();
    pod["metadata"]["namespace"] = json!("kube-system");
    let bytes = manifest::finish_unverified(pod, "kube-system", &template.id())
        .peek()
        .bytes
        .clone();
    let node = NodeContext::named(NODE);
    let chain = Chain::new(vec![]);
    let rendered =
        render::render_unverified(&template, &node, &chain, "kube-system", &mut |_, _, _| {});
    let (podstamp, own_rule) = match rendered {
        Err(e) => (Err(e.to_string()), true),
        Ok(rendered) => {
            assert_eq!(
                rendered.peek().bytes,
                bytes,
                "case {name:?}: the render wrote other bytes"
            );
            match rendered.verify_with(KubeCheck::shared()) {
                Ok(_) => (Ok(()), false),
                Err(e) => {
                    assert!(
                        matches!(e.stage, Stage::Refused { .. }),
                        "case {name:?}: the check did not run: {e}"
                    );
                    (Err(e.to_string()), false)
                }
            }
        }
    };
    Case {
        name: name.to_string(),
        podstamp,
        own_rule,
        bytes,
    }
}

#[test]
fn podstamp_refuses_exactly_what_the_kubelet_refuses_field_by_field() {
    let base = fixture();
    let mut cases = vec![case("the fixture as is", 0, base.clone())];
    for (i, (name, ops)) in mutations().into_iter().enumerate() {
        let mut doc = base.clone();
        for op in &ops {
            apply(&mut doc, op);
        }
        cases.push(case(name, i + 1, doc));
    }
    let dir = tempfile::tempdir().unwrap();
    for (i, case) in cases.iter().enumerate() {
        std::fs::write(dir.path().join(format!("case-{i:03}.yaml")), &case.bytes).unwrap();
    }
    let kubelet = common::kubelet_verdicts(dir.path(), NODE);
    let check = KubeCheck::shared();
    let mut disagreements = Vec::new();
    let mut accepted_mutations = Vec::new();
    let mut text_differs = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let file = format!("case-{i:03}.yaml");
        let verdict = kubelet
            .get(&file)
            .unwrap_or_else(|| panic!("no verdict for {file} ({})", case.name));
        if verdict.is_ok() != case.podstamp.is_ok() {
            disagreements.push(format!(
                "{file} {:?}: kubelet {verdict:?}, podstamp {:?}",
                case.name, case.podstamp
            ));
        }
        if i > 0 && verdict.is_ok() {
            accepted_mutations.push(case.name.clone());
        }
        // Where the kubelet refused in validation and podstamp in its check,
        // the kubelet's text is the same, word for word.
        if let (Err(kubelet_text), Err(_), false) = (verdict, &case.podstamp, case.own_rule)
            && kubelet_text.starts_with("invalid pod:")
        {
            let ours = match check.check(NODE, None, &case.bytes) {
                Err(podstamp::kube_check::CheckError::Refused(r)) => r.kubelet_error,
                other => format!("{other:?}"),
            };
            if &ours != kubelet_text {
                text_differs.push(format!(
                    "{file} {:?}:\n  kubelet:  {kubelet_text}\n  podstamp: {ours}",
                    case.name
                ));
            }
        }
    }
    let own = cases.iter().filter(|c| c.own_rule).count();
    println!(
        "kubelet parity, full-field fixture: {} cases (1 valid + {} mutations; {own} refused by podstamp's own rules first), {} disagreements, {} kubelet texts differing",
        cases.len(),
        cases.len() - 1,
        disagreements.len(),
        text_differs.len()
    );
    assert!(
        disagreements.is_empty(),
        "verdicts differ:\n{}",
        disagreements.join("\n")
    );
    assert!(
        accepted_mutations.is_empty(),
        "mutations the kubelet accepts (they test nothing; fix them): {accepted_mutations:?}"
    );
    assert!(text_differs.is_empty(), "{}", text_differs.join("\n"));
    assert!(
        cases[0].podstamp.is_ok(),
        "the fixture itself: {:?}",
        cases[0].podstamp
    );
}

#[test]
fn a_refusal_names_the_field_and_what_it_must_be() {
    let mut doc = fixture();
    apply(
        &mut doc,
        &set(format!("{C}/livenessProbe/successThreshold"), json!(5)),
    );
    let c = case("liveness successThreshold", 0, doc);
    let message = c.podstamp.unwrap_err();
    assert!(
        message.contains(
            "the kubelet (v1.37.2) would refuse it, and stop the pod running from it: spec.containers[0].livenessProbe.successThreshold: 5 is invalid: must be 1"
        ),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}

#[test]
fn fields_newer_than_the_nodes_kubelet_are_named_and_refused_by_the_setting() {
    use podstamp::kube_check::Settings;
    let mut doc = fixture();
    doc["metadata"]["name"] = json!("skew");
    let template = Template::from_value(&doc).unwrap();
    let render_for = |kubelet: &str| {
        let mut node = NodeContext::named(NODE);
        node.kubelet_version = Some(kubelet.to_string());
        render::render_unverified(
            &template,
            &node,
            &Chain::new(vec![]),
            "kube-system",
            &mut |_, _, _| {},
        )
        .unwrap()
    };
    // A v1.34 kubelet: written, with a warning counted for the node.
    let warn = KubeCheck::new(Settings::default());
    render_for("v1.34.0").verify_with(&warn).unwrap();
    assert_eq!(warn.newer_counts().get(NODE), Some(&1));
    // Refused by the setting, naming each field.
    let strict = KubeCheck::new(Settings {
        refuse_newer: true,
        ..Settings::default()
    });
    let e = render_for("v1.34.0")
        .verify_with(&strict)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the node's kubelet v1.34.0 would run it without the fields it does not know")
            && e.contains(
                "spec.containers[0].restartPolicyRules: is newer than the node's kubelet v1.34.0"
            ),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // The kubelet this check speaks for, and a newer one: nothing is newer.
    for kubelet in ["v1.37.2", "v1.38.0"] {
        render_for(kubelet)
            .verify_with(&strict)
            .unwrap_or_else(|e| panic!("{kubelet}: {e}"));
    }
    assert_eq!(strict.newer_counts().get(NODE), Some(&1));
    // A pod with nothing newer than a v1.34 kubelet (the helper answers it
    // without comparing the pod's JSON before and after the drop): written
    // under the setting, nothing counted.
    let plain = Template::from_value(&json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "plain", "namespace": "kube-system"},
        "template": {"spec": {"containers": [{"name": "main", "image": "registry.example.com/web:1"}]}},
    }))
    .unwrap();
    let mut node = NodeContext::named(NODE);
    node.kubelet_version = Some("v1.34.0".to_string());
    render::render_unverified(
        &plain,
        &node,
        &Chain::new(vec![]),
        "kube-system",
        &mut |_, _, _| {},
    )
    .unwrap()
    .verify_with(&strict)
    .unwrap_or_else(|e| panic!("a plain pod for a v1.34 kubelet: {e}"));
    assert_eq!(strict.newer_counts().get(NODE), Some(&1));
}
