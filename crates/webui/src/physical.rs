//! Hard partitions under their physical card: an MI300X in CPX mode registers eight
//! devices, one per partition, each with the card's PCI address (`customInfo.pciBDF`) and
//! an id ending in its partition index (D-8: `GPU-<unique_id>-<index>`). The node page
//! shows them together under the card, with the indices the mode implies that are not
//! registered, so a missing partition is visible rather than one card short in a long list.
//! Pure.

use hami_protocol::node_register::DeviceInfo;

/// One physical card and the registered devices that are its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    /// The card's PCI address.
    pub pci_bdf: String,
    /// Its compute partition mode (`CPX`, `DPX`, …).
    pub mode: String,
    /// (partition index, position in the node's device list), by index.
    pub partitions: Vec<(u8, usize)>,
    /// How many partitions the mode gives the card ([`expected_partitions`]).
    pub expected: usize,
    /// Indices below `expected` that no registered device has.
    pub missing: Vec<u8>,
}

/// How the node's devices are laid out: whole cards alone, partitions under their card, in
/// the order of each card's (or card's first partition's) place in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// A device that is not a partition (its position in the list).
    Whole(usize),
    /// A card split into partitions.
    Card(Physical),
}

/// Partitions the mode gives a card: SPX 1, DPX 2, TPX 3, QPX 4, CPX one per XCD (8 on
/// MI300X/MI325X, 6 on MI300A); an unknown mode: none assumed (only the registered ones).
pub fn expected_partitions(mode: &str, device_type: &str) -> usize {
    match mode.to_ascii_uppercase().as_str() {
        "SPX" => 1,
        "DPX" => 2,
        "TPX" => 3,
        "QPX" => 4,
        "CPX" if device_type.to_ascii_uppercase().contains("MI300A") => 6,
        "CPX" => 8,
        _ => 0,
    }
}

/// The partition index in a partition's registered id (`GPU-<16 hex>-<index>`, D-8).
fn partition_index(id: &str) -> Option<u8> {
    let (card, index) = id.rsplit_once('-')?;
    hami_protocol::identity::parse_rocr_id(card).ok()?;
    index.parse().ok().filter(|i| *i < 8)
}

/// Groups a node's devices: those in a partition mode other than SPX, with the card's PCI
/// address and a partition id, under their card; every other device alone.
pub fn group(devices: &[&DeviceInfo]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (pos, d) in devices.iter().enumerate() {
        let info = &d.custom_info;
        let partition = match (&info.compute_partition, &info.pci_bdf) {
            (Some(mode), Some(bdf)) if !mode.eq_ignore_ascii_case("SPX") => {
                partition_index(&d.id).map(|i| (mode, bdf, i))
            }
            _ => None,
        };
        let Some((mode, bdf, index)) = partition else {
            out.push(Group::Whole(pos));
            continue;
        };
        let card = out.iter_mut().find_map(|g| match g {
            Group::Card(c) if c.pci_bdf == *bdf => Some(c),
            _ => None,
        });
        match card {
            Some(c) => c.partitions.push((index, pos)),
            None => out.push(Group::Card(Physical {
                pci_bdf: bdf.clone(),
                mode: mode.clone(),
                partitions: vec![(index, pos)],
                expected: expected_partitions(mode, &d.device_type),
                missing: Vec::new(),
            })),
        }
    }
    for g in &mut out {
        if let Group::Card(c) = g {
            c.partitions.sort();
            let highest = c.partitions.iter().map(|(i, _)| *i as usize + 1).max();
            c.expected = c.expected.max(highest.unwrap_or(0));
            c.missing = (0..c.expected as u8)
                .filter(|i| !c.partitions.iter().any(|(p, _)| p == i))
                .collect();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(bdf: &str, id: &str) -> DeviceInfo {
        let mut d = DeviceInfo {
            id: id.into(),
            device_type: "AMD-Instinct-MI300X".into(),
            ..Default::default()
        };
        d.custom_info.pci_bdf = Some(bdf.into());
        d.custom_info.compute_partition = Some("CPX".into());
        d
    }

    #[test]
    fn the_real_cpx_capture_groups_into_cards_of_eight() {
        // The MI300X CPX capture: 63 partitions registered.
        let (_, cpx) = crate::fixtures::captures();
        let refs: Vec<&DeviceInfo> = cpx.iter().collect();
        let groups = group(&refs);
        let cards: Vec<&Physical> = groups
            .iter()
            .filter_map(|g| match g {
                Group::Card(c) => Some(c),
                Group::Whole(_) => None,
            })
            .collect();
        assert_eq!(cards.len(), groups.len(), "every device is a partition");
        let placed: usize = cards.iter().map(|c| c.partitions.len()).sum();
        assert_eq!(placed, cpx.len());
        for c in &cards {
            assert_eq!(c.expected, 8, "{c:?}");
            assert_eq!(c.partitions.len() + c.missing.len(), 8, "{c:?}");
        }
        let missing: usize = cards.iter().map(|c| c.missing.len()).sum();
        assert_eq!(missing, cards.len() * 8 - cpx.len());
    }

    #[test]
    fn a_missing_partition_is_named_and_whole_cards_stay_alone() {
        let mut devices: Vec<DeviceInfo> = (0..8)
            .filter(|i| *i != 5)
            .map(|i| partition("0000:0c:00.0", &format!("GPU-00000000000000ab-{i}")))
            .collect();
        devices.insert(2, partition("0000:22:00.0", "GPU-00000000000000cd-0"));
        let mut whole = DeviceInfo {
            id: "GPU-00000000-0000-4000-8000-000000000001".into(),
            ..Default::default()
        };
        whole.custom_info.pci_bdf = Some("0000:41:00.0".into());
        devices.push(whole);
        let refs: Vec<&DeviceInfo> = devices.iter().collect();
        let groups = group(&refs);
        assert_eq!(groups.len(), 3, "{groups:?}");
        let Group::Card(first) = &groups[0] else {
            panic!("{groups:?}")
        };
        assert_eq!(first.pci_bdf, "0000:0c:00.0");
        assert_eq!(first.partitions.len(), 7);
        assert_eq!(first.missing, vec![5]);
        let Group::Card(second) = &groups[1] else {
            panic!("{groups:?}")
        };
        assert_eq!(second.missing, (1..8).collect::<Vec<u8>>());
        assert_eq!(groups[2], Group::Whole(8));
    }

    #[test]
    fn modes_give_their_partition_counts() {
        assert_eq!(expected_partitions("DPX", "AMD-Instinct-MI300X"), 2);
        assert_eq!(expected_partitions("cpx", "AMD-Instinct-MI300A"), 6);
        assert_eq!(expected_partitions("CPX", "AMD-Instinct-MI325X"), 8);
        assert_eq!(expected_partitions("NEW", "x"), 0);
    }
}
