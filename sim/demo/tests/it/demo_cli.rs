//! `hami-demo --once` (what `hami demo --once` runs) as a user runs it: the real binary, the
//! repository's examples.

use crate::common;
use std::process::Command;

#[test]
fn demo_places_the_examples_and_explains_the_rest() {
    let _one_cluster = common::ONE_CLUSTER.blocking_lock();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let kubeconfig =
        std::env::temp_dir().join(format!("hami-demo-test-{}.kubeconfig", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_hami-demo"))
        .current_dir(root)
        .args(["--once", "--api-listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .output()
        .expect("run hami-demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = |who: &str| -> Vec<Vec<String>> {
        text.lines()
            .filter(|l| l.contains(&format!("default/{who}/")))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    // Two 25 % pods share one MI210 (104 CUs) with disjoint CU ranges.
    let (a, b) = (rows("share-a"), rows("share-b"));
    assert_eq!((a.len(), b.len()), (1, 1), "{text}");
    assert_eq!(a[0][0], b[0][0], "same GPU:\n{text}");
    assert_eq!(a[0][4], "26/104", "{text}");
    assert_ne!(a[0][5], b[0][5], "disjoint CU ranges:\n{text}");
    // The MI300X CPX node hands out whole partitions (count 1): two for one container.
    let cpx = rows("cpx-pair");
    assert_eq!(cpx.len(), 2, "{text}");
    assert_ne!(cpx[0][0], cpx[1][0]);
    // link-bind: two partitions of one die are peers (ids GPU-<card serial>-<index>).
    let card = |id: &str| id.rsplit_once('-').map(|(c, _)| c.to_owned());
    assert_eq!(card(&cpx[0][0]), card(&cpx[1][0]), "{text}");
    assert!(
        cpx.iter()
            .all(|r| r[4] == "38/38" && r[5..].join(" ").starts_with("all (whole partition)")),
        "{text}"
    );
    // The memory-only pod takes every CU of its MI210.
    let mem = rows("memory-only");
    assert_eq!(mem[0][4], "104/104", "{text}");
    // The XGMI pair gets two distinct MI210 GPUs.
    let pair = rows("xgmi-pair");
    assert_eq!(pair.len(), 2, "{text}");
    assert_ne!(pair[0][0], pair[1][0]);
    // The NVIDIA node (stand-in driver, real NVIDIA plugin) runs the NVIDIA slice.
    let nvidia = rows("nvidia-share");
    assert_eq!(nvidia.len(), 1, "{text}");
    assert_eq!(
        (nvidia[0][2].as_str(), nvidia[0][4].as_str()),
        ("4096", "30%"),
        "{text}"
    );
    assert!(text.contains("Node nvidia-node"), "{text}");
    // The init container and the app container each got their own slice.
    assert!(
        text.contains("default/staged/prepare (init)") && text.contains("default/staged/worker"),
        "{text}"
    );
    // The pod that cannot fit, with the scheduler's reason, and the rejected one.
    let not_placed = text.split("Not placed:").nth(1).unwrap_or_default();
    assert!(
        not_placed.contains("cannot-fit: no available node")
            && not_placed.contains("CardInsufficientMemory"),
        "{text}"
    );
    assert!(
        not_placed.contains("rejected (07-rejected.yaml) rejected at admission")
            && not_placed.contains("from 1 to 100"),
        "{text}"
    );
    // Without --dra the DRA examples are skipped, saying why, and nothing runs twice.
    for skipped in [
        "skipped 10-dra-slice.yaml: a DRA example (ResourceClaimTemplate); run with --dra",
        "skipped 11-dra-hami-api.yaml: a DRA example (hami.io/amd-mode: dra); run with --dra",
    ] {
        assert!(text.contains(skipped), "{text}");
    }
    assert!(!text.contains("(pod dra-hami-api)"), "{text}");
    assert!(!text.contains("memory-only-dra"), "{text}");
    // Hints a user can follow.
    assert!(
        text.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{text}"
    );
    // The web UI's URL beside the hints (issue 21).
    assert!(
        text.lines()
            .any(|l| l.starts_with("Web UI: http://127.0.0.1:")),
        "{text}"
    );
    assert!(
        std::fs::read_to_string(&kubeconfig)
            .unwrap()
            .contains("server: http://127.0.0.1:")
    );
    let _ = std::fs::remove_file(&kubeconfig);
}

#[test]
fn demo_with_a_scenario_runs_the_planner() {
    let _one_cluster = common::ONE_CLUSTER.blocking_lock();
    // The demo runs the same planner as `hami plan` on a scenario.
    let small = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/scenarios/small.yaml"
    );
    let demo = Command::new(env!("CARGO_BIN_EXE_hami-demo"))
        .args(["--scenario", small])
        .output()
        .expect("run hami-demo");
    assert!(demo.status.success());
    assert!(String::from_utf8_lossy(&demo.stdout).contains("default/bad-cores-0"));
}
