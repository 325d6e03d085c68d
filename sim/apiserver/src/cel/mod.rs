//! A CEL evaluator for what the API server itself evaluates (webhook `matchConditions`):
//! the whole core language — literals of every kind but bytes, `?:`, `||`, `&&`, relations,
//! `in`, arithmetic, indexing, field selection, `has()`, the `all`/`exists`/`exists_one`/
//! `map`/`filter` macros, `size`, `startsWith`/`endsWith`/`contains` and the conversions
//! `int`/`uint`/`double`/`string`/`bool` — compiled (parsed and type-checked against the
//! declared variables) before it is stored, and evaluated with cel-go's semantics
//! (`tests/it/cel_peer.rs` checks it against cel-python).
//!
//! Written here rather than shared with `hami-dra-core`'s selector reader: that one is
//! product code recognising only the conjunctions the driver writes (no `||`, no macros,
//! no single quotes, by design), and a sim's evaluator must not widen what product code
//! accepts. Kubernetes' extension libraries (regex `matches`, lists, strings, quantity,
//! authorizer…) are not here: they are refused at compile time by name.

pub mod check;
pub mod eval;
pub mod lex;
pub mod parse;
pub mod value;

pub use check::{Decls, Ty};
pub use eval::{Activation, EvalError};
pub use value::Val;

/// An expression that does not compile: cel-go's message shape
/// (`ERROR: <input>:LINE:COL: …`), or this evaluator's refusal of a feature it lacks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct CompileError {
    /// Byte offset the problem is at.
    pub at: usize,
    /// What is wrong (without the position).
    pub detail: String,
    /// `detail` with the position, as printed.
    pub message: String,
}

impl CompileError {
    fn new(at: usize, kind: &str, detail: String) -> CompileError {
        CompileError {
            at,
            message: format!("{kind}{detail}"),
            detail,
        }
    }

    /// A syntax error.
    pub fn syntax(at: usize, detail: impl Into<String>) -> CompileError {
        CompileError::new(at, "Syntax error: ", detail.into())
    }

    /// A type-check error.
    pub fn check(at: usize, detail: impl Into<String>) -> CompileError {
        CompileError::new(at, "", detail.into())
    }

    /// Valid CEL this evaluator does not implement.
    pub fn unsupported(at: usize, what: &str) -> CompileError {
        CompileError::new(
            at,
            "",
            format!(
                "{what} is not supported by the embedded API server's CEL evaluator (sim/apiserver/src/cel)"
            ),
        )
    }

    /// The message with cel-go's position prefix for `src`.
    pub fn positioned(&self, src: &str) -> String {
        let before = &src[..self.at.min(src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        format!("ERROR: <input>:{line}:{}: {}", col + 1, self.message)
    }
}

/// A compiled expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    root: parse::Node,
    /// Its static type.
    pub ty: Ty,
}

/// Parses and checks `src` against `decls`.
pub fn compile(src: &str, decls: &Decls) -> Result<Program, CompileError> {
    let root = parse::parse(src)?;
    let ty = check::check(&root, decls)?;
    Ok(Program { root, ty })
}

impl Program {
    /// Evaluates the program with the variables of `act`.
    pub fn eval(&self, act: &Activation<'_>) -> Result<Val, EvalError> {
        eval::eval(&self.root, act)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(src: &str, object: serde_json::Value) -> Result<Val, String> {
        let decls = Decls {
            vars: vec![("object", Ty::Dyn)],
            unsupported: vec![],
        };
        let p = compile(src, &decls).map_err(|e| e.positioned(src))?;
        p.eval(&Activation {
            vars: &[("object", Val::from_json(&object))],
        })
    }

    #[test]
    fn semantics() {
        let pod = json!({"metadata": {"name": "p", "labels": {"a": "1"}}, "spec": {"containers": [{"name": "c"}, {"name": "d", "resources": {}}]}});
        let t = |s: &str| run(s, pod.clone());
        assert_eq!(t("has(object.metadata.labels)"), Ok(Val::Bool(true)));
        assert_eq!(t("has(object.metadata.annotations)"), Ok(Val::Bool(false)));
        assert!(
            t("object.metadata.annotations['x'] == 'y'")
                .unwrap_err()
                .contains("no such key: annotations")
        );
        // false wins over an error on either side, and in all()/exists() over elements.
        assert_eq!(t("object.nope == 1 && false"), Ok(Val::Bool(false)));
        assert_eq!(t("true || object.nope"), Ok(Val::Bool(true)));
        assert!(t("object.nope || false").is_err());
        assert_eq!(
            t("object.spec.containers.exists(c, c.resources.limits == 1 || c.name == 'c')"),
            Ok(Val::Bool(true))
        );
        assert!(t("object.spec.containers.exists(c, c.resources.limits == 1)").is_err());
        assert_eq!(
            t("object.spec.containers.all(c, c.resources == 1)"),
            Ok(Val::Bool(false))
        );
        assert_eq!(
            t("object.spec.containers.exists_one(c, c.name.startsWith('c'))"),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            t("object.spec.containers.map(c, c.name) == ['c', 'd']"),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            t("size(object.spec.containers.filter(c, has(c.resources))) == 1"),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            t("'a' in object.metadata.labels && !('b' in object.metadata.labels)"),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            t("object.metadata.labels.a == '1' ? 1 : 2"),
            Ok(Val::Int(1))
        );
        assert_eq!(
            t("1u == 1u && [1, 2] == [1, 2] && {'a': 1} == {'a': 1} && object.metadata.name != 1"),
            Ok(Val::Bool(true))
        );
        assert_eq!(t("dyn_is_not_a_thing"), Err("ERROR: <input>:1:1: undeclared reference to 'dyn_is_not_a_thing' (in container '')".into()));
        assert!(
            t("9223372036854775807 + 1 == 0")
                .unwrap_err()
                .contains("overflow")
        );
        assert!(t("1 / 0 == 0").unwrap_err().contains("division by zero"));
        assert!(
            t("[1][3] == 0")
                .unwrap_err()
                .contains("index out of bounds")
        );
        assert_eq!(
            t("'ab' + 'c' == 'abc' && size('héllo') == 5 && int('42') == 42"),
            Ok(Val::Bool(true))
        );
        assert_eq!(t("-1 < 1u && 2.5 > 2"), Ok(Val::Bool(true)));
        assert!(t("object.metadata.name.x").is_err());
        assert!(t("has(object.metadata.name.x)").is_err());
        let e = run("a &&\n  b(", json!({})).unwrap_err();
        assert!(e.starts_with("ERROR: <input>:2:"), "{e}");
    }
}
