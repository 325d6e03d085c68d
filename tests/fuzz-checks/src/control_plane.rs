//! Checks of what the scheduler accepts over HTTP: kube-scheduler's extender JSON (any key
//! case, as Go decodes it) and AdmissionReview bodies from the API server.

use hami_scheduler_core::admission::WebhookConfig;
use hami_scheduler_core::extender::{ExtenderArgs, ExtenderBindingArgs, from_json_any_case};

/// Extender filter and bind arguments: total; what decodes has a consistent candidate list.
pub fn extender_json(data: &[u8]) {
    if let Ok(args) = from_json_any_case::<ExtenderArgs>(data) {
        let _ = hami_scheduler_core::extender::candidate_names(&args);
    }
    let _ = from_json_any_case::<ExtenderBindingArgs>(data);
}

/// AdmissionReview: any body gets an HTTP answer, never a panic; a 200 carries a response.
pub fn admission_review(data: &[u8]) {
    let (status, body) = hami_scheduler_core::review_codec::review(data, &WebhookConfig::default());
    if (200..300).contains(&status) {
        assert!(
            body.get("response").is_some(),
            "a 200 answer carries a response"
        );
    }
}
