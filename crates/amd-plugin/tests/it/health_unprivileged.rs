//! Health where the plugin cannot open the device nodes (issue 13 item 2): on a real node the
//! unprivileged plugin container's device cgroup refuses `open()` of the bind-mounted
//! `/dev/dri/renderD*` (EPERM). Modelled with real character-device nodes (`mknod`, as the
//! host's /dev has them) whose `open()` fails here too — no DRM driver serves major 226 on
//! this machine, so it answers ENXIO — while `stat` works, exactly as under the cgroup.
//! Every GPU must register healthy; a node with the wrong numbers, or no /dev/kfd, must not.

use std::ffi::CString;
use std::path::Path;

use hami_amd_plugin::discover_report::build_report;
use hami_amd_plugin::registration::RegistrationSettings;

fn mknod_char(path: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(path);
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path; mknod only reads it.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {} c {major} {minor}: {} — this test needs CAP_MKNOD (run as root, as CI does)",
        path.display(),
        std::io::Error::last_os_error()
    );
}

#[test]
fn gpus_are_healthy_when_open_is_refused_but_the_nodes_are_there() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let dev = tree.dev_root();
    let settings = RegistrationSettings::default();
    let renders: Vec<u32> = build_report(&tree.sysfs_root(), &dev, &settings)
        .unwrap()
        .registration
        .devices
        .iter()
        .map(|d| d.render)
        .collect();
    assert_eq!(renders.len(), 8);
    for r in &renders {
        mknod_char(&dev.join(format!("dri/renderD{r}")), 226, *r);
    }
    // /dev/kfd's major is dynamic on real kernels; 511 is unassigned here, so open fails.
    mknod_char(&dev.join("kfd"), 511, 0);
    for p in [
        dev.join(format!("dri/renderD{}", renders[0])),
        dev.join("kfd"),
    ] {
        let err = std::fs::File::open(&p).expect_err("the model needs open() to fail");
        assert!(
            matches!(
                err.raw_os_error(),
                Some(libc::ENXIO | libc::ENODEV | libc::EPERM | libc::EACCES)
            ),
            "{}: {err}",
            p.display()
        );
    }
    let report = build_report(&tree.sysfs_root(), &dev, &settings).unwrap();
    let health: Vec<bool> = report
        .registration
        .devices
        .iter()
        .map(|d| d.info.health)
        .collect();
    assert_eq!(
        health,
        vec![true; 8],
        "open refused must not mean unhealthy"
    );

    // sysfs says GPU 0's render node is 226:<r0>, but the /dev node there has other numbers
    // (a /dev tree that is not this node's): unhealthy, with the numbers in the reason.
    let r0 = renders[0];
    mknod_char(&dev.join(format!("dri/renderD{r0}")), 226, r0 + 1);
    let sys_dev = tree.sysfs_root().join(format!("class/drm/renderD{r0}"));
    std::fs::create_dir_all(&sys_dev).unwrap();
    std::fs::write(sys_dev.join("dev"), format!("226:{r0}\n")).unwrap();
    let why = hami_amd_plugin::health::render_node_problem(&tree.sysfs_root(), &dev, r0).unwrap();
    assert!(why.contains(&format!("226:{}", r0 + 1)), "{why}");
    let report = build_report(&tree.sysfs_root(), &dev, &settings).unwrap();
    assert!(!report.registration.devices[0].info.health);
    assert!(
        report.registration.devices[1..]
            .iter()
            .all(|d| d.info.health)
    );

    // No /dev/kfd: ROCm cannot reach any GPU.
    std::fs::remove_file(dev.join("kfd")).unwrap();
    let report = build_report(&tree.sysfs_root(), &dev, &settings).unwrap();
    assert!(report.registration.devices.iter().all(|d| !d.info.health));
}
