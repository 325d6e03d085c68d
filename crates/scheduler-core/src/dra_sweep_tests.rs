//! The sweeper's decision, and every interleaving of webhooks handing a template out with
//! sweepers deleting it, on a model of the API server (creates, 409s, resourceVersion
//! preconditions on the stamp and on the delete).

use super::*;

fn key(name: &str) -> TemplateKey {
    ("ns".into(), name.into())
}

fn listed(version: &str, last_used: Option<i64>) -> Listed {
    Listed {
        resource_version: version.into(),
        last_used,
    }
}

#[test]
fn only_templates_unreferenced_and_unchanged_past_the_grace_go() {
    let grace = Duration::from_secs(600);
    let t0 = Instant::now();
    let at = |s| t0 + Duration::from_secs(s);
    let unix = |s: u64| 1_000_000 + s as i64;
    let mut book = SweepBook::default();
    let mut all: BTreeMap<_, _> = [
        (key("a"), listed("1", None)),
        (key("b"), listed("1", None)),
        (key("c"), listed("1", None)),
    ]
    .into();
    let used: BTreeSet<_> = [key("a")].into();
    assert!(book.look(&all, &used, grace, t0, unix(0)).is_empty());
    assert!(book.look(&all, &used, grace, at(600), unix(600)).is_empty());
    // b was stamped at 300 s (a webhook reused it): its clock starts again.
    all.insert(key("b"), listed("2", Some(unix(300))));
    assert_eq!(
        book.look(&all, &used, grace, at(601), unix(601)),
        [key("c")]
    );
    book.deleted(&key("c"));
    all.remove(&key("c"));
    assert!(book.look(&all, &used, grace, at(900), unix(900)).is_empty());
    // 601 s after this replica saw the stamp, 1201 s after it was written.
    assert_eq!(
        book.look(&all, &used, grace, at(1202), unix(1501)),
        [key("b")]
    );
    // Referenced again: the clock starts over when it is unreferenced next.
    let both: BTreeSet<_> = [key("a"), key("b")].into();
    assert!(
        book.look(&all, &both, grace, at(1203), unix(1502))
            .is_empty()
    );
    assert!(
        book.look(&all, &used, grace, at(1300), unix(1600))
            .is_empty()
    );
    assert_eq!(
        book.look(&all, &used, grace, at(1901), unix(2201)),
        [key("b")]
    );
}

#[test]
fn a_stamp_within_the_grace_spares_a_template_this_replica_saw_long_unchanged() {
    let grace = Duration::from_secs(600);
    let t0 = Instant::now();
    let late = t0 + Duration::from_secs(700);
    let mut book = SweepBook::default();
    // A stamp written by a replica whose clock runs ahead of this one's, and an old one.
    let ahead: BTreeMap<_, _> = [(key("a"), listed("7", Some(5_000)))].into();
    let none = BTreeSet::new();
    assert!(book.look(&ahead, &none, grace, t0, 4_000).is_empty());
    assert!(book.look(&ahead, &none, grace, late, 4_700).is_empty());
    assert_eq!(book.look(&ahead, &none, grace, late, 5_601), [key("a")]);
    // An unreadable stamp counts as none.
    assert_eq!(parse_last_used("yesterday"), None);
    let t = 1_790_000_000;
    assert_eq!(parse_last_used(&format_last_used(t)), Some(t));
}

#[test]
fn ensure_steps() {
    let mut e = Ensure::default();
    let stamp = EnsureCall::Stamp {
        resource_version: "5".into(),
    };
    assert_eq!(Ensure::first(), EnsureCall::Create);
    assert_eq!(
        e.next(&EnsureCall::Create, EnsureAnswer::Exists),
        EnsureNext::Call(EnsureCall::Get)
    );
    let read = |same_spec| EnsureAnswer::Read {
        same_spec,
        resource_version: "5".into(),
    };
    assert_eq!(
        e.next(&EnsureCall::Get, read(true)),
        EnsureNext::Call(stamp.clone())
    );
    assert_eq!(
        e.next(&EnsureCall::Get, read(false)),
        EnsureNext::Deny(Refusal::DifferentSpec)
    );
    assert_eq!(
        e.next(&stamp, EnsureAnswer::Failed("forbidden".into())),
        EnsureNext::Deny(Refusal::StampFailed("forbidden".into()))
    );
    assert!(matches!(
        e.next(&EnsureCall::Create, EnsureAnswer::Stamped),
        EnsureNext::Deny(Refusal::Unexpected(_))
    ));
    // A template deleted under every attempt: refused after ENSURE_ROUNDS.
    let mut e = Ensure::default();
    let mut last = EnsureNext::Call(EnsureCall::Create);
    for _ in 0..ENSURE_ROUNDS {
        last = e.next(&stamp, EnsureAnswer::Gone);
    }
    assert_eq!(last, EnsureNext::Deny(Refusal::KeptChanging));
}

