//! GPU health from NVML XID events (issue 26 item 11), the pure rules.
//!
//! As NVIDIA's k8s-device-plugin (`internal/rm/health.go`): a `nvmlEventTypeXidCriticalError`
//! makes its GPU unhealthy unless the XID is one of the application errors that leave the
//! GPU usable ([`APPLICATION_XIDS`]: 13, 31, 43, 45, 68, 109). Like the AMD plugin
//! (`health_events.rs`), a change of health is an Event on the Node — `NVIDIAGPUUnhealthy`
//! (naming the XID) when it goes, `NVIDIAGPURecovered` when it comes back — and the GPU's
//! kubelet devices are re-sent Unhealthy/Healthy. When it comes back: upstream never (only a
//! plugin restart clears it, since XIDs such as 48 or 79 need a GPU reset); here the same by
//! default, or, with `--xid-recovery-seconds N`, once N seconds pass with no further
//! critical XID on that GPU while NVML still lists it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::registration::RegisteredGpu;

/// XIDs that report an application's error, not the GPU's (upstream's ignored list).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Node Event reason when a critical XID makes a GPU unhealthy.
pub const REASON_UNHEALTHY: &str = "NVIDIAGPUUnhealthy";
/// Node Event reason when such a GPU is healthy again.
pub const REASON_RECOVERED: &str = "NVIDIAGPURecovered";

/// Whether an XID makes its GPU unhealthy.
pub fn is_critical(xid: u64) -> bool {
    !APPLICATION_XIDS.contains(&xid)
}

/// What one XID event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidOutcome {
    /// An application error: the GPU stays as it was.
    Ignored,
    /// The GPU was healthy and is not any more.
    BecameUnhealthy,
    /// The GPU was already unhealthy (its recovery clock starts again).
    StillUnhealthy,
}

/// A Node Event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// [`REASON_UNHEALTHY`] or [`REASON_RECOVERED`].
    pub reason: &'static str,
    /// `Warning` or `Normal`.
    pub kind: &'static str,
    /// Names the GPU (and the XID).
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Mark {
    xid: u64,
    last: Instant,
}

/// The GPUs a critical XID made unhealthy, by UUID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XidHealth {
    recovery: Option<Duration>,
    marks: BTreeMap<String, Mark>,
}

impl XidHealth {
    /// Rules with a recovery time (`None`: a marked GPU stays unhealthy).
    pub fn new(recovery: Option<Duration>) -> Self {
        Self {
            recovery,
            marks: BTreeMap::new(),
        }
    }

    /// Records XID `xid` on GPU `uuid` at `now`.
    pub fn record(&mut self, uuid: &str, xid: u64, now: Instant) -> XidOutcome {
        if !is_critical(xid) {
            return XidOutcome::Ignored;
        }
        let before = self.is_unhealthy(uuid, now);
        self.marks.insert(uuid.to_owned(), Mark { xid, last: now });
        if before {
            XidOutcome::StillUnhealthy
        } else {
            XidOutcome::BecameUnhealthy
        }
    }

    /// Whether GPU `uuid` is unhealthy at `now`.
    pub fn is_unhealthy(&self, uuid: &str, now: Instant) -> bool {
        self.marks.get(uuid).is_some_and(|m| match self.recovery {
            None => true,
            Some(after) => now.saturating_duration_since(m.last) < after,
        })
    }

    /// Forgets the marks whose recovery time has passed at `now` and returns a
    /// [`REASON_RECOVERED`] Event for each of those GPUs NVML still lists (`present`);
    /// a GPU gone from NVML is forgotten silently (its disappearance is the news).
    pub fn recoveries(&mut self, present: &[RegisteredGpu], now: Instant) -> Vec<HealthEvent> {
        let Some(after) = self.recovery else {
            return Vec::new();
        };
        let done: Vec<String> = self
            .marks
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.last) >= after)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        let mut events = Vec::new();
        for uuid in done {
            let mark = self.marks.remove(&uuid);
            if let Some(mark) = mark
                && present.iter().any(|g| g.info.id == uuid)
            {
                events.push(HealthEvent {
                    reason: REASON_RECOVERED,
                    kind: "Normal",
                    message: format!(
                        "GPU {uuid} is healthy again: no critical XID for {}s since XID {}",
                        after.as_secs(),
                        mark.xid
                    ),
                });
            }
        }
        events
    }

    /// Marks the unhealthy GPUs of `devices` so (health false); others are left as they are.
    pub fn apply(&self, devices: &mut [RegisteredGpu], now: Instant) {
        for d in devices {
            if self.is_unhealthy(&d.info.id, now) {
                d.info.health = false;
            }
        }
    }
}

