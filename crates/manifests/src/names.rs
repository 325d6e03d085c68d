//! Object names, ports and paths shared by the typed manifests, the Helm chart (through the
//! agreement test) and the docs.

pub const APP_LABEL: &str = "app.kubernetes.io/name";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const APP: &str = "hami-rs";

pub const SCHEDULER: &str = "hami-scheduler";
pub const DEVICE_PLUGIN: &str = "hami-device-plugin";
pub const MONITOR: &str = "hami-monitor";
pub const NODE_LABELLER: &str = "hami-node-labeller";
/// The read-only web UI (binary `hami-webui` in the scheduler image).
pub const WEBUI: &str = "hami-webui";
pub const CERTGEN: &str = "hami-certgen";

pub const SCHEDULER_LEASE: &str = "hami-scheduler";
pub const KUBE_SCHEDULER_LEASE: &str = "hami-kube-scheduler";
pub const KUBE_SCHEDULER_CONFIG: &str = "hami-kube-scheduler-config";
pub const TLS_SECRET: &str = "hami-scheduler-tls";
/// cert-manager mode: the CA that signs the serving and the client certificates.
pub const CA_SECRET: &str = "hami-scheduler-ca";
/// cert-manager mode: the client certificate of kube-scheduler and of forwarding replicas.
pub const CLIENT_TLS_SECRET: &str = "hami-scheduler-client-tls";
pub const CLIENT_TLS_MOUNT: &str = "/tls-client";
pub const WEBHOOK: &str = "hami-webhook";
pub const WEBHOOK_NAME: &str = "vgpu.hami.io";
pub const WEBHOOK_PATH: &str = "/webhook";
/// Label (on namespaces and pods) that keeps the webhook away.
pub const WEBHOOK_IGNORE_LABEL: &str = "hami.io/webhook";

/// The extender's HTTPS port in the pod (filter, bind, webhook, health); unprivileged.
pub const SCHEDULER_HTTPS_PORT: i32 = 8443;
/// The extender listener (/filter, /bind): kube-scheduler beside it on 127.0.0.1, and
/// followers forwarding to the leader's pod IP (mutual TLS). Never in the Service.
pub const EXTENDER_PORT: i32 = 8444;
/// The Service port the API server calls the webhook on.
pub const SERVICE_HTTPS_PORT: i32 = 443;
pub const SCHEDULER_METRICS_PORT: i32 = 9395;
pub const MONITOR_METRICS_PORT: i32 = 9394;
/// The web UI's HTTP port in the pod; its Service serves it on 80.
pub const WEBUI_PORT: i32 = 8088;

pub const TLS_MOUNT: &str = "/tls";
pub const KUBE_SCHEDULER_CONFIG_MOUNT: &str = "/config";
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where the node image carries the hook.
pub const HOOK_IN_IMAGE: &str = "/opt/hami/lib/amd/libamvgpu.so";

/// The NVIDIA plugin and its hook.
pub const NVIDIA_DEVICE_PLUGIN: &str = "hami-nvidia-device-plugin";
pub const NVIDIA_HOOK_IN_IMAGE: &str = "/opt/hami/lib/nvidia/libvgpu.so";

// The extender's managed resources are `hami_protocol::names::managed_resources()` (one
// table, so a resource added there reaches kube-scheduler's config and the webhook).
