//! The fault schedule: a pure function of the seed and the run's length.

use std::time::Duration;

use crate::rng::Rng;

/// The kinds of fault the harness injects (issue 18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A burst of 409 Conflict answers on pod, pod status and node patches, pod binding and
    /// Lease updates; with the DRA node also on ResourceClaim status writes (allocation,
    /// reservation, the driver's `status.devices`) and 500s on claim creation.
    ConflictStorm,
    /// Every open watch is ended (and sometimes the watch history expired: 410 on resume).
    WatchDrop,
    /// The API server stops and starts again on the same address and `--data-dir`.
    ApiServerRestart,
    /// The leading scheduler replica is killed (election, informers, listener); it comes
    /// back later with a new clock skew.
    LeaderKill,
    /// A device plugin is stopped while a pod on its node is being allocated, and started again.
    PluginRestartMidAllocate,
    /// A simulated kubelet restarts (socket directory wiped, plugins must re-register).
    KubeletRestart,
    /// A pod is deleted while it is being bound or allocated, and a new one submitted.
    DeleteMidBind,
    /// A scheduler replica is restarted with a different wall-clock skew.
    ClockSkew,
    /// SIGKILL of a workload process (its process group when it has one of its own) of a
    /// seeded pod, preferably one just started and still allocating.
    KillWorkload,
    /// The DRA driver is killed (no shutdown: stale sockets, calls cut), preferably while a
    /// DRA pod on its node waits for its claim's prepare, and started again from its
    /// checkpoint.
    DraDriverKill,
    /// The DRA node's kubelet-sim process restarts (preferably while a DRA pod waits for its
    /// prepare): stopped, its containers with it; a Running DRA pod deleted while it is
    /// down; started again from its checkpoint file, to unprepare that pod's claim, keep the
    /// others prepared and find the driver's registration again.
    DraKubeletRestart,
    /// A DRA pod is deleted while its claim is being created, allocated or prepared, and a
    /// new one submitted.
    DraDeleteMidPrepare,
}

impl FaultKind {
    /// Every fault kind, in a fixed order so a seed picks the same kinds each run.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::ConflictStorm,
        FaultKind::WatchDrop,
        FaultKind::ApiServerRestart,
        FaultKind::LeaderKill,
        FaultKind::PluginRestartMidAllocate,
        FaultKind::KubeletRestart,
        FaultKind::DeleteMidBind,
        FaultKind::ClockSkew,
        FaultKind::KillWorkload,
        FaultKind::DraDriverKill,
        FaultKind::DraKubeletRestart,
        FaultKind::DraDeleteMidPrepare,
    ];

    /// Whether the fault needs the stack's DRA node.
    pub fn needs_dra(self) -> bool {
        matches!(
            self,
            FaultKind::DraDriverKill
                | FaultKind::DraKubeletRestart
                | FaultKind::DraDeleteMidPrepare
        )
    }
}

/// One planned fault: when (from the start of the fault phase), what, and a free
/// parameter the injector uses for its own choices (which node, how many 409s, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Offset from the start of the fault phase.
    pub at: Duration,
    /// Which fault to inject.
    pub kind: FaultKind,
    /// Seeded parameter the injector turns into its own choices.
    pub param: u64,
}

/// Faults spread over `duration`, about `mean_gap` apart (each gap uniform in
/// [gap/2, 3·gap/2]). Every kind occurs at least once (the first ones are a seeded
/// permutation of all kinds) as long as the duration holds that many gaps.
pub fn plan(seed: u64, duration: Duration, mean_gap: Duration) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut first = FaultKind::ALL;
    rng.shuffle(&mut first);
    let gap_ms = mean_gap.as_millis().max(2) as u64;
    let mut at = 0u64;
    let mut out = Vec::new();
    for i in 0.. {
        at += rng.between(gap_ms / 2, gap_ms * 3 / 2);
        if at >= duration.as_millis() as u64 {
            break;
        }
        let kind = match first.get(i) {
            Some(k) => *k,
            None => FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize],
        };
        out.push(Planned {
            at: Duration::from_millis(at),
            kind,
            param: rng.next_u64(),
        });
    }
    out
}

/// The mean gap at which `plan` fits every kind into `duration`: a gap is at most 1.5 × the
/// mean, so `ALL.len()` of them end before `duration` when the mean is under
/// `duration / (1.5 · ALL.len())`; never more than 2.5 s (the long runs' pace).
pub fn gap_fitting_every_kind(duration: Duration) -> Duration {
    let most = duration.as_millis() as u64 * 2 / (3 * FaultKind::ALL.len() as u64);
    Duration::from_millis(most.saturating_sub(1).clamp(2, 2500))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_seed_reproduces_its_schedule_and_covers_every_kind() {
        for seed in 0..200u64 {
            let a = plan(seed, Duration::from_secs(40), Duration::from_millis(1500));
            assert_eq!(
                a,
                plan(seed, Duration::from_secs(40), Duration::from_millis(1500))
            );
            let kinds: BTreeSet<FaultKind> = a.iter().map(|p| p.kind).collect();
            assert_eq!(kinds.len(), FaultKind::ALL.len(), "seed {seed}: {a:?}");
            assert!(a.windows(2).all(|w| w[0].at < w[1].at));
            assert!(a.iter().all(|p| p.at < Duration::from_secs(40)));
        }
        assert_ne!(
            plan(1, Duration::from_secs(40), Duration::from_secs(1)),
            plan(2, Duration::from_secs(40), Duration::from_secs(1))
        );
    }

    #[test]
    fn the_ci_run_plans_every_kind() {
        // tests/it/chaos.rs: 20 s of faults in CI (40 s the former CI run, and longer runs by
        // hand) at `gap_fitting_every_kind`; its default seed and more.
        for seconds in [20, 40, 300] {
            let duration = Duration::from_secs(seconds);
            let gap = gap_fitting_every_kind(duration);
            for seed in (0..2000u64).chain([0x4841_4d49_2018]) {
                let p = plan(seed, duration, gap);
                let kinds: BTreeSet<FaultKind> = p.iter().map(|p| p.kind).collect();
                assert_eq!(
                    kinds.len(),
                    FaultKind::ALL.len(),
                    "{seconds} s, seed {seed}: {p:?}"
                );
            }
        }
        assert_eq!(
            gap_fitting_every_kind(Duration::from_secs(20)),
            Duration::from_millis(1110)
        );
        assert_eq!(
            gap_fitting_every_kind(Duration::from_secs(300)),
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn a_short_run_plans_only_what_fits() {
        let p = plan(3, Duration::from_secs(3), Duration::from_secs(1));
        assert!(p.len() <= 6, "{p:?}");
        assert!(plan(3, Duration::ZERO, Duration::from_secs(1)).is_empty());
    }
}
