//! The compile-time check a real API server runs before it stores an expression: every
//! variable declared, every field of a typed variable (`request`) known, functions and
//! overloads that exist (cel-go's messages), list and map literals homogeneous (Kubernetes'
//! environment requires it), and the expression's type what the caller needs (`bool` for
//! matchConditions, exactly: `dyn` is refused as upstream refuses it). What the real
//! environment has but this evaluator does not (Kubernetes' extension libraries, `matches`,
//! `authorizer`, timestamps…) is refused by name, never accepted and mis-evaluated.

use super::CompileError;
use super::parse::{BinOp, Kind, Macro, Node};
use super::value::Val;

/// A static CEL type.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    /// Unknown until run time (`object`, `oldObject`, anything read from them).
    Dyn,
    /// `null_type`.
    Null,
    /// `bool`.
    Bool,
    /// `int`.
    Int,
    /// `uint`.
    Uint,
    /// `double`.
    Double,
    /// `string`.
    Str,
    /// `list(T)`.
    List(Box<Ty>),
    /// `map(K, V)`.
    Map(Box<Ty>, Box<Ty>),
    /// A declared object type and its fields.
    Object(&'static ObjectType),
}

/// A declared object type: its name and fields.
#[derive(Debug)]
pub struct ObjectType {
    /// The type's name (as errors print it).
    pub name: &'static str,
    /// Field names and their types.
    pub fields: fn() -> Vec<(&'static str, Ty)>,
}

impl PartialEq for ObjectType {
    fn eq(&self, other: &ObjectType) -> bool {
        self.name == other.name
    }
}

impl Ty {
    /// The type as cel-go prints it.
    pub fn show(&self) -> String {
        match self {
            Ty::Dyn => "dyn".into(),
            Ty::Null => "null_type".into(),
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::Str => "string".into(),
            Ty::List(t) => format!("list({})", t.show()),
            Ty::Map(k, v) => format!("map({}, {})", k.show(), v.show()),
            Ty::Object(o) => o.name.into(),
        }
    }

    fn of(v: &Val) -> Ty {
        match v {
            Val::Null => Ty::Null,
            Val::Bool(_) => Ty::Bool,
            Val::Int(_) => Ty::Int,
            Val::Uint(_) => Ty::Uint,
            Val::Double(_) => Ty::Double,
            Val::Str(_) => Ty::Str,
            Val::List(_) => Ty::List(Box::new(Ty::Dyn)),
            Val::Map(_) => Ty::Map(Box::new(Ty::Dyn), Box::new(Ty::Dyn)),
        }
    }

    fn is_num(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    /// Whether a value of `self` may stand where `other` is expected (dyn on either side
    /// agrees with anything, as cel-go's unification does).
    fn agrees(&self, other: &Ty) -> bool {
        match (self, other) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => true,
            (Ty::List(a), Ty::List(b)) => a.agrees(b),
            (Ty::Map(a, b), Ty::Map(c, d)) => a.agrees(c) && b.agrees(d),
            (Ty::Object(a), Ty::Object(b)) => a.name == b.name,
            (a, b) => a == b,
        }
    }

