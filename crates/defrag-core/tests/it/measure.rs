//! Measurements on real card shapes.

use hami_defrag_core::{Shape, measure, measure_node};
use hami_protocol::names::Vendor;
use serde_json::json;

use crate::fixtures::{A100, Fleet, MI210, MI300X, MI300X_CPX, movable, request, slice};

#[test]
fn an_idle_card_is_not_fragmented_and_takes_a_whole_card() {
    let mut f = Fleet::new();
    f.node("n", &[MI210, MI300X, A100, MI300X_CPX]);
    let m = measure_node(&f.cluster.nodes[0]);
    for card in &m.cards {
        assert_eq!(card.largest, Some(Shape::Whole), "{}", card.card);
        assert_eq!(
            (card.free_mib, card.placeable_mib),
            (card.total_mib, card.total_mib)
        );
        assert_eq!((card.stranded_mib, card.stranded_cores), (0, 0));
        assert_eq!(card.fragmentation, 0.0);
    }
    assert_eq!(m.totals.idle_cards, 4);
    assert_eq!(m.largest, Some(Shape::Whole));
}

#[test]
fn a_memory_only_amd_pod_strands_the_rest_of_the_card() {
    // A gpumem-only AMD pod takes every CU (the scheduler's charge): the free memory is
    // stranded, nothing fits, the card is wholly fragmented.
    let mut f = Fleet::new();
    f.node("n", &[MI300X]);
    assert!(f.place(
        "notebook",
        "n",
        "n-0",
        request(json!({"amd.com/gpumem": "8192"})),
        movable()
    ));
    let card = &measure_node(&f.cluster.nodes[0]).cards[0];
    assert_eq!(card.free_cores, 0);
    assert_eq!(card.free_mib, 196_288 - 8192);
    assert_eq!(card.stranded_mib, card.free_mib);
    assert_eq!(card.largest, None);
    assert_eq!(card.placeable_mib, 0);
    assert_eq!(card.fragmentation, 1.0);
}

#[test]
fn a_cpx_partition_with_one_pod_strands_both_dimensions() {
    // count 1: one pod takes its only share; its free memory and CUs are both stranded.
    let mut f = Fleet::new();
    f.node("n", &[MI300X_CPX]);
    assert!(f.place("small", "n", "n-0", slice(Vendor::Amd, 4096, 25), movable()));
    let card = &measure_node(&f.cluster.nodes[0]).cards[0];
    assert_eq!(card.free_shares, 0);
    assert_eq!(card.free_mib, 24_536 - 4096);
    // 25 % of 38 CUs is 9 (floor).
    assert_eq!(card.free_cores, 38 - 9);
    assert_eq!(
        (card.stranded_mib, card.stranded_cores),
        (card.free_mib, card.free_cores)
    );
    assert_eq!(card.largest, None);
}

#[test]
fn an_a100_packs_the_slices_its_compute_still_allows() {
    let mut f = Fleet::new();
    f.node("n", &[A100]);
    assert!(f.place(
        "a",
        "n",
        "n-0",
        slice(Vendor::Nvidia, 10_240, 50),
        movable()
    ));
    let card = &measure_node(&f.cluster.nodes[0]).cards[0];
    // 30720 MiB and 50 % free: a half (20480 MiB, 50 %) fits, then nothing more but
    // nothing is left of the compute; a 1/8 is 5120 MiB, 12 %.
    assert_eq!(card.largest, Some(Shape::Half));
    assert_eq!(card.placeable_mib, 20_480);
    assert!((card.fragmentation - (1.0 - 20_480.0 / 30_720.0)).abs() < 1e-9);
    assert!(f.place("b", "n", "n-0", slice(Vendor::Nvidia, 4096, 30), movable()));
    let card = &measure_node(&f.cluster.nodes[0]).cards[0];
    // 26624 MiB and 20 % left: only a 1/8 (12 %) fits, once.
    assert_eq!(card.largest, Some(Shape::Eighth));
    assert_eq!(card.placeable_mib, 5120);
    assert_eq!((card.stranded_mib, card.stranded_cores), (0, 0));
}

#[test]
fn mi210_quarters_and_the_fleet_sums_per_vendor() {
    let mut f = Fleet::new();
    f.node("a", &[MI210, MI210]).node("b", &[A100]);
    // Three quarters of a-0's memory with 1/4 of its CUs each (26 CUs).
    for i in 0..3 {
        assert!(f.place(
            &format!("q{i}"),
            "a",
            "a-0",
            slice(Vendor::Amd, 16_384, 25),
            movable()
        ));
    }
    let fleet = measure(&f.cluster.nodes);
    let a0 = &fleet.nodes[0].cards[0];
    assert_eq!((a0.free_mib, a0.free_cores), (16_384, 104 - 78));
    assert_eq!(a0.largest, Some(Shape::Quarter));
    assert_eq!(a0.fragmentation, 0.0);
    assert_eq!(fleet.amd.cards, 2);
    assert_eq!(fleet.amd.idle_cards, 1);
    assert_eq!(fleet.amd.free_mib, 16_384 + 65_536);
    assert_eq!(fleet.nvidia.cards, 1);
    assert_eq!(fleet.nvidia.free_cores, 100);
    let top = fleet.top_fragmented(5);
    assert_eq!(top.len(), 2, "nodes with free memory");
}
