//! Running What-if plans on the shared server: at most `max_running` at once (more are
//! answered 429 at once, not queued), each on a blocking thread under a stop condition it
//! checks before every pod: its deadline, its request gone (the client left: the request's
//! future is dropped, and with it a guard that raises the request's flag), or the UI
//! stopping (SIGTERM must not wait for a plan). Scenario plans, the live cluster's
//! What-if and defrag plans all run here ([`Runner::run`]). The slot is held by the planning thread
//! itself, so a stopped request frees it only once its thread has stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use hami_planner::report::PlanReport;
use tokio::sync::Semaphore;

use crate::whatif::{self, Limits, Problem};

/// The UI's What-if planner: its limits, its slots and its stop switch.
#[derive(Debug)]
pub struct Runner {
    limits: Limits,
    slots: Arc<Semaphore>,
    stopping: Arc<AtomicBool>,
}

/// Raises the flag when dropped: the request's future is gone.
struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Why a plan stopped short.
enum Stopped {
    Deadline,
    Gone,
    Stopping,
}

impl Runner {
    /// A runner with `limits`.
    pub fn new(limits: Limits) -> Runner {
        Runner {
            slots: Arc::new(Semaphore::new(limits.max_running.max(1))),
            limits,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The limits it plans under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Stops every plan running (at its next pod) and refuses new ones: the UI is stopping.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Admits and plans the scenario `text` (see [`whatif::admit`]); a refusal says what to
    /// change. Dropping the returned future stops the plan.
    pub async fn plan(&self, text: String) -> Result<PlanReport, Problem> {
        self.run(move |stop, limits| {
            let admitted = whatif::admit(&text, limits)?;
            let f = admitted.figures;
            tracing::info!(
                "what-if: planning {} pods on {} nodes with {} GPUs under {} policy pairs",
                f.pods,
                f.nodes,
                f.gpus,
                f.policy_pairs
            );
            Ok(match whatif::plan(&admitted, stop)? {
                Some(report) => Ran::Done(report),
                None => Ran::Stopped(format!(
                    "planning stopped after {} s, the UI's limit for one scenario ({} pods × {} policy pairs × {} nodes and GPUs): compare fewer policies, or lower the pods' or nodes' count, or run it with `hami plan --scenario FILE`",
                    limits.deadline.as_secs(),
                    f.pods,
                    f.policy_pairs,
                    f.nodes + f.gpus
                )),
            })
        })
        .await
    }

    /// Runs `job` on a blocking thread, in one of the planner's slots (429 at once when none
    /// is free), with its stop condition: the deadline, the request gone (dropping the
    /// returned future), or the UI stopping. `job` asks `stop` between steps; when it stops
    /// short it says, for the deadline's refusal, what to change. Every plan of the UI (a
    /// scenario, the live cluster edited, a defrag plan) goes through here.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&(dyn Fn() -> bool + Sync), &Limits) -> Result<Ran<T>, Problem>
        + Send
        + 'static,
    ) -> Result<T, Problem> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(stopping());
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return Err(Problem {
                status: 429,
                message: format!(
                    "the UI is planning {} requests already (its limit); retry in a few seconds, or plan from the command line (`hami plan --scenario FILE`, `hami defrag plan`)",
                    self.limits.max_running.max(1)
                ),
            });
        };
        let gone = Arc::new(AtomicBool::new(false));
        let _raise = RaiseOnDrop(gone.clone());
        let ui_stopping = self.stopping.clone();
        let limits = self.limits.clone();
        let deadline = Instant::now() + limits.deadline;
        let run = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let why = || {
                if gone.load(Ordering::SeqCst) {
                    Some(Stopped::Gone)
                } else if ui_stopping.load(Ordering::SeqCst) {
                    Some(Stopped::Stopping)
                } else if Instant::now() >= deadline {
                    Some(Stopped::Deadline)
                } else {
                    None
                }
            };
            match job(&|| why().is_some(), &limits)? {
                Ran::Done(value) => Ok(value),
                Ran::Stopped(deadline_problem) => Err(match why() {
                    Some(Stopped::Stopping) => stopping(),
                    Some(Stopped::Gone) => Problem {
                        status: 499,
                        message: "the client went away".into(),
                    },
                    _ => Problem::too_large(deadline_problem),
                }),
            }
        });
        run.await.unwrap_or_else(|e| {
            Err(Problem {
                status: 500,
                message: format!("the planner failed: {e}"),
            })
        })
    }
}

/// How a job of [`Runner::run`] ended.
pub enum Ran<T> {
    /// It finished.
    Done(T),
    /// It stopped when asked; the text says, should the deadline be why, what to change.
    Stopped(String),
}

fn stopping() -> Problem {
    Problem {
        status: 503,
        message: "the UI is stopping; open it again once it is back".into(),
    }
}
