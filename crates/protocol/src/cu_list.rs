//! CU ID lists and `HSA_CU_MASK` (SPEC §2.5).
//!
//! A list is comma-separated items, each `N` or `A-B` (inclusive). Writers emit ascending,
//! maximal runs collapsed (`0-3,8,10-12`); the reader also takes whitespace around items,
//! unordered and overlapping items (the reference's reader does), but never an id outside
//! `[0, devcore)`. Sets are kept as sorted, disjoint, non-adjacent ranges, so a huge range
//! costs nothing and every operation is linear in the number of runs.

use core::fmt;

/// A set of compute-unit ids of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CuSet {
    /// Inclusive, sorted, disjoint and non-adjacent.
    runs: Vec<(u32, u32)>,
}

/// Why a CU list or mask was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CuListError {
    /// No item names a CU.
    #[error("CU list is empty: it must name at least one CU, e.g. 0-75")]
    Empty,
    /// An item is neither `N` nor `A-B`.
    #[error("CU list item {item:?} is not N or A-B with decimal numbers")]
    Malformed {
        /// The item as written.
        item: String,
    },
    /// An item's range ends below its start.
    #[error("CU list item {item:?} runs backwards: write the smaller id first")]
    Backwards {
        /// The item as written.
        item: String,
    },
    /// An id is not below the GPU's CU count.
    #[error("CU id {id} is outside the GPU's {devcore} CUs (valid ids are 0-{max})", max = devcore.saturating_sub(1))]
    OutOfRange {
        /// The highest id of the item.
        id: u64,
        /// The GPU's CU count.
        devcore: u32,
    },
    /// A set holds some but not all CUs of a WGP.
    #[error(
        "CU set {set} splits a WGP: on this GPU (2 CUs per WGP) every slice must hold whole CU pairs 2k,2k+1"
    )]
    SplitWgp {
        /// The set, as a CU list.
        set: String,
    },
    /// A mask entry is not `<gpu index>:<CU list>`.
    #[error("HSA_CU_MASK entry {entry:?} is not <gpu index>:<CU list>")]
    MaskEntry {
        /// The entry as written.
        entry: String,
    },
    /// Two mask entries name one GPU.
    #[error("HSA_CU_MASK names GPU {index} twice")]
    MaskDuplicateIndex {
        /// The container-local GPU index.
        index: u32,
    },
    /// A mask entry's CU list is malformed.
    #[error("HSA_CU_MASK entry for GPU {index}: {source}")]
    MaskList {
        /// The container-local GPU index of the entry.
        index: u32,
        /// What is wrong with its list.
        #[source]
        source: Box<CuListError>,
    },
}

