//! Writes through mutating admission, in upstream's order: creates of pods, and updates of
//! pods when a webhook's rule names them (retried when the object changed meanwhile).

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::Method;
use serde_json::Value;

use crate::admission;
use crate::codec;
use crate::patch::{self, PatchType};
use crate::resources::{self, ResourceType};
use crate::route::ResourceRoute;
use crate::status::ApiError;
use crate::store::{Committed, ListOptions, Subresource, WriteContext};
use crate::strategy;

use super::{AppState, Params, store_ns};

/// The webhook configurations to consult for an UPDATE of the existing pod `ns/name` (or
/// its `sub`), when any of their rules names it; None: the update is stored directly.
pub(super) fn update_webhooks(
    st: &AppState,
    r: &'static ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
) -> Option<Vec<Arc<Value>>> {
    if r.plural != "pods" {
        return None;
    }
    let mwc = resources::lookup(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
    )?;
    let configs: Vec<Arc<Value>> = st.read(|s| {
        if s.get_stored(r, ns, name).is_err() {
            // Not there: the plain path answers (404, or an apply patch's create).
            return Vec::new();
        }
        s.list(mwc, None, &ListOptions::default())
            .map(|l| l.items.iter().map(|o| Arc::new(o.to_value())).collect())
            .unwrap_or_default()
    });
    admission::any_rule_matches(&configs, r, sub, "UPDATE").then_some(configs)
}

/// How many times an UPDATE is prepared and admitted again when the object changed while
/// its webhooks were called (upstream's patcher retries a conflicting patch 5 times).
const ADMITTED_UPDATE_ATTEMPTS: usize = 6;

/// A PUT or PATCH through mutating admission, as upstream orders it: the change is applied
/// to the stored object (managedFields recorded), the webhooks see that result as `object`
/// and the stored one as `oldObject` (operation UPDATE, UpdateOptions), their patches are
/// applied, and the result is validated and stored if the object has not changed meanwhile.
/// If it has, an unconditional update or a patch is prepared and admitted again; an update
/// naming a resourceVersion then answers 409.
#[allow(clippy::too_many_arguments)]
pub(super) async fn update_with_admission(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    p: &Params,
    method: &Method,
    rr: &ResourceRoute,
    name: &str,
    configs: Vec<Arc<Value>>,
    ct: Option<&str>,
    body: &Bytes,
) -> Result<Value, ApiError> {
    enum Change {
        Put(Value),
        Patch(PatchType, Value),
    }
    let r = rr.resource;
    let ns = store_ns(rr).to_string();
    let subres = if rr.subresource.as_deref() == Some("status") {
        Subresource::Status
    } else {
        Subresource::Main
    };
    let change = if *method == Method::PUT {
        Change::Put(codec::decode_object(ct, body)?)
    } else {
        let ty = PatchType::from_content_type(ct.unwrap_or(""))?;
        Change::Patch(ty, patch::parse_body(ty, body)?)
    };
    let nsr = resources::lookup("", "v1", "namespaces").expect("served");
    let ns_labels = st.read(|s| {
        s.get(nsr, "", &ns)
            .ok()
            .and_then(|o| o.pointer("/metadata/labels").cloned())
    });
    let prepare = WriteContext {
        dry_run: true,
        ..ctx.clone()
    };
    let who = admission::Requester {
        user: p.user.clone(),
        dry_run: ctx.dry_run,
        field_manager: p.field_manager.clone(),
    };
    let target = admission::Target {
        resource: r,
        sub: rr.subresource.as_deref(),
        operation: "UPDATE",
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (old, new) = st.write_ctx(&prepare, |s| {
            let old = s.get(r, &ns, name)?;
            let new = match &change {
                Change::Put(o) => s.update(r, &ns, name, o.clone(), subres)?,
                Change::Patch(ty, b) => s.patch(r, &ns, name, *ty, b, subres)?,
            };
            Ok((old, new))
        })?;
        let expected = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let admitted = admission::admit(
            configs.clone(),
            target,
            &ns,
            ns_labels.clone(),
            Arc::unwrap_or_clone(new),
            Some(Arc::unwrap_or_clone(old)),
            who.clone(),
        )
        .await?;
        match st.write_ctx(ctx, |s| {
            s.commit_admitted(r, &ns, name, admitted, subres, &expected)
        }) {
            Ok(out) => return Ok(Arc::unwrap_or_clone(out)),
            // Changed while the webhooks were called: prepare against the new state.
            Err(e) if e.code == 409 && attempt < ADMITTED_UPDATE_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Creates an object, running mutating admission webhooks first for pods.
pub(super) async fn create_with_admission(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    user: Option<&crate::rbac::UserInfo>,
    r: &'static ResourceType,
    ns: Option<&str>,
    obj: Value,
) -> Result<Committed, ApiError> {
    let mwc = resources::lookup(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
    )
    .expect("served");
    let nsr = resources::lookup("", "v1", "namespaces").expect("served");
    let (mut prepared, configs, ns_labels) = st.read(|s| -> Result<_, ApiError> {
        let mut prepared = s.prepare_create(r, ns, obj)?;
        // Built-in admission runs before the webhooks, as upstream orders its plugins.
        if st.service_accounts && r.plural == "pods" && r.group.is_empty() {
            crate::service_accounts::admit_pod(s, ns.unwrap_or(""), &mut prepared)?;
        }
        strategy::prepare_for_create(r, &mut prepared);
        let configs = if r.plural == "pods" {
            s.list(mwc, None, &ListOptions::default())?
                .items
                .iter()
                .map(|o| Arc::new(o.to_value()))
                .collect()
        } else {
            Vec::new()
        };
        // Only webhooks read the namespace's labels (namespaceSelector).
        let ns_labels = ns
            .filter(|_| !configs.is_empty())
            .and_then(|n| s.get(nsr, "", n).ok())
            .and_then(|o| o.pointer("/metadata/labels").cloned());
        Ok((prepared, configs, ns_labels))
    })?;
    if !configs.is_empty() {
        prepared = admission::admit_create(
            configs,
            r,
            ns.unwrap_or(""),
            ns_labels,
            prepared,
            admission::Requester {
                user: user.cloned(),
                dry_run: ctx.dry_run,
                field_manager: None,
            },
        )
        .await?;
    }
    st.write_ctx(ctx, |s| {
        // Validation after the webhooks (their patches may name another account).
        if st.service_accounts && r.plural == "pods" && r.group.is_empty() {
            crate::service_accounts::validate_pod(s, ns.unwrap_or(""), &prepared)?;
        }
        s.create_committed(r, ns, prepared)
    })
}
