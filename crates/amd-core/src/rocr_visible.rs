//! `ROCR_VISIBLE_DEVICES` for a container, and a model of what ROCr does with it.
//!
//! What ROCr accepts (ROCR-Runtime `core/runtime/amd_filter_device.cpp`, libhsakmt
//! `topology.c`): libhsakmt enumerates the KFD topology nodes in node order and drops
//! every GPU node whose `/dev/dri/renderD<minor>` cannot be opened, so a container sees
//! only the partitions whose render nodes were mounted. ROCr then reads the variable as
//! comma-separated tokens (trimmed, upper-cased): a token starting with `G` is a UUID
//! (`GPU-<16 hex of unique_id>`) that must match exactly one visible GPU by prefix; any
//! other token is an index (C `strtol`, base 0) into the visible GPUs. The first token
//! that does not resolve, or repeats a device, ends the list; the devices are renumbered
//! from 0 in token order.
//!
//! All partitions of a card share `unique_id`, so two partitions of one card in one
//! container would both be `GPU-<same>`: the token matches two devices and ROCr shows
//! **no** GPU at all. We therefore emit the UUID when it names one device of the
//! container, and otherwise the device's index among the container's visible GPUs
//! (KFD node order of what we mount). Both forms keep the allocation order.

use hami_amd_discovery::registration::RegisteredDevice;

/// The value for a container holding `devices`, in allocation order.
pub fn rocr_visible_devices(devices: &[&RegisteredDevice]) -> String {
    let mut by_node: Vec<u32> = devices.iter().map(|d| d.kfd_node).collect();
    by_node.sort_unstable();
    by_node.dedup();
    devices
        .iter()
        .map(|d| {
            let shared = devices.iter().filter(|o| o.rocr_id == d.rocr_id).count() > 1;
            if shared {
                by_node
                    .iter()
                    .position(|n| *n == d.kfd_node)
                    .unwrap_or_default()
                    .to_string()
            } else {
                d.rocr_id.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// One GPU as ROCr enumerates it inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleGpu {
    /// Its KFD topology node.
    pub kfd_node: u32,
    /// `GPU-<16 hex>` upper-cased as ROCr compares it, or `Invalid-UUID` for unique_id 0.
    pub uuid: String,
}

/// The GPUs libhsakmt/ROCr enumerate: KFD nodes with compute cores whose render node
/// opens, in node order. `nodes` are `(node id, simd_count, drm_render_minor, unique_id)`.
pub fn visible_gpus(
    nodes: &[(u32, u64, u32, u64)],
    render_opens: impl Fn(u32) -> bool,
) -> Vec<VisibleGpu> {
    let mut sorted = nodes.to_vec();
    sorted.sort_by_key(|n| n.0);
    sorted
        .into_iter()
        .filter(|(_, simds, render, _)| *simds > 0 && render_opens(*render))
        .map(|(kfd_node, _, _, unique_id)| VisibleGpu {
            kfd_node,
            uuid: if unique_id == 0 {
                "Invalid-UUID".into()
            } else {
                format!("GPU-{unique_id:016X}")
            },
        })
        .collect()
}

/// The KFD nodes ROCr surfaces for `env` (unset = all), in ROCr's device order.
pub fn rocr_selects(visible: &[VisibleGpu], env: Option<&str>) -> Vec<u32> {
    let Some(env) = env else {
        return visible.iter().map(|g| g.kfd_node).collect();
    };
    let mut chosen: Vec<usize> = Vec::new();
    if env.is_empty() {
        return Vec::new();
    }
    for token in env.split(',').take(visible.len()) {
        let token = token.trim().to_ascii_uppercase();
        let index = if token.starts_with('G') {
            if !(5..=20).contains(&token.len()) {
                break;
            }
            let mut matches = visible
                .iter()
                .enumerate()
                .filter(|(_, g)| g.uuid.starts_with(&token));
            match (matches.next(), matches.next()) {
                (Some((i, _)), None) => i,
                _ => break,
            }
        } else {
            match parse_c_integer(&token) {
                Some(i) if i >= 0 && (i as usize) < visible.len() => i as usize,
                _ => break,
            }
        };
        if chosen.contains(&index) {
            break;
        }
        chosen.push(index);
    }
    chosen.into_iter().map(|i| visible[i].kfd_node).collect()
}

/// `strtol(s, &end, 0)` with `*end == '\0'` required: decimal, `0x` hex or `0` octal.
fn parse_c_integer(token: &str) -> Option<i64> {
    let (negative, digits) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token.strip_prefix('+').unwrap_or(token)),
    };
    let value = if let Some(hex) = digits.strip_prefix("0X") {
        i64::from_str_radix(hex, 16).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse().ok()?
    };
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(uuids: &[u64]) -> Vec<VisibleGpu> {
        let nodes: Vec<_> = uuids
            .iter()
            .enumerate()
            .map(|(i, u)| (i as u32 + 2, 80, 128 + i as u32, *u))
            .collect();
        visible_gpus(&nodes, |_| true)
    }

    #[test]
    fn rocr_token_rules() {
        let two = gpus(&[0xe3aa, 0xe3aa]);
        // The same UUID twice: ambiguous, ROCr surfaces nothing.
        let same = format!("GPU-{:016x},GPU-{:016x}", 0xe3aa, 0xe3aa);
        assert_eq!(rocr_selects(&two, Some(&same)), Vec::<u32>::new());
        assert_eq!(rocr_selects(&two, Some("1,0")), vec![3, 2]);
        assert_eq!(
            rocr_selects(&two, Some("0,0")),
            vec![2],
            "repeat ends the list"
        );
        assert_eq!(rocr_selects(&two, Some("")), Vec::<u32>::new());
        assert_eq!(rocr_selects(&two, None), vec![2, 3]);
        let mixed = gpus(&[0xabc, 0xdef]);
        assert_eq!(
            rocr_selects(&mixed, Some(&format!(" gpu-{:016x} ,0", 0xdef))),
            vec![3, 2],
            "trimmed, case-insensitive, mixed forms"
        );
        assert_eq!(rocr_selects(&mixed, Some("0x1")), vec![3]);
        assert_eq!(rocr_selects(&mixed, Some("2")), Vec::<u32>::new());
        assert_eq!(rocr_selects(&mixed, Some("1x")), Vec::<u32>::new());
        // Not openable render nodes are not enumerated at all.
        let nodes = [(2, 80, 128, 7), (3, 80, 129, 7), (0, 0, 0, 0)];
        let only = visible_gpus(&nodes, |r| r == 129);
        assert_eq!(only.len(), 1);
        assert_eq!(rocr_selects(&only, Some("GPU-0000000000000007")), vec![3]);
    }
}
