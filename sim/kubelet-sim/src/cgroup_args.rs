//! `hami kubelet-sim`'s pod cgroup flags (`--cgroup-root`, `--cgroup-driver`) and their
//! check: a pure core ([`check_root`], [`cgroup_mount_of`]) that judges what the shell
//! ([`CgroupArgs::config`]) read from the file system, so every refusal is unit-tested
//! without one.

use std::path::{Component, Path, PathBuf};

use crate::cgroup_layout::CgroupDriver;
use crate::pod_cgroups::CgroupConfig;

/// The pod cgroup flags of `hami kubelet-sim` (flattened into its command line).
#[derive(Debug, Clone, clap::Args)]
pub struct CgroupArgs {
    /// Make the pods' cgroups, as kubelet and containerd do, in this directory standing
    /// for the node's /sys/fs/cgroup (a cgroup v2 tree: its cgroup.controllers lists the
    /// node's controllers, e.g. "cpu memory pids dmem"; with dmem, each cgroup gets the
    /// dmem.max the AMD drivers write). A plain directory, never a mounted cgroup
    /// filesystem. Without it no cgroups are made.
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// kubelet's --cgroup-driver: how the pod cgroups are named (kubelet's default,
    /// cgroupfs, or systemd, kubeadm's). Only with --cgroup-root.
    #[arg(
        long,
        value_enum,
        value_name = "DRIVER",
        default_value_t = CgroupDriver::Cgroupfs,
        requires = "cgroup_root"
    )]
    pub cgroup_driver: CgroupDriver,
}

/// What the file system says about a `--cgroup-root` (the shell's reading of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootState {
    /// Nothing is there.
    Missing,
    /// Something that is not a directory is there.
    NotDirectory,
    /// A directory.
    Directory {
        /// Its `cgroup.controllers`, when it has one.
        controllers: Option<String>,
        /// The mount point and type of the cgroup filesystem it is in, when it is in one.
        cgroup_mount: Option<(PathBuf, String)>,
    },
}

/// Judges a `--cgroup-root`: an error saying what to change, or the warnings to print
/// (none when all is well).
pub fn check_root(root: &Path, state: &RootState) -> Result<Vec<String>, String> {
    let shown = root.display();
    let (controllers, mount) = match state {
        RootState::Missing => {
            return Err(format!(
                "--cgroup-root {shown} does not exist: create the directory (e.g. `mkdir -p \
                 {shown}`) or pass an existing one"
            ));
        }
        RootState::NotDirectory => {
            return Err(format!(
                "--cgroup-root {shown} is not a directory: pass a directory standing for the \
                 node's /sys/fs/cgroup"
            ));
        }
        RootState::Directory {
            controllers,
            cgroup_mount,
        } => (controllers, cgroup_mount),
    };
    if let Some((point, kind)) = mount {
        // kubelet-sim writes the files the kernel would make (cgroup.controllers, …): in a
        // real tree that fails half-way, after real cgroups were made on this host.
        return Err(format!(
            "--cgroup-root {shown} is in the host's real {kind} filesystem (mounted on {}): \
             kubelet-sim makes a simulated node's cgroups in a plain directory; pass one such \
             as /tmp/node/sys/fs/cgroup with a cgroup.controllers file",
            point.display()
        ));
    }
    let Some(controllers) = controllers else {
        // The kernel puts cgroup.controllers in every cgroup v2 directory: without it the
        // tree has no controllers, so no cgroup would get dmem.max, the very file a user
        // runs this to watch. An error, not a warning that scrolls past.
        return Err(format!(
            "--cgroup-root {shown} does not look like a cgroup v2 tree: it has no \
             cgroup.controllers. Write the controllers the node has into it, e.g. `echo \
             'cpu memory pids dmem' > {shown}/cgroup.controllers`"
        ));
    };
    if controllers.split_whitespace().any(|c| c == "dmem") {
        return Ok(Vec::new());
    }
    Ok(vec![format!(
        "{shown}/cgroup.controllers lists no dmem controller: the pod cgroups get no \
         dmem.max, so the AMD drivers' device memory limits are not written; add dmem to it \
         to see them"
    )])
}

/// The mount point and type of the cgroup filesystem (`cgroup` or `cgroup2`) that `path`
/// (absolute, symlinks resolved) is in, from `/proc/self/mountinfo`'s text; `None` when
/// the mount it is on is of another type.
pub fn cgroup_mount_of(mountinfo: &str, path: &Path) -> Option<(PathBuf, String)> {
    let mut best: Option<(usize, PathBuf, String)> = None;
    for line in mountinfo.lines() {
        // `<id> <parent> <dev> <root> <mount point> <options> [<tags>...] - <type> ...`
        let Some((head, tail)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(point), Some(kind)) = (head.split(' ').nth(4), tail.split(' ').next()) else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !path.starts_with(&point) {
            continue;
        }
        // The deepest mount covering the path holds it; at one depth, the later one
        // (mounted over the earlier).
        let depth = point
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .count();
        if best.as_ref().is_none_or(|(d, _, _)| depth >= *d) {
            best = Some((depth, point, kind.to_owned()));
        }
    }
    best.filter(|(_, _, kind)| kind == "cgroup" || kind == "cgroup2")
        .map(|(_, point, kind)| (point, kind))
}

/// mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl CgroupArgs {
    /// The cgroup config these flags ask for (`None` without `--cgroup-root`) and the
    /// warnings to print, or an error saying what to change.
    pub fn config(&self) -> Result<Option<(CgroupConfig, Vec<String>)>, String> {
        let Some(root) = &self.cgroup_root else {
            return Ok(None);
        };
        let state = match std::fs::metadata(root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RootState::Missing,
            Err(e) => return Err(format!("cannot read --cgroup-root {}: {e}", root.display())),
            Ok(m) if !m.is_dir() => RootState::NotDirectory,
            Ok(_) => RootState::Directory {
                controllers: std::fs::read_to_string(root.join("cgroup.controllers")).ok(),
                cgroup_mount: std::fs::canonicalize(root).ok().and_then(|real| {
                    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
                    cgroup_mount_of(&mountinfo, &real)
                }),
            },
        };
        let warnings = check_root(root, &state)?;
        Ok(Some((
            CgroupConfig {
                root: root.clone(),
                driver: self.cgroup_driver,
            },
            warnings,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cgroups: CgroupArgs,
    }

    fn parse(args: &[&str]) -> Result<CgroupArgs, String> {
        Cli::try_parse_from(std::iter::once("kubelet-sim").chain(args.iter().copied()))
            .map(|c| c.cgroups)
            .map_err(|e| e.to_string())
    }

    fn dir(controllers: Option<&str>) -> RootState {
        RootState::Directory {
            controllers: controllers.map(str::to_owned),
            cgroup_mount: None,
        }
    }

    #[test]
    fn the_driver_defaults_to_kubelets_cgroupfs_and_needs_a_root() {
        let none = parse(&[]).unwrap();
        assert_eq!(
            (none.cgroup_root, none.cgroup_driver),
            (None, CgroupDriver::Cgroupfs)
        );
        let fs = parse(&["--cgroup-root", "/x"]).unwrap();
        assert_eq!(fs.cgroup_driver, CgroupDriver::Cgroupfs);
        let sd = parse(&["--cgroup-root", "/x", "--cgroup-driver", "systemd"]).unwrap();
        assert_eq!(
            (sd.cgroup_root, sd.cgroup_driver),
            (Some(PathBuf::from("/x")), CgroupDriver::Systemd)
        );
        let alone = parse(&["--cgroup-driver", "systemd"]).unwrap_err();
        assert!(alone.contains("--cgroup-root"), "{alone}");
    }

    #[test]
    fn an_unknown_driver_is_refused_naming_the_known_ones() {
        let e = parse(&["--cgroup-root", "/x", "--cgroup-driver", "systemdd"]).unwrap_err();
        assert!(
            e.contains("systemdd") && e.contains("cgroupfs") && e.contains("systemd"),
            "{e}"
        );
    }

    #[test]
    fn each_bad_root_says_what_to_change() {
        let root = Path::new("/n/cgroup");
        let missing = check_root(root, &RootState::Missing).unwrap_err();
        assert!(
            missing.contains("/n/cgroup does not exist") && missing.contains("mkdir -p"),
            "{missing}"
        );
        let file = check_root(root, &RootState::NotDirectory).unwrap_err();
        assert!(file.contains("is not a directory"), "{file}");
        let bare = check_root(root, &dir(None)).unwrap_err();
        assert!(
            bare.contains("does not look like a cgroup v2 tree")
                && bare.contains("/n/cgroup/cgroup.controllers"),
            "{bare}"
        );
        let real = check_root(
            root,
            &RootState::Directory {
                controllers: Some("cpu memory\n".into()),
                cgroup_mount: Some(("/sys/fs/cgroup".into(), "cgroup2".into())),
            },
        )
        .unwrap_err();
        assert!(
            real.contains("real cgroup2 filesystem (mounted on /sys/fs/cgroup)"),
            "{real}"
        );
    }

    #[test]
    fn a_tree_without_dmem_is_used_with_a_warning() {
        let root = Path::new("/n/cgroup");
        assert_eq!(
            check_root(root, &dir(Some("cpu memory pids dmem\n"))),
            Ok(vec![])
        );
        let warnings = check_root(root, &dir(Some("cpu memory\n"))).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("no dmem controller"), "{warnings:?}");
        // An empty controllers file is a v2 tree with none enabled: warned, not refused.
        assert_eq!(check_root(root, &dir(Some(""))).unwrap().len(), 1);
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
50 22 0:40 / /tmp/my\\040node rw - tmpfs tmpfs rw
51 22 0:41 / /mnt/cg rw - cgroup2 cgroup2 rw
52 22 0:42 / /mnt/cg rw - tmpfs tmpfs rw
";

    #[test]
    fn only_paths_in_a_cgroup_filesystem_are_found_in_one() {
        let of = |p: &str| cgroup_mount_of(MOUNTINFO, Path::new(p));
        assert_eq!(
            of("/sys/fs/cgroup/unified/kubepods"),
            Some(("/sys/fs/cgroup/unified".into(), "cgroup2".into()))
        );
        assert_eq!(
            of("/sys/fs/cgroup/memory"),
            Some(("/sys/fs/cgroup/memory".into(), "cgroup".into()))
        );
        // The tmpfs holding the v1 hierarchies, a plain directory, a prefix that is not a
        // path component, an escaped space, a cgroup2 mount hidden by a later tmpfs.
        assert_eq!(of("/sys/fs/cgroup"), None);
        assert_eq!(of("/tmp/node/cgroup"), None);
        assert_eq!(of("/sys/fs/cgroup/memoryx"), None);
        assert_eq!(of("/tmp/my node/cgroup"), None);
        assert_eq!(of("/mnt/cg/x"), None);
    }
}
