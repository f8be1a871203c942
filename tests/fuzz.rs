//! Property tests (proptest) over template → validate → file name → YAML:
//! whatever a PodTemplate holds, either it is refused with a message, or the
//! manifest's file name is safe for the kubelet's directory and its YAML
//! reads back (with serde_norway, a YAML parser podstamp does not use for
//! writing) as exactly the pod that was validated.
//!
//! Bounded: PROPTEST_CASES (default 256) cases per property (tests/run.sh raises
//! it to 50000, about a minute in all in a debug build on a loaded machine:
//! a pod that passes podstamp's own rules also gets the kubelet's verdict).
//! proptest saves a failing input in tests/fuzz.proptest-regressions and
//! replays it first on every later run: commit that file, and add the input
//! to `every_tricky_string_in_every_place` or a test of its own.

mod common;

use podstamp::chain::Chain;
use podstamp::manifest;
use podstamp::node::NodeContext;
use podstamp::render;
use podstamp::template::Template;
use podstamp::yaml::to_yaml;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Strings YAML likes to read as something else, and pieces of paths.
const TRICKY: &[&str] = &[
    "",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "true",
    "False",
    "null",
    "Null",
    "~",
    "0",
    "-0",
    "007",
    "0x1F",
    "0o17",
    "1e3",
    "1_000",
    ".5",
    ".inf",
    "-.inf",
    ".nan",
    "+1",
    "12:30",
    "-",
    "- a",
    "? x",
    ": x",
    "a: b",
    "a #b",
    "#",
    "&a",
    "*a",
    "!tag",
    "%YAML",
    "@x",
    "`x",
    "{}",
    "[]",
    "{a: 1}",
    "---",
    "...",
    "'",
    "\"",
    "\\",
    "\n",
    "\r\n",
    "\t",
    " lead",
    "trail ",
    "é",
    "日本",
    "\u{feff}",
    "\u{2028}",
    "\u{0}",
    "\u{7f}",
    "\u{85}",
    "a\u{2028}b",
    "a\u{2029}b",
    "a\u{85}b",
    "a\u{feff}b",
    "a\u{a0}b",
    "../",
    "/",
    ".",
    "..",
    "a/b",
    ".hidden",
    "=",
    "<<",
    "${node.name}",
];

fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(TRICKY).prop_map(str::to_string),
        any::<String>(),
        "[ -~]{0,40}",
        proptest::collection::vec(proptest::sample::select(TRICKY), 0..4).prop_map(|v| v.concat()),
    ]
}

/// Names: mostly valid, sometimes anything.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?",
        1 => "[a-z0-9./_A-Z-]{0,20}",
        1 => "[a-z]{1,62}(\\.[a-z]{1,62}){0,4}",
        1 => tricky_string(),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{1,10}(\\.[a-z]{1,5})?/[a-z]{1,10}",
        4 => "[a-zA-Z0-9]([a-zA-Z0-9._-]{0,18}[a-zA-Z0-9])?",
        1 => tricky_string(),
    ]
}

fn to_map(m: std::collections::BTreeMap<String, String>) -> Map<String, Value> {
    m.into_iter().map(|(k, v)| (k, Value::String(v))).collect()
}

/// Labels: values mostly valid label values.
fn labels() -> impl Strategy<Value = Map<String, Value>> {
    let value = prop_oneof![
        4 => "([a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?)?",
        1 => tricky_string(),
    ];
    proptest::collection::btree_map(key(), value, 0..4).prop_map(to_map)
}

/// Keys around and over the 1024 characters YAML allows an implicit key:
/// plain, with characters that need quoting or escapes, multi-byte.
fn long_key() -> impl Strategy<Value = String> {
    (
        prop_oneof![
            Just(String::new()),
            proptest::sample::select(TRICKY).prop_map(str::to_string),
            Just("é".to_string()),
        ],
        1000usize..1100,
        proptest::sample::select(&["k", "é", "\u{2028}", " "][..]),
    )
        .prop_map(|(head, n, filler)| format!("{head}x{}", filler.repeat(n)))
}

