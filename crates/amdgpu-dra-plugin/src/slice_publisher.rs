//! Publishing the node's ResourceSlices (issue 20 item 2), what the Go helper's
//! `PublishResources` does for a Go driver: from discovery, dra-core's `slice` builds the
//! pool; this reconciles the API server towards it. Slices are owned by the Node (GC'd with
//! it); an unchanged pool writes nothing (no resourceVersion churn, no generation bump);
//! unhealthy devices stay, tainted; slices of this driver and node that the pool no longer
//! has are deleted after the others are written (the scheduler uses only the newest
//! generation, so an old slice left for a moment is ignored, never double-counted).

use std::path::PathBuf;
use std::time::Duration;

use hami_amd_discovery::registration::RegistrationSettings;
use hami_dra_core::api::{API_VERSION, ResourceSlice};
use hami_dra_core::slice::{self, NodeRef};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};

/// kube's description of `resource.k8s.io/v1` ResourceSlices.
pub fn resource_slices() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: API_VERSION.into(),
        kind: "ResourceSlice".into(),
        plural: "resourceslices".into(),
    }
}

/// What one reconcile did (slice names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// The pool generation the slices carry now.
    pub generation: i64,
    /// Slices created.
    pub created: Vec<String>,
    /// Slices replaced (their content changed).
    pub updated: Vec<String>,
    /// Stale slices of this driver and node deleted.
    pub deleted: Vec<String>,
}

impl Published {
    /// Whether the API server was written to at all.
    pub fn wrote(&self) -> bool {
        !(self.created.is_empty() && self.updated.is_empty() && self.deleted.is_empty())
    }
}

