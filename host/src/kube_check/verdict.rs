//! The helper's verdict, and how podstamp words a refusal.
//!
//! A refusal keeps every problem the kubelet found, each as one
//! [`FieldError`] (the field as Kubernetes names it, and what it must be: the
//! fix), in the order Kubernetes reported them; the kubelet's own error text
//! is kept beside them for logs and for the differential tests. A verdict
//! that cannot be read is not a refusal but a check that failed: nothing is
//! written either way.

use std::fmt;

use serde::Deserialize;

use crate::validate::{FieldError, Invalid};

/// The kubelet would refuse the manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// The Kubernetes release whose kubelet decided, e.g. `v1.37.2`.
    pub kubernetes: String,
    /// One per problem.
    pub problems: Invalid,
    /// The kubelet's own error text, as its log would show it.
    pub kubelet_error: String,
    /// Not the kubelet's refusal but the setting's: fields newer than this
    /// kubelet version (the node's).
    pub newer_than: Option<String>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.newer_than {
            None => write!(
                f,
                "the kubelet ({}) would refuse it, and stop the pod running from it: {}",
                self.kubernetes, self.problems
            ),
            Some(kubelet) => write!(
                f,
                "the node's kubelet {kubelet} would run it without the fields it does not know ({}=true refuses that): {}",
                super::REFUSE_NEWER_ENV,
                self.problems
            ),
        }
    }
}

impl Refusal {
    /// Fields the node's kubelet would drop, refused by the setting
    /// ([`super::REFUSE_NEWER_ENV`]).
    pub fn newer(fields: &[String], kubelet: &str, kubernetes: &str) -> Refusal {
        let problems: Vec<FieldError> = fields
            .iter()
            .map(|field| FieldError {
                field: field.clone(),
                message: format!(
                    "is newer than the node's kubelet {kubelet}, which would run the pod without it: remove it, or upgrade the kubelet"
                ),
            })
            .collect();
        Refusal {
            kubernetes: kubernetes.to_string(),
            kubelet_error: format!("fields newer than kubelet {kubelet}: {}", fields.join(", ")),
            problems: Invalid(problems),
            newer_than: Some(kubelet.to_string()),
        }
    }

    pub fn too_large(size: usize, limit: usize) -> Refusal {
        let message = format!(
            "the manifest is {size} bytes; the kubelet reads at most {limit}: make the pod smaller"
        );
        Refusal {
            kubernetes: "any".into(),
            problems: Invalid(vec![FieldError {
                field: String::new(),
                message: message.clone(),
            }]),
            kubelet_error: message,
            newer_than: None,
        }
    }
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    error: String,
    #[serde(default)]
    fields: Vec<Problem>,
    /// Of an accepted pod: the fields the node's (older) kubelet would not honour.
    #[serde(default)]
    newer: Vec<String>,
}

#[derive(Deserialize)]
struct Problem {
    field: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    detail: String,
}

/// Reads one verdict: Ok with the fields newer than the node's kubelet, or
/// the refusal; `Err` when it is not one (the check failed).
pub fn parse(answer: &[u8], kubernetes: &str) -> Result<Result<Vec<String>, Refusal>, String> {
    let answer: Answer = serde_json::from_slice(answer)
        .map_err(|e| format!("the pod check answered something that is not a verdict: {e}"))?;
    if answer.ok {
        return Ok(Ok(answer.newer));
    }
    let problems = if answer.fields.is_empty() {
        // Not a field's rule but the file as a whole: the decoder's error.
        vec![FieldError {
            field: String::new(),
            message: format!(
                "the kubelet cannot read it as a pod: {}",
                answer.error.trim()
            ),
        }]
    } else {
        answer.fields.iter().map(field_error).collect()
    };
    Ok(Err(Refusal {
        kubernetes: kubernetes.to_string(),
        problems: Invalid(problems),
        kubelet_error: answer.error,
        newer_than: None,
    }))
}

/// One problem in podstamp's words: the field, what is wrong, what it must be.
fn field_error(p: &Problem) -> FieldError {
    let with = |what: String| {
        if p.detail.is_empty() {
            what
        } else {
            format!("{what}: {}", p.detail)
        }
    };
    let message = match p.kind.as_str() {
        "FieldValueRequired" => with("is required".into()),
        "FieldValueNotFound" => with(format!("{} not found", p.value)),
        "FieldValueDuplicate" => with(format!("duplicate value {}", p.value)),
        "FieldValueInvalid" => with(format!("{} is invalid", p.value)),
        "FieldValueNotSupported" => with(format!("{} is not supported", p.value)),
        "FieldValueForbidden" => with("is forbidden".into()),
        "FieldValueTooLong" => with("is too long".into()),
        "FieldValueTooMany" => with("has too many items".into()),
        "FieldValueTypeInvalid" => with(format!("{} has the wrong type", p.value)),
        "InternalError" => with("cannot be checked (an internal error of the check)".into()),
        other => with(format!("{other} {}", p.value).trim_end().to_string()),
    };
    FieldError {
        field: p.field.clone(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_each_field_and_what_it_must_be() {
        let answer = br#"{"ok":false,"error":"invalid pod: [...]","fields":[
            {"field":"spec.containers[0].livenessProbe.httpGet","type":"FieldValueForbidden","detail":"may not specify more than 1 handler type"},
            {"field":"spec.containers[0].livenessProbe.successThreshold","type":"FieldValueInvalid","value":"5","detail":"must be 1"},
            {"field":"spec.containers[0].securityContext.seccompProfile.type","type":"FieldValueNotSupported","value":"\"runtimeDefault\"","detail":"supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\""}]}"#;
        let refusal = parse(answer, "v1.37.2").unwrap().unwrap_err();
        let lines: Vec<String> = refusal.problems.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "spec.containers[0].livenessProbe.httpGet: is forbidden: may not specify more than 1 handler type",
                "spec.containers[0].livenessProbe.successThreshold: 5 is invalid: must be 1",
                "spec.containers[0].securityContext.seccompProfile.type: \"runtimeDefault\" is not supported: supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\"",
            ]
        );
        assert!(
            refusal
                .to_string()
                .starts_with("the kubelet (v1.37.2) would refuse it")
        );
    }

    #[test]
    fn a_file_the_decoder_refuses_is_one_problem() {
        let answer = br#"{"ok":false,"error":"quantities must match the regular expression"}"#;
        let refusal = parse(answer, "v1.37.2").unwrap().unwrap_err();
        assert_eq!(
            refusal.problems.to_string(),
            "the kubelet cannot read it as a pod: quantities must match the regular expression"
        );
    }

    #[test]
    fn an_answer_that_is_no_verdict_is_a_failed_check() {
        assert!(parse(b"{", "v1.37.2").is_err());
        assert_eq!(parse(br#"{"ok":true}"#, "v1.37.2").unwrap(), Ok(vec![]));
        assert_eq!(
            parse(br#"{"ok":true,"newer":["spec.hostUsers"]}"#, "v1.37.2").unwrap(),
            Ok(vec!["spec.hostUsers".to_string()])
        );
    }
}
