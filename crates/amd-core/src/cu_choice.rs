//! Which CUs a slice gets (SPEC §4 "CU choice"): `count` free CUs of one GPU, never
//! overlapping what other pods hold, made of whole WGPs when a WGP has 2 CUs (RDNA), and
//! contiguous whenever some free run can hold the whole slice.
//!
//! The reference takes the lowest free CUs one by one (first fit), which splits later
//! slices across holes. We pick the *smallest* free run that holds the slice (best fit),
//! so big runs stay whole for big slices; only when no run is large enough do we combine
//! runs, largest first, and best-fit the remainder. `best_fit_keeps_large_runs_whole` and
//! `fewer_split_masks_than_first_fit` below show the difference.
//!
//! A container with several GPUs gets, where possible, the *same* CU ids on each
//! ([`choose_common_cus`]): ROCm 5.x enforces a CU slice only through
//! `ROC_GLOBAL_CU_MASK`, one mask for every device of the process, so a container whose
//! GPUs got different CU sets runs there with no CU limit at all. Only when no set is free
//! on every GPU does each GPU get its own best fit.

use hami_protocol::cu_list::CuSet;

/// Why no slice could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CuChoiceError {
    /// A slice of no CUs.
    #[error("a slice of 0 CUs was requested: the scheduler must ask for at least 1")]
    Zero,
    /// More CUs than the GPU has.
    #[error("{want} CUs were requested but the GPU has only {devcore}")]
    MoreThanDevice {
        /// CUs asked for.
        want: u32,
        /// The GPU's CU count.
        devcore: u32,
    },
    /// Other pods hold too many of the GPU's CUs.
    #[error(
        "not enough free CUs: need {need}, free {free} (of {devcore}); other pods hold the rest"
    )]
    NotEnough {
        /// CUs asked for.
        need: u32,
        /// CUs free.
        free: u32,
        /// The GPU's CU count.
        devcore: u32,
    },
}

/// The CU count a slice really gets: `count` on GCN/CDNA; on RDNA whole WGPs, rounded down
/// (the slice never exceeds what the scheduler reserved) but at least one WGP.
pub fn slice_size(count: u32, cu_per_wgp: u32) -> u32 {
    let w = cu_per_wgp.max(1);
    ((count / w).max(1)) * w
}

/// Chooses `count` CUs (see [`slice_size`]) of a GPU with `devcore` CUs, avoiding `used`.
pub fn choose_cus(
    used: &CuSet,
    devcore: u32,
    count: u32,
    cu_per_wgp: u32,
) -> Result<CuSet, CuChoiceError> {
    if count == 0 {
        return Err(CuChoiceError::Zero);
    }
    if count > devcore {
        return Err(CuChoiceError::MoreThanDevice {
            want: count,
            devcore,
        });
    }
    let w = cu_per_wgp.max(1);
    let need_units = slice_size(count, w) / w;
    let runs = free_unit_runs(used, devcore, w);
    let free_units: u32 = runs.iter().map(|(_, len)| len).sum();
    if free_units < need_units {
        return Err(CuChoiceError::NotEnough {
            need: need_units * w,
            free: free_units * w,
            devcore,
        });
    }
    let picked = pick_best_fit(&runs, need_units);
    let mut set = CuSet::new();
    for (start, len) in picked {
        set.insert_run(start * w, (start + len) * w - 1);
    }
    Ok(set)
}

/// One GPU of a multi-GPU container's CU choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSlice<'a> {
    /// CUs other pods (and this pod's earlier containers) hold on this GPU.
    pub used: &'a CuSet,
    /// The GPU's CU count.
    pub devcore: u32,
    /// CUs the scheduler reserved on it.
    pub count: u32,
    /// CUs per WGP (2 on RDNA).
    pub cu_per_wgp: u32,
}

