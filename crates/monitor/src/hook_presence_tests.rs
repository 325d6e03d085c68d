use super::*;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;
use std::collections::HashSet;

pub(crate) const AMD_UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";
pub(crate) const NV_UID: &str = "bbbbbbbb-0000-4000-8000-000000000002";
pub(crate) const PLAIN_UID: &str = "cccccccc-0000-4000-8000-000000000003";

fn pod(uid: &str, name: &str, resource: Option<(&str, &str, &str)>) -> Pod {
    let (limits, annotations) = match resource {
        Some((res, key, value)) => (json!({res: "1"}), json!({key: value})),
        None => (json!({}), json!({})),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {"schedulerName": "hami-scheduler", "containers": [
            {"name": "main", "resources": {"limits": limits}}, {"name": "side"}]}
    }))
    .unwrap()
}

pub(crate) fn index() -> PodIndex {
    let pods = [
        pod(
            AMD_UID,
            "amd",
            Some((
                "amd.com/gpu",
                "hami.io/amd-devices-allocated",
                "G0,AMD Instinct MI210,1024,10:;",
            )),
        ),
        pod(
            NV_UID,
            "nv",
            Some((
                "nvidia.com/gpu",
                "hami.io/vgpu-devices-allocated",
                "GPU-0,NVIDIA,1024,10:;",
            )),
        ),
        pod(PLAIN_UID, "plain", None),
    ];
    PodIndex::from_pods(pods.iter(), "hami-scheduler")
}

pub(crate) const AMD_ENV: &[u8] =
    b"PATH=/bin\0HIP_DEVICE_MEMORY_LIMIT_0=1024m\0LD_AUDIT=/usr/local/vgpu/libamvgpu.so\0";
pub(crate) const NV_ENV: &[u8] = b"CUDA_DEVICE_MEMORY_LIMIT_0=1024m\0CUDA_DEVICE_SM_LIMIT=10\0";

pub(crate) fn maps_with(libs: &[&str]) -> String {
    let mut text = String::from(
        "55d0c0000000-55d0c0001000 r--p 00000000 fd:01 12 /usr/bin/python3\n\
         7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n",
    );
    for (i, lib) in libs.iter().enumerate() {
        text.push_str(&format!(
            "7f00{i:08x}-7f00{i:08x} r-xp 00000000 fd:01 {} {lib}\n",
            100 + i
        ));
    }
    text
}

pub(crate) fn facts(
    uid: &str,
    container: &str,
    env: &[u8],
    maps: Result<String, String>,
) -> ProcessFacts {
    ProcessFacts {
        pid: 4242,
        command: "python3".into(),
        pod_uid: uid.into(),
        container: container.into(),
        gpu_fds: Ok(true),
        env: Ok(slice_env(env)),
        maps,
    }
}

pub(crate) fn key(uid: &str, pod: &str, vendor: Vendor) -> ContainerHook {
    ContainerHook {
        pod_uid: uid.into(),
        namespace: "ml".into(),
        pod: pod.into(),
        container: "main".into(),
        vendor,
    }
}

#[test]
fn the_environment_says_which_hook_the_slice_expects() {
    let amd = slice_env(AMD_ENV);
    assert!(amd.expects(Vendor::Amd) && !amd.expects(Vendor::Nvidia));
    let nv = slice_env(NV_ENV);
    assert!(nv.expects(Vendor::Nvidia) && !nv.expects(Vendor::Amd));
    assert!(slice_env(b"CUDA_DEVICE_MEMORY_LIMIT=2g").expects(Vendor::Nvidia));
    // An opt-out, and near misses.
    assert!(
        !slice_env(b"CUDA_DEVICE_MEMORY_LIMIT_0=1g\0CUDA_DISABLE_CONTROL=true\0")
            .expects(Vendor::Nvidia)
    );
    assert!(
        slice_env(b"CUDA_DEVICE_MEMORY_LIMIT_0=1g\0CUDA_DISABLE_CONTROL=no\0")
            .expects(Vendor::Nvidia)
    );
    assert_eq!(slice_env(b"CUDA_DEVICE_MEMORY_LIMITS=1\0XHIP_DEVICE_MEMORY_LIMIT_0=1\0HIP_DEVICE_MEMORY_LIMIT_0\0"), SliceEnv::default());
}

#[test]
fn gpu_device_nodes() {
    for node in [
        "/dev/kfd",
        "/dev/dri/renderD128",
        "/dev/dri/card0",
        "/dev/nvidia0",
        "/dev/nvidia12",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ] {
        assert!(is_gpu_device_node(node), "{node}");
    }
    for other in [
        "/dev/null",
        "/dev/nvidia",
        "/dev/nvidia-caps",
        "/dev/nvidiax",
        "socket:[123]",
        "/tmp/dev/kfd",
        "/dev/kfd2",
    ] {
        assert!(!is_gpu_device_node(other), "{other}");
    }
}

