//! The probes a static pod declares, as podstamp runs them: each
//! container's `startupProbe` and `readinessProbe` with its own thresholds.
//!
//! Invariants:
//! * Only a `hostNetwork` pod's probes are run: its ports are the node's,
//!   reachable at 127.0.0.1 (or the probe's `host`) from podstamp's own
//!   host network. Another pod's address is in a network namespace podstamp
//!   does not enter; its probes are not run, and its readiness is read from
//!   the runtime alone (every container running).
//! * `exec` probes are not run: podstamp does not enter containers (an
//!   exec is a write to the runtime: a new process in the container). Such
//!   a probe is reported as not run and counts as not declared, so that
//!   such a pod is ready once its containers run, as the runtime shows
//!   them; its own kubelet still runs the probe (and restarts a container
//!   whose startup probe fails, which the crash-loop rule then sees).
//! * A `grpc` probe is run as the kubelet runs it: the gRPC health protocol
//!   (`grpc.health.v1.Health/Check`, its `service` or ""), in plain text,
//!   at 127.0.0.1 (the kubelet's is the pod's IP, the node's own for a
//!   `hostNetwork` pod; a `grpc` action has no `host`).
//! * Defaults are the API's: `periodSeconds` 10, `timeoutSeconds` 1,
//!   `successThreshold` 1, `failureThreshold` 3, `initialDelaySeconds` 0;
//!   an httpGet's scheme HTTP and path `/`; a named port is looked up in
//!   the container's `ports`.

use std::time::Duration;

use serde_json::Value;

/// Which probe of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Startup,
    Readiness,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Startup => "startup",
            Kind::Readiness => "readiness",
        }
    }
}

/// What a probe checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Http {
        https: bool,
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: String,
        port: u16,
    },
    Grpc {
        host: String,
        port: u16,
        /// The service asked about; "" (the server as a whole) by default.
        service: String,
    },
}

/// One declared probe podstamp runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub container: String,
    pub kind: Kind,
    pub action: Action,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Probe {
    /// `startup probe of container main`, for messages.
    pub fn what(&self) -> String {
        format!("{} (container {})", self.kind.as_str(), self.container)
    }
}

/// What a pod declares: the probes podstamp runs, and those it does not
/// (with why), for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Declared {
    pub run: Vec<Probe>,
    pub not_run: Vec<String>,
}

/// The probes of `pod` (a static pod manifest as JSON).
pub fn declared(pod: &Value) -> Declared {
    let mut out = Declared::default();
    let host_network = pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true);
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for c in &containers {
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        for (kind, field) in [
            (Kind::Startup, "startupProbe"),
            (Kind::Readiness, "readinessProbe"),
        ] {
            let Some(p) = c.get(field) else { continue };
            let what = format!("{} probe of container {name}", kind.as_str());
            if !host_network {
                out.not_run.push(format!(
                    "{what}: the pod is not hostNetwork, its address is not the node's"
                ));
                continue;
            }
            match action(p, c) {
                Ok(action) => out.run.push(Probe {
                    container: name.to_string(),
                    kind,
                    action,
                    initial_delay: seconds(p, "initialDelaySeconds", 0),
                    period: seconds(p, "periodSeconds", 10),
                    timeout: seconds(p, "timeoutSeconds", 1),
                    success_threshold: number(p, "successThreshold", 1),
                    failure_threshold: number(p, "failureThreshold", 3),
                }),
                Err(why) => out.not_run.push(format!("{what}: {why}")),
            }
        }
    }
    out
}

fn number(p: &Value, field: &str, default: u32) -> u32 {
    p.get(field)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

fn seconds(p: &Value, field: &str, default: u32) -> Duration {
    let n = p
        .get(field)
        .and_then(Value::as_u64)
        .unwrap_or(u64::from(default));
    Duration::from_secs(n)
}

/// What probe `p` of container `c` checks; why it is not run otherwise.
fn action(p: &Value, c: &Value) -> Result<Action, String> {
    let host = |h: &Value| {
        h.get("host")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty())
            .unwrap_or("127.0.0.1")
            .to_string()
    };
    if let Some(h) = p.get("httpGet") {
        let headers = h
            .get("httpHeaders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|x| {
                Some((
                    x.get("name")?.as_str()?.to_string(),
                    x.get("value")?.as_str().unwrap_or_default().to_string(),
                ))
            })
            .collect();
        return Ok(Action::Http {
            https: h.get("scheme").and_then(Value::as_str) == Some("HTTPS"),
            host: host(h),
            port: port(h, c)?,
            path: h
                .get("path")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .unwrap_or("/")
                .to_string(),
            headers,
        });
    }
    if let Some(t) = p.get("tcpSocket") {
        return Ok(Action::Tcp {
            host: host(t),
            port: port(t, c)?,
        });
    }
    if p.get("exec").is_some() {
        return Err("exec probes are not run by podstamp (it does not enter containers)".into());
    }
    if let Some(g) = p.get("grpc") {
        // An int32 in the API: no named port, unlike httpGet and tcpSocket.
        let port = match g.get("port") {
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("port {n} is not a port number"))?,
            _ => return Err("its grpc action has no port number".into()),
        };
        return Ok(Action::Grpc {
            host: "127.0.0.1".into(),
            port,
            service: g
                .get("service")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        });
    }
    Err("no handler podstamp knows".into())
}

