//! Checks of the protocol crate's codecs: every wire format a foreign writer can put in an
//! annotation or an environment variable.

use std::collections::BTreeMap;

use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::cu_list::{CuSet, HsaCuMask};
use hami_protocol::defrag_reservation::DefragReservation;
use hami_protocol::device_list::{decode_pod_devices, encode_pod_devices};
use hami_protocol::identity::{KubeletDeviceId, parse_rocr_id, rocr_id};
use hami_protocol::memory_limit::{parse_memory_limit, parse_memory_limit_bytes};
use hami_protocol::names::Vendor;
use hami_protocol::node_lock::{self, BindPhase, NodeLock, PodRef};
use hami_protocol::node_register::{decode_node_devices, encode_node_devices};
use hami_protocol::quantity::parse_count;
use hami_protocol::requests::{RequestDefaults, container_slots, pod_requests as requests_of};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy, PodPolicies};

use crate::text;

/// Node register JSON: what decodes re-encodes, and the encoding is a fixed point.
pub fn node_register(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(devices) = decode_node_devices(text) else {
        return;
    };
    let encoded = encode_node_devices(&devices).expect("a decoded register list must encode");
    let again = decode_node_devices(&encoded).expect("an encoded register list must decode");
    assert_eq!(
        again, devices,
        "register JSON round trip changed the devices"
    );
    assert_eq!(encode_node_devices(&again).ok().as_deref(), Some(&*encoded));
}

/// Container device lists (`UUID,TYPE,MEM,CORES:` … `;`): round trip and fixed point.
pub fn device_list(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(runs) = decode_pod_devices(text) else {
        return;
    };
    let encoded = encode_pod_devices(&runs).expect("a decoded device list must encode");
    let again = decode_pod_devices(&encoded).expect("an encoded device list must decode");
    assert_eq!(again, runs, "device list round trip changed the runs");
    assert_eq!(encode_pod_devices(&again).ok().as_deref(), Some(&*encoded));
}

/// `hami.io/amd-cu-allocated`: round trip, and no device maps to an empty set.
pub fn cu_allocated(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(map) = CuAllocation::parse(text) else {
        return;
    };
    assert!(map.0.values().all(|set| !set.is_empty()));
    let encoded = map.encode();
    let again = CuAllocation::parse(&encoded).expect("an encoded CU map must parse");
    assert_eq!(again, map, "CU map round trip changed it");
    assert_eq!(again.encode(), encoded);
}

/// `reservation.defrag.hami.io/<uid>`: what decodes is valid (an owner, distinct named
/// cards, expiring no earlier than written) and round-trips; the encoding is a fixed point.
pub fn defrag_reservation(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(r) = DefragReservation::decode(text) else {
        return;
    };
    assert!(!r.owner_uid.is_empty() && !r.cards.is_empty());
    assert!(r.expires_at >= r.reserved_at);
    let encoded = r.encode();
    let again = DefragReservation::decode(&encoded).expect("an encoded reservation must decode");
    assert_eq!(again, r, "reservation round trip changed it");
    assert_eq!(again.encode(), encoded);
}

/// Node lock values and bind phases: round trip; `decide` is total for any stored value.
pub fn node_lock(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(lock) = NodeLock::parse(text) {
        let encoded = lock.encode().expect("a parsed lock must encode");
        assert_eq!(NodeLock::parse(&encoded).as_ref(), Ok(&lock));
    }
    if let Ok(phase) = BindPhase::parse(text) {
        assert_eq!(BindPhase::parse(&phase.to_string()), Ok(phase));
    }
    let pod = PodRef::new("default", "fuzz");
    let now = i64::from_le_bytes(padded(data));
    for exists in [false, true] {
        let _ = node_lock::decide(Some(text), &pod, now, 60, |_| exists);
    }
}

