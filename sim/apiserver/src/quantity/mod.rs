//! `resource.Quantity` as the real API server stores it. Its JSON and protobuf decoders
//! parse every quantity and its encoder writes it back in canonical form, so what a client
//! wrote is not what any reader gets: `3000` comes back as `3k`, `1000m` as `1`, `0.5` as
//! `500m`, `1024Mi` as `1Gi`. Readers that only accept what they would have written
//! themselves break on a real cluster; this stand-in does the same so that they break
//! here first. Which fields are quantities: [`canonicalize_object`].
//!
//! Written from apimachinery's `pkg/api/resource` rules (ParseQuantity, CanonicalizeBytes),
//! including its quirks: a string already "in canonical form" by its cheap test is kept
//! verbatim (`007`, `+5` and `1e3` stay), values are rounded up to 1n, BinarySI values are
//! capped at 2^63-1. Arithmetic is on decimal digit strings, so any length is exact.

use serde_json::Value;

use crate::resources::ResourceType;
use crate::status::ApiError;

#[cfg(test)]
mod tests;

/// Why a quantity does not parse (upstream's three error texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantityError {
    /// Not `<sign><digits>.<digits><suffix>`.
    Format,
    /// A suffix that is none of the known ones.
    Suffix,
    /// A number that does not convert (here: an exponent beyond ±1000, where upstream
    /// truncates to 32 bits and writes values no reader expects).
    Numeric,
}

impl std::fmt::Display for QuantityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Format => {
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            }
            Self::Suffix => "unable to parse quantity's suffix",
            Self::Numeric => "unable to parse numeric value",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalSi,
    BinarySi,
    DecimalExponent,
}

const DECIMAL: &[(&str, i64)] = &[
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];
const BINARY: &[(&str, i64)] = &[
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];
/// Upstream's cap for BinarySI values, 2^63-1.
const MAX_BINARY: &str = "9223372036854775807";

/// The pieces of a quantity string, as upstream's `parseQuantityString` splits it.
struct Parts<'a> {
    negative: bool,
    /// The integer digits without leading zeros; "0" when there are none.
    num: String,
    denom: &'a str,
    suffix: &'a str,
}

fn split(s: &str) -> Result<Parts<'_>, QuantityError> {
    let b = s.as_bytes();
    let negative = b.first() == Some(&b'-');
    let mut pos = usize::from(matches!(b.first(), Some(b'-' | b'+')));
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    let digits_from = |p: usize| p + b[p..].iter().take_while(|c| c.is_ascii_digit()).count();
    let num_end = digits_from(pos);
    let num = if num_end == pos {
        "0".to_string()
    } else {
        s[pos..num_end].to_string()
    };
    let mut end = num_end;
    let mut denom = "";
    if end < b.len() && b[end] == b'.' {
        let d_end = digits_from(end + 1);
        denom = &s[end + 1..d_end];
        end = d_end;
    }
    let suffix = &s[end..];
    // Letters from upstream's suffix alphabet, an optional sign, digits, and nothing else.
    let mut i = end
        + suffix
            .bytes()
            .take_while(|c| b"eEinumkKMGTP".contains(c))
            .count();
    if i < b.len() && matches!(b[i], b'-' | b'+') {
        i += 1;
    }
    if digits_from(i) != b.len() {
        return Err(QuantityError::Format);
    }
    Ok(Parts {
        negative,
        num,
        denom,
        suffix,
    })
}

fn interpret(suffix: &str) -> Result<(u32, i64, Format), QuantityError> {
    if let Some((_, e)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        return Ok((10, *e, Format::DecimalSi));
    }
    if let Some((_, e)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        return Ok((2, *e, Format::BinarySi));
    }
    match suffix.strip_prefix(['e', 'E']) {
        Some(exp) if !exp.is_empty() => {
            let e: i64 = exp.parse().map_err(|_| QuantityError::Suffix)?;
            if e.abs() > 1000 {
                return Err(QuantityError::Numeric);
            }
            Ok((10, e, Format::DecimalExponent))
        }
        _ => Err(QuantityError::Suffix),
    }
}

