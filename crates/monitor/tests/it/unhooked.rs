//! Issue 29: a sliced container whose process runs on the GPU without the memory hook
//! (ld.so could not load `libamvgpu.so` from `LD_AUDIT`: it warns and goes on) has NO
//! memory limit. The monitor must say so: `hami_container_unhooked_processes` > 0 and one
//! `SliceNotEnforced` Warning Event on the pod, once.
//!
//! The processes are real (`sleep` started with the slice's environment; the hooked one
//! with the real `libamvgpu.so` of this workspace in `LD_AUDIT`), so their
//! `/proc/<pid>/maps` and `environ` are the kernel's. What a kubelet would add around
//! them is faked in a proc-shaped tree, as the other tests here do: `<pid>/cgroup` names
//! the pod and container (this test process cannot create kubepods cgroups), `<pid>/fd/3`
//! links to `/dev/kfd` (no GPU here); `maps`, `environ` and `comm` link to the real
//! process's entries.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{kubepods_cgroup, scrape};
use hami_local_ports::free_port;
use hami_monitor::hook_presence::REASON_SLICE_NOT_ENFORCED;
use hami_monitor::metrics::{LegacyMetrics, render};
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;
use hami_monitor::server::{ServeConfig, serve};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "node-h";
const AMD_GRANT: &str = "G0,AMD Instinct MI210,1024,10:;";

fn base_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hami-monitor-unhooked-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("hook/containers")).unwrap();
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    std::fs::create_dir_all(dir.join("sys")).unwrap();
    dir
}

