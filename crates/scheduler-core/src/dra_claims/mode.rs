//! Which front end serves a pod's AMD requests: the device plugin or the DRA driver.

use hami_protocol::dra::{AMD_MODE_ANNOTATION, AMD_MODE_DEVICE_PLUGIN, AMD_MODE_DRA};
use k8s_openapi::api::core::v1::Pod;

/// Which front end serves a pod's AMD requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AmdMode {
    /// The device plugin and the extender (today's behaviour).
    #[default]
    DevicePlugin,
    /// ResourceClaims for the AMD DRA driver.
    Dra,
}

impl AmdMode {
    /// Reads `device-plugin` or `dra`.
    pub fn parse(value: &str) -> Result<AmdMode, String> {
        match value {
            AMD_MODE_DEVICE_PLUGIN => Ok(AmdMode::DevicePlugin),
            AMD_MODE_DRA => Ok(AmdMode::Dra),
            other => Err(format!(
                "{other:?} is not an AMD mode: write {AMD_MODE_DEVICE_PLUGIN} or {AMD_MODE_DRA}"
            )),
        }
    }

    /// The spelling of [`AmdMode::parse`].
    pub const fn as_str(self) -> &'static str {
        match self {
            AmdMode::DevicePlugin => AMD_MODE_DEVICE_PLUGIN,
            AmdMode::Dra => AMD_MODE_DRA,
        }
    }

    /// The pod's mode: its `hami.io/amd-mode` annotation, else `default`.
    pub fn of_pod(pod: &Pod, default: AmdMode) -> Result<AmdMode, String> {
        match pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(AMD_MODE_ANNOTATION))
        {
            None => Ok(default),
            Some(v) => AmdMode::parse(v)
                .map_err(|e| format!("metadata.annotations[{AMD_MODE_ANNOTATION}]: {e}")),
        }
    }
}
