//! The processes the hook check found hooked, remembered between passes (pure).
//!
//! Reading a process's `environ` and `maps` takes its mmap lock for reading, and the check
//! runs at every refresh (5 s) over every process of every granted container. A hook
//! loaded by ld.so (`LD_AUDIT`, `/etc/ld.so.preload`) is never unloaded while the program
//! image lives, so a process once found hooked stays hooked: its reads are skipped at
//! later passes. The image does not live as long as the pid: `execve` replaces it (the new
//! program loads the hook again only if ld.so can), and a pid is reused after an exit. So a
//! process is known by [`ProcessIdentity`]: its pid, its start time (a reused pid has
//! another) and where its image's code and stack were placed (a new image gets new ones).
//!
//! Only *hooked* is remembered. An unhooked process cannot become hooked (ld.so loads the
//! hook at start or never), but it is read again anyway: it is what the check is for, its
//! count must drop when it exits or execs, and it is rare. An unknown one is read again
//! because the monitor may gain the right to read it. A process the cache knows is counted
//! hooked for the hooks it had, without reads, while its (pod, container) is the same.
//! Entries of processes not seen in a pass are dropped.

use std::collections::BTreeMap;

use crate::hook_presence::{ContainerHook, Findings, ProcessFacts, Verdict, grants, verdicts};
use crate::pods::PodIndex;

/// A process across passes (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessIdentity {
    /// Host pid.
    pub pid: i32,
    /// `starttime`, field 22 of `/proc/<pid>/stat`: clock ticks after boot.
    pub start_time: u64,
    /// `startcode`, field 26 (1 or 0 when the reader may not trace the process).
    pub start_code: u64,
    /// `startstack`, field 28 (0 when the reader may not trace the process).
    pub start_stack: u64,
}

/// The numeric fields of a `/proc/<pid>/stat` text, as `field(n)` with the kernel's 1-based
/// numbering (`proc(5)`); `None` when it is not one. The command name (field 2, in
/// parentheses) may hold spaces and parentheses: fields are counted after the last `)`.
pub fn stat_fields(stat: &str) -> Option<impl Fn(usize) -> Option<u64> + '_> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state).
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(move |n: usize| fields.get(n.checked_sub(3)?)?.parse::<u64>().ok())
}

/// Reads `/proc/<pid>/stat`; `None` when it is not one.
pub fn process_identity(pid: i32, stat: &str) -> Option<ProcessIdentity> {
    let field = stat_fields(stat)?;
    Some(ProcessIdentity {
        pid,
        start_time: field(22)?,
        start_code: field(26)?,
        start_stack: field(28)?,
    })
}

/// What is remembered of a hooked process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Remembered {
    pod_uid: String,
    container: String,
    /// Each hook its slice expected (all found mapped).
    hooks: Vec<ContainerHook>,
}

/// The processes found hooked, by identity: plain data, carried by the shell from one pass
/// to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookedProcesses {
    known: BTreeMap<ProcessIdentity, Remembered>,
}

impl HookedProcesses {
    /// Whether `id`, now a process of (`pod_uid`, `container`), was found hooked there: the
    /// shell then skips its reads and gives it to [`pass`] as known.
    pub fn knows(&self, id: &ProcessIdentity, pod_uid: &str, container: &str) -> bool {
        self.known
            .get(id)
            .is_some_and(|r| r.pod_uid == pod_uid && r.container == container)
    }

    /// How many processes are remembered.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}

/// One pass of the check: the findings over the processes `read` (with their identity
/// when `/proc/<pid>/stat` could be read) and those `known` hooked (that `before`
/// [`knows`](HookedProcesses::knows)), and what to remember for the next pass: the known
/// ones still in a granted container, and the read ones found hooked for every hook their
/// slice expects. Everything else is forgotten (processes gone, or no longer hooked
/// after an exec, which gives them a new identity).
pub fn pass(
    before: &HookedProcesses,
    read: &[(Option<ProcessIdentity>, ProcessFacts)],
    known: &[ProcessIdentity],
    pods: &PodIndex,
) -> (Findings, HookedProcesses) {
    let mut found = Findings::default();
    let mut after = HookedProcesses::default();
    for id in known {
        let Some(r) = before.known.get(id) else {
            continue;
        };
        // The grant is the pod's: a hook whose pod or container is gone counts no more.
        let hooks: Vec<ContainerHook> = r
            .hooks
            .iter()
            .filter(|at| {
                pods.get(&at.pod_uid)
                    .and_then(|p| p.container(&at.container))
                    .is_some_and(|c| grants(c, at.vendor))
            })
            .cloned()
            .collect();
        for at in &hooks {
            found.count(at.clone(), id.pid, "", Verdict::Hooked);
        }
        if !hooks.is_empty() {
            after.known.insert(*id, Remembered { hooks, ..r.clone() });
        }
    }
    for (id, p) in read {
        let vs = verdicts(p, pods);
        if let Some(id) = id
            && !vs.is_empty()
            && vs.iter().all(|(_, v)| *v == Verdict::Hooked)
        {
            after.known.insert(
                *id,
                Remembered {
                    pod_uid: p.pod_uid.clone(),
                    container: p.container.clone(),
                    hooks: vs.iter().map(|(at, _)| at.clone()).collect(),
                },
            );
        }
        for (at, verdict) in vs {
            found.count(at, p.pid, &p.command, verdict);
        }
    }
    (found, after)
}

#[cfg(test)]
#[path = "hooked_processes_tests.rs"]
mod tests;
