//! Card choice at placement (issue 32 item 4: prevent fragmentation rather than repair it),
//! as pure scores proposed for the scheduler's binpack (on a node, binpack takes the card
//! with the highest score). Not adopted unless measured to help: `examples/card_score.rs`
//! places the example scenarios under each and counts what each leaves stranded.

use hami_scheduler_core::snapshot::{Gpu, GpuUsage};

fn ratio(part: f64, total: f64) -> f64 {
    if total > 0.0 { part / total } else { 0.0 }
}

/// Today's device score (scheduler-core `fit::device_score`, repeated to compare): 10 ×
/// (shares + cores + memory used, as fractions of the card, the ask included). A sum
/// cannot tell a card whose memory and cores fill together from one where memory runs
/// out with compute to spare: both add up the same.
pub fn today_score(gpu: &Gpu, usage: &GpuUsage, (mem, cores): (u64, u64)) -> f64 {
    let info = &gpu.info;
    10.0 * (ratio(f64::from(usage.used) + 1.0, f64::from(info.count))
        + ratio((usage.cores + cores) as f64, f64::from(info.devcore))
        + ratio((usage.mem_mib + mem) as f64, info.devmem as f64))
}

/// The scarcer-dimension score, read literally: how full the card would be, the ask
/// included, in the dimension it has the least of left (memory or compute), then today's
/// sum. Binpack maximizing it piles slices onto the card closest to running out of
/// either dimension.
pub fn scarcer_dimension_score(gpu: &Gpu, usage: &GpuUsage, ask: (u64, u64)) -> f64 {
    let (mem_used, cores_used) = fills(gpu, usage, ask);
    LEAD * mem_used.max(cores_used) + today_score(gpu, usage, ask)
}

/// The even-fill score: how full the card would be, the ask included, in the dimension
/// it has the most of left (the one that strands when the other runs out), then
/// today's sum. Binpack maximizing it fills a card's memory and compute together: a
/// memory-heavy slice goes to the card whose compute is the fuller dimension, so fewer
/// cards end with one dimension exhausted and the other stranded.
pub fn even_fill_score(gpu: &Gpu, usage: &GpuUsage, ask: (u64, u64)) -> f64 {
    let (mem_used, cores_used) = fills(gpu, usage, ask);
    LEAD * mem_used.min(cores_used) + today_score(gpu, usage, ask)
}

/// The weight of the leading fill: 0.3 % of a card in it outweighs today's whole range
/// (0..30), which only breaks near-ties.
const LEAD: f64 = 10_000.0;

/// Memory and compute used after the ask, as fractions of the card.
fn fills(gpu: &Gpu, usage: &GpuUsage, (mem, cores): (u64, u64)) -> (f64, f64) {
    let info = &gpu.info;
    (
        ratio((usage.mem_mib + mem) as f64, info.devmem as f64),
        ratio((usage.cores + cores) as f64, f64::from(info.devcore)),
    )
}
