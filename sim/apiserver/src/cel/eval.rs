//! Evaluation with cel-go's semantics: `&&`, `||` and the `all`/`exists` macros commutative
//! over errors (false, resp. true, wins over an error), `?:`, `!` and every function strict,
//! a missing map key or field an error (`no such key`), `has()` testing presence, int and
//! uint arithmetic checked for overflow, heterogeneous equality.

use std::sync::Arc;

use super::parse::{BinOp, Kind, Macro, Node};
use super::value::{Val, equal};

/// A run-time error's message.
pub type EvalError = String;

/// The variables of one evaluation.
pub struct Activation<'a> {
    /// Name and value of each variable.
    pub vars: &'a [(&'a str, Val)],
}

struct Env<'a> {
    act: &'a Activation<'a>,
    scopes: Vec<(String, Val)>,
}

fn no_overload(f: &str, args: &[&Val]) -> EvalError {
    let list: Vec<&str> = args.iter().map(|v| v.type_name()).collect();
    format!("no such overload: {f}({})", list.join(", "))
}

fn as_bool(v: Result<Val, EvalError>, f: &str) -> Result<bool, EvalError> {
    match v? {
        Val::Bool(b) => Ok(b),
        other => Err(no_overload(f, &[&other])),
    }
}

fn select(v: &Val, f: &str) -> Result<Val, EvalError> {
    match v {
        Val::Map(m) => {
            Val::map_get(m, &Val::Str(f.into())).ok_or_else(|| format!("no such key: {f}"))
        }
        other => Err(format!(
            "type '{}' does not support field selection",
            other.type_name()
        )),
    }
}

fn index(v: &Val, i: &Val) -> Result<Val, EvalError> {
    match (v, i) {
        (Val::List(l), Val::Int(_) | Val::Uint(_) | Val::Double(_)) => {
            let n = match i {
                Val::Int(n) => Some(*n),
                Val::Uint(u) => i64::try_from(*u).ok(),
                Val::Double(d) if d.fract() == 0.0 && d.abs() < 9.2e18 => Some(*d as i64),
                _ => None,
            };
            let Some(n) = n else {
                return Err(format!("unsupported index value {i:?} in list"));
            };
            usize::try_from(n)
                .ok()
                .and_then(|k| l.get(k).cloned())
                .ok_or_else(|| format!("index out of bounds: {n}"))
        }
        (Val::Map(m), k) => Val::map_get(m, k).ok_or_else(|| match k {
            Val::Str(s) => format!("no such key: {s}"),
            other => format!("no such key: {other:?}"),
        }),
        _ => Err(no_overload("_[_]", &[v, i])),
    }
}

fn contains(container: &Val, x: &Val) -> Result<bool, EvalError> {
    match container {
        Val::List(l) => Ok(l.iter().any(|e| equal(e, x))),
        Val::Map(m) => Ok(m.iter().any(|(k, _)| equal(k, x))),
        other => Err(no_overload("@in", &[x, other])),
    }
}

fn compare(a: &Val, b: &Val) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Uint(x), Val::Uint(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::Uint(y)) => Some(if *x < 0 {
            Ordering::Less
        } else {
            (*x as u64).cmp(y)
        }),
        (Val::Uint(x), Val::Int(y)) => Some(if *y < 0 {
            Ordering::Greater
        } else {
            x.cmp(&(*y as u64))
        }),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::Double(_), _) | (_, Val::Double(_)) => {
            let f = |v: &Val| match v {
                Val::Int(i) => Some(*i as f64),
                Val::Uint(u) => Some(*u as f64),
                Val::Double(d) => Some(*d),
                _ => None,
            };
            f(a)?.partial_cmp(&f(b)?)
        }
        _ => None,
    }
}