/// A node selector: label keys and values, mostly valid, sometimes with
/// the characters the kubelet refuses in a label value (U+2028, U+0085,
/// ...) or keys too long for a label (or for a YAML implicit key).
fn node_selector() -> impl Strategy<Value = Map<String, Value>> {
    let value = prop_oneof![
        8 => "([a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?)?",
        2 => tricky_string(),
        1 => long_key(),
    ];
    let key = prop_oneof![8 => key(), 1 => long_key()];
    proptest::collection::btree_map(key, value, 0..3).prop_map(to_map)
}

/// A volume: a flexVolume, whose `options` are the one map of a v1 Pod the
/// kubelet takes with keys of any length (the writer's long keys reach it
/// there), a hostPath, or one the kubelet refuses in a static pod.
fn volume() -> impl Strategy<Value = Value> {
    let options = proptest::collection::btree_map(
        prop_oneof![2 => key(), 2 => long_key(), 1 => tricky_string()],
        tricky_string(),
        0..3,
    )
    .prop_map(to_map);
    prop_oneof![
        8 => options.prop_map(
            |options| json!({"name": "opts", "flexVolume": {"driver": "example.com/fv", "options": options}})
        ),
        1 => Just(json!({"name": "etc", "hostPath": {"path": "/etc/kubernetes"}})),
        1 => Just(json!({"name": "cm", "configMap": {"name": "settings"}})),
    ]
}

/// Annotations: any value at all, which is where YAML quoting matters.
fn annotations() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::btree_map(key(), tricky_string(), 0..4).prop_map(to_map)
}

fn image() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9.-]{1,12}(/[a-z0-9]{1,8})?(:[a-zA-Z0-9._-]{1,8})?",
        1 => tricky_string(),
    ]
}

/// Small numbers around the bounds the kubelet checks (negative, zero, one).
fn small() -> impl Strategy<Value = i64> {
    prop_oneof![4 => 1i64..=3, 1 => Just(0i64), 1 => Just(-1i64)]
}

/// A port: mostly valid numbers, sometimes out of range, or a name.
fn port() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => proptest::sample::select(&[80i64, 443, 8080, 9090][..]).prop_map(Value::from),
        1 => proptest::sample::select(&[0i64, -1, 65536, 70000][..]).prop_map(Value::from),
        1 => proptest::sample::select(&["http", "metrics", "HTTP_X", "a-name-over-15-chars"][..])
            .prop_map(Value::from),
    ]
}

/// A probe: one handler (sometimes two), thresholds around their bounds.
fn probe() -> impl Strategy<Value = Value> {
    let handler = prop_oneof![
        Just(("exec", json!({"command": ["/bin/true"]}))),
        port().prop_map(|p| ("httpGet", json!({"port": p, "path": "/healthz"}))),
        port().prop_map(|p| ("tcpSocket", json!({"port": p}))),
        (0i64..70000).prop_map(|p| ("grpc", json!({"port": p}))),
    ];
    (
        handler.clone(),
        proptest::option::weighted(0.15, handler),
        [small(), small(), small(), small(), small()],
        proptest::option::weighted(0.2, small()),
    )
        .prop_map(
            |((kind, h), second, [success, period, timeout, failure, delay], grace)| {
                let mut probe = json!({
                    "successThreshold": success, "periodSeconds": period, "timeoutSeconds": timeout,
                    "failureThreshold": failure, "initialDelaySeconds": delay,
                });
                probe[kind] = h;
                if let Some((kind, h)) = second {
                    probe[kind] = h;
                }
                if let Some(grace) = grace {
                    probe["terminationGracePeriodSeconds"] = json!(grace);
                }
                probe
            },
        )
}

