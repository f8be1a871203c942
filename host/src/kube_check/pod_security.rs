//! The Pod Security request: a level and version, and the helper's verdict.
//!
//! Static pods bypass Pod Security Admission (the kubelet runs a static pod
//! whatever its namespace enforces; only its mirror pod meets admission,
//! after the fact), so podstamp holds every rendered pod to a level itself,
//! with Kubernetes' own checks (`k8s.io/pod-security-admission/policy`, run
//! by the same helper as the kubelet's check: see
//! tests/harness/cmd/podstamp-kubecheck/podsecurity.go).
//!
//! Invariants:
//! - A [`Policy`] is only ever a level and a version the library accepts
//!   (`privileged`, `baseline`, `restricted`; `latest` or `v1.N`): parsed
//!   here, so the helper never sees another (it would answer `bad`, which is
//!   a failed check, not a verdict).
//! - A refusal names every check that failed, by its ID, with the library's
//!   reason and detail, in the library's order; its text is the admission
//!   plugin's (`violates PodSecurity "restricted:latest": …`).

use std::fmt;

use serde::Deserialize;

/// A Pod Security Standards level, from the least restricted to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Privileged, Level::Baseline, Level::Restricted];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// The level named `text`, exactly as Kubernetes spells it.
    pub fn parse(text: &str) -> Result<Level, String> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "{text:?} is not a Pod Security level: use privileged, baseline or restricted"
                )
            })
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level and the version of the standards it is checked at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    pub level: Level,
    /// `latest` or `v1.N` (checked by [`check_version`]).
    version: String,
}

impl Policy {
    pub fn new(level: Level, version: &str) -> Result<Policy, String> {
        check_version(version)?;
        Ok(Policy {
            level,
            version: version.to_string(),
        })
    }

    pub fn latest(level: Level) -> Policy {
        Policy {
            level,
            version: "latest".into(),
        }
    }

    /// `LEVEL` or `LEVEL:VERSION` (the admission plugin's way of writing one).
    pub fn parse(text: &str) -> Result<Policy, String> {
        let (level, version) = text.split_once(':').unwrap_or((text, "latest"));
        Policy::new(Level::parse(level)?, version)
    }

    pub fn version(&self) -> &str {
        &self.version
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level, self.version)
    }
}

/// `latest` or `v1.N` (N without leading zeros), as the library parses
/// `pod-security.kubernetes.io/enforce-version`.
pub fn check_version(version: &str) -> Result<(), String> {
    let minor = version.strip_prefix("v1.");
    let ok = version == "latest"
        || minor.is_some_and(|m| {
            !m.is_empty()
                && m.bytes().all(|b| b.is_ascii_digit())
                && (m == "0" || !m.starts_with('0'))
                && m.len() <= 4
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{version:?} is not a Pod Security version: use \"latest\" or \"v1.N\""
        ))
    }
}

/// One check the pod failed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FailedCheck {
    /// The library's ID of the check, e.g. `hostNamespaces`.
    pub id: String,
    /// As the admission plugin words it, e.g. `host namespaces`.
    pub reason: String,
    /// What in the pod, e.g. `hostNetwork=true`.
    #[serde(default)]
    pub detail: String,
}

impl fmt::Display for FailedCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{} ({})", self.reason, self.detail)
        }
    }
}

/// The pod does not meet the level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Violation {
    pub policy: Policy,
    /// Every check that failed, in the library's order.
    pub checks: Vec<FailedCheck>,
    /// The library's own message (`violates PodSecurity "…": …`).
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "forbidden: ")?;
        for (i, check) in self.checks.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{check}")?;
        }
        Ok(())
    }
}

impl Violation {
    /// The IDs of the failed checks, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.checks.iter().map(|c| c.id.as_str()).collect()
    }
}

/// The request's parts after the mark byte (see the helper's protocol).
pub fn request<'a>(policy: &'a Policy, manifest: &'a [u8]) -> [&'a [u8]; 4] {
    [
        b"\x01pod-security",
        policy.level.as_str().as_bytes(),
        policy.version.as_bytes(),
        manifest,
    ]
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    error: String,
    #[serde(default)]
    checks: Vec<FailedCheck>,
    #[serde(default)]
    bad: String,
}

/// Reads one verdict: Ok, or the violation; `Err` when it is no verdict
/// (the check failed).
pub fn parse(answer: &[u8], policy: &Policy) -> Result<Result<(), Violation>, String> {
    let answer: Answer = serde_json::from_slice(answer).map_err(|e| {
        format!("the Pod Security check answered something that is not a verdict: {e}")
    })?;
    if answer.ok {
        return Ok(Ok(()));
    }
    if !answer.bad.is_empty() {
        return Err(format!(
            "the Pod Security check could not decide: {}",
            answer.bad
        ));
    }
    if answer.checks.is_empty() {
        return Err(format!(
            "the Pod Security check refused the pod without naming a check: {}",
            answer.error
        ));
    }
    Ok(Err(Violation {
        policy: policy.clone(),
        checks: answer.checks,
        message: answer.error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_versions_are_kubernetes_own_spellings() {
        assert_eq!(
            Policy::parse("restricted").unwrap().to_string(),
            "restricted:latest"
        );
        assert_eq!(
            Policy::parse("baseline:v1.30").unwrap().to_string(),
            "baseline:v1.30"
        );
        for bad in [
            "Restricted",
            "",
            "root",
            "baseline:1.30",
            "baseline:v1.030",
            "baseline:v2.0",
            "baseline:v1.",
        ] {
            assert!(Policy::parse(bad).is_err(), "{bad}");
        }
        assert!(Level::Privileged < Level::Baseline && Level::Baseline < Level::Restricted);
    }

    #[test]
    fn a_violation_names_every_check() {
        let answer = br#"{"ok":false,"error":"violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), privileged (container \"c\" must not set securityContext.privileged=true)","checks":[
            {"id":"hostNamespaces","reason":"host namespaces","detail":"hostNetwork=true"},
            {"id":"privileged","reason":"privileged","detail":"container \"c\" must not set securityContext.privileged=true"}]}"#;
        let policy = Policy::latest(Level::Baseline);
        let v = parse(answer, &policy).unwrap().unwrap_err();
        assert_eq!(v.ids(), ["hostNamespaces", "privileged"]);
        assert_eq!(
            v.to_string(),
            "forbidden: host namespaces (hostNetwork=true), privileged (container \"c\" must not set securityContext.privileged=true)"
        );
        assert_eq!(parse(br#"{"ok":true}"#, &policy).unwrap(), Ok(()));
        assert!(parse(br#"{"ok":false,"bad":"level \"x\""}"#, &policy).is_err());
        assert!(parse(br#"{"ok":false,"error":"x"}"#, &policy).is_err());
        assert!(parse(b"[", &policy).is_err());
    }
}