#[test]
fn the_hook_is_found_by_file_name_whatever_its_mount_path() {
    let maps = maps_with(&[
        "/opt/hooks/amd/libamvgpu.so",
        "/usr/lib/libamdhip64.so.6.0.1",
    ]);
    assert!(maps_library(&maps, "libamvgpu.so"));
    assert!(maps_gpu_runtime(&maps));
    assert!(!maps_library(&maps, "libvgpu.so"));
    assert!(maps_library(
        &maps_with(&["/usr/local/vgpu/libvgpu.so (deleted)"]),
        "libvgpu.so"
    ));
    // A directory or another file named like the hook does not count.
    assert!(!maps_library(
        &maps_with(&["/libamvgpu.so/x.so", "/lib/libamvgpu.so.bak"]),
        "libamvgpu.so"
    ));
    assert!(!maps_gpu_runtime(&maps_with(&[
        "/lib/libcudart.so.12",
        "/lib/libcuda.sox"
    ])));
    assert!(maps_gpu_runtime(&maps_with(&[
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    ])));
    // Paths with spaces.
    assert!(maps_library(
        &maps_with(&["/my hooks/libamvgpu.so"]),
        "libamvgpu.so"
    ));
}

#[test]
fn an_unhooked_gpu_process_of_a_sliced_container_is_found() {
    let pods = index();
    let procs = [
        facts(
            AMD_UID,
            "main",
            AMD_ENV,
            Ok(maps_with(&["/usr/lib/libamdhip64.so.6"])),
        ),
        facts(
            NV_UID,
            "main",
            NV_ENV,
            Ok(maps_with(&[
                "/usr/local/vgpu/libvgpu.so",
                "/lib/libcuda.so.1",
            ])),
        ),
    ];
    let f = findings(&procs, &pods);
    assert_eq!(f.unhooked.len(), 1, "{f:?}");
    assert_eq!(f.unhooked[0].at, key(AMD_UID, "amd", Vendor::Amd));
    assert_eq!(
        f.tallies[&key(AMD_UID, "amd", Vendor::Amd)],
        Tally {
            unhooked: 1,
            unknown: 0,
            hooked: 0
        }
    );
    assert_eq!(
        f.tallies[&key(NV_UID, "nv", Vendor::Nvidia)],
        Tally {
            unhooked: 0,
            unknown: 0,
            hooked: 1
        }
    );
    assert!(f.unknown.is_empty());
    let message = event_message(&f.unhooked[0]);
    for part in [
        "4242",
        "python3",
        "main",
        "libamvgpu.so",
        "LD_AUDIT",
        "glibc",
        "2.34",
        "mounted",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
}

#[test]
fn processes_not_on_a_gpu_or_not_sliced_count_for_nothing() {
    let pods = index();
    let mut off_gpu = facts(AMD_UID, "main", AMD_ENV, Ok(maps_with(&[])));
    off_gpu.gpu_fds = Ok(false);
    let procs = [
        off_gpu,
        // The pod has no grant; another container of a granted pod; an unknown pod.
        facts(PLAIN_UID, "main", AMD_ENV, Ok(maps_with(&[]))),
        facts(AMD_UID, "side", AMD_ENV, Ok(maps_with(&[]))),
        facts(
            "dddddddd-0000-4000-8000-000000000004",
            "main",
            AMD_ENV,
            Ok(maps_with(&[])),
        ),
        // A granted container whose environment carries no limit (a whole card).
        facts(AMD_UID, "main", b"PATH=/bin\0", Ok(maps_with(&[]))),
        // The other vendor's limit in an AMD container.
        facts(AMD_UID, "main", NV_ENV, Ok(maps_with(&[]))),
    ];
    assert_eq!(findings(&procs, &pods), Findings::default());
}

fn denied<T>() -> Result<T, String> {
    Err("Permission denied (os error 13)".to_string())
}

#[test]
fn unreadable_facts_make_a_process_unknown_never_unhooked() {
    let pods = index();
    let mut no_env = facts(AMD_UID, "main", AMD_ENV, Ok(maps_with(&[])));
    no_env.env = denied();
    let mut nothing = facts(AMD_UID, "main", AMD_ENV, denied());
    nothing.gpu_fds = denied();
    let procs = [facts(AMD_UID, "main", AMD_ENV, denied()), no_env, nothing];
    let f = findings(&procs, &pods);
    assert!(f.unhooked.is_empty(), "{f:?}");
    assert_eq!(
        f.tallies[&key(AMD_UID, "amd", Vendor::Amd)],
        Tally {
            unhooked: 0,
            unknown: 3,
            hooked: 0
        }
    );
    assert!(
        f.unknown[0].reason.contains("maps: Permission denied"),
        "{:?}",
        f.unknown
    );
    assert!(f.unknown[1].reason.contains("environ"), "{:?}", f.unknown);
    assert!(f.unknown[2].reason.contains("fd:"), "{:?}", f.unknown);
    // Descriptors unreadable but a runtime mapped: on a GPU, and checkable.
    let mut fds_hidden = facts(
        AMD_UID,
        "main",
        AMD_ENV,
        Ok(maps_with(&["/opt/rocm/lib/libhsa-runtime64.so.1"])),
    );
    fds_hidden.gpu_fds = denied();
    assert_eq!(findings(&[fds_hidden], &pods).unhooked.len(), 1);
}

pub(crate) fn arb_facts() -> impl Strategy<Value = ProcessFacts> {
    let uid = prop::sample::select(vec![AMD_UID, NV_UID, PLAIN_UID, "x"]);
    let container = prop::sample::select(vec!["main", "side"]);
    let env = prop::sample::select(vec![
        AMD_ENV,
        NV_ENV,
        b"A=b".as_slice(),
        b"CUDA_DEVICE_MEMORY_LIMIT=1\0CUDA_DISABLE_CONTROL=1",
    ]);
    let libs = prop::collection::vec(
        prop::sample::select(vec![
            "/a/libamvgpu.so",
            "/b/libvgpu.so",
            "/c/libamdhip64.so",
            "/d/libcuda.so.1",
            "/e/libc.so.6",
        ]),
        0..4,
    );
    (uid, container, env, libs, any::<(bool, bool, bool, bool)>()).prop_map(
        |(uid, container, env, libs, (fds, fds_ok, env_ok, maps_ok))| ProcessFacts {
            pid: 1,
            command: String::new(),
            pod_uid: uid.into(),
            container: container.into(),
            gpu_fds: if fds_ok {
                Ok(fds)
            } else {
                Err("denied".into())
            },
            env: if env_ok {
                Ok(slice_env(env))
            } else {
                Err("denied".into())
            },
            maps: if maps_ok {
                Ok(maps_with(&libs))
            } else {
                Err("denied".into())
            },
        },
    )
}

proptest! {
    #[test]
    fn parsers_never_panic(text in "\\PC{0,300}", bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = maps_library(&text, "libamvgpu.so");
        let _ = maps_gpu_runtime(&text);
        let _ = slice_env(&bytes);
        let _ = is_gpu_device_node(&text);
    }

    /// Every counted process is counted once per expected hook; an unhooked one always had
    /// readable maps without the hook; an unreadable fact never yields unhooked.
    #[test]
    fn counts_agree_with_the_facts(mut procs in prop::collection::vec(arb_facts(), 0..12)) {
        for (i, p) in procs.iter_mut().enumerate() {
            p.pid = i as i32;
        }
        let pods = index();
        let f = findings(&procs, &pods);
        let total: u32 = f.tallies.values().map(|t| t.unhooked).sum();
        prop_assert_eq!(total as usize, f.unhooked.len());
        let unknown: u32 = f.tallies.values().map(|t| t.unknown).sum();
        prop_assert_eq!(unknown as usize, f.unknown.len());
        for u in &f.unhooked {
            prop_assert!(u.at.pod_uid == AMD_UID || u.at.pod_uid == NV_UID);
            prop_assert_eq!(&u.at.container, "main");
        }
        for u in &f.unhooked {
            let p = &procs[u.pid as usize];
            let maps = p.maps.as_ref().unwrap();
            prop_assert!(p.env.is_ok() && !maps_library(maps, u.at.vendor.hook_library()));
        }
        // Dropping every unreadable process changes no unhooked finding.
        let readable: Vec<_> = procs.iter().filter(|p| p.env.is_ok() && p.maps.is_ok()).cloned().collect();
        prop_assert_eq!(findings(&readable, &pods).unhooked, f.unhooked);
    }
}

#[test]
fn each_container_is_told_once() {
    let at = |uid: &str, container: &str| ContainerHook {
        pod_uid: uid.into(),
        namespace: "ml".into(),
        pod: "p".into(),
        container: container.into(),
        vendor: Vendor::Amd,
    };
    let u = |uid: &str, container: &str, pid: i32| Unhooked {
        at: at(uid, container),
        pid,
        command: "x".into(),
    };
    let unhooked = [
        u("a", "main", 1),
        u("a", "main", 2),
        u("a", "side", 3),
        u("b", "main", 4),
    ];
    let told: HashSet<(String, String)> = [("b".to_string(), "main".to_string())].into();
    let pids: Vec<i32> = to_tell(&unhooked, &told).iter().map(|u| u.pid).collect();
    assert_eq!(pids, vec![1, 3]);
}