// --- The model: one template, webhooks admitting pods that name it, sweepers. ---

#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    uid: u32,
    version: u32,
    stamp: Option<i64>,
}

/// What one webhook does next.
#[derive(Debug, Clone)]
enum Hook {
    Calling(Ensure, EnsureCall),
    /// Answered Allow: the pod is stored next.
    Allowed,
    Finished,
}

/// Where one sweeper round is.
#[derive(Debug, Clone)]
enum Sweep {
    ListTemplates,
    ListPods(Option<Obj>),
    Delete(Option<Obj>, bool),
    Finished,
}

#[derive(Debug, Clone)]
struct World {
    template: Option<Obj>,
    next_version: u32,
    next_uid: u32,
    pods: usize,
    denied: Vec<Refusal>,
    hooks: Vec<Hook>,
    /// The leader's book, and its sweeper rounds (one after another).
    book: SweepBook,
    sweeps: Vec<Sweep>,
    now: Instant,
    now_unix: i64,
    grace: Duration,
    /// Whether the webhook stamps reused templates (false: the unfixed protocol).
    stamping: bool,
}

const NOW_UNIX: i64 = 10_000_000;

impl World {
    fn key() -> TemplateKey {
        key("hami-amd-0123456789abcdef")
    }

    fn version(&mut self) -> u32 {
        self.next_version += 1;
        self.next_version
    }

    fn call(&mut self, call: &EnsureCall) -> EnsureAnswer {
        match call {
            EnsureCall::Create => {
                if self.template.is_some() {
                    return EnsureAnswer::Exists;
                }
                self.next_uid += 1;
                let version = self.version();
                self.template = Some(Obj {
                    uid: self.next_uid,
                    version,
                    stamp: Some(self.now_unix),
                });
                EnsureAnswer::Created
            }
            EnsureCall::Get => match &self.template {
                None => EnsureAnswer::Gone,
                Some(o) => EnsureAnswer::Read {
                    same_spec: true,
                    resource_version: o.version.to_string(),
                },
            },
            EnsureCall::Stamp { resource_version } => {
                let version = self.version();
                let now = self.now_unix;
                match &mut self.template {
                    None => EnsureAnswer::Gone,
                    Some(o) if o.version.to_string() != *resource_version => EnsureAnswer::Conflict,
                    Some(o) => {
                        o.version = version;
                        o.stamp = Some(now);
                        EnsureAnswer::Stamped
                    }
                }
            }
        }
    }

    /// Runs one step of webhook `i`; false if it has none left.
    fn step_hook(&mut self, i: usize) -> bool {
        match self.hooks[i].clone() {
            Hook::Calling(mut ensure, call) => {
                let answer = self.call(&call);
                let answer = match (&call, answer, self.stamping) {
                    // The unfixed protocol: a same-spec 409 is the end of it.
                    (
                        EnsureCall::Get,
                        EnsureAnswer::Read {
                            same_spec: true, ..
                        },
                        false,
                    ) => {
                        self.hooks[i] = Hook::Allowed;
                        return true;
                    }
                    (_, a, _) => a,
                };
                self.hooks[i] = match ensure.next(&call, answer) {
                    EnsureNext::Call(c) => Hook::Calling(ensure, c),
                    EnsureNext::Done => Hook::Allowed,
                    EnsureNext::Deny(why) => {
                        self.denied.push(why);
                        Hook::Finished
                    }
                };
                true
            }
            Hook::Allowed => {
                // The pod is stored, naming the template: it must exist now.
                assert!(
                    self.template.is_some(),
                    "a pod was stored naming a template that is gone: {self:?}"
                );
                self.pods += 1;
                self.hooks[i] = Hook::Finished;
                true
            }
            Hook::Finished => false,
        }
    }

