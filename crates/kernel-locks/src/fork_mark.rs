//! A page the kernel zeroes in a forked child (`MADV_WIPEONFORK`, Linux 4.14): set once a
//! process has built its per-process state, it tells the hooks' hot path "still the process
//! that built it" without a `getpid` system call. Where the kernel cannot wipe on fork the
//! page is not kept ([`Mark::Absent`]) and the hooks compare pids instead.

use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::atomic::{AtomicPtr, AtomicU64};

/// What a [`ForkMark`] says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// No page (not mapped yet, or the kernel cannot wipe it on fork).
    Absent,
    /// The page is there but clear: a forked child (or before [`ForkMark::set`]).
    Clear,
    /// Set by this process: its state is the one published before [`ForkMark::set`].
    Set,
}

/// One hook's fork mark; meant to be a `static`.
pub struct ForkMark {
    page: AtomicPtr<AtomicU64>,
}

impl Default for ForkMark {
    fn default() -> Self {
        Self::new()
    }
}

impl ForkMark {
    /// A mark with no page yet.
    pub const fn new() -> Self {
        Self {
            page: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// What the mark says now (no system call).
    pub fn read(&self) -> Mark {
        let page = self.page.load(Acquire);
        // SAFETY: a non-null page is the one `map` mapped, never unmapped.
        match unsafe { page.as_ref() } {
            None => Mark::Absent,
            Some(mark) if mark.load(Acquire) != 0 => Mark::Set,
            Some(_) => Mark::Clear,
        }
    }

    /// Marks this process (mapping the page on first use): call after publishing its state.
    /// Nothing happens where the kernel cannot wipe the page on fork.
    pub fn set(&self) {
        // SAFETY: a non-null page is the one `map` mapped, never unmapped.
        if let Some(mark) = unsafe { self.map().as_ref() } {
            mark.store(1, Release);
        }
    }

    /// Maps the page once; null when the kernel cannot wipe on fork.
    fn map(&self) -> *mut AtomicU64 {
        let existing = self.page.load(Acquire);
        if !existing.is_null() {
            return existing;
        }
        // SAFETY: an anonymous private page, never unmapped; checked before use.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        // SAFETY: madvise on the page just mapped.
        if unsafe { libc::madvise(page, 4096, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: unmapping the page just mapped, unused.
            unsafe { libc::munmap(page, 4096) };
            return std::ptr::null_mut();
        }
        let mark = page.cast::<AtomicU64>();
        self.page.store(mark, Release);
        mark
    }
}

/// This process's id.
pub fn own_pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_wiped_in_a_forked_child() {
        let _no_open_locks_meanwhile = crate::FORK_IN_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        static MARK: ForkMark = ForkMark::new();
        assert_eq!(MARK.read(), Mark::Absent);
        MARK.set();
        let here = MARK.read();
        assert_eq!(here, Mark::Set, "this kernel wipes on fork (Linux ≥ 4.14)");
        // SAFETY: the child only reads the mark and leaves with _exit (no unwinding, no
        // destructors, no allocation).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = if MARK.read() == Mark::Clear { 0 } else { 1 };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0, "the child saw its mark set");
        assert_eq!(MARK.read(), Mark::Set);
    }
}