fn arith(op: BinOp, a: &Val, b: &Val) -> Result<Val, EvalError> {
    let overflow = || "integer overflow".to_string();
    Ok(match (op, a, b) {
        (BinOp::Add, Val::Int(x), Val::Int(y)) => Val::Int(x.checked_add(*y).ok_or_else(overflow)?),
        (BinOp::Sub, Val::Int(x), Val::Int(y)) => Val::Int(x.checked_sub(*y).ok_or_else(overflow)?),
        (BinOp::Mul, Val::Int(x), Val::Int(y)) => Val::Int(x.checked_mul(*y).ok_or_else(overflow)?),
        (BinOp::Div | BinOp::Rem, Val::Int(_), Val::Int(0))
        | (BinOp::Div | BinOp::Rem, Val::Uint(_), Val::Uint(0)) => {
            return Err(if op == BinOp::Div {
                "division by zero".into()
            } else {
                "modulus by zero".into()
            });
        }
        (BinOp::Div, Val::Int(x), Val::Int(y)) => Val::Int(x.checked_div(*y).ok_or_else(overflow)?),
        (BinOp::Rem, Val::Int(x), Val::Int(y)) => Val::Int(x.checked_rem(*y).ok_or_else(overflow)?),
        (BinOp::Add, Val::Uint(x), Val::Uint(y)) => {
            Val::Uint(x.checked_add(*y).ok_or_else(overflow)?)
        }
        (BinOp::Sub, Val::Uint(x), Val::Uint(y)) => {
            Val::Uint(x.checked_sub(*y).ok_or_else(overflow)?)
        }
        (BinOp::Mul, Val::Uint(x), Val::Uint(y)) => {
            Val::Uint(x.checked_mul(*y).ok_or_else(overflow)?)
        }
        (BinOp::Div, Val::Uint(x), Val::Uint(y)) => Val::Uint(x / y),
        (BinOp::Rem, Val::Uint(x), Val::Uint(y)) => Val::Uint(x % y),
        (BinOp::Add, Val::Double(x), Val::Double(y)) => Val::Double(x + y),
        (BinOp::Sub, Val::Double(x), Val::Double(y)) => Val::Double(x - y),
        (BinOp::Mul, Val::Double(x), Val::Double(y)) => Val::Double(x * y),
        (BinOp::Div, Val::Double(x), Val::Double(y)) => Val::Double(x / y),
        (BinOp::Add, Val::Str(x), Val::Str(y)) => Val::Str(format!("{x}{y}").into()),
        (BinOp::Add, Val::List(x), Val::List(y)) => {
            Val::List(x.iter().chain(y.iter()).cloned().collect())
        }
        _ => return Err(no_overload(op.function(), &[a, b])),
    })
}

fn range_items(v: &Val) -> Result<Vec<Val>, EvalError> {
    match v {
        Val::List(l) => Ok(l.to_vec()),
        Val::Map(m) => Ok(m.iter().map(|(k, _)| k.clone()).collect()),
        other => Err(format!(
            "expression of type '{}' cannot be range of a comprehension",
            other.type_name()
        )),
    }
}

fn convert(name: &str, v: &Val) -> Result<Val, EvalError> {
    let range = || format!("{name}() range error converting {v:?}");
    Ok(match (name, v) {
        ("int", Val::Int(i)) => Val::Int(*i),
        ("int", Val::Uint(u)) => Val::Int(i64::try_from(*u).map_err(|_| range())?),
        ("int", Val::Double(d)) if d.is_finite() && d.abs() < 9.223_372_036_854_775e18 => {
            Val::Int(d.trunc() as i64)
        }
        ("int", Val::Str(s)) => Val::Int(
            s.parse()
                .map_err(|_| format!("cannot convert string '{s}' to int"))?,
        ),
        ("uint", Val::Uint(u)) => Val::Uint(*u),
        ("uint", Val::Int(i)) => Val::Uint(u64::try_from(*i).map_err(|_| range())?),
        ("uint", Val::Double(d)) if d.is_finite() && *d >= 0.0 && *d < 1.8446744073709552e19 => {
            Val::Uint(d.trunc() as u64)
        }
        ("uint", Val::Str(s)) => Val::Uint(
            s.parse()
                .map_err(|_| format!("cannot convert string '{s}' to uint"))?,
        ),
        ("double", Val::Double(d)) => Val::Double(*d),
        ("double", Val::Int(i)) => Val::Double(*i as f64),
        ("double", Val::Uint(u)) => Val::Double(*u as f64),
        ("double", Val::Str(s)) => Val::Double(
            s.parse()
                .map_err(|_| format!("cannot convert string '{s}' to double"))?,
        ),
        ("string", Val::Str(s)) => Val::Str(s.clone()),
        ("string", Val::Int(i)) => Val::Str(i.to_string().into()),
        ("string", Val::Uint(u)) => Val::Str(u.to_string().into()),
        ("string", Val::Bool(b)) => Val::Str(b.to_string().into()),
        ("bool", Val::Bool(b)) => Val::Bool(*b),
        ("bool", Val::Str(s)) => Val::Bool(match &**s {
            "1" | "t" | "true" | "TRUE" | "True" => true,
            "0" | "f" | "false" | "FALSE" | "False" => false,
            _ => {
                return Err(format!(
                    "type conversion error from 'string' to 'bool': {s}"
                ));
            }
        }),
        _ => return Err(no_overload(name, &[v])),
    })
}

