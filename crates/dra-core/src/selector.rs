//! The CEL selectors this driver's classes and the webhook write, read as attribute
//! equalities: `device.driver == "<d>"` and `device.attributes["<domain>"].<name> == <lit>`
//! (string, int or bool literal), joined by `&&`. That is what the allocator model
//! evaluates; any other CEL is refused with an error that names it (the real
//! kube-scheduler evaluates full CEL; our stand-in does not pretend to).
//!
//! Hand-written rather than a CEL library (none is a workspace dependency): only the
//! selectors this driver writes are read, and a full evaluator would accept expressions the
//! allocator model could not mirror.

use crate::api::DeviceAttribute;

/// One conjunct of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `device.driver == "<d>"`.
    Driver(String),
    /// Fully qualified attribute name (`<domain>/<name>`) equals the value.
    Attribute {
        /// `<domain>/<name>`.
        name: String,
        /// The literal it must equal.
        value: DeviceAttribute,
    },
}

/// A selector this model cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "selector {expression:?}: {problem}; supported: `device.driver == \"…\"` and `device.attributes[\"<domain>\"].<name> == <string|int|bool>` joined by &&"
)]
pub struct SelectorError {
    /// The expression.
    pub expression: String,
    /// What is not supported in it.
    pub problem: String,
}

/// Parses an expression into its conjuncts.
pub fn parse(expression: &str) -> Result<Vec<Term>, SelectorError> {
    let err = |problem: &str| SelectorError {
        expression: expression.into(),
        problem: problem.into(),
    };
    let mut terms = Vec::new();
    for part in split_and(expression) {
        let (lhs, rhs) = part
            .split_once("==")
            .ok_or_else(|| err("a conjunct is not an equality"))?;
        let (lhs, rhs) = (lhs.trim(), rhs.trim());
        let value = literal(rhs).ok_or_else(|| err("the right side is not a literal"))?;
        if lhs == "device.driver" {
            let s = value
                .string
                .ok_or_else(|| err("device.driver compares to a string"))?;
            terms.push(Term::Driver(s));
            continue;
        }
        let rest = lhs.strip_prefix("device.attributes[\"").ok_or_else(|| {
            err("the left side is neither device.driver nor device.attributes[…]")
        })?;
        let (domain, name) = rest
            .split_once("\"].")
            .ok_or_else(|| err("expected device.attributes[\"<domain>\"].<name>"))?;
        if domain.is_empty()
            || name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(err("bad attribute domain or name"));
        }
        terms.push(Term::Attribute {
            name: format!("{domain}/{name}"),
            value,
        });
    }
    if terms.is_empty() {
        return Err(err("empty"));
    }
    Ok(terms)
}

/// Splits on `&&` outside string literals.
fn split_and(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut in_str, mut prev) = (0, false, b' ');
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' && prev != b'\\' {
            in_str = !in_str;
        } else if !in_str && b[i] == b'&' && b.get(i + 1) == Some(&b'&') {
            out.push(&s[start..i]);
            start = i + 2;
            i += 1;
        }
        prev = b[i];
        i += 1;
    }
    out.push(&s[start..]);
    out
}

fn literal(s: &str) -> Option<DeviceAttribute> {
    if let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return (!inner.contains(['"', '\\'])).then(|| DeviceAttribute::string(inner));
    }
    match s {
        "true" => Some(DeviceAttribute::bool(true)),
        "false" => Some(DeviceAttribute::bool(false)),
        _ => s.parse::<i64>().ok().map(DeviceAttribute::int),
    }
}

/// The CEL text of a term (what the webhook and the DeviceClass write).
pub fn render(terms: &[Term]) -> String {
    let parts: Vec<String> = terms
        .iter()
        .map(|t| match t {
            Term::Driver(d) => format!("device.driver == \"{d}\""),
            Term::Attribute { name, value } => {
                let (domain, short) = name.rsplit_once('/').unwrap_or(("", name));
                let lit = match value {
                    DeviceAttribute {
                        string: Some(s), ..
                    } => format!("\"{s}\""),
                    DeviceAttribute { int: Some(i), .. } => i.to_string(),
                    DeviceAttribute { bool: Some(b), .. } => b.to_string(),
                    DeviceAttribute {
                        version: Some(v), ..
                    } => format!("\"{v}\""),
                    _ => "null".into(),
                };
                format!("device.attributes[\"{domain}\"].{short} == {lit}")
            }
        })
        .collect();
    parts.join(" && ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_class_and_webhook_selectors() {
        let t = parse(r#"device.driver == "amdgpu.hami-rs.io" && device.attributes["amdgpu.hami-rs.io"].type == "amdgpu-slice""#).unwrap();
        assert_eq!(t[0], Term::Driver("amdgpu.hami-rs.io".into()));
        assert_eq!(
            t[1],
            Term::Attribute {
                name: "amdgpu.hami-rs.io/type".into(),
                value: DeviceAttribute::string("amdgpu-slice")
            }
        );
        assert_eq!(parse(&render(&t)).unwrap(), t);
        let n = parse(r#"device.attributes["resource.kubernetes.io"].numaNode == 1"#).unwrap();
        assert_eq!(
            n[0],
            Term::Attribute {
                name: "resource.kubernetes.io/numaNode".into(),
                value: DeviceAttribute::int(1)
            }
        );
    }

    #[test]
    fn refuses_other_cel_by_name() {
        for bad in [
            "device.capacity[\"x\"].memory.compareTo(quantity(\"1Gi\")) >= 0",
            "device.driver != \"x\"",
            "device.attributes[\"d\"].a == b",
            "",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains("supported:"), "{e}");
        }
    }
}
