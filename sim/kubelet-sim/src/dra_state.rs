//! Kubelet's DRA manager state (its `dra_manager_state` checkpoint), pure: which claims are
//! prepared, by which drivers, with which devices (CDI ids per request), for which pods. A
//! claim is unprepared when its last pod is gone, also by a kubelet that restarted in
//! between (the state is what survives: [`DraState::encode`]/[`DraState::decode`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One prepared device as NodePrepareResources answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The claim's requests this device serves.
    pub requests: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// CDI ids to inject.
    pub cdi_ids: Vec<String>,
}

/// One prepared claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Driver → its devices; a driver appears once its prepare succeeded.
    pub drivers: BTreeMap<String, Vec<PreparedDevice>>,
    /// Pods using it.
    pub pods: BTreeSet<String>,
}

/// Claim UID → entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraState {
    /// The prepared claims.
    pub claims: BTreeMap<String, ClaimEntry>,
}

/// Version tag of the encoded state (a different one is refused, not guessed at).
const VERSION: &str = "kubelet-sim.dra/v1";

#[derive(Serialize, Deserialize)]
struct Encoded {
    version: String,
    #[serde(flatten)]
    state: DraState,
}

impl DraState {
    /// The CDI ids of the claim's devices serving `request` (all of them when `None`).
    pub fn cdi_ids(&self, claim_uid: &str, request: Option<&str>) -> Vec<String> {
        let Some(c) = self.claims.get(claim_uid) else {
            return Vec::new();
        };
        c.drivers
            .values()
            .flatten()
            .filter(|d| request.is_none_or(|r| d.requests.iter().any(|q| q == r)))
            .flat_map(|d| d.cdi_ids.iter().cloned())
            .collect()
    }

    /// Drops pods not in `live` from every claim; returns the claims nobody uses now (to
    /// unprepare), with their driver names.
    pub fn release(&mut self, live: &BTreeSet<String>) -> Vec<(String, ClaimEntry)> {
        for c in self.claims.values_mut() {
            c.pods.retain(|p| live.contains(p));
        }
        self.claims
            .iter()
            .filter(|(_, c)| c.pods.is_empty())
            .map(|(u, c)| (u.clone(), c.clone()))
            .collect()
    }

    /// The state as the checkpoint file holds it.
    pub fn encode(&self) -> String {
        serde_json::to_string_pretty(&Encoded {
            version: VERSION.into(),
            state: self.clone(),
        })
        .unwrap_or_default()
    }

    /// Reads a checkpoint file's text.
    pub fn decode(text: &str) -> Result<Self, String> {
        let e: Encoded = serde_json::from_str(text).map_err(|e| format!("DRA checkpoint: {e}"))?;
        if e.version != VERSION {
            return Err(format!(
                "DRA checkpoint: version {:?}, this kubelet reads {VERSION:?}",
                e.version
            ));
        }
        Ok(e.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pods: &[&str]) -> ClaimEntry {
        ClaimEntry {
            namespace: "default".into(),
            name: "c".into(),
            drivers: BTreeMap::from([(
                "d".to_owned(),
                vec![
                    PreparedDevice {
                        requests: vec!["gpu".into()],
                        pool: "n".into(),
                        device: "gpu-0".into(),
                        cdi_ids: vec!["k/c=u-gpu-0".into()],
                    },
                    PreparedDevice {
                        requests: vec!["other".into()],
                        pool: "n".into(),
                        device: "gpu-1".into(),
                        cdi_ids: vec!["k/c=u-gpu-1".into()],
                    },
                ],
            )]),
            pods: pods.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn release_returns_claims_without_pods_and_keeps_the_rest() {
        let mut s = DraState::default();
        s.claims.insert("a".into(), entry(&["p1"]));
        s.claims.insert("b".into(), entry(&["p1", "p2"]));
        let free = s.release(&BTreeSet::from(["p2".to_owned()]));
        assert_eq!(
            free.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(s.claims["b"].pods, BTreeSet::from(["p2".to_owned()]));
    }

    #[test]
    fn cdi_ids_by_request_and_round_trip() {
        let mut s = DraState::default();
        s.claims.insert("a".into(), entry(&["p1"]));
        assert_eq!(s.cdi_ids("a", Some("gpu")), ["k/c=u-gpu-0"]);
        assert_eq!(s.cdi_ids("a", None).len(), 2);
        assert!(s.cdi_ids("zz", None).is_empty());
        let back = DraState::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        let wrong = s.encode().replace("kubelet-sim.dra/v1", "v0");
        assert!(DraState::decode(&wrong).unwrap_err().contains("version"));
        assert!(DraState::decode("{").is_err());
    }
}
