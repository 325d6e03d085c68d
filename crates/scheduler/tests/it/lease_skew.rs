//! Leader election with skewed wall clocks on the embedded API server (issue 17 item 8):
//! three replicas whose clocks are off by 0, +S and -S seconds (S = 2 and 30) write their
//! own times into one Lease. Sampled every few milliseconds, at most one replica believes
//! it leads; after the leader is killed another one takes over. Comparing the Lease's
//! times with the reader's clock (the old rule) gives two leaders within the first second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::leader::{ElectionConfig, Leadership, SkewedClock, run_with_clock};
use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use tokio::task::JoinHandle;

struct Replica {
    leadership: Arc<Leadership>,
    task: JoinHandle<()>,
}

fn start(client: &Client, lease: &str, identity: &str, skew_seconds: i64) -> Replica {
    let leadership = Arc::new(Leadership::elected());
    let config = ElectionConfig {
        namespace: "kube-system".into(),
        name: lease.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_interval: Duration::from_millis(200),
    };
    let task = tokio::spawn(run_with_clock(
        client.clone(),
        config,
        leadership.clone(),
        SkewedClock(SignedDuration::from_secs(skew_seconds)),
    ));
    Replica { leadership, task }
}

/// Samples the replicas for `period`, failing on two leaders; returns the last leader.
async fn watch_leaders(replicas: &[Replica], period: Duration, what: &str) -> Option<usize> {
    let until = Instant::now() + period;
    let mut last = None;
    while Instant::now() < until {
        let leaders: Vec<usize> = (0..replicas.len())
            .filter(|&i| replicas[i].leadership.is_leader())
            .collect();
        assert!(
            leaders.len() <= 1,
            "{what}: two leaders at once: {leaders:?}"
        );
        if let Some(&l) = leaders.first() {
            last = Some(l);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    last
}

async fn scenario(client: Client, skew: i64) {
    let lease = format!("skew-{skew}");
    let replicas: Vec<Replica> = [0, skew, -skew]
        .iter()
        .enumerate()
        .map(|(i, s)| start(&client, &lease, &format!("replica-{i}"), *s))
        .collect();
    let what = format!("skew {skew} s");
    let leader = watch_leaders(&replicas, Duration::from_secs(3), &what)
        .await
        .unwrap_or_else(|| panic!("{what}: nobody became the leader"));
    // Kill the leader: its renewals stop; its own leadership lapses on its clock.
    replicas[leader].task.abort();
    let deadline = Instant::now() + Duration::from_secs(8);
    let next = loop {
        let now = watch_leaders(&replicas, Duration::from_millis(100), &what).await;
        if let Some(n) = now
            && n != leader
        {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no replica took over after the leader was killed"
        );
    };
    assert!(!replicas[leader].leadership.is_leader());
    let _ = next;
    // Two more seconds of sampling: still never two leaders.
    watch_leaders(&replicas, Duration::from_secs(2), &what).await;
    for r in &replicas {
        r.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_never_give_two_leaders() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    tokio::join!(scenario(client.clone(), 2), scenario(client.clone(), 30));
}

/// A renewal that hangs (the API server answers nothing for 10 s) is abandoned after the
/// leadership it would extend has lapsed, and a new one is made: once the server answers
/// again, a leader is back within a few seconds, not when the hung request returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_renewal_is_abandoned() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let replica = start(&client, "hung", "replica-0", 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !replica.leadership.is_leader() {
        assert!(Instant::now() < deadline, "never led");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    api.faults().set_latency(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(5);
    while replica.leadership.is_leader() {
        assert!(Instant::now() < deadline, "leadership outlived its lease");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Deliberate, the scenario itself: the server stays hung a while past the lapse, so the
    // renewal in flight is one that must be abandoned.
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.faults().set_latency(Duration::ZERO);
    let cleared = Instant::now();
    while !replica.leadership.is_leader() {
        assert!(
            cleared.elapsed() < Duration::from_secs(5),
            "no leader 5 s after the server answered again (a hung renewal was waited for)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    replica.task.abort();
}
