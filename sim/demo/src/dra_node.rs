//! `--dra`: the demo's DRA node. The real AMD DRA driver (registration and DRA sockets,
//! NodePrepareResources, CDI specs, checkpoint, ResourceSlices) serves one AMD node instead of
//! the device plugin; the chart's DeviceClass; the DRA examples' ResourceClaimTemplates;
//! the node's cgroup tree with the dmem controller, in which kubelet-sim makes the pods'
//! cgroups (`hami_kubelet_sim::pod_cgroups`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hami_amd_discovery::registration::RegistrationSettings;
use hami_amdgpu_dra_plugin::claims::KubeClaims;
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_amdgpu_dra_plugin::slice_publisher::SlicePublisher;
use hami_apiserver::RunningApiServer;
use hami_dra_core::DRIVER;
use hami_dra_core::prepare::PrepareSettings;
use hami_kubelet_sim::cgroup_layout::{CgroupDriver, Layout, Qos};
use hami_kubelet_sim::pod_cgroups::CgroupConfig;
use hami_sysfs_fixtures::FixtureTree;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Progress;

/// Seconds between the driver's ResourceSlice reconciles (the chart's default is 30; the
/// demo is short).
const PUBLISH_INTERVAL: Duration = Duration::from_secs(2);

/// Where a DRA node's kubelet and driver keep their files (a node's `/var/lib/kubelet`,
/// `/var/run/cdi`).
pub struct DraPaths {
    /// `plugins_registry/`: the driver's registration socket.
    pub registry_dir: PathBuf,
    /// `plugins/<driver>/`: its DRA socket and checkpoint.
    pub plugin_dir: PathBuf,
    /// The CDI specs the driver writes per claim and kubelet-sim reads.
    pub cdi_dir: PathBuf,
    /// kubelet-sim's DRA checkpoint (`dra_manager_state`).
    pub kubelet_state: PathBuf,
}

impl DraPaths {
    /// The paths under a node's directory.
    pub fn new(node_dir: &Path) -> Self {
        Self {
            registry_dir: node_dir.join("plugins_registry"),
            plugin_dir: node_dir.join("plugins").join(DRIVER),
            cdi_dir: node_dir.join("cdi"),
            kubelet_state: node_dir.join("dra_manager_state"),
        }
    }

    /// What kubelet-sim's DRA side is configured with.
    pub fn kubelet(&self) -> hami_kubelet_sim::dra_manager::DraConfig {
        hami_kubelet_sim::dra_manager::DraConfig {
            registry_dir: self.registry_dir.clone(),
            state_file: self.kubelet_state.clone(),
            cdi_dirs: vec![self.cdi_dir.clone()],
        }
    }
}

/// Creates the DeviceClass as the chart renders it for a cluster with `resource.k8s.io/v1`.
pub fn create_device_class(api: &RunningApiServer) -> anyhow::Result<()> {
    let mut settings = hami_manifests::Settings {
        kube_version: hami_manifests::KubeVersion::parse("v1.34.0").map_err(anyhow::Error::msg)?,
        ..Default::default()
    };
    settings.values.dra_plugin.enabled = true;
    let class = hami_manifests::objects::device_class(&settings).to_value()?;
    api.create_object("resource.k8s.io/v1", "deviceclasses", None, class)
        .map_err(|e| anyhow::anyhow!("cannot create the DeviceClass: {e:?}"))?;
    Ok(())
}

/// Starts the driver for node `name` as its DaemonSet would: ResourceSlices from the node's
/// sysfs, the hook at `<hook_path>/vgpu/libamvgpu.so`, per-claim caches and hook configs under
/// `<hook_path>/vgpu/dra` (where the node's monitor reads them), dmem when the node's cgroup
/// tree has it ([`node_cgroups`]). The task ends (after unregistering) once `stop` turns true.
pub fn spawn_driver(
    client: Client,
    name: &str,
    tree: &FixtureTree,
    hook_path: &Path,
    paths: &DraPaths,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let settings = RegistrationSettings::default();
    let report = hami_amd_plugin::discover_report::build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &settings,
    )
    .map_err(anyhow::Error::msg)?;
    let cgroup_root = tree.sysfs_root().join("fs/cgroup");
    let dmem = hami_amd_plugin::dmem::dmem_available(&cgroup_root)
        .then(|| hami_amd_plugin::dmem::spawn_writer(cgroup_root.clone(), Duration::from_secs(30)));
    let hook_dir = hook_path.join("vgpu");
    let config = DriverConfig {
        settings: PrepareSettings {
            driver: DRIVER.into(),
            node: name.into(),
            hook_host_path: hook_dir.join("libamvgpu.so").display().to_string(),
            hook_container_path: hami_amd_plugin::allocate_plan::HOOK_CONTAINER_PATH.into(),
            cache_host_root: hook_dir.join("dra").display().to_string(),
        },
        devices: hami_dra_core::slice::registered_by_name(&report.discovery, &report.registration)
            .into_iter()
            .map(|(k, v)| (k, v.clone()))
            .collect(),
        cdi_dir: paths.cdi_dir.clone(),
        checkpoint: paths.plugin_dir.join("checkpoint.json"),
        dmem,
    };
    std::fs::create_dir_all(&paths.plugin_dir)?;
    std::fs::create_dir_all(&paths.cdi_dir)?;
    let publisher = SlicePublisher {
        client: client.clone(),
        driver: DRIVER.into(),
        node: name.into(),
        sysfs_root: tree.sysfs_root(),
        dev_root: tree.dev_root(),
        settings,
    };
    let driver = Arc::new(Driver::new(config, KubeClaims { client })?);
    let sockets = Sockets::new(&paths.registry_dir, &paths.plugin_dir, DRIVER);
    Ok(tokio::spawn(async move {
        let stopped = |mut stop: watch::Receiver<bool>| async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let publishing = tokio::spawn(publisher.run(PUBLISH_INTERVAL, stopped(stop.clone())));
        let (_registered, serving) = serve(driver, DRIVER, &sockets, stopped(stop)).await?;
        serving.await?;
        publishing.await?;
        Ok(())
    }))
}

