//! Reading the ResourceClaim the kubelet names (it sends only namespace, name and UID).

use std::future::Future;

use hami_dra_core::api::ResourceClaim;
use kube::api::{Api, ApiResource, DynamicObject};

/// Where claims come from: the API server in production.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`; the error says why it cannot be read.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;
}

/// `resource.k8s.io/v1` ResourceClaims through kube's dynamic API, decoded into our own
/// types (the workspace's k8s-openapi feature has no resource.k8s.io/v1).
#[derive(Clone)]
pub struct KubeClaims {
    /// The API client.
    pub client: kube::Client,
}

/// kube's description of `resource.k8s.io/v1` ResourceClaims.
pub fn resource_claims() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: hami_dra_core::api::API_VERSION.into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource_claims());
        let obj = api
            .get(name)
            .await
            .map_err(|e| format!("reading ResourceClaim {namespace}/{name}: {e}"))?;
        let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
        serde_json::from_value(value).map_err(|e| {
            format!("ResourceClaim {namespace}/{name} is not a resource.k8s.io/v1 claim: {e}")
        })
    }
}