fn container_port() -> impl Strategy<Value = Value> {
    (
        prop_oneof![8 => 1i64..65536, 1 => proptest::sample::select(&[0i64, -1, 65536][..])],
        proptest::option::weighted(0.3, prop_oneof![4 => 1i64..65536, 1 => Just(0i64)]),
        proptest::option::weighted(
            0.5,
            proptest::sample::select(
                &[
                    "http",
                    "metrics",
                    "web-1",
                    "HTTP",
                    "a-name-over-15-chars",
                    "9x",
                ][..],
            ),
        ),
        proptest::sample::select(&["", "TCP", "UDP", "SCTP"][..]),
    )
        .prop_map(|(container, host, name, protocol)| {
            let mut port = json!({"containerPort": container});
            if let Some(host) = host {
                port["hostPort"] = json!(host);
            }
            if let Some(name) = name {
                port["name"] = json!(name);
            }
            if !protocol.is_empty() {
                port["protocol"] = json!(protocol);
            }
            port
        })
}

fn resources() -> impl Strategy<Value = Value> {
    let names = &[
        "cpu",
        "memory",
        "ephemeral-storage",
        "example.com/gpu",
        "hugepages-2Mi",
        "foo",
    ][..];
    let quantities = &["100m", "1", "2", "0", "-1", "512Mi", "1Gi", "1.5", "abc"][..];
    let list = proptest::collection::btree_map(
        proptest::sample::select(names).prop_map(str::to_string),
        proptest::sample::select(quantities).prop_map(str::to_string),
        0..3,
    )
    .prop_map(to_map);
    (list.clone(), list)
        .prop_map(|(requests, limits)| json!({"requests": requests, "limits": limits}))
}

fn security_context() -> impl Strategy<Value = Value> {
    (
        proptest::option::weighted(0.5, prop_oneof![small(), Just(1000i64)]),
        proptest::option::weighted(0.3, any::<bool>()),
        proptest::option::weighted(0.3, any::<bool>()),
        proptest::option::weighted(0.3, any::<bool>()),
        proptest::option::weighted(
            0.4,
            (
                proptest::sample::select(
                    &[
                        "RuntimeDefault",
                        "runtimeDefault",
                        "Unconfined",
                        "Localhost",
                    ][..],
                ),
                any::<bool>(),
            ),
        ),
        proptest::option::weighted(
            0.2,
            proptest::sample::select(&["Default", "Unmasked", "Masked"][..]),
        ),
        proptest::option::weighted(
            0.3,
            proptest::sample::select(&["NET_ADMIN", "SYS_TIME", "ALL"][..]),
        ),
    )
        .prop_map(
            |(user, non_root, privileged, escalation, seccomp, proc_mount, add)| {
                let mut context = json!({});
                if let Some(user) = user {
                    context["runAsUser"] = json!(user);
                }
                if let Some(non_root) = non_root {
                    context["runAsNonRoot"] = json!(non_root);
                }
                if let Some(privileged) = privileged {
                    context["privileged"] = json!(privileged);
                }
                if let Some(escalation) = escalation {
                    context["allowPrivilegeEscalation"] = json!(escalation);
                }
                if let Some((kind, profile)) = seccomp {
                    context["seccompProfile"] = json!({"type": kind});
                    if profile {
                        context["seccompProfile"]["localhostProfile"] = json!("profiles/p.json");
                    }
                }
                if let Some(proc_mount) = proc_mount {
                    context["procMount"] = json!(proc_mount);
                }
                if let Some(add) = add {
                    context["capabilities"] = json!({"add": [add]});
                }
                context
            },
        )
}

fn toleration() -> impl Strategy<Value = Value> {
    (
        proptest::sample::select(&["", "k", "example.com/k", "bad key!"][..]),
        proptest::sample::select(&["", "Exists", "Equal", "equal"][..]),
        proptest::sample::select(&["", "v"][..]),
        proptest::sample::select(&["", "NoSchedule", "NoExecute", "PreferNoSchedule", "NoRun"][..]),
        proptest::option::weighted(0.3, small()),
    )
        .prop_map(|(key, operator, value, effect, seconds)| {
            let mut toleration = json!({});
            for (field, v) in [
                ("key", key),
                ("operator", operator),
                ("value", value),
                ("effect", effect),
            ] {
                if !v.is_empty() {
                    toleration[field] = json!(v);
                }
            }
            if let Some(seconds) = seconds {
                toleration["tolerationSeconds"] = json!(seconds);
            }
            toleration
        })
}

