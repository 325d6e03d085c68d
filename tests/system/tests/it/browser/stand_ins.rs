//! What the browser test runs beside the demo: the repository's root, a monitor stand-in
//! whose samples change per scrape (the charts need data), and another site whose page
//! frames the UI and posts its What-if form.

use std::path::{Path, PathBuf};

/// The repository's root.
pub(super) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Serves, in the monitor's exposition (same families and labels), a utilization and a
/// memory sample that change per scrape, and the enforced memory limit (the grant, MiB),
/// for each `(namespace, pod, container, uuid, grant)`:
/// the demo runs no GPU processes yet (issue 15), and the charts need samples to draw.
pub(super) async fn sampling_monitor(series: Vec<(String, String, String, String, u64)>) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tick = std::sync::Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = tick.fetch_add(1, Ordering::SeqCst);
            let series = series.clone();
            async move {
                let mut body = String::from("# TYPE hami_container_device_utilization_ratio gauge\n");
                for (ns, pod, ctr, uuid, limit_mib) in &series {
                    let labels = format!("zone=\"vGPU\",namespace=\"{ns}\",pod=\"{pod}\",container=\"{ctr}\",vdevice_index=\"0\",device_uuid=\"{uuid}\"");
                    body.push_str(&format!("hami_container_device_utilization_ratio{{{labels}}} {}\n", 30 + n % 40));
                    body.push_str(&format!("hami_container_device_memory_bytes{{{labels}}} {}\n", (512 + 64 * (n % 8)) << 20));
                    // The limit HAMi-core enforces: the container's grant on the device.
                    body.push_str(&format!("hami_vgpu_memory_limit_bytes{{{labels}}} {}\n", limit_mib << 20));
                }
                body
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.ok() });
    format!("http://{addr}/metrics")
}

/// Another site (`localhost`, while the UI is at 127.0.0.1: cross-site to the browser):
/// `/post` holds a form that posts a scenario to the UI's What-if page, `/frame` frames the
/// UI's overview.
pub(super) async fn other_site(ui: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let html = |body: String| {
        axum::response::Html(format!(
            "<!DOCTYPE html><html lang=\"en\"><head><title>elsewhere</title></head><body>{body}</body></html>"
        ))
    };
    let post = format!(
        "<form id=\"f\" method=\"post\" action=\"{ui}whatif\"><textarea name=\"scenario\">fleet: []</textarea><button id=\"go\" type=\"submit\">go</button></form>"
    );
    let frame = format!("<iframe id=\"ui\" title=\"ui\" src=\"{ui}\"></iframe>");
    let app = axum::Router::new()
        .route(
            "/post",
            axum::routing::get(move || {
                let post = post.clone();
                async move { html(post) }
            }),
        )
        .route(
            "/frame",
            axum::routing::get(move || {
                let frame = frame.clone();
                async move { html(frame) }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.ok() });
    format!("http://localhost:{port}/")
}
