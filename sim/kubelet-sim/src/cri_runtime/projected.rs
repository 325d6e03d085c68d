//! Projected volumes as kubelet's projected plugin sets them up before the sandbox: the
//! files of every source written under the pod's volume directory, which the containers
//! mount read-only. What the ServiceAccount admission plugin puts in every pod
//! (`kube-api-access-<suffix>`) is three sources, all handled:
//! - `serviceAccountToken`: a token of the pod's ServiceAccount (`spec.serviceAccountName`,
//!   `default` when unset) from the API server's TokenRequest API
//!   (`serviceaccounts/<name>/token`, bound to the pod), as kubelet's token manager asks;
//! - `configMap` (`kube-root-ca.crt`): its keys (or `items`) as files; a missing ConfigMap
//!   fails the mount unless `optional`, as kubelet's does;
//! - `downwardAPI`: `metadata.namespace`, `metadata.name`, `metadata.uid` and the pod's
//!   labels and annotations by `fieldRef`;
//!
//! and `secret` likewise. A failure leaves the pod waiting with kubelet's
//! `MountVolume.SetUp failed for volume "…" : …` message, retried. Not done: the token's
//! refresh at 80 % of its lifetime (a pod here lives shorter than the hour asked for), and
//! kubelet's atomic `..data` symlink swap (files are written once, before the sandbox).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, KeyToPath, PodSpec, ProjectedVolumeSource, Secret, ServiceAccount,
};
use kube::api::{Api, PostParams};

use crate::cri_spec::PodRef;

/// The token lifetime kubelet asks for when the source says none (one hour).
const DEFAULT_EXPIRATION: i64 = 3600;

/// Sets up every projected volume of the pod under `volumes/<name>`, or says why one
/// cannot be.
pub(super) async fn set_up(
    client: &kube::Client,
    pod: &PodRef,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    spec: &PodSpec,
    volumes: &Path,
) -> Result<(), String> {
    for volume in spec.volumes.iter().flatten() {
        let Some(projected) = &volume.projected else {
            continue;
        };
        let failed = |e: String| {
            format!(
                "MountVolume.SetUp failed for volume \"{}\" : {e}",
                volume.name
            )
        };
        let files = files(client, pod, labels, annotations, spec, projected)
            .await
            .map_err(failed)?;
        write(
            &volumes.join(&volume.name),
            &files,
            projected.default_mode.unwrap_or(0o644),
        )
        .map_err(failed)?;
    }
    Ok(())
}

/// (relative path, bytes, mode) of a projected volume.
type Files = Vec<(String, Vec<u8>, Option<i32>)>;

/// `items` of a ConfigMap or Secret source: the named keys at their paths, else every key
/// at its own name; a named key that is missing is an error unless `optional`.
fn pick(
    what: &str,
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    out: &mut Files,
) -> Result<(), String> {
    match items {
        None => out.extend(data.into_iter().map(|(k, v)| (k, v, None))),
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => out.push((item.path.clone(), v.clone(), item.mode)),
                    None if optional => {}
                    None => return Err(format!("{what}: no key {:?}", item.key)),
                }
            }
        }
    }
    Ok(())
}

