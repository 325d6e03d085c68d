//! What one of the UI's watchers does with each item of kube-runtime's watcher stream, as
//! a pure state machine (`watch.rs` drives it and applies the answer to the `World`).
//! kube-runtime decides when to list, watch and back off; this decides what the pages show:
//! - an error becomes the resource's banner, and the pages keep what was last seen;
//! - any event clears the banner;
//! - a (re)list is buffered from `Init` to `InitDone` and replaces the resource's objects
//!   only then, all at once (so a relist never shows a half-listed cluster), and marks the
//!   resource listed;
//! - objects applied or deleted after the list change the pages one by one.

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

/// One watcher's list buffer.
#[derive(Debug, Clone)]
pub struct Feed<K> {
    buffer: Vec<K>,
}

impl<K> Default for Feed<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Feed<K> {
    /// Nothing buffered.
    pub fn new() -> Self {
        Feed { buffer: Vec::new() }
    }

    /// Takes in the watcher stream's next item (its error as text).
    pub fn on(&mut self, item: Result<Event<K>, String>) -> Update<K> {
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
                if let Some(objects) = expect_reset {
                    prop_assert_eq!(update, Update::Reset(objects));
                }
            }
        }
    }
}
