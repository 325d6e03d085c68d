//! Fault injection for tests: fail the next N requests matching (verb, resource) with a
//! given status code, and add latency to every request. Closing watches and expiring the
//! watch history are operations of the running server ([`crate::FaultHandle`]).

use std::time::Duration;

use crate::status::ApiError;

/// One "fail the next N matching requests" rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); None matches any.
    pub verb: Option<String>,
    /// Resource plural, optionally with subresource (`pods`, `pods/binding`); None matches any.
    pub resource: Option<String>,
    /// Matching requests still to fail; the rule is dropped at 0.
    pub remaining: u32,
    /// HTTP status answered, with Kubernetes' reason for it ([`reason_for`]).
    pub code: u16,
}

/// The reason Kubernetes attaches to each status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The faults set on a running server, consulted on every request.
#[derive(Debug, Default, Clone)]
pub struct FaultState {
    /// Fail rules, the first matching one with uses left applies.
    pub rules: Vec<FailRule>,
    /// Delay added before every request is answered.
    pub latency: Duration,
}

impl FaultState {
    /// Consumes one matching rule use, returning the error to answer with.
    pub fn take_failure(&mut self, verb: &str, resource: &str) -> Option<ApiError> {
        let rule = self.rules.iter_mut().find(|r| {
            r.remaining > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource.as_deref().is_none_or(|x| x == resource)
        })?;
        rule.remaining -= 1;
        let code = rule.code;
        self.rules.retain(|r| r.remaining > 0);
        let mut err = ApiError::new(
            code,
            reason_for(code),
            format!("injected fault: {verb} {resource} fails with {code}"),
        );
        if code == 429 {
            err.details = Some(serde_json::json!({"retryAfterSeconds": 1}));
        }
        Some(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_count_down_and_match() {
        let mut f = FaultState::default();
        f.rules.push(FailRule {
            verb: Some("patch".into()),
            resource: Some("pods".into()),
            remaining: 2,
            code: 500,
        });
        f.rules.push(FailRule {
            verb: None,
            resource: Some("pods/binding".into()),
            remaining: 1,
            code: 409,
        });
        assert!(f.take_failure("get", "pods").is_none());
        assert!(f.take_failure("patch", "pods/status").is_none());
        assert_eq!(f.take_failure("patch", "pods").unwrap().code, 500);
        assert_eq!(
            f.take_failure("create", "pods/binding").unwrap().reason,
            "Conflict"
        );
        assert_eq!(f.take_failure("patch", "pods").unwrap().code, 500);
        assert!(f.take_failure("patch", "pods").is_none());
        assert!(f.rules.is_empty());
    }
}