    /// The join of two types (dyn where they differ).
    fn join(&self, other: &Ty) -> Ty {
        if self == other { self.clone() } else { Ty::Dyn }
    }
}

/// The variables an expression may use.
pub struct Decls {
    /// Name and type of each variable.
    pub vars: Vec<(&'static str, Ty)>,
    /// Names the real environment declares that this evaluator cannot serve, with why.
    pub unsupported: Vec<(&'static str, &'static str)>,
}

struct Checker<'a> {
    decls: &'a Decls,
    scopes: Vec<(String, Ty)>,
}

fn overload(at: usize, f: &str, args: &[&Ty]) -> CompileError {
    let list: Vec<String> = args.iter().map(|t| t.show()).collect();
    CompileError::check(
        at,
        format!(
            "found no matching overload for '{f}' applied to '({})'",
            list.join(", ")
        ),
    )
}

/// Functions (global or member) the real environment has and this evaluator does not.
const UNSUPPORTED_FUNCTIONS: &[&str] = &[
    "matches",
    "timestamp",
    "duration",
    "bytes",
    "type",
    "dyn",
    "getField",
    "lowerAscii",
    "upperAscii",
    "split",
    "join",
    "replace",
    "substring",
    "trim",
    "indexOf",
    "lastIndexOf",
    "charAt",
    "format",
    "quote",
    "find",
    "findAll",
    "url",
    "ip",
    "cidr",
    "quantity",
    "isSorted",
    "sum",
    "min",
    "max",
    "indexOf",
    "sets",
    "base64",
    "optional",
    "orValue",
    "hasValue",
    "value",
    "semver",
    "jsonpatch",
];

impl Checker<'_> {
    fn var(&self, at: usize, name: &str) -> Result<Ty, CompileError> {
        if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Ok(t.clone());
        }
        if let Some((_, t)) = self.decls.vars.iter().find(|(n, _)| *n == name) {
            return Ok(t.clone());
        }
        if let Some((_, why)) = self.decls.unsupported.iter().find(|(n, _)| *n == name) {
            return Err(CompileError::unsupported(at, why));
        }
        Err(CompileError::check(
            at,
            format!("undeclared reference to '{name}' (in container '')"),
        ))
    }

    fn field(&self, at: usize, t: &Ty, f: &str) -> Result<Ty, CompileError> {
        match t {
            Ty::Dyn => Ok(Ty::Dyn),
            Ty::Map(k, v) if k.agrees(&Ty::Str) => Ok((**v).clone()),
            Ty::Object(o) => (o.fields)()
                .into_iter()
                .find(|(n, _)| *n == f)
                .map(|(_, t)| t)
                .ok_or_else(|| CompileError::check(at, format!("undefined field '{f}'"))),
            other => Err(CompileError::check(
                at,
                format!("type '{}' does not support field selection", other.show()),
            )),
        }
    }

    fn check(&mut self, e: &Node) -> Result<Ty, CompileError> {
        let at = e.at;
        Ok(match &e.kind {
            Kind::Lit(v) => Ty::of(v),
            Kind::Ident(n) => self.var(at, n)?,
            Kind::Select(x, f) | Kind::Has(x, f) => {
                let t = self.check(x)?;
                let ft = self.field(at, &t, f)?;
                if matches!(e.kind, Kind::Has(..)) {
                    Ty::Bool
                } else {
                    ft
                }
            }
            Kind::Index(x, i) => {
                let t = self.check(x)?;
                let it = self.check(i)?;
                match &t {
                    Ty::Dyn => Ty::Dyn,
                    Ty::List(el) if matches!(it, Ty::Int | Ty::Uint | Ty::Dyn) => (**el).clone(),
                    Ty::Map(k, v) if it.agrees(k) => (**v).clone(),
                    _ => return Err(overload(at, "_[_]", &[&t, &it])),
                }
            }
            Kind::Not(x) => {
                let t = self.check(x)?;
                if !t.agrees(&Ty::Bool) {
                    return Err(overload(at, "!_", &[&t]));
                }
                Ty::Bool
            }
            Kind::Neg(x) => {
                let t = self.check(x)?;
                match t {
                    Ty::Int | Ty::Double | Ty::Dyn => t,
                    _ => return Err(overload(at, "-_", &[&t])),
                }
            }
            Kind::And(a, b) | Kind::Or(a, b) => {
                let (ta, tb) = (self.check(a)?, self.check(b)?);
                if !ta.agrees(&Ty::Bool) || !tb.agrees(&Ty::Bool) {
                    let f = if matches!(e.kind, Kind::And(..)) {
                        "_&&_"
                    } else {
                        "_||_"
                    };
                    return Err(overload(at, f, &[&ta, &tb]));
                }
                Ty::Bool
            }
            Kind::Cond(c, a, b) => {
                let tc = self.check(c)?;
                let (ta, tb) = (self.check(a)?, self.check(b)?);
                if !tc.agrees(&Ty::Bool) || !ta.agrees(&tb) {
                    return Err(overload(at, "_?_:_", &[&tc, &ta, &tb]));
                }
                ta.join(&tb)
            }
            Kind::Binary(op, a, b) => {
                let (ta, tb) = (self.check(a)?, self.check(b)?);
                self.binary(at, *op, &ta, &tb)?
            }
            Kind::List(items) => {
                let mut el: Option<Ty> = None;
                for i in items {
                    let t = self.check(i)?;
                    el = Some(self.homogeneous(i.at, el, t)?);
                }
                Ty::List(Box::new(el.unwrap_or(Ty::Dyn)))
            }
            Kind::Map(entries) => {
                let (mut kt, mut vt): (Option<Ty>, Option<Ty>) = (None, None);
                for (k, v) in entries {
                    let t = self.check(k)?;
                    if !matches!(t, Ty::Str | Ty::Int | Ty::Uint | Ty::Bool | Ty::Dyn) {
                        return Err(CompileError::check(
                            k.at,
                            format!("unsupported map key type: {}", t.show()),
                        ));
                    }
                    kt = Some(self.homogeneous(k.at, kt, t)?);
                    let t = self.check(v)?;
                    vt = Some(self.homogeneous(v.at, vt, t)?);
                }
                Ty::Map(
                    Box::new(kt.unwrap_or(Ty::Dyn)),
                    Box::new(vt.unwrap_or(Ty::Dyn)),
                )
            }
            Kind::Call { target, name, args } => self.call(at, target.as_deref(), name, args)?,
            Kind::Comprehension {
                kind,
                range,
                var,
                body,
                transform,
            } => {
                let rt = self.check(range)?;
                let el = match &rt {
                    Ty::Dyn => Ty::Dyn,
                    Ty::List(t) => (**t).clone(),
                    Ty::Map(k, _) => (**k).clone(),
                    other => {
                        return Err(CompileError::check(
                            range.at,
                            format!(
                                "expression of type '{}' cannot be range of a comprehension (must be list, map, or dynamic)",
                                other.show()
                            ),
                        ));
                    }
                };
                self.scopes.push((var.clone(), el.clone()));
                let bt = self.check(body);
                let tt = transform.as_deref().map(|t| self.check(t)).transpose();
                self.scopes.pop();
                let (bt, tt) = (bt?, tt?);
                let predicate = !(*kind == Macro::Map && tt.is_none());
                if predicate && !bt.agrees(&Ty::Bool) {
                    return Err(CompileError::check(
                        body.at,
                        format!("expected type 'bool' but found '{}'", bt.show()),
                    ));
                }
                match kind {
                    Macro::All | Macro::Exists | Macro::ExistsOne => Ty::Bool,
                    Macro::Filter => Ty::List(Box::new(el)),
                    Macro::Map => Ty::List(Box::new(tt.unwrap_or(bt))),
                }
            }
        })
    }

    fn homogeneous(&self, at: usize, so_far: Option<Ty>, t: Ty) -> Result<Ty, CompileError> {
        match so_far {
            None => Ok(t),
            Some(s) if s.agrees(&t) => Ok(s.join(&t)),
            Some(s) => Err(CompileError::check(
                at,
                format!("expected type '{}' but found '{}'", s.show(), t.show()),
            )),
        }
    }

    fn binary(&self, at: usize, op: BinOp, a: &Ty, b: &Ty) -> Result<Ty, CompileError> {
        let dyn_either = *a == Ty::Dyn || *b == Ty::Dyn;
        let ok = match op {
            BinOp::Eq | BinOp::Ne => a.agrees(b) || *a == Ty::Null || *b == Ty::Null,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                dyn_either
                    || (a.is_num() && b.is_num())
                    || (a == b && matches!(a, Ty::Str | Ty::Bool))
            }
            BinOp::In => match b {
                Ty::Dyn => true,
                Ty::List(el) => a.agrees(el),
                Ty::Map(k, _) => a.agrees(k),
                _ => false,
            },
            BinOp::Add => {
                dyn_either
                    || (a == b && (a.is_num() || *a == Ty::Str))
                    || matches!((a, b), (Ty::List(x), Ty::List(y)) if x.agrees(y))
            }
            BinOp::Sub | BinOp::Mul | BinOp::Div => dyn_either || (a == b && a.is_num()),
            BinOp::Rem => dyn_either || (a == b && matches!(a, Ty::Int | Ty::Uint)),
        };
        if !ok {
            return Err(overload(at, op.function(), &[a, b]));
        }
        Ok(match op {
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::In => {
                Ty::Bool
            }
            _ if *a == Ty::Dyn => b.clone(),
            _ => a.clone(),
        })
    }

    fn call(
        &mut self,
        at: usize,
        target: Option<&Node>,
        name: &str,
        args: &[Node],
    ) -> Result<Ty, CompileError> {
        let tt = target.map(|t| self.check(t)).transpose()?;
        let ats: Vec<Ty> = args
            .iter()
            .map(|a| self.check(a))
            .collect::<Result<_, _>>()?;
        let mut all: Vec<&Ty> = tt.iter().collect();
        all.extend(ats.iter());
        let string_like = |t: &Ty| t.agrees(&Ty::Str);
        let result = match (name, tt.as_ref(), ats.as_slice()) {
            ("size", None, [x]) | ("size", Some(x), []) => {
                matches!(x, Ty::Dyn | Ty::Str | Ty::List(_) | Ty::Map(..)).then_some(Ty::Int)
            }
            ("startsWith" | "endsWith" | "contains", Some(s), [x]) => {
                (string_like(s) && string_like(x)).then_some(Ty::Bool)
            }
            ("int", None, [x]) => {
                matches!(x, Ty::Dyn | Ty::Int | Ty::Uint | Ty::Double | Ty::Str).then_some(Ty::Int)
            }
            ("uint", None, [x]) => {
                matches!(x, Ty::Dyn | Ty::Int | Ty::Uint | Ty::Double | Ty::Str).then_some(Ty::Uint)
            }
            ("double", None, [x]) => {
                matches!(x, Ty::Dyn | Ty::Int | Ty::Uint | Ty::Double | Ty::Str)
                    .then_some(Ty::Double)
            }
            ("string", None, [x]) => matches!(
                x,
                Ty::Dyn | Ty::Int | Ty::Uint | Ty::Double | Ty::Str | Ty::Bool
            )
            .then_some(Ty::Str),
            ("bool", None, [x]) => matches!(x, Ty::Dyn | Ty::Bool | Ty::Str).then_some(Ty::Bool),
            _ if UNSUPPORTED_FUNCTIONS.contains(&name) => {
                return Err(CompileError::unsupported(
                    at,
                    &format!("the function '{name}'"),
                ));
            }
            (
                "size" | "startsWith" | "endsWith" | "contains" | "int" | "uint" | "double"
                | "string" | "bool",
                _,
                _,
            ) => None,
            _ => {
                return Err(CompileError::check(
                    at,
                    format!("undeclared reference to '{name}' (in container '')"),
                ));
            }
        };
        result.ok_or_else(|| overload(at, name, &all))
    }
}

