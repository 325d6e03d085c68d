//! Service accounts as a real cluster runs them (`Config::service_accounts`):
//! - the serviceaccount controller: a `default` ServiceAccount in every namespace, existing
//!   and created (recreated when deleted);
//! - the root-CA publisher: a ConfigMap `kube-root-ca.crt` with `ca.crt` = the server's CA in
//!   every namespace (only with TLS: without it there is no CA to publish), kept equal to it;
//! - the ServiceAccount admission plugin on pod CREATE (upstream's
//!   plugin/pkg/admission/serviceaccount): `serviceAccountName` defaults to `default`, a pod
//!   whose account does not exist is refused, and unless automounting is off (on the pod,
//!   else on the account) the projected volume `kube-api-access-xxxxx` (token, CA, namespace)
//!   is added and mounted read-only at [`TOKEN_MOUNT_PATH`] in every container and init
//!   container that does not already mount that path. Mirror pods are only validated.
//!
//! The controllers run inside the write that creates a namespace (or deletes what they
//! keep), not later as kube-controller-manager's do: a pod created right after its
//! namespace finds its `default` account, which upstream's admission otherwise waits for.
//! Off by default: kube-apiserver always runs them, but most tests create pods in
//! namespaces without accounts and compare pod specs without the injected volume.

use serde_json::{Map, Value, json};

use crate::resources::{self, ResourceType};
use crate::status::ApiError;
use crate::store::{Store, Subresource};

/// The account a pod without `serviceAccountName` runs as.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Where the token, CA and namespace are mounted in every container.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the injected volume's name (upstream's `ServiceAccountVolumeName`).
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";
/// The ConfigMap the root-CA publisher keeps in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The token lifetime the injected volume asks for: kube-apiserver extends a token
/// requested for exactly this long to a year and only warns after an hour.
pub const WARN_ONLY_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation of a kubelet's mirror pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The manager recorded on what the controllers write.
const CONTROLLER_MANAGER: &str = "kube-controller-manager";
const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

fn served(plural: &str) -> &'static ResourceType {
    resources::lookup("", "v1", plural).expect("core resource is served")
}

/// The settings of the controllers and the admission plugin.
#[derive(Debug, Clone)]
pub struct ServiceAccounts {
    /// The CA PEM to publish in `kube-root-ca.crt` (None without TLS: nothing published).
    pub ca_pem: Option<String>,
}

impl ServiceAccounts {
    /// Whether a write that changed these resources needs the controllers to look again.
    pub fn concerns(plural: &str) -> bool {
        matches!(plural, "namespaces" | "serviceaccounts" | "configmaps")
    }

    /// Brings every live namespace to the controllers' desired state: a `default`
    /// ServiceAccount and (with a CA) `kube-root-ca.crt` holding exactly the CA.
    pub fn reconcile(&self, store: &mut Store) {
        let (nsr, sar, cmr) = (
            served("namespaces"),
            served("serviceaccounts"),
            served("configmaps"),
        );
        let saved = std::mem::take(&mut store.ctx);
        store.ctx.manager = CONTROLLER_MANAGER.into();
        for ns in store.objects_of(nsr) {
            let ns = ns.to_value();
            // A terminating namespace gets nothing new (upstream's controllers skip it).
            if ns.pointer("/metadata/deletionTimestamp").is_some()
                || ns.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
            {
                continue;
            }
            let Some(name) = ns.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            if store.get(sar, name, DEFAULT_SERVICE_ACCOUNT).is_err() {
                let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": name}});
                if let Err(e) = store.create(sar, Some(name), sa) {
                    tracing::warn!("serviceaccount controller: {name}/default: {}", e.message);
                }
            }
            let Some(ca) = &self.ca_pem else { continue };
            let data = json!({"ca.crt": ca});
            match store.get(cmr, name, ROOT_CA_CONFIGMAP) {
                Err(_) => {
                    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": name,
                            "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
                        "data": data});
                    if let Err(e) = store.create(cmr, Some(name), cm) {
                        tracing::warn!("root-ca publisher: {name}: {}", e.message);
                    }
                }
                Ok(cm) if cm.get("data") != Some(&data) || cm.get("binaryData").is_some() => {
                    let mut cm = (*cm).clone();
                    cm["data"] = data;
                    if let Some(o) = cm.as_object_mut() {
                        o.remove("binaryData");
                    }
                    if let Err(e) =
                        store.update(cmr, name, ROOT_CA_CONFIGMAP, cm, Subresource::Main)
                    {
                        tracing::warn!("root-ca publisher: {name}: {}", e.message);
                    }
                }
                Ok(_) => {}
            }
        }
        store.ctx = saved;
    }
}

