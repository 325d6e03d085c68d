//! Evaluation with upstream's semantics: a missing attribute or capacity is a runtime
//! error, `&&` lets false win over an error and an error over true.

use hami_dra_core::api::Device;
use hami_dra_core::quantity;

use super::Term;

/// A capacity by fully qualified name: unqualified keys belong to the driver's domain (as
/// attributes, see [`crate::allocator::attribute`]).
fn capacity<'a>(driver: &str, device: &'a Device, name: &str) -> Option<&'a str> {
    if let Some(short) = name.strip_prefix(driver).and_then(|r| r.strip_prefix('/'))
        && let Some(c) = device.capacity.get(short)
    {
        return Some(&c.value);
    }
    device.capacity.get(name).map(|c| c.value.as_str())
}

fn no_such(kind: &str, name: &str) -> String {
    let (domain, short) = name.rsplit_once('/').unwrap_or(("", name));
    format!("no such key: the device has no {kind} {short:?} in domain {domain:?}")
}

fn eval_term(driver: &str, device: &Device, term: &Term) -> Result<bool, String> {
    match term {
        Term::Driver(d) => Ok(d == driver),
        Term::Attribute { name, value } => crate::allocator::attribute(driver, device, name)
            .map(|a| a == value)
            .ok_or_else(|| no_such("attribute", name)),
        Term::AttributeIn { name, values } => crate::allocator::attribute(driver, device, name)
            .map(|a| values.contains(a))
            .ok_or_else(|| no_such("attribute", name)),
        Term::Capacity {
            name, cmp, value, ..
        } => {
            let text = capacity(driver, device, name).ok_or_else(|| no_such("capacity", name))?;
            let have = quantity::parse(text).map_err(|e| format!("capacity {name}: {e}"))?;
            Ok(cmp.holds(have.cmp(value)))
        }
        Term::Not(t) => eval_term(driver, device, t).map(|b| !b),
    }
}

/// Evaluates one parsed expression on a device of `driver` as CEL would: `Ok(false)` when a
/// conjunct is false, else `Err` (the runtime error) when one errs, else `Ok(true)`.
pub fn eval(driver: &str, device: &Device, terms: &[Term]) -> Result<bool, String> {
    let mut error = None;
    for t in terms {
        match eval_term(driver, device, t) {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    error.map_or(Ok(true), Err)
}
