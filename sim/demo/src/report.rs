//! The per-node tables: GPU, pod/container, memory granted, CUs and CU range, and live from
//! the node's monitor: device memory used and utilization.

use std::collections::BTreeMap;

use hami_protocol::cu_list::HsaCuMask;
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{AMD, NVIDIA, env};
use hami_protocol::requests::{container_slots, pod_ref};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::cluster::{Cluster, Submitted};
use crate::live::scrape;

struct Row {
    gpu: String,
    who: String,
    memory: String,
    cus: String,
    range: String,
    used: String,
    util: String,
}

pub(crate) async fn render(cluster: &Cluster, submitted: &[Submitted]) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let all = pods.list(&ListParams::default()).await?.items;
    let mut text = String::new();
    let dra = if cluster.dra {
        crate::report_dra::DraView::read(&cluster.client).await?
    } else {
        Default::default()
    };
    for node in &cluster.nodes {
        let addr = node.monitor_addr;
        let live = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap_or_default();
        if node.dra {
            text.push_str(&crate::report_dra::node_table(
                &dra,
                &node.name,
                &node.description,
                &all,
                &live,
            ));
            continue;
        }
        let (gpus, devcore_of, partitions) = {
            let state = cluster.scheduler.state();
            let snapshot = state.node(&node.name).cloned();
            let gpus: Vec<(String, String, u64, u32)> = snapshot
                .as_ref()
                .map(|s| {
                    s.devices
                        .gpus
                        .iter()
                        .map(|g| {
                            (
                                g.info.id.clone(),
                                g.info.device_type.clone(),
                                g.info.devmem,
                                g.info.devcore,
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let devcore_of: BTreeMap<String, u32> =
                gpus.iter().map(|g| (g.0.clone(), g.3)).collect();
            // Hard partitions (mode xcp) are handed out whole, whatever share was asked.
            let partitions: std::collections::BTreeSet<String> = snapshot
                .as_ref()
                .map(|s| {
                    s.devices
                        .gpus
                        .iter()
                        .filter(|g| g.info.mode == hami_protocol::node_register::DeviceMode::Xcp)
                        .map(|g| g.info.id.clone())
                        .collect()
                })
                .unwrap_or_default();
            (gpus, devcore_of, partitions)
        };
        let mut rows = Vec::new();
        let mut busy: BTreeMap<String, ()> = BTreeMap::new();
        for pod in all.iter().filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.name.as_str())
        }) {
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            let nvidia = annotations.contains_key(NVIDIA.devices_allocated);
            let key = if nvidia {
                NVIDIA.devices_allocated
            } else {
                AMD.devices_allocated
            };
            let Some(runs) = annotations
                .get(key)
                .and_then(|t| decode_pod_devices(t).ok())
            else {
                continue;
            };
            let owner = pod_ref(pod);
            let (namespace, name) = (owner.namespace, owner.name);
            let record = annotations
                .get(hami_kubelet_sim::records::RECORD_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            let slots = pod.spec.as_ref().map(container_slots).unwrap_or_default();
            for (slot, run) in slots.iter().zip(&runs) {
                let container = &slot.container.name;
                let envs =
                    hami_kubelet_sim::records::envs_of(&record, container).unwrap_or_default();
                let mask = envs
                    .get(env::HSA_CU_MASK)
                    .and_then(|m| m.as_str())
                    .and_then(|m| HsaCuMask::parse(m).ok());
                for (i, dev) in run.iter().enumerate() {
                    busy.insert(dev.uuid.clone(), ());
                    let devcore = devcore_of.get(&dev.uuid).copied().unwrap_or(0);
                    let range = match &mask {
                        // NVIDIA slices are limited by SM share, not by a CU mask.
                        _ if nvidia => format!("SM limit {}%", dev.cores),
                        Some(mask) => mask
                            .get(i as u32)
                            .map(ToString::to_string)
                            .unwrap_or_else(|| "all".into()),
                        None if envs.is_empty() => "(pending Allocate)".into(),
                        None if partitions.contains(&dev.uuid) => "all (whole partition)".into(),
                        None => "all (whole card)".into(),
                    };
                    let key = (
                        namespace.clone(),
                        name.clone(),
                        container.clone(),
                        i.to_string(),
                    );
                    rows.push(Row {
                        gpu: dev.uuid.clone(),
                        who: format!(
                            "{namespace}/{name}/{container}{}",
                            if slot.kind == hami_protocol::requests::ContainerKind::App {
                                ""
                            } else {
                                " (init)"
                            }
                        ),
                        memory: format!("{} MiB", dev.mem_mib),
                        cus: if nvidia {
                            format!("{}%", dev.cores)
                        } else if partitions.contains(&dev.uuid) {
                            format!("{devcore}/{devcore}")
                        } else {
                            format!("{}/{devcore}", dev.cores)
                        },
                        range,
                        used: live
                            .memory
                            .get(&key)
                            .map(|b| format!("{} MiB", (*b as u64) >> 20))
                            .unwrap_or_else(|| "-".into()),
                        util: live
                            .util
                            .get(&key)
                            .map(|u| format!("{u:.0}%"))
                            .unwrap_or_else(|| "-".into()),
                    });
                }
            }
        }
        rows.sort_by(|a, b| a.gpu.cmp(&b.gpu).then(a.who.cmp(&b.who)));
        let model = gpus.first().map(|g| g.1.clone()).unwrap_or_default();
        text.push_str(&format!(
            "\nNode {} — {} ({} GPUs/partitions registered as {model:?}, {} in use)\n",
            node.name,
            node.description,
            gpus.len(),
            busy.len()
        ));
        let mut table = vec![
            [
                "GPU",
                "POD/CONTAINER",
                "MEMORY",
                "CUS",
                "CU RANGE",
                "USED",
                "UTIL",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for r in &rows {
            table.push(vec![
                r.gpu.clone(),
                r.who.clone(),
                r.memory.clone(),
                r.cus.clone(),
                r.range.clone(),
                r.used.clone(),
                r.util.clone(),
            ]);
        }
        if rows.is_empty() {
            text.push_str("  no slices on this node\n");
        } else {
            text.push_str(&align(&table));
        }
    }
    let failures = cluster
        .scheduling_failures(
            &submitted
                .iter()
                .filter_map(|s| match s {
                    Submitted::Created { pod, .. } => Some(pod.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        )
        .await;
    let mut pending = String::new();
    for (pod, why) in &failures {
        let placed = all.iter().any(|p| {
            p.metadata.name.as_deref() == Some(pod.as_str())
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
        });
        if !placed {
            pending.push_str(&format!("  {pod}: {why}\n"));
        }
    }
    for s in submitted {
        if let Submitted::Rejected { pod, message, file } = s {
            pending.push_str(&format!(
                "  {pod} ({file}) rejected at admission: {message}\n"
            ));
        }
    }
    if !pending.is_empty() {
        text.push_str("\nNot placed:\n");
        text.push_str(&pending);
    }
    Ok(text)
}

pub(crate) fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < columns {
                line.extend(std::iter::repeat_n(
                    ' ',
                    widths[c] - cell.chars().count() + 2,
                ));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Waits (at most `limit`) until every running GPU container's process shows in its node
/// monitor's utilization, then for one more monitor refresh, so the tables do not show
/// the first window, which holds only part of a process's life.
pub(crate) async fn wait_for_live(
    cluster: &Cluster,
    limit: std::time::Duration,
    refresh: std::time::Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    loop {
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return;
        };
        let mut complete = true;
        for node in &cluster.nodes {
            let running = node.kubelet.containers();
            if running.is_empty() {
                continue;
            }
            let addr = node.monitor_addr;
            let live = tokio::task::spawn_blocking(move || scrape(addr))
                .await
                .unwrap_or_default();
            for c in running.iter().filter(|c| c.init_pid.is_some()) {
                let record = list
                    .items
                    .iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(c.pod_uid.as_str()))
                    .and_then(|p| p.metadata.annotations.as_ref())
                    .and_then(|a| a.get(hami_kubelet_sim::records::RECORD_ANNOTATION))
                    .cloned()
                    .unwrap_or_default();
                let gpu = hami_kubelet_sim::records::envs_of(&record, &c.container)
                    .is_some_and(|e| !e.is_empty());
                let key = (
                    c.namespace.clone(),
                    c.pod.clone(),
                    c.container.clone(),
                    "0".into(),
                );
                if gpu && !live.util.contains_key(&key) {
                    complete = false;
                }
            }
        }
        if complete {
            tokio::time::sleep(refresh).await;
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
