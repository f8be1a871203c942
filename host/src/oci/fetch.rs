//! Talking to a registry with every body it sends bounded while it is read:
//! the parts of the OCI distribution protocol podstamp uses (GET a manifest
//! or a blob; push a blob by a monolithic upload and a manifest by PUT;
//! answer the registry's auth challenge), on reqwest.
//!
//! `oci-client` reads whole bodies before anyone can look at their size
//! (manifests, error answers, token answers), so a hostile or broken
//! registry could make a node hold gigabytes; pulls and pushes go through
//! here instead (`oci-client` is kept for parsing references).
//!
//! Invariants:
//! * no body is held past its cap: a `Content-Length` over the cap is
//!   refused before a byte of the body is read, and a body without one
//!   (chunked) is read chunk by chunk and refused at the chunk that passes
//!   the cap, the connection dropped; the caps are the caller's (a manifest
//!   [`super::MAX_MANIFEST_BYTES`], a layer the size its manifest declares),
//!   a token answer [`MAX_TOKEN_BYTES`], an error's text [`MAX_ERROR_TEXT`]
//!   (read that far, the rest dropped);
//! * credentials are sent only after the registry asks for them (a 401 and
//!   its challenge), and only over HTTPS unless the caller chose plain HTTP
//!   (`https_only`, redirects and token realms included);
//! * every failure is an [`OciError`] naming the registry or the reference.

use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, LOCATION,
    WWW_AUTHENTICATE,
};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::error::{OciError, Oversize};
use super::options::RegistryOptions;

/// The largest token answer read from a registry's auth realm (a bearer
/// token is a few KiB at most).
pub const MAX_TOKEN_BYTES: usize = 64 << 10;
/// How much of an error answer is read for its message; the rest is dropped.
pub const MAX_ERROR_TEXT: usize = 4 << 10;

/// Why a capped read stopped.
#[derive(Debug)]
pub enum ReadFault {
    Over(Oversize),
    Http(reqwest::Error),
}

/// The body of `response`, at most `cap` bytes (see the invariants).
pub async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, ReadFault> {
    if let Some(declared) = response.content_length()
        && declared > cap as u64
    {
        return Err(ReadFault::Over(Oversize::Declared(declared)));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadFault::Http)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadFault::Over(Oversize::Past(cap)));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The first [`MAX_ERROR_TEXT`] bytes of an error answer, on one line.
async fn error_text(mut response: reqwest::Response) -> String {
    let mut text = Vec::new();
    while text.len() < MAX_ERROR_TEXT {
        match response.chunk().await {
            Ok(Some(chunk)) => text.extend_from_slice(&chunk),
            _ => break,
        }
    }
    text.truncate(MAX_ERROR_TEXT);
    String::from_utf8_lossy(&text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The HTTP client for the registries: the configured CA besides the
/// system's, the configured timeout on connect and on each read, HTTPS only
/// unless plain HTTP was asked for.
pub fn http_client(options: &RegistryOptions) -> Result<reqwest::Client, OciError> {
    // reqwest is built without a TLS provider of its own: ring, as kube.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(options.timeout)
        .read_timeout(options.timeout)
        .https_only(!options.insecure_http)
        .user_agent(concat!("podstamp/", env!("CARGO_PKG_VERSION")));
    let ca_error = |path: &std::path::Path, detail: String| OciError::Ca {
        path: path.display().to_string(),
        detail,
    };
    if let Some(path) = &options.ca {
        let pem = std::fs::read(path).map_err(|e| ca_error(path.as_path(), e.to_string()))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| ca_error(path.as_path(), error_chain(&e)))?;
        if certificates.is_empty() {
            return Err(ca_error(path.as_path(), "no PEM certificate in it".into()));
        }
        builder = builder.tls_certs_merge(certificates);
    }
    builder.build().map_err(|e| match &options.ca {
        Some(path) => ca_error(path.as_path(), error_chain(&e)),
        None => OciError::Registry {
            registry: "(any)".into(),
            detail: error_chain(&e),
        },
    })
}

/// An error and its sources, on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The pulls of one repository of one registry, keeping the authorization
/// its challenge led to for the next request.
pub struct Session {
    http: reqwest::Client,
    /// `SCHEME://HOST/v2/REPOSITORY`.
    base: String,
    registry: String,
    repository: String,
    /// User and password for this registry, if the credentials have them.
    basic: Option<(String, String)>,
    /// Where the credentials came from, for a 401's message.
    credentials: String,
    authorization: Option<Authorization>,
    timeout: std::time::Duration,
    /// What a token is asked for: `pull`, or `pull,push`.
    scope: &'static str,
}

/// What a 401's challenge led to, sent with every later request.
enum Authorization {
    Basic,
    Bearer(HeaderValue),
}

/// The parts of an OCI error answer read for its meaning.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    errors: Vec<EnvelopeError>,
}