fn affinity() -> impl Strategy<Value = Value> {
    let expression = (
        proptest::sample::select(&["kubernetes.io/arch", "", "bad key!"][..]),
        proptest::sample::select(
            &[
                "In",
                "NotIn",
                "Exists",
                "DoesNotExist",
                "Gt",
                "Lt",
                "Equals",
            ][..],
        ),
        proptest::collection::vec(proptest::sample::select(&["amd64", "1", "x y"][..]), 0..3),
    )
        .prop_map(
            |(key, operator, values)| json!({"key": key, "operator": operator, "values": values}),
        );
    proptest::collection::vec(expression, 0..3).prop_map(|expressions| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}})
    })
}

fn dns() -> impl Strategy<Value = (&'static str, Option<Value>)> {
    let config = (
        proptest::collection::vec(
            proptest::sample::select(&["10.0.0.10", "::1", "dns.example", "1.2.3"][..]),
            0..5,
        ),
        proptest::collection::vec(
            proptest::sample::select(&["svc.local", "Bad Search", "a.b"][..]),
            0..3,
        ),
        proptest::collection::vec(proptest::sample::select(&["ndots", ""][..]), 0..2),
    )
        .prop_map(|(nameservers, searches, options)| {
            let options: Vec<Value> = options
                .into_iter()
                .map(|n| json!({"name": n, "value": "2"}))
                .collect();
            json!({"nameservers": nameservers, "searches": searches, "options": options})
        });
    (
        proptest::sample::select(
            &[
                "",
                "None",
                "ClusterFirst",
                "Default",
                "ClusterFirstWithHostNet",
            ][..],
        ),
        proptest::option::weighted(0.5, config),
    )
}

fn host_alias() -> impl Strategy<Value = Value> {
    (
        proptest::sample::select(&["10.0.0.1", "::1", "not-an-ip", ""][..]),
        proptest::collection::vec(
            proptest::sample::select(&["a.example", "Bad_Host", ""][..]),
            0..3,
        ),
    )
        .prop_map(|(ip, hostnames)| json!({"ip": ip, "hostnames": hostnames}))
}

/// The fields of a pod and its container a node-specific plugin fills in
/// (probes, ports, resources, security contexts, tolerations, affinity, DNS,
/// host aliases, host namespaces), each present about a third of the time.
fn extras() -> BoxedStrategy<(Map<String, Value>, Map<String, Value>)> {
    (
        proptest::option::weighted(0.3, probe().boxed()),
        proptest::option::weighted(0.2, probe().boxed()),
        proptest::option::weighted(
            0.3,
            proptest::collection::vec(container_port().boxed(), 1..3),
        )
        .boxed(),
        proptest::option::weighted(0.3, resources().boxed()),
        proptest::option::weighted(0.3, security_context().boxed()),
        proptest::option::weighted(0.3, proptest::collection::vec(toleration().boxed(), 1..3))
            .boxed(),
        proptest::option::weighted(0.2, affinity().boxed()),
        proptest::option::weighted(0.3, dns().boxed()),
        proptest::option::weighted(0.2, proptest::collection::vec(host_alias().boxed(), 1..3))
            .boxed(),
        proptest::option::weighted(0.3, (any::<bool>(), any::<bool>(), any::<bool>())).boxed(),
    )
        .prop_map(
            |(
                liveness,
                startup,
                ports,
                resources,
                context,
                tolerations,
                affinity,
                dns,
                aliases,
                host,
            )| {
                let mut spec = Map::new();
                let mut container = Map::new();
                let put = |map: &mut Map<String, Value>, key: &str, value: Option<Value>| {
                    if let Some(value) = value {
                        map.insert(key.to_string(), value);
                    }
                };
                put(&mut container, "livenessProbe", liveness);
                put(&mut container, "startupProbe", startup);
                put(&mut container, "ports", ports.map(Value::Array));
                put(&mut container, "resources", resources);
                put(&mut container, "securityContext", context);
                put(&mut spec, "tolerations", tolerations.map(Value::Array));
                put(&mut spec, "affinity", affinity);
                if let Some((policy, config)) = dns {
                    if !policy.is_empty() {
                        spec.insert("dnsPolicy".into(), json!(policy));
                    }
                    put(&mut spec, "dnsConfig", config);
                }
                put(&mut spec, "hostAliases", aliases.map(Value::Array));
                if let Some((network, pid, share)) = host {
                    spec.insert("hostNetwork".into(), json!(network));
                    spec.insert("hostPID".into(), json!(pid));
                    spec.insert("shareProcessNamespace".into(), json!(share));
                }
                (spec, container)
            },
        )
        .boxed()
}

