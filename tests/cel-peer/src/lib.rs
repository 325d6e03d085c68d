//! Tests-only: the launcher of the cel-python peers, the real CEL implementation (PyPI
//! `cel-python`, module `celpy`) that the CEL evaluators are checked against
//! (`sim/structured-allocation/tests/it/selector_cel_peer.rs`,
//! `sim/apiserver/tests/it/cel_peer.rs`, `crates/manifests/tests/it/webhook_match_conditions.rs`). Each test keeps its own peer
//! script, since what is evaluated differs; this starts it under `$HAMI_PYTHON` (default
//! `python3`), writes the request as JSON on its stdin and parses its stdout as JSON.
//!
//! The scripts' contract: exit 0 with the answer, exit 3 when `celpy` cannot be imported
//! (reported with what to install), anything else is the script's failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The exit status by which a peer script says `celpy` cannot be imported.
pub const MISSING_PEER: i32 = 3;

/// Why a peer gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The interpreter could not be started.
    #[error("cannot run {python}: {source}")]
    Spawn {
        /// The interpreter tried (`$HAMI_PYTHON` or `python3`).
        python: String,
        /// What starting it returned.
        source: std::io::Error,
    },
    /// The script exited [`MISSING_PEER`]: cel-python is not installed for that interpreter.
    #[error("a real peer is missing: {stderr} (`pip install cel-python`, as scripts/test.sh does)")]
    Missing {
        /// The script's stderr (it names the import that failed).
        stderr: String,
    },
    /// The script failed otherwise.
    #[error("{script} failed ({status}): {stderr}")]
    Failed {
        /// The script's file name.
        script: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr.
        stderr: String,
    },
    /// The script exited 0 but the request could not be written to it.
    #[error("{script} did not read its request: {source}")]
    Request {
        /// The script's file name.
        script: String,
        /// The write's error.
        source: std::io::Error,
    },
    /// The script exited 0 with an answer that is not the JSON expected.
    #[error("{script} answered no JSON of the expected shape: {source}")]
    Answer {
        /// The script's file name.
        script: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// The interpreter the peers run under: `$HAMI_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("HAMI_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `script` (a path below the calling crate, e.g. `tests/peers/cel_peer.py`) as an absolute
/// path: `manifest_dir` is the caller's `env!("CARGO_MANIFEST_DIR")`.
pub fn script(manifest_dir: &str, relative: &str) -> PathBuf {
    Path::new(manifest_dir).join(relative)
}

/// Runs `script` under `python` with `request` on its stdin and parses its stdout.
pub fn try_run<T: DeserializeOwned>(
    python: &str,
    script: &Path,
    request: &Value,
) -> Result<T, PeerError> {
    let name = script.file_name().map_or_else(
        || script.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| PeerError::Spawn {
            python: python.into(),
            source,
        })?;
    // A script that exits before reading (celpy missing) closes the pipe: its exit status
    // says why, so a failed write is reported only if the script claims success.
    let written = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(request.to_string().as_bytes());
    let out = child
        .wait_with_output()
        .map_err(|source| PeerError::Spawn {
            python: python.into(),
            source,
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => {}
        Some(MISSING_PEER) => return Err(PeerError::Missing { stderr }),
        _ => {
            return Err(PeerError::Failed {
                script: name,
                status: out.status,
                stderr,
            });
        }
    }
    written.map_err(|source| PeerError::Request {
        script: name.clone(),
        source,
    })?;
    serde_json::from_slice(&out.stdout).map_err(|source| PeerError::Answer {
        script: name,
        source,
    })
}

/// [`try_run`] under [`python`].
///
/// # Panics
/// With the [`PeerError`]'s message when the peer gives no answer (a missing cel-python
/// says `pip install cel-python`).
pub fn run<T: DeserializeOwned>(script: &Path, request: &Value) -> T {
    try_run(&python(), script, request).unwrap_or_else(|e| panic!("{e}"))
}
