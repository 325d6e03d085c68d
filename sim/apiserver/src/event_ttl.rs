//! The bound on stored Events. kube-apiserver writes every Event with a one-hour etcd lease
//! (`--event-ttl=1h`), so Events vanish an hour after their last write however many pods
//! come and go; this server keeps the same age bound and, since it holds everything in
//! memory, a count bound too (the oldest Events go first). Which Events to drop is decided
//! here; the store deletes them with DELETED watch events, as a lease expiry shows them.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3600);

/// Events (core `v1` and `events.k8s.io/v1` together; a mirrored Event counts twice) kept
/// at most; a few MiB of JSON.
pub const DEFAULT_MAX_EVENTS: usize = 2000;

/// (resource index, (namespace, name)).
pub type EventKey = (usize, (String, String));

/// The last write time of every stored Event, oldest first.
#[derive(Debug)]
pub struct EventExpiry {
    /// How long after its last write an Event is dropped.
    pub ttl: Duration,
    /// Events kept at most; beyond it the oldest go first.
    pub max: usize,
    last_write: BTreeMap<EventKey, Instant>,
    /// Writes in time order; an entry whose time is not the key's `last_write` is stale
    /// (the Event was written again or deleted since) and is skipped.
    order: VecDeque<(Instant, EventKey)>,
}

impl Default for EventExpiry {
    fn default() -> Self {
        EventExpiry {
            ttl: DEFAULT_EVENT_TTL,
            max: DEFAULT_MAX_EVENTS,
            last_write: BTreeMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl EventExpiry {
    /// An Event was created or updated: its TTL starts again (as the lease is renewed).
    pub fn written(&mut self, key: EventKey, now: Instant) {
        self.last_write.insert(key.clone(), now);
        self.order.push_back((now, key));
    }

    /// An Event was deleted.
    pub fn deleted(&mut self, key: &EventKey) {
        self.last_write.remove(key);
        // Stale entries go as they reach the front; keep the queue from outgrowing the map
        // when Events are rewritten often.
        if self.order.len() > 2 * self.last_write.len() + 64 {
            let live = &self.last_write;
            self.order.retain(|(t, k)| live.get(k) == Some(t));
        }
    }

    /// The next Event to delete: the oldest, when it is past the TTL or there are more
    /// than `max`. It is forgotten here; the caller deletes it.
    pub fn next_expired(&mut self, now: Instant) -> Option<EventKey> {
        while let Some((t, key)) = self.order.front() {
            if self.last_write.get(key) != Some(t) {
                self.order.pop_front();
                continue;
            }
            if now.duration_since(*t) <= self.ttl && self.last_write.len() <= self.max {
                return None;
            }
            let (_, key) = self.order.pop_front()?;
            self.last_write.remove(&key);
            return Some(key);
        }
        None
    }

    /// Events tracked (every stored Event).
    pub fn len(&self) -> usize {
        self.last_write.len()
    }

    /// No Event is tracked.
    pub fn is_empty(&self) -> bool {
        self.last_write.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> EventKey {
        (0, ("default".into(), n.into()))
    }

    #[test]
    fn count_bound_drops_the_oldest_and_rewrites_renew() {
        let mut e = EventExpiry {
            max: 2,
            ..EventExpiry::default()
        };
        let t = Instant::now();
        e.written(key("a"), t);
        e.written(key("b"), t);
        e.written(key("a"), t + Duration::from_millis(1));
        e.written(key("c"), t + Duration::from_millis(2));
        let now = t + Duration::from_millis(3);
        assert_eq!(
            e.next_expired(now),
            Some(key("b")),
            "a was rewritten after b"
        );
        assert_eq!(e.next_expired(now), None);
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn age_bound() {
        let mut e = EventExpiry {
            ttl: Duration::from_secs(10),
            ..EventExpiry::default()
        };
        let t = Instant::now();
        e.written(key("a"), t);
        e.written(key("b"), t + Duration::from_secs(5));
        e.deleted(&key("b"));
        e.written(key("c"), t + Duration::from_secs(6));
        assert_eq!(e.next_expired(t + Duration::from_secs(10)), None);
        assert_eq!(e.next_expired(t + Duration::from_secs(11)), Some(key("a")));
        assert_eq!(e.next_expired(t + Duration::from_secs(16)), None);
        assert_eq!(e.next_expired(t + Duration::from_secs(17)), Some(key("c")));
        assert!(e.is_empty());
    }
}
