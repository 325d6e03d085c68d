//! A TCP forwarder standing in for the scheduler's Service in front of the replicas: each
//! new connection goes to the leader when one is known, else to any live replica. TLS
//! passes through untouched (the replicas terminate it).
//!
//! A killed replica's connections are cut, as the kernel closes a dead process's sockets;
//! a connection to a replica that no longer leads is cut too once another one leads, so a
//! kept-alive connection cannot pin kube-scheduler to a follower. (Followers forwarding to
//! the leader is tested in the scheduler crate, `crates/scheduler/tests/it/ha_forwarding.rs`.)

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hami_scheduler::leader::Leadership;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

struct Backend {
    identity: String,
    addr: SocketAddr,
    leadership: Arc<Leadership>,
    /// Generation: bumped when this identity is removed or replaced.
    generation: u64,
}

/// The scheduler replicas the forwarder may route to, updated by the stack as replicas
/// die and restart.
#[derive(Clone, Default)]
pub struct Backends(Arc<Mutex<(Vec<Backend>, u64)>>);

impl Backends {
    /// Registers replica `identity` at `addr` with its leadership view, replacing any earlier
    /// entry, or removes it with `None`.
    pub fn set(&self, identity: &str, addr: Option<(SocketAddr, Arc<Leadership>)>) {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (list, next) = &mut *guard;
        list.retain(|b| b.identity != identity);
        if let Some((addr, leadership)) = addr {
            *next += 1;
            list.push(Backend {
                identity: identity.to_string(),
                addr,
                leadership,
                generation: *next,
            });
        }
    }

    fn pick(&self) -> Option<(SocketAddr, u64)> {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let list = &guard.0;
        list.iter()
            .find(|b| b.leadership.is_leader())
            .or_else(|| list.first())
            .map(|b| (b.addr, b.generation))
    }

    /// Whether a connection to backend `generation` may stay open.
    fn keep(&self, generation: u64) -> bool {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let list = &guard.0;
        let Some(me) = list.iter().find(|b| b.generation == generation) else {
            return false;
        };
        me.leadership.is_leader() || !list.iter().any(|b| b.leadership.is_leader())
    }
}

/// Serves `listener` until the task is aborted.
pub fn spawn(listener: TcpListener, backends: Backends) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let backends = backends.clone();
            tokio::spawn(async move {
                // No backend, or a dead one: the caller sees the connection close, as with
                // a Service without ready endpoints.
                let Some((addr, generation)) = backends.pick() else {
                    return;
                };
                let Ok(mut outbound) = TcpStream::connect(addr).await else {
                    return;
                };
                let watchdog = async {
                    while backends.keep(generation) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = watchdog => {}
                }
            });
        }
    })
}
