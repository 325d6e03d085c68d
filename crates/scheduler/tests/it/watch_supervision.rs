//! Supervised watches on the embedded API server (issue 17 item 9): a killed watch (the
//! server ends it and refuses to list or watch again) and a stalled one (requests that
//! get no answer) make `/readyz` false and filter answer a clear error; once the server
//! answers again the view catches up (a node created during the outage is offered) and
//! the scheduler is ready again.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderArgs;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use hami_scheduler::watch_health::WatchTuning;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

fn readyz(port: u16) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (code, body.unwrap_or_default())
}

async fn until_readyz(port: u16, code: u16, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (c, body) = tokio::task::spawn_blocking(move || readyz(port))
            .await
            .unwrap();
        if c == code {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /readyz stayed {c} ({body})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#}},
        "status": {"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}}))
    .unwrap()
}

fn filter_args(nodes: &[&str]) -> ExtenderArgs {
    serde_json::from_value(json!({"pod": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100"}}}]}},
        "nodenames": nodes}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_stalled_watches_make_the_scheduler_unready_until_they_recover() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("early"))
        .await
        .unwrap();
    let settings = Settings {
        watch: WatchTuning {
            watch_timeout: Duration::from_secs(1),
            stall_after: Duration::from_secs(2),
            error_grace: Duration::from_millis(500),
        },
        ..Settings::default()
    };
    let scheduler = Scheduler::start(client.clone(), settings, Arc::new(Leadership::always()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    until_readyz(port, 200, "start").await;
    let pod = filter_args(&[]).pod.unwrap();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    // A quiet cluster stays ready across several server-side watch timeouts (1 s): the
    // sleep is the thing under test (a non-event), not synchronisation.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(readyz(port).0, 200, "a quiet watch is not a stalled one");

    // Kill: the server ends the node watch and refuses to list or watch nodes again
    // (500: kube-rs retries 503s itself, which looks like a stall instead).
    let faults = api.faults();
    faults.fail_next(Some("watch"), Some("nodes"), 100_000, 500);
    faults.fail_next(Some("list"), Some("nodes"), 100_000, 500);
    faults.close_all_watches();
    let body = until_readyz(port, 503, "killed node watch").await;
    assert!(body.contains("nodes watch has been failing"), "{body}");
    let refused = scheduler.filter(filter_args(&["early"])).await;
    assert!(
        refused.error.contains("nodes watch has been failing")
            && refused
                .error
                .contains("does not decide until the watch recovers"),
        "{}",
        refused.error
    );
    assert!(!refused.error.contains("Status {"), "{}", refused.error);
    // A node joins during the outage; the frozen view cannot know it.
    nodes
        .create(&PostParams::default(), &node("late"))
        .await
        .unwrap();
    faults.clear();
    until_readyz(port, 200, "node watch recovered").await;
    let decided = scheduler.filter(filter_args(&["late"])).await;
    assert_eq!(
        decided.nodenames,
        Some(vec!["late".to_string()]),
        "the recovered view has the node created during the outage: {}",
        decided.error
    );

    // History expired (410 Gone on resume): the informers list again and stay in step.
    faults.expire_watch_history();
    faults.close_all_watches();
    nodes
        .create(&PostParams::default(), &node("after-410"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = scheduler.filter(filter_args(&["after-410"])).await;
        if r.nodenames == Some(vec!["after-410".to_string()]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after a 410 the view never caught up: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Stall: watch requests get no answer (the server delays every request by 30 s).
    faults.set_latency(Duration::from_secs(30));
    faults.close_all_watches();
    let body = until_readyz(port, 503, "stalled watches").await;
    assert!(
        body.contains("delivered nothing") || body.contains("got no answer"),
        "{body}"
    );
    let refused = scheduler.filter(filter_args(&["early"])).await;
    assert!(
        refused
            .error
            .contains("does not decide until the watch recovers"),
        "{}",
        refused.error
    );
    faults.set_latency(Duration::ZERO);
    until_readyz(port, 200, "stall over").await;
    let decided = scheduler.filter(filter_args(&["early"])).await;
    assert_eq!(decided.error, "");
}