/// CU lists: ids stay below the GPU's CU count, Display re-parses to the same set, and the
/// complement partitions the GPU.
pub fn cu_list(data: &[u8]) {
    let (devcore, rest) = match data.split_first_chunk::<2>() {
        Some((head, rest)) => (u32::from(u16::from_le_bytes(*head)), rest),
        None => return,
    };
    let Some(text) = text(rest) else { return };
    let Ok(set) = CuSet::parse(text, devcore) else {
        return;
    };
    assert!(!set.is_empty());
    assert!(set.max().is_some_and(|max| max < devcore));
    let shown = set.to_string();
    assert_eq!(CuSet::parse(&shown, devcore).as_ref(), Ok(&set));
    let rest_of_gpu = set.complement(devcore);
    assert!(!set.overlaps(&rest_of_gpu));
    assert_eq!(set.len() + rest_of_gpu.len(), u64::from(devcore));
    assert_eq!(set.union(&rest_of_gpu), CuSet::range(0, devcore));
    assert!(set.intersection(&rest_of_gpu).is_empty());
}

/// `HSA_CU_MASK` (raw environ bytes): round trip through Display; a mask is within itself.
pub fn hsa_cu_mask(data: &[u8]) {
    let Ok(mask) = HsaCuMask::parse_bytes(data) else {
        return;
    };
    let shown = mask.to_string();
    assert_eq!(HsaCuMask::parse(&shown).as_ref(), Ok(&mask));
    assert!(mask.is_within(&mask));
}

/// Memory-limit strings: the byte and text decoders agree; results never wrap.
pub fn memory_limit(data: &[u8]) {
    let from_bytes = parse_memory_limit_bytes(data);
    if let Some(text) = text(data) {
        assert_eq!(
            parse_memory_limit(text),
            from_bytes,
            "byte and text decoders differ"
        );
    }
}

/// Integer quantities: what parses re-parses from its decimal form, and from the form the
/// API server stores it in (the stand-in's canonicalization, after apimachinery's): a
/// count a client wrote is the count every reader gets.
pub fn quantity(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(n) = parse_count(text) {
        assert_eq!(parse_count(&n.to_string()), Ok(n));
        if let Ok(stored) = hami_apiserver::quantity::canonical(text.trim()) {
            assert_eq!(
                parse_count(&stored),
                Ok(n),
                "{text:?} is stored as {stored:?}"
            );
        }
        let stored = hami_apiserver::quantity::canonical(&n.to_string())
            .expect("a plain integer is a quantity");
        assert_eq!(parse_count(&stored), Ok(n), "{n} is stored as {stored:?}");
    }
}

/// ROCr ids and kubelet device ids: round trips.
pub fn identity(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(unique_id) = parse_rocr_id(text) {
        assert_eq!(parse_rocr_id(&rocr_id(unique_id)), Ok(unique_id));
    }
    if let Ok(id) = KubeletDeviceId::parse(text) {
        assert_eq!(KubeletDeviceId::parse(&id.to_string()).as_ref(), Ok(&id));
    }
}

/// RFC 3339 timestamps: the instant survives formatting.
pub fn rfc3339(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(unix) = hami_protocol::rfc3339::parse(text) {
        let formatted = hami_protocol::rfc3339::format_utc(unix);
        assert_eq!(hami_protocol::rfc3339::parse(&formatted).ok(), Some(unix));
    }
}

/// Steering annotations and policies: total on any annotation map (`key=value` lines).
pub fn selection(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let _ = GpuPolicy::parse(text);
    let _ = NodePolicy::parse(text);
    let annotations: BTreeMap<String, String> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for vendor in [Vendor::Amd, Vendor::Nvidia] {
        let _ = DeviceSelector::from_annotations(vendor, &annotations);
    }
    let _ = PodPolicies::from_annotations(&annotations);
}

/// Pod requests from any Pod JSON: one request per container slot, or a typed error that
/// names a field.
pub fn pod_requests(data: &[u8]) {
    let Ok(pod) = serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(data) else {
        return;
    };
    match requests_of(&pod, &RequestDefaults::default()) {
        Ok(requests) => {
            let slots = pod
                .spec
                .as_ref()
                .map_or(0, |spec| container_slots(spec).len());
            assert_eq!(requests.len(), slots, "one request per container slot");
        }
        Err(error) => {
            assert!(
                error.field.starts_with("spec."),
                "request errors name a field: {error}"
            );
            assert!(!error.to_string().is_empty());
        }
    }
}

fn padded(data: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    let n = data.len().min(8);
    out[..n].copy_from_slice(&data[..n]);
    out
}
