//! Our resource.k8s.io/v1 types against upstream-shaped JSON (field names as in
//! k8s.io/api/resource/v1 and k8s-openapi 0.29's `v1_36` module, which is generated from
//! upstream's OpenAPI): a round trip must give the same JSON, so a misspelled or missing
//! field (dropped on read) fails here. `crates/dra-core/upstream-check` (its own workspace,
//! k8s-openapi `v1_36`) round-trips the same files, and the slices the builder makes, through
//! k8s-openapi's upstream-generated types.

use hami_dra_core::api::{ResourceClaim, ResourceSlice};
use serde_json::Value;

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(text: &str) {
    let original: Value = serde_json::from_str(text).unwrap();
    let typed: T = serde_json::from_value(original.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(back, original);
}

#[test]
fn resource_claim_round_trips() {
    round_trip::<ResourceClaim>(include_str!("../upstream/resourceclaim.json"));
}

#[test]
fn first_available_claim_round_trips() {
    round_trip::<ResourceClaim>(include_str!(
        "../upstream/resourceclaim-first-available.json"
    ));
    let c: ResourceClaim = serde_json::from_str(include_str!(
        "../upstream/resourceclaim-first-available.json"
    ))
    .unwrap();
    let subs = &c.spec.devices.requests[0].first_available;
    assert_eq!(subs.len(), 2);
    assert_eq!(subs[0].count, Some(2));
    assert_eq!(subs[1].tolerations.len(), 1);
}

#[test]
fn resource_slice_round_trips() {
    round_trip::<ResourceSlice>(include_str!("../upstream/resourceslice.json"));
}

#[test]
fn a_misspelled_field_is_noticed() {
    // `shareId` (not upstream's `shareID`) would be lost: the round trip must differ.
    let text = include_str!("../upstream/resourceclaim.json").replace("\"shareID\"", "\"shareId\"");
    let original: Value = serde_json::from_str(&text).unwrap();
    let typed: ResourceClaim = serde_json::from_value(original.clone()).unwrap();
    assert_ne!(serde_json::to_value(&typed).unwrap(), original);
}