/// The Event of a GPU that became unhealthy.
pub fn unhealthy_event(uuid: &str, xid: u64, recovery: Option<Duration>) -> HealthEvent {
    let until = match recovery {
        None => "until the GPU is reset and the plugin restarted".to_owned(),
        Some(d) => format!("until {}s pass without a critical XID", d.as_secs()),
    };
    HealthEvent {
        reason: REASON_UNHEALTHY,
        kind: "Warning",
        message: format!(
            "GPU {uuid} is unhealthy: critical XID {xid} reported by NVML; it is offered as Unhealthy {until}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::node_register::DeviceInfo;
    use proptest::prelude::*;

    fn gpu(uuid: &str) -> RegisteredGpu {
        RegisteredGpu {
            info: DeviceInfo {
                id: uuid.into(),
                health: true,
                ..DeviceInfo::default()
            },
        }
    }

    #[test]
    fn critical_xids_mark_application_errors_do_not() {
        let t0 = Instant::now();
        let mut h = XidHealth::new(None);
        for xid in APPLICATION_XIDS {
            assert_eq!(h.record("GPU-a", xid, t0), XidOutcome::Ignored, "{xid}");
        }
        assert!(!h.is_unhealthy("GPU-a", t0));
        assert_eq!(h.record("GPU-a", 79, t0), XidOutcome::BecameUnhealthy);
        assert_eq!(h.record("GPU-a", 48, t0), XidOutcome::StillUnhealthy);
        let mut devices = vec![gpu("GPU-a"), gpu("GPU-b")];
        h.apply(&mut devices, t0 + Duration::from_secs(3600));
        assert!(!devices[0].info.health);
        assert!(devices[1].info.health);
        // Without a recovery time it never comes back.
        assert!(
            h.recoveries(&devices, t0 + Duration::from_secs(86400))
                .is_empty()
        );
        assert!(h.is_unhealthy("GPU-a", t0 + Duration::from_secs(86400)));
        let e = unhealthy_event("GPU-a", 79, None);
        assert_eq!((e.reason, e.kind), (REASON_UNHEALTHY, "Warning"));
        assert!(e.message.contains("XID 79") && e.message.contains("GPU-a"));
    }

    #[test]
    fn recovery_after_a_quiet_period_on_a_listed_gpu() {
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let mut h = XidHealth::new(Some(after));
        h.record("GPU-a", 79, t0);
        h.record("GPU-b", 94, t0);
        let listed = [gpu("GPU-a")];
        assert!(
            h.recoveries(&listed, t0 + Duration::from_secs(59))
                .is_empty()
        );
        // A new critical XID restarts the clock.
        assert_eq!(
            h.record("GPU-a", 79, t0 + Duration::from_secs(30)),
            XidOutcome::StillUnhealthy
        );
        let events = h.recoveries(&listed, t0 + Duration::from_secs(61));
        // GPU-b is gone from NVML: forgotten without an Event.
        assert!(events.is_empty(), "{events:?}");
        assert!(h.is_unhealthy("GPU-a", t0 + Duration::from_secs(61)));
        let events = h.recoveries(&listed, t0 + Duration::from_secs(90));
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].reason, events[0].kind),
            (REASON_RECOVERED, "Normal")
        );
        assert!(!h.is_unhealthy("GPU-a", t0 + Duration::from_secs(90)));
    }

    proptest! {
        /// A GPU is unhealthy after a sequence of XIDs exactly when one of them is
        /// critical (no recovery time).
        #[test]
        fn unhealthy_iff_some_xid_is_critical(xids in prop::collection::vec(0u64..200, 0..12)) {
            let t0 = Instant::now();
            let mut h = XidHealth::new(None);
            let mut became = 0;
            for &x in &xids {
                if h.record("GPU-a", x, t0) == XidOutcome::BecameUnhealthy {
                    became += 1;
                }
            }
            let critical = xids.iter().any(|&x| is_critical(x));
            prop_assert_eq!(h.is_unhealthy("GPU-a", t0), critical);
            prop_assert_eq!(became, usize::from(critical));
        }
    }
}