impl CuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The set `[first, first + len)`.
    pub fn range(first: u32, len: u32) -> Self {
        let mut set = Self::new();
        if len > 0 {
            set.insert_run(first, first.saturating_add(len - 1));
        }
        set
    }

    /// Parses a CU ID list whose ids must lie in `[0, devcore)`.
    pub fn parse(text: &str, devcore: u32) -> Result<Self, CuListError> {
        let mut set = Self::new();
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (first, last) = match item.split_once('-') {
                Some((a, b)) => (parse_id(item, a.trim())?, parse_id(item, b.trim())?),
                None => {
                    let id = parse_id(item, item)?;
                    (id, id)
                }
            };
            if first > last {
                return Err(CuListError::Backwards {
                    item: item.to_owned(),
                });
            }
            if last >= u64::from(devcore) {
                return Err(CuListError::OutOfRange { id: last, devcore });
            }
            // Both fit in u32 because devcore does.
            set.insert_run(first as u32, last as u32);
        }
        if set.is_empty() {
            return Err(CuListError::Empty);
        }
        Ok(set)
    }

    /// Whether the set holds no CU.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Number of CUs in the set.
    pub fn len(&self) -> u64 {
        self.runs.iter().map(|&(a, b)| u64::from(b - a) + 1).sum()
    }

    /// The inclusive runs, ascending.
    pub fn runs(&self) -> &[(u32, u32)] {
        &self.runs
    }

    /// Whether CU `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        self.runs.iter().any(|&(a, b)| a <= id && id <= b)
    }

    /// Highest id in the set.
    pub fn max(&self) -> Option<u32> {
        self.runs.last().map(|&(_, b)| b)
    }

    /// Adds `[first, last]`, merging with touching runs.
    pub fn insert_run(&mut self, first: u32, last: u32) {
        debug_assert!(first <= last);
        let (mut first, mut last) = (first, last);
        let mut merged = Vec::with_capacity(self.runs.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.runs {
            if u64::from(b) + 1 < u64::from(first) {
                merged.push((a, b));
            } else if u64::from(last) + 1 < u64::from(a) {
                if !placed {
                    merged.push((first, last));
                    placed = true;
                }
                merged.push((a, b));
            } else {
                first = first.min(a);
                last = last.max(b);
            }
        }
        if !placed {
            merged.push((first, last));
        }
        self.runs = merged;
    }

    /// The union of both sets.
    pub fn union(&self, other: &CuSet) -> CuSet {
        let mut out = self.clone();
        for &(a, b) in &other.runs {
            out.insert_run(a, b);
        }
        out
    }

    /// Whether the sets share an id.
    pub fn overlaps(&self, other: &CuSet) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.runs.len() && j < other.runs.len() {
            let (a, b) = self.runs[i];
            let (c, d) = other.runs[j];
            if a <= d && c <= b {
                return true;
            }
            if b < d {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    /// The ids in both sets.
    pub fn intersection(&self, other: &CuSet) -> CuSet {
        let mut out = CuSet::new();
        let (mut i, mut j) = (0, 0);
        while i < self.runs.len() && j < other.runs.len() {
            let (a, b) = self.runs[i];
            let (c, d) = other.runs[j];
            let (lo, hi) = (a.max(c), b.min(d));
            if lo <= hi {
                out.runs.push((lo, hi));
            }
            if b < d {
                i += 1;
            } else {
                j += 1;
            }
        }
        out
    }

    /// `[0, devcore)` minus this set.
    pub fn complement(&self, devcore: u32) -> CuSet {
        let mut out = CuSet::new();
        let mut next = 0u32;
        for &(a, b) in &self.runs {
            if a >= devcore {
                break;
            }
            if a > next {
                out.runs.push((next, a - 1));
            }
            next = b.saturating_add(1);
            if b == u32::MAX {
                return out;
            }
        }
        if next < devcore {
            out.runs.push((next, devcore - 1));
        }
        out
    }

    /// Checks that the set is made of whole WGPs when a WGP holds `cu_per_wgp` CUs
    /// (2 on RDNA, 1 elsewhere): every run must start and end on a WGP boundary.
    pub fn check_whole_wgps(&self, cu_per_wgp: u32) -> Result<(), CuListError> {
        if cu_per_wgp <= 1 {
            return Ok(());
        }
        let whole = self
            .runs
            .iter()
            .all(|&(a, b)| a % cu_per_wgp == 0 && (u64::from(b) + 1) % u64::from(cu_per_wgp) == 0);
        if whole {
            Ok(())
        } else {
            Err(CuListError::SplitWgp {
                set: self.to_string(),
            })
        }
    }
}

fn parse_id(item: &str, digits: &str) -> Result<u64, CuListError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CuListError::Malformed {
            item: item.to_owned(),
        });
    }
    // More than 20 digits cannot be a valid id; saturate so the range check reports it.
    Ok(digits.parse::<u64>().unwrap_or(u64::MAX))
}

/// The canonical list: ascending, maximal runs collapsed.
impl fmt::Display for CuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(a, b)) in self.runs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// The value of `HSA_CU_MASK`: per visible GPU (container-local index after
/// `ROCR_VISIBLE_DEVICES` reordering) the CUs it may use, e.g. `0:0-75;1:0-75`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HsaCuMask {
    /// Sorted by index, indices unique, sets non-empty.
    entries: Vec<(u32, CuSet)>,
}

