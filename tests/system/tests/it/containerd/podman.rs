//! A real CDI consumer (issue 29 item 4): Debian's podman 4.3 reads the CDI specs the AMD
//! device plugin (`--cdi`: `cdi::write_spec`) and the DRA driver (a prepared claim) write,
//! and its containers, run as uid 1000, get exactly the device nodes, env and mounts each
//! spec names — the expectations are read from the written specs, not restated here.
//!
//! The host stays untouched: podman runs in a private mount namespace (`unshare -m`) where
//! `/run` is a fresh tmpfs whose `cdi/` is the test's spec directory (podman 4.3 reads only
//! `/etc/cdi` and `/var/run/cdi`; `/etc/cdi` is hidden too when it exists) and `/dev` a
//! tmpfs holding the basic nodes and the capture's stand-in `/dev/kfd` and `/dev/dri/*`
//! (CDI takes a node's type and numbers from the host path, as on a real node); its store
//! (`vfs`) and run directory are the test's. The image is the tests' busybox one, built
//! here and loaded from its OCI archive, never pulled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::ClaimSource;
use hami_amdgpu_dra_plugin::dra_v1::Claim;
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_containerd_host::images::BusyboxImage;
use hami_containerd_host::shared::TEST_BUSYBOX;
use hami_dra_core::api::{AllocatedDeviceStatus, ResourceClaim};
use hami_dra_core::prepare::PrepareSettings;
use serde_json::{Value, json};

use super::{built, install, stand_in_dev};

/// What a machine without root or podman is told.
const INSTALL: &str = "run as root with Debian's podman (apt-get install podman)";
/// A Kubernetes-style claim UID starting with a digit (CDI 0.5.0's device names).
const CLAIM_UID: &str = "7f3c1a2e-5b4d-4c6e-8f00-000000000029";

/// Every container prints what it got: its `/dev/kfd` and `/dev/dri/*` character devices
/// (numbers), its environment, the mount options and (files) sizes of the paths given as
/// arguments, its uid.
const PROBE: &str = r#"for f in /dev/kfd /dev/dri/*; do [ -c "$f" ] && echo "dev $f $(stat -c '%t:%T' "$f")"; done
env | sed 's/^/env /'
for p in "$@"; do
  echo "mount $p $(awk -v p="$p" '$5 == p {print $6}' /proc/self/mountinfo | tail -n 1)"
  [ -f "$p" ] && echo "size $p $(wc -c < "$p")"
  [ -f "$p" ] && (: >> "$p") 2>/dev/null && echo "writable $p"
done
echo "uid $(id -u)""#;

/// The namespace's setup, then podman: `$T` is the test directory, `$AMD` and `$DRA` the CDI
/// names to run with, `$AMD_MOUNTS`/`$DRA_MOUNTS` the paths to probe.
const RUN: &str = r#"set -e
mount -t tmpfs -o mode=755 tmpfs /run
mkdir /run/cdi
mount --bind "$T/cdi" /run/cdi
if [ -d /etc/cdi ]; then mount -t tmpfs tmpfs /etc/cdi; fi
mount -t tmpfs -o mode=755 tmpfs /dev
for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
  set -- $n; mknod -m 666 "/dev/$1" c "$2" "$3"