impl Env<'_> {
    fn var(&self, name: &str) -> Result<Val, EvalError> {
        if let Some((_, v)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Ok(v.clone());
        }
        self.act
            .vars
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("no such attribute: {name}"))
    }

    fn with<T>(&mut self, var: &str, v: Val, f: impl FnOnce(&mut Self) -> T) -> T {
        self.scopes.push((var.to_string(), v));
        let out = f(self);
        self.scopes.pop();
        out
    }

    fn eval(&mut self, e: &Node) -> Result<Val, EvalError> {
        match &e.kind {
            Kind::Lit(v) => Ok(v.clone()),
            Kind::Ident(n) => self.var(n),
            Kind::Select(x, f) => select(&self.eval(x)?, f),
            Kind::Has(x, f) => match self.eval(x)? {
                Val::Map(m) => Ok(Val::Bool(
                    m.iter().any(|(k, _)| matches!(k, Val::Str(s) if &**s == f)),
                )),
                other => Err(format!(
                    "invalid type for field selection: {}",
                    other.type_name()
                )),
            },
            Kind::Index(x, i) => {
                let v = self.eval(x)?;
                let i = self.eval(i)?;
                index(&v, &i)
            }
            Kind::Not(x) => Ok(Val::Bool(!as_bool(self.eval(x), "!_")?)),
            Kind::Neg(x) => match self.eval(x)? {
                Val::Int(i) => i
                    .checked_neg()
                    .map(Val::Int)
                    .ok_or_else(|| "integer overflow".into()),
                Val::Double(d) => Ok(Val::Double(-d)),
                other => Err(no_overload("-_", &[&other])),
            },
            Kind::And(a, b) => {
                let l = as_bool(self.eval(a), "_&&_");
                if l == Ok(false) {
                    return Ok(Val::Bool(false));
                }
                let r = as_bool(self.eval(b), "_&&_");
                match (l, r) {
                    (_, Ok(false)) => Ok(Val::Bool(false)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    _ => Ok(Val::Bool(true)),
                }
            }
            Kind::Or(a, b) => {
                let l = as_bool(self.eval(a), "_||_");
                if l == Ok(true) {
                    return Ok(Val::Bool(true));
                }
                let r = as_bool(self.eval(b), "_||_");
                match (l, r) {
                    (_, Ok(true)) => Ok(Val::Bool(true)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    _ => Ok(Val::Bool(false)),
                }
            }
            Kind::Cond(c, a, b) => {
                if as_bool(self.eval(c), "_?_:_")? {
                    self.eval(a)
                } else {
                    self.eval(b)
                }
            }
            Kind::Binary(op, a, b) => {
                let l = self.eval(a)?;
                let r = self.eval(b)?;
                match op {
                    BinOp::Eq => Ok(Val::Bool(equal(&l, &r))),
                    BinOp::Ne => Ok(Val::Bool(!equal(&l, &r))),
                    BinOp::In => contains(&r, &l).map(Val::Bool),
                    BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                        let o =
                            compare(&l, &r).ok_or_else(|| no_overload(op.function(), &[&l, &r]))?;
                        Ok(Val::Bool(match op {
                            BinOp::Lt => o.is_lt(),
                            BinOp::Le => o.is_le(),
                            BinOp::Gt => o.is_gt(),
                            _ => o.is_ge(),
                        }))
                    }
                    _ => arith(*op, &l, &r),
                }
            }
            Kind::List(items) => Ok(Val::List(
                items
                    .iter()
                    .map(|i| self.eval(i))
                    .collect::<Result<Arc<[Val]>, _>>()?,
            )),
            Kind::Map(entries) => {
                let mut out: Vec<(Val, Val)> = Vec::new();
                for (k, v) in entries {
                    let k = self.eval(k)?;
                    let v = self.eval(v)?;
                    if out.iter().any(|(o, _)| equal(o, &k)) {
                        return Err(format!("Failed with repeated key: {k:?}"));
                    }
                    out.push((k, v));
                }
                Ok(Val::Map(out.into()))
            }
            Kind::Call { target, name, args } => {
                let t = target.as_deref().map(|t| self.eval(t)).transpose()?;
                let a: Vec<Val> = args
                    .iter()
                    .map(|x| self.eval(x))
                    .collect::<Result<_, _>>()?;
                call(name, t.as_ref(), &a)
            }
            Kind::Comprehension {
                kind,
                range,
                var,
                body,
                transform,
            } => {
                let items = range_items(&self.eval(range)?)?;
                self.comprehension(*kind, items, var, body, transform.as_deref())
            }
        }
    }

    fn comprehension(
        &mut self,
        kind: Macro,
        items: Vec<Val>,
        var: &str,
        body: &Node,
        transform: Option<&Node>,
    ) -> Result<Val, EvalError> {
        match kind {
            Macro::All | Macro::Exists => {
                // The fold of `&&` (resp. `||`): the deciding value wins over an error.
                let decisive = kind == Macro::Exists;
                let f = if decisive { "_||_" } else { "_&&_" };
                let mut first_err = None;
                for it in items {
                    match as_bool(self.with(var, it, |env| env.eval(body)), f) {
                        Ok(b) if b == decisive => return Ok(Val::Bool(decisive)),
                        Ok(_) => {}
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(Val::Bool(!decisive)),
                }
            }
            Macro::ExistsOne => {
                let mut n = 0;
                for it in items {
                    if as_bool(self.with(var, it, |env| env.eval(body)), "exists_one")? {
                        n += 1;
                    }
                }
                Ok(Val::Bool(n == 1))
            }
            Macro::Filter => {
                let mut out = Vec::new();
                for it in items {
                    if as_bool(self.with(var, it.clone(), |env| env.eval(body)), "filter")? {
                        out.push(it);
                    }
                }
                Ok(Val::List(out.into()))
            }
            Macro::Map => {
                let mut out = Vec::new();
                for it in items {
                    let v = self.with(var, it, |env| -> Result<Option<Val>, EvalError> {
                        match transform {
                            None => env.eval(body).map(Some),
                            Some(t) => {
                                if as_bool(env.eval(body), "map")? {
                                    env.eval(t).map(Some)
                                } else {
                                    Ok(None)
                                }
                            }
                        }
                    })?;
                    out.extend(v);
                }
                Ok(Val::List(out.into()))
            }
        }
    }
}

fn call(name: &str, target: Option<&Val>, args: &[Val]) -> Result<Val, EvalError> {
    match (name, target, args) {
        ("size", None, [x]) | ("size", Some(x), []) => match x {
            Val::Str(s) => Ok(Val::Int(s.chars().count() as i64)),
            Val::List(l) => Ok(Val::Int(l.len() as i64)),
            Val::Map(m) => Ok(Val::Int(m.len() as i64)),
            other => Err(no_overload("size", &[other])),
        },
        ("startsWith", Some(Val::Str(s)), [Val::Str(p)]) => Ok(Val::Bool(s.starts_with(&**p))),
        ("endsWith", Some(Val::Str(s)), [Val::Str(p)]) => Ok(Val::Bool(s.ends_with(&**p))),
        ("contains", Some(Val::Str(s)), [Val::Str(p)]) => Ok(Val::Bool(s.contains(&**p))),
        ("int" | "uint" | "double" | "string" | "bool", None, [x]) => convert(name, x),
        _ => {
            let mut all: Vec<&Val> = target.into_iter().collect();
            all.extend(args.iter());
            Err(no_overload(name, &all))
        }
    }
}

/// Evaluates `e` (already checked) with the variables of `act`.
pub fn eval(e: &Node, act: &Activation<'_>) -> Result<Val, EvalError> {
    Env {
        act,
        scopes: Vec::new(),
    }
    .eval(e)
}
