//! The selector subset against a real CEL implementation (PyPI cel-python, with Kubernetes'
//! `quantity()`/`compareTo()` added in the peer): random devices (attributes and capacities
//! sometimes missing, another driver's devices too) and random expressions of every form
//! `selector.rs` reads (`==`, `in`, `compareTo(...) <op> 0`, `!(...)`, joined by `&&`),
//! rendered by `selector::render`. Both sides must agree on true / false / runtime error,
//! and the rendering must parse back to the same terms.
//!
//! Comparisons are generated between values of one type: cel-python follows CEL's older
//! spec there (a cross-type `==` is an error), cel-go and so Kubernetes the current one
//! (false, which `selector.rs` does; unit-tested in `selector.rs`).

use hami_dra_core::api::{Device, DeviceAttribute, DeviceCapacity};
use hami_structured_allocation::selector::{self, Cmp, Term};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Map, Value, json};

const DRV: &str = "amdgpu.hami-rs.io";
const OTHER: &str = "other.example.com";

/// (qualified name as a slice device keys it, domain, short name, type: 0 str, 1 int, 2 bool).
const ATTRS: &[(&str, &str, &str, u8)] = &[
    ("uuid", DRV, "uuid", 0),
    ("productName", DRV, "productName", 0),
    ("wgpMode", DRV, "wgpMode", 2),
    (
        "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io",
        "numaNode",
        1,
    ),
];
const CAPS: &[&str] = &["memory", "computeUnits"];
const STRINGS: &[&str] = &["GPU-a", "GPU-b", "MI210", "AMD \"Instinct\" \\ MI300X"];
/// Capacity values and the literals that may name them (same bytes, other spellings too).
const QUANTITIES: &[&str] = &["64Gi", "65536Mi", "32Gi", "104", "52", "0", "1k", "1000"];

fn value_of(kind: u8, pick: usize) -> DeviceAttribute {
    match kind {
        0 => DeviceAttribute::string(STRINGS[pick % STRINGS.len()]),
        1 => DeviceAttribute::int((pick % 3) as i64 - 1),
        _ => DeviceAttribute::bool(pick.is_multiple_of(2)),
    }
}

fn device_strategy() -> impl Strategy<Value = (bool, Vec<Option<usize>>, Vec<Option<usize>>)> {
    (
        prop::bool::weighted(0.85),
        prop::collection::vec(prop::option::weighted(0.85, 0usize..8), ATTRS.len()),
        prop::collection::vec(prop::option::weighted(0.85, 0usize..8), CAPS.len()),
    )
}

fn device(
    (ours, attrs, caps): &(bool, Vec<Option<usize>>, Vec<Option<usize>>),
) -> (String, Device) {
    let driver = if *ours { DRV } else { OTHER };
    let mut d = Device {
        name: "gpu-0".into(),
        ..Device::default()
    };
    for (i, (key, _, _, kind)) in ATTRS.iter().enumerate() {
        if let Some(p) = attrs[i] {
            d.attributes.insert((*key).into(), value_of(*kind, p));
        }
    }
    for (i, key) in CAPS.iter().enumerate() {
        if let Some(p) = caps[i] {
            d.capacity.insert(
                (*key).into(),
                DeviceCapacity {
                    value: QUANTITIES[p % QUANTITIES.len()].into(),
                    request_policy: None,
                },
            );
        }
    }
    (driver.into(), d)
}

