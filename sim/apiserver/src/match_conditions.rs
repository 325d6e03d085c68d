//! A webhook's `matchConditions`, as k8s.io/apiserver's admission/plugin/webhook/
//! matchconditions runs them: compiled when the configuration is written (an expression
//! that does not compile is refused with 422, naming it), then, for a request the webhook's
//! rules and selectors matched, every condition evaluated with `object`, `oldObject` and
//! `request`: any false skips the webhook (whatever the others gave), else any error
//! applies the failure policy (Fail: the request is refused 403 with the errors; Ignore:
//! the webhook is skipped), else the webhook is called.

use serde_json::Value;

use crate::cel::check::ADMISSION_REQUEST;
use crate::cel::{self, Activation, Decls, Program, Ty, Val};

/// Upstream's bound on conditions per webhook.
pub const MAX_CONDITIONS: usize = 64;

/// The variables a matchCondition may use (admission/plugin/cel's environment for
/// webhooks: no `params`; `authorizer` is declared there but not served here).
pub fn decls() -> Decls {
    Decls {
        vars: vec![
            ("object", Ty::Dyn),
            ("oldObject", Ty::Dyn),
            ("request", Ty::Object(&ADMISSION_REQUEST)),
            // Upstream types it as a Namespace; webhooks get null.
            ("namespaceObject", Ty::Dyn),
        ],
        unsupported: vec![("authorizer", "the authorizer variable")],
    }
}

/// One compiled condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// Its `name`.
    pub name: String,
    /// Its `expression`.
    pub expression: String,
    /// The program, or why it does not compile (possible only for a configuration stored
    /// before validation existed; evaluated as upstream treats it: an error).
    pub program: Result<Program, String>,
}

fn compile(expression: &str) -> Result<Program, String> {
    let program = cel::compile(expression, &decls()).map_err(|e| e.positioned(expression))?;
    if program.ty != Ty::Bool {
        return Err(format!(
            "must evaluate to bool but got {}",
            program.ty.show()
        ));
    }
    Ok(program)
}

/// The conditions of a webhook (its `matchConditions`, possibly absent).
pub fn conditions(webhook: &Value) -> Vec<Condition> {
    webhook
        .get("matchConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let expression = c
                .get("expression")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_string();
            Condition {
                name: c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                program: compile(&expression).map_err(|e| format!("compilation error: {e}")),
                expression,
            }
        })
        .collect()
}

