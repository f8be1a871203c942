//! Every request the daemon's client sends to the API server, counted by
//! resource and verb (`podstamp_api_requests_total`): what a node agent
//! costs the control plane is something its operators need to see, and the
//! API server's own counters cannot tell one client from another.
//!
//! Invariants: counting never changes or delays a request (a tower layer
//! that only looks at the method and path); the label set is bounded — the
//! resource is taken from the path only when it looks like a resource name
//! (lowercase letters, at most 63), a subresource is appended, anything else
//! counts as `other`, and past [`super::metrics::MAX_API_SERIES`] distinct
//! pairs new ones count as `other` too (the metrics keep that bound).

use std::sync::Arc;

use super::metrics::Metrics;

/// The tower layer that counts each request into `metrics`.
pub fn layer(
    metrics: Arc<Metrics>,
) -> tower::util::MapRequestLayer<
    impl Fn(http::Request<kube::client::Body>) -> http::Request<kube::client::Body> + Clone,
> {
    tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        let (resource, verb) = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        metrics.api_request(resource, verb);
        request
    })
}

/// (resource, verb) of a request, in the API server's words (`list`,
/// `watch`, `get`, `create`, `update`, `patch`, `delete`,
/// `deletecollection`).
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> (String, &'static str) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest = match parts.first() {
        Some(&"api") if parts.len() >= 2 => &parts[2..],
        Some(&"apis") if parts.len() >= 3 => &parts[3..],
        _ => return ("other".into(), verb(method, false, query)),
    };
    // namespaces/NS/RESOURCE/... is namespaced; namespaces[/NS] is the
    // namespaces resource itself.
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        _ => rest,
    };
    let named = rest.len() >= 2;
    let resource = match rest {
        [resource] | [resource, _] => resource.to_string(),
        [resource, _, sub] => format!("{resource}/{sub}"),
        _ => return ("other".into(), verb(method, named, query)),
    };
    let plausible = !resource.is_empty()
        && resource.len() <= 63
        && resource.chars().all(|c| c.is_ascii_lowercase() || c == '/');
    (
        if plausible { resource } else { "other".into() },
        verb(method, named, query),
    )
}

fn verb(method: &http::Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    });
    match *method {
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn requests_are_named_as_the_api_server_names_them() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/ns/podtemplates",
                None,
                ("podtemplates", "list"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/podtemplates",
                Some("labelSelector=a&watch=true&resourceVersion=5"),
                ("podtemplates", "watch"),
            ),
            (Method::GET, "/api/v1/nodes/n1", None, ("nodes", "get")),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/podstamp-node.n1",
                None,
                ("leases", "update"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                None,
                ("events", "create"),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/p/status",
                None,
                ("pods/status", "patch"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns",
                None,
                ("namespaces", "get"),
            ),
            (Method::GET, "/version", None, ("other", "list")),
            (
                Method::GET,
                "/api/v1/namespaces/ns/Weird%20Thing",
                None,
                ("other", "list"),
            ),
        ];
        for (method, path, query, (resource, verb)) in cases {
            assert_eq!(
                classify(&method, path, query),
                (resource.to_string(), verb),
                "{method} {path}"
            );
        }
    }
}