impl HsaCuMask {
    /// Builds a mask from per-GPU sets; index `i` of the slice is GPU `i`.
    pub fn from_sets(sets: impl IntoIterator<Item = CuSet>) -> Result<Self, CuListError> {
        let mut entries = Vec::new();
        for (index, set) in sets.into_iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            if set.is_empty() {
                return Err(CuListError::MaskList {
                    index,
                    source: Box::new(CuListError::Empty),
                });
            }
            entries.push((index, set));
        }
        Ok(Self { entries })
    }

    /// Parses a mask; ids are only bounded by `u32` since the reader cannot know the GPU.
    pub fn parse(text: &str) -> Result<Self, CuListError> {
        let mut entries: Vec<(u32, CuSet)> = Vec::new();
        for entry in text.split(';') {
            if entry.trim().is_empty() {
                continue;
            }
            let Some((index, list)) = entry.split_once(':') else {
                return Err(CuListError::MaskEntry {
                    entry: entry.to_owned(),
                });
            };
            let index_text = index.trim();
            let index = if !index_text.is_empty() && index_text.bytes().all(|b| b.is_ascii_digit())
            {
                index_text.parse::<u32>().ok()
            } else {
                None
            }
            .ok_or_else(|| CuListError::MaskEntry {
                entry: entry.to_owned(),
            })?;
            if entries.iter().any(|(i, _)| *i == index) {
                return Err(CuListError::MaskDuplicateIndex { index });
            }
            let set = CuSet::parse(list, u32::MAX).map_err(|source| CuListError::MaskList {
                index,
                source: Box::new(source),
            })?;
            entries.push((index, set));
        }
        entries.sort_by_key(|(index, _)| *index);
        Ok(Self { entries })
    }

    /// Parses a mask read as raw bytes (`/proc/1/environ`); non-UTF-8 is malformed.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, CuListError> {
        let text = core::str::from_utf8(bytes).map_err(|_| CuListError::MaskEntry {
            entry: String::from_utf8_lossy(bytes).into_owned(),
        })?;
        Self::parse(text)
    }

    /// The `(GPU index, CUs)` entries, by ascending index.
    pub fn entries(&self) -> &[(u32, CuSet)] {
        &self.entries
    }

    /// The CUs of container-local GPU `index`, if the mask names it.
    pub fn get(&self, index: u32) -> Option<&CuSet> {
        self.entries
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, set)| set)
    }

    /// Whether every GPU of `self` is limited to a subset of what `allowed` grants it.
    /// A GPU missing from `self` has no mask, i.e. all CUs: it is only within `allowed`
    /// when `allowed` does not restrict it either.
    pub fn is_within(&self, allowed: &HsaCuMask) -> bool {
        let restricted_by_self = |index: u32| self.get(index).is_some();
        allowed
            .entries
            .iter()
            .all(|(index, _)| restricted_by_self(*index))
            && self
                .entries
                .iter()
                .all(|(index, set)| match allowed.get(*index) {
                    Some(granted) => set.union(granted) == *granted,
                    None => true,
                })
    }
}

