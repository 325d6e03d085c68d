//! The DRA mode's shell: a reflector of ResourceSlices (their device shapes feed
//! [`crate::dra_claims`]), the hand-out of the claim templates an admitted pod names
//! (created stamped, or an existing one of the same spec stamped at the version read; a
//! template of another spec is refused, never overwritten), and the sweeper that deletes
//! managed templates no pod has referenced, nor a webhook stamped, for
//! [`SweepTuning::grace`]. [`crate::dra_sweep`] decides both sides of that race.
//!
//! Started at once with `--amd-mode=dra`; otherwise on the first pod that names
//! `hami.io/amd-mode` (a device-plugin cluster makes no DRA request at all, so it needs
//! no DRA rights).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_plugin_core::node_lock_client::unix_now;
use hami_protocol::dra::{DRIVER, LAST_USED_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::dra_claims::{ContainerClaim, Shape, claim_field, same_spec, shapes};
use crate::dra_sweep::{
    ENSURE_ROUNDS, Ensure, EnsureAnswer, EnsureCall, EnsureNext, Listed, Refusal, SweepBook,
    SweepTuning, TemplateKey, format_last_used, parse_last_used,
};
use crate::leader::Leadership;

/// How long an admission waits for the first list of ResourceSlices.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(3);

pub use hami_scheduler_core::review_codec::may_need_shapes;

struct Running {
    slices: Store<ResourceSlice>,
    last_error: Arc<Mutex<Option<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The DRA side of one scheduler replica.
pub struct DraFront {
    client: Client,
    leader: Arc<Leadership>,
    tuning: SweepTuning,
    running: OnceLock<Running>,
}

impl Drop for DraFront {
    fn drop(&mut self) {
        for task in self.running.get().into_iter().flat_map(|r| &r.tasks) {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DraFront {
    /// Nothing runs until [`DraFront::start`] or the first [`DraFront::shapes`].
    pub fn new(client: Client, leader: Arc<Leadership>, tuning: SweepTuning) -> Self {
        Self {
            client,
            leader,
            tuning,
            running: OnceLock::new(),
        }
    }

    /// Starts the slice reflector and the sweeper (once; later calls do nothing).
    pub fn start(&self) {
        self.running();
    }

    fn running(&self) -> &Running {
        self.running.get_or_init(|| {
            info!("DRA mode: watching ResourceSlices and sweeping unused claim templates");
            let (store, writer) = reflector::store::<ResourceSlice>();
            let last_error: Arc<Mutex<Option<String>>> = Arc::default();
            let errors = last_error.clone();
            let stream = reflector::reflector(
                writer,
                watcher(
                    Api::<ResourceSlice>::all(self.client.clone()),
                    // Only this driver's slices (upstream's field selector).
                    watcher::Config::default().fields(&format!("spec.driver={DRIVER}")),
                )
                .default_backoff(),
            );
            let watch = tokio::spawn(stream.for_each(move |event| {
                crate::watch_errors::note(&errors, "ResourceSlice", &event);
                async {}
            }));
            let sweeper = tokio::spawn(sweep_loop(
                self.client.clone(),
                self.leader.clone(),
                self.tuning,
            ));
            Running {
                slices: store,
                last_error,
                tasks: vec![watch, sweeper],
            }
        })
    }

    /// The device shapes of the driver's slices now; the first call starts the watch and
    /// waits (bounded) for its first list. Err says why the slices cannot be read.
    pub async fn shapes(&self) -> Result<Vec<Shape>, String> {
        let running = self.running();
        let ready = tokio::time::timeout(FIRST_LIST_WAIT, running.slices.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok());
        if !ready {
            return Err(lock(&running.last_error).clone().unwrap_or_else(|| {
                format!(
                    "the ResourceSlice watch has not listed within {}s",
                    FIRST_LIST_WAIT.as_secs()
                )
            }));
        }
        let state = running.slices.state();
        Ok(shapes(state.iter().map(|s| s.as_ref())))
    }

    /// Hands out the templates `claims` name in `namespace` (each once): creates each,
    /// stamped, or stamps the existing one of the same spec at the version read, creating it
    /// again if it was swept meanwhile ([`Ensure`]). Err is the denial message.
    pub async fn ensure_templates(
        &self,
        namespace: &str,
        claims: &[ContainerClaim],
    ) -> Result<(), String> {
        self.start();
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
        let mut done = HashSet::new();
        for claim in claims {
            if !done.insert(claim.template_name.as_str()) {
                continue;
            }
            hand_out(&api, namespace, claim).await?;
        }
        Ok(())
    }
}

/// One template's hand-out, the calls [`Ensure`] asks for.
async fn hand_out(
    api: &Api<ResourceClaimTemplate>,
    namespace: &str,
    claim: &ContainerClaim,
) -> Result<(), String> {
    let name = &claim.template_name;
    let text = crate::kube_error::text;
    let mut ensure = Ensure::default();
    let mut call = Ensure::first();
    loop {
        let answer = match &call {
            EnsureCall::Create => {
                let mut template = claim.template(namespace);
                template
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(LAST_USED_ANNOTATION.into(), format_last_used(unix_now()));
                match api.create(&PostParams::default(), &template).await {
                    Ok(_) => EnsureAnswer::Created,
                    Err(kube::Error::Api(s)) if s.code == 409 => EnsureAnswer::Exists,
                    Err(e) => EnsureAnswer::Failed(text(&e)),
                }
            }
            EnsureCall::Get => match api.get(name).await {
                Ok(existing) => EnsureAnswer::Read {
                    same_spec: same_spec(&existing.spec, &claim.spec),
                    resource_version: existing.resource_version().unwrap_or_default(),
                },
                Err(kube::Error::Api(s)) if s.code == 404 => EnsureAnswer::Gone,
                Err(e) => EnsureAnswer::Failed(text(&e)),
            },
            EnsureCall::Stamp { resource_version } => {
                // The version makes it conditional: a template swept and made again since
                // the GET is read again, never stamped blind.
                let patch = serde_json::json!({"metadata": {
                    "resourceVersion": resource_version,
                    "annotations": {LAST_USED_ANNOTATION: format_last_used(unix_now())},
                }});
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => EnsureAnswer::Stamped,
                    Err(kube::Error::Api(s)) if s.code == 404 => EnsureAnswer::Gone,
                    Err(kube::Error::Api(s)) if s.code == 409 => EnsureAnswer::Conflict,
                    Err(e) => EnsureAnswer::Failed(text(&e)),
                }
            }
        };
        call = match ensure.next(&call, answer) {
            EnsureNext::Call(next) => next,
            EnsureNext::Done => return Ok(()),
            EnsureNext::Deny(why) => return Err(refusal(namespace, claim, why)),
        };
    }
}

/// The denial message for `why`.
fn refusal(namespace: &str, claim: &ContainerClaim, why: Refusal) -> String {
    let what = format!(
        "ResourceClaimTemplate {namespace}/{} for {}",
        claim.template_name,
        claim_field(claim)
    );
    match why {
        Refusal::CreateFailed(e) => format!("cannot create {what}: {e}"),
        Refusal::ReadFailed(e) => format!("{what} exists but cannot be read: {e}"),
        Refusal::DifferentSpec => format!(
            "{what} exists with a different spec; the webhook never overwrites it: delete or rename that template"
        ),
        Refusal::StampFailed(e) => format!(
            "cannot mark {what} as in use (annotation {LAST_USED_ANNOTATION}, which keeps the sweeper from deleting it before the pod is stored): {e}"
        ),
        Refusal::KeptChanging => format!(
            "{what} was deleted or changed {ENSURE_ROUNDS} times while the webhook handed it out; create the pod again"
        ),
        Refusal::Unexpected(e) => format!("{what}: unexpected answer {e}"),
    }
}

/// Every `tuning.interval` while this replica leads: list the managed templates and the
/// pods of their namespaces, delete what the book says (with the listed uid and version
/// as preconditions, so a template stamped or made anew since the list is kept).
async fn sweep_loop(client: Client, leader: Arc<Leadership>, tuning: SweepTuning) {
    let mut book = SweepBook::default();
    loop {
        tokio::time::sleep(tuning.interval).await;
        if !leader.is_leader() {
            continue;
        }
        if let Err(e) = sweep_once(&client, &tuning, &mut book).await {
            warn!(error = %e, "sweeping claim templates failed; trying again later");
        }
    }
}

async fn sweep_once(
    client: &Client,
    tuning: &SweepTuning,
    book: &mut SweepBook,
) -> Result<(), String> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_WEBHOOK}");
    let listed = Api::<ResourceClaimTemplate>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing claim templates: {}", crate::kube_error::text(&e)))?;
    let mut versions = BTreeMap::new();
    let mut templates: BTreeMap<TemplateKey, Listed> = BTreeMap::new();
    for t in &listed.items {
        let key = (t.namespace().unwrap_or_default(), t.name_any());
        versions.insert(key.clone(), (t.uid(), t.resource_version()));
        templates.insert(
            key,
            Listed {
                resource_version: t.resource_version().unwrap_or_default(),
                last_used: t
                    .annotations()
                    .get(LAST_USED_ANNOTATION)
                    .and_then(|v| parse_last_used(v)),
            },
        );
    }
    let namespaces: BTreeSet<&String> = templates.keys().map(|(ns, _)| ns).collect();
    let mut referenced = BTreeSet::new();
    for ns in namespaces {
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing pods of {ns}: {}", crate::kube_error::text(&e)))?;
        for pod in &pods.items {
            for entry in pod
                .spec
                .iter()
                .flat_map(|s| s.resource_claims.iter().flatten())
            {
                if let Some(t) = &entry.resource_claim_template_name {
                    referenced.insert((ns.clone(), t.clone()));
                }
            }
        }
    }
    let (now, now_unix) = (Instant::now(), unix_now());
    for key in book.look(&templates, &referenced, tuning.grace, now, now_unix) {
        let (uid, version) = versions[&key].clone();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: version,
            }),
            ..DeleteParams::default()
        };
        let (ns, name) = &key;
        match Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns)
            .delete(name, &params)
            .await
        {
            Ok(_) => info!(namespace = %ns, template = %name, "deleted an unused claim template"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                warn!(namespace = %ns, template = %name, error = %crate::kube_error::text(&e), "cannot delete an unused claim template")
            }
        }
        book.deleted(&key);
    }
    Ok(())
}
