//! The Kubernetes side: one watcher per resource (nodes, pods, core/v1 and
//! events.k8s.io/v1 Events, and, as `--dra` says, resource.k8s.io/v1 ResourceSlices and
//! ResourceClaims for the DRA nodes) feeding [`World`]. A watch error becomes a banner while
//! it lasts and is logged once per run of errors; the watcher retries with backoff and the
//! pages keep what was last seen. What each stream item does to the world is
//! [`crate::watch_feed`]'s decision; this file drives it.

use std::sync::{Arc, RwLock};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use k8s_openapi::api::events::v1::Event as NewEvent;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::DraWatch;
use crate::watch_feed::{Feed, Update};
use crate::world::{EventRow, World, is_dra_node};

/// A core/v1 Event as a row (its time: last, first, event time, else creation).
pub fn core_event_row(e: &CoreEvent) -> EventRow {
    let at = e
        .last_timestamp
        .as_ref()
        .or(e.first_timestamp.as_ref())
        .map(|t| t.0.as_second())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.as_second()))
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .unwrap_or(0);
    let o = &e.involved_object;
    EventRow {
        uid: e.metadata.uid.clone().unwrap_or_default(),
        source: "core",
        at,
        kind: o.kind.clone().unwrap_or_default(),
        namespace: o.namespace.clone().unwrap_or_default(),
        name: o.name.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        note: e.message.clone().unwrap_or_default(),
        warning: e.type_.as_deref() == Some("Warning"),
    }
}