done
mkdir /dev/shm /dev/pts
mount -t tmpfs tmpfs /dev/shm
cp -a "$T/dev/." /dev/
for f in /dev/kfd /dev/dri/*; do echo "dev $f $(stat -c '%t:%T' "$f")"; done > "$T/host.devs"
p() { podman --root "$T/podman/root" --runroot "$T/podman/run" --tmpdir "$T/podman/tmp" \
  --storage-driver vfs --cgroup-manager cgroupfs --events-backend file "$@"; }
p load -q -i "$T/busybox.tar"
# nofile and nproc within this host's hard limits: runc cannot raise them (podman's
# defaults for root are above them on CI machines).
run() {
  out=$1 dev=$2; shift 2
  p run --rm --network none --user 1000:1000 --ulimit nofile=1024:1024 \
    --ulimit nproc=1024:1024 --device "$dev" "$IMAGE" sh -c "$PROBE" probe "$@" \
    > "$T/$out" 2>&1 || echo "podman failed: $?" >> "$T/$out"
}
run amd.out "$AMD" $AMD_MOUNTS
run dra.out "$DRA" $DRA_MOUNTS
"#;

/// The one claim the DRA driver prepares.
struct OneClaim(ResourceClaim);

impl ClaimSource for OneClaim {
    async fn get(&self, _namespace: &str, _name: &str) -> Result<ResourceClaim, String> {
        Ok(self.0.clone())
    }

    async fn set_device_status(
        &self,
        _seen: &ResourceClaim,
        _driver: &str,
        _devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        Ok(())
    }
}

/// Root and podman, or why not.
fn host_ready() -> Result<(), String> {
    let root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    let podman = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && podman {
        Ok(())
    } else {
        Err(format!(
            "skipped: the podman CDI test needs root and podman ({INSTALL})"
        ))
    }
}

/// A spec's device nodes for the device `name`, with the common ones.
fn spec_nodes(spec: &Value, name: &str) -> BTreeSet<String> {
    let device = spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == name))
        .unwrap_or(&Value::Null);
    [&device["containerEdits"], &spec["containerEdits"]]
        .into_iter()
        .filter_map(|e| e["deviceNodes"].as_array())
        .flatten()
        .filter_map(|n| n["path"].as_str().map(str::to_owned))
        .collect()
}

/// The lines of `out` that start with `tag `, without it.
fn tagged<'a>(out: &'a str, tag: &str) -> Vec<&'a str> {
    let tag = format!("{tag} ");
    out.lines().filter_map(|l| l.strip_prefix(&tag)).collect()
}

/// The container saw exactly `nodes`, each with the host node's numbers.
fn assert_devices(out: &str, host: &str, nodes: &BTreeSet<String>) {
    let host: BTreeMap<&str, &str> = tagged(host, "dev")
        .into_iter()
        .filter_map(|l| l.split_once(' '))
        .collect();
    let seen: BTreeMap<&str, &str> = tagged(out, "dev")
        .into_iter()
        .filter_map(|l| l.split_once(' '))
        .collect();
    let seen_paths: BTreeSet<String> = seen.keys().map(|p| (*p).to_owned()).collect();
    assert_eq!(&seen_paths, nodes, "device nodes: {out}");
    for (path, numbers) in seen {
        assert_eq!(Some(&numbers), host.get(path), "{path}'s numbers: {out}");
    }
}

/// A DRA claim allocated on the capture's `device` with 1 GiB and 26 CUs of it.
fn dra_claim(device: &str, node: &str) -> Result<ResourceClaim, String> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "gpu", "namespace": "default", "uid": CLAIM_UID},
        "spec": {},
        "status": {
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": hami_dra_core::DRIVER, "pool": node,
                "device": device, "shareID": "share-1",
                "consumedCapacity": {"memory": "1Gi", "computeUnits": "26", "shares": "1"},
            }]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid-1"}],
        },
    }))
    .map_err(|e| format!("the test's claim: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_injects_what_the_plugin_and_dra_cdi_specs_name() -> Result<(), String> {
    let _machine = crate::MACHINE.read().await;
    if let Err(why) = host_ready() {
        eprintln!("{why}");
        return Ok(());
    }
    let dir = Scratch(std::env::temp_dir().join(format!("sys-podman-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    run_in(&dir.0).await
}

/// The test's directory, removed also when an assertion fails (podman's store is in it).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn run_in(dir: &Path) -> Result<(), String> {
    let tree = hami_sysfs_fixtures::mi210_xgmi().map_err(|e| e.to_string())?;
    stand_in_dev(&tree.dev_root(), &dir.join("dev"))?;
    let cdi = dir.join("cdi");
    let image = BusyboxImage {
        name: TEST_BUSYBOX.into(),
        cmd: vec!["/bin/sh".into()],
    };
    let archive = dir.join("busybox.tar");
    tokio::task::block_in_place(|| image.build(&dir.join("image"), &archive))?;

    // The device plugin's spec; the third card is the one asked for.
    let settings = RegistrationSettings::default();
    let devices = hami_amd_plugin::discover_report::build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &settings,
    )
    .map_err(|e| e.to_string())?
    .registration
    .devices;
    hami_amd_plugin::cdi::write_spec(&cdi, &devices).map_err(|e| e.to_string())?;
    let card = hami_amd_plugin::cdi::device_name(&devices[2]);
    let amd_spec: Value = read_json(&cdi.join(hami_amd_plugin::cdi::SPEC_FILE))?;

    // The DRA driver prepares a sliced claim on one card: its spec, hook config and region
    // file, the hook mounted from where the init container installs it.
    let hook = dir.join("hook/libamvgpu.so");
    install(&built("libamvgpu.so")?, &hook)?;
    let found = discover(&tree.sysfs_root()).map_err(|e| e.to_string())?;
    let registered = register(&found, &settings, |_| true);
    let by_name: BTreeMap<_, _> = hami_dra_core::slice::registered_by_name(&found, &registered)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let device = by_name.keys().nth(1).ok_or("no second device")?.clone();
    let driver = Driver::new(
        DriverConfig {
            settings: PrepareSettings {
                driver: hami_dra_core::DRIVER.into(),
                node: "n1".into(),
                hook_host_path: hook.display().to_string(),
                hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
                cache_host_root: dir.join("vgpu").display().to_string(),
            },
            devices: by_name,
            cdi_dir: cdi.clone(),
            checkpoint: dir.join("dra/checkpoint.json"),
            dmem: None,
        },
        OneClaim(dra_claim(&device, "n1")?),
    )
    .map_err(|e| format!("the DRA driver: {e}"))?;
    let prepared = driver
        .prepare(&[Claim {
            namespace: "default".into(),
            uid: CLAIM_UID.into(),
            name: "gpu".into(),
        }])
        .await;
    let ids = prepared
        .get(CLAIM_UID)
        .cloned()
        .unwrap_or_else(|| Err("no entry".into()))
        .map_err(|e| format!("prepare: {e}"))?;
    let dra_id = ids
        .first()
        .and_then(|d| d.cdi_device_ids.first())
        .ok_or("no CDI id")?
        .clone();
    let dra_spec: Value = read_json(&cdi.join(hami_dra_core::cdi_claim::file_name(CLAIM_UID)))?;
    let dra_mounts = dra_spec["containerEdits"]["mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(dra_mounts.len() >= 3, "a sliced claim mounts: {dra_spec:#}");

    let paths = |mounts: &[Value]| -> String {
        let list: Vec<&str> = mounts
            .iter()
            .filter_map(|m| m["containerPath"].as_str())
            .collect();
        list.join(" ")
    };
    let ran = tokio::task::block_in_place(|| {
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", RUN])
            .env("T", dir)
            .env("IMAGE", TEST_BUSYBOX)
            .env("PROBE", PROBE)
            .env("AMD", format!("{}={card}", hami_amd_plugin::cdi::CDI_KIND))
            .env("AMD_MOUNTS", "")
            .env("DRA", &dra_id)
            .env("DRA_MOUNTS", paths(&dra_mounts))
            .output()
    })
    .map_err(|e| format!("cannot run unshare: {e}"))?;
    if !ran.status.success() {
        return Err(format!(
            "podman's namespace: {}{}",
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr)
        ));
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let (host, amd, dra) = (read("host.devs"), read("amd.out"), read("dra.out"));

    // The plugin's spec: the card's nodes and /dev/kfd, no other card's.
    assert_eq!(tagged(&amd, "uid"), ["1000"], "{amd}");
    let nodes = spec_nodes(&amd_spec, &card);
    assert_eq!(nodes.len(), 3, "{amd_spec:#}");
    assert_devices(&amd, &host, &nodes);

    // The claim's spec: its nodes, every variable, every mount with its flags, the files
    // the host holds (the region file writable by the container's user).
    assert_eq!(tagged(&dra, "uid"), ["1000"], "{dra}");
    let name = dra_id.split_once('=').map(|(_, n)| n).unwrap_or_default();
    assert_devices(&dra, &host, &spec_nodes(&dra_spec, name));
    let env = tagged(&dra, "env");
    for var in dra_spec["containerEdits"]["env"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let var = var.as_str().unwrap_or_default();
        assert!(env.contains(&var), "{var} missing: {dra}");
    }
    assert!(env.iter().any(|v| v.starts_with("HSA_CU_MASK=")), "{dra}");
    let mounted: BTreeMap<&str, &str> = tagged(&dra, "mount")
        .into_iter()
        .map(|l| l.split_once(' ').unwrap_or((l, "")))
        .collect();
    let sizes: BTreeMap<&str, &str> = tagged(&dra, "size")
        .into_iter()
        .filter_map(|l| l.split_once(' '))
        .collect();
    let writable = tagged(&dra, "writable");
    for m in &dra_mounts {
        let (Some(inside), Some(host_path)) = (m["containerPath"].as_str(), m["hostPath"].as_str())
        else {
            return Err(format!("a mount without paths: {m}"));
        };
        let flags: BTreeSet<&str> = mounted
            .get(inside)
            .copied()
            .unwrap_or_default()
            .split(',')
            .collect();
        for want in ["ro", "nosuid", "nodev"] {
            let named = m["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == want));
            assert_eq!(
                flags.contains(want),
                named,
                "{inside}'s {want}: {flags:?}; {dra}"
            );
        }
        let meta = std::fs::metadata(host_path).map_err(|e| format!("{host_path}: {e}"))?;
        if meta.is_file() {
            assert_eq!(
                sizes.get(inside).map(|s| s.trim()),
                Some(meta.len().to_string().as_str()),
                "{inside} is {host_path}: {dra}"
            );
            if !flags.contains("ro") {
                assert!(writable.contains(&inside), "{inside} for uid 1000: {dra}");
            }
        }
    }
    drop(tree);
    Ok(())
}

fn read_json(path: &PathBuf) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