fn template() -> impl Strategy<Value = Value> {
    (
        name(),
        labels(),
        annotations(),
        image(),
        proptest::collection::vec(tricky_string(), 0..4),
        proptest::collection::vec(
            (
                prop_oneof![9 => "[A-Z_]{1,8}".boxed(), 1 => tricky_string().boxed()],
                tricky_string(),
            ),
            0..3,
        ),
        proptest::bool::weighted(0.9),
        proptest::option::weighted(0.3, node_selector()),
        proptest::option::weighted(0.5, volume()),
        prop_oneof![
            8 => proptest::sample::select(&["", "Always", "IfNotPresent", "Never"][..]),
            1 => proptest::sample::select(&["always", "Sometimes", " Always"][..]),
        ],
        proptest::option::weighted(0.5, extras()).boxed(),
    )
        .prop_map(
            |(
                name,
                labels,
                annotations,
                image,
                args,
                env,
                containers,
                node_selector,
                volume,
                pull,
                extras,
            )| {
                let env: Vec<Value> = env
                    .into_iter()
                    .map(|(n, v)| json!({"name": n, "value": v}))
                    .collect();
                let containers = if containers {
                    json!([{"name": "main", "image": image, "args": args, "env": env,
                            "imagePullPolicy": pull}])
                } else {
                    json!([])
                };
                let mut spec = json!({"containers": containers});
                if let Some(selector) = node_selector {
                    spec["nodeSelector"] = Value::Object(selector);
                }
                if let Some(volume) = volume {
                    spec["volumes"] = json!([volume]);
                }
                if let Some((pod_fields, container_fields)) = extras {
                    if let Some(container) = spec["containers"].get_mut(0) {
                        container
                            .as_object_mut()
                            .expect("an object")
                            .extend(container_fields);
                    }
                    spec.as_object_mut().expect("an object").extend(pod_fields);
                }
                json!({
                    "apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": name, "namespace": "kube-system"},
                    "template": {
                        "metadata": {"labels": labels, "annotations": annotations},
                        "spec": spec
                    }
                })
            },
        )
}

