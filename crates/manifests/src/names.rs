//! Object names, ports and paths shared by the typed manifests, the Helm chart (through the
//! agreement test) and the docs.

/// Label every object carries, valued [`APP`].
pub const APP_LABEL: &str = "app.kubernetes.io/name";
/// Label naming the object's component (scheduler, device plugin, …).
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The installation's name.
pub const APP: &str = "hami-rs";

/// The scheduler's Deployment, ServiceAccount and Service.
pub const SCHEDULER: &str = "hami-scheduler";
/// The AMD device plugin's DaemonSet and ServiceAccount.
pub const DEVICE_PLUGIN: &str = "hami-device-plugin";
/// The monitor's DaemonSet and ServiceAccount.
pub const MONITOR: &str = "hami-monitor";
/// The node labeller's DaemonSet and ServiceAccount.
pub const NODE_LABELLER: &str = "hami-node-labeller";
/// The read-only web UI (binary `hami-webui` in the scheduler image).
pub const WEBUI: &str = "hami-webui";
/// The certificate generator Jobs (`tls.mode: certgen`).
pub const CERTGEN: &str = "hami-certgen";

/// The scheduler replicas' leader-election Lease.
pub const SCHEDULER_LEASE: &str = "hami-scheduler";
/// The kube-scheduler sidecars' leader-election Lease.
pub const KUBE_SCHEDULER_LEASE: &str = "hami-kube-scheduler";
/// The ConfigMap holding the `KubeSchedulerConfiguration`.
pub const KUBE_SCHEDULER_CONFIG: &str = "hami-kube-scheduler-config";
/// The Secret of the scheduler's serving certificate.
pub const TLS_SECRET: &str = "hami-scheduler-tls";
/// cert-manager mode: the CA that signs the serving and the client certificates.
pub const CA_SECRET: &str = "hami-scheduler-ca";
/// cert-manager mode: the client certificate of kube-scheduler and of forwarding replicas.
pub const CLIENT_TLS_SECRET: &str = "hami-scheduler-client-tls";
/// Where the client certificate is mounted in the scheduler pod.
pub const CLIENT_TLS_MOUNT: &str = "/tls-client";
/// The webhook's Service.
pub const WEBHOOK: &str = "hami-webhook";
/// The mutating webhook's name.
pub const WEBHOOK_NAME: &str = "vgpu.hami.io";
/// The path the webhook is served on.
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
/// The scheduler's `/metrics` port.
pub const SCHEDULER_METRICS_PORT: i32 = 9395;
/// The monitor's `/metrics` port.
pub const MONITOR_METRICS_PORT: i32 = 9394;
/// The web UI's HTTP port in the pod; its Service serves it on 80.
pub const WEBUI_PORT: i32 = 8088;

/// Where the serving certificate is mounted in the scheduler pod.
pub const TLS_MOUNT: &str = "/tls";
/// Where the kube-scheduler configuration is mounted.
pub const KUBE_SCHEDULER_CONFIG_MOUNT: &str = "/config";
/// Kubelet's device-plugin directory, mounted into the plugins.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where the node image carries the hook.
pub const HOOK_IN_IMAGE: &str = "/opt/hami/lib/amd/libamvgpu.so";

/// The AMD DRA driver's DaemonSet and ServiceAccount (`draPlugin.enabled`).
pub const DRA_PLUGIN: &str = "hami-amdgpu-dra-plugin";
/// The DRA driver's name, also the name of the DeviceClass selecting its devices.
pub use hami_protocol::dra::DRIVER as DRA_DRIVER;
/// The node label choosing DRA for a node (KEP-5004: never the device plugin and DRA for
/// `amd.com/gpu` on one node) and its DRA value.
pub use hami_protocol::dra::{AMD_MODE_DRA, AMD_MODE_LABEL};
/// Kubelet's plugin registration directory (the DRA driver registers there).
pub const PLUGINS_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Kubelet's plugin directory; the DRA driver's socket is in `<this>/<driver>`.
pub const KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// The NVIDIA plugin and its hook.
pub const NVIDIA_DEVICE_PLUGIN: &str = "hami-nvidia-device-plugin";
/// Where the node image carries the NVIDIA hook.
pub const NVIDIA_HOOK_IN_IMAGE: &str = "/opt/hami/lib/nvidia/libvgpu.so";

// The extender's managed resources are `hami_protocol::names::managed_resources()` (one
// table, so a resource added there reaches kube-scheduler's config and the webhook).