impl fmt::Display for HsaCuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (index, set)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{index}:{set}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonical_form() {
        let set = CuSet::parse("0-3,8,10-12", 304).unwrap();
        assert_eq!(set.to_string(), "0-3,8,10-12");
        assert_eq!(set.len(), 8);
        // Unordered, overlapping, adjacent and spaced items collapse.
        let set = CuSet::parse(" 10-12, 4 ,0-3,11,8 ,", 304).unwrap();
        assert_eq!(set.to_string(), "0-4,8,10-12");
        assert_eq!(CuSet::range(76, 76).to_string(), "76-151");
        assert_eq!(CuSet::range(0, 1).to_string(), "0");
        assert!(CuSet::range(5, 0).is_empty());
    }

    #[test]
    fn bad_lists() {
        assert_eq!(CuSet::parse("", 304), Err(CuListError::Empty));
        assert_eq!(CuSet::parse(" , ", 304), Err(CuListError::Empty));
        assert_eq!(
            CuSet::parse("304", 304),
            Err(CuListError::OutOfRange {
                id: 304,
                devcore: 304
            })
        );
        assert!(matches!(
            CuSet::parse("0-99999999999999999999999", 304),
            Err(CuListError::OutOfRange { .. })
        ));
        assert!(matches!(
            CuSet::parse("5-3", 304),
            Err(CuListError::Backwards { .. })
        ));
        for bad in ["-1", "a", "1-", "-", "1--2", "1-2-3", "0x1", "+1", "1 2"] {
            assert!(
                matches!(CuSet::parse(bad, 304), Err(CuListError::Malformed { .. })),
                "{bad}"
            );
        }
        let message = CuSet::parse("400", 304).unwrap_err().to_string();
        assert!(message.contains("0-303"), "{message}");
    }

    #[test]
    fn wgp_pairs() {
        assert!(
            CuSet::parse("0-3,8-9", 80)
                .unwrap()
                .check_whole_wgps(2)
                .is_ok()
        );
        assert!(
            CuSet::parse("1-2", 80)
                .unwrap()
                .check_whole_wgps(2)
                .is_err()
        );
        assert!(
            CuSet::parse("0-2", 80)
                .unwrap()
                .check_whole_wgps(2)
                .is_err()
        );
        assert!(CuSet::parse("0-2", 80).unwrap().check_whole_wgps(1).is_ok());
        let err = CuSet::parse("3", 80)
            .unwrap()
            .check_whole_wgps(2)
            .unwrap_err();
        assert!(err.to_string().contains("2k,2k+1"));
    }

    #[test]
    fn set_operations() {
        let a = CuSet::parse("0-75", 304).unwrap();
        let b = CuSet::parse("76-151", 304).unwrap();
        assert!(!a.overlaps(&b));
        assert_eq!(a.union(&b).to_string(), "0-151");
        assert!(a.overlaps(&CuSet::parse("75-80", 304).unwrap()));
        assert_eq!(a.union(&b).complement(304).to_string(), "152-303");
        assert_eq!(CuSet::new().complement(4).to_string(), "0-3");
        assert_eq!(CuSet::parse("0-3", 4).unwrap().complement(4), CuSet::new());
        assert!(a.contains(75) && !a.contains(76));
    }

    #[test]
    fn hsa_cu_mask() {
        let mask = HsaCuMask::from_sets([CuSet::range(0, 76), CuSet::range(0, 76)]).unwrap();
        assert_eq!(mask.to_string(), "0:0-75;1:0-75");
        assert_eq!(HsaCuMask::parse("1:0-75;0:0-75").unwrap(), mask);
        assert_eq!(HsaCuMask::parse("").unwrap().entries().len(), 0);
        assert!(matches!(
            HsaCuMask::parse("0:1;0:2"),
            Err(CuListError::MaskDuplicateIndex { index: 0 })
        ));
        for bad in ["0-75", "x:1", ":1", "-1:1", "0:"] {
            assert!(HsaCuMask::parse(bad).is_err(), "{bad}");
        }
        assert!(HsaCuMask::from_sets([CuSet::new()]).is_err());
        assert_eq!(HsaCuMask::parse_bytes(b"0:0-75;1:0-75").unwrap(), mask);
        assert!(HsaCuMask::parse_bytes(b"0:0-7\xff5").is_err());
    }

    #[test]
    fn mask_widening_is_detected() {
        let granted = HsaCuMask::parse("0:0-75;1:0-75").unwrap();
        assert!(
            HsaCuMask::parse("0:0-10;1:0-75")
                .unwrap()
                .is_within(&granted)
        );
        assert!(
            !HsaCuMask::parse("0:0-76;1:0-75")
                .unwrap()
                .is_within(&granted)
        );
        // Dropping a GPU from the mask removes its restriction: that widens it.
        assert!(!HsaCuMask::parse("0:0-75").unwrap().is_within(&granted));
        assert!(!HsaCuMask::parse("").unwrap().is_within(&granted));
    }

    fn cu_set() -> impl Strategy<Value = CuSet> {
        prop::collection::vec((0u32..400, 0u32..40), 1..8).prop_map(|runs| {
            let mut set = CuSet::new();
            for (a, len) in runs {
                set.insert_run(a, a + len);
            }
            set
        })
    }

    proptest! {
        #[test]
        fn round_trip(set in cu_set()) {
            let text = set.to_string();
            let back = CuSet::parse(&text, 440).unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn union_and_complement_agree_with_membership(a in cu_set(), b in cu_set(), id in 0u32..450) {
            prop_assert_eq!(a.union(&b).contains(id), a.contains(id) || b.contains(id));
            prop_assert_eq!(a.complement(440).contains(id), id < 440 && !a.contains(id));
            let brute = (0..450).any(|i| a.contains(i) && b.contains(i));
            prop_assert_eq!(a.overlaps(&b), brute);
            prop_assert_eq!(a.intersection(&b).contains(id), a.contains(id) && b.contains(id));
            prop_assert_eq!(a.intersection(&b).is_empty(), !brute);
            let count = (0..450u32).filter(|i| a.contains(*i)).count() as u64;
            prop_assert_eq!(a.len(), count);
        }

        #[test]
        fn mask_round_trip(sets in prop::collection::vec(cu_set(), 1..5)) {
            let mask = HsaCuMask::from_sets(sets).unwrap();
            let text = mask.to_string();
            let back = HsaCuMask::parse(&text).unwrap();
            prop_assert_eq!(&back, &mask);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn total_on_arbitrary_text(text in ".{0,100}", devcore in any::<u32>()) {
            let _ = CuSet::parse(&text, devcore);
            let _ = HsaCuMask::parse(&text);
        }

        #[test]
        fn total_on_list_like_text(text in "[0-9,; :-]{0,60}") {
            if let Ok(set) = CuSet::parse(&text, 1000) {
                prop_assert_eq!(CuSet::parse(&set.to_string(), 1000).unwrap(), set);
            }
            let _ = HsaCuMask::parse(&text);
        }
    }
}