/// The device as CEL sees it: attributes and capacities grouped by domain, unqualified
/// names in the driver's domain.
fn cel_device(driver: &str, d: &Device) -> Value {
    let group = |keys: Vec<(&String, Value)>| {
        let mut out: Map<String, Value> = Map::new();
        for (k, v) in keys {
            let (domain, name) = k.rsplit_once('/').unwrap_or((driver, k));
            out.entry(domain)
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .unwrap()
                .insert(name.into(), v);
        }
        Value::Object(out)
    };
    let attr = |a: &DeviceAttribute| {
        a.string
            .as_ref()
            .map(|s| json!(s))
            .or(a.int.map(|i| json!(i)))
            .or(a.bool.map(|b| json!(b)))
            .unwrap()
    };
    json!({
        "driver": driver,
        "attributes": group(d.attributes.iter().map(|(k, a)| (k, attr(a))).collect()),
        "capacity": group(d.capacity.iter().map(|(k, c)| (k, json!(c.value))).collect()),
    })
}

fn term_strategy() -> impl Strategy<Value = Term> {
    let attr = 0..ATTRS.len();
    let leaf = prop_oneof![
        prop::bool::ANY.prop_map(|ours| Term::Driver(if ours { DRV } else { OTHER }.into())),
        (attr.clone(), 0usize..8).prop_map(|(i, p)| {
            let (_, domain, name, kind) = ATTRS[i];
            Term::Attribute {
                name: format!("{domain}/{name}"),
                value: value_of(kind, p),
            }
        }),
        (attr, prop::collection::vec(0usize..8, 0..4)).prop_map(|(i, ps)| {
            let (_, domain, name, kind) = ATTRS[i];
            Term::AttributeIn {
                name: format!("{domain}/{name}"),
                values: ps.into_iter().map(|p| value_of(kind, p)).collect(),
            }
        }),
        (0..CAPS.len() + 1, 0usize..5, 0..QUANTITIES.len()).prop_map(|(c, op, q)| {
            // One capacity name no device has: a runtime error.
            let name = CAPS.get(c).copied().unwrap_or("shares");
            let text = QUANTITIES[q];
            Term::Capacity {
                name: format!("{DRV}/{name}"),
                cmp: [Cmp::Eq, Cmp::Lt, Cmp::Gt, Cmp::Le, Cmp::Ge][op],
                quantity: text.into(),
                value: hami_dra_core::quantity::parse(text).unwrap(),
            }
        }),
    ];
    leaf.prop_recursive(2, 4, 1, |inner| inner.prop_map(|t| Term::Not(Box::new(t))))
}

fn peer(cases: &[Value]) -> Vec<Value> {
    hami_cel_peer::run(
        &hami_cel_peer::script(
            env!("CARGO_MANIFEST_DIR"),
            "tests/peers/cel_selector_peer.py",
        ),
        &json!({ "cases": cases }),
    )
}

#[test]
fn selectors_agree_with_a_real_cel() {
    let mut runner = TestRunner::deterministic();
    let devices = device_strategy();
    let exprs = prop::collection::vec(term_strategy(), 1..4);
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..1500 {
        let d = devices.new_tree(&mut runner).unwrap().current();
        let terms = exprs.new_tree(&mut runner).unwrap().current();
        let (driver, dev) = device(&d);
        let text = selector::render(&terms);
        assert_eq!(selector::parse(&text).unwrap(), terms, "{text}");
        ours.push(selector::eval(&driver, &dev, &terms));
        cases.push(json!({"expression": text, "device": cel_device(&driver, &dev)}));
    }
    let theirs = peer(&cases);
    assert_eq!(theirs.len(), cases.len());
    let (mut t, mut f, mut e) = (0, 0, 0);
    for ((case, mine), real) in cases.iter().zip(&ours).zip(&theirs) {
        let agree = match (mine, real) {
            (Ok(b), Value::Bool(r)) => b == r,
            (Err(_), Value::String(s)) => s.starts_with("error"),
            _ => false,
        };
        assert!(agree, "{case}: ours {mine:?}, cel-python {real}");
        match mine {
            Ok(true) => t += 1,
            Ok(false) => f += 1,
            Err(_) => e += 1,
        }
    }
    // The corpus reaches every outcome, each often.
    assert!(
        t > 100 && f > 100 && e > 100,
        "true {t}, false {f}, error {e}"
    );
}
