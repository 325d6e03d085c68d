//! A process's environment read from its memory, for the hook check (issue 29), when
//! `/proc/<pid>/environ` cannot be opened.
//!
//! `environ` is mode 0400 and owned by the process's user: a monitor that is root but
//! holds only `CAP_SYS_PTRACE` (the DaemonSet's securityContext: every capability dropped
//! but that one) is refused it for every container that runs as another user (most real
//! images: `runAsUser: 1000`) — DAC, before ptrace's rules are asked. Every such process
//! was counted *unknown*, never *unhooked*, so the check told nobody on a real node. The
//! kernel's `environ` is the bytes between `env_start` and `env_end` of the process's
//! memory (fields 50 and 51 of `/proc/<pid>/stat`, a 0444 file that shows them to a reader
//! ptrace allows); `process_vm_readv` reads them under the same ptrace rule
//! (`CAP_SYS_PTRACE` suffices) with no file permission involved. Granting
//! `CAP_DAC_READ_SEARCH` instead would let the monitor read every file on the node
//! (`open_by_handle_at`).

use std::io;

/// The most bytes read of an environment (the kernel bounds argv + envp by `ARG_MAX`-like
/// limits; a block larger than this is not an environment).
const MAX_ENVIRON: u64 = 8 << 20;

/// `(env_start, env_end)`, fields 50 and 51 of a `/proc/<pid>/stat` text; `None` when
/// absent, zero (the reader may not see them, or a kernel thread) or not a range.
pub fn env_range(stat: &str) -> Option<(u64, u64)> {
    let field = crate::hooked_processes::stat_fields(stat)?;
    let (start, end) = (field(50)?, field(51)?);
    (start != 0 && start < end && end - start <= MAX_ENVIRON).then_some((start, end))
}

/// The bytes `range` of process `pid`'s memory (`process_vm_readv`). `ESRCH` when the
/// process is gone.
pub fn read_memory(pid: i32, (start, end): (u64, u64)) -> io::Result<Vec<u8>> {
    let len = usize::try_from(end - start).map_err(io::Error::other)?;
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: start as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes `buf`, which lives and is not otherwise borrowed for the
    // call; the kernel checks the remote range in the other process and writes at most
    // `len` bytes into `buf`.
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(read as usize);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line with fields 3.. as given after `pid (comm)`.
    fn stat(comm: &str, env: (u64, u64)) -> String {
        // Fields 3 to 49, then env_start (50), env_end (51), exit_code (52).
        let mut fields = vec!["S".to_owned()];
        fields.extend((4..=49).map(|n| n.to_string()));
        fields.push(env.0.to_string());
        fields.push(env.1.to_string());
        fields.push("0".into());
        format!("42 ({comm}) {}\n", fields.join(" "))
    }

    #[test]
    fn the_range_is_fields_50_and_51_after_the_command() {
        assert_eq!(env_range(&stat("sh", (4096, 8192))), Some((4096, 8192)));
        // A command with spaces and parentheses does not shift the fields.
        assert_eq!(env_range(&stat("a) (b c", (100, 300))), Some((100, 300)));
    }

    #[test]
    fn hidden_empty_or_huge_ranges_are_none() {
        assert_eq!(env_range(&stat("sh", (0, 0))), None);
        assert_eq!(env_range(&stat("sh", (500, 500))), None);
        assert_eq!(env_range(&stat("sh", (900, 100))), None);
        assert_eq!(env_range(&stat("sh", (1, 2 + MAX_ENVIRON))), None);
        assert_eq!(env_range("42 (sh) S 1 2 3"), None);
        assert_eq!(env_range("garbage"), None);
    }

    #[test]
    fn reads_this_processs_environment_as_the_kernel_shows_it() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let range = env_range(&stat).expect("this process's env range");
        let pid = std::process::id() as i32;
        assert_eq!(
            read_memory(pid, range).unwrap(),
            std::fs::read("/proc/self/environ").unwrap()
        );
    }
}