/// Validation of one webhook's `matchConditions` (upstream's `validateMatchConditions`):
/// `(field, message)` per problem.
pub fn validate(webhook: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let Some(list) = webhook.get("matchConditions").filter(|v| !v.is_null()) else {
        return out;
    };
    let Some(list) = list.as_array() else {
        out.push(("webhooks[].matchConditions", "must be a list".into()));
        return out;
    };
    if list.len() > MAX_CONDITIONS {
        out.push((
            "webhooks[].matchConditions",
            format!(
                "Too many: {}: must have at most {MAX_CONDITIONS} items",
                list.len()
            ),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for c in list {
        let expression = c.get("expression").and_then(Value::as_str).unwrap_or("");
        if expression.trim().is_empty() {
            out.push((
                "webhooks[].matchConditions[].expression",
                "Required value".into(),
            ));
        } else if let Err(e) = compile(expression.trim()) {
            let detail = if e.starts_with("must evaluate") {
                e
            } else {
                format!("compilation failed: {e}")
            };
            out.push((
                "webhooks[].matchConditions[].expression",
                format!("Invalid value: {expression:?}: {detail}"),
            ));
        }
        match c.get("name").and_then(Value::as_str).unwrap_or("") {
            "" => out.push(("webhooks[].matchConditions[].name", "Required value".into())),
            n => {
                if let Some(e) = qualified_name_error(n) {
                    out.push((
                        "webhooks[].matchConditions[].name",
                        format!("Invalid value: {n:?}: {e}"),
                    ));
                }
                if !names.insert(n.to_string()) {
                    out.push((
                        "webhooks[].matchConditions[].name",
                        format!("Duplicate value: {n:?}"),
                    ));
                }
            }
        }
    }
    out
}

/// Upstream's `ValidateQualifiedName`: an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
fn qualified_name_error(n: &str) -> Option<String> {
    let (prefix, name) = match n.split_once('/') {
        Some((p, rest)) => (Some(p), rest),
        None => (None, n),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if let Some(e) = crate::meta::dns1123_subdomain_error(p) {
            return Some(format!("prefix part {e}"));
        }
    }
    let b = name.as_bytes();
    if b.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if b.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    let inner = |c: &u8| c.is_ascii_alphanumeric() || b"-_.".contains(c);
    if !b.iter().all(inner)
        || !b[0].is_ascii_alphanumeric()
        || !b[b.len() - 1].is_ascii_alphanumeric()
    {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

/// What the conditions decide.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Every condition is true (or there are none): call the webhook.
    Call,
    /// A condition is false: skip the webhook.
    Skip {
        /// The first false condition's name.
        condition: String,
    },
    /// Conditions failed to evaluate and none was false, under `failurePolicy: Ignore`.
    SkipOnError(String),
    /// Conditions failed to evaluate and none was false, under `failurePolicy: Fail`:
    /// the request is refused with this message (upstream's aggregate of the errors).
    Refuse(String),
}

/// The variables for a request: `request` is the AdmissionRequest sent to the webhook
/// (`review_request`), without `uid`, `object` and `oldObject` (they are variables of
/// their own, as upstream's `CreateAdmissionRequest` leaves them out).
pub fn bindings(review_request: &Value) -> Vec<(&'static str, Val)> {
    let mut request = review_request.clone();
    if let Some(m) = request.as_object_mut() {
        for k in ["uid", "object", "oldObject"] {
            m.remove(k);
        }
    }
    let get = |k: &str| Val::from_json(review_request.get(k).unwrap_or(&Value::Null));
    vec![
        ("object", get("object")),
        ("oldObject", get("oldObject")),
        ("request", Val::from_json(&request)),
        ("namespaceObject", Val::Null),
    ]
}

/// Runs `conditions` as upstream's matcher does.
pub fn decide(conditions: &[Condition], fail_closed: bool, vars: &[(&str, Val)]) -> Decision {
    let act = Activation { vars };
    let mut errors = Vec::new();
    for c in conditions {
        let result = match &c.program {
            Err(e) => Err(e.clone()),
            Ok(p) => match p.eval(&act) {
                Ok(Val::Bool(b)) => Ok(b),
                Ok(other) => Err(format!("expected bool, got {}", other.type_name())),
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(false) => {
                return Decision::Skip {
                    condition: c.name.clone(),
                };
            }
            Ok(true) => {}
            Err(e) if c.program.is_err() => errors.push(e),
            Err(e) => errors.push(format!(
                "expression '{}' resulted in error: {e}",
                c.expression
            )),
        }
    }
    let message = match errors.len() {
        0 => return Decision::Call,
        1 => errors.remove(0),
        _ => format!("[{}]", errors.join(", ")),
    };
    if fail_closed {
        Decision::Refuse(message)
    } else {
        Decision::SkipOnError(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hook(conds: Value) -> Value {
        json!({"name": "w", "matchConditions": conds})
    }

    #[test]
    fn validation_names_the_expression() {
        let v = validate(&hook(json!([
            {"name": "ok", "expression": "request.operation == 'CREATE'"},
            {"name": "ok", "expression": "object.metadata.name.matches('^a')"},
            {"name": "", "expression": "object.x"},
            {"name": "bad name!", "expression": "request.nope == 1"},
            {"name": "e", "expression": "  "}
        ])));
        let text: Vec<String> = v.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let all = text.join("\n");
        assert!(all.contains("Duplicate value: \"ok\""), "{all}");
        assert!(all.contains(r#"Invalid value: "object.metadata.name.matches('^a')": compilation failed: ERROR: <input>:1:1: the function 'matches' is not supported"#), "{all}");
        assert!(
            all.contains(r#"Invalid value: "object.x": must evaluate to bool but got dyn"#),
            "{all}"
        );
        assert!(all.contains("undefined field 'nope'"), "{all}");
        assert!(
            all.contains("webhooks[].matchConditions[].name: Required value"),
            "{all}"
        );
        assert!(
            all.contains("webhooks[].matchConditions[].expression: Required value"),
            "{all}"
        );
        assert!(all.contains("bad name!"), "{all}");
        assert_eq!(v.len(), 7, "{all}");
        let many: Vec<Value> = (0..65)
            .map(|i| json!({"name": format!("c{i}"), "expression": "true"}))
            .collect();
        assert!(
            validate(&hook(Value::Array(many)))[0]
                .1
                .contains("Too many: 65")
        );
        assert!(validate(&json!({"name": "w"})).is_empty());
    }

    fn req(op: &str, object: Value) -> Value {
        json!({"uid": "u", "operation": op, "name": "p", "namespace": "default",
               "userInfo": {"username": "alice", "groups": ["devs"]},
               "object": object, "oldObject": null, "dryRun": false})
    }

    #[test]
    fn false_wins_errors_follow_the_policy() {
        let c = conditions(&hook(json!([
            {"name": "errs", "expression": "object.metadata.annotations['a'] == 'b'"},
            {"name": "user", "expression": "request.userInfo.username != 'alice'"},
        ])));
        let pod = json!({"metadata": {"name": "p"}});
        let vars = bindings(&req("CREATE", pod.clone()));
        // The second is false: skipped, although the first is an error (evaluated before it).
        assert_eq!(
            decide(&c, true, &vars),
            Decision::Skip {
                condition: "user".into()
            }
        );
        let c = conditions(&hook(json!([
            {"name": "errs", "expression": "object.metadata.annotations['a'] == 'b'"},
            {"name": "create", "expression": "request.operation == 'CREATE' && !request.dryRun"},
            {"name": "old", "expression": "oldObject == null && request.namespace == 'default'"},
        ])));
        let want = "expression 'object.metadata.annotations['a'] == 'b'' resulted in error: no such key: annotations";
        assert_eq!(decide(&c, true, &vars), Decision::Refuse(want.into()));
        assert_eq!(decide(&c, false, &vars), Decision::SkipOnError(want.into()));
        let annotated = json!({"metadata": {"name": "p", "annotations": {"a": "b"}}});
        assert_eq!(
            decide(&c, true, &bindings(&req("CREATE", annotated))),
            Decision::Call
        );
        assert_eq!(decide(&[], true, &vars), Decision::Call);
        let two = conditions(&hook(json!([
            {"name": "a", "expression": "object.x == 1"},
            {"name": "b", "expression": "object.y == 1"},
        ])));
        let Decision::Refuse(m) = decide(&two, true, &vars) else {
            panic!()
        };
        assert!(
            m.starts_with("[expression 'object.x == 1'")
                && m.contains(", expression 'object.y == 1'"),
            "{m}"
        );
        // The review's uid is not part of `request` (upstream leaves it out).
        let c = conditions(&hook(
            json!([{"name": "uid", "expression": "has(request.uid)"}]),
        ));
        assert!(
            matches!(decide(&c, true, &vars), Decision::Refuse(m) if m.contains("undefined field 'uid'"))
        );
    }
}