/// A probe's `port`: a number, or the name of one of the container's ports.
fn port(handler: &Value, c: &Value) -> Result<u16, String> {
    match handler.get("port") {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("port {n} is not a port number")),
        Some(Value::String(name)) => c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name.as_str()))
            .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| format!("port {name:?} is not one of the container's named ports")),
        _ => Err("it has no port".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_host_network_pods_probes_are_read_with_their_thresholds_and_defaults() {
        let pod = json!({"spec": {"hostNetwork": true, "containers": [{
            "name": "api",
            "ports": [{"name": "https", "containerPort": 6443}],
            "startupProbe": {"httpGet": {"scheme": "HTTPS", "port": "https", "path": "/livez",
                "httpHeaders": [{"name": "X-A", "value": "b"}]},
                "failureThreshold": 24, "periodSeconds": 2},
            "readinessProbe": {"tcpSocket": {"port": 6443, "host": "10.0.0.1"},
                "timeoutSeconds": 15},
        }, {"name": "side", "livenessProbe": {"tcpSocket": {"port": 1}},
            "readinessProbe": {"exec": {"command": ["true"]}}}]}});
        let d = declared(&pod);
        assert_eq!(d.run.len(), 2);
        assert_eq!(
            d.run[0],
            Probe {
                container: "api".into(),
                kind: Kind::Startup,
                action: Action::Http {
                    https: true,
                    host: "127.0.0.1".into(),
                    port: 6443,
                    path: "/livez".into(),
                    headers: vec![("X-A".into(), "b".into())],
                },
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(2),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 24,
            }
        );
        assert_eq!(
            d.run[1].action,
            Action::Tcp {
                host: "10.0.0.1".into(),
                port: 6443
            }
        );
        assert_eq!(
            (d.run[1].period, d.run[1].failure_threshold),
            (Duration::from_secs(10), 3)
        );
        assert_eq!(d.not_run.len(), 1);
        assert!(
            d.not_run[0].contains("exec probes are not run"),
            "{:?}",
            d.not_run
        );
    }

    #[test]
    fn another_pods_probes_and_bad_ports_are_not_run_and_say_why() {
        let probe = json!({"tcpSocket": {"port": "web"}});
        let pod = json!({"spec": {"containers": [{"name": "c", "readinessProbe": probe}]}});
        let d = declared(&pod);
        assert!(d.run.is_empty());
        assert!(d.not_run[0].contains("not hostNetwork"), "{:?}", d.not_run);
        let pod = json!({"spec": {"hostNetwork": true,
            "containers": [{"name": "c", "readinessProbe": probe}]}});
        assert!(declared(&pod).not_run[0].contains("\"web\" is not one of"));
    }

    #[test]
    fn a_grpc_probe_is_run_on_the_node_with_its_service_and_a_named_port_is_not() {
        let pod = json!({"spec": {"hostNetwork": true, "containers": [{"name": "etcd",
            "startupProbe": {"grpc": {"port": 2379}},
            "readinessProbe": {"grpc": {"port": 2379, "service": "etcd"}}},
            {"name": "side", "readinessProbe": {"grpc": {"port": "client"}}}]}});
        let d = declared(&pod);
        let actions: Vec<_> = d.run.iter().map(|p| p.action.clone()).collect();
        let grpc = |service: &str| Action::Grpc {
            host: "127.0.0.1".into(),
            port: 2379,
            service: service.into(),
        };
        assert_eq!(actions, [grpc(""), grpc("etcd")]);
        assert_eq!(d.not_run.len(), 1);
        assert!(
            d.not_run[0].contains("container side: its grpc action has no port number"),
            "{:?}",
            d.not_run
        );
    }
}
