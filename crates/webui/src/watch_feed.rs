//! What one of the UI's watchers does with each item of kube-runtime's watcher stream, as
//! a pure state machine (`watch.rs` drives it and applies the answer to the `World`).
//! kube-runtime decides when to list, watch and back off; this decides what the pages show:
//! - an error becomes the resource's banner, and the pages keep what was last seen;
//! - any event clears the banner;
//! - a (re)list is buffered from `Init` to `InitDone` and replaces the resource's objects
//!   only then, all at once (so a relist never shows a half-listed cluster), and marks the
//!   resource listed;
//! - objects applied or deleted after the list change the pages one by one;
//! - of a run of errors only the first is logged ([`Feed::began_failing`]): kube-runtime
//!   retries for ever, and a watch the server refuses for good (a 403 on resources the UI
//!   may not read) would otherwise log once per retry.

use kube::runtime::watcher::Event;

/// What to do to the world after one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update<K> {
    /// Show this error as the resource's banner; change nothing else.
    Banner(String),
    /// Clear the banner; a list is being buffered, nothing else changes yet.
    Buffering,
    /// Clear the banner; these are now all the resource's objects, and it is listed.
    Reset(Vec<K>),
    /// Clear the banner; add or replace this object.
    Apply(K),
    /// Clear the banner; remove this object.
    Delete(K),
}

/// One watcher's list buffer, and whether it is failing.
#[derive(Debug, Clone)]
pub struct Feed<K> {
    buffer: Vec<K>,
    failing: bool,
    began_failing: bool,
    recovered: bool,
}

impl<K> Default for Feed<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Feed<K> {
    /// Nothing buffered.
    pub fn new() -> Self {
        Feed {
            buffer: Vec::new(),
            failing: false,
            began_failing: false,
            recovered: false,
        }
    }

    /// Whether the last item was an error that followed a success (or came first): the
    /// one error of a run to log.
    pub fn began_failing(&self) -> bool {
        self.began_failing
    }

    /// Whether the last item was a success that ended a run of errors (to log once): an
    /// object or the end of a list (a list's start is no success yet).
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// Takes in the watcher stream's next item (its error as text).
    pub fn on(&mut self, item: Result<Event<K>, String>) -> Update<K> {
        match &item {
            Err(_) => {
                self.began_failing = !self.failing;
                self.recovered = false;
                self.failing = true;
            }
            // kube-runtime says `Init` before each retry's list, refused or not: that
            // ends no run of errors.
            Ok(Event::Init) => {
                self.began_failing = false;
                self.recovered = false;
            }
            Ok(_) => {
                self.began_failing = false;
                self.recovered = self.failing;
                self.failing = false;
            }
        }
        match item {
            Err(e) => Update::Banner(e),
            Ok(Event::Init) => {
                self.buffer.clear();
                Update::Buffering
            }
            Ok(Event::InitApply(obj)) => {
                self.buffer.push(obj);
                Update::Buffering
            }
            Ok(Event::InitDone) => Update::Reset(std::mem::take(&mut self.buffer)),
            Ok(Event::Apply(obj)) => Update::Apply(obj),
            Ok(Event::Delete(obj)) => Update::Delete(obj),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_relist_replaces_all_at_once_and_errors_keep_the_pages() {
        let mut f = Feed::new();
        assert_eq!(f.on(Ok(Event::Init)), Update::Buffering);
        assert_eq!(f.on(Ok(Event::InitApply(1))), Update::Buffering);
        // An error mid-list: a banner, and the buffer is kept for the list's rest.
        assert_eq!(f.on(Err("410".into())), Update::Banner("410".into()));
        assert_eq!(f.on(Ok(Event::InitApply(2))), Update::Buffering);
        assert_eq!(f.on(Ok(Event::InitDone)), Update::Reset(vec![1, 2]));
        assert_eq!(f.on(Ok(Event::Apply(3))), Update::Apply(3));
        assert_eq!(f.on(Ok(Event::Delete(1))), Update::Delete(1));
        // A relist that starts over drops what an earlier, unfinished one buffered.
        f.on(Ok(Event::Init));
        f.on(Ok(Event::InitApply(7)));
        f.on(Ok(Event::Init));
        f.on(Ok(Event::InitApply(8)));
        assert_eq!(f.on(Ok(Event::InitDone)), Update::Reset(vec![8]));
        // An empty list empties the resource.
        f.on(Ok(Event::Init));
        assert_eq!(f.on(Ok(Event::InitDone)), Update::Reset(vec![]));
    }

    #[test]
    fn only_the_first_error_of_a_run_is_logged() {
        let mut f = Feed::<u8>::new();
        f.on(Err("403".into()));
        assert!(f.began_failing() && !f.recovered());
        for _ in 0..5 {
            f.on(Err("403".into()));
            assert!(!f.began_failing() && !f.recovered());
        }
        // A retry's list starting (kube-runtime's `Init`) and refused again: the same run.
        f.on(Ok(Event::Init));
        assert!(!f.began_failing() && !f.recovered());
        f.on(Err("403".into()));
        assert!(!f.began_failing() && !f.recovered());
        f.on(Ok(Event::Init));
        f.on(Ok(Event::InitDone));
        assert!(!f.began_failing() && f.recovered());
        f.on(Ok(Event::Apply(1)));
        assert!(!f.began_failing() && !f.recovered());
        f.on(Err("410".into()));
        assert!(f.began_failing());
    }

    fn item() -> impl Strategy<Value = Result<Event<u8>, String>> {
        prop_oneof![
            Just(Err("e".to_owned())),
            Just(Ok(Event::Init)),
            any::<u8>().prop_map(|o| Ok(Event::InitApply(o))),
            Just(Ok(Event::InitDone)),
            any::<u8>().prop_map(|o| Ok(Event::Apply(o))),
            any::<u8>().prop_map(|o| Ok(Event::Delete(o))),
        ]
    }

    proptest! {
        /// A reset holds exactly the objects listed since the last `Init` (errors in
        /// between lose none), and only an error shows a banner.
        #[test]
        fn reset_is_the_last_list(items in proptest::collection::vec(item(), 1..80)) {
            let mut f = Feed::new();
            let mut since_init: Vec<u8> = Vec::new();
            // Runs of errors in the items (an `Init` between two errors ends none), and
            // the errors the feed says to log.
            let mut runs = 0;
            let mut failing = false;
            for i in &items {
                match i {
                    Err(_) => {
                        runs += usize::from(!failing);
                        failing = true;
                    }
                    Ok(Event::Init) => {}
                    Ok(_) => failing = false,
                }
            }
            let mut logged = 0;
            for i in items {
                let expect_reset = match &i {
                    Ok(Event::Init) => { since_init.clear(); None }
                    Ok(Event::InitApply(o)) => { since_init.push(*o); None }
                    Ok(Event::InitDone) => Some(std::mem::take(&mut since_init)),
                    _ => None,
                };
                let is_err = i.is_err();
                let update = f.on(i);
                prop_assert_eq!(matches!(update, Update::Banner(_)), is_err);
                logged += usize::from(f.began_failing());
                if let Some(objects) = expect_reset {
                    prop_assert_eq!(update, Update::Reset(objects));
                }
            }
            prop_assert_eq!(logged, runs);
        }
    }
}