/// Checks `e` against `decls`; its type.
pub fn check(e: &Node, decls: &Decls) -> Result<Ty, CompileError> {
    Checker {
        decls,
        scopes: Vec::new(),
    }
    .check(e)
}

/// Kubernetes' `kubernetes.GroupVersionKind`.
pub static GVK: ObjectType = ObjectType {
    name: "kubernetes.GroupVersionKind",
    fields: || vec![("group", Ty::Str), ("version", Ty::Str), ("kind", Ty::Str)],
};
/// Kubernetes' `kubernetes.GroupVersionResource`.
pub static GVR: ObjectType = ObjectType {
    name: "kubernetes.GroupVersionResource",
    fields: || {
        vec![
            ("group", Ty::Str),
            ("version", Ty::Str),
            ("resource", Ty::Str),
        ]
    },
};
/// Kubernetes' `kubernetes.UserInfo`.
pub static USER_INFO: ObjectType = ObjectType {
    name: "kubernetes.UserInfo",
    fields: || {
        vec![
            ("username", Ty::Str),
            ("uid", Ty::Str),
            ("groups", Ty::List(Box::new(Ty::Str))),
            (
                "extra",
                Ty::Map(Box::new(Ty::Str), Box::new(Ty::List(Box::new(Ty::Str)))),
            ),
        ]
    },
};
/// Kubernetes' `kubernetes.AdmissionRequest` (admission/plugin/cel's `BuildRequestType`:
/// no `uid`, `object` or `oldObject`).
pub static ADMISSION_REQUEST: ObjectType = ObjectType {
    name: "kubernetes.AdmissionRequest",
    fields: || {
        vec![
            ("kind", Ty::Object(&GVK)),
            ("resource", Ty::Object(&GVR)),
            ("subResource", Ty::Str),
            ("requestKind", Ty::Object(&GVK)),
            ("requestResource", Ty::Object(&GVR)),
            ("requestSubResource", Ty::Str),
            ("name", Ty::Str),
            ("namespace", Ty::Str),
            ("operation", Ty::Str),
            ("userInfo", Ty::Object(&USER_INFO)),
            ("dryRun", Ty::Bool),
            ("options", Ty::Dyn),
        ]
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::parse::parse;

    fn decls() -> Decls {
        Decls {
            vars: vec![
                ("object", Ty::Dyn),
                ("request", Ty::Object(&ADMISSION_REQUEST)),
            ],
            unsupported: vec![("authorizer", "the authorizer variable")],
        }
    }

    fn ty(src: &str) -> Result<Ty, String> {
        check(&parse(src).map_err(|e| e.to_string())?, &decls()).map_err(|e| e.to_string())
    }

    #[test]
    fn types_and_refusals() {
        assert_eq!(ty("request.operation == 'CREATE'"), Ok(Ty::Bool));
        assert_eq!(
            ty("request.userInfo.groups"),
            Ok(Ty::List(Box::new(Ty::Str)))
        );
        assert_eq!(ty("object.spec.x"), Ok(Ty::Dyn));
        assert_eq!(ty("[1, 2].map(x, x * 2)"), Ok(Ty::List(Box::new(Ty::Int))));
        assert!(
            ty("request.nope")
                .unwrap_err()
                .contains("undefined field 'nope'")
        );
        assert!(
            ty("nope")
                .unwrap_err()
                .contains("undeclared reference to 'nope'")
        );
        assert!(
            ty("request.operation == 1")
                .unwrap_err()
                .contains("'_==_' applied to '(string, int)'")
        );
        assert!(
            ty("[1, 'a']")
                .unwrap_err()
                .contains("expected type 'int' but found 'string'")
        );
        assert!(
            ty("object.name.matches('x')")
                .unwrap_err()
                .contains("'matches'")
        );
        assert!(
            ty("authorizer.group('')")
                .unwrap_err()
                .contains("authorizer")
        );
        assert!(ty("1 && true").is_err());
        assert!(ty("'a'.startsWith(1)").is_err());
        assert!(ty("object.x in 'abc'").is_err());
        assert!(
            ty("foo(1)")
                .unwrap_err()
                .contains("undeclared reference to 'foo'")
        );
        assert!(ty("1.exists(x, true)").is_err());
        assert_eq!(ty("object.a == null"), Ok(Ty::Bool));
        assert_eq!(ty("1 < 2.5"), Ok(Ty::Bool));
    }
}