/// Whether upstream's parser keeps the string as written: its fast path (the value fits
/// an int64 at scale 1n or coarser) plus its "already canonical" test, which looks only at
/// the digits, so leading zeros and a `+` survive.
fn kept_verbatim(p: &Parts<'_>, exponent: i64, format: Format) -> bool {
    let digits = p.num.len() + p.denom.len();
    match format {
        Format::DecimalSi | Format::DecimalExponent => {
            let scale = exponent - p.denom.len() as i64;
            let shifted = format!("{}{}", p.num, p.denom);
            digits <= 18
                && scale >= -9
                && scale % 3 == 0
                && !shifted.ends_with("000")
                && !shifted.starts_with('0')
        }
        Format::BinarySi => {
            // Upstream's precision estimate: 15 - digits - int(float32(exponent)*3/10) - 1.
            let precision = 15 - p.num.len() as i64 - (exponent * 3 / 10) - 1;
            let Ok(value) = p.num.parse::<i64>() else {
                return false;
            };
            p.denom.is_empty()
                && precision >= 0
                && value.checked_mul(1 << exponent).is_some()
                && value & 7 != 0
        }
    }
}

/// Decimal digits, most significant first, no leading zeros (empty is zero).
type Digits = Vec<u8>;

fn digits_of(s: &str) -> Digits {
    let d: Digits = s.bytes().map(|c| c - b'0').collect();
    trim(d)
}

fn trim(mut d: Digits) -> Digits {
    let zeros = d.iter().take_while(|&&x| x == 0).count();
    d.drain(..zeros);
    d
}

fn mul_small(d: &mut Digits, k: u32) {
    let mut carry = 0u64;
    for x in d.iter_mut().rev() {
        let v = u64::from(*x) * u64::from(k) + carry;
        *x = (v % 10) as u8;
        carry = v / 10;
    }
    while carry > 0 {
        d.insert(0, (carry % 10) as u8);
        carry /= 10;
    }
    let taken = std::mem::take(d);
    *d = trim(taken);
}

fn divmod_small(d: &[u8], k: u32) -> (Digits, u32) {
    let mut rem = 0u64;
    let mut q = Vec::with_capacity(d.len());
    for &x in d {
        let v = rem * 10 + u64::from(x);
        q.push((v / u64::from(k)) as u8);
        rem = v % u64::from(k);
    }
    (trim(q), rem as u32)
}

fn add_one(d: &mut Digits) {
    for x in d.iter_mut().rev() {
        if *x < 9 {
            *x += 1;
            return;
        }
        *x = 0;
    }
    d.insert(0, 1);
}

fn to_string(d: &[u8]) -> String {
    if d.is_empty() {
        return "0".into();
    }
    d.iter().map(|x| char::from(b'0' + x)).collect()
}

/// The integer part of `d × 10^exp` and whether a fraction was dropped.
fn integer_part(d: &[u8], exp: i64) -> (Digits, bool) {
    if exp >= 0 {
        let mut i = d.to_vec();
        i.extend(std::iter::repeat_n(0, exp as usize));
        return (trim(i), false);
    }
    let cut = d.len().saturating_sub(exp.unsigned_abs() as usize);
    (trim(d[..cut].to_vec()), d[cut..].iter().any(|&x| x != 0))
}

fn greater(a: &[u8], b: &[u8]) -> bool {
    (a.len(), a) > (b.len(), b)
}

/// The canonical text of a quantity, as the real API server stores and returns it.
pub fn canonical(text: &str) -> Result<String, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Format);
    }
    if text == "0" {
        return Ok(text.into());
    }
    let p = split(text)?;
    let (base, exponent, mut format) = interpret(p.suffix)?;
    if kept_verbatim(&p, exponent, format) {
        return Ok(text.into());
    }
    // value = digits × 10^exp, sign aside.
    let mut digits = digits_of(&format!("{}{}", p.num, p.denom));
    let mut exp = -(p.denom.len() as i64);
    if base == 10 {
        exp += exponent;
    } else {
        for _ in 0..exponent / 10 {
            mul_small(&mut digits, 1024);
        }
    }
    // Rounded up (away from zero) to 1n: asking for some must not give none.
    if !digits.is_empty() && exp < -9 {
        let (kept, dropped) = integer_part(&digits, exp + 9);
        digits = kept;
        if dropped {
            add_one(&mut digits);
        }
        exp = -9;
    }
    if digits.is_empty() {
        return Ok("0".into());
    }
    let (int, fraction) = integer_part(&digits, exp);
    if format == Format::BinarySi {
        let max = digits_of(MAX_BINARY);
        if greater(&int, &max) || (int == max && fraction) {
            (digits, exp) = (max, 0);
        }
        let (int, fraction) = integer_part(&digits, exp);
        // Below 1024, or not whole: written in decimal so that nothing is rounded.
        if fraction || !greater(&int, &digits_of("1023")) {
            format = Format::DecimalSi;
        } else {
            let (mut n, mut k) = (int, 0usize);
            loop {
                let (q, r) = divmod_small(&n, 1024);
                if r != 0 || k == BINARY.len() {
                    break;
                }
                (n, k) = (q, k + 1);
            }
            let suffix = if k == 0 { "" } else { BINARY[k - 1].0 };
            return Ok(format!("{}{}{suffix}", sign(&p), to_string(&n)));
        }
    }
    // Trailing zeros into the exponent, then down to a multiple of 3.
    while digits.last() == Some(&0) {
        digits.pop();
        exp += 1;
    }
    while exp.rem_euclid(3) != 0 {
        digits.push(0);
        exp -= 1;
    }
    let suffix = match (format, DECIMAL.iter().find(|(_, e)| *e == exp)) {
        (Format::DecimalExponent, _) if exp == 0 => String::new(),
        (Format::DecimalSi, Some((s, _))) => (*s).to_string(),
        // Upstream would drop the suffix of a DecimalSI value beyond `E` (and write a
        // wrong number); the exponent form keeps the value.
        _ => format!("e{exp}"),
    };
    Ok(format!("{}{}{suffix}", sign(&p), to_string(&digits)))
}