/// What a rendered template must satisfy; returns why not.
fn check_template(object: &Value) -> Result<(), String> {
    let template = match Template::from_value(object) {
        Ok(t) => t,
        Err(e) => {
            let message = e.to_string();
            return if message.is_empty() {
                Err("refused without a message".into())
            } else {
                Ok(())
            };
        }
    };
    let node = NodeContext::named("n1");
    let manifest = match render::render(&template, &node, &Chain::new(vec![]), "kube-system") {
        Ok(m) => m,
        Err(e) if !e.to_string().is_empty() => return Ok(()),
        Err(_) => return Err("render failed without a message".into()),
    };
    let file = manifest.file_name();
    if file.contains('/')
        || file.contains('\0')
        || file.starts_with('.')
        || file != format!("{}.yaml", template.name)
    {
        return Err(format!("unsafe file name {file:?}"));
    }
    if !template
        .name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "a name the kubelet's file would not hold as is: {:?}",
            template.name
        ));
    }
    // Reads back, with another parser, as exactly the pod that was validated.
    let text = std::str::from_utf8(&manifest.bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let parsed: Value =
        serde_norway::from_str(text).map_err(|e| format!("serde_norway: {e}\n{text}"))?;
    let own = manifest::ownership(&manifest.bytes).ok_or("no ownership")?;
    if !own.intact || own.source != template.id() {
        return Err(format!("ownership {own:?}"));
    }
    let (_, body) = text.split_once('\n').ok_or("no header line")?;
    if to_yaml(&parsed) != body {
        return Err(format!("not a fixed point of parse and write:\n{text}"));
    }
    let pod = template.pod();
    // Every manifest carries its revision as a label of its own, in place
    // of any the template sets; the template's other labels are kept as is.
    let mut parsed = parsed;
    let revision = parsed["metadata"]["labels"]
        .as_object_mut()
        .and_then(|labels| labels.remove(manifest::REVISION_LABEL));
    if revision.as_ref().and_then(Value::as_str) != Some(manifest.revision.as_str()) {
        return Err(format!(
            "revision label {revision:?}, not {:?}\n{text}",
            manifest.revision
        ));
    }
    if parsed["metadata"]["labels"]
        .as_object()
        .is_some_and(|labels| labels.is_empty())
        && pod.pointer("/metadata/labels").is_none()
    {
        parsed["metadata"]
            .as_object_mut()
            .expect("metadata is an object")
            .remove("labels");
    }
    let mut pod = pod.clone();
    if let Some(labels) = pod["metadata"]["labels"].as_object_mut() {
        labels.remove(manifest::REVISION_LABEL);
    }
    for pointer in [
        "/spec/containers",
        "/spec/nodeSelector",
        "/spec/volumes",
        "/metadata/labels",
        "/metadata/name",
    ] {
        if parsed.pointer(pointer) != pod.pointer(pointer) {
            return Err(format!(
                "{pointer} changed: {:?} → {:?}\n{text}",
                pod.pointer(pointer),
                parsed.pointer(pointer)
            ));
        }
    }
    if let Some(Value::Object(annotations)) = pod.pointer("/metadata/annotations") {
        for (k, v) in annotations {
            if parsed["metadata"]["annotations"].get(k) != Some(v) {
                return Err(format!("annotation {k:?} changed\n{text}"));
            }
        }
    }
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        // Keys of any length: a long one must be written as a key YAML
        // readers take (they refuse implicit keys over 1024 characters).
        let map_key = prop_oneof![6 => tricky_string(), 1 => long_key()];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(map_key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn templates_are_refused_or_written_safely(object in template()) {
        if let Err(why) = check_template(&object) {
            prop_assert!(false, "{}\ninput: {}", why, object);
        }
    }

    #[test]
    fn the_yaml_writer_round_trips_through_serde_norway(value in json_value()) {
        let text = to_yaml(&value);
        let parsed: Result<Value, _> = serde_norway::from_str(&text);
        prop_assert!(parsed.is_ok(), "{:?}\n{}", parsed, text);
        prop_assert_eq!(parsed.unwrap(), value, "{}", text);
    }
}

/// The tricky strings, each in every place, as fixed cases (and where
/// inputs that once failed go, with the file proptest saved them in).
#[test]
fn every_tricky_string_in_every_place() {
    for s in TRICKY {
        let object = json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "web", "namespace": "kube-system"},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"example.com/a": s}},
                "spec": {"containers": [{"name": "main", "image": "nginx", "args": [s],
                                         "env": [{"name": "V", "value": s}]}]}
            }
        });
        if let Err(why) = check_template(&object) {
            panic!("{s:?}: {why}");
        }
        // Accepted, so the checks above ran on a manifest.
        let template = Template::from_value(&object).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        render::render(
            &template,
            &NodeContext::named("n1"),
            &Chain::new(vec![]),
            "kube-system",
        )
        .unwrap_or_else(|e| panic!("{s:?}: {e}"));
        let value = json!({ *s: [s, {"k": s}], "n": null });
        let text = to_yaml(&value);
        let parsed: Value =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{s:?}: {e}\n{text}"));
        assert_eq!(parsed, value, "{text}");
    }
}

