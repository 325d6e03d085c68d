//! The CEL selectors a claim writes: one shape pinned, a list of UUIDs; every value a
//! quoted CEL literal.

use hami_protocol::capacity::{format_bytes, format_count};
use hami_protocol::dra::{ATTR_PRODUCT_NAME, ATTR_UUID, COMPUTE_UNITS, DRIVER, MEMORY};
use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceSelector as ClaimSelector};

use super::Shape;

/// A CEL string literal (`"` and `\` escaped, control characters as `\u` escapes), so no
/// value can end the literal early.
pub(super) fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The CEL selector pinning one shape: product name, memory and compute units equal.
pub fn shape_selector(shape: &Shape) -> String {
    format!(
        "device.attributes[\"{DRIVER}\"].{ATTR_PRODUCT_NAME} == {} && device.capacity[\"{DRIVER}\"].{MEMORY}.compareTo(quantity(\"{}\")) == 0 && device.capacity[\"{DRIVER}\"].{COMPUTE_UNITS}.compareTo(quantity(\"{}\")) == 0",
        cel_string(&shape.product_name),
        format_bytes(shape.memory_bytes),
        format_count(shape.compute_units),
    )
}

pub(super) fn uuid_list(uuids: &[String]) -> String {
    let items: Vec<String> = uuids.iter().map(|u| cel_string(u)).collect();
    format!(
        "device.attributes[\"{DRIVER}\"].{ATTR_UUID} in [{}]",
        items.join(", ")
    )
}

pub(super) fn cel(expression: String) -> ClaimSelector {
    ClaimSelector {
        cel: Some(CELDeviceSelector { expression }),
    }
}
