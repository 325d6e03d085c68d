//! The kubelet DRA plugin for AMD GPU slices (issue 20): the shell around `hami-dra-core`.
//! `registration` serves the plugin-registry socket (pluginregistration v1), `service` the
//! DRA v1 `NodePrepareResources`/`NodeUnprepareResources` on the plugin socket, `driver`
//! does the work (idempotent, serialised per claim, never holding its state lock across an
//! API call, checkpointed: `checkpoint` is the snapshot format, `checkpoint_store` the
//! journal that makes each change durable), `claims` reads ResourceClaims from the API
//! server (`kube_error` makes its errors one readable line), `slice_publisher` keeps the
//! node's ResourceSlices; `args` is the binary's command line.
//! The kubelet protos (DRA v1, plugin registration v1) are compiled in
//! `hami-deviceplugin-api`, with the device-plugin API; they are re-exported here because the
//! driver's API speaks their types.

pub use hami_deviceplugin_api::{dra_v1, pluginregistration};

pub mod args;
pub mod checkpoint;
pub mod checkpoint_store;
pub mod claims;
pub mod driver;
pub mod files;
pub mod kube_error;
pub mod registration;
pub mod service;
pub mod slice_publisher;
