//! Leader election on a `coordination.k8s.io/v1` Lease, with optimistic concurrency
//! (update carrying the resourceVersion) so that exactly one replica wins a contested
//! lease on any conforming API server. A replica considers itself leader only until its
//! last successful renewal plus the lease duration minus a safety margin, measured on its
//! own monotonic clock: a replica that cannot renew stops deciding before another one may
//! take over, so a follower never serves a stale decision.
//!
//! Pure here: [`LeaseObserver`] (which step to take on the Lease) and [`next_spec`] (what
//! to write); [`crate::leader_term`] decides how long each attempt makes this replica lead.
//! [`run`] is their driver: it reads and writes the Lease and sleeps.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use crate::leader_term::{Attempt, Hold, Term, Transition};

/// Whether this replica may decide now.
#[derive(Debug)]
pub struct Leadership {
    elected: bool,
    valid_until: Mutex<Option<Instant>>,
    /// The Lease holder as last read (another replica's identity when we follow).
    holder: Mutex<Option<String>>,
    /// Leadership terms begun (0 before the first, and always without election): the
    /// informers list again at each, and the new leader decides only once they have (D-23).
    terms: tokio::sync::watch::Sender<u64>,
}

impl Leadership {
    /// No election: always the leader.
    pub fn always() -> Self {
        Self {
            elected: false,
            valid_until: Mutex::new(None),
            holder: Mutex::new(None),
            terms: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Elected: leader only while the lease is held.
    pub fn elected() -> Self {
        Self {
            elected: true,
            valid_until: Mutex::new(None),
            holder: Mutex::new(None),
            terms: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Whether this replica may decide now: always when not elected, else while its lease holds.
    pub fn is_leader(&self) -> bool {
        if !self.elected {
            return true;
        }
        let until = *self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|t| Instant::now() < t)
    }

    /// Terms begun so far.
    pub fn term(&self) -> u64 {
        *self.terms.borrow()
    }

    /// Told of each term begun.
    pub fn terms(&self) -> tokio::sync::watch::Receiver<u64> {
        self.terms.subscribe()
    }

    /// Counts a term begun: before the lease's validity is published, so no decision of the
    /// new term can pass the informers' fence on a view listed before it.
    fn begin_term(&self) {
        self.terms.send_modify(|t| *t += 1);
    }

    fn hold_until(&self, until: Option<Instant>) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Whether leader election runs (false: this replica always decides).
    pub fn is_elected(&self) -> bool {
        self.elected
    }

    /// The identity holding the Lease as last read; `None` without election or before
    /// the first read.
    pub fn holder(&self) -> Option<String> {
        self.holder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_holder(&self, holder: Option<String>) {
        *self.holder.lock().unwrap_or_else(|p| p.into_inner()) = holder;
    }
}

/// What to do with the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it.
    TakeOver,
    /// Held by someone else.
    Follow {
        /// The holder's identity.
        holder: String,
    },
}

/// The parts of a Lease whose change proves its holder alive (client-go's
/// `LeaderElectionRecord`): any difference, even a renew time that went backwards on a
/// skewed clock, counts as a renewal observed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `holderIdentity` (empty when none).
    pub holder: String,
    /// `leaseDurationSeconds` (15 when absent).
    pub duration_seconds: i32,
    /// `acquireTime` as written.
    pub acquire_time: Option<String>,
    /// `renewTime` as written.
    pub renew_time: Option<String>,
    /// `leaseTransitions`.
    pub transitions: i32,
}

impl LeaseRecord {
    /// The record of a Lease's spec.
    pub fn of(spec: &LeaseSpec) -> Self {
        let time = |t: &Option<MicroTime>| t.as_ref().map(|t| t.0.to_string());
        LeaseRecord {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(15),
            acquire_time: time(&spec.acquire_time),
            renew_time: time(&spec.renew_time),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What this replica last saw of the Lease and when, on its own monotonic clock. Expiry is
/// measured from that moment, never from the times written in the Lease: those come from
/// the holder's wall clock, and comparing them with ours made 2 s of skew enough for two
/// leaders. A replica that starts, or sees a new record, waits a whole lease duration
/// before it may take over (client-go's rule).
#[derive(Debug, Clone, Default)]
pub struct LeaseObserver {
    last: Option<(LeaseRecord, Instant)>,
}

impl LeaseObserver {
    /// An observer that has seen nothing (so it waits a lease duration before taking over).
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides from the lease as read at `now` (monotonic), remembering what was read.
    pub fn step(&mut self, spec: Option<&LeaseSpec>, me: &str, now: Instant) -> LeaseStep {
        let Some(spec) = spec else {
            self.last = None;
            return LeaseStep::TakeOver;
        };
        let record = LeaseRecord::of(spec);
        let observed_at = match &self.last {
            Some((seen, at)) if *seen == record => *at,
            _ => now,
        };
        self.last = Some((record.clone(), observed_at));
        if record.holder == me {
            return LeaseStep::Renew;
        }
        if record.holder.is_empty() {
            return LeaseStep::TakeOver;
        }
        let duration = Duration::from_secs(u64::try_from(record.duration_seconds).unwrap_or(0));
        if now < observed_at + duration {
            LeaseStep::Follow {
                holder: record.holder,
            }
        } else {
            LeaseStep::TakeOver
        }
    }

    /// The holder as last read (for forwarding to the leader), if any.
    pub fn holder(&self) -> Option<&str> {
        self.last
            .as_ref()
            .map(|(r, _)| r.holder.as_str())
            .filter(|h| !h.is_empty())
    }
}

/// The wall clock the election writes into the Lease (`acquireTime`, `renewTime`). Only
/// other replicas' change detection reads those times, so a skewed clock is harmless;
/// tests skew it on purpose.
pub trait WallClock: Send + Sync + 'static {
    /// The time to write into the Lease.
    fn now(&self) -> Timestamp;
}

/// The system clock.
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The system clock shifted by a fixed amount (tests of clock skew).
pub struct SkewedClock(pub SignedDuration);

impl WallClock for SkewedClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
            .checked_add(self.0)
            .unwrap_or_else(|_| Timestamp::now())
    }
}

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's `holderIdentity`.
    pub identity: String,
    /// How long a lease holds without renewal.
    pub lease_duration: Duration,
    /// How often the lease is read and renewed.
    pub renew_interval: Duration,
}

/// Runs the election forever, updating `leadership`.
pub async fn run(client: Client, config: ElectionConfig, leadership: std::sync::Arc<Leadership>) {
    run_with_clock(client, config, leadership, SystemClock).await
}

/// [`run`] writing Lease times from `clock`.
pub async fn run_with_clock(
    client: Client,
    config: ElectionConfig,
    leadership: std::sync::Arc<Leadership>,
    clock: impl WallClock,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut observer = LeaseObserver::new();
    let mut term = Term::new(config.lease_duration);
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(
            term.attempt_deadline(),
            try_once(&api, &config, &mut observer, &clock),
        )
        .await
        .unwrap_or_else(|_| Err(kube::Error::Service("the Lease request timed out".into())));
        let attempt = match attempt {
            Ok(true) => Attempt::Won,
            Ok(false) => Attempt::Lost,
            Err(e) => {
                warn!(error = %crate::kube_error::text(&e), "lease update failed; leadership lapses unless renewed in time");
                Attempt::Failed
            }
        };
        let update = term.on(attempt, started);
        if update.transition == Some(Transition::Became) {
            leadership.begin_term();
        }
        match update.hold {
            Hold::Until(until) => leadership.hold_until(Some(until)),
            Hold::End => leadership.hold_until(None),
            Hold::Keep => {}
        }
        match update.transition {
            Some(Transition::Became) => info!(identity = %config.identity, "became the leader"),
            Some(Transition::Lost) => warn!(identity = %config.identity, "lost the lease"),
            None => {}
        }
        leadership.set_holder(observer.holder().map(str::to_owned));
        tokio::time::sleep(config.renew_interval).await;
    }
}

