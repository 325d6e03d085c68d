//! The webhook configuration the demo (and the chaos stack) register on the embedded API
//! server for a scheduler they run themselves: what ships, pointed at that scheduler.
//!
//! The 1.27 rendering, because that server (like a 1.27 one) evaluates no
//! `matchConditions`: the 1.28+ rendering's D-4 guard webhook, which relies on them to see
//! only annotated pods, would see every pod there. With `failurePolicy: Fail`, the operator's
//! choice for 1.27 that makes the webhook required, as the demo's flows expect.

use hami_manifests::{KubeVersion, Settings, objects};
use serde_json::Value;

/// The shipped 1.27 webhook configuration (failure policy `Fail`) for the scheduler serving
/// HTTPS at `base_url` with a certificate signed by `ca_pem`.
///
/// # Errors
/// If the configuration does not serialise (never for the shipped object).
pub fn configuration(base_url: &str, ca_pem: &[u8]) -> anyhow::Result<Value> {
    let mut settings = Settings {
        kube_version: KubeVersion::parse("v1.27.0").map_err(anyhow::Error::msg)?,
        ..Settings::default()
    };
    settings
        .values
        .webhook
        .failure_policy_without_match_conditions = "Fail".into();
    Ok(objects::webhook_at(&settings, base_url, ca_pem).to_value()?)
}
