//! The DRA mode's shell: a reflector of ResourceSlices (their device shapes feed
//! [`crate::dra_claims`]), the creation of the claim templates an admitted pod names
//! (idempotent: an existing template of our name with the same spec is fine, another spec
//! is refused, never overwritten), and the sweeper that deletes managed templates no pod
//! has referenced for [`SweepTuning::grace`] ([`crate::dra_sweep`] decides).
//!
//! Started at once with `--amd-mode=dra`; otherwise on the first pod that names
//! `hami.io/amd-mode` (a device-plugin cluster makes no DRA request at all, so it needs
//! no DRA rights).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_protocol::dra::{AMD_MODE_ANNOTATION, DRIVER, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::admission::WebhookConfig;
use crate::dra_claims::{AmdMode, ContainerClaim, Shape, claim_field, same_spec, shapes};
use crate::dra_sweep::{SweepBook, SweepTuning, TemplateKey};
use crate::leader::Leadership;

/// How long an admission waits for the first list of ResourceSlices.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(3);

/// Whether a review body may be a DRA-mode pod (so the slices are worth reading): the
/// default mode is DRA, or the body names the mode annotation.
pub fn may_need_shapes(body: &[u8], config: &WebhookConfig) -> bool {
    config.amd_mode == AmdMode::Dra
        || body
            .windows(AMD_MODE_ANNOTATION.len())
            .any(|w| w == AMD_MODE_ANNOTATION.as_bytes())
}

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
    /// Templates this replica's webhook ensured, and when (the sweeper spares them).
    handed_out: Arc<Mutex<BTreeMap<TemplateKey, Instant>>>,
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
            handed_out: Arc::default(),
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
                let mut last = lock(&errors);
                match event {
                    Ok(_) => *last = None,
                    Err(e) => {
                        let text = e.to_string();
                        // Said once per distinct error, not on every backoff retry.
                        if last.as_deref() != Some(text.as_str()) {
                            warn!(error = %text, "the ResourceSlice watch failed; retrying");
                        }
                        *last = Some(text);
                    }
                }
                async {}
            }));
            let sweeper = tokio::spawn(sweep_loop(
                self.client.clone(),
                self.leader.clone(),
                self.tuning,
                self.handed_out.clone(),
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

    /// Creates the templates `claims` name in `namespace` (each once); an existing one of
    /// the same name must have the same spec. Err is the denial message.
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
            let name = &claim.template_name;
            let what = || {
                format!(
                    "ResourceClaimTemplate {namespace}/{name} for {}",
                    claim_field(claim)
                )
            };
            match api
                .create(&PostParams::default(), &claim.template(namespace))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = api.get(name).await.map_err(|e| {
                        format!(
                            "{} exists but cannot be read: {}",
                            what(),
                            crate::kube_error::text(&e)
                        )
                    })?;
                    if !same_spec(&existing.spec, &claim.spec) {
                        return Err(format!(
                            "{} exists with a different spec; the webhook never overwrites it: delete or rename that template",
                            what()
                        ));
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "cannot create {}: {}",
                        what(),
                        crate::kube_error::text(&e)
                    ));
                }
            }
            lock(&self.handed_out).insert((namespace.to_owned(), name.clone()), Instant::now());
        }
        Ok(())
    }
}

/// Every `tuning.interval` while this replica leads: list the managed templates and the
/// pods of their namespaces, delete what the book says (with the listed version as
/// precondition, so a template changed since is kept).
async fn sweep_loop(
    client: Client,
    leader: Arc<Leadership>,
    tuning: SweepTuning,
    handed_out: Arc<Mutex<BTreeMap<TemplateKey, Instant>>>,
) {
    let mut book = SweepBook::default();
    loop {
        tokio::time::sleep(tuning.interval).await;
        if !leader.is_leader() {
            continue;
        }
        if let Err(e) = sweep_once(&client, &tuning, &handed_out, &mut book).await {
            warn!(error = %e, "sweeping claim templates failed; trying again later");
        }
    }
}

async fn sweep_once(
    client: &Client,
    tuning: &SweepTuning,
    handed_out: &Mutex<BTreeMap<TemplateKey, Instant>>,
    book: &mut SweepBook,
) -> Result<(), String> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_WEBHOOK}");
    let listed = Api::<ResourceClaimTemplate>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing claim templates: {}", crate::kube_error::text(&e)))?;
    let mut versions = BTreeMap::new();
    for t in &listed.items {
        versions.insert(
            (t.namespace().unwrap_or_default(), t.name_any()),
            (t.uid(), t.resource_version()),
        );
    }
    let templates: BTreeSet<TemplateKey> = versions.keys().cloned().collect();
    let namespaces: BTreeSet<&String> = templates.iter().map(|(ns, _)| ns).collect();
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
    let now = Instant::now();
    let spared = {
        let mut h = lock(handed_out);
        h.retain(|_, at| now.saturating_duration_since(*at) <= tuning.grace);
        h.clone()
    };
    for key in book.look(&templates, &referenced, &spared, tuning.grace, now) {
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