async fn try_once(
    api: &Api<Lease>,
    config: &ElectionConfig,
    observer: &mut LeaseObserver,
    clock: &impl WallClock,
) -> Result<bool, kube::Error> {
    let current = match api.get_opt(&config.name).await? {
        Some(lease) => lease,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    ..Default::default()
                },
                spec: Some(new_spec(config, clock.now(), 0)),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    observer.step(created.spec.as_ref(), &config.identity, Instant::now());
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        }
    };
    let step = observer.step(current.spec.as_ref(), &config.identity, Instant::now());
    let Some(next) = next_spec(&step, current.spec.as_ref(), config, clock.now()) else {
        return Ok(false);
    };
    let updated = Lease {
        metadata: current.metadata.clone(),
        spec: Some(next),
    };
    match api
        .replace(&config.name, &PostParams::default(), &updated)
        .await
    {
        Ok(written) => {
            observer.step(written.spec.as_ref(), &config.identity, Instant::now());
            Ok(true)
        }
        // Another replica wrote first (the update carried our resourceVersion).
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The Lease spec that `step` writes over `current` at wall time `now`; `None` when it
/// writes nothing (following). A renewal moves only `renewTime`; a take-over writes a new
/// record (this identity, our duration, both times now) and counts a transition.
pub fn next_spec(
    step: &LeaseStep,
    current: Option<&LeaseSpec>,
    config: &ElectionConfig,
    now: Timestamp,
) -> Option<LeaseSpec> {
    let spec = current.cloned().unwrap_or_default();
    match step {
        LeaseStep::Follow { .. } => None,
        LeaseStep::Renew => Some(LeaseSpec {
            renew_time: Some(MicroTime(now)),
            ..spec
        }),
        LeaseStep::TakeOver => Some(new_spec(
            config,
            now,
            spec.lease_transitions.unwrap_or(0) + 1,
        )),
    }
}

fn new_spec(config: &ElectionConfig, now: Timestamp, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(config.lease_duration.as_secs() as i32),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn steps() {
        let t0 = Instant::now();
        let mut o = LeaseObserver::new();
        assert_eq!(o.step(None, "a", t0), LeaseStep::TakeOver);
        assert_eq!(o.step(Some(&spec("a", 990, 15)), "a", t0), LeaseStep::Renew);
        assert_eq!(
            o.step(Some(&spec("", 999, 15)), "a", t0),
            LeaseStep::TakeOver
        );
        let mut o = LeaseObserver::new();
        // The written renew time (from b's clock, 10 000 s in the past by ours) is never
        // compared with our clock: b is followed until 15 s after we first saw the record.
        let b = spec("b", 990, 15);
        assert_eq!(
            o.step(Some(&b), "a", t0),
            LeaseStep::Follow { holder: "b".into() }
        );
        assert_eq!(o.holder(), Some("b"));
        assert_eq!(
            o.step(Some(&b), "a", t0 + Duration::from_secs(14)),
            LeaseStep::Follow { holder: "b".into() }
        );
        // A renewal (any change, even a renew time that went backwards) restarts the wait.
        let renewed = spec("b", 985, 15);
        assert_eq!(
            o.step(Some(&renewed), "a", t0 + Duration::from_secs(14)),
            LeaseStep::Follow { holder: "b".into() }
        );
        assert_eq!(
            o.step(Some(&renewed), "a", t0 + Duration::from_secs(28)),
            LeaseStep::Follow { holder: "b".into() }
        );
        assert_eq!(
            o.step(Some(&renewed), "a", t0 + Duration::from_secs(29)),
            LeaseStep::TakeOver
        );
    }

    /// Replicas whose wall clocks are skewed (2 s and 30 s, both directions) renew and
    /// watch one Lease in simulated time, in random interleavings; the leader is killed
    /// midway. At every instant at most one replica believes it leads, and after the kill
    /// another one takes over. The Lease times each replica writes come from its skewed
    /// clock; the old rule (compare them with our clock) gives two leaders here.
    #[test]
    fn skewed_clocks_never_give_two_leaders() {
        use proptest::test_runner::{Config, TestRunner};
        let mut runner = TestRunner::new(Config {
            cases: 64,
            ..Config::default()
        });
        let skews = proptest::sample::subsequence(vec![0i64, 2, -2, 30, -30], 2..=5);
        let steps = proptest::collection::vec((0usize..5, 1u64..400), 200..400);
        runner
            .run(&(skews, steps), |(skews, steps)| {
                simulate(&skews, &steps);
                Ok(())
            })
            .unwrap();
    }

    /// One shared Lease; a replica's turn either reads and decides, or completes the
    /// write it decided on (optimistic concurrency: it fails when the Lease changed since
    /// the read). How long a replica leads is `run`'s own rule, [`Term`], on the shared
    /// monotonic clock.
    fn simulate(skews: &[i64], steps: &[(usize, u64)]) {
        const DURATION: u64 = 15;
        let base = Instant::now();
        let n = skews.len();
        let mut lease: Option<(u64, LeaseSpec)> = None;
        let mut observers = vec![LeaseObserver::new(); n];
        let mut valid_until: Vec<Option<Instant>> = vec![None; n];
        let mut terms = vec![Term::new(Duration::from_secs(DURATION)); n];
        let apply = |valid_until: &mut Option<Instant>, hold: Hold| match hold {
            Hold::Until(t) => *valid_until = Some(t),
            Hold::End => *valid_until = None,
            Hold::Keep => {}
        };
        let mut pending: Vec<Option<(Option<u64>, LeaseSpec, Instant)>> = vec![None; n];
        let mut alive = vec![true; n];
        let mut elapsed_ms = 0u64;
        let kill_at = steps.len() / 2;
        // The random interleaving, then 60 s of every live replica taking turns each
        // second, so that a take-over after the kill is due.
        let tail = (0..60 * n).map(|k| (k % n, 100 / n as u64));
        for (i, (who, advance)) in steps.iter().copied().chain(tail).enumerate() {
            elapsed_ms += advance * 10;
            let now = base + Duration::from_millis(elapsed_ms);
            let leading = |r: usize| valid_until[r].is_some_and(|t| now < t);
            let leaders: Vec<usize> = (0..n).filter(|&r| leading(r)).collect();
            assert!(
                leaders.len() <= 1,
                "two leaders at {elapsed_ms} ms: {leaders:?}, skews {skews:?}"
            );
            if i == kill_at {
                for &r in &leaders {
                    alive[r] = false;
                }
            }
            let r = who % n;
            if !alive[r] {
                continue;
            }
            let me = format!("r{r}");
            let version = lease.as_ref().map(|(v, _)| *v);
            if let Some((read_version, next, started)) = pending[r].take() {
                if version == read_version {
                    lease = Some((version.unwrap_or(0) + 1, next));
                    observers[r].step(lease.as_ref().map(|(_, s)| s), &me, now);
                    apply(&mut valid_until[r], terms[r].on(Attempt::Won, started).hold);
                } else {
                    apply(&mut valid_until[r], terms[r].on(Attempt::Lost, now).hold);
                }
                continue;
            }
            let wall = 1_800_000_000 + (elapsed_ms / 1000) as i64 + skews[r];
            match observers[r].step(lease.as_ref().map(|(_, s)| s), &me, now) {
                LeaseStep::Follow { .. } => {
                    apply(&mut valid_until[r], terms[r].on(Attempt::Lost, now).hold)
                }
                LeaseStep::Renew => {
                    let next = LeaseSpec {
                        renew_time: Some(MicroTime(Timestamp::from_second(wall).unwrap())),
                        ..lease.as_ref().unwrap().1.clone()
                    };
                    pending[r] = Some((version, next, now));
                }
                LeaseStep::TakeOver => {
                    pending[r] = Some((version, spec(&me, wall, DURATION as i32), now));
                }
            }
        }
        let now = base + Duration::from_millis(elapsed_ms);
        assert!(
            (0..n).any(|r| alive[r] && valid_until[r].is_some_and(|t| now < t)),
            "a live replica took over after the kill (skews {skews:?})"
        );
    }

    #[test]
    fn what_each_step_writes() {
        let config = ElectionConfig {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(20),
            renew_interval: Duration::from_secs(2),
        };
        let now = Timestamp::from_second(2_000).unwrap();
        let mut theirs = spec("b", 1_000, 15);
        theirs.lease_transitions = Some(4);
        theirs.acquire_time = Some(MicroTime(Timestamp::from_second(900).unwrap()));
        let follow = LeaseStep::Follow { holder: "b".into() };
        assert_eq!(next_spec(&follow, Some(&theirs), &config, now), None);
        // A renewal moves renewTime only (holder, duration, acquireTime, transitions kept).
        let mut ours = theirs.clone();
        ours.holder_identity = Some("a".into());
        let renewed = next_spec(&LeaseStep::Renew, Some(&ours), &config, now).unwrap();
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(
            LeaseSpec {
                renew_time: ours.renew_time.clone(),
                ..renewed
            },
            ours
        );
        // A take-over: a fresh record under our identity and duration, one more transition.
        let taken = next_spec(&LeaseStep::TakeOver, Some(&theirs), &config, now).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_duration_seconds, Some(20));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.renew_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_transitions, Some(5));
        // A Lease without a spec: the first transition.
        let first = next_spec(&LeaseStep::TakeOver, None, &config, now).unwrap();
        assert_eq!(first.lease_transitions, Some(1));
    }

    #[test]
    fn leadership_lapses() {
        let l = Leadership::elected();
        assert!(!l.is_leader());
        l.hold_until(Some(Instant::now() + Duration::from_secs(5)));
        assert!(l.is_leader());
        l.hold_until(Some(Instant::now() - Duration::from_millis(1)));
        assert!(!l.is_leader());
        assert!(Leadership::always().is_leader());
    }
}
