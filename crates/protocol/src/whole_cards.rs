//! Whole-card fallback holdings (issue 26 item 1).
//!
//! A pod HAMi did not place (plain `amd.com/gpu` / `nvidia.com/gpu`: webhook opt-out, or
//! `spec.nodeName` set) is handed whole cards by the device plugin from the ids kubelet
//! chose. The plugin records which cards on the pod, before it answers Allocate:
//!
//! - key: `hami.io/amd-whole-cards` / `hami.io/nvidia-whole-cards` ([`key`]);
//! - writer: the vendor's device plugin only (scheduler-owned under D-4: listed in
//!   `names::SCHEDULER_OWNED_ANNOTATIONS`, so the webhook denies it to anyone else);
//! - value: the registered ids (UUIDs) of the cards, comma-separated, no spaces, each once:
//!   `GPU-1,GPU-2` ([`decode`], [`encode`]);
//! - counted ([`held_cards`]) by the scheduler (a held card is full: no slice is placed on
//!   it), `hami status` and the web UI (through the scheduler's state), both plugins (no
//!   second hand-over, no slice), and the monitor — on live pods bound to a node that the
//!   scheduler did not place, at most as many cards as the pod asks for of the vendor's
//!   count resource. A forged value can therefore only make cards look busy (slices wait),
//!   never let two pods share a card.

use crate::names::Vendor;

/// The annotation key of `vendor`'s whole-card holdings.
pub fn key(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => AMD_KEY,
        Vendor::Nvidia => NVIDIA_KEY,
    }
}

/// `hami.io/amd-whole-cards`.
pub const AMD_KEY: &str = "hami.io/amd-whole-cards";
/// `hami.io/nvidia-whole-cards`.
pub const NVIDIA_KEY: &str = "hami.io/nvidia-whole-cards";

/// Why a whole-card list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a whole-card list ({problem}); expected card ids separated by commas, e.g. \"GPU-1,GPU-2\""
)]
pub struct WholeCardsError {
    /// The value as read.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

fn valid_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("an empty card id".into());
    }
    if let Some(c) = id
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, ',' | ';' | ':'))
    {
        return Err(format!("card id {id:?} holds {c:?}"));
    }
    Ok(())
}

/// Reads a value: the card ids in order. The empty value is the empty list.
pub fn decode(value: &str) -> Result<Vec<String>, WholeCardsError> {
    let fail = |problem: String| WholeCardsError {
        value: value.to_owned(),
        problem,
    };
    if value.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids: Vec<String> = Vec::new();
    for id in value.split(',') {
        valid_id(id).map_err(fail)?;
        if ids.iter().any(|i| i == id) {
            return Err(fail(format!("card id {id:?} is listed twice")));
        }
        ids.push(id.to_owned());
    }
    Ok(ids)
}

/// Writes a value (ids kept in order; a repeat or an id that cannot be listed is refused).
pub fn encode(ids: &[String]) -> Result<String, WholeCardsError> {
    let value = ids.join(",");
    let decoded = decode(&value)?;
    if decoded.len() != ids.len() {
        return Err(WholeCardsError {
            value,
            problem: "an empty card id".into(),
        });
    }
    Ok(value)
}

/// `existing` (a recorded value) with `cards` added after it, each id once.
pub fn merge(existing: Option<&str>, cards: &[String]) -> Result<String, WholeCardsError> {
    let mut ids = match existing {
        Some(text) => decode(text)?,
        None => Vec::new(),
    };
    for card in cards {
        if !ids.contains(card) {
            ids.push(card.clone());
        }
    }
    encode(&ids)
}

#[cfg(feature = "k8s")]
pub use counted::{HeldCards, held_cards, requested_count};

#[cfg(feature = "k8s")]
mod counted {
    use k8s_openapi::api::core::v1::Pod;

    use super::{WholeCardsError, decode, key};
    use crate::names::Vendor;
    use crate::placement::placed_by_scheduler;
    use crate::requests::container_slots;

