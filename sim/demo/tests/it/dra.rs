//! `hami demo --dra` (issue 20): a DRA slice pod and the device-plugin slice pods side by
//! side on different nodes. The built-in examples with `--dra`: the DRA example's claim is
//! allocated by the simulated kube-scheduler from the DRA node's ResourceSlices, prepared by
//! the real AMD DRA driver, and its container gets the CDI spec's env (CU mask, memory
//! limit, hook) and mounts (hook, cache, hook config); a second claim pinned to the same GPU
//! gets disjoint CUs; the pod's VRAM limit is in its pod cgroup's `dmem.max`; the device-plugin pods still run on their nodes; no device plugin
//! registered on the DRA node; the tables show the DRA holders.
//!
//! HAMi's own API in DRA mode: `11-dra-hami-api.yaml` (share-a's request, annotated
//! `hami.io/amd-mode: dra`) and memory-only's DRA twin are converted by the scheduler's
//! webhook into `hami-amd-*` ResourceClaimTemplates (the cluster's default mode stays
//! device-plugin) and run on the DRA node with the same env, mask width, memory limit and
//! dmem as their device-plugin twins get on mi210-node.

use crate::common;

use std::time::{Duration, Instant};

use common::{once_args, scratch};
use hami_demo::{Cluster, Progress, SimNode};
use hami_kubelet_sim::records::RECORD_ANNOTATION;
use hami_protocol::cu_list::{CuSet, HsaCuMask};
use hami_protocol::dra::{CLAIM_PREFIX, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const DRA_NODE: &str = "mi210-dra-node";
const DRIVER: &str = "amdgpu.hami-rs.io";

fn record(pod: &Pod) -> Value {
    serde_json::from_str(&pod.annotations()[RECORD_ANNOTATION]).unwrap()
}

async fn running(client: &Client, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = pods.get(name).await.unwrap();
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return p;
        }
        assert!(Instant::now() < deadline, "pod {name} not Running: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pod's (only) claim.
async fn claim_of(client: &Client, pod: &Pod) -> ResourceClaim {
    let name = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|s| s[0].resource_claim_name.clone())
        .unwrap_or_else(|| panic!("{} has no claim status", pod.name_any()));
    Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .get(&name)
        .await
        .unwrap()
}

/// The claim's one result on our driver: (device, consumed memory, consumed CUs).
fn result_of(claim: &ResourceClaim) -> (String, String, String) {
    let alloc = claim.status.as_ref().unwrap().allocation.as_ref().unwrap();
    let r = &alloc.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(r.driver, DRIVER);
    let consumed = r.consumed_capacity.as_ref().unwrap();
    (
        r.device.clone(),
        consumed["memory"].0.clone(),
        consumed["computeUnits"].0.clone(),
    )
}

/// The CU set the container's `HSA_CU_MASK` gives its one device.
fn cu_set(envs: &Value) -> CuSet {
    let mask = HsaCuMask::parse(envs["HSA_CU_MASK"].as_str().unwrap()).unwrap();
    mask.get(0).unwrap().clone()
}

/// The one `drm/<region> <bytes>` line the driver wrote into pod `uid`'s `dmem.max` on the
/// DRA node (waited for, bounded).
async fn dmem_limit(node: &SimNode, uid: &str) -> (String, u64) {
    let cgroup_root = node.tree.sysfs_root().join("fs/cgroup");
    let dmem_max = hami_demo::dra_node::pod_cgroup(&cgroup_root, uid).join("dmem.max");
    let deadline = Instant::now() + Duration::from_secs(10);
    let limits = loop {
        let text = std::fs::read_to_string(&dmem_max).unwrap_or_default();
        if !text.is_empty() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no dmem limit in {}",
            dmem_max.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lines: Vec<&str> = limits.lines().collect();
    assert_eq!(lines.len(), 1, "{limits}");
    let (region, bytes) = lines[0].split_once(' ').unwrap();
    assert!(region.starts_with("drm/"), "{limits}");
    (region.to_owned(), bytes.parse().unwrap())
}

/// Waits (bounded) until `node`'s monitor shows `mib` MiB used by `pod`/`container` (device
/// 0) under a limit of `limit` bytes: the container ran under the hook with its slice.
async fn wait_live(node: &SimNode, pod: &str, container: &str, mib: f64, limit: f64, log: &str) {
    let key = (
        "default".to_owned(),
        pod.to_owned(),
        container.to_owned(),
        "0".to_owned(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let addr = node.monitor_addr;
        let live = tokio::task::spawn_blocking(move || hami_demo::scrape(addr))
            .await
            .unwrap();
        if live.memory.get(&key) == Some(&(mib * 1048576.0)) {
            assert_eq!(live.limit.get(&key), Some(&limit), "{live:?}");
            return;
        }
        let container_log = std::fs::read_to_string(
            node.record_dir
                .join(format!("default_{pod}_{container}.log")),
        )
        .unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "{}'s monitor never showed {pod}'s {mib} MiB: {live:?}\ncontainer log: {container_log}\n{log}",
            node.name
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a pod converted by the webhook's DRA mode got.
struct Converted {
    pod: Pod,
    /// The claim's device, consumed memory (bytes) and CUs.
    device: String,
    memory: u64,
    cus: u64,
    envs: Value,
    set: CuSet,
    /// `status.devices[0].data.cuRanges`.
    published: String,
}

/// A pod written with HAMi's API and `hami.io/amd-mode: dra`: the webhook replaced its
/// container's amd.com/* limits by a claim from a managed `hami-amd-*` template; it runs on
/// the DRA node with the claim (owned by the pod, reserved for it) prepared by the driver: the
/// CDI env, the CU ranges published in the claim's status, the limit in its `dmem.max`.
async fn converted(client: &Client, node: &SimNode, name: &str, container: &str) -> Converted {
    let pod = running(client, name).await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(DRA_NODE), "{name}");
    let entries = spec.resource_claims.as_ref().unwrap();
    assert_eq!(entries.len(), 1, "{name}: {entries:?}");
    assert_eq!(entries[0].name, format!("{CLAIM_PREFIX}{container}"));
    let template_name = entries[0].resource_claim_template_name.clone().unwrap();
    assert!(template_name.starts_with(CLAIM_PREFIX), "{template_name}");
    let c = spec
        .containers
        .iter()
        .find(|c| c.name == container)
        .unwrap();
    let resources = c.resources.as_ref().unwrap();
    let claims: Vec<&str> = resources
        .claims
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(claims, [entries[0].name.as_str()], "{name}");
    assert!(
        resources
            .limits
            .iter()
            .chain(&resources.requests)
            .flat_map(|m| m.keys())
            .all(|k| !k.starts_with("amd.com/")),
        "{name}: amd.com/* left in {resources:?}"
    );
    let template = Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default")
        .get(&template_name)
        .await
        .unwrap();
    assert_eq!(template.labels()[MANAGED_BY_LABEL], MANAGED_BY_WEBHOOK);
    let claim = claim_of(client, &pod).await;
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.clone())),
        ("Pod", pod.uid()),
        "the claim goes with its pod"
    );
    let status = claim.status.clone().unwrap();
    assert_eq!(
        status.reserved_for.as_ref().unwrap()[0].uid,
        pod.uid().unwrap()
    );
    let (device, memory, cus) = result_of(&claim);
    let rec = record(&pod);
    let entry = &rec[container][0];
    assert_eq!(entry["claim"], claim.name_any(), "{rec}");
    let envs = entry["envs"].clone();
    assert_eq!(envs["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so", "{envs}");
    assert_eq!(envs["HIP_VISIBLE_DEVICES"], "0", "{envs}");
    let set = cu_set(&envs);
    let published = status.devices.as_ref().unwrap()[0].data.as_ref().unwrap().0["cuRanges"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(CuSet::parse(&published, 104).unwrap(), set, "{name}");
    let memory = hami_protocol::capacity::parse(&memory).unwrap();
    assert_eq!(
        dmem_limit(node, &pod.uid().unwrap()).await.1,
        memory,
        "{name}"
    );
    Converted {
        pod,
        device,
        memory,
        cus: hami_protocol::capacity::parse(&cus).unwrap(),
        envs,
        set,
        published,
    }
}

/// The env kubelet-sim gave container `container` of device-plugin pod `name`, on
/// mi210-node.
async fn device_plugin_envs(client: &Client, name: &str, container: &str) -> Value {
    let p = running(client, name).await;
    assert_eq!(
        p.spec.as_ref().unwrap().node_name.as_deref(),
        Some("mi210-node"),
        "{name}"
    );
    assert_eq!(p.annotations()["hami.io/bind-phase"], "success");
    Value::Object(
        hami_kubelet_sim::records::envs_of(&p.annotations()[RECORD_ANNOTATION], container).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_slice_pod_runs_beside_the_device_plugin_pods() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("dra");
    let mut args = once_args("built-in".into(), &dir);
    args.dra = true;
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let workload = Some(env!("CARGO_BIN_EXE_hami-workload").into());
    let cluster = Cluster::start_with(&args, workload, &mut progress)
        .await
        .unwrap();
    let submitted = cluster
        .submit_examples(&args.examples, &mut progress)
        .await
        .unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    let log = String::from_utf8_lossy(&sink).into_owned();
    let client = cluster.client.clone();
    assert!(
        log.contains("webhook AMD mode device-plugin by default; pods annotated hami.io/amd-mode: dra get claims"),
        "{log}"
    );

    // The DRA node: labelled for DRA, its slices published, no device plugin registered.
    let node = Api::<Node>::all(client.clone())
        .get(DRA_NODE)
        .await
        .unwrap();
    assert_eq!(node.labels()["hami.io/amd-mode"], "dra");
    assert!(
        !node.annotations().contains_key("hami.io/node-amd-register"),
        "{:?}",
        node.annotations()
    );
    let dra_node = cluster.nodes.iter().find(|n| n.name == DRA_NODE).unwrap();
    assert!(dra_node.dra);
    assert_eq!(
        dra_node.kubelet.registrations(),
        0,
        "a device plugin registered"
    );
    assert_eq!(dra_node.kubelet.allocatable("amd.com/gpu"), 0);
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert!(
        slices
            .iter()
            .all(|s| s.spec.node_name.as_deref() == Some(DRA_NODE))
    );
    let devices: Vec<_> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    assert_eq!(devices.len(), 8, "one device per MI210");
    // The DeviceClass as the chart renders it.
    let class = Api::<DeviceClass>::all(client.clone())
        .get(DRIVER)
        .await
        .unwrap();
    assert_eq!(
        class.spec.selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression,
        format!("device.driver == \"{DRIVER}\"")
    );

    // The DRA pod: Running on the DRA node, its claim from the template.
    let pod = running(&client, "dra-slice").await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(DRA_NODE),
        "{log}"
    );
    let claim = claim_of(&client, &pod).await;
    assert!(
        claim.name_any().starts_with("dra-slice-gpu-"),
        "{}",
        claim.name_any()
    );
    let status = claim.status.clone().unwrap();
    assert_eq!(
        status.reserved_for.as_ref().unwrap()[0].uid,
        pod.uid().unwrap()
    );
    let (device, memory, cus) = result_of(&claim);
    assert_eq!((memory.as_str(), cus.as_str()), ("16Gi", "26"));
    // The env, devices and mounts of the driver's CDI spec.
    let rec = record(&pod);
    let entry = &rec["train"][0];
    assert_eq!(entry["claim"], claim.name_any(), "{rec}");
    let envs = &entry["envs"];
    assert_eq!(envs["HIP_DEVICE_MEMORY_LIMIT_0"], "16384m", "{envs}");
    assert_eq!(envs["HIP_VISIBLE_DEVICES"], "0", "{envs}");
    assert_eq!(envs["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so", "{envs}");
    assert_eq!(
        envs["HIP_DEVICE_MEMORY_SHARED_CACHE"],
        "/usr/local/vgpu/cache/hipdevshr.cache"
    );
    let set = cu_set(envs);
    assert_eq!(set.len(), 26, "{envs}");
    let mounts = entry["mounts"].as_array().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["containerPath"] == path)
            .unwrap_or_else(|| panic!("no mount at {path}: {entry}"))
    };
    assert_eq!(mount("/usr/local/vgpu/libamvgpu.so")["readOnly"], true);
    mount("/usr/local/vgpu/cache");
    // The hook config the driver wrote says the same as the env.
    let conf = mount("/usr/local/vgpu/hook.conf");
    assert_eq!(conf["readOnly"], true);
    let text = std::fs::read(conf["hostPath"].as_str().unwrap()).unwrap();
    let config = hami_protocol::hook_config::decode(&text).unwrap();
    assert_eq!(config.memory_limit(0), Some(16 << 30));
    assert_eq!(config.hsa_cu_mask.as_deref(), envs["HSA_CU_MASK"].as_str());
    // The CU ranges the driver published in the claim's status.
    let published = status.devices.as_ref().unwrap()[0].data.as_ref().unwrap().0["cuRanges"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(CuSet::parse(&published, 104).unwrap(), set);

    // dmem: the driver wrote the pod's VRAM limit into its pod cgroup.
    let (_, bytes) = dmem_limit(dra_node, &pod.uid().unwrap()).await;
    assert_eq!(bytes, 16u64 << 30);

    // HAMi's API in DRA mode (11-dra-hami-api.yaml: share-a's request, annotated): the
    // webhook's template asks 8Gi and 25 % of the MI210's 104 CUs = 26 (SPEC floor and
    // clamp); first fit puts it on dra-slice's GPU, with CUs disjoint from dra-slice's.
    let api = converted(&client, dra_node, "dra-hami-api", "train").await;
    assert_eq!((api.memory, api.cus), (8 << 30, 26), "{log}");
    assert_eq!(
        api.envs["HIP_DEVICE_MEMORY_LIMIT_0"], "8192m",
        "{}",
        api.envs
    );
    assert_eq!(api.set.len(), 26, "{}", api.envs);
    assert_eq!(api.device, device, "first fit: dra-slice's GPU");
    assert!(!api.set.overlaps(&set), "{:?} vs {set:?}", api.set);
    // memory-only's DRA twin: no gpucores, so every CU of its GPU (memory-only reserves
    // 100 % of the cores), which therefore holds no other DRA pod.
    let mem = converted(&client, dra_node, "memory-only-dra", "infer").await;
    assert_eq!((mem.memory, mem.cus), (16 << 30, 104), "{log}");
    assert_eq!(
        mem.envs["HIP_DEVICE_MEMORY_LIMIT_0"], "16384m",
        "{}",
        mem.envs
    );
    assert_eq!(mem.set.len(), 104, "{}", mem.envs);
    assert_ne!(mem.device, device);
    let templates: std::collections::BTreeSet<String> = [&api.pod, &mem.pod]
        .iter()
        .map(|p| {
            p.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
                .resource_claim_template_name
                .clone()
                .unwrap()
        })
        .collect();
    assert_eq!(
        templates.len(),
        2,
        "different requests, different templates"
    );
    // Side by side: their device-plugin twins on mi210-node got the same from the device
    // plugin (env, mask width, memory limit).
    for (twin, name, container) in [(&api, "share-a", "train"), (&mem, "memory-only", "infer")] {
        let envs = device_plugin_envs(&client, name, container).await;
        assert_eq!(
            envs["HIP_DEVICE_MEMORY_LIMIT_0"], twin.envs["HIP_DEVICE_MEMORY_LIMIT_0"],
            "{name}: {envs}"
        );
        assert_eq!(cu_set(&envs).len(), twin.set.len(), "{name}: {envs}");
        assert_eq!(envs["LD_AUDIT"], twin.envs["LD_AUDIT"], "{name}: {envs}");
    }

    // A second claim pinned to the same GPU: disjoint CUs.
    let uuid = devices
        .iter()
        .find(|d| d.name == device)
        .unwrap()
        .attributes
        .as_ref()
        .unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let pinned: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "40"}}}}]}}}))
    .unwrap();
    claims
        .create(&PostParams::default(), &pinned)
        .await
        .unwrap();
    let second: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "dra-pinned", "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "pinned"}],
            "containers": [{"name": "main", "image": "rocm",
                "resources": {"claims": [{"name": "gpu"}]}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &second)
        .await
        .unwrap();
    let second = running(&client, "dra-pinned").await;
    assert_eq!(
        second.spec.as_ref().unwrap().node_name.as_deref(),
        Some(DRA_NODE)
    );
    let second_set = cu_set(&record(&second)["main"][0]["envs"]);
    assert_eq!(second_set.len(), 40);
    assert!(!second_set.overlaps(&set), "{second_set:?} vs {set:?}");
    assert!(
        !second_set.overlaps(&api.set),
        "{second_set:?} vs {:?}",
        api.set
    );
    assert_eq!(result_of(&claims.get("pinned").await.unwrap()).0, device);

    // The device-plugin slice pods still run, on device-plugin nodes, with their masks.
    for name in ["share-a", "share-b"] {
        let p = running(&client, name).await;
        let on = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        assert_eq!(on, "mi210-node", "{name}");
        assert_eq!(p.annotations()["hami.io/bind-phase"], "success");
        let envs = hami_kubelet_sim::records::envs_of(&p.annotations()[RECORD_ANNOTATION], "train")
            .unwrap();
        assert_eq!(
            HsaCuMask::parse(envs["HSA_CU_MASK"].as_str().unwrap())
                .unwrap()
                .get(0)
                .unwrap()
                .len(),
            26,
            "{name}: a quarter of 104 CUs"
        );
        assert_eq!(envs["HIP_DEVICE_MEMORY_LIMIT_0"], "8192m", "{name}");
    }

    // With container processes: the DRA container starts (its CDI mounts exist, the region
    // file among them) and the DRA node's monitor reports what it allocated under the hook.
    if log.contains("app containers run hami-workload") {
        wait_live(
            dra_node,
            "dra-slice",
            "train",
            4096.0,
            16.0 * 1073741824.0,
            &log,
        )
        .await;
        // The converted pods' containers run under the hook with their slices too.
        wait_live(
            dra_node,
            "dra-hami-api",
            "train",
            4096.0,
            8.0 * 1073741824.0,
            &log,
        )
        .await;
        wait_live(
            dra_node,
            "memory-only-dra",
            "infer",
            8192.0,
            16.0 * 1073741824.0,
            &log,
        )
        .await;
        // Issue 29: the DRA containers' processes load the hook their CDI spec names, and
        // the DRA node's monitor checks them (the driver model's proc tree).
        common::wait_all_hooked(
            &[dra_node.monitor_addr],
            &[
                ("dra-slice", "libamvgpu.so"),
                ("dra-hami-api", "libamvgpu.so"),
                ("memory-only-dra", "libamvgpu.so"),
            ],
        )
        .await;
        common::assert_no_slice_not_enforced(&client).await;
    }

    // The tables: the DRA node's holders with their CU ranges.
    let tables = hami_demo::render_tables(&cluster, &submitted)
        .await
        .unwrap();
    let section = tables
        .split("\nNode ")
        .find(|s| s.starts_with(DRA_NODE))
        .unwrap_or_else(|| panic!("no {DRA_NODE} table: {tables}"));
    let row = section
        .lines()
        .find(|l| l.contains("default/dra-slice/train"))
        .unwrap_or_else(|| panic!("no dra-slice row: {section}"));
    assert!(row.contains(&published), "{row}");
    assert!(row.contains("16384 MiB") && row.contains("26/104"), "{row}");
    assert!(section.contains("default/dra-pinned/main"), "{section}");
    // The converted pods are DRA holders on the DRA node, not device-plugin rows.
    for (who, twin, memory, cus) in [
        ("default/dra-hami-api/train", &api, "8192 MiB", "26/104"),
        (
            "default/memory-only-dra/infer",
            &mem,
            "16384 MiB",
            "104/104",
        ),
    ] {
        let row = section
            .lines()
            .find(|l| l.contains(who))
            .unwrap_or_else(|| panic!("no {who} row: {section}"));
        assert!(row.contains(&twin.published), "{row}");
        assert!(row.contains(memory) && row.contains(cus), "{row}");
    }
    let device_plugin = tables
        .split("\nNode ")
        .find(|s| s.starts_with("mi210-node"))
        .unwrap_or_else(|| panic!("no mi210-node table: {tables}"));
    assert!(
        device_plugin.contains("default/memory-only/infer"),
        "{device_plugin}"
    );
    assert!(!device_plugin.contains("-dra/"), "{device_plugin}");

    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
