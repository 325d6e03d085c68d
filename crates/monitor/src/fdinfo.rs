//! DRM fdinfo (kernel Documentation/gpu/drm-usage-stats.rst) and the utilization between two
//! samples (D-7). Pure: text in, numbers out.

use std::collections::BTreeMap;

/// What one DRM file descriptor reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrmClient {
    /// `drm-driver`, e.g. `amdgpu`.
    pub driver: String,
    /// PCI address of the device (`drm-pdev`), e.g. `0000:c1:00.0`.
    pub pdev: String,
    /// `drm-client-id`: unique per DRM file; duplicated descriptors show the same id.
    pub client_id: u64,
    /// Σ busy nanoseconds of the `gfx` and `compute` engines.
    pub busy_ns: u64,
    /// Minor of the DRM node the descriptor is open on (`renderD<m>`, `card<n>`), from the
    /// fd's link, not from fdinfo: it tells the partitions of one card apart, which share
    /// `drm-pdev`.
    pub minor: Option<u32>,
}

/// Parses one `/proc/<pid>/fdinfo/<fd>` text. `None` when it is not a DRM client with a
/// device and client id (most descriptors are not DRM files); engines other than gfx and
/// compute (dma, dec, enc, ...) are not compute utilization and are left out.
pub fn parse_fdinfo(text: &str) -> Option<DrmClient> {
    let mut driver = None;
    let mut pdev = None;
    let mut client_id = None;
    let mut busy_ns = 0u64;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "drm-driver" => driver = Some(value.to_owned()),
            "drm-pdev" => pdev = Some(value.to_owned()),
            "drm-client-id" => client_id = value.parse().ok(),
            "drm-engine-gfx" | "drm-engine-compute" => {
                if let Some(ns) = value
                    .strip_suffix("ns")
                    .and_then(|n| n.trim().parse::<u64>().ok())
                {
                    busy_ns = busy_ns.saturating_add(ns);
                }
            }
            _ => {}
        }
    }
    Some(DrmClient {
        driver: driver?,
        pdev: pdev?,
        client_id: client_id?,
        busy_ns,
        minor: None,
    })
}

/// Busy counters of the clients of one group (a container) at one instant, keyed by
/// `(device, client id)` so that duplicated descriptors are counted once. The device is
/// the registered id the client was attributed to ([`add_client_on`]), or its `drm-pdev`.
pub type BusySample = BTreeMap<(String, u64), u64>;

/// Adds a client to a sample under its `drm-pdev`, once per `(pdev, client id)`.
pub fn add_client(sample: &mut BusySample, client: &DrmClient) {
    add_client_on(sample, &client.pdev, client);
}

/// Adds a client to a sample under `device`, once per `(device, client id)`.
pub fn add_client_on(sample: &mut BusySample, device: &str, client: &DrmClient) {
    sample
        .entry((device.to_owned(), client.client_id))
        .or_insert(client.busy_ns);
}

/// Utilization of a device by a group between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceUtilization {
    /// 0..=100.
    pub percent: f64,
    /// The raw sum was above 100 % and was clamped (several engines busy at once).
    pub clamped: bool,
}