    /// The cards a pod holds whole, as every consumer counts them.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct HeldCards {
        /// The node the pod is bound to (`spec.nodeName`).
        pub node: String,
        /// The registered ids of the cards, as recorded (at most the pod's request).
        pub cards: Vec<String>,
    }

    /// How many of `vendor`'s count resource (`amd.com/gpu`, `nvidia.com/gpu`) the pod asks
    /// for over all its containers (limits, else requests; init containers too: kubelet
    /// may give them cards of their own). Unreadable quantities count 0.
    pub fn requested_count(pod: &Pod, vendor: Vendor) -> u64 {
        let Some(spec) = &pod.spec else { return 0 };
        let name = vendor.names().resource_count;
        container_slots(spec)
            .iter()
            .filter_map(|slot| {
                let r = slot.container.resources.as_ref()?;
                let q = r
                    .limits
                    .as_ref()
                    .and_then(|l| l.get(name))
                    .or_else(|| r.requests.as_ref().and_then(|l| l.get(name)))?;
                // As the API server stores it (a count of 1000 would read `1k`).
                crate::quantity::parse_count(&q.0).ok()
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The rule every consumer applies: `pod`'s whole-card holding of `vendor` counts when
    /// the pod is live (not Succeeded/Failed), bound to a node, not placed by the scheduler
    /// named `scheduler_name` (a placed pod's holdings are its device lists), and asks for
    /// the vendor's count resource; the first [`requested_count`] cards of the value count.
    /// `Ok(None)`: nothing counts; `Err`: a value that does not decode (the caller reports).
    pub fn held_cards(
        pod: &Pod,
        vendor: Vendor,
        scheduler_name: &str,
    ) -> Result<Option<HeldCards>, WholeCardsError> {
        let Some(text) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key(vendor)))
        else {
            return Ok(None);
        };
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        let (Some(node), false) = (node, terminal || placed_by_scheduler(pod, scheduler_name))
        else {
            return Ok(None);
        };
        let mut cards = decode(text)?;
        let asked = usize::try_from(requested_count(pod, vendor)).unwrap_or(usize::MAX);
        cards.truncate(asked);
        if cards.is_empty() {
            return Ok(None);
        }
        Ok(Some(HeldCards {
            node: node.to_owned(),
            cards,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_bad_ones_name_the_problem() {
        let ids = vec!["GPU-1".to_owned(), "0x74a1-1".to_owned()];
        let text = encode(&ids).unwrap();
        assert_eq!(text, "GPU-1,0x74a1-1");
        assert_eq!(decode(&text).unwrap(), ids);
        assert_eq!(decode("").unwrap(), Vec::<String>::new());
        for (bad, why) in [
            ("a,,b", "empty"),
            ("a,", "empty"),
            ("a b", "' '"),
            ("a;b", "';'"),
            ("a,a", "twice"),
        ] {
            let e = decode(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("GPU-1,GPU-2"), "{bad}: {e}");
        }
        assert!(encode(&["".into()]).is_err());
        assert!(encode(&["x,y".into()]).is_err());
        assert_eq!(merge(Some("A"), &["B".into(), "A".into()]).unwrap(), "A,B");
        assert_eq!(merge(None, &["B".into()]).unwrap(), "B");
        assert!(merge(Some("A,,"), &["B".into()]).is_err());
        assert_eq!(key(Vendor::Amd), "hami.io/amd-whole-cards");
        assert_eq!(key(Vendor::Nvidia), "hami.io/nvidia-whole-cards");
    }

    #[cfg(feature = "k8s")]
    #[test]
    fn only_live_bound_pods_the_scheduler_did_not_place_hold_and_no_more_than_asked() {
        use k8s_openapi::api::core::v1::Pod;
        use serde_json::json;
        let pod = |spec: serde_json::Value, phase: &str, value: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "annotations": {AMD_KEY: value}},
                "spec": spec, "status": {"phase": phase}}))
            .unwrap()
        };
        let plain = json!({"nodeName": "n1", "containers": [
            {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]});
        let held = held_cards(
            &pod(plain.clone(), "Running", "A"),
            Vendor::Amd,
            "hami-scheduler",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            held,
            HeldCards {
                node: "n1".into(),
                cards: vec!["A".into()]
            }
        );
        // More cards than asked: only the first count (a forgery gains nothing).
        let two = held_cards(&pod(plain.clone(), "Pending", "A,B"), Vendor::Amd, "x")
            .unwrap()
            .unwrap();
        assert_eq!(two.cards, vec!["A".to_owned()]);
        // Finished, unbound, other vendor, no request: nothing.
        assert_eq!(
            held_cards(&pod(plain.clone(), "Succeeded", "A"), Vendor::Amd, "x").unwrap(),
            None
        );
        assert_eq!(
            held_cards(&pod(plain.clone(), "Running", "A"), Vendor::Nvidia, "x").unwrap(),
            None
        );
        let unbound = json!({"containers": [
            {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]});
        assert_eq!(
            held_cards(&pod(unbound, "Pending", "A"), Vendor::Amd, "x").unwrap(),
            None
        );
        let none = json!({"nodeName": "n1", "containers": [{"name": "c"}]});
        assert_eq!(
            held_cards(&pod(none, "Running", "A"), Vendor::Amd, "x").unwrap(),
            None
        );
        // A pod the scheduler placed: its device lists say what it holds.
        let placed = json!({"nodeName": "n1", "schedulerName": "hami-scheduler", "containers": [
            {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]});
        assert_eq!(
            held_cards(&pod(placed, "Running", "A"), Vendor::Amd, "hami-scheduler").unwrap(),
            None
        );
        // Init containers' requests count too; a bad value is an error.
        let init = json!({"nodeName": "n1",
            "initContainers": [{"name": "i", "resources": {"limits": {"amd.com/gpu": "1"}}}],
            "containers": [{"name": "c", "resources": {"requests": {"amd.com/gpu": "1"}}}]});
        assert_eq!(
            requested_count(&pod(init.clone(), "Running", ""), Vendor::Amd),
            2
        );
        assert!(held_cards(&pod(init, "Running", "A,,B"), Vendor::Amd, "x").is_err());
    }
}
