//! The DRA node's table (`--dra`): who holds which share of each device, from the driver's
//! ResourceSlices and the allocated ResourceClaims (`hami_report::dra_status`, as `hami
//! status` shows them) — no annotation or node lock in DRA mode — plus the monitor's live
//! memory used and utilization per container.

use hami_report::dra_status::{DraNode, build};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::live::Live;

/// Every DRA node's devices and holders, read once per rendering.
#[derive(Default)]
pub struct DraView {
    nodes: Vec<DraNode>,
}

impl DraView {
    /// Lists the slices and claims and builds the view.
    pub async fn read(client: &Client) -> anyhow::Result<Self> {
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let claims = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        Ok(Self {
            nodes: build(hami_dra_core::DRIVER, &slices, &claims),
        })
    }
}

/// The containers of `pod` (`namespace/name`) that use one of its claims.
fn claim_containers(pods: &[Pod], pod: &str) -> Vec<String> {
    let Some(p) = pods
        .iter()
        .find(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()) == pod)
    else {
        return Vec::new();
    };
    p.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        })
        .map(|c| c.name.clone())
        .collect()
}

/// The table of DRA node `name` (same columns as the device-plugin nodes').
pub fn node_table(
    view: &DraView,
    name: &str,
    description: &str,
    pods: &[Pod],
    live: &Live,
) -> String {
    let node = view.nodes.iter().find(|n| n.name == name);
    let devices = node.map_or(&[][..], |n| n.devices.as_slice());
    let busy = devices.iter().filter(|d| !d.holders.is_empty()).count();
    let model = devices
        .first()
        .map(|d| d.product.clone())
        .unwrap_or_default();
    let mut text = format!(
        "\nNode {name} — {description} ({} GPUs/partitions published as DRA devices of {}, {model:?}, {busy} in use)\n",
        devices.len(),
        hami_dra_core::DRIVER,
    );
    let mut table = vec![
        [
            "GPU",
            "POD/CONTAINER",
            "CLAIM",
            "MEMORY",
            "CUS",
            "CU RANGE",
            "USED",
            "UTIL",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for d in devices {
        for h in &d.holders {
            let mut who: Vec<(String, String, String)> = Vec::new();
            for pod in &h.pods {
                let (ns, pod_name) = pod.split_once('/').unwrap_or(("", pod));
                for c in claim_containers(pods, pod) {
                    who.push((ns.into(), pod_name.into(), c));
                }
            }
            if who.is_empty() {
                who.push((String::new(), "(not reserved yet)".into(), String::new()));
            }
            for (ns, pod, container) in who {
                let key = (ns.clone(), pod.clone(), container.clone(), "0".to_string());
                table.push(vec![
                    d.uuid.clone(),
                    if ns.is_empty() {
                        pod.clone()
                    } else {
                        format!("{ns}/{pod}/{container}")
                    },
                    h.claim.clone(),
                    format!("{} MiB", h.memory_bytes >> 20),
                    format!("{}/{}", h.compute_units, d.compute_units),
                    if h.cu_ranges.is_empty() {
                        "(pending prepare)".into()
                    } else {
                        h.cu_ranges.clone()
                    },
                    live.memory
                        .get(&key)
                        .map(|b| format!("{} MiB", (*b as u64) >> 20))
                        .unwrap_or_else(|| "-".into()),
                    live.util
                        .get(&key)
                        .map(|u| format!("{u:.0}%"))
                        .unwrap_or_else(|| "-".into()),
                ]);
            }
        }
    }
    if table.len() == 1 {
        text.push_str("  no slices on this node\n");
    } else {
        text.push_str(&crate::report::align(&table));
    }
    for p in node.iter().flat_map(|n| &n.problems) {
        text.push_str(&format!("  problem: {p}\n"));
    }
    text
}
