//! Helpers shared by the simulated kube-scheduler's integration tests.

use serde_json::{Value, json};

/// The AMD DRA driver's name.
pub(crate) const DRIVER: &str = hami_dra_core::DRIVER;

/// Creates `v` through `api`.
pub(crate) async fn create<K>(api: &kube::Api<K>, v: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(
        &kube::api::PostParams::default(),
        &serde_json::from_value(v).unwrap(),
    )
    .await
    .unwrap();
}

/// The node's ResourceSlice: one shared MI210-sized device (64Gi, 104 CUs, 10 shares), as
/// the driver publishes it.
pub(crate) fn slice(node: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
    "metadata": {"name": format!("{node}-{DRIVER}")},
    "spec": {"driver": DRIVER, "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0", "allowMultipleAllocations": true, "capacity": {
            "memory": {"value": "64Gi", "requestPolicy": {"default": "64Gi",
                "validRange": {"min": "1Mi", "max": "64Gi", "step": "1Mi"}}},
            "computeUnits": {"value": "104", "requestPolicy": {"default": "104",
                "validRange": {"min": "1", "max": "104", "step": "1"}}},
            "shares": {"value": "10", "requestPolicy": {"default": "1",
                "validRange": {"min": "1", "max": "10", "step": "1"}}},
        }}]}})
}