/// The hook this workspace built (hami-hip-hook is a dev-dependency: its cdylib lands next
/// to this test binary).
fn hook_library() -> PathBuf {
    let path = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libamvgpu.so");
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A container id made of `n`.
fn cid(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

/// A real `sleep` with the slice's environment; `ld_audit` as the device plugin sets it.
struct Sleeper(Child);

impl Sleeper {
    fn start(ld_audit: Option<&Path>, limit: bool) -> Sleeper {
        Self::start_as(ld_audit, limit, None)
    }

    /// [`Sleeper::start`] as user `uid` (this process's when `None`).
    fn start_as(ld_audit: Option<&Path>, limit: bool, uid: Option<u32>) -> Sleeper {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("sleep");
        cmd.arg("600").env_clear().env("PATH", "/usr/bin:/bin");
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        if limit {
            cmd.env("HIP_DEVICE_MEMORY_LIMIT_0", "1024m")
                .env("HSA_CU_MASK", "0:0-9");
        }
        if let Some(hook) = ld_audit {
            cmd.env("LD_AUDIT", hook);
        }
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Started once ld.so has mapped the program's libraries (audit libraries come first).
        let maps = format!("/proc/{}/maps", child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&maps)
            .unwrap_or_default()
            .contains("libc.so")
        {
            assert!(Instant::now() < deadline, "sleep never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sleeper(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn maps(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid())).unwrap()
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `<proc>/<pid>/`: the kubelet's cgroup for (`pod_uid`, `cid`), a descriptor on `/dev/kfd`
/// when `on_gpu`, and the real process's `maps`, `environ` and `comm`.
fn attribute(proc_root: &Path, pid: u32, pod_uid: &str, cid: &str, on_gpu: bool) -> PathBuf {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    std::fs::write(dir.join("cgroup"), kubepods_cgroup(pod_uid, cid)).unwrap();
    std::os::unix::fs::symlink("/dev/null", dir.join("fd/0")).unwrap();
    if on_gpu {
        std::os::unix::fs::symlink("/dev/kfd", dir.join("fd/3")).unwrap();
    }
    for entry in ["maps", "environ", "comm"] {
        std::os::unix::fs::symlink(format!("/proc/{pid}/{entry}"), dir.join(entry)).unwrap();
    }
    dir
}

fn pod_json(name: &str, uid: Option<&str>, grant: Option<&str>, cid: &str) -> serde_json::Value {
    let (annotations, limits) = match grant {
        Some(g) => (
            json!({"hami.io/amd-devices-allocated": g}),
            json!({"amd.com/gpu": "1"}),
        ),
        None => (json!({}), json!({})),
    };
    let mut metadata = json!({"name": name, "namespace": "default", "annotations": annotations});
    if let Some(uid) = uid {
        metadata["uid"] = json!(uid);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": NODE, "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main",
            "containerID": format!("containerd://{cid}"), "image": "x", "imageID": "x",
            "ready": true, "restartCount": 0}]}
    })
}

fn monitor(base: &Path) -> NodeMonitor {
    NodeMonitor::new(MonitorConfig {
        hook_path: base.join("hook"),
        proc_root: base.join("proc"),
        sys_root: base.join("sys"),
        node_name: NODE.into(),
        gc_grace: Duration::from_secs(3600),
        nvml_library: None,
    })
}

/// `hami_container_unhooked_processes` and `hami_container_hook_unknown_processes` of a
/// metrics text: (metric, pod) → value.
fn hook_series(text: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        for metric in [
            "hami_container_unhooked_processes",
            "hami_container_hook_unknown_processes",
        ] {
            let Some(rest) = line.strip_prefix(&format!("{metric}{{")) else {
                continue;
            };
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            assert!(labels.contains("hook=\"libamvgpu.so\""), "{line}");
            assert!(labels.contains("container=\"main\""), "{line}");
            let pod = labels
                .split("pod=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            out.insert((metric.to_owned(), pod.to_owned()), value.parse().unwrap());
        }
    }
    out
}

async fn slice_events(api: &Api<Event>) -> Vec<Event> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_SLICE_NOT_ENFORCED))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_process_without_the_hook_is_counted_and_its_pod_told_once() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let base = base_dir("served");
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut uids = BTreeMap::new();
    for (name, grant, n) in [("sliced", Some(AMD_GRANT), 1), ("plain", None, 2)] {
        let pod: Pod = serde_json::from_value(pod_json(name, None, grant, &cid(n))).unwrap();
        let created = pods.create(&PostParams::default(), &pod).await.unwrap();
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": pod.status})),
        )
        .await
        .unwrap();
        uids.insert(name, created.metadata.uid.unwrap());
    }
    // The defect: LD_AUDIT names a hook that is not there; ld.so warns and runs the program.
    let unhooked = Sleeper::start(Some(Path::new("/nonexistent/vgpu/libamvgpu.so")), true);
    assert!(!unhooked.maps().contains("libamvgpu.so"));
    attribute(
        &base.join("proc"),
        unhooked.pid(),
        &uids["sliced"],
        &cid(1),
        true,
    );
    // On a GPU, same environment, but its pod has no grant: not a slice.
    let plain = Sleeper::start(None, true);
    attribute(
        &base.join("proc"),
        plain.pid(),
        &uids["plain"],
        &cid(2),
        true,
    );

    let port = free_port();
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: base.join("hook"),
            proc_root: base.join("proc"),
            sys_root: base.join("sys"),
            node_name: NODE.into(),
            gc_grace: Duration::from_secs(3600),
            nvml_library: None,
        },
        bind: format!("127.0.0.1:{port}").parse().unwrap(),
        legacy_metrics: LegacyMetrics::None,
        scheduler_name: "hami-scheduler".into(),
        refresh_interval: Duration::from_secs(1),
    };
    let task = tokio::spawn(serve(config, client.clone(), std::future::pending()));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = scrape(port).await.unwrap_or_default();
        let series = hook_series(&text);
        if series.get(&("hami_container_unhooked_processes".into(), "sliced".into())) == Some(&1.0)
            && !slice_events(&events).await.is_empty()
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no unhooked process reported:\n{text}\nevents: {:?}",
            slice_events(&events).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let series = hook_series(&text);
    assert_eq!(
        series,
        BTreeMap::from([
            (
                (
                    "hami_container_hook_unknown_processes".into(),
                    "sliced".into()
                ),
                0.0
            ),
            (
                ("hami_container_unhooked_processes".into(), "sliced".into()),
                1.0
            ),
        ]),
        "only the sliced pod's container has series:\n{text}"
    );
    assert!(
        text.contains("# HELP hami_container_unhooked_processes"),
        "{text}"
    );
    // Several more refreshes (1 s each): still one Event, on the sliced pod.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let told = slice_events(&events).await;
    assert_eq!(told.len(), 1, "{told:#?}");
    let event = &told[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.name.as_deref(), Some("sliced"));
    assert_eq!(
        event.involved_object.uid.as_deref(),
        Some(uids["sliced"].as_str())
    );
    let message = event.message.clone().unwrap_or_default();
    let pid = unhooked.pid().to_string();
    for part in [
        pid.as_str(),
        "sleep",
        "main",
        "libamvgpu.so",
        "LD_AUDIT",
        "2.34",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    task.abort();
    drop((unhooked, plain));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_process_with_the_real_hook_counts_zero_and_nobody_is_told() {
    let base = base_dir("hooked");
    let uid = "aaaaaaaa-0000-4000-8000-00000000000a";
    let pod: Pod =
        serde_json::from_value(pod_json("hooked", Some(uid), Some(AMD_GRANT), &cid(3))).unwrap();
    let hooked = Sleeper::start(Some(&hook_library()), true);
    assert!(
        hooked.maps().contains("/libamvgpu.so"),
        "ld.so loaded the hook:\n{}",
        hooked.maps()
    );
    attribute(&base.join("proc"), hooked.pid(), uid, &cid(3), true);
    let m = monitor(&base);
    m.refresh(PodIndex::from_pods([&pod], "hami-scheduler"));
    let text = render(&m.snapshot(), LegacyMetrics::None);
    assert_eq!(
        hook_series(&text),
        BTreeMap::from([
            (
                (
                    "hami_container_hook_unknown_processes".into(),
                    "hooked".into()
                ),
                0.0
            ),
            (
                ("hami_container_unhooked_processes".into(), "hooked".into()),
                0.0
            ),
        ]),
        "{text}"
    );
    assert!(m.hooks().take_events().is_empty());
    let _ = std::fs::remove_dir_all(&base);
}

/// A log sink for one thread's subscriber.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn processes_off_the_gpu_gone_or_unreadable_are_never_unhooked() {
    let base = base_dir("hostile");
    let proc_root = base.join("proc");
    let uid = "bbbbbbbb-0000-4000-8000-00000000000b";
    let pod: Pod =
        serde_json::from_value(pod_json("hostile", Some(uid), Some(AMD_GRANT), &cid(4))).unwrap();
    let index = PodIndex::from_pods([&pod], "hami-scheduler");
    // Sliced, unhooked, but on no GPU (no device descriptor, no runtime mapped).
    let idle = Sleeper::start(None, true);
    attribute(&proc_root, idle.pid(), uid, &cid(4), false);
    // On a GPU without the hook, but its environment has no limit (a whole card).
    let whole = Sleeper::start(None, false);
    attribute(&proc_root, whole.pid(), uid, &cid(4), true);
    // Exits between the listing and the reads: its entries dangle, as the kernel's vanish.
    let mut gone = Sleeper::start(None, true);
    attribute(&proc_root, gone.pid(), uid, &cid(4), true);
    gone.stop();
    // Its maps cannot be read: EACCES for a monitor without the right (root cannot be
    // denied, so as root the entry is made unreadable another way: a directory).
    let hidden = Sleeper::start(None, true);
    let dir = attribute(&proc_root, hidden.pid(), uid, &cid(4), true);
    std::fs::remove_file(dir.join("maps")).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::create_dir(dir.join("maps")).unwrap();
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(dir.join("maps"), "x").unwrap();
        std::fs::set_permissions(dir.join("maps"), std::fs::Permissions::from_mode(0o000)).unwrap();
    }

    let m = monitor(&base);
    let log = Log::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        m.refresh(index.clone());
        m.refresh(index.clone());
    });
    let text = render(&m.snapshot(), LegacyMetrics::None);
    assert_eq!(
        hook_series(&text),
        BTreeMap::from([
            (
                (
                    "hami_container_hook_unknown_processes".into(),
                    "hostile".into()
                ),
                1.0
            ),
            (
                ("hami_container_unhooked_processes".into(), "hostile".into()),
                0.0
            ),
        ]),
        "{text}"
    );
    assert!(m.hooks().take_events().is_empty());
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        logged
            .matches("cannot tell whether the memory hook")
            .count(),
        1,
        "said once over two passes:\n{logged}"
    );
    assert!(
        logged.contains(&format!("pid={}", hidden.pid())),
        "{logged}"
    );
    assert!(
        !logged.contains(&format!("pid={}", gone.pid())),
        "nothing about the exited process:\n{logged}"
    );
    let errors = m.errors().counts();
    assert!(!errors.keys().any(|k| k.starts_with("proc")), "{errors:?}");
    assert!(!logged.contains("SliceNotEnforced"), "{logged}");
    drop((idle, whole, hidden));
    let _ = std::fs::remove_dir_all(&base);
}

