//! The last error of a kube-runtime watcher the shell keeps beside a reflector (the PDB
//! reflector of the preempt verb, the DRA templates' ResourceSlice reflector): an answer that
//! needs the reflector names it, and the log says each distinct error once, not on every
//! backoff retry.

use std::fmt::Display;
use std::sync::Mutex;

use tracing::warn;

/// Records one watcher event of the `what` watch in `last`: a success clears the error, a
/// failure is kept and logged when it differs from the one before.
pub(crate) fn note<T, E: Display>(last: &Mutex<Option<String>>, what: &str, event: &Result<T, E>) {
    let mut last = last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match event {
        Ok(_) => *last = None,
        Err(e) => {
            let text = e.to_string();
            if last.as_deref() != Some(text.as_str()) {
                warn!(error = %text, "the {what} watch failed; retrying");
            }
            *last = Some(text);
        }
    }
}
