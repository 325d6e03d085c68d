//! What the demo's tests set up the same way: a fresh scratch directory and the arguments of
//! a `--once` demo on free ports; a monitor's `/metrics` and its hook check's series.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_monitor::hook_presence::REASON_SLICE_NOT_ENFORCED;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

use hami_demo::DemoArgs;

/// A fresh, empty `<tmp>/hami-<name>-<pid>`.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `hami demo --once` with the API server and the UI on free ports, the pods of `examples`
/// (a directory, or `built-in`) settling for at most 20 s, its kubeconfig written in `dir`.
pub(crate) fn once_args(examples: PathBuf, dir: &Path) -> DemoArgs {
    DemoArgs {
        once: true,
        api_listen: "127.0.0.1:0".parse().unwrap(),
        examples,
        kubeconfig_out: dir.join("kubeconfig"),
        settle_seconds: 20,
        scenario: None,
        ui_listen: "127.0.0.1:0".parse().unwrap(),
        dra: false,
    }
}

/// The demo cluster of `args` whose app containers run this package's `hami-workload`
/// program (where the machine allows: root and util-linux), reporting to `progress`.
pub(crate) async fn start_running_workloads(
    args: &DemoArgs,
    progress: &mut hami_demo::Progress<'_>,
) -> hami_demo::Cluster {
    let workload = Some(env!("CARGO_BIN_EXE_hami-workload").into());
    hami_demo::Cluster::start_with(args, workload, progress)
        .await
        .unwrap()
}

/// One demo cluster at a time in this binary, held for a test's whole run: a cluster is the
/// whole system, and two at once on a small machine miss each other's bounded waits (each
/// test was its own binary before, and those ran one after another).
pub(crate) static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `GET /metrics` with `accept` (no `Accept` header when empty): (content type, body).
pub(crate) fn get_metrics(addr: SocketAddr, accept: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let accept = if accept.is_empty() {
        String::new()
    } else {
        format!("Accept: {accept}\r\n")
    };
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (content_type, body.to_owned())
}

const UNHOOKED: &str = "hami_container_unhooked_processes";
const HOOK_UNKNOWN: &str = "hami_container_hook_unknown_processes";

/// The hook check's series of a metrics text: (family, pod, hook) → value (read by the
/// protocol crate's exposition reader, as `hami status` reads the monitors).
fn hook_series(text: &str) -> BTreeMap<(String, String, String), f64> {
    hami_protocol::scrape::parse_samples(text)
        .0
        .into_iter()
        .filter(|s| s.name == UNHOOKED || s.name == HOOK_UNKNOWN)
        .map(|s| {
            let label = |key: &str| s.label(key).unwrap_or_default().to_owned();
            ((s.name.clone(), label("pod"), label("hook")), s.value)
        })
        .collect()
}

/// Waits (bounded) until the monitors at `monitors` have checked every process of `pods`,
/// each given with the hook its slice loads (issue 29: their series of that hook exist,
/// `libamvgpu.so` or `libvgpu.so`), failing at once on any process counted unhooked; then
/// every hook series of theirs must read 0 (none unhooked, none unknown).
pub(crate) async fn wait_all_hooked(monitors: &[SocketAddr], pods: &[(&str, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let series = loop {
        let addrs = monitors.to_vec();
        let series = tokio::task::spawn_blocking(move || {
            let mut series = BTreeMap::new();
            for addr in addrs {
                series.extend(hook_series(&get_metrics(addr, "").1));
            }
            series
        })
        .await
        .unwrap();
        let unhooked: Vec<_> = series
            .iter()
            .filter(|((family, ..), v)| family == UNHOOKED && **v != 0.0)
            .collect();
        assert!(
            unhooked.is_empty(),
            "the demo's hooked processes counted unhooked: {unhooked:?}"
        );
        let checked = pods.iter().all(|(pod, hook)| {
            [UNHOOKED, HOOK_UNKNOWN].iter().all(|family| {
                series.contains_key(&(family.to_string(), pod.to_string(), hook.to_string()))
            })
        });
        if checked {
            break series;
        }
        assert!(
            Instant::now() < deadline,
            "the monitors never checked the processes of {pods:?} for their hook: {series:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        series.values().all(|v| *v == 0.0),
        "hook check series not 0: {series:?}"
    );
}

/// No monitor told any pod `SliceNotEnforced` (the demo's pods load their hooks).
pub(crate) async fn assert_no_slice_not_enforced(client: &kube::Client) {
    let told: Vec<Event> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_SLICE_NOT_ENFORCED))
        .collect();
    assert!(told.is_empty(), "SliceNotEnforced on hooked pods: {told:?}");
}
