//! The fixed table of resource types this server serves, as discovery and routing see them.

/// One served resource type (a "GroupVersionResource" plus what discovery needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// The API group, empty for the core group.
    pub group: &'static str,
    /// The version served (one per type).
    pub version: &'static str,
    /// The URL name (`pods`).
    pub plural: &'static str,
    /// The name kubectl also accepts (`pod`).
    pub singular: &'static str,
    /// The `kind` of its objects (`Pod`).
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl's short names (`po`), advertised in discovery.
    pub short_names: &'static [&'static str],
    /// Subresources served under `<plural>/<name>/<sub>`.
    pub subresources: &'static [&'static str],
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `kind` of a list of these objects (`PodList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The group-resource string used in Status details and messages, e.g. `pods` or `leases.coordination.k8s.io`.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// A stable small identifier used as a storage key.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }
}

const fn rt(
    (group, version): (&'static str, &'static str),
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    subresources: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        subresources,
    }
}

/// Every resource type served. Order is the discovery order.
pub static RESOURCES: &[ResourceType] = &[
    rt(
        ("", "v1"),
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        &["status"],
    ),
    rt(
        ("", "v1"),
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        &["status"],
    ),
    rt(
        ("", "v1"),
        "pods",
        "pod",
        "Pod",
        true,
        &["po"],
        &["status", "binding", "eviction"],
    ),
    rt(("", "v1"), "events", "event", "Event", true, &["ev"], &[]),
    rt(
        ("", "v1"),
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        &[],
    ),
    rt(("", "v1"), "secrets", "secret", "Secret", true, &[], &[]),
    rt(
        ("", "v1"),
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
        &["quota"],
        &["status"],
    ),
    rt(
        ("", "v1"),
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        &["token"],
    ),
    rt(
        ("coordination.k8s.io", "v1"),
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        &[],
    ),
    rt(
        ("events.k8s.io", "v1"),
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        &[],
    ),
    rt(
        ("rbac.authorization.k8s.io", "v1"),
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        &[],
    ),
    rt(
        ("rbac.authorization.k8s.io", "v1"),
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
    ),
    rt(
        ("rbac.authorization.k8s.io", "v1"),
        "roles",
        "role",
        "Role",
        true,
        &[],
        &[],
    ),
    rt(
        ("rbac.authorization.k8s.io", "v1"),
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        &[],
    ),
    rt(
        ("admissionregistration.k8s.io", "v1"),
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
        &[],
        &[],
    ),
    // resource.k8s.io/v1 (DRA, GA in 1.34): what a DRA driver, kube-scheduler and the
    // resourceclaim controller read and write. Only claims have a status subresource upstream.
    rt(
        ("resource.k8s.io", "v1"),
        "deviceclasses",
        "deviceclass",
        "DeviceClass",
        false,
        &[],
        &[],
    ),
    rt(
        ("resource.k8s.io", "v1"),
        "resourceslices",
        "resourceslice",
        "ResourceSlice",
        false,
        &[],
        &[],
    ),
    rt(
        ("resource.k8s.io", "v1"),
        "resourceclaims",
        "resourceclaim",
        "ResourceClaim",
        true,
        &[],
        &["status"],
    ),
    rt(
        ("resource.k8s.io", "v1"),
        "resourceclaimtemplates",
        "resourceclaimtemplate",
        "ResourceClaimTemplate",
        true,
        &[],
        &[],
    ),
    // policy/v1: the scheduler's preempt verb counts PodDisruptionBudget violations.
    rt(
        ("policy", "v1"),
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        &["status"],
    ),
];

/// The served groups other than the core group, in discovery order (one version each).
pub fn named_groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Looks a resource type up by group, version and plural name.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Looks a resource type up by apiVersion and kind (as found in an object or a YAML file).
pub fn lookup_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// Whether the group/version pair is served at all.
pub fn group_version_served(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
}

/// The resource types of one group/version.
pub fn in_group_version(group: &str, version: &str) -> Vec<&'static ResourceType> {
    RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        for r in RESOURCES {
            assert_eq!(lookup(r.group, r.version, r.plural), Some(r));
            assert_eq!(
                lookup_kind(&r.api_version(), r.kind).map(|x| x.plural),
                Some(r.plural)
            );
        }
        assert!(lookup("", "v1", "deployments").is_none());
        assert_eq!(
            lookup("events.k8s.io", "v1", "events")
                .unwrap()
                .group_resource(),
            "events.events.k8s.io"
        );
        assert_eq!(named_groups().len(), 6);
        assert_eq!(
            lookup("resource.k8s.io", "v1", "resourceclaims")
                .unwrap()
                .group_resource(),
            "resourceclaims.resource.k8s.io"
        );
    }
}
