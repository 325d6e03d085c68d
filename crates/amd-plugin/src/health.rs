//! Device health without opening the device (issue 13 item 2).
//!
//! A GPU is healthy when its DRM render node `<dev_root>/dri/renderD<M>` exists and is the
//! character device the kernel gave that GPU (sysfs `class/drm/renderD<M>/dev`, else DRM's
//! fixed numbering 226:M), and `<dev_root>/kfd` exists (ROCm reaches every GPU through it);
//! when AMD's device-metrics exporter runs, it must not call the GPU unhealthy either
//! (`exporter.rs`, combined by the publisher).
//!
//! Why `stat` and not `open`: the plugin container is unprivileged, and its device cgroup
//! (runc/crun's default allowlist, cgroup v2's eBPF filter) refuses `open()` of a device
//! node that is merely bind-mounted, with EPERM, even `O_RDONLY`. An open-based check would
//! call every GPU unhealthy on a real node. `stat` is not subject to the device cgroup.
//! Where a test tree stands a plain file in for a device node, its presence is the check.
//!
//! [`judge`] is the decision over plain data; [`render_node_problem`] reads the filesystem.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// DRM's character-device major (`DRM_MAJOR`); render node `renderD<M>` has minor M.
pub const DRM_MAJOR: u32 = 226;

/// What `stat` says about a device-node path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStat {
    /// A character device with its numbers.
    CharDevice {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
    /// Something else (a test tree's plain-file stand-in, a FIFO, a directory).
    Other(&'static str),
    /// `stat` failed (the error's text).
    Absent(String),
}

/// What the health check looks at for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthInputs {
    /// `<dev_root>/dri/renderD<M>`.
    pub render_path: String,
    /// What `stat` says about it.
    pub render: NodeStat,
    /// The numbers the kernel gave the render node.
    pub expected: (u32, u32),
    /// `<dev_root>/kfd`.
    pub kfd_path: String,
    /// What `stat` says about it.
    pub kfd: NodeStat,
}

/// `None` when healthy, else why not.
pub fn judge(i: &HealthInputs) -> Option<String> {
    match &i.render {
        NodeStat::Absent(e) => {
            return Some(format!(
                "render node {} is not there ({e}): mount the host's /dev (the chart does) or check the driver",
                i.render_path
            ));
        }
        NodeStat::CharDevice { major, minor } if (*major, *minor) != i.expected => {
            return Some(format!(
                "{} is character device {major}:{minor}, but this GPU's render node is {}:{} (sysfs): the /dev tree is not this node's",
                i.render_path, i.expected.0, i.expected.1
            ));
        }
        NodeStat::Other("directory") => {
            return Some(format!(
                "{} is a directory, not a device node",
                i.render_path
            ));
        }
        NodeStat::CharDevice { .. } | NodeStat::Other(_) => {}
    }
    match &i.kfd {
        NodeStat::Absent(e) => Some(format!(
            "{} is not there ({e}): ROCm reaches GPUs only through it; mount the host's /dev",
            i.kfd_path
        )),
        NodeStat::Other("directory") => Some(format!("{} is a directory", i.kfd_path)),
        _ => None,
    }
}

/// `stat` of a path (following links, as opening it would).
pub fn stat(path: &Path) -> NodeStat {
    match std::fs::metadata(path) {
        Err(e) => NodeStat::Absent(e.to_string()),
        Ok(m) => {
            let t = m.file_type();
            if t.is_char_device() {
                let rdev = m.rdev();
                NodeStat::CharDevice {
                    major: libc::major(rdev),
                    minor: libc::minor(rdev),
                }
            } else if t.is_dir() {
                NodeStat::Other("directory")
            } else if t.is_fifo() {
                NodeStat::Other("fifo")
            } else if t.is_block_device() {
                NodeStat::Other("block device")
            } else {
                NodeStat::Other("file")
            }
        }
    }
}

/// `major:minor` from a sysfs `dev` file.
pub fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Reads what [`judge`] needs for render node `render`.
pub fn inputs(sysfs_root: &Path, dev_root: &Path, render: u32) -> HealthInputs {
    let render_path = dev_root.join(format!("dri/renderD{render}"));
    let kfd_path = dev_root.join("kfd");
    // sysfs reads are bounded (a small attribute file); absent in test trees and old kernels.
    let expected =
        std::fs::read_to_string(sysfs_root.join(format!("class/drm/renderD{render}/dev")))
            .ok()
            .and_then(|t| parse_dev(&t))
            .unwrap_or((DRM_MAJOR, render));
    HealthInputs {
        render: stat(&render_path),
        render_path: render_path.display().to_string(),
        expected,
        kfd: stat(&kfd_path),
        kfd_path: kfd_path.display().to_string(),
    }
}

/// Why render node `render` is unhealthy, if it is.
pub fn render_node_problem(sysfs_root: &Path, dev_root: &Path, render: u32) -> Option<String> {
    judge(&inputs(sysfs_root, dev_root, render))
}

/// Whether render node `render` is healthy.
pub fn render_node_healthy(sysfs_root: &Path, dev_root: &Path, render: u32) -> bool {
    render_node_problem(sysfs_root, dev_root, render).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(render: NodeStat, kfd: NodeStat) -> HealthInputs {
        HealthInputs {
            render_path: "/host/dev/dri/renderD128".into(),
            render,
            expected: (226, 128),
            kfd_path: "/host/dev/kfd".into(),
            kfd,
        }
    }
    const KFD: NodeStat = NodeStat::CharDevice {
        major: 238,
        minor: 0,
    };

    #[test]
    fn the_right_char_device_is_healthy_without_opening_it() {
        let ok = NodeStat::CharDevice {
            major: 226,
            minor: 128,
        };
        assert_eq!(judge(&inputs(ok.clone(), KFD)), None);
        assert_eq!(judge(&inputs(NodeStat::Other("file"), KFD)), None);
        let wrong = judge(&inputs(
            NodeStat::CharDevice {
                major: 226,
                minor: 129,
            },
            KFD,
        ))
        .unwrap();
        assert!(
            wrong.contains("226:129") && wrong.contains("226:128"),
            "{wrong}"
        );
        let gone = judge(&inputs(NodeStat::Absent("No such file".into()), KFD)).unwrap();
        assert!(gone.contains("mount the host's /dev"), "{gone}");
        let no_kfd = judge(&inputs(ok, NodeStat::Absent("No such file".into()))).unwrap();
        assert!(no_kfd.contains("/host/dev/kfd"), "{no_kfd}");
        assert!(judge(&inputs(NodeStat::Other("directory"), KFD)).is_some());
    }

    #[test]
    fn sysfs_dev_numbers() {
        assert_eq!(parse_dev("226:128\n"), Some((226, 128)));
        assert_eq!(parse_dev("226"), None);
        assert_eq!(parse_dev("a:b"), None);
    }
}