/// Percent busy per device (`pdev`) between `previous` and `current`, taken `wall_ns`
/// apart. A client present in both samples contributes its busy-time increase; a client
/// new in `current` started within the interval, so its whole busy time counts, bounded by
/// the interval; a client gone from `current` (closed its file or exited) contributes
/// nothing, because its last busy time is unknowable. Counters that went backwards (a
/// reused client id) count as new. Devices seen in either sample are reported, so a group
/// that went idle reads 0 rather than disappearing.
pub fn utilization(
    previous: &BusySample,
    current: &BusySample,
    wall_ns: u64,
) -> BTreeMap<String, DeviceUtilization> {
    let mut busy: BTreeMap<String, u64> = BTreeMap::new();
    for (pdev, _) in previous.keys() {
        busy.entry(pdev.clone()).or_insert(0);
    }
    if wall_ns == 0 {
        return BTreeMap::new();
    }
    for ((pdev, client), now) in current {
        let delta = match previous.get(&(pdev.clone(), *client)) {
            Some(before) if now >= before => now - before,
            _ => (*now).min(wall_ns),
        };
        let entry = busy.entry(pdev.clone()).or_insert(0);
        *entry = entry.saturating_add(delta);
    }
    busy.into_iter()
        .map(|(pdev, ns)| {
            let raw = ns as f64 * 100.0 / wall_ns as f64;
            (
                pdev,
                DeviceUtilization {
                    percent: raw.min(100.0),
                    clamped: raw > 100.0,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const AMDGPU: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1061\ndrm-driver:\tamdgpu\ndrm-client-id:\t42\ndrm-pdev:\t0000:c1:00.0\npasid:\t32771\ndrm-memory-vram:\t1048576 KiB\ndrm-memory-gtt:\t2048 KiB\ndrm-memory-cpu:\t0 KiB\namd-memory-visible-vram:\t0 KiB\ndrm-engine-gfx:\t1500 ns\ndrm-engine-compute:\t2500000 ns\ndrm-engine-dma:\t99999 ns\ndrm-engine-dec:\t7 ns\n";

    #[test]
    fn parses_an_amdgpu_fdinfo() {
        let client = parse_fdinfo(AMDGPU).unwrap();
        assert_eq!(client.driver, "amdgpu");
        assert_eq!(client.pdev, "0000:c1:00.0");
        assert_eq!(client.client_id, 42);
        assert_eq!(client.busy_ns, 2_501_500, "gfx + compute, not dma/dec");
    }

    #[test]
    fn non_drm_descriptors_are_not_clients() {
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t1\n"), None);
        assert_eq!(parse_fdinfo(""), None);
        let no_client = AMDGPU.replace("drm-client-id:\t42\n", "");
        assert_eq!(parse_fdinfo(&no_client), None);
    }

    #[test]
    fn duplicated_descriptors_count_once() {
        let client = parse_fdinfo(AMDGPU).unwrap();
        let mut sample = BusySample::new();
        add_client(&mut sample, &client);
        add_client(&mut sample, &client);
        assert_eq!(sample.len(), 1);
    }

    fn sample(entries: &[(&str, u64, u64)]) -> BusySample {
        entries
            .iter()
            .map(|(p, c, ns)| ((p.to_string(), *c), *ns))
            .collect()
    }

    #[test]
    fn utilization_is_busy_delta_over_wall_time() {
        let before = sample(&[("a", 1, 1_000), ("a", 2, 0), ("b", 3, 10)]);
        let after = sample(&[("a", 1, 251_000), ("a", 2, 250_000), ("b", 3, 10)]);
        let util = utilization(&before, &after, 1_000_000);
        assert_eq!(util["a"].percent, 50.0);
        assert!(!util["a"].clamped);
        assert_eq!(util["b"].percent, 0.0, "idle device reads 0");
    }

    #[test]
    fn sums_above_wall_time_are_clamped_and_flagged() {
        let before = sample(&[("a", 1, 0), ("a", 2, 0)]);
        let after = sample(&[("a", 1, 900), ("a", 2, 900)]);
        let util = utilization(&before, &after, 1000);
        assert_eq!(util["a"].percent, 100.0);
        assert!(util["a"].clamped);
    }

    #[test]
    fn new_and_gone_clients() {
        let before = sample(&[("a", 1, 500)]);
        let after = sample(&[("a", 2, 5_000)]);
        let util = utilization(&before, &after, 1_000);
        assert_eq!(
            util["a"].percent, 100.0,
            "a new client counts at most the interval"
        );
        let util = utilization(&before, &sample(&[("a", 2, 300)]), 1_000);
        assert_eq!(util["a"].percent, 30.0);
    }

    proptest! {
        #[test]
        fn utilization_stays_in_range(
            prev in proptest::collection::btree_map((0u8..3, 0u64..4), 0u64..1u64 << 40, 0..8),
            next in proptest::collection::btree_map((0u8..3, 0u64..4), 0u64..1u64 << 40, 0..8),
            wall in 0u64..1u64 << 40,
        ) {
            let conv = |m: &BTreeMap<(u8, u64), u64>| -> BusySample {
                m.iter().map(|((p, c), v)| ((p.to_string(), *c), *v)).collect()
            };
            for (_, u) in utilization(&conv(&prev), &conv(&next), wall) {
                prop_assert!((0.0..=100.0).contains(&u.percent));
                prop_assert!(!u.clamped || u.percent == 100.0);
            }
        }

        #[test]
        fn exact_for_continuing_clients(busy in proptest::collection::vec(0u64..1_000, 1..6), wall in 6_000u64..100_000) {
            let before: BusySample = busy.iter().enumerate().map(|(i, _)| (("d".to_string(), i as u64), 7)).collect();
            let after: BusySample = busy.iter().enumerate().map(|(i, b)| (("d".to_string(), i as u64), 7 + b)).collect();
            let total: u64 = busy.iter().sum();
            let util = utilization(&before, &after, wall);
            let expected = total as f64 * 100.0 / wall as f64;
            prop_assert!((util["d"].percent - expected).abs() < 1e-9);
        }

        #[test]
        fn parser_never_panics(text in ".{0,400}") {
            let _ = parse_fdinfo(&text);
        }
    }
}
