//! The admission webhooks: the mutating webhook, the guard, their match conditions (CEL)
//! and failure policy.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::names::*;

use crate::settings::{Settings, TlsMode};

use super::*;

/// Name of the webhook's match condition: a GPU pod, or one carrying a scheduler-owned annotation.
pub const WEBHOOK_MATCH_CONDITION: &str = "gpu-pod-or-scheduler-annotation";

/// Name of the guard webhook's match condition: the pod carries a scheduler-owned annotation.
pub const GUARD_MATCH_CONDITION: &str = "carries-scheduler-annotation";

/// Name of the condition that lets the scheduler's and plugins' own writes through.
pub const NOT_A_WRITER_CONDITION: &str = "not-a-hami-writer";

/// The second webhook: D-4 everywhere, selectors or not.
pub const GUARD_WEBHOOK_NAME: &str = "guard.vgpu.hami.io";

/// The ServiceAccounts allowed to write scheduler-owned annotations (the scheduler's
/// default `annotationWriters`, `hami_scheduler::admission::ANNOTATION_WRITER_SERVICE_ACCOUNTS`).
pub const ANNOTATION_WRITERS: [&str; 3] = [SCHEDULER, DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN];

pub(super) fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

pub(super) fn carries_owned(var: &str) -> String {
    format!(
        "(has({var}.metadata.annotations) && {}.exists(a, a in {var}.metadata.annotations))",
        cel_list(hami_protocol::names::SCHEDULER_OWNED_ANNOTATIONS)
    )
}

/// The annotations no UPDATE but the writers' may set, change or remove: D-4's and those the
/// webhook writes into the creator's own CREATE (D-33: the DRA quota charge). Only D-4's are
/// looked for on CREATE ([`carries_owned`]): the guard runs after the main webhook and would
/// see the charge just patched in.
pub fn update_owned_annotations() -> Vec<&'static str> {
    use hami_protocol::names::{ADMISSION_WRITTEN_ANNOTATIONS, SCHEDULER_OWNED_ANNOTATIONS};
    SCHEDULER_OWNED_ANNOTATIONS
        .iter()
        .chain(ADMISSION_WRITTEN_ANNOTATIONS)
        .copied()
        .collect()
}

/// An UPDATE that sets, changes or removes one of [`update_owned_annotations`] (D-4 and D-33
/// on update); other updates (labels, finalizers, a controller's bookkeeping) never wait
/// for the scheduler. `oldObject` is null on CREATE, hence the operation test first.
pub(super) fn changes_owned() -> String {
    let value = |var: &str| {
        format!(
            "(has({var}.metadata.annotations) && a in {var}.metadata.annotations ? {var}.metadata.annotations[a] : '')"
        )
    };
    format!(
        "(request.operation == 'UPDATE' && {}.exists(a, {} != {}))",
        cel_list(&update_owned_annotations()),
        value("object"),
        value("oldObject")
    )
}

/// The CEL `matchConditions` expression of the main webhook: a CREATE of a pod that
/// requests (limits or requests, app or init containers) a resource of the protocol's
/// table or carries an annotation only the scheduler may set (D-4 must still see those on
/// plain pods), or an UPDATE that changes such an annotation.
pub fn webhook_match_expression() -> String {
    let resources = cel_list(&hami_protocol::names::managed_resources());
    let asks = "(has(c.resources) && ((has(c.resources.limits) && r in c.resources.limits) || (has(c.resources.requests) && r in c.resources.requests)))";
    format!(
        "(request.operation != 'UPDATE' && ({resources}.exists(r, object.spec.containers.exists(c, {asks}) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {asks}))) || {})) || {}",
        carries_owned("object"),
        changes_owned()
    )
}

/// The guard webhook's expression: a CREATE carrying a scheduler-owned annotation, or an
/// UPDATE changing one or the DRA quota charge.
pub fn guard_match_expression() -> String {
    format!(
        "(request.operation != 'UPDATE' && {}) || {}",
        carries_owned("object"),
        changes_owned()
    )
}

/// Our own components' writes never wait for the webhook (a scheduler outage must not
/// block the plugins' Allocate commits); the scheduler allows them anyway (D-4 writers).
pub fn not_a_writer_expression(settings: &Settings) -> String {
    let writers: Vec<String> = ANNOTATION_WRITERS
        .iter()
        .map(|sa| format!("system:serviceaccount:{}:{sa}", settings.namespace))
        .collect();
    let refs: Vec<&str> = writers.iter().map(String::as_str).collect();
    format!("!(request.userInfo.username in {})", cel_list(&refs))
}

pub(super) fn conditions(
    settings: &Settings,
    name: &str,
    expression: String,
) -> Option<Vec<MatchCondition>> {
    settings.kube_version.has_match_conditions().then(|| {
        vec![
            MatchCondition {
                name: s(NOT_A_WRITER_CONDITION),
                expression: not_a_writer_expression(settings),
            },
            MatchCondition {
                name: s(name),
                expression,
            },
        ]
    })
}

/// Fail where matchConditions narrow the webhook to GPU pods; elsewhere every pod would be
/// sent, and the operator's fallback applies.
pub fn webhook_failure_policy(settings: &Settings) -> String {
    if settings.kube_version.has_match_conditions() {
        s("Fail")
    } else {
        settings
            .values
            .webhook
            .failure_policy_without_match_conditions
            .clone()
    }
}

