//! The extender's certificate is reloaded when its files change: no restart for rotation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderFilterResult;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use kube::Client;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificate_is_served_without_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let scheduler = Scheduler::start(client, Settings::default(), Arc::new(Leadership::always()));
    let dir = std::env::temp_dir().join(format!("hami-tls-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    let first = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(&cert_path, first.cert.pem()).unwrap();
    std::fs::write(&key_path, first.signing_key.serialize_pem()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler),
        listener,
        Some((cert_path.clone(), key_path.clone())),
    ));
    let args = json!({"pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "nodenames": ["n"]});
    let call = |pem: Vec<u8>| {
        let base = base.clone();
        let args = args.clone();
        async move {
            let client = ExtenderClient::new(&base, Trust::Ca(pem)).unwrap();
            client
                .call::<_, ExtenderFilterResult>("filter", &args)
                .await
        }
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while call(first.cert.pem().into_bytes()).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the first certificate is never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let second = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    assert!(
        call(second.cert.pem().into_bytes()).await.is_err(),
        "not trusted before rotation"
    );
    // Rotate atomically, as a Secret volume update does.
    std::fs::write(dir.join("tls.key.new"), second.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt.new"), second.cert.pem()).unwrap();
    std::fs::rename(dir.join("tls.key.new"), &key_path).unwrap();
    std::fs::rename(dir.join("tls.crt.new"), &cert_path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if call(second.cert.pem().into_bytes()).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        call(first.cert.pem().into_bytes()).await.is_err(),
        "the old certificate is gone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
