//! From k8s-pb's prost messages to the JSON objects the store holds. The per-message
//! impls are generated (`generated.rs`); this file has the field rules and the messages
//! whose JSON form is not their message form (times, quantities, int-or-string, raw JSON).
//!
//! Field rules, as Go's proto decode followed by its JSON encode gives them: an absent
//! optional field, an empty list or map and an empty string are left out (Go writes every
//! non-pointer string, even empty, and drops it again with `omitempty`); `false` and `0`
//! are kept (pointer fields mean them).

use std::collections::BTreeMap;

use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{Duration, FieldsV1, MicroTime, Time};
use k8s_pb::apimachinery::pkg::runtime::RawExtension;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value, json};

/// A message (or scalar) as JSON; `Null` means "leave the field out".
pub trait ToJson {
    /// This value as Kubernetes' JSON.
    fn to_json(&self) -> Value;
}

/// A message field as JSON; None leaves it out.
pub trait Field {
    /// This field's JSON, or None to leave it out.
    fn field(&self) -> Option<Value>;
}

/// Sets `key` unless the field is to be left out.
pub fn put(m: &mut Map<String, Value>, key: &str, f: &impl Field) {
    if let Some(v) = f.field() {
        m.insert(key.to_string(), v);
    }
}

/// A Go struct embedded with `json:",inline"`: its fields go into the parent object.
pub fn put_inline<T: ToJson>(m: &mut Map<String, Value>, f: &Option<T>) {
    if let Some(Value::Object(inner)) = f.as_ref().map(ToJson::to_json) {
        m.extend(inner);
    }
}

fn kept(v: Value) -> Option<Value> {
    match &v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        _ => Some(v),
    }
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap_or(Value::Null)
}

impl<T: ToJson> Field for Option<T> {
    fn field(&self) -> Option<Value> {
        self.as_ref().and_then(|v| kept(v.to_json()))
    }
}

/// `bytes` fields are base64 strings in JSON.
impl Field for Option<Vec<u8>> {
    fn field(&self) -> Option<Value> {
        self.as_ref().map(|b| base64(b))
    }
}

impl<T: ToJson> Field for Vec<T> {
    fn field(&self) -> Option<Value> {
        (!self.is_empty()).then(|| Value::Array(self.iter().map(ToJson::to_json).collect()))
    }
}

/// Map values keep empty strings (`data: {"k": ""}` means something).
pub trait MapValue {
    /// This map value's JSON.
    fn map_value(&self) -> Value;
}

impl<T: ToJson> MapValue for T {
    fn map_value(&self) -> Value {
        self.to_json()
    }
}

impl MapValue for Vec<u8> {
    fn map_value(&self) -> Value {
        base64(self)
    }
}

impl<T: MapValue> Field for BTreeMap<String, T> {
    fn field(&self) -> Option<Value> {
        (!self.is_empty()).then(|| {
            Value::Object(
                self.iter()
                    .map(|(k, v)| (k.clone(), v.map_value()))
                    .collect(),
            )
        })
    }
}

impl ToJson for String {
    fn to_json(&self) -> Value {
        Value::String(self.clone())
    }
}

impl ToJson for bool {
    fn to_json(&self) -> Value {
        Value::Bool(*self)
    }
}

impl ToJson for i32 {
    fn to_json(&self) -> Value {
        json!(self)
    }
}

impl ToJson for i64 {
    fn to_json(&self) -> Value {
        json!(self)
    }
}

impl ToJson for f64 {
    fn to_json(&self) -> Value {
        serde_json::Number::from_f64(*self).map_or(Value::Null, Value::Number)
    }
}

impl<T: ToJson> ToJson for Box<T> {
    fn to_json(&self) -> Value {
        (**self).to_json()
    }
}

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), which Go writes for an unset time.
const GO_ZERO_TIME: i64 = -62_135_596_800;

fn rfc3339(seconds: Option<i64>, nanos: Option<i32>, micro: bool) -> Value {
    let Some(s) = seconds.filter(|s| *s != GO_ZERO_TIME) else {
        return Value::Null;
    };
    let ns = nanos.unwrap_or(0).clamp(0, 999_999_999);
    match k8s_openapi::jiff::Timestamp::new(s, ns) {
        Ok(t) if micro => json!(t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()),
        Ok(t) => json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        Err(_) => Value::Null,
    }
}

impl ToJson for Time {
    fn to_json(&self) -> Value {
        rfc3339(self.seconds, self.nanos, false)
    }
}

impl ToJson for MicroTime {
    fn to_json(&self) -> Value {
        rfc3339(self.seconds, self.nanos, true)
    }
}

/// Go's `time.Duration.String()` form (`1h2m3.5s`), which `metav1.Duration` uses in JSON.
impl ToJson for Duration {
    fn to_json(&self) -> Value {
        let ns = self.duration.unwrap_or(0);
        if ns == 0 {
            return json!("0s");
        }
        let sign = if ns < 0 { "-" } else { "" };
        let ns = ns.unsigned_abs();
        let (h, rem) = (ns / 3_600_000_000_000, ns % 3_600_000_000_000);
        let (m, rem) = (rem / 60_000_000_000, rem % 60_000_000_000);
        let (s, frac) = (rem / 1_000_000_000, rem % 1_000_000_000);
        let mut out = String::from(sign);
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if h > 0 || m > 0 {
            out.push_str(&format!("{m}m"));
        }
        let frac = format!("{frac:09}");
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            out.push_str(&format!("{s}s"));
        } else {
            out.push_str(&format!("{s}.{frac}s"));
        }
        json!(out)
    }
}

/// A Quantity message without its string is Go's zero Quantity, which it writes as "0"
/// (a null in a resource map would make the object unreadable to typed clients).
impl ToJson for Quantity {
    fn to_json(&self) -> Value {
        Value::String(self.string.clone().unwrap_or_else(|| "0".into()))
    }
}

impl ToJson for IntOrString {
    fn to_json(&self) -> Value {
        match self.r#type {
            Some(1) => self.str_val.clone().map_or(json!(""), Value::String),
            _ => json!(self.int_val.unwrap_or(0)),
        }
    }
}

/// Raw JSON carried in a bytes field (managedFields' `fieldsV1`, `RawExtension`).
fn raw_json(raw: &Option<Vec<u8>>) -> Value {
    raw.as_deref()
        .filter(|r| !r.is_empty())
        .and_then(|r| serde_json::from_slice(r).ok())
        .unwrap_or(Value::Null)
}

impl ToJson for FieldsV1 {
    fn to_json(&self) -> Value {
        raw_json(&self.raw)
    }
}

impl ToJson for RawExtension {
    fn to_json(&self) -> Value {
        raw_json(&self.raw)
    }
}
