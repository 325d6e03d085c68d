//! `metav1.Status` errors: every failure the server returns is one of these, with the HTTP
//! code and machine-readable reason Kubernetes uses for the same condition.

use serde_json::{Value, json};

/// A failed request, rendered as a `metav1.Status` body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The Status `reason` (`NotFound`, `Conflict`, ...), which clients switch on.
    pub reason: String,
    /// The human-readable `message`.
    pub message: String,
    /// `details` of the Status (name, group, kind, causes), if any.
    pub details: Option<Value>,
}

fn details(group: &str, kind: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    /// An error with no `details`.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// 404 for a named object: `pods "x" not found`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let gr = group_resource(group, resource);
        ApiError {
            code: 404,
            reason: "NotFound".into(),
            message: format!("{gr} \"{name}\" not found"),
            details: Some(details(group, resource, name)),
        }
    }

    /// 409 AlreadyExists for a create whose name is taken.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let gr = group_resource(group, resource);
        ApiError {
            code: 409,
            reason: "AlreadyExists".into(),
            message: format!("{gr} \"{name}\" already exists"),
            details: Some(details(group, resource, name)),
        }
    }

    /// 409 Conflict, the optimistic-concurrency failure.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let gr = group_resource(group, resource);
        ApiError {
            code: 409,
            reason: "Conflict".into(),
            message: format!("Operation cannot be fulfilled on {gr} \"{name}\": {why}"),
            details: Some(details(group, resource, name)),
        }
    }

    /// 422 Invalid with one cause per bad field.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[(&str, String)]) -> Self {
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let mut d = details(group, kind, name);
        d["causes"] = Value::Array(
            causes
                .iter()
                .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
                .collect(),
        );
        ApiError {
            code: 422,
            reason: "Invalid".into(),
            message: format!("{kind} \"{name}\" is invalid: {}", list.join(", ")),
            details: Some(d),
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 for a body whose Content-Type this server does not decode.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 413 for a body over Kubernetes' 3 MiB limit.
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    /// 410 Expired: what the client asked for is older than the history kept (it must relist).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A 404 for a URL that names no served resource.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A success Status (`pods/binding` and deletes of already-gone finalized objects return these).
pub fn success_status(code: u16, details: Option<Value>) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_message_matches_kubernetes() {
        let e = ApiError::not_found("", "pods", "x");
        assert_eq!(e.message, "pods \"x\" not found");
        let s = e.to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["details"]["kind"], "pods");
        let e = ApiError::conflict(
            "coordination.k8s.io",
            "leases",
            "l",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
        assert!(
            e.message
                .starts_with("Operation cannot be fulfilled on leases.coordination.k8s.io \"l\"")
        );
    }
}
