//! The DRA parts of the pages (issue 20), pure: DRA nodes on the overview, a DRA node's
//! devices (capacity, what the claims consume, the CU map from the CU ranges the driver
//! chose, the shares) and a DRA pod's shares. All from [`World::dra_nodes`], the model
//! `hami status` prints (`hami_report::dra_status`): a DRA node registers nothing in
//! annotations and its pods carry no allocation annotation.

use std::fmt::Write;

use hami_protocol::cu_list::CuSet;
use hami_protocol::dra::DRIVER;
use hami_report::dra_status::{DraDevice, DraNode};

use crate::html::{esc, mib, table, url_segment};
use crate::pages::{node_link, pod_link};
use crate::samples::Metrics;
use crate::svg::{CuOwner, cu_map, meter};
use crate::usage::{card_use, coverage, figure, sampled_note};
use crate::world::{World, is_dra_node};

const MIB: f64 = 1048576.0;

fn bytes_mib(bytes: u64) -> String {
    mib(bytes as f64 / MIB)
}

/// The names of the DRA nodes: labelled `hami.io/amd-mode=dra`, or publishing devices of
/// our driver; sorted.
pub(crate) fn dra_node_names(world: &World) -> Vec<String> {
    let mut names: Vec<String> = world
        .nodes
        .iter()
        .filter(|(_, n)| is_dra_node(n))
        .map(|(name, _)| name.clone())
        .collect();
    names.extend(world.dra_nodes().iter().map(|n| n.name.clone()));
    names.sort();
    names.dedup();
    names
}

/// The overview's "DRA nodes" section; empty when the cluster has none.
pub fn overview_section(world: &World) -> String {
    let names = dra_node_names(world);
    if names.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = names
        .iter()
        .map(|name| {
            let devices: &[DraDevice] = world
                .dra_nodes()
                .iter()
                .find(|n| &n.name == name)
                .map_or(&[], |n| n.devices.as_slice());
            let sum = |f: fn(&DraDevice) -> u64| devices.iter().map(f).sum::<u64>();
            let busy = devices.iter().filter(|d| !d.holders.is_empty()).count();
            let tainted = devices.iter().filter(|d| d.tainted).count();
            let problems = world
                .dra_nodes()
                .iter()
                .find(|n| &n.name == name)
                .is_some_and(|n| !n.problems.is_empty());
            vec![
                node_link(name),
                format!("{busy}/{}", devices.len()),
                format!(
                    "{} / {}",
                    bytes_mib(sum(|d| d.memory_used_bytes)),
                    bytes_mib(sum(|d| d.memory_bytes))
                ),
                format!(
                    "{} / {} CUs",
                    sum(|d| d.compute_units_used),
                    sum(|d| d.compute_units)
                ),
                format!("{} / {}", sum(|d| d.shares_used), sum(|d| d.shares)),
                if devices.is_empty() {
                    "<span class=\"bad\">no devices published</span>".into()
                } else if tainted > 0 {
                    format!("<span class=\"bad\">{tainted} unhealthy (tainted)</span>")
                } else if problems {
                    "<span class=\"bad\">problem</span>".into()
                } else {
                    "ok".into()
                },
            ]
        })
        .collect();
    let mut out = String::from("<h2>DRA nodes</h2>");
    out.push_str(&table(
        &format!(
            "{} nodes whose GPUs are DRA devices of {DRIVER} (claimed through ResourceClaims)",
            names.len()
        ),
        &[
            "NODE",
            "DEVICES IN USE",
            "MEMORY CLAIMED",
            "COMPUTE CLAIMED",
            "SHARES",
            "HEALTH",
        ],
        &rows,
    ));
    out
}

