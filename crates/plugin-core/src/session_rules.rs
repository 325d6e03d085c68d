//! When a kubelet session registers, starts over or stops (pure). The loop in
//! [`crate::kubelet_session::run_sessions`] binds our socket, then every poll hands
//! [`Session::poll`] what it saw (the shutdown flag and the identities of `kubelet.sock`
//! and our socket) and does what it answers.
//!
//! The rules: register once `kubelet.sock` exists (kubelet may not be up yet; a failed
//! registration is tried again at the next poll); once registered, start over (new socket,
//! new registration) when `kubelet.sock` is not the file we registered through (kubelet
//! restarted: it re-creates the socket and wipes the directory) or our socket is not the
//! one we bound (removed); on shutdown stop, removing our socket only once registered.
//! Between looks the loop sleeps until the directory changes ([`wake`]; the notification
//! is `crate::dir_watch`), except to retry a failed registration.

/// A socket file's identity (inode, change time seconds and nanoseconds); `None` when the
/// file is absent. A re-created file has another.
pub type SocketId = Option<(u64, i64, i64)>;

/// What the loop saw at one poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The shutdown signal has turned true.
    pub shutdown: bool,
    /// `kubelet.sock` now.
    pub kubelet: SocketId,
    /// Our socket now.
    pub ours: SocketId,
}

/// Why a session ends and a new one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// `kubelet.sock` is another file than the one we registered through (or gone).
    KubeletRestarted,
    /// Our socket is another file than the one we bound (or gone).
    OurSocketGone,
}

/// What the loop does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Register with kubelet; report the result with [`Session::registered`].
    Register,
    /// Nothing: wait for the next poll.
    Wait,
    /// End this session (stop its server) and start a new one.
    Restart(Restart),
    /// End this session and return.
    Stop {
        /// Whether to remove our socket file.
        remove_socket: bool,
    },
}

/// One kubelet session, from our socket's bind to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    ours: SocketId,
    /// `kubelet.sock` as seen before the registration that succeeded.
    registered: Option<SocketId>,
}

impl Session {
    /// A session whose socket, just bound, is `ours`.
    pub fn new(ours: SocketId) -> Self {
        Session {
            ours,
            registered: None,
        }
    }

    /// Whether a registration succeeded.
    pub fn is_registered(&self) -> bool {
        self.registered.is_some()
    }

    /// The decision at one poll.
    pub fn poll(&self, seen: Seen) -> Action {
        let Some(kubelet) = self.registered else {
            if seen.shutdown {
                return Action::Stop {
                    remove_socket: false,
                };
            }
            return if seen.kubelet.is_some() {
                Action::Register
            } else {
                Action::Wait
            };
        };
        if seen.shutdown {
            Action::Stop {
                remove_socket: true,
            }
        } else if seen.kubelet != kubelet {
            Action::Restart(Restart::KubeletRestarted)
        } else if seen.ours != self.ours {
            Action::Restart(Restart::OurSocketGone)
        } else {
            Action::Wait
        }
    }

    /// The registration asked for after `seen` succeeded.
    pub fn registered(&mut self, seen: Seen) {
        self.registered = Some(seen.kubelet);
    }
}

/// How the loop waits before its next look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Until the directory changes (kubelet re-creating its socket, ours removed), or a
    /// long backstop passes.
    OnChange,
    /// For the poll interval.
    AfterPoll,
}

