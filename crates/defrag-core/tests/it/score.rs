//! The card scores proposed for binpack (issue 32 item 4).

use hami_defrag_core::score::{even_fill_score, scarcer_dimension_score, today_score};
use hami_scheduler_core::snapshot::GpuUsage;

use crate::fixtures::{MI210, gpu};

/// Two MI210 holding the same share of the card in sum, one memory-heavy (half its
/// memory, a tenth of its CUs), one compute-heavy (the reverse); a memory-heavy slice
/// arrives. Today's sum cannot tell them apart; the even fill sends the slice where
/// compute is the fuller dimension, so both dimensions of that card fill together.
#[test]
fn a_memory_heavy_slice_goes_where_compute_is_fuller() {
    let card = gpu(MI210, "c");
    let memory_heavy = GpuUsage {
        used: 1,
        mem_mib: 32_768,
        cores: 10,
    };
    let compute_heavy = GpuUsage {
        used: 1,
        mem_mib: 6_301,
        cores: 52,
    };
    let ask = (16_384, 5);
    let (a, b) = (
        today_score(&card, &memory_heavy, ask),
        today_score(&card, &compute_heavy, ask),
    );
    assert!((a - b).abs() < 0.01, "{a} {b}");
    assert!(
        even_fill_score(&card, &compute_heavy, ask) > even_fill_score(&card, &memory_heavy, ask)
    );
    // Read literally, the scarcer dimension piles onto the card nearest to running out.
    assert!(
        scarcer_dimension_score(&card, &memory_heavy, ask)
            > scarcer_dimension_score(&card, &compute_heavy, ask)
    );
    // On cards equally even, the fuller one still wins, as binpack wants.
    let fuller = GpuUsage {
        used: 2,
        mem_mib: 32_768,
        cores: 52,
    };
    let emptier = GpuUsage {
        used: 1,
        mem_mib: 16_384,
        cores: 26,
    };
    for score in [today_score, even_fill_score, scarcer_dimension_score] {
        assert!(score(&card, &fuller, ask) > score(&card, &emptier, ask));
    }
}