/// One device's card: capacity and consumption meters, CU map, shares.
fn device_card(out: &mut String, node: &str, device: &DraDevice, metrics: &Metrics, now: i64) {
    let id = format!("dra-{}", url_segment(&device.name));
    let covered = coverage(metrics, node);
    let sampled = card_use(metrics, node, &device.uuid);
    let _ = write!(
        out,
        "<section class=\"card\" data-dra-device=\"{name}\" aria-labelledby=\"{id}\"><h3 id=\"{id}\">{name} {product} <span class=\"muted\">{uuid}</span></h3><p>{health} · {used}/{shares} shares</p>",
        name = esc(&device.name),
        product = esc(&device.product),
        uuid = esc(&device.uuid),
        health = if device.tainted {
            "<span class=\"bad\">UNHEALTHY (tainted: takes no new claims)</span>"
        } else {
            "healthy"
        },
        used = device.shares_used,
        shares = device.shares,
    );
    let _ = write!(
        out,
        "<p>{}<br>{}<br>{}</p>",
        meter(
            "Memory (MiB)",
            device.memory_used_bytes as f64 / MIB,
            sampled.memory_mib,
            device.memory_bytes as f64 / MIB,
            "MiB"
        ),
        meter(
            "Compute (CUs)",
            device.compute_units_used as f64,
            None,
            device.compute_units as f64,
            "CUs"
        ),
        sampled_note(sampled.at, now, covered),
    );
    let total = u32::try_from(device.compute_units).unwrap_or(u32::MAX);
    // Owner label: the pod, else the claim (allocated, not reserved by a pod yet).
    let mut problems = Vec::new();
    let sets: Vec<(String, CuSet)> = device
        .holders
        .iter()
        .filter(|h| !h.cu_ranges.is_empty())
        .filter_map(|h| {
            let who = h.pods.first().cloned().unwrap_or_else(|| h.claim.clone());
            match CuSet::parse(&h.cu_ranges, total) {
                Ok(set) => Some((who, set)),
                Err(e) => {
                    problems.push(format!("{}: cuRanges {:?}: {e}", h.claim, h.cu_ranges));
                    None
                }
            }
        })
        .collect();
    let owners: Vec<CuOwner> = sets.iter().map(|(pod, cus)| CuOwner { pod, cus }).collect();
    out.push_str(&cu_map(
        total,
        &owners,
        None,
        &format!("CU map of {}: {} CUs", device.name, device.compute_units),
    ));
    for p in &problems {
        let _ = write!(out, "<p class=\"bad\">{}</p>", esc(p));
    }
    if device.holders.is_empty() {
        out.push_str("<p class=\"muted\">No claims.</p>");
    } else {
        let rows: Vec<Vec<String>> = device
            .holders
            .iter()
            .map(|h| {
                let pods = if h.pods.is_empty() {
                    "(not reserved yet)".to_owned()
                } else {
                    h.pods
                        .iter()
                        .map(|p| pod_link(p))
                        .collect::<Vec<_>>()
                        .join("<br>")
                };
                let used: Vec<(f64, Option<i64>)> = h
                    .pods
                    .iter()
                    .filter_map(|p| {
                        let (ns, name) = p.split_once('/').unwrap_or(("", p));
                        let u = metrics.pod_device(ns, name, &device.uuid);
                        u.memory_bytes.map(|b| (b, u.at))
                    })
                    .collect();
                vec![
                    pods,
                    esc(&h.claim),
                    bytes_mib(h.memory_bytes),
                    h.memory_limit_bytes
                        .map(bytes_mib)
                        .unwrap_or_else(|| "(pending prepare)".into()),
                    figure(
                        (!used.is_empty()).then(|| {
                            (
                                mib(used.iter().map(|(b, _)| b).sum::<f64>() / MIB),
                                used.iter().filter_map(|(_, at)| *at).min(),
                            )
                        }),
                        now,
                        covered,
                    ),
                    format!("{} CUs", h.compute_units),
                    if h.cu_ranges.is_empty() {
                        "(pending prepare)".into()
                    } else {
                        esc(&h.cu_ranges)
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            "Shares (one per allocation result)",
            &[
                "POD",
                "CLAIM",
                "MEMORY CLAIMED",
                "LIMIT",
                "USED",
                "COMPUTE",
                "CUS",
            ],
            &rows,
        ));
    }
    out.push_str("</section>");
}

/// The node page's DRA section for node `name`; `None` when it is not a DRA node.
pub fn node_section(world: &World, metrics: &Metrics, name: &str, now: i64) -> Option<String> {
    let labelled = world.nodes.get(name).is_some_and(is_dra_node);
    let node: Option<&DraNode> = world.dra_nodes().iter().find(|n| n.name == name);
    if !labelled && node.is_none() {
        return None;
    }
    let devices = node.map_or(&[][..], |n| n.devices.as_slice());
    let mut out = format!(
        "<h2>DRA devices ({})</h2><p>DRA mode: this node's GPUs are devices of {DRIVER} in its ResourceSlices; pods get shares of them through ResourceClaims.</p>",
        devices.len()
    );
    for p in node.iter().flat_map(|n| &n.problems) {
        let _ = write!(out, "<p class=\"bad\">{}</p>", esc(p));
    }
    if devices.is_empty() {
        out.push_str(
            "<p class=\"muted\">No ResourceSlice of this driver names this node (yet).</p>",
        );
    }
    out.push_str("<div class=\"cards\">");
    for d in devices {
        device_card(&mut out, name, d, metrics, now);
    }
    out.push_str("</div>");
    Some(out)
}

/// The pod page's DRA section for `namespace/name`: its shares of DRA devices; empty
/// when it has none.
pub fn pod_section(world: &World, pod: &str) -> String {
    let shares = world.dra_shares_of(pod);
    if shares.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = shares
        .iter()
        .map(|s| {
            vec![
                node_link(&s.node.name),
                esc(&s.device.name),
                esc(&s.device.uuid),
                esc(&s.holder.claim),
                bytes_mib(s.holder.memory_bytes),
                s.holder
                    .memory_limit_bytes
                    .map(bytes_mib)
                    .unwrap_or_else(|| "(pending prepare)".into()),
                format!("{} CUs", s.holder.compute_units),
                if s.holder.cu_ranges.is_empty() {
                    "(pending prepare)".into()
                } else {
                    esc(&s.holder.cu_ranges)
                },
            ]
        })
        .collect();
    let mut out = String::from("<h2>DRA shares</h2>");
    out.push_str(&table(
        "From the ResourceClaims reserved for this pod (allocation and the driver's status)",
        &[
            "NODE",
            "DEVICE",
            "UUID",
            "CLAIM",
            "MEMORY CLAIMED",
            "LIMIT",
            "COMPUTE",
            "CUS",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{captures, slice_device};
    use crate::html::esc;
    use crate::pages;
    use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
    use hami_protocol::names::{Vendor, pod as pod_keys};
    use hami_protocol::node_register::DeviceInfo;
    use hami_protocol::scrape::parse_samples;
    use serde_json::{Value, json};

    fn world() -> World {
        let mut w = World::default();
        w.upsert_node(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "dra-node", "labels": {"hami.io/amd-mode": "dra"}}}))
            .unwrap(),
        );
        let gpu = |name: &str, uuid: &str, taints: Value| {
            json!({"name": name, "allowMultipleAllocations": true,
                "attributes": {"uuid": {"string": uuid}, "productName": {"string": "AMD Instinct MI210"}},
                "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                    "shares": {"value": "10"}},
                "taints": taints})
        };
        w.reset_slices(vec![
            serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "dra-node-amdgpu-0"},
                "spec": {"driver": DRIVER, "nodeName": "dra-node",
                    "pool": {"name": "dra-node", "generation": 2, "resourceSliceCount": 1},
                    "devices": [gpu("gpu-0", "0xa1", json!([])),
                        gpu("gpu-1", "0xa2", json!([{"key": "unhealthy", "effect": "NoSchedule"}]))]}}))
            .unwrap(),
        ]);
        w.upsert_claim(
            serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "train-gpu-x1", "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
                "status": {
                    "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                        "pool": "dra-node", "device": "gpu-0", "shareID": "s1",
                        "consumedCapacity": {"memory": "8Gi", "computeUnits": "26", "shares": "1"}}]}},
                    "reservedFor": [{"resource": "pods", "name": "train", "uid": "u1"}],
                    "devices": [{"driver": DRIVER, "pool": "dra-node", "device": "gpu-0", "shareID": "s1",
                        "data": {"cuRanges": "26-51", "memoryBytes": 8589934592u64}}]}}))
            .unwrap(),
        );
        w.upsert_pod(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
                "spec": {"nodeName": "dra-node",
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice-8g"}],
                    "containers": [{"name": "main", "image": "rocm",
                        "resources": {"claims": [{"name": "gpu"}]}}]},
                "status": {"phase": "Running",
                    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x1"}]}}))
            .unwrap(),
        );
        w
    }

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn a_dra_node_and_pod_show_their_devices_and_shares() {
        let w = world();
        let m = Metrics::default();
        let overview = pages::overview(&w, &m, "", 1000).html;
        assert!(overview.contains("<h2>DRA nodes</h2>"), "{overview}");
        assert!(overview.contains("href=\"/nodes/dra-node\""), "{overview}");
        // 1 of 2 devices in use; 8 GiB of 128 GiB; 26 of 208 CUs; 1 of 20 shares; 1 tainted.
        assert!(
            overview.contains("<td>1/2</td><td>8.0 GiB / 128.0 GiB</td><td>26 / 208 CUs</td><td>1 / 20</td><td><span class=\"bad\">1 unhealthy (tainted)</span></td>"),
            "{overview}"
        );

        let node = pages::node(&w, &m, "dra-node", 1000).html;
        assert!(node.contains("<h2>DRA devices (2)</h2>"), "{node}");
        assert!(!node.contains("Cards and partitions"), "{node}");
        assert_eq!(count(&node, "data-dra-device="), 2, "{node}");
        // The CU map: 104 cells per device, the pod owns 26-51 of gpu-0.
        assert_eq!(count(&node, "class=\"cu\""), 208);
        assert_eq!(count(&node, "data-owner=\"ml/train\""), 26);
        assert!(
            node.contains(&format!(
                "fill=\"{}\" data-cu=\"26\" data-owner=\"ml/train\"",
                crate::svg::owner_colours(&["ml/train"])[0]
            )),
            "{node}"
        );
        assert!(
            node.contains("Memory (MiB): 8192 of 65536 MiB granted"),
            "{node}"
        );
        assert!(
            node.contains("Compute (CUs): 26 of 104 CUs granted"),
            "{node}"
        );
        assert!(node.contains("1/10 shares"), "{node}");
        assert!(node.contains("UNHEALTHY (tainted"), "{node}");
        assert!(
            node.contains("<td>ml/train-gpu-x1:gpu</td><td>8.0 GiB</td><td>8.0 GiB</td><td>not reported: no monitor configured for this node</td><td>26 CUs</td><td>26-51</td>"),
            "{node}"
        );

        let pod = pages::pod(&w, &m, "ml", "train", 1000).html;
        assert!(pod.contains("<h2>DRA shares</h2>"), "{pod}");
        assert!(
            pod.contains(
                "<td>main</td><td>app</td><td>-</td><td>claims gpu (DRA shares below)</td>"
            ),
            "{pod}"
        );
        assert!(
            pod.contains("<td><a href=\"/nodes/dra-node\">dra-node</a></td><td>dra-node/gpu-0</td><td>0xa1</td><td>ml/train-gpu-x1:gpu</td><td>8.0 GiB</td><td>8.0 GiB</td><td>26 CUs</td><td>26-51</td>"),
            "{pod}"
        );
        // A pod without claims has no DRA section; the claim's removal empties the share.
        let mut w = w;
        w.reset_claims(vec![]);
        let pod = pages::pod(&w, &m, "ml", "train", 1000).html;
        assert!(!pod.contains("<h2>DRA shares</h2>"), "{pod}");
        let node = pages::node(&w, &m, "dra-node", 1000).html;
        assert_eq!(count(&node, "data-owner=\"ml/train\""), 0);
    }

    #[test]
    fn gpus_by_type_and_the_memory_trend_count_dra_devices_once() {
        let mut w = world();
        // A device-plugin node (the MI210 capture) with a pod granted 16 GiB and 26 CUs.
        let (node, cpx) = captures();
        let mi210: Vec<DeviceInfo> = hami_protocol::node_register::decode_node_devices(
            &node.metadata.annotations.as_ref().unwrap()[Vendor::Amd.names().node_register],
        )
        .unwrap();
        assert_eq!(mi210.len(), 8);
        let ty = mi210[0].device_type.clone();
        assert_eq!(ty, "AMD Instinct MI210", "the DRA fixture's productName");
        w.upsert_node(node);
        let runs = vec![vec![ContainerDevice {
            uuid: mi210[0].id.clone(),
            device_type: ty.clone(),
            mem_mib: 16384,
            cores: 26,
        }]];
        w.upsert_pod(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "infer", "namespace": "default", "uid": "u2",
                    "annotations": {
                        pod_keys::VGPU_NODE: "mi210-0",
                        Vendor::Amd.names().devices_allocated: encode_pod_devices(&runs).unwrap(),
                        pod_keys::BIND_PHASE: "success"}},
                "spec": {"nodeName": "mi210-0", "schedulerName": "hami-scheduler",
                    "containers": [{"name": "server", "image": "rocm",
                        "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "16384"}}}]},
                "status": {"phase": "Running"}}))
            .unwrap(),
        );
        // A DRA node of hard partitions (the CPX capture), one claimed whole: the API gives
        // an exclusive device's result no consumedCapacity.
        let devices: Vec<Value> = cpx
            .iter()
            .enumerate()
            .map(|(i, d)| slice_device(&format!("gpu-0-cpx-{i}"), d))
            .collect();
        assert_eq!(devices.len(), 63);
        w.upsert_slice(
            serde_json::from_value(
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "cpx-dra-amdgpu-0"},
                "spec": {"driver": DRIVER, "nodeName": "cpx-dra",
                    "pool": {"name": "cpx-dra", "generation": 1, "resourceSliceCount": 1},
                    "devices": devices}}),
            )
            .unwrap(),
        );
        w.upsert_claim(
            serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "part", "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
                "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                    "pool": "cpx-dra", "device": "gpu-0-cpx-5"}]}}}}))
            .unwrap(),
        );
        // Monitor samples: the device-plugin container (4 GiB) and the DRA one (2 GiB).
        let sample = |ns: &str, pod: &str, ctr: &str, uuid: &str, gib: u64| {
            format!(
                "hami_container_device_memory_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"{ctr}\",vdevice_index=\"0\",device_uuid=\"{uuid}\"}} {}\n",
                gib << 30
            )
        };
        let body = sample("default", "infer", "server", &mi210[0].id, 4)
            + &sample("ml", "train", "main", "0xa1", 2);
        let mut m = Metrics::with_endpoints(&["http://monitor/metrics".into()]);
        // Granted: 16 GiB by the scheduler, 8 GiB + one 1/63 partition claimed through DRA.
        let partition_mib = cpx[5].devmem as f64;
        assert_eq!(w.memory_granted_mib(), 16384.0 + 8192.0 + partition_mib);
        m.ingest(1000, vec![Ok(parse_samples(&body))], &w);
        assert_eq!(
            m.trend_granted.0.back(),
            Some(&(1000, 24576.0 + partition_mib))
        );
        assert_eq!(m.trend_used.0.back(), Some(&(1000, 6144.0)));

        let overview = pages::overview(&w, &m, "", 1000).html;
        // MI210: 8 plugin GPUs + 2 DRA devices on 2 nodes; 24 of 640 GiB
        // granted, 6 GiB used; 52 of 1040 CUs; the tainted DRA device is unhealthy.
        assert!(
            overview.contains("<td>AMD Instinct MI210</td><td>AMD</td><td>10</td><td>2</td><td>24.0 GiB / 640.0 GiB (4%)</td><td>6.0 GiB (1%) <span class=\"age\" title=\"sampled at 00:16:40 UTC\">as of 0 s ago</span></td><td>52 / 1040 CUs (5%)</td><td>no samples yet</td><td><span class=\"bad\">1 unhealthy</span></td>"),
            "{overview}"
        );
        // The CPX partitions: 63 on 1 node, one held whole (as a register entry each).
        let part = &cpx[5];
        let total_mib: f64 = cpx.iter().map(|d| d.devmem as f64).sum();
        let total_cus: u32 = cpx.iter().map(|d| d.devcore).sum();
        assert!(
            overview.contains(&format!(
                "<td>{}</td><td>AMD</td><td>63</td><td>1</td><td>{} / {} ({})</td><td>not reported: no monitor configured for this node</td><td>{} / {total_cus} CUs ({})</td>",
                esc(&part.device_type),
                mib(part.devmem as f64),
                mib(total_mib),
                pages::pct(part.devmem as f64, total_mib),
                part.devcore,
                pages::pct(f64::from(part.devcore), f64::from(total_cus)),
            )),
            "{overview}"
        );
        // The Nodes table lists device-plugin nodes; the DRA nodes have their own table.
        assert!(overview.contains("1 nodes with GPUs"), "{overview}");
        assert!(!overview.contains("-0 MiB"), "{overview}");
        // The DRA nodes table shows the partition held whole too.
        assert!(overview.contains("href=\"/nodes/cpx-dra\""), "{overview}");
        assert!(
            overview.contains(&format!(
                "<td>1/63</td><td>{} / {}</td>",
                bytes_mib(part.devmem << 20),
                mib(total_mib)
            )),
            "{overview}"
        );

        // The DRA node also registering its tainted device 0xa2 by annotation, healthy
        // (a node changing modes, its old device plugin's annotation not yet gone): the
        // scheduler offers no AMD GPU of a DRA-labelled node to device-plugin pods, so the
        // GPU is the DRA driver's — counted once, from its slice (tainted: unhealthy), and
        // the node gets no device-plugin row.
        let mut both = mi210[1].clone();
        both.id = "0xa2".into();
        w.upsert_node(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "dra-node", "labels": {"hami.io/amd-mode": "dra"},
                    "annotations": {Vendor::Amd.names().node_register:
                        hami_protocol::node_register::encode_node_devices(&[both]).unwrap()}}}))
            .unwrap(),
        );
        let overview = pages::overview(&w, &m, "", 1000).html;
        assert!(
            overview.contains("<td>AMD Instinct MI210</td><td>AMD</td><td>10</td><td>2</td><td>24.0 GiB / 640.0 GiB (4%)</td><td>6.0 GiB (1%) <span class=\"age\" title=\"sampled at 00:16:40 UTC\">as of 0 s ago</span></td><td>52 / 1040 CUs (5%)</td><td>no samples yet</td><td><span class=\"bad\">1 unhealthy</span></td>"),
            "{overview}"
        );
        assert!(overview.contains("1 nodes with GPUs"), "{overview}");
        assert!(
            !overview.contains(
                "<td><a href=\"/nodes/dra-node\">dra-node</a></td><td>AMD Instinct MI210</td>"
            ),
            "{overview}"
        );
        assert_eq!(w.memory_granted_mib(), 16384.0 + 8192.0 + partition_mib);

        // A DRA node whose NVIDIA GPUs come through the device plugin: its row is healthy
        // (the scheduler's "serves AMD through DRA" note there is expected).
        let mut nvidia = mi210[2].clone();
        nvidia.id = "GPU-00000000-0000-4000-8000-000000000001".into();
        nvidia.device_type = "NVIDIA A100".into();
        nvidia.device_vendor = Vendor::Nvidia.word().into();
        w.upsert_node(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "mixed", "labels": {"hami.io/amd-mode": "dra"},
                    "annotations": {Vendor::Nvidia.names().node_register:
                        hami_protocol::node_register::encode_node_devices(&[nvidia]).unwrap()}}}))
            .unwrap(),
        );
        assert!(
            !w.state
                .node("mixed")
                .unwrap()
                .devices
                .register_errors
                .is_empty(),
            "the scheduler refuses the device plugin's AMD there"
        );
        let overview = pages::overview(&w, &m, "", 1000).html;
        assert!(
            overview.contains("<td><a href=\"/nodes/mixed\">mixed</a></td><td>NVIDIA A100</td><td>0/1</td><td>0 MiB / 64.0 GiB</td><td>not reported: no monitor configured for this node</td><td>ok</td>"),
            "{overview}"
        );
    }

    #[test]
    fn dra_watch_errors_show_only_where_dra_is_used() {
        let mut w = World::default();
        w.watch_failed(
            "resourceslices",
            "404 the server could not find it".into(),
            0,
        );
        w.synced.insert("resourceclaims", false);
        w.synced.insert("nodes", false);
        let b = w.banners();
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].contains("Still listing nodes"));
        assert!(overview_section(&w).is_empty());
        w = world();
        w.watch_failed("resourceslices", "403 forbidden".into(), 0);
        w.synced.insert("resourceclaims", false);
        let b = w.banners();
        assert!(
            b.iter()
                .any(|b| b.contains("cannot be read since 00:00 UTC (resourceslices): 403")),
            "{b:?}"
        );
        assert!(
            b.iter().any(|b| b.contains("Still listing resourceclaims")),
            "{b:?}"
        );
    }

    #[test]
    fn a_dra_node_on_a_ui_without_dra_watches_says_so_once() {
        // With --dra=off the UI starts no DRA watch (so has no DRA error or pending list);
        // a node labelled for DRA gets one banner naming the flag; none without one.
        let mut w = World::default();
        w.dra_unwatched = true;
        w.upsert_node(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "plain"}}))
            .unwrap(),
        );
        assert!(w.banners().is_empty(), "{:?}", w.banners());
        w.upsert_node(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "dra-node", "labels": {"hami.io/amd-mode": "dra"}}}))
            .unwrap(),
        );
        let b = w.banners();
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(
            b[0].contains("Node dra-node is in DRA mode") && b[0].contains("--dra"),
            "{b:?}"
        );
        // With the DRA watches on (the default World, as `start`), no such banner.
        w.dra_unwatched = false;
        assert!(w.banners().is_empty(), "{:?}", w.banners());
    }
}