/// The cgroup v2 tree of the node whose sysfs is `sys_root`, its root listing the `dmem`
/// controller (kernel ≥ 6.14), so the driver applies each pod's VRAM limits to its pod
/// cgroup's `dmem.max`; kubelet-sim makes the pod cgroups in it (cgroupfs driver). Call
/// before kubelet-sim starts: the controllers are the kernel's, there from boot.
pub fn node_cgroups(sys_root: &Path) -> std::io::Result<CgroupConfig> {
    let root = sys_root.join("fs/cgroup");
    std::fs::create_dir_all(&root)?;
    std::fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc dmem\n",
    )?;
    Ok(CgroupConfig {
        root,
        driver: CgroupDriver::Cgroupfs,
    })
}

/// Where pod `uid`'s cgroup is under `cgroup_root`: found as the driver finds it, else
/// (not made yet, or gone) where a BestEffort pod's would be.
pub fn pod_cgroup(cgroup_root: &Path, uid: &str) -> PathBuf {
    hami_amd_plugin::dmem::find_pod_cgroup(cgroup_root, uid).unwrap_or_else(|| {
        let layout = Layout {
            driver: CgroupDriver::Cgroupfs,
        };
        cgroup_root.join(layout.pod(Qos::BestEffort, uid))
    })
}

/// Whether the driver has published node `name`'s ResourceSlices.
pub async fn slices_published(client: &Client, name: &str) -> bool {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices.list(&ListParams::default()).await.is_ok_and(|l| {
        l.items
            .iter()
            .any(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(name))
    })
}

/// One example file: its pod and, for a DRA example, the ResourceClaimTemplates before it.
pub struct ExampleDocuments {
    /// The pod (the file's last document).
    pub pod: Pod,
    /// `Some` when the file has more than one document: the ResourceClaimTemplates.
    pub templates: Option<Vec<ResourceClaimTemplate>>,
}

/// Parses an example file: one Pod, or ResourceClaimTemplates then one Pod (`---`-separated).
///
/// # Errors
/// Invalid YAML, a document of another kind, or not exactly one Pod last.
pub fn example_documents(file: &str, text: &str) -> anyhow::Result<ExampleDocuments> {
    let yaml_error = |e: serde_saphyr::Error| {
        anyhow::anyhow!(
            "{file}: not valid YAML: {}",
            e.to_string().lines().next().unwrap_or_default()
        )
    };
    let multi = text.lines().any(|l| l.trim_end() == "---");
    let mut docs: Vec<Value> = if multi {
        serde_saphyr::from_str_multiple(text).map_err(yaml_error)?
    } else {
        vec![serde_saphyr::from_str(text).map_err(yaml_error)?]
    };
    let last = docs
        .pop()
        .ok_or_else(|| anyhow::anyhow!("{file}: no documents"))?;
    let pod: Pod =
        serde_json::from_value(last).map_err(|e| anyhow::anyhow!("{file}: not a Pod: {e}"))?;
    if !multi {
        return Ok(ExampleDocuments {
            pod,
            templates: None,
        });
    }
    let templates = docs
        .into_iter()
        .enumerate()
        .map(|(i, doc)| {
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            if kind != "ResourceClaimTemplate" {
                anyhow::bail!(
                    "{file}: document {} is a {kind:?}; only ResourceClaimTemplates may come before the Pod",
                    i + 1
                );
            }
            serde_json::from_value(doc).map_err(|e| {
                anyhow::anyhow!("{file}: document {} is not a ResourceClaimTemplate: {e}", i + 1)
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ExampleDocuments {
        pod,
        templates: Some(templates),
    })
}

/// Creates an example's ResourceClaimTemplates (in their namespace, `default` if none).
///
/// # Errors
/// When the API server refuses one.
pub async fn create_templates(
    client: &Client,
    file: &str,
    templates: Vec<ResourceClaimTemplate>,
    progress: &mut Progress<'_>,
) -> anyhow::Result<()> {
    for t in templates {
        let ns = t.namespace().unwrap_or_else(|| "default".into());
        let name = t.name_any();
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &t)
            .await
            .map_err(|e| {
                anyhow::anyhow!("{file}: cannot create ResourceClaimTemplate {name}: {e}")
            })?;
        progress.step(format!(
            "created ResourceClaimTemplate {ns}/{name} ({file})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_pod_file_has_no_templates() {
        let docs = example_documents(
            "a.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n",
        )
        .unwrap();
        assert_eq!(docs.pod.name_any(), "a");
        assert!(docs.templates.is_none());
    }

    #[test]
    fn the_dra_example_has_its_template_then_its_pod() {
        let text = include_str!("../../../examples/10-dra-slice.yaml");
        let docs = example_documents("10-dra-slice.yaml", text).unwrap();
        let templates = docs.templates.unwrap();
        assert_eq!(templates.len(), 1);
        let claims = docs.pod.spec.unwrap().resource_claims.unwrap();
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some(templates[0].name_any().as_str())
        );
    }

    #[test]
    fn other_documents_before_the_pod_are_refused() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n";
        let err = example_documents("b.yaml", text).err().unwrap().to_string();
        assert!(err.contains("document 1 is a \"ConfigMap\""), "{err}");
        let err = example_documents("c.yaml", "a: [")
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("c.yaml: not valid YAML"), "{err}");
    }
}