    fn step_sweep(&mut self, i: usize) -> bool {
        let next = match self.sweeps[i].clone() {
            Sweep::ListTemplates => Sweep::ListPods(self.template.clone()),
            Sweep::ListPods(seen) => Sweep::Delete(seen, self.pods > 0),
            Sweep::Delete(seen, referenced) => {
                let templates: BTreeMap<_, _> = seen
                    .iter()
                    .map(|o| (World::key(), listed(&o.version.to_string(), o.stamp)))
                    .collect();
                let refs: BTreeSet<_> = referenced.then(World::key).into_iter().collect();
                let (grace, now, now_unix) = (self.grace, self.now, self.now_unix);
                for k in self.book.look(&templates, &refs, grace, now, now_unix) {
                    let o = seen.as_ref().expect("deletes only what it listed");
                    // uid and resourceVersion preconditions.
                    if self.template.as_ref() == Some(o) {
                        self.template = None;
                    }
                    self.book.deleted(&k);
                }
                Sweep::Finished
            }
            Sweep::Finished => return false,
        };
        self.sweeps[i] = next;
        true
    }

    fn done(&self) -> bool {
        self.hooks.iter().all(|h| matches!(h, Hook::Finished))
            && self.sweeps.iter().all(|s| matches!(s, Sweep::Finished))
    }
}

/// Every interleaving from `world` (depth first); returns how many ended, checking each
/// end: every webhook answered Allow, every pod's template still exists.
fn explore(world: &World) -> usize {
    if world.done() {
        assert!(world.denied.is_empty(), "{world:?}");
        assert_eq!(world.pods, world.hooks.len());
        assert!(
            world.template.is_some(),
            "pods name a template that is gone: {world:?}"
        );
        return 1;
    }
    let mut ends = 0;
    for i in 0..world.hooks.len() {
        let mut w = world.clone();
        if w.step_hook(i) {
            ends += explore(&w);
        }
    }
    for i in 0..world.sweeps.len() {
        // A later round starts after the earlier one ended (one sweeper loop per leader).
        if i > 0 && !matches!(world.sweeps[i - 1], Sweep::Finished) {
            continue;
        }
        let mut w = world.clone();
        if w.step_sweep(i) {
            ends += explore(&w);
        }
    }
    ends
}

/// A template nobody has named for long, known to the sweeper's book since then (stamped
/// once, long ago, or never); `hooks` webhooks about to reuse it, `rounds` sweeper rounds
/// of that leader.
fn world(hooks: usize, rounds: usize, stamping: bool, old_stamp: Option<i64>) -> World {
    let grace = Duration::from_secs(600);
    let t0 = Instant::now();
    let now = t0 + 2 * grace;
    let mut book = SweepBook::default();
    let templates: BTreeMap<_, _> = [(World::key(), listed("1", old_stamp))].into();
    assert!(
        book.look(&templates, &BTreeSet::new(), grace, t0, NOW_UNIX - 1200)
            .is_empty()
    );
    World {
        template: Some(Obj {
            uid: 1,
            version: 1,
            stamp: old_stamp,
        }),
        next_version: 1,
        next_uid: 1,
        pods: 0,
        denied: Vec::new(),
        hooks: (0..hooks)
            .map(|_| Hook::Calling(Ensure::default(), Ensure::first()))
            .collect(),
        book,
        sweeps: vec![Sweep::ListTemplates; rounds],
        now,
        now_unix: NOW_UNIX,
        grace,
        stamping,
    }
}

#[test]
fn no_interleaving_of_reuse_and_sweep_stores_a_pod_naming_a_gone_template() {
    for old_stamp in [None, Some(NOW_UNIX - 1200)] {
        // One webhook, a sweep by the leader that knows the template, then another round.
        assert!(explore(&world(1, 2, true, old_stamp)) > 100);
        // Two webhooks reusing it at once (their stamps conflict), one sweep.
        assert!(explore(&world(2, 1, true, old_stamp)) > 1000);
    }
}

#[test]
fn sweep_then_reuse_creates_the_template_again_before_answering() {
    // The sweeper deletes first; the webhook's 409 was answered before that: the GET or the
    // stamp finds it gone, and the webhook makes it again.
    let mut w = world(1, 1, true, None);
    assert!(w.step_hook(0)); // create: 409
    for _ in 0..3 {
        assert!(w.step_sweep(0)); // list, list pods, delete
    }
    assert!(w.template.is_none(), "the sweeper did not delete: {w:?}");
    while w.step_hook(0) {}
    assert!(
        w.template.is_some() && w.pods == 1 && w.denied.is_empty(),
        "{w:?}"
    );
    assert_eq!(w.template.as_ref().unwrap().uid, 2, "made again");
}

#[test]
fn without_the_stamp_some_interleaving_loses_the_template() {
    // The model finds the race in the protocol without the stamp (so the test above can fail).
    let lost = std::panic::catch_unwind(|| explore(&world(1, 1, false, None)));
    assert!(
        lost.is_err(),
        "the unstamped protocol never lost a template"
    );
}
