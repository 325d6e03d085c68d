//! Least privilege: the API calls each component's code makes, as RBAC rules. Each rule
//! names the code that needs it; the end-to-end test (`tests/system/tests/it/least_privilege.rs`) runs the
//! components under these rules on the embedded API server and checks both directions:
//! nothing is denied, and every verb granted was used.

use k8s_openapi::api::rbac::v1::PolicyRule;

use crate::names;
use crate::settings::Settings;

fn rule(group: &str, resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        non_resource_urls: None,
    }
}

/// Cluster-wide rules of the scheduler extender + webhook (`hami-scheduler`).
pub fn scheduler_cluster_rules() -> Vec<PolicyRule> {
    vec![
        // informer.rs: node watch (list/watch); plugin-core node_lock_client.rs (used by
        // bind): node lock get + patch.
        rule("", &["nodes"], &["get", "list", "watch", "patch"], &[]),
        // runtime.rs: pod informer (list/watch), filter annotations + bind-phase (patch),
        // the pod at bind (get); node_lock_client.rs: lock owner (get).
        rule("", &["pods"], &["get", "list", "watch", "patch"], &[]),
        // runtime.rs: bind.
        rule("", &["pods/binding"], &["create"], &[]),
        // runtime.rs: kube-runtime Recorder (FilteringSucceed/Failed, BindingFailed).
        rule("events.k8s.io", &["events"], &["create", "patch"], &[]),
        // preempt.rs: the PodDisruptionBudget reflector (the preempt verb counts
        // violations as kube-scheduler does).
        rule("policy", &["poddisruptionbudgets"], &["list", "watch"], &[]),
        // informer.rs: the ResourceQuota watch (HAMi's quota keys, issue 30); its
        // QuotaExceeded and QuotaValueIgnored Events use the events rule above.
        rule("", &["resourcequotas"], &["list", "watch"], &[]),
    ]
}

/// The scheduler's extra cluster-wide rules in the DRA mode (`draPlugin.enabled`; also
/// pods annotated `hami.io/amd-mode=dra`): dra_templates.rs watches the driver's
/// ResourceSlices (reflector: list/watch; the device shapes percentages need), creates the
/// claim templates the webhook names (create; get to compare an existing one, patch to
/// stamp it as in use so a sweeper racing the reuse keeps it), and its sweeper lists them
/// and deletes the unused ones (list, delete; the pods of their namespaces are listed with
/// the pods rule above).
pub fn scheduler_dra_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            "resource.k8s.io",
            &["resourceslices"],
            &["list", "watch"],
            &[],
        ),
        rule(
            "resource.k8s.io",
            &["resourceclaimtemplates"],
            &["get", "list", "create", "patch", "delete"],
            &[],
        ),
    ]
}

/// Leader election in the release namespace: the extender's Lease (leader.rs) and the
/// kube-scheduler sidecar's (same pod, same service account; its other rights come from the
/// built-in `system:kube-scheduler` and `system:volume-scheduler` ClusterRoles, which only
/// cover a Lease named `kube-scheduler`).
pub fn scheduler_lease_rules() -> Vec<PolicyRule> {
    vec![
        // create cannot be limited by name (the name is in the body).
        rule("coordination.k8s.io", &["leases"], &["create"], &[]),
        rule(
            "coordination.k8s.io",
            &["leases"],
            &["get", "update"],
            &[names::SCHEDULER_LEASE, names::KUBE_SCHEDULER_LEASE],
        ),
    ]
}

/// Cluster-wide rules of the AMD device plugin (`k8s-device-plugin`).
pub fn device_plugin_cluster_rules(settings: &Settings) -> Vec<PolicyRule> {
    let mut rules = vec![
        // node_publisher.rs: read + annotate its Node; kube_shell.rs: node lock get + release.
        rule("", &["nodes"], &["get", "patch"], &[]),
        // plugin-core node_pods.rs: pods of this node (list + watch with spec.nodeName), a
        // lock owner the watch has not shown (get); allocate_shell.rs: cu-allocated +
        // bind-phase (patch); node_publisher.rs: CUs in use (list).
        rule("", &["pods"], &["get", "list", "watch", "patch"], &[]),
    ];
    if settings.values.device_plugin.report_node_capacity {
        // node_publisher.rs: -report_node_capacity writes capacity/allocatable.
        rules.push(rule("", &["nodes/status"], &["patch"], &[]));
    }
    rules
}

/// Cluster-wide rules of the NVIDIA device plugin (`nvidia-device-plugin`): the same API
/// calls through plugin-core (node lock, pod choice and commit) and its own publisher.
pub fn nvidia_device_plugin_cluster_rules(settings: &Settings) -> Vec<PolicyRule> {
    let mut rules = vec![
        // node_publisher.rs: annotate its Node; plugin-core pod_commit.rs: node lock get +
        // release (patch).
        rule("", &["nodes"], &["get", "patch"], &[]),
        // plugin-core node_pods.rs: the node's pods (list + watch with spec.nodeName), a lock
        // owner the watch has not shown (get); allocate_shell.rs: the pod commit (patch).
        rule("", &["pods"], &["get", "list", "watch", "patch"], &[]),
    ];
    if settings.values.nvidia_device_plugin.report_node_capacity {
        // node_publisher.rs: --report-node-capacity writes capacity/allocatable.
        rules.push(rule("", &["nodes/status"], &["patch"], &[]));
    }
    rules
}

