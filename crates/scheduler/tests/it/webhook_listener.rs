//! The webhook listener (reachable from any pod through the Service) serves the webhook and
//! the probes only: every extender verb — `/filter`, `/preempt`, `/bind` — answers 403 with
//! where kube-scheduler must call instead, never 404 for one of them.

use std::sync::Arc;

use hami_scheduler::config::Settings;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;

use crate::http_api::{json_body, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_extender_verb_is_refused_alike_on_the_webhook_listener() {
    let (_api, client) = crate::common::api().await;
    let scheduler = Scheduler::start(client, Settings::default(), Arc::new(Leadership::always()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::webhook_router(scheduler),
        listener,
        None,
    ));
    let answers = tokio::task::spawn_blocking(move || {
        ["/filter", "/preempt", "/bind", "/healthz"].map(|path| {
            let method = if path == "/healthz" { "GET" } else { "POST" };
            (path, request(port, method, path, b"{}"))
        })
    })
    .await
    .unwrap();
    for (path, (status, body)) in &answers[..3] {
        assert_eq!(*status, 403, "{path}: {body}");
        let error = json_body(body)["error"].as_str().unwrap().to_owned();
        assert!(
            error.contains("/filter, /preempt and /bind are not served on the webhook listener")
                && error.contains("--extender-bind"),
            "{path}: {error}"
        );
    }
    assert_eq!(answers[3].1.0, 200, "{:?}", answers[3]);
}