/// The publisher of one node's pool.
pub struct SlicePublisher {
    /// The API client.
    pub client: kube::Client,
    /// The driver name (`spec.driver`).
    pub driver: String,
    /// The node (also the pool name).
    pub node: String,
    /// Where sysfs is mounted.
    pub sysfs_root: PathBuf,
    /// Where `/dev` is mounted (the health check's device nodes).
    pub dev_root: PathBuf,
    /// How GPUs become registered devices (the same as Prepare's).
    pub settings: RegistrationSettings,
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// The index a slice name of ours ends with (`<node>-<driver>-<i>`), for ordering.
fn slice_index(s: &ResourceSlice) -> u64 {
    s.metadata
        .name
        .as_deref()
        .and_then(|n| n.rsplit('-').next())
        .and_then(|i| i.parse().ok())
        .unwrap_or(u64::MAX)
}

impl SlicePublisher {
    /// The field selector of this node's slices of this driver.
    pub fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    /// This driver's slices for this node as the API server has them, in pool order.
    pub async fn current(&self) -> Result<Vec<ResourceSlice>, String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource_slices());
        // The server filters (as the Go helper asks): other nodes' slices are never sent
        // here, so a plugin cannot read, let alone change, them.
        let list = api
            .list(&ListParams::default().fields(&self.field_selector()))
            .await
            .map_err(|e| format!("listing ResourceSlices: {e}"))?;
        let mut out = Vec::new();
        for obj in list.items {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let spec = obj.data.get("spec");
            let field = |f: &str| spec.and_then(|s| s.get(f)).and_then(|v| v.as_str());
            // A server that ignored the selector must not make us touch others' slices.
            if field("driver") != Some(self.driver.as_str())
                || field("nodeName") != Some(self.node.as_str())
            {
                return Err(format!(
                    "the API server answered the field selector {:?} with slice {name} of another node or driver",
                    self.field_selector()
                ));
            }
            let value = serde_json::to_value(&obj).map_err(|e| e.to_string())?;
            match serde_json::from_value::<ResourceSlice>(value) {
                Ok(s) => out.push(s),
                // Ours by driver and node, but unreadable: replaced by a fresh one.
                Err(e) => {
                    tracing::warn!(slice = %name, "ResourceSlice is not a resource.k8s.io/v1 slice ({e}); deleting it");
                    api.delete(&name, &DeleteParams::default())
                        .await
                        .map_err(|e| format!("deleting unreadable ResourceSlice {name}: {e}"))?;
                }
            }
        }
        out.sort_by_key(slice_index);
        Ok(out)
    }

    /// One reconcile: rediscover, build the pool, write what differs.
    pub async fn refresh(&self) -> Result<Published, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.node)
            .await
            .map_err(|e| format!("cannot read node {}: {e}", self.node))?;
        let uid = node.metadata.uid.clone().ok_or_else(|| {
            format!(
                "node {} has no uid: cannot own ResourceSlices by it",
                self.node
            )
        })?;
        let report = hami_amd_plugin::discover_report::build_report(
            &self.sysfs_root,
            &self.dev_root,
            &self.settings,
        )?;
        for w in report
            .discovery
            .warnings
            .iter()
            .chain(&report.registration.warnings)
        {
            tracing::warn!("{w}");
        }
        let previous = self.current().await?;
        let devices = slice::devices(
            &report.discovery,
            &report.registration,
            &previous,
            &now_rfc3339(),
        )
        .map_err(|e| e.to_string())?;
        let node_ref = NodeRef {
            name: self.node.clone(),
            uid,
        };
        let desired = slice::build_slices(&self.driver, &node_ref, devices, &previous);
        self.apply(desired, previous).await
    }

    /// Writes `desired` over `previous` (this driver's slices of this node): creates,
    /// replaces what differs (with its resourceVersion: a concurrent writer is a conflict,
    /// retried at the next refresh), then deletes what is no longer in the pool.
    pub async fn apply(
        &self,
        desired: Vec<ResourceSlice>,
        previous: Vec<ResourceSlice>,
    ) -> Result<Published, String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource_slices());
        let mut out = Published {
            generation: desired.first().map_or(0, |s| s.spec.pool.generation),
            ..Published::default()
        };
        for want in &desired {
            let name = want.metadata.name.clone().unwrap_or_default();
            let have = previous
                .iter()
                .find(|p| p.metadata.name == want.metadata.name);
            let mut obj = want.clone();
            match have {
                Some(h)
                    if h.spec == want.spec
                        && h.metadata.owner_references == want.metadata.owner_references =>
                {
                    continue;
                }
                Some(h) => {
                    obj.metadata.resource_version = h.metadata.resource_version.clone();
                    obj.metadata.uid = h.metadata.uid.clone();
                    obj.metadata.labels = h.metadata.labels.clone();
                    api.replace(&name, &PostParams::default(), &dynamic(&obj)?)
                        .await
                        .map_err(|e| format!("updating ResourceSlice {name}: {e}"))?;
                    out.updated.push(name);
                }
                None => {
                    api.create(&PostParams::default(), &dynamic(&obj)?)
                        .await
                        .map_err(|e| format!("creating ResourceSlice {name}: {e}"))?;
                    out.created.push(name);
                }
            }
        }
        for old in &previous {
            if desired.iter().any(|d| d.metadata.name == old.metadata.name) {
                continue;
            }
            let name = old.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => out.deleted.push(name),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(format!("deleting stale ResourceSlice {name}: {e}")),
            }
        }
        if out.wrote() {
            tracing::info!(generation = out.generation, created = ?out.created, updated = ?out.updated, deleted = ?out.deleted, "published ResourceSlices");
        }
        Ok(out)
    }

    /// Reconciles every `interval` until `shutdown` resolves; a failed round is logged and
    /// retried at the next one (the API server may be briefly away).
    pub async fn run(self, interval: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            if let Err(e) = self.refresh().await {
                tracing::warn!(node = %self.node, "publishing ResourceSlices failed: {e}");
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

fn dynamic(s: &ResourceSlice) -> Result<DynamicObject, String> {
    serde_json::to_value(s)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("encoding ResourceSlice: {e}"))
}
