//! Object names, ports and paths shared by the typed manifests, the Helm chart (through the
//! agreement test) and the docs.

pub const APP_LABEL: &str = "app.kubernetes.io/name";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const APP: &str = "hami-rs";

pub const SCHEDULER: &str = "hami-scheduler";
pub const DEVICE_PLUGIN: &str = "hami-device-plugin";
pub const MONITOR: &str = "hami-monitor";
pub const NODE_LABELLER: &str = "hami-node-labeller";
pub const CERTGEN: &str = "hami-certgen";

pub const SCHEDULER_LEASE: &str = "hami-scheduler";
pub const KUBE_SCHEDULER_LEASE: &str = "hami-kube-scheduler";
pub const KUBE_SCHEDULER_CONFIG: &str = "hami-kube-scheduler-config";
pub const TLS_SECRET: &str = "hami-scheduler-tls";
pub const WEBHOOK: &str = "hami-webhook";
pub const WEBHOOK_NAME: &str = "vgpu.hami.io";
pub const WEBHOOK_PATH: &str = "/webhook";
/// Label (on namespaces and pods) that keeps the webhook away.
pub const WEBHOOK_IGNORE_LABEL: &str = "hami.io/webhook";

/// The extender's HTTPS port in the pod (filter, bind, webhook, health); unprivileged.
pub const SCHEDULER_HTTPS_PORT: i32 = 8443;
/// The Service port the API server calls the webhook on.
pub const SERVICE_HTTPS_PORT: i32 = 443;
pub const SCHEDULER_METRICS_PORT: i32 = 9395;
pub const MONITOR_METRICS_PORT: i32 = 9394;

pub const TLS_MOUNT: &str = "/tls";
pub const KUBE_SCHEDULER_CONFIG_MOUNT: &str = "/config";
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where the node image carries the hook.
pub const HOOK_IN_IMAGE: &str = "/opt/hami/lib/amd/libamvgpu.so";

/// Resources kube-scheduler hands to the extender and must not count itself.
pub const MANAGED_RESOURCES: &[&str] = &[
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
    "amd.com/gpu",
    "amd.com/gpumem",
    "amd.com/gpucores",
];
