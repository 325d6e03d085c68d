use super::*;
use crate::hook_presence::findings;
use crate::hook_presence::tests::{
    AMD_ENV, AMD_UID, NV_UID, arb_facts, facts, index, key, maps_with,
};
use hami_protocol::names::Vendor;
use proptest::prelude::*;

/// A `/proc/<pid>/stat` line whose command name has spaces and parentheses.
fn stat(pid: i32, start_time: u64, start_code: u64) -> String {
    let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
    fields[0] = "S".into();
    fields[22 - 3] = start_time.to_string();
    fields[26 - 3] = start_code.to_string();
    fields[28 - 3] = "140730000000000".into();
    format!("{pid} (a) b (c) {}\n", fields.join(" "))
}

fn id(pid: i32, start_time: u64, start_code: u64) -> ProcessIdentity {
    process_identity(pid, &stat(pid, start_time, start_code)).unwrap()
}

fn hooked() -> ProcessFacts {
    facts(
        AMD_UID,
        "main",
        AMD_ENV,
        Ok(maps_with(&["/usr/local/vgpu/libamvgpu.so"])),
    )
}

#[test]
fn the_identity_is_read_after_the_command_name() {
    let got = process_identity(7, &stat(7, 123_456, 94_000_000)).unwrap();
    assert_eq!(
        got,
        ProcessIdentity {
            pid: 7,
            start_time: 123_456,
            start_code: 94_000_000,
            start_stack: 140_730_000_000_000,
        }
    );
    for bad in [
        "",
        "7 (x) S 1 2",
        "7 x S",
        &stat(7, 99_999, 1).replace(" 99999 ", " x "),
    ] {
        assert_eq!(process_identity(7, bad), None, "{bad:?}");
    }
    // The kernel's own line parses.
    let own = std::fs::read_to_string("/proc/self/stat").unwrap();
    assert!(
        process_identity(1, &own).is_some_and(|i| i.start_time > 0),
        "{own}"
    );
}

#[test]
fn a_hooked_process_is_counted_without_its_facts_until_it_is_gone() {
    let pods = index();
    let me = id(4242, 1000, 1);
    let (first, cache) = pass(
        &HookedProcesses::default(),
        &[(Some(me), hooked())],
        &[],
        &pods,
    );
    assert_eq!(first, findings(&[hooked()], &pods));
    assert!(cache.knows(&me, AMD_UID, "main"));
    // Known: no facts at all, same counts.
    let (second, cache) = pass(&cache, &[], &[me], &pods);
    assert_eq!(second, first);
    assert_eq!(second.tallies[&key(AMD_UID, "amd", Vendor::Amd)].hooked, 1);
    // Not in another container, not as another process on the same pid.
    assert!(!cache.knows(&me, AMD_UID, "side"));
    assert!(!cache.knows(&me, NV_UID, "main"));
    assert!(
        !cache.knows(&id(4242, 1001, 1), AMD_UID, "main"),
        "pid reused"
    );
    assert!(
        !cache.knows(&id(4242, 1000, 2), AMD_UID, "main"),
        "image replaced (exec)"
    );
    // Not seen in a pass: forgotten.
    let (_, cache) = pass(&cache, &[], &[], &pods);
    assert!(cache.is_empty());
}

#[test]
fn unhooked_unknown_and_unidentified_processes_are_not_remembered() {
    let pods = index();
    let unhooked = facts(AMD_UID, "main", AMD_ENV, Ok(maps_with(&[])));
    let unknown = facts(AMD_UID, "main", AMD_ENV, Err("denied".into()));
    let (found, cache) = pass(
        &HookedProcesses::default(),
        &[
            (Some(id(1, 1, 1)), unhooked),
            (Some(id(2, 1, 1)), unknown),
            (None, hooked()),
        ],
        &[],
        &pods,
    );
    assert_eq!(found.unhooked.len(), 1);
    assert_eq!(found.unknown.len(), 1);
    assert!(cache.is_empty(), "{cache:?}");
}

#[test]
fn a_known_process_whose_pod_is_gone_counts_for_nothing() {
    let me = id(4242, 1000, 1);
    let (_, cache) = pass(
        &HookedProcesses::default(),
        &[(Some(me), hooked())],
        &[],
        &index(),
    );
    let (found, cache) = pass(&cache, &[], &[me], &PodIndex::default());
    assert_eq!(found, Findings::default());
    assert!(cache.is_empty());
}

proptest! {
    /// The cache changes no count while nothing changes: a first pass reads every process
    /// and counts as `findings` does; a second one, given the remembered processes as
    /// known and reading only the rest, finds the same and remembers the same.
    #[test]
    fn remembering_changes_no_count(procs in prop::collection::vec(arb_facts(), 0..12), ids in prop::collection::vec(any::<bool>(), 12)) {
        let pods = index();
        let read: Vec<_> = procs
            .into_iter()
            .enumerate()
            .map(|(i, mut p)| {
                p.pid = i as i32;
                (ids[i].then(|| id(i as i32, 100 + i as u64, 1)), p)
            })
            .collect();
        let all: Vec<ProcessFacts> = read.iter().map(|(_, p)| p.clone()).collect();
        let (first, cache) = pass(&HookedProcesses::default(), &read, &[], &pods);
        prop_assert_eq!(&first, &findings(&all, &pods));
        let (known, rest): (Vec<_>, Vec<_>) = read
            .iter()
            .cloned()
            .partition(|(i, p)| i.is_some_and(|i| cache.knows(&i, &p.pod_uid, &p.container)));
        let known: Vec<ProcessIdentity> = known.into_iter().filter_map(|(i, _)| i).collect();
        let (second, again) = pass(&cache, &rest, &known, &pods);
        prop_assert_eq!(second, first);
        prop_assert_eq!(again, cache);
    }
}