/// `/proc/<pid>/stat` of a real process with field 22 (start time) moved by `shift`: the
/// same pid as another process would see it.
fn stat_shifted(pid: u32, shift: u64) -> String {
    let real = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let close = real.rfind(')').unwrap();
    let (head, rest) = real.split_at(close + 1);
    let mut fields: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
    // `rest` starts at field 3.
    let start: u64 = fields[22 - 3].parse().unwrap();
    fields[22 - 3] = (start + shift).to_string();
    format!("{head} {}\n", fields.join(" "))
}

/// The (hooked, unknown) counts of the hook check's last pass for the container.
fn hooked_and_unknown(m: &NodeMonitor) -> (u32, u32) {
    let tallies = m.hooks().tallies();
    assert_eq!(tallies.len(), 1, "{tallies:?}");
    (tallies[0].1.hooked, tallies[0].1.unknown)
}

/// A process found hooked is not read again: after the first pass its `maps` and
/// `environ` are made unreadable in the tree, and it still counts as hooked (read, it would
/// be unknown). The same pid with another start time (a new process) is read again, and a
/// process gone is forgotten.
#[test]
fn a_hooked_process_is_read_once_and_a_reused_pid_again() {
    let base = base_dir("remembered");
    let proc_root = base.join("proc");
    let uid = "cccccccc-0000-4000-8000-00000000000c";
    let pod: Pod =
        serde_json::from_value(pod_json("remembered", Some(uid), Some(AMD_GRANT), &cid(5)))
            .unwrap();
    let index = PodIndex::from_pods([&pod], "hami-scheduler");
    let hooked = Sleeper::start(Some(&hook_library()), true);
    let dir = attribute(&proc_root, hooked.pid(), uid, &cid(5), true);
    std::fs::write(dir.join("stat"), stat_shifted(hooked.pid(), 0)).unwrap();
    let m = monitor(&base);
    m.refresh(index.clone());
    assert_eq!(hooked_and_unknown(&m), (1, 0));
    assert_eq!(m.hooks().remembered_hooked(), 1);

    // Read now, these say "unknown" (a directory cannot be read as a file).
    for entry in ["maps", "environ"] {
        std::fs::remove_file(dir.join(entry)).unwrap();
        std::fs::create_dir(dir.join(entry)).unwrap();
    }
    for _ in 0..3 {
        m.refresh(index.clone());
        assert_eq!(hooked_and_unknown(&m), (1, 0), "not read again");
    }

    // Another process on the same pid: read, so unknown, and nothing remembered.
    std::fs::write(dir.join("stat"), stat_shifted(hooked.pid(), 1)).unwrap();
    m.refresh(index.clone());
    assert_eq!(hooked_and_unknown(&m), (0, 1), "the new process is read");
    assert_eq!(m.hooks().remembered_hooked(), 0);

    // Hooked again, then gone: forgotten.
    for entry in ["maps", "environ"] {
        std::fs::remove_dir(dir.join(entry)).unwrap();
        std::os::unix::fs::symlink(format!("/proc/{}/{entry}", hooked.pid()), dir.join(entry))
            .unwrap();
    }
    m.refresh(index.clone());
    assert_eq!(hooked_and_unknown(&m), (1, 0));
    assert_eq!(m.hooks().remembered_hooked(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
    m.refresh(index.clone());
    assert!(m.hooks().tallies().is_empty());
    assert_eq!(m.hooks().remembered_hooked(), 0);
    drop(hooked);
    let _ = std::fs::remove_dir_all(&base);
}

/// `execve` replaces the program image, and the hook with it: a hooked shell that execs a
/// program without `LD_AUDIT` is not remembered as hooked (its start code and stack, in
/// its identity, moved) and the new program is found unhooked.
#[test]
fn a_hooked_process_that_execs_without_the_hook_is_read_again() {
    let base = base_dir("exec");
    let uid = "dddddddd-0000-4000-8000-00000000000d";
    let pod: Pod =
        serde_json::from_value(pod_json("exec", Some(uid), Some(AMD_GRANT), &cid(6))).unwrap();
    let index = PodIndex::from_pods([&pod], "hami-scheduler");
    let child = Command::new("sh")
        .args(["-c", "read _; exec env -u LD_AUDIT sleep 600"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HIP_DEVICE_MEMORY_LIMIT_0", "1024m")
        .env("LD_AUDIT", hook_library())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut shell = Sleeper(child);
    let pid = shell.pid();
    let wait_for = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("the shell never loaded the hook", &|m| {
        m.contains("/libamvgpu.so") && m.contains("libc.so")
    });
    let dir = attribute(&base.join("proc"), pid, uid, &cid(6), true);
    std::os::unix::fs::symlink(format!("/proc/{pid}/stat"), dir.join("stat")).unwrap();
    let m = monitor(&base);
    m.refresh(index.clone());
    assert_eq!(hooked_and_unknown(&m), (1, 0));
    assert_eq!(m.hooks().remembered_hooked(), 1);

    shell.0.stdin.take().unwrap().write_all(b"\n").unwrap();
    let comm = format!("/proc/{pid}/comm");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&comm).unwrap_or_default() != "sleep\n" {
        assert!(Instant::now() < deadline, "sleep never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for("sleep never started", &|m| m.contains("libc.so"));
    m.refresh(index.clone());
    let tallies = m.hooks().tallies();
    assert_eq!(tallies.len(), 1, "{tallies:?}");
    assert_eq!(
        (tallies[0].1.hooked, tallies[0].1.unhooked),
        (0, 1),
        "{tallies:?}"
    );
    assert_eq!(m.hooks().remembered_hooked(), 0);
    drop(shell);
    let _ = std::fs::remove_dir_all(&base);
}

/// The calling thread's effective capabilities become `CAP_SYS_PTRACE` alone (the
/// DaemonSet's monitor: root with every capability dropped but that one); its permitted
/// set is kept. Capabilities are per thread: the others of this process keep theirs.
fn only_sys_ptrace_in_this_thread() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_PTRACE: u32 = 19;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3) into `data` for this thread (pid 0).
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective = 1 << CAP_SYS_PTRACE;
    data[1].effective = 0;
    // SAFETY: capset reads the header and two `Data` for this thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// A container that runs as another user (uid 1000, most real images), seen by the
/// DaemonSet's monitor, which is root with only `CAP_SYS_PTRACE`: the process's `environ`
/// (mode 0400, its owner's) is refused to it, so it reads the environment from the
/// process's memory and counts the process unhooked, not unknown; the hooked one of the
/// same user counts 0.
#[test]
fn another_users_process_is_checked_by_a_monitor_with_only_sys_ptrace() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (to run processes as uid 1000 and keep CAP_SYS_PTRACE)");
        return;
    }
    let base = base_dir("other-user");
    let proc_root = base.join("proc");
    let pods: Vec<Pod> = [("unhooked-user", 5), ("hooked-user", 6)]
        .into_iter()
        .map(|(name, n)| {
            let uid = format!("cccccccc-0000-4000-8000-00000000000{n}");
            serde_json::from_value(pod_json(name, Some(&uid), Some(AMD_GRANT), &cid(n))).unwrap()
        })
        .collect();
    let index = PodIndex::from_pods(pods.iter(), "hami-scheduler");
    // The hook where uid 1000 may read it (the build tree may be closed to others).
    let hook = base.join("libamvgpu.so");
    std::fs::copy(hook_library(), &hook).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let open = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(&base, open.clone()).unwrap();
        std::fs::set_permissions(&hook, open).unwrap();
    }
    let unhooked = Sleeper::start_as(None, true, Some(1000));
    let hooked = Sleeper::start_as(Some(&hook), true, Some(1000));
    assert!(hooked.maps().contains("/libamvgpu.so"), "{}", hooked.maps());
    for (sleeper, pod) in [(&unhooked, &pods[0]), (&hooked, &pods[1])] {
        let uid = pod.metadata.uid.as_deref().unwrap();
        let n = if sleeper.pid() == unhooked.pid() {
            5
        } else {
            6
        };
        let dir = attribute(&proc_root, sleeper.pid(), uid, &cid(n), true);
        std::os::unix::fs::symlink(format!("/proc/{}/stat", sleeper.pid()), dir.join("stat"))
            .unwrap();
    }
    let m = monitor(&base);
    let refused = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                only_sys_ptrace_in_this_thread();
                let refused = std::fs::read(format!("/proc/{}/environ", unhooked.pid()))
                    .err()
                    .map(|e| e.kind());
                m.refresh(index.clone());
                refused
            })
            .join()
            .unwrap()
    });
    assert_eq!(
        refused,
        Some(std::io::ErrorKind::PermissionDenied),
        "the thread was not held to CAP_SYS_PTRACE: it opened another user's environ"
    );
    let text = render(&m.snapshot(), LegacyMetrics::None);
    let series = hook_series(&text);
    let want = |family: &str, pod: &str| series.get(&(family.to_owned(), pod.to_owned())).copied();
    assert_eq!(
        [
            want("hami_container_unhooked_processes", "unhooked-user"),
            want("hami_container_hook_unknown_processes", "unhooked-user"),
            want("hami_container_unhooked_processes", "hooked-user"),
            want("hami_container_hook_unknown_processes", "hooked-user"),
        ],
        [Some(1.0), Some(0.0), Some(0.0), Some(0.0)],
        "{text}"
    );
    let told = m.hooks().take_events();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].pod, "unhooked-user");
    drop((unhooked, hooked));
    let _ = std::fs::remove_dir_all(&base);
}
