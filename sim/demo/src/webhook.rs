//! The webhook configuration the demo (and the chaos stack) register on the embedded API
//! server for a scheduler they run themselves: what ships, pointed at that scheduler.
//!
//! The default rendering (the chart's default Kubernetes version): `matchConditions` keep
//! the main webhook to GPU pods and scheduler-owned annotations, with `failurePolicy: Fail`,
//! plus the D-4 guard webhook for annotated pods the main one's selectors leave out. The
//! embedded API server compiles and evaluates those conditions as a real one does.

use hami_manifests::{Settings, objects};
use serde_json::Value;

/// The shipped webhook configuration (default settings) for the scheduler serving HTTPS at
/// `base_url` with a certificate signed by `ca_pem`.
///
/// # Errors
/// If the configuration does not serialise (never for the shipped object).
pub fn configuration(base_url: &str, ca_pem: &[u8]) -> anyhow::Result<Value> {
    Ok(objects::webhook_at(&Settings::default(), base_url, ca_pem).to_value()?)
}