#[derive(Deserialize)]
struct EnvelopeError {
    #[serde(default)]
    code: String,
}

/// A token realm's answer (distribution's token spec names it either way).
#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Session {
    pub fn new(
        http: reqwest::Client,
        options: &RegistryOptions,
        registry: &str,
        repository: &str,
        basic: Option<(String, String)>,
    ) -> Session {
        let scheme = if options.insecure_http {
            "http"
        } else {
            "https"
        };
        Session {
            http,
            base: format!("{scheme}://{registry}/v2/{repository}"),
            registry: registry.to_string(),
            repository: repository.to_string(),
            basic,
            credentials: options.credentials.to_string(),
            authorization: None,
            timeout: options.timeout,
            scope: "pull",
        }
    }

    /// The same session, for pushing (its token asked for push too).
    pub fn for_push(mut self) -> Session {
        self.scope = "pull,push";
        self
    }

    /// GETs `PATH` (`manifests/DIGEST`, `blobs/DIGEST`) of the repository
    /// and reads its body up to `cap`; `shown` names the reference in
    /// errors. A body over the cap is `Err(Ok(how))`, for the caller to say
    /// what it was; any other failure is `Err(Err(error))`.
    pub async fn get(
        &mut self,
        path: &str,
        accept: &str,
        cap: usize,
        shown: &str,
    ) -> Result<Vec<u8>, Result<Oversize, OciError>> {
        let url = format!("{}/{path}", self.base);
        let response = self
            .exchange(Method::GET, &url, &[(ACCEPT, accept)], None)
            .await
            .map_err(Err)?;
        let status = response.status();
        if !status.is_success() {
            return Err(Err(self.refused(status, response, shown).await));
        }
        read_capped(response, cap).await.map_err(|e| match e {
            ReadFault::Over(how) => Ok(how),
            ReadFault::Http(e) => Err(self.http_error(e)),
        })
    }

    /// Pushes the blob `bytes` whose digest is `digest` (a monolithic
    /// upload: POST for a location, PUT there with the digest); `shown`
    /// names the target in errors. Answers are read only as far as an
    /// error's text.
    pub async fn push_blob(
        &mut self,
        digest: &str,
        bytes: &[u8],
        shown: &str,
    ) -> Result<(), OciError> {
        let start = format!("{}/blobs/uploads/", self.base);
        let response = self
            .exchange(Method::POST, &start, &[(CONTENT_LENGTH, "0")], Some(&[]))
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(status, response, shown).await);
        }
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        drop(response);
        let location = location
            .and_then(|l| reqwest::Url::parse(&start).ok()?.join(&l).ok())
            .ok_or_else(|| OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("POST {start} answered {status} without a usable Location"),
            })?;
        let mut url = location;
        url.query_pairs_mut().append_pair("digest", digest);
        let response = self
            .exchange(
                Method::PUT,
                url.as_str(),
                &[(CONTENT_TYPE, "application/octet-stream")],
                Some(bytes),
            )
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(status, response, shown).await);
        }
        Ok(())
    }

    /// PUTs the manifest `bytes` of `media_type` as `reference` (a tag or a
    /// digest) of the repository.
    pub async fn push_manifest(
        &mut self,
        reference: &str,
        bytes: &[u8],
        media_type: &str,
        shown: &str,
    ) -> Result<(), OciError> {
        let url = format!("{}/manifests/{reference}", self.base);
        let response = self
            .exchange(
                Method::PUT,
                &url,
                &[(CONTENT_TYPE, media_type)],
                Some(bytes),
            )
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(status, response, shown).await);
        }
        Ok(())
    }

    /// Sends a request, answering a 401's challenge once and sending it
    /// again; the answer, of any status, its body unread.
    async fn exchange(
        &mut self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, &str)],
        body: Option<&[u8]>,
    ) -> Result<reqwest::Response, OciError> {
        let response = self.send(method.clone(), url, headers, body).await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        drop(response);
        self.authorize(challenge.as_deref()).await?;
        self.send(method, url, headers, body).await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, &str)],
        body: Option<&[u8]>,
    ) -> Result<reqwest::Response, OciError> {
        let mut request = self.http.request(method, url);
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        if let Some(body) = body {
            request = request.body(body.to_vec());
        }
        match (&self.authorization, &self.basic) {
            (Some(Authorization::Basic), Some((user, password))) => {
                request = request.basic_auth(user, Some(password));
            }
            (Some(Authorization::Bearer(token)), _) => {
                request = request.header(AUTHORIZATION, token.clone());
            }
            _ => {}
        }
        request.send().await.map_err(|e| self.http_error(e))
    }

    /// Answers a 401's challenge: Basic with the credentials' user and
    /// password, or Bearer with a token from the realm it names.
    async fn authorize(&mut self, challenge: Option<&str>) -> Result<(), OciError> {
        let unauthorized = || OciError::Unauthorized {
            registry: self.registry.clone(),
            credentials: self.credentials.clone(),
        };
        if self.authorization.is_some() {
            // Already answered once: the credentials are what is refused.
            return Err(unauthorized());
        }
        let challenge = challenge.unwrap_or_default();
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            if self.basic.is_none() {
                return Err(unauthorized());
            }
            self.authorization = Some(Authorization::Basic);
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized());
        }
        let params = challenge_params(params);
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let Some(realm) = param("realm") else {
            return Err(OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("a Bearer challenge without a realm: {challenge}"),
            });
        };
        let mut query = vec![(
            "scope",
            format!("repository:{}:{}", self.repository, self.scope),
        )];
        if let Some(service) = param("service") {
            query.push(("service", service));
        }
        let mut request = self.http.get(&realm).query(&query);
        if let Some((user, password)) = &self.basic {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(|e| self.http_error(e))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(unauthorized());
        }
        if !status.is_success() {
            let text = error_text(response).await;
            return Err(OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("its token realm {realm} answered {status}: {text}"),
            });
        }
        let body = read_capped(response, MAX_TOKEN_BYTES)
            .await
            .map_err(|e| match e {
                ReadFault::Over(how) => OciError::Registry {
                    registry: self.registry.clone(),
                    detail: format!(
                        "its token realm {realm} answered {how}, over the limit of {MAX_TOKEN_BYTES}; refused"
                    ),
                },
                ReadFault::Http(e) => self.http_error(e),
            })?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("its token realm {realm} answered no token: {e}"),
            })?;
        let token = answer
            .token
            .or(answer.access_token)
            .ok_or_else(|| OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("its token realm {realm} answered no token"),
            })?;
        let mut value =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| OciError::Registry {
                registry: self.registry.clone(),
                detail: format!("its token realm {realm} answered a token that is not a header"),
            })?;
        value.set_sensitive(true);
        self.authorization = Some(Authorization::Bearer(value));
        Ok(())
    }

    /// The error a non-success answer means, from its status and the codes
    /// of its (capped) OCI error envelope.
    async fn refused(
        &self,
        status: StatusCode,
        response: reqwest::Response,
        shown: &str,
    ) -> OciError {
        let text = error_text(response).await;
        let codes: Vec<String> = serde_json::from_str::<Envelope>(&text)
            .map(|e| e.errors.into_iter().map(|e| e.code).collect())
            .unwrap_or_default();
        let has = |names: &[&str]| codes.iter().any(|c| names.contains(&c.as_str()));
        let detail = if text.is_empty() {
            status.to_string()
        } else {
            format!("{status}: {text}")
        };
        if status == StatusCode::UNAUTHORIZED || has(&["UNAUTHORIZED", "DENIED"]) {
            OciError::Unauthorized {
                registry: self.registry.clone(),
                credentials: self.credentials.clone(),
            }
        } else if status == StatusCode::NOT_FOUND
            || has(&[
                "MANIFEST_UNKNOWN",
                "BLOB_UNKNOWN",
                "NAME_UNKNOWN",
                "NOT_FOUND",
            ])
        {
            OciError::Unknown {
                reference: shown.to_string(),
                detail,
            }
        } else {
            OciError::Registry {
                registry: self.registry.clone(),
                detail,
            }
        }
    }

    fn http_error(&self, e: reqwest::Error) -> OciError {
        if e.is_timeout() {
            OciError::Timeout {
                registry: self.registry.clone(),
                timeout: self.timeout,
            }
        } else if e.is_connect() {
            OciError::Unreachable {
                registry: self.registry.clone(),
                detail: error_chain(&e),
            }
        } else {
            OciError::Registry {
                registry: self.registry.clone(),
                detail: error_chain(&e),
            }
        }
    }
}

/// `key="value", key=value` pairs of a challenge (RFC 9110 auth-params).
fn challenge_params(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((key, value));
        rest = next.trim_start().trim_start_matches(',');
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_read_as_the_rfc_says() {
        assert_eq!(
            challenge_params(
                r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            vec![
                (
                    "realm".to_string(),
                    "https://auth.example/token".to_string()
                ),
                ("service".to_string(), "registry.example".to_string()),
                ("scope".to_string(), "repository:a/b:pull".to_string()),
            ]
        );
        assert_eq!(
            challenge_params(r#"realm=plain, service="a\"b""#),
            vec![
                ("realm".to_string(), "plain".to_string()),
                ("service".to_string(), "a\"b".to_string()),
            ]
        );
    }
}
