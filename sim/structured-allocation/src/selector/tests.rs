//! The selector's unit tests: parsing each form and its refusals, evaluation with
//! upstream's error semantics, rendering round trips.

use super::*;
use hami_dra_core::api::{Device, DeviceCapacity};

const D: &str = "amdgpu.hami-rs.io";

fn dev() -> Device {
    let mut d = Device {
        name: "gpu-0".into(),
        ..Device::default()
    };
    d.attributes
        .insert("uuid".into(), DeviceAttribute::string("GPU-a"));
    d.attributes
        .insert("productName".into(), DeviceAttribute::string("MI210"));
    d.attributes.insert(
        "resource.kubernetes.io/numaNode".into(),
        DeviceAttribute::int(1),
    );
    for (k, v) in [("memory", "64Gi"), ("computeUnits", "104")] {
        d.capacity.insert(
            k.into(),
            DeviceCapacity {
                value: v.into(),
                request_policy: None,
            },
        );
    }
    d
}

fn ev(expr: &str) -> Result<bool, String> {
    eval(D, &dev(), &parse(expr).unwrap())
}

#[test]
fn negations_nest_at_most_the_limit_even_in_a_10k_selector() {
    let nested = |depth: usize| {
        format!(
            "{}device.driver == \"x\"{}",
            "!(".repeat(depth),
            ")".repeat(depth)
        )
    };
    let deepest = parse(&nested(MAX_NEGATION_DEPTH)).unwrap();
    assert_eq!(parse(&render(&deepest)).unwrap(), deepest);
    assert_eq!(eval(D, &dev(), &deepest), Ok(false));
    // 10 KiB of `!(` (upstream's CEL length limit): an error, not a stack overflow.
    for depth in [MAX_NEGATION_DEPTH + 1, 3400] {
        let e = parse(&nested(depth)).unwrap_err();
        assert!(e.problem.contains("nest deeper than 32"), "{e}");
    }
}

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
fn capacity_compare_to_quantity() {
    let shape = format!(
        "device.attributes[\"{D}\"].productName == \"MI210\" && device.capacity[\"{D}\"].memory.compareTo(quantity(\"64Gi\")) == 0 && device.capacity[\"{D}\"].computeUnits.compareTo(quantity(\"104\")) == 0"
    );
    let t = parse(&shape).unwrap();
    assert_eq!(
        t[1],
        Term::Capacity {
            name: format!("{D}/memory"),
            cmp: Cmp::Eq,
            quantity: "64Gi".into(),
            value: 64 << 30
        }
    );
    assert_eq!(parse(&render(&t)).unwrap(), t);
    assert_eq!(eval(D, &dev(), &t), Ok(true));
    // The same bytes written differently compare equal (quantities, not strings).
    assert_eq!(
        ev(&format!(
            "device.capacity[\"{D}\"].memory.compareTo(quantity(\"65536Mi\")) == 0"
        )),
        Ok(true)
    );
    for (op, want) in [
        ("==", false),
        ("<", true),
        (">", false),
        ("<=", true),
        (">=", false),
    ] {
        let e = format!("device.capacity[\"{D}\"].memory.compareTo(quantity(\"65Gi\")) {op} 0");
        assert_eq!(ev(&e), Ok(want), "{e}");
        assert_eq!(render(&parse(&e).unwrap()), e);
    }
    assert_eq!(
        ev(&format!(
            "device.capacity[\"{D}\"].computeUnits.compareTo(quantity(\"104\")) >= 0"
        )),
        Ok(true)
    );
    // An unknown capacity is a runtime error, as upstream.
    let e = ev(&format!(
        "device.capacity[\"{D}\"].shares.compareTo(quantity(\"1\")) == 0"
    ))
    .unwrap_err();
    assert!(e.contains("no such key") && e.contains("shares"), "{e}");
}

#[test]
fn attribute_in_list() {
    let e = format!("device.attributes[\"{D}\"].uuid in [\"GPU-b\", \"GPU-a\"]");
    let t = parse(&e).unwrap();
    assert_eq!(
        t[0],
        Term::AttributeIn {
            name: format!("{D}/uuid"),
            values: vec![
                DeviceAttribute::string("GPU-b"),
                DeviceAttribute::string("GPU-a")
            ]
        }
    );
    assert_eq!(render(&t), e);
    assert_eq!(ev(&e), Ok(true));
    assert_eq!(
        ev(&format!("device.attributes[\"{D}\"].uuid in [\"GPU-b\"]")),
        Ok(false)
    );
    assert_eq!(
        ev(&format!("device.attributes[\"{D}\"].uuid in []")),
        Ok(false)
    );
    assert_eq!(
        ev("device.attributes[\"resource.kubernetes.io\"].numaNode in [0, 1,]"),
        Ok(true)
    );
    // A string list never holds an int attribute (no conversion, as CEL).
    assert_eq!(
        ev("device.attributes[\"resource.kubernetes.io\"].numaNode in [\"1\"]"),
        Ok(false)
    );
    assert!(
        ev(&format!("device.attributes[\"{D}\"].serial in [\"x\"]"))
            .unwrap_err()
            .contains("serial")
    );
}

