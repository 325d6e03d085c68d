use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::resources::lookup;

#[test]
fn counts_in_thousands_come_back_with_decimal_suffixes() {
    for (written, stored) in [
        ("3000", "3k"),
        ("16000", "16k"),
        ("2000000", "2M"),
        ("1500", "1500"),
        ("1024", "1024"),
        ("10", "10"),
        ("100", "100"),
        ("1000000000000", "1T"),
        ("10000000000000000000", "10E"),
        ("18446744073709551615", "18446744073709551615"),
    ] {
        assert_eq!(canonical(written).as_deref(), Ok(stored), "{written}");
    }
}

#[test]
fn fractions_milli_units_and_exponents() {
    for (written, stored) in [
        ("1000m", "1"),
        ("1500m", "1500m"),
        ("0.5", "500m"),
        (".5", "500m"),
        ("1.0", "1"),
        ("2.0", "2"),
        ("1.5k", "1500"),
        ("1e3", "1e3"),
        ("1E3", "1E3"),
        ("3e3", "3e3"),
        ("1000e3", "1e6"),
        ("15e2", "1500"),
        ("1e-3", "1e-3"),
        ("0.1n", "1n"),
        ("1.0000000001", "1000000001n"),
        ("12345678901234567890123", "12345678901234567890123"),
    ] {
        assert_eq!(canonical(written).as_deref(), Ok(stored), "{written}");
    }
}

#[test]
fn binary_suffixes_as_apimachinery_writes_them() {
    // The first nine are upstream's own TestQuantityParseEmit table.
    for (written, stored) in [
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Ki", "512"),
        ("1.1Gi", "1181116006400m"),
        ("16Ei", "9223372036854775807"),
        ("4096Pi", "4Ei"),
    ] {
        assert_eq!(canonical(written).as_deref(), Ok(stored), "{written}");
        if stored != "9223372036854775807" {
            let negative = format!("-{written}");
            assert_eq!(canonical(&negative), Ok(format!("-{stored}")), "{negative}");
        }
    }
}

#[test]
fn strings_upstream_deems_canonical_are_kept_verbatim() {
    for kept in ["007", "+5", "1e3", "10e3", "5Ki", "1025Ki", "-7", "100m"] {
        assert_eq!(canonical(kept).as_deref(), Ok(kept));
    }
    for zero in ["0", "00", "-0", "0.0", "0Ki", "0m", "."] {
        assert_eq!(canonical(zero).as_deref(), Ok("0"), "{zero}");
    }
}

#[test]
fn what_upstream_refuses_is_refused() {
    for bad in ["", "1x", "1 0", "abc", "0x10", "1.2.3", "many"] {
        assert_eq!(canonical(bad), Err(QuantityError::Format), "{bad}");
    }
    for bad in ["1e", "1K", "1ki", "1Kib", "1mi", "1e3k"] {
        assert!(canonical(bad).is_err(), "{bad}");
    }
    assert_eq!(canonical("1e99999"), Err(QuantityError::Numeric));
}

#[test]
fn a_pods_quantities_are_rewritten_and_a_bad_one_is_a_400() {
    let pods = lookup("", "v1", "pods").unwrap();
    let mut pod = json!({"spec": {
        "containers": [{"name": "a", "resources": {
            "limits": {"amd.com/gpumem": "3000", "amd.com/gpucores": "50", "amd.com/gpu": 1},
            "requests": {"cpu": "1000m", "memory": "1024Mi"}}}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpumem": "16000"}}}],
        "overhead": {"cpu": "0.25"},
    }});
    canonicalize_object(pods, &mut pod).unwrap();
    let c = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(c["limits"]["amd.com/gpumem"], "3k");
    assert_eq!(c["limits"]["amd.com/gpucores"], "50");
    assert_eq!(c["limits"]["amd.com/gpu"], "1");
    assert_eq!(c["requests"]["cpu"], "1");
    assert_eq!(c["requests"]["memory"], "1Gi");
    assert_eq!(
        pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpumem"],
        "16k"
    );
    assert_eq!(pod["spec"]["overhead"]["cpu"], "250m");

    let mut bad = json!({"spec": {"containers": [{"name": "a", "resources": {
        "limits": {"amd.com/gpu": "many"}}}]}});
    let e = canonicalize_object(pods, &mut bad).unwrap_err();
    assert_eq!(e.code, 400);
    assert!(e.message.contains("amd.com/gpu") && e.message.contains("regular expression"));
}

#[test]
fn nodes_and_quotas_are_rewritten_other_kinds_are_not() {
    let nodes = lookup("", "v1", "nodes").unwrap();
    let mut node = json!({"status": {"capacity": {"hami.io/vgpu": "10000"},
        "allocatable": {"memory": "2048Ki"}}});
    canonicalize_object(nodes, &mut node).unwrap();
    assert_eq!(node["status"]["capacity"]["hami.io/vgpu"], "10k");
    assert_eq!(node["status"]["allocatable"]["memory"], "2Mi");

    let quotas = lookup("", "v1", "resourcequotas").unwrap();
    let mut quota = json!({"spec": {"hard": {"limits.amd.com/gpumem": "40000"}},
        "status": {"used": {"limits.amd.com/gpumem": "3000"}}});
    canonicalize_object(quotas, &mut quota).unwrap();
    assert_eq!(quota["spec"]["hard"]["limits.amd.com/gpumem"], "40k");
    assert_eq!(quota["status"]["used"]["limits.amd.com/gpumem"], "3k");

    let cms = lookup("", "v1", "configmaps").unwrap();
    let mut cm = json!({"data": {"capacity": "3000"}});
    canonicalize_object(cms, &mut cm).unwrap();
    assert_eq!(cm["data"]["capacity"], "3000");
}

/// The value of a canonical text, from the text alone (an independent reading: suffix
/// table and exponent), for the checks below; None for a fraction.
fn whole_value(text: &str) -> Option<u128> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, suffix) = text.split_at(split);
    let n: u128 = n.parse().ok()?;
    let pow = match suffix {
        "" => 0,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        e => e.strip_prefix('e')?.parse().ok()?,
    };
    n.checked_mul(10u128.checked_pow(pow)?)
}

proptest! {
    #[test]
    fn a_whole_number_keeps_its_value(n in any::<u64>(), zeros in 0u32..7) {
        let n = u128::from(n) * 10u128.pow(zeros);
        let c = canonical(&n.to_string()).unwrap();
        prop_assert_eq!(whole_value(&c), Some(n), "{} -> {}", n, c);
        // Stored again (an update of what was read), it does not change.
        prop_assert_eq!(canonical(&c).unwrap(), c);
    }

    #[test]
    fn canonical_is_total_and_a_fixed_point(text in "[-+]?[0-9]{0,22}(\\.[0-9]{0,12})?(|[numkMGTPE]|[KMGTPE]i|e-?[0-9]{1,2})") {
        if let Ok(c) = canonical(&text) {
            prop_assert_eq!(canonical(&c), Ok(c.clone()), "{} -> {}", text, c);
        }
    }

    #[test]
    fn any_text_is_answered(text in ".{0,30}") {
        let _ = canonical(&text);
    }
}
