//! CEL runtime values, their conversion from JSON (as Kubernetes hands an unstructured
//! object to CEL: integers are int, other numbers double), and CEL's heterogeneous equality
//! (values of different types are unequal, numbers compare by value).

use std::sync::Arc;

use serde_json::Value;

/// A CEL value.
#[derive(Debug, Clone)]
pub enum Val {
    /// `null`.
    Null,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A uint.
    Uint(u64),
    /// A double.
    Double(f64),
    /// A string.
    Str(Arc<str>),
    /// A list.
    List(Arc<[Val]>),
    /// A map, in insertion order (keys are unique).
    Map(Arc<[(Val, Val)]>),
}

impl PartialEq for Val {
    fn eq(&self, other: &Val) -> bool {
        equal(self, other)
    }
}

impl Val {
    /// The CEL type name (as errors print it).
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null_type",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Uint(_) => "uint",
            Val::Double(_) => "double",
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Map(_) => "map",
        }
    }

    /// The value at `key` of a map (CEL's key equality: numbers by value).
    pub fn map_get(entries: &[(Val, Val)], key: &Val) -> Option<Val> {
        entries
            .iter()
            .find(|(k, _)| equal(k, key))
            .map(|(_, v)| v.clone())
    }

    /// Converts JSON as Kubernetes gives an unstructured object to CEL.
    pub fn from_json(v: &Value) -> Val {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Val::Int(i),
                (None, Some(u)) => Val::Uint(u),
                _ => Val::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Val::Str(s.as_str().into()),
            Value::Array(a) => Val::List(a.iter().map(Val::from_json).collect()),
            Value::Object(m) => Val::Map(
                m.iter()
                    .map(|(k, v)| (Val::Str(k.as_str().into()), Val::from_json(v)))
                    .collect(),
            ),
        }
    }
}

fn num(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Uint(u) => Some(*u as f64),
        Val::Double(d) => Some(*d),
        _ => None,
    }
}

/// CEL's `==`: heterogeneous (different types are unequal), numbers by value across
/// int/uint/double, lists element-wise, maps by key set and values.
pub fn equal(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Null, Val::Null) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Int(x), Val::Int(y)) => x == y,
        (Val::Uint(x), Val::Uint(y)) => x == y,
        (Val::Int(i), Val::Uint(u)) | (Val::Uint(u), Val::Int(i)) => {
            u64::try_from(*i).is_ok_and(|i| i == *u)
        }
        (Val::Double(_), _) | (_, Val::Double(_)) => match (num(a), num(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
        (Val::Str(x), Val::Str(y)) => x == y,
        (Val::List(x), Val::List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| equal(p, q))
        }
        (Val::Map(x), Val::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| Val::map_get(y, k).is_some_and(|w| equal(v, &w)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_and_equality() {
        let v = Val::from_json(&json!({"a": [1, 2.5, "x", null, true], "b": {}}));
        let Val::Map(m) = &v else { panic!() };
        let a = Val::map_get(m, &Val::Str("a".into())).unwrap();
        assert_eq!(
            a,
            Val::List(
                vec![
                    Val::Int(1),
                    Val::Double(2.5),
                    Val::Str("x".into()),
                    Val::Null,
                    Val::Bool(true)
                ]
                .into()
            )
        );
        assert!(equal(&Val::Int(1), &Val::Double(1.0)));
        assert!(equal(&Val::Int(1), &Val::Uint(1)));
        assert!(!equal(&Val::Int(-1), &Val::Uint(u64::MAX)));
        assert!(!equal(&Val::Str("1".into()), &Val::Int(1)));
        assert!(!equal(&Val::Null, &Val::Bool(false)));
    }
}
