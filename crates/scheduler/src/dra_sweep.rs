//! Which of the webhook's ResourceClaimTemplates to delete (DRA mode): a managed template
//! that no pod of its namespace references, continuously for longer than the grace
//! period, and that this replica's webhook did not hand out within it. The claims made
//! from a template are owned by their pods and go with them (garbage collector); only the
//! shared, content-addressed templates need this. Pure: the shell lists and deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// `(namespace, name)` of a template.
pub type TemplateKey = (String, String);

/// How often the sweeper looks and how long a template may stay unreferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepTuning {
    /// Between two looks (list templates and pods).
    pub interval: Duration,
    /// Unreferenced for longer than this: deleted.
    pub grace: Duration,
}

impl Default for SweepTuning {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(600),
        }
    }
}

/// Since when each managed template has been seen unreferenced.
#[derive(Debug, Clone, Default)]
pub struct SweepBook {
    unreferenced_since: BTreeMap<TemplateKey, Instant>,
}

impl SweepBook {
    /// One look: `templates` (the managed ones that exist), `referenced` (those some pod
    /// names), `handed_out` (those the webhook ensured, with when). Returns the templates to
    /// delete now; forgets those that are gone or referenced again.
    pub fn look(
        &mut self,
        templates: &BTreeSet<TemplateKey>,
        referenced: &BTreeSet<TemplateKey>,
        handed_out: &BTreeMap<TemplateKey, Instant>,
        grace: Duration,
        now: Instant,
    ) -> Vec<TemplateKey> {
        self.unreferenced_since
            .retain(|k, _| templates.contains(k) && !referenced.contains(k));
        let mut delete = Vec::new();
        for key in templates.difference(referenced) {
            // A template just handed out is about to be referenced by the pod being created.
            let since = handed_out
                .get(key)
                .copied()
                .into_iter()
                .chain(self.unreferenced_since.get(key).copied())
                .max()
                .unwrap_or(now);
            self.unreferenced_since.insert(key.clone(), since);
            if now.saturating_duration_since(since) > grace {
                delete.push(key.clone());
            }
        }
        delete
    }

    /// A deleted template is forgotten.
    pub fn deleted(&mut self, key: &TemplateKey) {
        self.unreferenced_since.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> TemplateKey {
        ("ns".into(), name.into())
    }

    #[test]
    fn only_templates_unreferenced_past_the_grace_go() {
        let grace = Duration::from_secs(600);
        let t0 = Instant::now();
        let mut book = SweepBook::default();
        let all: BTreeSet<_> = [key("a"), key("b"), key("c")].into();
        let used: BTreeSet<_> = [key("a")].into();
        let none = BTreeMap::new();
        assert!(book.look(&all, &used, &none, grace, t0).is_empty());
        let at = |s| t0 + Duration::from_secs(s);
        assert!(book.look(&all, &used, &none, grace, at(600)).is_empty());
        // b was handed out at 300 s: its clock starts there.
        let handed: BTreeMap<_, _> = [(key("b"), at(300))].into();
        assert_eq!(book.look(&all, &used, &handed, grace, at(601)), [key("c")]);
        book.deleted(&key("c"));
        let left: BTreeSet<_> = [key("a"), key("b")].into();
        assert_eq!(book.look(&left, &used, &handed, grace, at(901)), [key("b")]);
        // Referenced again: the clock starts over when it is unreferenced next.
        let both: BTreeSet<_> = [key("a"), key("b")].into();
        assert!(book.look(&left, &both, &handed, grace, at(902)).is_empty());
        assert!(book.look(&left, &used, &none, grace, at(1000)).is_empty());
        assert_eq!(book.look(&left, &used, &none, grace, at(1601)), [key("b")]);
    }
}
