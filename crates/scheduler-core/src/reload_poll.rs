//! When the TLS listeners reload their certificate files (pure: the shell in `http.rs`
//! reads the files' modification times every few seconds and passes them in).
//!
//! Rule: reload when any file's stamp (its modification time; `None` when it cannot be
//! read) differs from the stamps last acted on, and act on each change once: a reload that
//! fails (say, a certificate written before its key) is not retried until the files change
//! again, when the next write lands, so a broken pair is not reloaded in a loop every poll.

/// The stamps last acted on.
#[derive(Debug, Clone)]
pub struct ReloadPoll<S> {
    last: S,
}

impl<S: PartialEq> ReloadPoll<S> {
    /// Starts from the stamps of the files as first loaded.
    pub fn new(loaded: S) -> Self {
        ReloadPoll { last: loaded }
    }

    /// The files' stamps now: whether to reload (then these are the stamps acted on).
    pub fn poll(&mut self, now: S) -> bool {
        if now == self.last {
            return false;
        }
        self.last = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_once_per_change() {
        let mut p = ReloadPoll::new(vec![Some(1), Some(1)]);
        assert!(!p.poll(vec![Some(1), Some(1)]));
        // The certificate rewritten: reload once, whatever came of it.
        assert!(p.poll(vec![Some(2), Some(1)]));
        assert!(!p.poll(vec![Some(2), Some(1)]));
        // Then its key: reload again.
        assert!(p.poll(vec![Some(2), Some(3)]));
        // A file gone (unreadable) is a change too, and so is its return.
        assert!(p.poll(vec![None, Some(3)]));
        assert!(p.poll(vec![Some(4), Some(3)]));
        // A stamp that went back (a file restored from a copy) is a change.
        assert!(p.poll(vec![Some(1), Some(3)]));
    }
}
