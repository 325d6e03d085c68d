//! A pod's service-account credentials on the real runtime (see `mod.rs`): the
//! `kube-api-access-<suffix>` projected volume the ServiceAccount admission plugin puts in
//! every pod — a token of the pod's ServiceAccount from the API server's TokenRequest API,
//! the cluster's `kube-root-ca.crt`, the namespace — written before the sandbox and mounted
//! read-only at `/var/run/secrets/kubernetes.io/serviceaccount`, where in-cluster clients
//! read them. Without the ConfigMap the pod waits with kubelet's message, then runs.

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{BUSYBOX, Node, containerd, out, pod, scratch};

const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_api_access_volume_holds_the_accounts_token_the_root_ca_and_the_namespace()
-> Result<(), String> {
    let Some(shared) = containerd() else {
        return Ok(());
    };
    let dir = scratch("sa-token")?;
    let node = Node::start(shared, &dir).await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "agent"}}))
        .map_err(|e| e.to_string())?;
    Api::<ServiceAccount>::namespaced(node.client.clone(), "default")
        .create(&PostParams::default(), &sa)
        .await
        .map_err(|e| format!("cannot create the service account: {e}"))?;
    let script = format!(
        "cd {MOUNT} && cat token > /out/token && cat ca.crt > /out/ca && cat namespace > /out/ns \
         && (echo x > probe 2>/dev/null && echo writable || echo read-only) > /out/ro \
         && echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT > /out/svc"
    );
    // As the admission plugin writes it (kube-apiserver 1.36).
    node.create(pod(
        "sa",
        &dir,
        "",
        json!({
            "serviceAccountName": "agent",
            "volumes": [
                {"name": "out", "hostPath": {"path": dir.join("out").display().to_string()}},
                {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
            ],
            // Arrays replace the helper's: the whole container.
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["/bin/sh", "-c", script], "volumeMounts": [
                {"name": "out", "mountPath": "/out"},
                {"name": "kube-api-access-x7k2p", "mountPath": MOUNT, "readOnly": true},
            ]}],
        }),
    ))
    .await?;
    // No kube-root-ca.crt yet (its publisher has not run): the pod waits, as kubelet's does.
    let status = node
        .wait_status("sa", "a waiting reason", |s| {
            s["containerStatuses"][0]["state"]["waiting"]["message"].is_string()
        })
        .await?;
    assert_eq!(
        status["containerStatuses"][0]["state"]["waiting"]["message"],
        "MountVolume.SetUp failed for volume \"kube-api-access-x7k2p\" : configmap \"kube-root-ca.crt\" not found",
        "{status:#}"
    );
    let ca: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kube-root-ca.crt"},
        "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"}}))
    .map_err(|e| e.to_string())?;
    Api::<ConfigMap>::namespaced(node.client.clone(), "default")
        .create(&PostParams::default(), &ca)
        .await
        .map_err(|e| format!("cannot create kube-root-ca.crt: {e}"))?;
    node.wait_phase("sa", "Succeeded").await?;
    // The token is one the API server issued for the account, bound to this pod.
    let user = node.server.token_user(&out(&dir, "token"));
    assert_eq!(
        user.map(|u| u.name).as_deref(),
        Some("system:serviceaccount:default:agent")
    );
    assert_eq!(
        out(&dir, "ca"),
        "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"
    );
    assert_eq!(out(&dir, "ns"), "default");
    assert_eq!(out(&dir, "ro"), "read-only\n");
    // Where in-cluster clients find the API server (host network: where kubelet-sim does).
    let url = node.server.url();
    let authority = url.trim_start_matches("http://");
    assert_eq!(out(&dir, "svc"), format!("{authority} tcp://{authority}\n"));
    node.stop().await;
    Ok(())
}