fn forbidden(pod: &Value, why: String) -> ApiError {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut e = ApiError::forbidden(format!("pods \"{name}\" is forbidden: {why}"));
    e.details = Some(json!({"name": name, "kind": "pods"}));
    e
}

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Upstream's `Admit` on a pod CREATE in `ns`: defaults the account, checks it exists, and
/// mounts the token volume unless automounting is off. A mirror pod is only validated.
pub fn admit_pod(store: &Store, ns: &str, pod: &mut Value) -> Result<(), ApiError> {
    if is_mirror(pod) {
        return validate_pod(store, ns, pod);
    }
    if !pod.get("spec").is_some_and(Value::is_object) {
        return Ok(()); // validation answers the missing spec
    }
    let named = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from);
    let sa_name = named.unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_string());
    pod["spec"]["serviceAccountName"] = json!(sa_name);
    let sa = lookup(store, ns, &sa_name, pod)?;
    let automount = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if automount {
        mount_token(pod);
    }
    let has_pull_secrets = pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_pull_secrets && let Some(s) = sa.get("imagePullSecrets").filter(|s| s.is_array()) {
        pod["spec"]["imagePullSecrets"] = s.clone();
    }
    validate_pod(store, ns, pod)
}

/// Upstream's `Validate` on a pod CREATE: a mirror pod may not name an account, secrets or
/// token projections; any other pod's account must exist (checked again after webhooks).
pub fn validate_pod(store: &Store, ns: &str, pod: &Value) -> Result<(), ApiError> {
    let spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    if is_mirror(pod) {
        if spec
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(forbidden(
                pod,
                "a mirror pod may not reference service accounts".into(),
            ));
        }
        let volumes = spec.get("volumes").and_then(Value::as_array);
        let uses = |f: &dyn Fn(&Value) -> bool| volumes.is_some_and(|v| v.iter().any(f));
        let secret_env = ["containers", "initContainers"].iter().any(|k| {
            spec.get(*k).and_then(Value::as_array).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.pointer("/env")
                        .and_then(Value::as_array)
                        .is_some_and(|e| {
                            e.iter()
                                .any(|e| e.pointer("/valueFrom/secretKeyRef").is_some())
                        })
                        || c.pointer("/envFrom")
                            .and_then(Value::as_array)
                            .is_some_and(|e| e.iter().any(|e| e.get("secretRef").is_some()))
                })
            })
        });
        if uses(&|v| v.get("secret").is_some())
            || secret_env
            || spec
                .get("imagePullSecrets")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        {
            return Err(forbidden(
                pod,
                "a mirror pod may not reference secrets".into(),
            ));
        }
        if uses(&|v| {
            v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .is_some_and(|s| s.iter().any(|s| s.get("serviceAccountToken").is_some()))
        }) {
            return Err(forbidden(
                pod,
                "a mirror pod may not use ServiceAccountToken volume projections".into(),
            ));
        }
        return Ok(());
    }
    let sa_name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT);
    lookup(store, ns, sa_name, pod).map(|_| ())
}

fn lookup(store: &Store, ns: &str, sa: &str, pod: &Value) -> Result<Value, ApiError> {
    store
        .get(served("serviceaccounts"), ns, sa)
        .map(|v| (*v).clone())
        .map_err(|_| {
            forbidden(
                pod,
                format!(
                    "error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found"
                ),
            )
        })
}

/// The projected volume upstream's `TokenVolumeSource` describes.
pub fn token_volume_source() -> Value {
    json!({
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": WARN_ONLY_EXPIRATION_SECONDS, "path": "token"}},
            {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]
    })
}

/// Mounts a new `kube-api-access-xxxxx` volume at [`TOKEN_MOUNT_PATH`] in every init
/// container and container that does not mount that path yet; adds the volume if any does.
fn mount_token(pod: &mut Value) {
    let volume_name = crate::meta::generate_name(TOKEN_VOLUME_PREFIX);
    let mount = json!({"name": volume_name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for key in ["initContainers", "containers"] {
        let Some(containers) = pod["spec"].get_mut(key).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mounted = match c.get("volumeMounts") {
                None | Some(Value::Null) => false,
                Some(Value::Array(list)) => list
                    .iter()
                    .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH)),
                Some(_) => continue, // not a list: validation refuses it
            };
            if mounted {
                continue;
            }
            let list = c
                .entry("volumeMounts")
                .or_insert_with(|| Value::Array(Vec::new()));
            if list.is_null() {
                *list = Value::Array(Vec::new());
            }
            if let Some(list) = list.as_array_mut() {
                list.push(mount.clone());
                needed = true;
            }
        }
    }
    if needed {
        let spec = pod["spec"].as_object_mut().expect("checked by the caller");
        let volumes = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(v) = volumes.as_array_mut() {
            let mut volume = Map::new();
            volume.insert("name".into(), json!(volume_name));
            volume.insert("projected".into(), token_volume_source());
            v.push(Value::Object(volume));
        }
    }
}

#[cfg(test)]
mod tests;
