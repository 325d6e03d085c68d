//! The installation as the typed manifests, the Helm chart and the docs give it: chart
//! agreement with real Helm (`peers`: the Helm and CEL peers in `tests/peers/`), install
//! order, images (and `scripts/build-images.sh`'s archives of them), the documented values
//! and the quota section's objects,
//! device-plugin mounts, the DRA driver's arguments, the scheduler's dashboard, the upstream
//! kube-scheduler config schema, and the webhook's match conditions.

mod chart_agreement;
mod device_plugin_mounts;
mod dra_plugin_args;
mod helm_install_order;
mod image_archives;
mod images;
mod install_doc_objects;
mod install_doc_values;
mod peers;
mod scheduler_dashboard;
mod upstream_config_schema;
mod webhook_match_conditions;