async fn files(
    client: &kube::Client,
    pod: &PodRef,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    spec: &PodSpec,
    projected: &ProjectedVolumeSource,
) -> Result<Files, String> {
    let mut out = Files::new();
    let ns = pod.namespace.as_str();
    for source in projected.sources.iter().flatten() {
        if let Some(t) = &source.service_account_token {
            let sa = spec
                .service_account_name
                .as_deref()
                .filter(|s| !s.is_empty())
                .unwrap_or("default");
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(t.audience.iter().cloned().collect()),
                    expiration_seconds: Some(t.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION)),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(pod.name.clone()),
                        uid: Some(pod.uid.clone()),
                    }),
                }),
                ..Default::default()
            };
            let answer = Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .create_token_request(sa, &PostParams::default(), &request)
                .await
                .map_err(|e| format!("cannot get a token of service account {ns}/{sa}: {e}"))?;
            let token = answer
                .status
                .and_then(|s| s.token)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| format!("the token request of {ns}/{sa} answered no token"))?;
            out.push((t.path.clone(), token.into_bytes(), None));
        }
        if let Some(c) = &source.config_map {
            let optional = c.optional.unwrap_or(false);
            match Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(&c.name)
                .await
                .map_err(|e| format!("cannot get configmap {ns}/{}: {e}", c.name))?
            {
                Some(cm) => {
                    let mut data: BTreeMap<String, Vec<u8>> = cm
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    data.extend(
                        cm.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    pick(
                        &format!("configmap {ns}/{}", c.name),
                        data,
                        c.items.as_ref(),
                        optional,
                        &mut out,
                    )?;
                }
                None if optional => {}
                None => return Err(format!("configmap \"{}\" not found", c.name)),
            }
        }
        if let Some(s) = &source.secret {
            let optional = s.optional.unwrap_or(false);
            match Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(&s.name)
                .await
                .map_err(|e| format!("cannot get secret {ns}/{}: {e}", s.name))?
            {
                Some(secret) => {
                    let data = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect();
                    pick(
                        &format!("secret {ns}/{}", s.name),
                        data,
                        s.items.as_ref(),
                        optional,
                        &mut out,
                    )?;
                }
                None if optional => {}
                None => return Err(format!("secret \"{}\" not found", s.name)),
            }
        }
        if let Some(d) = &source.downward_api {
            for item in d.items.iter().flatten() {
                let Some(field) = &item.field_ref else {
                    return Err(format!(
                        "downwardAPI {}: only fieldRef is supported by kubelet-sim",
                        item.path
                    ));
                };
                let value = match field.field_path.as_str() {
                    "metadata.namespace" => pod.namespace.clone(),
                    "metadata.name" => pod.name.clone(),
                    "metadata.uid" => pod.uid.clone(),
                    "metadata.labels" => key_values(labels),
                    "metadata.annotations" => key_values(annotations),
                    other => {
                        return Err(format!(
                            "downwardAPI {}: fieldRef {other} is not supported by kubelet-sim",
                            item.path
                        ));
                    }
                };
                out.push((item.path.clone(), value.into_bytes(), item.mode));
            }
        }
        if source.cluster_trust_bundle.is_some() || source.pod_certificate.is_some() {
            return Err(
                "clusterTrustBundle and podCertificate sources are not supported by kubelet-sim"
                    .into(),
            );
        }
    }
    Ok(out)
}

/// `key="value"` lines, as the downward API writes labels and annotations.
fn key_values(map: &BTreeMap<String, String>) -> String {
    map.iter().map(|(k, v)| format!("{k}={v:?}\n")).collect()
}

/// Writes the files under `dir` (made fresh), each with its mode or `default_mode`; paths
/// must stay inside `dir`.
fn write(dir: &Path, files: &Files, default_mode: i32) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (path, bytes, mode) in files {
        let rel = Path::new(path);
        if path.is_empty()
            || rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "path {path:?} must be relative and must not contain '..'"
            ));
        }
        let file = dir.join(rel);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&file, bytes)
            .and_then(|()| {
                let mode = mode.unwrap_or(default_mode) as u32 & 0o777;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
            })
            .map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_land_under_the_volume_with_their_modes_and_never_outside() {
        let dir =
            std::env::temp_dir().join(format!("kubelet-sim-projected-{}", std::process::id()));
        let files: Files = vec![
            ("token".into(), b"t".to_vec(), None),
            ("sub/ca.crt".into(), b"c".to_vec(), Some(0o600)),
        ];
        write(&dir, &files, 0o644).unwrap();
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::read(dir.join("token")).unwrap(), b"t");
        assert_eq!((mode("token"), mode("sub/ca.crt")), (0o644, 0o600));
        for bad in ["../escape", "/etc/passwd", ""] {
            let err = write(&dir, &vec![(bad.into(), vec![], None)], 0o644).unwrap_err();
            assert!(err.contains("relative"), "{bad}: {err}");
        }
        let mut out = Files::new();
        let data: BTreeMap<String, Vec<u8>> = [("ca.crt".to_string(), b"x".to_vec())].into();
        let items = vec![KeyToPath {
            key: "missing".into(),
            path: "m".into(),
            mode: None,
        }];
        assert!(
            pick(
                "configmap ns/c",
                data.clone(),
                Some(&items),
                false,
                &mut out
            )
            .is_err()
        );
        pick("configmap ns/c", data, Some(&items), true, &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(
            key_values(&[("a".to_string(), "b c".to_string())].into()),
            "a=\"b c\"\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
