//! Runs one probe's action against the node, as the kubelet would: an
//! `httpGet` passes with a status from 200 to 399 (redirects followed; an
//! HTTPS certificate not verified, as the kubelet does not verify it), a
//! `tcpSocket` once the connection opens, a `grpc` probe when the gRPC
//! health protocol answers `SERVING` for its service (plain text, as the
//! kubelet's: it has no TLS option); each within the probe's
//! `timeoutSeconds`.
//!
//! Invariant: one probe, one connection, closed when it returns; the
//! message of a failure names the address and what happened, never a body.

use std::time::Duration;

use tokio::net::TcpStream;

use super::spec::Action;

/// The kubelet's User-Agent for its probes, so that a server that logs or
/// filters probes treats podstamp's the same.
const USER_AGENT: &str = "kube-probe/podstamp";

/// Runs `action` within `timeout`: Ok, or what failed.
pub async fn run(action: &Action, timeout: Duration) -> Result<(), String> {
    let timeout = timeout.max(Duration::from_secs(1));
    match action {
        Action::Tcp { host, port } => {
            let address = format!("{host}:{port}");
            match tokio::time::timeout(timeout, TcpStream::connect(&address)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("tcp {address}: {e}")),
                Err(_) => Err(format!("tcp {address}: no connection within {timeout:?}")),
            }
        }
        Action::Grpc {
            host,
            port,
            service,
        } => grpc(&bracketed(host), *port, service, timeout).await,
        Action::Http {
            https,
            host,
            port,
            path,
            headers,
        } => {
            let scheme = if *https { "https" } else { "http" };
            let url = format!("{scheme}://{}:{port}{path}", bracketed(host));
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .tls_danger_accept_invalid_certs(true)
                .user_agent(USER_AGENT)
                .no_proxy()
                .build()
                .map_err(|e| format!("GET {url}: {e}"))?;
            let mut request = client.get(&url);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            match request.send().await {
                Ok(response) if (200..400).contains(&response.status().as_u16()) => Ok(()),
                Ok(response) => Err(format!("GET {url}: HTTP {}", response.status().as_u16())),
                Err(e) => Err(format!("GET {url}: {}", error_chain(&e))),
            }
        }
    }
}

/// A literal IPv6 host is bracketed in a URL.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// `grpc.health.v1.Health/Check` for `service` at `host:port`, the
/// connection and the call within `timeout`.
async fn grpc(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let address = format!("{host}:{port}");
    let what = format!("grpc {address} service {service:?}");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("{what}: {e}"))?
        .user_agent(USER_AGENT)
        .map_err(|e| format!("{what}: {e}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let check = async {
        let channel = endpoint.connect().await.map_err(|e| error_chain(&e))?;
        let request = HealthCheckRequest {
            service: service.to_string(),
        };
        match HealthClient::new(channel).check(request).await {
            Ok(answer) => Ok(answer.into_inner().status),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                Err("the server does not implement the gRPC health protocol".to_string())
            }
            Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
        }
    };
    match tokio::time::timeout(timeout, check).await {
        Ok(Ok(status)) if status == ServingStatus::Serving as i32 => Ok(()),
        Ok(Ok(status)) => Err(format!(
            "{what}: {}",
            ServingStatus::try_from(status)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_else(|_| format!("status {status}"))
        )),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
    }
}

/// An error and its sources, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server on 127.0.0.1 that answers each request with `status`; its
    /// port. Serves at most `n` connections (bounded), then stops.
    async fn serve(status: u16, n: usize) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for _ in 0..n {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        port
    }

    fn http(port: u16) -> Action {
        Action::Http {
            https: false,
            host: "127.0.0.1".into(),
            port,
            path: "/readyz".into(),
            headers: vec![("X-Probe".into(), "1".into())],
        }
    }

    #[tokio::test]
    async fn http_passes_on_2xx_3xx_and_fails_otherwise_naming_the_url() {
        let second = Duration::from_secs(1);
        assert_eq!(run(&http(serve(200, 1).await), second).await, Ok(()));
        let e = run(&http(serve(503, 1).await), second).await.unwrap_err();
        assert!(e.contains("/readyz: HTTP 503"), "{e}");
        // Nothing listens (a port just freed).
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = run(&http(port), second).await.unwrap_err();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }

    /// A gRPC server on 127.0.0.1 with the health service: "" serving,
    /// `etcd` not serving; its port.
    async fn serve_grpc() -> u16 {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("etcd", tonic_health::ServingStatus::NotServing)
            .await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        port
    }

    #[tokio::test]
    async fn grpc_passes_when_its_service_is_serving_and_says_what_it_is_otherwise() {
        let port = serve_grpc().await;
        let grpc = |port, service: &str| Action::Grpc {
            host: "127.0.0.1".into(),
            port,
            service: service.into(),
        };
        let second = Duration::from_secs(1);
        assert_eq!(run(&grpc(port, ""), second).await, Ok(()));
        let e = run(&grpc(port, "etcd"), second).await.unwrap_err();
        assert_eq!(
            e,
            format!("grpc 127.0.0.1:{port} service \"etcd\": NOT_SERVING")
        );
        let e = run(&grpc(port, "other"), second).await.unwrap_err();
        assert!(e.contains("service \"other\": NotFound"), "{e}");
        // A server that is not gRPC at all (HTTP/1), and nothing listening.
        let e = run(&grpc(serve(200, 1).await, ""), second)
            .await
            .unwrap_err();
        assert!(e.starts_with("grpc 127.0.0.1:"), "{e}");
        let free = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = run(&grpc(free, ""), second).await.unwrap_err();
        assert!(e.contains(&format!("127.0.0.1:{free}")), "{e}");
    }

    #[tokio::test]
    async fn tcp_passes_once_a_connection_opens() {
        let port = serve(200, 1).await;
        let tcp = |port| Action::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        assert_eq!(run(&tcp(port), Duration::from_secs(1)).await, Ok(()));
        let free = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = run(&tcp(free), Duration::from_secs(1)).await.unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }
}
