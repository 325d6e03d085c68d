//! LIST (and the options a delete-collection shares): selectors and pages, answered as
//! JSON assembled outside the store lock, or as a Table for kubectl.

use std::sync::Arc;

use axum::response::Response;
use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::route::ResourceRoute;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::ListOptions;
use crate::table;

use super::{AppState, Params, bytes_response, json_response};

pub(super) fn list_options(r: &ResourceType, p: &Params) -> Result<ListOptions, ApiError> {
    Ok(ListOptions {
        labels: LabelSelector::parse(&p.label_selector)?,
        fields: FieldSelector::parse(&p.field_selector, r.plural)?,
        limit: p.limit,
        continue_token: p.continue_token.clone(),
    })
}

pub(super) fn list_request(
    st: &Arc<AppState>,
    rr: &ResourceRoute,
    p: &Params,
    accept: &str,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let opts = list_options(r, p)?;
    let page = st.read(|s| s.list(r, rr.namespace.as_deref(), &opts))?;
    if table::wants_table(accept) {
        let values: Vec<Value> = page.items.iter().map(|v| v.to_value()).collect();
        let refs: Vec<&Value> = values.iter().collect();
        return Ok(json_response(
            200,
            &table::table(
                r,
                &refs,
                Some(page.resource_version),
                page.continue_token.as_deref(),
            ),
        ));
    }
    // Assemble the list by hand: items are serialised once, outside the store lock.
    let mut out = Vec::with_capacity(64 + page.items.len() * 1024);
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            r.list_kind(),
            r.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.json.as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(200, out))
}