/// The mutating webhook (SPEC §3, D-4): GPU pods only (matchConditions) with `failurePolicy:
/// Fail`; pods and namespaces labelled `hami.io/webhook=ignore` are left alone.
pub fn webhook(settings: &Settings) -> Object {
    let ignore = LabelSelectorRequirement {
        key: s(WEBHOOK_IGNORE_LABEL),
        operator: s("NotIn"),
        values: Some(vec![s("ignore")]),
    };
    // With failurePolicy Fail, a scheduler outage must not block the control plane's own
    // pods (kube-system) nor ours (which the webhook would need to come back up).
    let namespaces = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![
            ignore.clone(),
            LabelSelectorRequirement {
                key: s("kubernetes.io/metadata.name"),
                operator: s("NotIn"),
                values: Some(vec![s("kube-system"), settings.namespace.clone()]),
            },
        ]),
    };
    let pods = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![ignore]),
    };
    let annotations = match settings.values.tls.mode {
        TlsMode::CertManager => Some(BTreeMap::from([(
            s("cert-manager.io/inject-ca-from"),
            format!("{}/{SCHEDULER}", settings.namespace),
        )])),
        TlsMode::Certgen => None,
    };
    Object::MutatingWebhookConfiguration(MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            annotations,
            ..meta(WEBHOOK, None, SCHEDULER)
        },
        webhooks: Some(webhooks(settings, namespaces, pods)),
    })
}

/// The shipped [`webhook`] configuration with every webhook's `clientConfig` pointed at the
/// scheduler listening at `base_url` (`https://host:port`; the webhook path is appended) and
/// trusting `ca_pem`, instead of the in-cluster Service: how tests and the demo register the
/// webhook of a scheduler they run themselves, so that they exercise what ships.
pub fn webhook_at(settings: &Settings, base_url: &str, ca_pem: &[u8]) -> Object {
    let mut object = webhook(settings);
    if let Object::MutatingWebhookConfiguration(config) = &mut object {
        for hook in config.webhooks.iter_mut().flatten() {
            hook.client_config = WebhookClientConfig {
                url: Some(format!("{base_url}{WEBHOOK_PATH}")),
                ca_bundle: Some(k8s_openapi::ByteString(ca_pem.to_vec())),
                service: None,
            };
        }
    }
    object
}

pub(super) fn webhooks(
    settings: &Settings,
    namespaces: LabelSelector,
    pods: LabelSelector,
) -> Vec<MutatingWebhook> {
    let client_config = WebhookClientConfig {
        service: Some(ServiceReference {
            name: s(SCHEDULER),
            namespace: settings.namespace.clone(),
            path: Some(s(WEBHOOK_PATH)),
            port: Some(SERVICE_HTTPS_PORT),
        }),
        ..Default::default()
    };
    let main = MutatingWebhook {
        name: s(WEBHOOK_NAME),
        client_config: client_config.clone(),
        // UPDATE too: a scheduler-owned annotation added later is denied like one set
        // at creation (D-4).
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![s("")]),
            api_versions: Some(vec![s("v1")]),
            operations: Some(vec![s("CREATE"), s("UPDATE")]),
            resources: Some(vec![s("pods")]),
            scope: Some(s("*")),
        }]),
        match_conditions: conditions(
            settings,
            WEBHOOK_MATCH_CONDITION,
            webhook_match_expression(),
        ),
        failure_policy: Some(webhook_failure_policy(settings)),
        match_policy: Some(s("Equivalent")),
        // DRA mode: the webhook creates ResourceClaimTemplates, but never on a dryRun.
        side_effects: s("NoneOnDryRun"),
        timeout_seconds: Some(10),
        reinvocation_policy: Some(s("Never")),
        admission_review_versions: vec![s("v1"), s("v1beta1")],
        namespace_selector: Some(namespaces),
        object_selector: Some(pods),
    };
    let mut out = vec![main.clone()];
    // D-4 beyond the selectors: pods and namespaces labelled ignore, kube-system and ours
    // are not sent to the main webhook, but a scheduler-owned annotation on them must be
    // refused too. Only pods carrying one match (so Fail blocks nothing else); only where
    // matchConditions exist (without them this would send every pod of the cluster).
    //
    // pods/status too: the API server's status strategy keeps a status write's labels and
    // annotations, so whoever may write a pod's status could otherwise rewrite them unseen
    // (kubelet's status writes change no annotation, so matchConditions send none of them).
    if settings.kube_version.has_match_conditions() {
        let mut rules = main.rules.clone().unwrap_or_default();
        for rule in &mut rules {
            rule.resources = Some(vec![s("pods"), s("pods/status")]);
        }
        out.push(MutatingWebhook {
            name: s(GUARD_WEBHOOK_NAME),
            client_config,
            rules: Some(rules),
            match_conditions: conditions(settings, GUARD_MATCH_CONDITION, guard_match_expression()),
            failure_policy: Some(s("Fail")),
            namespace_selector: None,
            object_selector: None,
            ..main
        });
    }
    out
}