fn sign(p: &Parts<'_>) -> &'static str {
    if p.negative { "-" } else { "" }
}

/// Rewrites one quantity value in place (a string, or a JSON number as upstream's decoder
/// also takes one); `field` names it in the 400 a bad value earns.
fn rewrite(v: &mut Value, field: &str, kind: &str) -> Result<(), ApiError> {
    let text = match v {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => return Ok(()),
        _ => {
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"v1\" cannot be handled as a {kind}: {field}: quantities must be strings or numbers"
            )));
        }
    };
    let c = canonical(&text).map_err(|e| {
        ApiError::bad_request(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: {field}: {text:?}: {e}"
        ))
    })?;
    *v = Value::String(c);
    Ok(())
}

/// Rewrites every value of the map at `path` (JSON pointer), if there is one.
fn rewrite_map(obj: &mut Value, path: &str, kind: &str) -> Result<(), ApiError> {
    if let Some(Value::Object(m)) = obj.pointer_mut(path) {
        for (k, v) in m.iter_mut() {
            rewrite(v, &format!("{path}/{k}"), kind)?;
        }
    }
    Ok(())
}

/// Rewrites the maps at `inner` paths of every element of the array at `array`.
fn rewrite_each(obj: &mut Value, array: &str, inner: &[&str], kind: &str) -> Result<(), ApiError> {
    let len = obj
        .pointer(array)
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for i in 0..len {
        for path in inner {
            rewrite_map(obj, &format!("{array}/{i}{path}"), kind)?;
        }
    }
    Ok(())
}

/// Puts the quantity fields of `obj` in canonical form, where the real server's types
/// hold a `resource.Quantity`: pods' container, init and ephemeral container resources,
/// pod-level resources and overhead; nodes' capacity and allocatable; ResourceQuotas' hard
/// and used; LimitRanges; PersistentVolumeClaims' requests, limits and capacity. Other
/// resources (and fields outside that list) are stored as written. A value that is no
/// quantity is a 400, as upstream's decoder refuses the body before anything else sees it.
pub fn canonicalize_object(r: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    let kind = r.kind;
    let resources = ["/resources/requests", "/resources/limits"];
    match (r.group, r.plural) {
        ("", "pods") => {
            for list in ["containers", "initContainers", "ephemeralContainers"] {
                rewrite_each(obj, &format!("/spec/{list}"), &resources, kind)?;
            }
            for path in [
                "/spec/overhead",
                "/spec/resources/requests",
                "/spec/resources/limits",
            ] {
                rewrite_map(obj, path, kind)?;
            }
        }
        ("", "nodes") => {
            rewrite_map(obj, "/status/capacity", kind)?;
            rewrite_map(obj, "/status/allocatable", kind)?;
        }
        ("", "resourcequotas") => {
            for path in ["/spec/hard", "/status/hard", "/status/used"] {
                rewrite_map(obj, path, kind)?;
            }
        }
        ("", "limitranges") => {
            let fields = [
                "/max",
                "/min",
                "/default",
                "/defaultRequest",
                "/maxLimitRequestRatio",
            ];
            rewrite_each(obj, "/spec/limits", &fields, kind)?;
        }
        ("", "persistentvolumeclaims") => {
            for path in [
                "/spec/resources/requests",
                "/spec/resources/limits",
                "/status/capacity",
            ] {
                rewrite_map(obj, path, kind)?;
            }
        }
        _ => {}
    }
    Ok(())
}
