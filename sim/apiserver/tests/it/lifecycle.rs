//! Server lifecycle: persistence across restarts, the `serve` entry point and its kubeconfig.

use crate::common;

use common::{client, pod, start_with};
use hami_apiserver::{Config, ServeArgs};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn temp_dir(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "hami-apiserver-{tag}-{}",
        hami_apiserver::meta::new_uid()
    ))
}

#[tokio::test]
async fn data_dir_survives_restart() {
    let dir = temp_dir("data");
    let config = Config {
        data_dir: Some(dir.clone()),
        ..Config::default()
    };
    let (uid, rv, last_rv) = {
        let server = start_with(config.clone()).await;
        let c = client(&server);
        let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
        let p = pods
            .create(&PostParams::default(), &pod("keep"))
            .await
            .unwrap();
        pods.create(&PostParams::default(), &pod("gone"))
            .await
            .unwrap();
        pods.delete("gone", &DeleteParams::default()).await.unwrap();
        let last = server.resource_version();
        server.shutdown().await;
        (
            p.metadata.uid.unwrap(),
            p.metadata.resource_version.unwrap(),
            last,
        )
    };
    let server = start_with(config).await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = pods.get("keep").await.unwrap();
    assert_eq!(p.metadata.uid.unwrap(), uid);
    assert_eq!(p.metadata.resource_version.unwrap(), rv);
    assert!(pods.get("gone").await.is_err());
    assert_eq!(
        server.resource_version(),
        last_rv,
        "the resourceVersion counter survives, deletes included"
    );
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "new"}})).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        cm.metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > last_rv
    );
    server.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `hami apiserver --kubeconfig-out`, plain and with `--tls`: kube-rs reads the written
/// kubeconfig (with `--tls`: https and the CA in `certificate-authority-data`) and lists.
#[tokio::test]
async fn serve_writes_a_kubeconfig_kube_accepts() {
    for tls in [false, true] {
        let dir = temp_dir(&format!("serve-{tls}"));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("kubeconfig");
        let port = hami_local_ports::free_port();
        let args = ServeArgs {
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            kubeconfig_out: Some(kc.clone()),
            data_dir: None,
            tls,
        };
        let task = tokio::spawn(hami_apiserver::serve(args));
        common::eventually("kubeconfig written", async || kc.exists()).await;
        let kubeconfig = kube::config::Kubeconfig::read_from(&kc).unwrap();
        let cluster = kubeconfig.clusters[0].cluster.clone().unwrap();
        let scheme = if tls { "https" } else { "http" };
        assert_eq!(
            cluster.server.as_deref(),
            Some(format!("{scheme}://127.0.0.1:{port}").as_str())
        );
        assert_eq!(cluster.certificate_authority_data.is_some(), tls);
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let c = kube::Client::try_from(config).unwrap();
        let pods: Api<Pod> = Api::default_namespaced(c);
        assert!(
            pods.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        task.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[tokio::test]
async fn serve_refuses_non_loopback() {
    let args = ServeArgs {
        listen: "0.0.0.0:0".parse().unwrap(),
        kubeconfig_out: None,
        data_dir: None,
        tls: true,
    };
    let err = hami_apiserver::serve(args).await.unwrap_err().to_string();
    assert!(err.contains("loopback"), "{err}");
}

#[tokio::test]
async fn damaged_data_dir_is_refused_clearly() {
    let dir = temp_dir("damaged");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("objects.jsonl"), "garbage\n{\"also\": \"bad\"}\n").unwrap();
    let err = hami_apiserver::ApiServer::start(Config {
        data_dir: Some(dir.clone()),
        ..Config::default()
    })
    .await
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("damaged") && err.contains("line 1"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