/// Differential: podstamp's verdict on a random template's pod equals the
/// kubelet's own static pod decoder's (the harness's podstamp-manifestcheck,
/// run once over a directory of them): every manifest podstamp writes, the
/// kubelet accepts; every pod podstamp refuses (by its own rules or by its
/// kubelet check), the kubelet refuses too. The generator reaches probes,
/// ports, resources, security contexts, tolerations, affinity, DNS and host
/// aliases ([`extras`]). Prints the counts.
#[test]
fn podstamp_and_the_kubelet_agree_on_random_templates() {
    use podstamp::kube_check::KubeCheck;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    // One decoder run over them all; at most 10000 templates.
    let cases = config().cases.clamp(256, 10_000);
    let mut runner = TestRunner::new(Config::default());
    let strategy = template();
    let dir = tempfile::tempdir().unwrap();
    let node = NodeContext::named("n1");
    let chain = Chain::new(vec![]);
    // File name -> podstamp's verdict (and whether its own rules decided).
    let mut podstamp = std::collections::BTreeMap::new();
    let mut read = 0;
    for _ in 0..cases {
        let object = strategy.new_tree(&mut runner).unwrap().current();
        // Not a v1 PodTemplate at all (types, unknown fields): podstamp's
        // own schema, which the kubelet's decoder does not share.
        let Ok(template) = Template::from_value(&object) else {
            continue;
        };
        read += 1;
        let mut pod = template.pod();
        pod["metadata"]["namespace"] = json!("kube-system");
        let bytes = manifest::finish_unverified(pod, "kube-system", &template.id())
            .peek()
            .bytes
            .clone();
        let file = format!("{}.yaml", template.name);
        // A file the kubelet could not be given (a name longer than a file
        // name may be, which podstamp refuses), or one already written.
        if file.starts_with('.')
            || file.contains('/')
            || file.len() > 255
            || dir.path().join(&file).exists()
        {
            continue;
        }
        let verdict = match render::render_unverified(
            &template,
            &node,
            &chain,
            "kube-system",
            &mut |_, _, _| {},
        ) {
            Err(e) => (Err(e.to_string()), true),
            Ok(rendered) => (
                rendered
                    .verify_with(KubeCheck::shared())
                    .map(drop)
                    .map_err(|e| e.to_string()),
                false,
            ),
        };
        std::fs::write(dir.path().join(&file), &bytes).unwrap();
        podstamp.insert(file, verdict);
    }
    let kubelet = common::kubelet_verdicts(dir.path(), "n1");
    let mut disagreements = Vec::new();
    let (mut accepted, mut own, mut checked) = (0, 0, 0);
    for (file, (verdict, own_rule)) in &podstamp {
        let theirs = kubelet
            .get(file)
            .unwrap_or_else(|| panic!("no verdict from the kubelet for {file}"));
        match (verdict, own_rule) {
            (Ok(()), _) => accepted += 1,
            (Err(_), true) => own += 1,
            (Err(_), false) => checked += 1,
        }
        if verdict.is_ok() != theirs.is_ok() {
            disagreements.push((
                file.clone(),
                format!("{file}: kubelet {theirs:?}, podstamp {verdict:?}"),
            ));
        }
    }
    println!(
        "kubelet parity, random templates: {} cases ({read} of {cases} generated read as templates; {accepted} accepted, {own} refused by podstamp's own rules, {checked} by its kubelet check), {} disagreements",
        podstamp.len(),
        disagreements.len()
    );
    if let Some((file, _)) = disagreements.first() {
        let text =
            String::from_utf8_lossy(&std::fs::read(dir.path().join(file)).unwrap()).into_owned();
        let lines: Vec<&str> = disagreements
            .iter()
            .map(|(_, line)| line.as_str())
            .collect();
        panic!(
            "{} disagreements:\n{}\nthe first manifest:\n{text}",
            disagreements.len(),
            lines.join("\n")
        );
    }
    // Each kind of verdict is reached, so the comparison tests something.
    assert!(
        accepted >= cases / 50 && own >= cases / 50 && checked >= cases / 50,
        "too few of a kind: {accepted} accepted, {own} by podstamp's rules, {checked} by its check, of {cases}"
    );
}