/// An events.k8s.io/v1 Event as a row.
pub fn new_event_row(e: &NewEvent) -> EventRow {
    let at = e
        .event_time
        .as_ref()
        .map(|t| t.0.as_second())
        .or_else(|| {
            e.deprecated_last_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .or_else(|| {
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .unwrap_or(0);
    let r = e.regarding.clone().unwrap_or_default();
    EventRow {
        uid: e.metadata.uid.clone().unwrap_or_default(),
        source: "events",
        at,
        kind: r.kind.unwrap_or_default(),
        namespace: r.namespace.unwrap_or_default(),
        name: r.name.unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        note: e.note.clone().unwrap_or_default(),
        warning: e.type_.as_deref() == Some("Warning"),
    }
}

/// How a watcher's events change the world.
trait Apply: Sized {
    const WHAT: &'static str;
    fn apply(world: &mut World, obj: Self);
    fn delete(world: &mut World, obj: &Self);
    fn reset(world: &mut World, all: Vec<Self>);
}

impl Apply for Node {
    const WHAT: &'static str = "nodes";
    fn apply(world: &mut World, obj: Self) {
        world.upsert_node(obj);
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_node(obj.metadata.name.as_deref().unwrap_or_default());
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_nodes(all);
    }
}

impl Apply for Pod {
    const WHAT: &'static str = "pods";
    fn apply(world: &mut World, obj: Self) {
        world.upsert_pod(obj);
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_pod(obj);
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_pods(all);
    }
}

impl Apply for CoreEvent {
    const WHAT: &'static str = "events";
    fn apply(world: &mut World, obj: Self) {
        world.upsert_event(core_event_row(&obj));
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_event(&core_event_row(obj).uid);
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_events("core", all.iter().map(core_event_row).collect());
    }
}

impl Apply for NewEvent {
    const WHAT: &'static str = "events.k8s.io events";
    fn apply(world: &mut World, obj: Self) {
        world.upsert_event(new_event_row(&obj));
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_event(&new_event_row(obj).uid);
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_events("events", all.iter().map(new_event_row).collect());
    }
}

impl Apply for ResourceSlice {
    const WHAT: &'static str = crate::world::DRA_RESOURCES[0];
    fn apply(world: &mut World, obj: Self) {
        world.upsert_slice(obj);
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_slice(obj.metadata.name.as_deref().unwrap_or_default());
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_slices(all);
    }
}

impl Apply for ResourceClaim {
    const WHAT: &'static str = crate::world::DRA_RESOURCES[1];
    fn apply(world: &mut World, obj: Self) {
        world.upsert_claim(obj);
    }
    fn delete(world: &mut World, obj: &Self) {
        world.remove_claim(obj);
    }
    fn reset(world: &mut World, all: Vec<Self>) {
        world.reset_claims(all);
    }
}

/// Keeps the world's `K`s as the watch says; `notice` sees each object applied (also each
/// of a relist), as the world takes it.
async fn run<K>(
    api: Api<K>,
    config: watcher::Config,
    world: Arc<RwLock<World>>,
    notice: impl Fn(&K) + Send,
) where
    K: Apply + Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    if let Ok(mut w) = world.write() {
        w.synced.insert(K::WHAT, false);
    }
    let mut feed = Feed::new();
    let mut stream = watcher::watcher(api, config)
        .default_backoff()
        .into_stream()
        .boxed();
    while let Some(item) = stream.next().await {
        let update = feed.on(item.map_err(|e| e.to_string()));
        if let Update::Banner(e) = &update
            && feed.began_failing()
        {
            tracing::warn!(
                "cannot watch {}: {e} (retrying with backoff; logged once until it works)",
                K::WHAT
            );
        } else if feed.recovered() {
            tracing::info!("watching {} again", K::WHAT);
        }
        let Ok(mut w) = world.write() else { return };
        match update {
            Update::Banner(e) => {
                w.watch_failed(K::WHAT, e, crate::scrape::unix_now());
            }
            update => {
                w.watch_ok(K::WHAT);
                match update {
                    Update::Banner(_) | Update::Buffering => {}
                    Update::Reset(all) => {
                        all.iter().for_each(&notice);
                        K::reset(&mut w, all);
                        w.synced.insert(K::WHAT, true);
                    }
                    Update::Apply(obj) => {
                        notice(&obj);
                        K::apply(&mut w, obj);
                    }
                    Update::Delete(obj) => K::delete(&mut w, &obj),
                }
            }
        }
    }
}

/// Starts the watchers; they run until the runtime stops. The DRA watchers as `dra` says:
/// from the start (the chart passes `--dra`, and grants list/watch on ResourceSlices and
/// ResourceClaims, only in its DRA mode), never (`--dra=off`, the chart's other mode: the UI
/// never asks for what it may not read; [`World::dra_unwatched`] then says so if a node is
/// in DRA mode anyway), or once a node is in DRA mode (`auto`, `hami ui`'s default: a
/// cluster without DRA sees no resource.k8s.io request). Only our driver's slices are
/// watched (the server filters by `spec.driver`); claims have no driver field to select on.
/// Under `auto` the node watcher signals the first node it sees in DRA mode (a
/// `tokio::sync::watch`), and the DRA watchers start then: nothing polls.
pub fn start(
    client: Client,
    world: Arc<RwLock<World>>,
    dra: DraWatch,
) -> Vec<tokio::task::JoinHandle<()>> {
    let all = watcher::Config::default;
    if let Ok(mut w) = world.write() {
        w.dra_unwatched = dra == DraWatch::Off;
    }
    // Set once the node watcher sees a node in DRA mode (`--dra=auto` waits for it).
    let (dra_seen, mut dra_wait) = tokio::sync::watch::channel(false);
    let nodes_notice = move |node: &Node| {
        if is_dra_node(node) {
            dra_seen.send_if_modified(|seen| !std::mem::replace(seen, true));
        }
    };
    let mut tasks = vec![
        tokio::spawn(run(
            Api::<Node>::all(client.clone()),
            all(),
            world.clone(),
            nodes_notice,
        )),
        tokio::spawn(run(
            Api::<Pod>::all(client.clone()),
            all(),
            world.clone(),
            |_: &Pod| {},
        )),
        tokio::spawn(run(
            Api::<CoreEvent>::all(client.clone()),
            all(),
            world.clone(),
            |_: &CoreEvent| {},
        )),
        tokio::spawn(run(
            Api::<NewEvent>::all(client.clone()),
            all(),
            world.clone(),
            |_: &NewEvent| {},
        )),
    ];
    match dra {
        DraWatch::On => tasks.push(tokio::spawn(run_dra(client, world))),
        DraWatch::Auto => tasks.push(tokio::spawn(async move {
            // An error: the node watcher ended (the world is gone), so nothing to watch for.
            if dra_wait.wait_for(|seen| *seen).await.is_err() {
                return;
            }
            tracing::info!("a node is in DRA mode: watching ResourceSlices and ResourceClaims");
            run_dra(client, world).await;
        })),
        DraWatch::Off => {}
    }
    tasks
}

/// The two DRA watchers, in this task (aborting it stops both).
async fn run_dra(client: Client, world: Arc<RwLock<World>>) {
    let ours = format!("spec.driver={}", hami_protocol::dra::DRIVER);
    futures::join!(
        run(
            Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default().fields(&ours),
            world.clone(),
            |_: &ResourceSlice| {},
        ),
        run(
            Api::<ResourceClaim>::all(client),
            watcher::Config::default(),
            world,
            |_: &ResourceClaim| {},
        ),
    );
}
