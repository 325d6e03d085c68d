//! The chaos package's tests, one binary: the bounded chaos run (`chaos`) and the soak
//! (`soak`), each over the whole stack in this process. They take `ONE_STACK` in turn: the
//! soak measures this process's threads, fds and RSS, and two stacks at once would also
//! halve each one's share of a small machine.

mod chaos;
mod soak;

/// Held by each test for its whole run: one stack at a time in this process.
static ONE_STACK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