#[test]
fn negation() {
    let e = format!("!(device.attributes[\"{D}\"].uuid in [\"GPU-a\", \"GPU-c\"])");
    let t = parse(&e).unwrap();
    assert!(matches!(&t[0], Term::Not(inner) if matches!(**inner, Term::AttributeIn { .. })));
    assert_eq!(render(&t), e);
    assert_eq!(ev(&e), Ok(false));
    assert_eq!(
        ev(&format!(
            "!(device.attributes[\"{D}\"].uuid in [\"GPU-c\"])"
        )),
        Ok(true)
    );
    assert_eq!(ev(&format!("!(device.driver == \"{D}\")")), Ok(false));
    assert_eq!(
        ev(&format!(
            "!(device.capacity[\"{D}\"].memory.compareTo(quantity(\"64Gi\")) == 0)"
        )),
        Ok(false)
    );
    assert_eq!(
        ev(&format!(
            "!(!(device.attributes[\"{D}\"].productName == \"MI210\"))"
        )),
        Ok(true)
    );
    // Negating a lookup of a missing attribute stays an error (the device is not "not
    // in the list"): upstream aborts.
    assert!(ev(&format!("!(device.attributes[\"{D}\"].serial in [\"x\"])")).is_err());
}

#[test]
fn string_escapes_read_and_written() {
    let t =
        parse(r#"device.attributes["amdgpu.hami-rs.io"].productName == "A \"B\" \\ \u00e9\x41\n""#)
            .unwrap();
    let want = DeviceAttribute::string("A \"B\" \\ \u{e9}A\n");
    assert_eq!(
        t[0],
        Term::Attribute {
            name: "amdgpu.hami-rs.io/productName".into(),
            value: want
        }
    );
    let text = render(&t);
    assert_eq!(
        text,
        r#"device.attributes["amdgpu.hami-rs.io"].productName == "A \"B\" \\ éA\u000a""#
    );
    assert_eq!(parse(&text).unwrap(), t);
}

#[test]
fn and_is_cels_false_beats_error_beats_true() {
    let missing = format!("device.attributes[\"{D}\"].serial == \"x\"");
    assert_eq!(
        ev(&format!("device.driver == \"other\" && {missing}")),
        Ok(false)
    );
    assert_eq!(
        ev(&format!("{missing} && device.driver == \"other\"")),
        Ok(false)
    );
    assert!(ev(&format!("device.driver == \"{D}\" && {missing}")).is_err());
}

#[test]
fn refuses_other_cel_by_name() {
    for (bad, why) in [
        ("device.driver != \"x\"", "expected `==`"),
        ("device.attributes[\"d\"].a == b", "literal"),
        ("", "empty"),
        (
            "device.attributes[\"d\"].uuid in [\"a\", \"b\"",
            "unterminated list",
        ),
        ("device.attributes[\"d\"].uuid in [\"a\", 1]", "mixes types"),
        (
            "device.capacity[\"d\"].memory.isGreaterThan(quantity(\"1Gi\"))",
            "unknown function `isGreaterThan`",
        ),
        (
            "device.capacity[\"d\"].memory.compareTo(size(\"1Gi\")) == 0",
            "unknown function `size`",
        ),
        (
            "device.attributes[\"d\"].uuid == lower(\"A\")",
            "unknown function `lower`",
        ),
        (
            "device.capacity[\"d\"].memory.compareTo(quantity(\"1.5Gi\")) == 0",
            "quantity(\"1.5Gi\") does not parse",
        ),
        (
            "device.capacity[\"d\"].memory.compareTo(quantity(\"lots\")) == 0",
            "quantity(\"lots\") does not parse",
        ),
        (
            "device.capacity[\"d\"].memory.compareTo(quantity(\"1Gi\")) == 1",
            "compared with 0",
        ),
        (
            "device.capacity[\"d\"].memory.compareTo(quantity(\"1Gi\") == 0",
            "to close compareTo",
        ),
        (
            "!device.attributes[\"d\"].a == 1",
            "negation must be written",
        ),
        (
            "!(device.driver == \"a\" && device.driver == \"b\")",
            "one term",
        ),
        (
            "device.driver == \"a\" || device.driver == \"b\"",
            "`||` is not supported",
        ),
        ("device.attributes[\"d\"].a == \"x", "unterminated string"),
        (
            "device.attributes[\"d\"].a == \"x\\qy\"",
            "unsupported escape \\q",
        ),
        ("device.attributes[\"d\"].a == \"x\\u12\"", "bad escape"),
        ("other.driver == \"x\"", "unknown variable"),
        ("device.name == \"x\"", "unknown field device.name"),
        ("device.attributes[\"\"].a == 1", "empty domain"),
        (
            "device.driver == \"a\" device.driver",
            "unexpected `device`",
        ),
    ] {
        let e = parse(bad).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("supported:"), "{text}");
        assert!(e.problem.contains(why), "{bad}: {}", e.problem);
    }
}
