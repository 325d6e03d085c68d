//! Host pids of processes in a container's PID namespace (issue 15 item 1).
//!
//! Inside a pod, a process sees only its namespace's pids: the CUDA hook stores `pid`
//! (its own `getpid`) in its region slot but cannot learn the host pid (a container's
//! `/proc` lists one `NSpid`), so `hostpid` stays 0. NVML, like the driver, reports host
//! pids, so the hook's sampler matches nothing and the SM limiter never throttles. The
//! monitor runs with `hostPID`: for every slot with `hostpid == 0` it finds the host process
//! that (a) maps that very region file (same device and inode in `/proc/<pid>/maps`) and
//! (b) has the slot's `pid` as its innermost `NSpid` entry, and writes its host pid into
//! the slot. Matching by the mapping rather than by cgroup works for every runtime and
//! cgroup driver, and cannot pick a process of another container (it would not map this
//! file). Pure: text in, decisions out; the shell is in `node_monitor`.

/// `NSpid` entries of a `/proc/<pid>/status` text, outermost (host) first.
pub fn nspids(status: &str) -> Vec<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| {
            rest.split_whitespace()
                .map_while(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A file's identity as `/proc/<pid>/maps` shows it: device major, minor, inode.
pub type FileId = (u32, u32, u64);

/// `(major, minor)` of a `st_dev` (glibc's `gnu_dev_major`/`gnu_dev_minor` encoding).
pub fn dev_numbers(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// Whether a `/proc/<pid>/maps` text maps the file `id` (`addr perms offset dev inode path`).
pub fn maps_file(maps: &str, id: FileId) -> bool {
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace().skip(3);
        let (Some(dev), Some(inode)) = (fields.next(), fields.next()) else {
            return false;
        };
        let Some((major, minor)) = dev.split_once(':') else {
            return false;
        };
        u32::from_str_radix(major, 16) == Ok(id.0)
            && u32::from_str_radix(minor, 16) == Ok(id.1)
            && inode.parse() == Ok(id.2)
    })
}

/// For each unresolved slot `(index, pid)`, the host pid of the one mapper `(host pid,
/// innermost pid)` whose innermost pid is the slot's. Two mappers with that innermost pid
/// (processes of two namespaces sharing one region) are ambiguous: left unresolved.
pub fn resolve(unresolved: &[(usize, i32)], mappers: &[(i32, i32)]) -> Vec<(usize, i32)> {
    unresolved
        .iter()
        .filter_map(|&(index, pid)| {
            let mut found = mappers.iter().filter(|(_, inner)| *inner == pid);
            match (found.next(), found.next()) {
                (Some(&(host, _)), None) if host > 0 => Some((index, host)),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nspid_lists_outermost_first() {
        assert_eq!(nspids("Name:\tx\nNSpid:\t4711\t7\n"), vec![4711, 7]);
        assert_eq!(nspids("NSpid:\t12\n"), vec![12]);
        assert!(nspids("Name:\tx\n").is_empty());
    }

    #[test]
    fn maps_are_matched_by_device_and_inode() {
        let maps = "7f0000000000-7f00001ea000 rw-s 00000000 00:2a 1234567 /tmp/c/cudevshr.cache\n\
                    7f1000000000-7f1000001000 r-xp 00000000 fd:01 99 /usr/lib/libc.so.6\n";
        assert!(maps_file(maps, (0, 0x2a, 1_234_567)));
        assert!(maps_file(maps, (0xfd, 1, 99)));
        assert!(!maps_file(maps, (0, 0x2a, 99)), "inode of another device");
        assert!(!maps_file("garbage\n\n1 2 3 x:y z\n", (0, 0, 0)));
        assert_eq!(dev_numbers(0xfd01), (0xfd, 1));
        assert_eq!(dev_numbers(0x2a), (0, 0x2a));
    }

    #[test]
    fn slots_get_the_host_pid_of_their_one_mapper() {
        let mappers = [(4711, 7), (4712, 8), (5000, 9), (5001, 9)];
        assert_eq!(
            resolve(&[(0, 7), (1, 8), (2, 9), (3, 10)], &mappers),
            vec![(0, 4711), (1, 4712)],
            "9 is ambiguous, 10 has no mapper"
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(text in "\\PC{0,300}") {
            let _ = nspids(&text);
            let _ = maps_file(&text, (0, 0, 0));
        }
    }
}