/// node_publisher.rs records AMDGPU* Events in `default` (they concern Nodes, which have no
/// namespace; `default` is where kubectl looks for them). A Role there, not cluster-wide.
pub fn device_plugin_event_rules() -> Vec<PolicyRule> {
    vec![rule("", &["events"], &["create"], &[])]
}

/// The NVIDIA plugin's `xid_watch.rs` records NVIDIAGPUUnhealthy/Recovered Node Events in
/// `default`, as the AMD plugin does: the same Role rules, bound to its own account.
pub fn nvidia_device_plugin_event_rules() -> Vec<PolicyRule> {
    device_plugin_event_rules()
}

/// Cluster-wide rules of the AMD DRA driver (crates/amdgpu-dra-plugin): `slice_publisher.rs`
/// reads its Node (the slices' owner) and lists, creates, replaces and deletes its
/// ResourceSlices; `claims.rs` reads the claims kubelet prepares and writes their
/// `status.devices` (GET then a conditional merge patch of the status subresource).
pub fn dra_plugin_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule("", &["nodes"], &["get"], &[]),
        rule(
            "resource.k8s.io",
            &["resourceslices"],
            &["list", "create", "update", "delete"],
            &[],
        ),
        rule("resource.k8s.io", &["resourceclaims"], &["get"], &[]),
        rule(
            "resource.k8s.io",
            &["resourceclaims/status"],
            &["patch"],
            &[],
        ),
    ]
}

/// Cluster-wide rules of the monitor: pods.rs watches the pods of its node, and
/// [`monitor_event_rules`].
pub fn monitor_cluster_rules() -> Vec<PolicyRule> {
    let mut rules = vec![rule("", &["pods"], &["list", "watch"], &[])];
    rules.extend(monitor_event_rules());
    rules
}

/// Part of [`monitor_cluster_rules`]: hook_check.rs `post_event` records a
/// `SliceNotEnforced` Warning Event (core v1) on a pod whose GPU process runs without its
/// memory hook (issue 29). Events go in the pod's namespace, hence cluster-wide.
pub fn monitor_event_rules() -> Vec<PolicyRule> {
    vec![rule("", &["events"], &["create"], &[])]
}

/// The monitor's extra rules in the DRA mode (`draPlugin`): dra_fetch.rs gets the
/// ResourceClaims its node's pods use and lists the driver's ResourceSlices (for the
/// devices' `uuid` attribute).
pub fn monitor_dra_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule("resource.k8s.io", &["resourceclaims"], &["get"], &[]),
        rule("resource.k8s.io", &["resourceslices"], &["list"], &[]),
    ]
}

/// Cluster-wide rules of the web UI: its watchers (crates/webui/src/watch.rs) list and
/// watch nodes, pods and both Event APIs, and the defrag preview (crates/webui/src/
/// defrag_view.rs) lists the PodDisruptionBudgets once per plan (no watch); no write verb.
pub fn webui_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule("", &["nodes", "pods", "events"], &["list", "watch"], &[]),
        rule("events.k8s.io", &["events"], &["list", "watch"], &[]),
        rule("policy", &["poddisruptionbudgets"], &["list"], &[]),
    ]
}

/// The web UI's extra rules in the DRA mode (`draPlugin`, which also passes it `--dra`):
/// its DRA watchers list and watch the driver's ResourceSlices and the ResourceClaims its
/// DRA nodes' and pods' pages show. Without the DRA mode the UI starts no such watch and
/// holds no read of any claim.
pub fn webui_dra_cluster_rules() -> Vec<PolicyRule> {
    vec![rule(
        "resource.k8s.io",
        &["resourceslices", "resourceclaims"],
        &["list", "watch"],
        &[],
    )]
}

/// Cluster-wide rules of the node labeller: main.rs reads and labels its Node.
pub fn node_labeller_cluster_rules() -> Vec<PolicyRule> {
    vec![rule("", &["nodes"], &["get", "patch"], &[])]
}

/// kube-webhook-certgen `create` (the TLS Secret) in the release namespace.
pub fn certgen_namespace_rules() -> Vec<PolicyRule> {
    vec![
        rule("", &["secrets"], &["create"], &[]),
        rule("", &["secrets"], &["get"], &[names::TLS_SECRET]),
    ]
}

/// kube-webhook-certgen `patch` (the caBundle of our webhook configuration only).
pub fn certgen_cluster_rules() -> Vec<PolicyRule> {
    vec![rule(
        "admissionregistration.k8s.io",
        &["mutatingwebhookconfigurations"],
        &["get", "update"],
        &[names::WEBHOOK],
    )]
}