/// One CU set free on *every* GPU of `gpus` that is a valid slice of each (the size
/// [`slice_size`] gives each, whole WGPs of each, below each GPU's CU count), chosen by the
/// same best fit as [`choose_cus`] over the CUs free everywhere; `None` when there is no
/// such set (the slices differ in size, or no common set is free), and for fewer than two
/// GPUs (nothing to agree on). Whenever some set is free on every GPU, one is returned, and
/// a contiguous one whenever a common free run can hold the slice.
pub fn choose_common_cus(gpus: &[GpuSlice<'_>]) -> Option<CuSet> {
    if gpus.len() < 2 {
        return None;
    }
    let size = slice_size(gpus[0].count, gpus[0].cu_per_wgp);
    if gpus
        .iter()
        .any(|g| g.count == 0 || slice_size(g.count, g.cu_per_wgp) != size)
    {
        return None;
    }
    // A unit that is a whole WGP on every GPU (WGPs have 1 or 2 CUs: the largest is a
    // multiple of every other).
    let unit = gpus.iter().map(|g| g.cu_per_wgp.max(1)).max().unwrap_or(1);
    if gpus
        .iter()
        .any(|g| !unit.is_multiple_of(g.cu_per_wgp.max(1)))
        || !size.is_multiple_of(unit)
    {
        return None;
    }
    let devcore = gpus.iter().map(|g| g.devcore).min().unwrap_or(0);
    let used = gpus.iter().fold(CuSet::new(), |acc, g| acc.union(g.used));
    choose_cus(&used, devcore, size, unit).ok()
}

/// The CUs of each GPU of one container, in order: the same set on all of them when
/// [`choose_common_cus`] finds one, else each GPU's own [`choose_cus`]. An error names the
/// index of the GPU that has no room.
pub fn choose_container_cus(gpus: &[GpuSlice<'_>]) -> Result<Vec<CuSet>, (usize, CuChoiceError)> {
    if let Some(common) = choose_common_cus(gpus) {
        return Ok(vec![common; gpus.len()]);
    }
    gpus.iter()
        .enumerate()
        .map(|(i, g)| choose_cus(g.used, g.devcore, g.count, g.cu_per_wgp).map_err(|e| (i, e)))
        .collect()
}

/// Free runs in WGP units: `(first unit, length)`. A unit is free only if all its CUs are.
fn free_unit_runs(used: &CuSet, devcore: u32, w: u32) -> Vec<(u32, u32)> {
    let units = devcore / w;
    let mut runs = Vec::new();
    let mut start: Option<u32> = None;
    for u in 0..units {
        let free = (u * w..(u + 1) * w).all(|cu| !used.contains(cu));
        match (free, start) {
            (true, None) => start = Some(u),
            (false, Some(s)) => {
                runs.push((s, u - s));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, units - s));
    }
    runs
}

/// Best fit over runs; `runs` must hold at least `need` units in total.
fn pick_best_fit(runs: &[(u32, u32)], need: u32) -> Vec<(u32, u32)> {
    // Smallest run that holds everything (lowest start on ties).
    if let Some(&(start, _)) = runs
        .iter()
        .filter(|(_, len)| *len >= need)
        .min_by_key(|(s, len)| (*len, *s))
    {
        return vec![(start, need)];
    }
    // Otherwise: whole runs largest first while the rest does not fit in one remaining run,
    // then the smallest run that holds the remainder.
    let mut remaining: Vec<(u32, u32)> = runs.to_vec();
    remaining.sort_by_key(|(s, len)| (std::cmp::Reverse(*len), *s));
    let mut picked = Vec::new();
    let mut need = need;
    while need > 0 {
        if let Some(i) = remaining
            .iter()
            .enumerate()
            .filter(|(_, (_, len))| *len >= need)
            .min_by_key(|(_, (s, len))| (*len, *s))
            .map(|(i, _)| i)
        {
            picked.push((remaining[i].0, need));
            break;
        }
        let (s, len) = remaining.remove(0);
        picked.push((s, len));
        need -= len;
    }
    picked.sort();
    picked
}

/// The reference's lowest-first-fit, kept for comparison in tests and benchmarks.
pub fn choose_cus_first_fit(used: &CuSet, devcore: u32, count: u32) -> Option<CuSet> {
    let mut set = CuSet::new();
    let mut taken = 0;
    for cu in 0..devcore {
        if taken == count {
            break;
        }
        if !used.contains(cu) {
            set.insert_run(cu, cu);
            taken += 1;
        }
    }
    (taken == count && count > 0).then_some(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(text: &str) -> CuSet {
        CuSet::parse(text, u32::MAX).unwrap()
    }

    #[test]
    fn spec_example_two_quarter_slices() {
        let a = choose_cus(&CuSet::new(), 304, 76, 1).unwrap();
        assert_eq!(a.to_string(), "0-75");
        let b = choose_cus(&a, 304, 76, 1).unwrap();
        assert_eq!(b.to_string(), "76-151");
    }

    #[test]
    fn best_fit_keeps_large_runs_whole() {
        // Free: 0-5 (6 CUs) and 10-13 (4 CUs).
        let used = set("6-9,14-19");
        let first = choose_cus_first_fit(&used, 20, 4).unwrap();
        assert_eq!(first.to_string(), "0-3", "first fit breaks the 6-run");
        let best = choose_cus(&used, 20, 4, 1).unwrap();
        assert_eq!(best.to_string(), "10-13", "best fit uses the exact hole");
        // A following 6-CU slice is contiguous only after best fit.
        let after_best = choose_cus(&used.union(&best), 20, 6, 1).unwrap();
        assert_eq!(after_best.to_string(), "0-5");
        let after_first = choose_cus_first_fit(&used.union(&first), 20, 6).unwrap();
        assert_eq!(after_first.to_string(), "4-5,10-13");
    }

    #[test]
    fn wgp_alignment_on_rdna() {
        // CU 1 taken: WGP 0 is unusable, so the slice starts at CU 2.
        let s = choose_cus(&set("1"), 96, 24, 2).unwrap();
        assert_eq!(s.to_string(), "2-25");
        assert!(s.check_whole_wgps(2).is_ok());
        // Odd counts round down to whole WGPs, at least one WGP.
        assert_eq!(slice_size(31, 2), 30);
        assert_eq!(slice_size(1, 2), 2);
        assert_eq!(
            choose_cus(&CuSet::new(), 64, 1, 2).unwrap().to_string(),
            "0-1"
        );
    }

    #[test]
    fn errors_name_the_shortage() {
        assert_eq!(choose_cus(&CuSet::new(), 8, 0, 1), Err(CuChoiceError::Zero));
        assert!(matches!(
            choose_cus(&CuSet::new(), 8, 9, 1),
            Err(CuChoiceError::MoreThanDevice { .. })
        ));
        let err = choose_cus(&set("0-5"), 8, 4, 1).unwrap_err();
        assert_eq!(
            err,
            CuChoiceError::NotEnough {
                need: 4,
                free: 2,
                devcore: 8
            }
        );
        assert!(err.to_string().contains("need 4, free 2"));
        // On RDNA a half-used WGP is not free.
        assert!(matches!(
            choose_cus(&set("0,3,5"), 6, 2, 2),
            Err(CuChoiceError::NotEnough { free: 0, .. })
        ));
    }

    /// Deterministic churn (fixed LCG): slices of random sizes come and go on a 304-CU GPU.
    fn churn(best: bool) -> (u32, u32) {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = move |n: u32| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % u64::from(n)) as u32
        };
        let mut live: Vec<CuSet> = Vec::new();
        let (mut split, mut placed) = (0, 0);
        for _ in 0..4000 {
            if !live.is_empty() && rand(100) < 45 {
                let i = rand(live.len() as u32) as usize;
                live.swap_remove(i);
                continue;
            }
            let used = live.iter().fold(CuSet::new(), |acc, s| acc.union(s));
            let want = [16, 30, 38, 76, 100][rand(5) as usize];
            let got = if best {
                choose_cus(&used, 304, want, 1).ok()
            } else {
                choose_cus_first_fit(&used, 304, want)
            };
            if let Some(s) = got {
                placed += 1;
                if s.runs().len() > 1 {
                    split += 1;
                }
                live.push(s);
            }
        }
        (split, placed)
    }

    #[test]
    fn fewer_split_masks_than_first_fit() {
        let (best_split, best_placed) = churn(true);
        let (first_split, first_placed) = churn(false);
        eprintln!(
            "best fit: {best_split}/{best_placed} split; first fit: {first_split}/{first_placed} split"
        );
        assert!(best_placed > 500 && first_placed > 500);
        assert!(
            best_split * 2 < first_split,
            "best fit split {best_split}/{best_placed}, first fit split {first_split}/{first_placed}"
        );
    }

    #[test]
    fn a_multi_gpu_container_gets_one_common_range() {
        // GPU 0 holds 0-9, GPU 1 holds 50-59: each GPU's own best fit differs (10-35 and
        // 60-85), but 10-35 is free on both.
        let (a, b) = (set("0-9"), set("50-59"));
        assert_eq!(choose_cus(&a, 104, 26, 1).unwrap().to_string(), "10-35");
        assert_eq!(choose_cus(&b, 104, 26, 1).unwrap().to_string(), "60-85");
        let gpus = [gpu(&a, 104, 26, 1), gpu(&b, 104, 26, 1)];
        assert_eq!(choose_common_cus(&gpus).unwrap().to_string(), "10-35");
        let both = choose_container_cus(&gpus).unwrap();
        assert_eq!(both[0], both[1]);
        // No CU free on both: each GPU gets its own best fit.
        let (a, b) = (set("0-51"), set("52-103"));
        let gpus = [gpu(&a, 104, 26, 1), gpu(&b, 104, 26, 1)];
        assert_eq!(choose_common_cus(&gpus), None);
        let each = choose_container_cus(&gpus).unwrap();
        assert_eq!(each[0].to_string(), "52-77");
        assert_eq!(each[1].to_string(), "0-25");
        // A common set split over two holes still beats none (ROCm 5.x can enforce it).
        let (a, b) = (set("4-9,20-103"), set("10-13,30-103"));
        let gpus = [gpu(&a, 104, 8, 1), gpu(&b, 104, 8, 1)];
        assert_eq!(choose_common_cus(&gpus).unwrap().to_string(), "0-1,14-19");
        // Slices of different sizes cannot share one set.
        let free = CuSet::new();
        let gpus = [gpu(&free, 104, 26, 1), gpu(&free, 80, 20, 1)];
        assert_eq!(choose_common_cus(&gpus), None);
        // RDNA: the common set is whole WGPs.
        let (a, b) = (set("1"), set("4"));
        let gpus = [gpu(&a, 96, 4, 2), gpu(&b, 96, 4, 2)];
        assert_eq!(choose_common_cus(&gpus).unwrap().to_string(), "6-9");
        // One GPU: nothing to agree on.
        assert_eq!(choose_common_cus(&gpus[..1]), None);
    }

    fn gpu(used: &CuSet, devcore: u32, count: u32, cu_per_wgp: u32) -> GpuSlice<'_> {
        GpuSlice {
            used,
            devcore,
            count,
            cu_per_wgp,
        }
    }

    fn used_set(devcore: u32, runs: &[(u32, u32)]) -> CuSet {
        runs.iter().fold(CuSet::new(), |acc, &(a, n)| {
            let a = a.min(devcore - 1);
            acc.union(&CuSet::range(a, n.min(devcore - a)))
        })
    }

    proptest! {
        #[test]
        fn a_common_choice_is_free_everywhere_and_found_when_one_exists(
            gpus in prop::collection::vec(
                (64u32..128, prop::collection::vec((0u32..128, 1u32..30), 0..5)),
                2..5,
            ),
            count in 1u32..64,
            wgp in 1u32..3,
        ) {
            let used: Vec<(u32, CuSet)> = gpus
                .iter()
                .map(|(devcore, runs)| (*devcore, used_set(*devcore, runs)))
                .collect();
            let slices: Vec<GpuSlice<'_>> = used
                .iter()
                .map(|(devcore, u)| gpu(u, *devcore, count, wgp))
                .collect();
            let size = slice_size(count, wgp);
            // Brute force: whole WGPs free on every GPU, below every GPU's CU count.
            let devcore = used.iter().map(|(d, _)| *d).min().unwrap();
            let union = used.iter().fold(CuSet::new(), |acc, (_, u)| acc.union(u));
            let free_units = free_unit_runs(&union, devcore, wgp);
            let common_free: u32 = free_units.iter().map(|r| r.1 * wgp).sum();
            let common_run = free_units.iter().any(|r| r.1 * wgp >= size);
            match choose_common_cus(&slices) {
                Some(s) => {
                    for (d, u) in &used {
                        prop_assert!(!s.overlaps(u));
                        prop_assert!(s.max().unwrap() < *d);
                    }
                    prop_assert_eq!(s.len(), u64::from(size));
                    prop_assert!(s.check_whole_wgps(wgp).is_ok());
                    if common_run {
                        prop_assert_eq!(s.runs().len(), 1);
                    }
                }
                None => prop_assert!(common_free < size, "a common set of {} exists", size),
            }
            // The container's choice: one set everywhere when a common one exists, else
            // each GPU's own, never overlapping what it holds.
            if let Ok(sets) = choose_container_cus(&slices) {
                for (s, (d, u)) in sets.iter().zip(&used) {
                    prop_assert!(!s.overlaps(u));
                    prop_assert!(s.max().unwrap() < *d);
                    prop_assert_eq!(s.len(), u64::from(size));
                }
                if common_free >= size {
                    prop_assert!(sets.iter().all(|s| s == &sets[0]));
                }
            }
        }

        #[test]
        fn never_overlaps_exact_and_aligned(
            devcore in 1u32..320,
            used_runs in prop::collection::vec((0u32..320, 1u32..40), 0..8),
            count in 1u32..320,
            wgp in 1u32..3,
        ) {
            let used = used_runs.iter().fold(CuSet::new(), |acc, &(a, n)| {
                let a = a.min(devcore - 1);
                acc.union(&CuSet::range(a, n.min(devcore - a)))
            });
            match choose_cus(&used, devcore, count, wgp) {
                Ok(s) => {
                    prop_assert!(!s.overlaps(&used));
                    prop_assert_eq!(s.len(), u64::from(slice_size(count, wgp)));
                    prop_assert!(s.check_whole_wgps(wgp).is_ok());
                    prop_assert!(s.max().unwrap() < devcore);
                    // Contiguous whenever a free aligned run could hold it.
                    let runs = free_unit_runs(&used, devcore, wgp);
                    if runs.iter().any(|(_, len)| len * wgp >= slice_size(count, wgp)) {
                        prop_assert_eq!(s.runs().len(), 1);
                    }
                }
                Err(CuChoiceError::NotEnough { need, free, .. }) => {
                    prop_assert!(free < need);
                    let free_units: u32 = free_unit_runs(&used, devcore, wgp).iter().map(|r| r.1).sum();
                    prop_assert_eq!(free_units * wgp, free);
                }
                Err(CuChoiceError::MoreThanDevice { .. }) => prop_assert!(count > devcore),
                Err(CuChoiceError::Zero) => prop_assert!(false),
            }
        }
    }
}
