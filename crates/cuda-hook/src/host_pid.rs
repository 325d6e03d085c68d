//! The host pid of this process, without the reference's context-creating probe: from the
//! `NSpid` line of `/proc/self/status` (outermost pid first) when it lists more than one
//! namespace, or the plain pid when we run in the initial pid namespace.

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO`).
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Parses `/proc/self/status` and the inode of `/proc/self/ns/pid`.
pub fn resolve(status: &str, pid_ns_inode: Option<u64>) -> Option<i32> {
    let pids: Vec<i32> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    match pids.as_slice() {
        [] => None,
        [only] => (pid_ns_inode == Some(INIT_PID_NS)).then_some(*only),
        [outer, ..] => Some(*outer),
    }
}

/// Reads this process's host pid (None when it cannot be known from inside).
pub fn own() -> Option<i32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let inode = std::fs::read_link("/proc/self/ns/pid").ok().and_then(|l| {
        l.to_str()?
            .strip_prefix("pid:[")?
            .strip_suffix(']')?
            .parse()
            .ok()
    });
    resolve(&status, inode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_rules() {
        assert_eq!(resolve("Name:\tx\nNSpid:\t4711\t12\n", Some(5)), Some(4711));
        assert_eq!(resolve("NSpid:\t4711\n", Some(INIT_PID_NS)), Some(4711));
        // A container with its own /proc shows one pid that is not the host's.
        assert_eq!(resolve("NSpid:\t7\n", Some(4026532000)), None);
        assert_eq!(resolve("Name:\tx\n", Some(INIT_PID_NS)), None);
    }
}
