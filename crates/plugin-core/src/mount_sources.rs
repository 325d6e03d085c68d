//! Every host path an Allocate answer mounts must exist before kubelet gets it (issue 29).
//! containerd 1.6's CRI plugin creates a missing bind-mount source as an empty directory
//! on the host, so a hook library that is not installed would leave the container running
//! with an empty directory where the hook belongs: no limits, and no error anywhere. The
//! plugin is the last place that knows what the path was for.

use std::path::Path;

use hami_protocol::container_plan::ContainerPlan;
use hami_protocol::names::Vendor;

/// The refusal for the first mount of `plan` whose host path `exists` says is missing, if
/// any; it names the path and what to install for `vendor`.
pub fn check_mount_sources(
    plan: &ContainerPlan,
    vendor: Vendor,
    exists: impl Fn(&Path) -> bool,
) -> Result<(), String> {
    let Some(missing) = plan
        .mounts
        .iter()
        .find(|m| !exists(Path::new(&m.host_path)))
    else {
        return Ok(());
    };
    let (hook, flag) = match vendor {
        Vendor::Amd => ("libamvgpu.so", "--host-hook-path (HOST_HOOK_PATH)"),
        Vendor::Nvidia => ("libvgpu.so", "--hook-path (HOOK_PATH)"),
    };
    Err(format!(
        "the container would mount {host} at {container}, but {host} does not exist on this \
         node: install the HAMi hook files there ({hook} is copied into <{flag}>/vgpu by the \
         device plugin DaemonSet's init container; check that it ran and that {flag} names \
         that host directory). Refused: a container runtime would create an empty directory \
         in its place and run the container without its GPU limits",
        host = missing.host_path,
        container = missing.container_path,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::container_plan::MountPlan;

    fn plan(paths: &[&str]) -> ContainerPlan {
        ContainerPlan {
            mounts: paths
                .iter()
                .map(|p| MountPlan {
                    container_path: format!("/in{p}"),
                    host_path: (*p).into(),
                    read_only: true,
                })
                .collect(),
            ..ContainerPlan::default()
        }
    }

    #[test]
    fn the_first_missing_source_is_named_with_what_to_install() {
        let p = plan(&["/there", "/usr/local/vgpu/libamvgpu.so", "/also-missing"]);
        let err =
            check_mount_sources(&p, Vendor::Amd, |path| path == Path::new("/there")).unwrap_err();
        assert!(
            err.contains("mount /usr/local/vgpu/libamvgpu.so at /in/usr/local/vgpu/libamvgpu.so"),
            "{err}"
        );
        assert!(err.contains("--host-hook-path"), "{err}");
        assert!(!err.contains("/also-missing"), "{err}");
        let err = check_mount_sources(&p, Vendor::Nvidia, |_| false).unwrap_err();
        assert!(
            err.contains("/there") && err.contains("libvgpu.so"),
            "{err}"
        );
        assert!(err.contains("--hook-path (HOOK_PATH)"), "{err}");
    }

    #[test]
    fn a_plan_whose_sources_all_exist_passes() {
        assert_eq!(
            check_mount_sources(&plan(&["/a", "/b"]), Vendor::Amd, |_| true),
            Ok(())
        );
        assert_eq!(
            check_mount_sources(&plan(&[]), Vendor::Nvidia, |_| false),
            Ok(())
        );
    }
}
