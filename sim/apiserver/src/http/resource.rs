//! One resource request: gets, creates, updates, patches, deletes and the pod
//! subresources (`binding`, `token`, `eviction`), dry runs included; lists and watches are
//! handed to `list` and `watch`, writes that webhooks must see to `admitted`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::Method;
use axum::response::Response;
use serde_json::{Value, json};

use crate::codec;
use crate::patch::{self, PatchType};
use crate::route::ResourceRoute;
use crate::status::{ApiError, success_status};
use crate::store::{DeleteOptions, Subresource, WriteContext};
use crate::table;

use super::admitted::{create_with_admission, update_webhooks, update_with_admission};
use super::list::{list_options, list_request};
use super::watch::watch_request;
use super::{
    AppState, Params, bytes_response, committed_response, json_response, object_response, store_ns,
};

pub(super) async fn resource_request(
    st: &Arc<AppState>,
    method: &Method,
    rr: ResourceRoute,
    p: Params,
    ct: Option<&str>,
    accept: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    if !crate::protobuf::accepts_json(accept) {
        // We answer JSON only; protobuf-first clients list JSON after it (client-go does).
        return Err(ApiError::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json (Accept: {accept:?})"
            ),
        ));
    }
    let ns = store_ns(&rr).to_string();
    let sub = rr.subresource.as_deref();
    let manager = match (
        &p.field_manager,
        ct.map(|c| c.starts_with("application/apply-patch")),
    ) {
        (Some(m), _) => m.clone(),
        (None, Some(true)) if *method == Method::PATCH => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[(
                    "fieldManager",
                    "Required value: is required for apply patch".into(),
                )],
            ));
        }
        // Kubernetes derives the default manager from the User-Agent's product name.
        _ => p
            .user_agent
            .as_deref()
            .and_then(|u| u.split('/').next())
            .filter(|m| !m.is_empty())
            .unwrap_or("unknown")
            .to_string(),
    };
    let ctx = WriteContext {
        manager,
        force: p.force,
        dry_run: p.dry_run,
    };
    if p.dry_run && *method == Method::POST && rr.name.is_none() && sub.is_none() {
        // A dry-run create is admitted like any other (webhooks see `dryRun: true`; the
        // shipped ones declare sideEffects None or NoneOnDryRun), then not stored.
        let obj = codec::decode_object(ct, body)?;
        let created =
            create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                .await?;
        return Ok(committed_response(201, r, &created, accept));
    }
    if (*method == Method::PUT || *method == Method::PATCH)
        && let Some(name) = rr.name.clone()
        && matches!(sub, None | Some("status"))
        && let Some(configs) = update_webhooks(st, r, &ns, &name, sub)
    {
        return update_with_admission(st, &ctx, &p, method, &rr, &name, configs, ct, body)
            .await
            .map(|out| object_response(200, r, &out, accept));
    }
    if p.dry_run && *method != Method::GET {
        return dry_run_request(st, &ctx, method, rr, ct, accept, body);
    }
    match (method.as_str(), rr.name.as_deref(), sub) {
        ("GET", _, _) if p.watch => watch_request(st, &rr, p, accept),
        ("GET", Some(name), None | Some("status")) => {
            let obj = st.read(|s| s.get_stored(r, &ns, name))?;
            if table::wants_table(accept) {
                return Ok(object_response(200, r, &obj.to_value(), accept));
            }
            Ok(bytes_response(200, obj.json.as_bytes().to_vec()))
        }
        ("GET", None, None) => list_request(st, &rr, &p, accept),
        ("POST", None, None) => {
            let obj = codec::decode_object(ct, body)?;
            let created =
                create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                    .await?;
            Ok(committed_response(201, r, &created, accept))
        }
        ("POST", Some(name), Some("binding")) => {
            let b = codec::decode_object(ct, body)?;
            if b.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k != "Binding")
            {
                return Err(ApiError::bad_request(
                    "the body of a pods/binding request must be a Binding",
                ));
            }
            if let Some(bn) = b
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty() && *n != name)
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the Binding ({bn}) does not match the pod name on the URL ({name})"
                )));
            }
            st.write_ctx(&ctx, |s| s.bind(&ns, name, &b))?;
            Ok(json_response(201, &success_status(201, None)))
        }
        ("POST", Some(name), Some("token")) => {
            let req = codec::decode_object(ct, body)?;
            let answer = st.write_ctx(&ctx, |s| crate::authn::token_request(s, &ns, name, &req))?;
            Ok(json_response(201, &answer))
        }
        ("POST", Some(name), Some("eviction")) => {
            let ev = codec::decode_object(ct, body)?;
            st.write_ctx(&ctx, |s| crate::eviction::evict(s, r, &ns, name, &ev))?;
            Ok(json_response(201, &success_status(201, None)))
        }
        ("PUT", Some(name), None | Some("status")) => {
            let obj = codec::decode_object(ct, body)?;
            let subres = if sub == Some("status") {
                Subresource::Status
            } else {
                Subresource::Main
            };
            let out = st.write_ctx(&ctx, |s| s.update(r, &ns, name, obj, subres))?;
            Ok(object_response(200, r, &out, accept))
        }
        ("PATCH", Some(name), None | Some("status")) => {
            let ty = PatchType::from_content_type(ct.unwrap_or(""))?;
            let patch_body = patch::parse_body(ty, body)?;
            let subres = if sub == Some("status") {
                Subresource::Status
            } else {
                Subresource::Main
            };
            // Whether it is there, without parsing it.
            let existed = st.read(|s| s.get_stored(r, &ns, name).is_ok());
            let out = if !existed && ty == PatchType::Apply && r.plural == "pods" {
                // Apply-creating a pod goes through admission like any other create.
                let mut obj = patch_body.clone();
                obj["metadata"]["name"] = json!(name);
                create_with_admission(st, &ctx, p.user.as_ref(), r, rr.namespace.as_deref(), obj)
                    .await?
            } else {
                st.write_ctx(&ctx, |s| {
                    s.patch_committed(r, &ns, name, ty, &patch_body, subres)
                })?
            };
            let code = if existed { 200 } else { 201 };
            Ok(committed_response(code, r, &out, accept))
        }
        ("DELETE", Some(name), None) => {
            let opts = codec::decode_delete_options(ct, body)?;
            let out = st.write_ctx(&ctx, |s| s.delete(r, &ns, name, &opts))?;
            Ok(object_response(200, r, &out, accept))
        }
        ("DELETE", None, None) => {
            let opts = list_options(r, &p)?;
            let deleted = st.write_ctx(&ctx, |s| {
                let page = s.list(r, rr.namespace.as_deref(), &opts)?;
                let mut out = Vec::new();
                for obj in page.items {
                    let (ons, oname) = (obj.namespace().to_string(), obj.name().to_string());
                    out.push(s.delete(r, &ons, &oname, &DeleteOptions::default())?);
                }
                Ok((out, s.resource_version()))
            })?;
            let items: Vec<Value> = deleted.0.iter().map(|v| (**v).clone()).collect();
            Ok(json_response(
                200,
                &json!({"kind": r.list_kind(), "apiVersion": r.api_version(), "metadata": {"resourceVersion": deleted.1.to_string()}, "items": items}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            rr.resource_path()
        ))),
    }
}