/// The wait after `action`: without a notification of the directory's changes the loop
/// polls; a registration that failed is tried again after the poll interval (kubelet
/// refusing, or not answering yet, changes nothing in the directory); otherwise the loop
/// sleeps until the directory changes.
pub fn wake(action: Action, registered: bool, notified: bool) -> Wake {
    if !notified || (action == Action::Register && !registered) {
        Wake::AfterPoll
    } else {
        Wake::OnChange
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OURS: SocketId = Some((10, 1, 0));
    const KUBELET: SocketId = Some((20, 1, 0));

    fn seen(kubelet: SocketId, ours: SocketId) -> Seen {
        Seen {
            shutdown: false,
            kubelet,
            ours,
        }
    }

    #[test]
    fn the_loop_sleeps_until_the_directory_changes_except_to_retry_a_registration() {
        assert_eq!(wake(Action::Wait, false, true), Wake::OnChange);
        assert_eq!(wake(Action::Register, true, true), Wake::OnChange);
        assert_eq!(wake(Action::Register, false, true), Wake::AfterPoll);
        assert_eq!(wake(Action::Wait, true, false), Wake::AfterPoll);
    }

    #[test]
    fn registers_once_kubelet_is_up_and_retries_a_failure() {
        let mut s = Session::new(OURS);
        assert_eq!(s.poll(seen(None, OURS)), Action::Wait);
        assert_eq!(s.poll(seen(KUBELET, OURS)), Action::Register);
        // The registration failed: the next poll asks again.
        assert_eq!(s.poll(seen(KUBELET, OURS)), Action::Register);
        s.registered(seen(KUBELET, OURS));
        assert!(s.is_registered());
        assert_eq!(s.poll(seen(KUBELET, OURS)), Action::Wait);
    }

    #[test]
    fn a_new_kubelet_socket_or_a_lost_own_socket_starts_over() {
        let mut s = Session::new(OURS);
        s.registered(seen(KUBELET, OURS));
        let recreated = Some((21, 2, 0));
        assert_eq!(
            s.poll(seen(recreated, OURS)),
            Action::Restart(Restart::KubeletRestarted)
        );
        assert_eq!(
            s.poll(seen(None, OURS)),
            Action::Restart(Restart::KubeletRestarted)
        );
        assert_eq!(
            s.poll(seen(KUBELET, None)),
            Action::Restart(Restart::OurSocketGone)
        );
        // Same inode, new change time: re-created too.
        assert_eq!(
            s.poll(seen(KUBELET, Some((10, 1, 5)))),
            Action::Restart(Restart::OurSocketGone)
        );
        // Both changed (kubelet wiped the directory): one restart, kubelet's reason.
        assert_eq!(
            s.poll(seen(recreated, None)),
            Action::Restart(Restart::KubeletRestarted)
        );
    }

    #[test]
    fn shutdown_removes_the_socket_only_once_registered() {
        let mut s = Session::new(OURS);
        let down = Seen {
            shutdown: true,
            kubelet: KUBELET,
            ours: OURS,
        };
        assert_eq!(
            s.poll(down),
            Action::Stop {
                remove_socket: false
            }
        );
        s.registered(seen(KUBELET, OURS));
        assert_eq!(
            s.poll(down),
            Action::Stop {
                remove_socket: true
            }
        );
        // Shutdown wins over a restart seen at the same poll.
        assert_eq!(
            s.poll(Seen {
                shutdown: true,
                kubelet: None,
                ours: None
            }),
            Action::Stop {
                remove_socket: true
            }
        );
    }

    fn id() -> impl Strategy<Value = SocketId> {
        proptest::option::of((0u64..3, 0i64..2, 0i64..2))
    }

    proptest! {
        /// A registered session keeps serving exactly while both sockets are the ones it
        /// registered with, and never registers again within itself.
        #[test]
        fn serves_exactly_while_both_sockets_are_unchanged(
            ours in id(), kubelet in id(), polls in proptest::collection::vec((any::<bool>(), id(), id()), 1..20)
        ) {
            let mut s = Session::new(ours);
            s.registered(seen(kubelet, ours));
            for (shutdown, k, o) in polls {
                let action = s.poll(Seen { shutdown, kubelet: k, ours: o });
                prop_assert_ne!(action, Action::Register);
                let unchanged = k == kubelet && o == ours;
                prop_assert_eq!(action == Action::Wait, !shutdown && unchanged);
            }
        }

        /// Before registering, nothing restarts: the session waits for kubelet.
        #[test]
        fn unregistered_never_restarts(ours in id(), k in id(), o in id(), shutdown in any::<bool>()) {
            let action = Session::new(ours).poll(Seen { shutdown, kubelet: k, ours: o });
            prop_assert!(!matches!(action, Action::Restart(_)));
            prop_assert_eq!(action == Action::Register, !shutdown && k.is_some());
        }
    }
}
