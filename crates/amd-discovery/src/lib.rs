//! What an AMD node has, read from sysfs only (no C library), and what it registers.
//!
//! Shared by the device plugin (which publishes it), the node labeller, the monitor (which
//! labels metrics with the same device ids) and the what-if planner (which builds fleets
//! from real captures). Pure readers over a sysfs root; no Kubernetes, no gRPC.
//!
//! - [`sysfs`]: small typed readers (properties files, integers, DRM minors).
//! - [`kfd_topology`]: `class/kfd/kfd/topology/nodes/*` (CUs, ids, links, memory banks).
//! - [`discovery`]: PCI cards, XCP partitions, XGMI peers, partition modes → `Discovery`.
//! - [`device_locator`]: which registered device (partition) a DRM client uses, by DRM minor
//!   (fdinfo `drm-pdev` alone cannot tell partitions of one card apart).
//! - [`registration`]: `Discovery` → `hami.io/node-amd-register` entries and kubelet ids,
//!   per operating mode (`cu`, `partition`), with the D-8 partition ids.

pub mod device_locator;
pub mod discovery;
pub mod kfd_topology;
pub mod registration;
pub mod sysfs;