/// `dryRun=All` of an update, patch or delete: the write is validated and answered as if
/// done, but nothing is stored, watched or persisted (one no webhook's rule names; the
/// others go through [`update_with_admission`]).
fn dry_run_request(
    st: &Arc<AppState>,
    ctx: &WriteContext,
    method: &Method,
    rr: ResourceRoute,
    ct: Option<&str>,
    accept: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let ns = store_ns(&rr).to_string();
    let sub = if rr.subresource.as_deref() == Some("status") {
        Subresource::Status
    } else {
        Subresource::Main
    };
    let name = rr.name.clone();
    let outcome = st.write_ctx(ctx, |s| {
        match (method.as_str(), name.as_deref(), rr.subresource.as_deref()) {
            ("PUT", Some(n), None | Some("status")) => codec::decode_object(ct, body)
                .and_then(|o| s.update(r, &ns, n, o, sub))
                .map(|v| (200, v)),
            ("PATCH", Some(n), None | Some("status")) => {
                PatchType::from_content_type(ct.unwrap_or(""))
                    .and_then(|ty| patch::parse_body(ty, body).map(|b| (ty, b)))
                    .and_then(|(ty, b)| s.patch(r, &ns, n, ty, &b, sub))
                    .map(|v| (200, v))
            }
            ("DELETE", Some(n), None) => s
                .delete(r, &ns, n, &DeleteOptions::default())
                .map(|v| (200, v)),
            _ => Err(ApiError::bad_request(format!(
                "dryRun is not supported for {method} {}",
                rr.resource_path()
            ))),
        }
    })?;
    Ok(object_response(outcome.0, r, &outcome.1, accept))
}
