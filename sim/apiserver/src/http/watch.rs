//! WATCH: the stream of one watch: initial events, the store's broadcast filtered by
//! selectors, bookmarks, a deadline, and a 410 ERROR frame for a consumer that fell behind.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast;

use crate::resources::ResourceType;
use crate::route::ResourceRoute;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{EventType, WatchEvent};
use crate::stored::StoredObject;
use crate::table;
use crate::watch::{self, WatchFilter};

use super::{AppState, Params};

struct WatchStream {
    queue: VecDeque<String>,
    rx: broadcast::Receiver<Arc<WatchEvent>>,
    filter: WatchFilter,
    deadline: tokio::time::Instant,
    closer: tokio::sync::watch::Receiver<u64>,
    bookmarks: Option<tokio::time::Interval>,
    last_rv: u64,
    done: bool,
    /// Send each object as a one-row Table (`kubectl get -w`).
    table: bool,
}

/// One watch frame; for Table watches the object is rendered as a one-row Table.
fn frame_for(table: bool, r: &ResourceType, t: EventType, obj: &StoredObject) -> String {
    if table {
        let t_obj = table::table(r, &[&obj.to_value()], None, None);
        return watch::event_frame(t, &t_obj.to_string());
    }
    watch::event_frame(t, &obj.json)
}

async fn next_frame(mut ws: WatchStream) -> Option<(Result<Bytes, Infallible>, WatchStream)> {
    if let Some(f) = ws.queue.pop_front() {
        return Some((Ok(Bytes::from(f)), ws));
    }
    if ws.done {
        return None;
    }
    loop {
        let bookmark = async {
            match ws.bookmarks.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(ws.deadline) => return None,
            _ = ws.closer.changed() => return None,
            _ = bookmark => {
                let f = watch::bookmark_frame(ws.filter.resource, ws.last_rv, false);
                return Some((Ok(Bytes::from(f)), ws));
            }
            ev = ws.rx.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= ws.last_rv {
                        continue;
                    }
                    ws.last_rv = ev.rv;
                    if let Some(t) = ws.filter.classify(&ev) {
                        let f = frame_for(ws.table, ws.filter.resource, t, &ev.object);
                        return Some((Ok(Bytes::from(f)), ws));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow a consumer: end with 410 so that it relists, as the real server does.
                    ws.done = true;
                    let e = ApiError::expired(format!("too old resource version: {} (watcher fell behind)", ws.last_rv));
                    return Some((Ok(Bytes::from(watch::error_frame(&e))), ws));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

pub(super) fn watch_request(
    st: &Arc<AppState>,
    rr: &ResourceRoute,
    p: Params,
    accept: &str,
) -> Result<Response, ApiError> {
    let r = rr.resource;
    let table = table::wants_table(accept);
    let mut fields = FieldSelector::parse(&p.field_selector, r.plural)?;
    if let Some(name) = &rr.name {
        fields.0.push(("metadata.name".into(), true, name.clone()));
    }
    let filter = WatchFilter {
        resource: r,
        namespace: rr.namespace.clone(),
        labels: LabelSelector::parse(&p.label_selector)?,
        fields,
    };
    let from: Option<u64> = match p.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(v) => Some(v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be a number"
            ))
        })?),
    };
    let timeout = p
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(st.default_watch_timeout);
    let start = st.store.watch(&filter, from, p.send_initial_events)?;
    let mut queue: VecDeque<String> = start
        .initial
        .iter()
        .map(|(t, obj)| frame_for(table, r, *t, obj))
        .collect();
    if let (Some(rv), true) = (start.listed_at, p.send_initial_events && p.allow_bookmarks) {
        queue.push_back(watch::bookmark_frame(r, rv, true));
    }
    if let Some(e) = &start.expired {
        // Kubernetes answers 200 and sends the 410 as an ERROR event.
        queue.push_back(watch::error_frame(e));
    }
    if start.expired.is_some() || start.stopping {
        // Stopping: the stream ends at once (clients re-watch elsewhere).
        let ws = WatchStream {
            queue,
            rx: start.rx,
            filter,
            deadline: tokio::time::Instant::now(),
            closer: start.closer,
            bookmarks: None,
            last_rv: start.last_rv,
            done: true,
            table,
        };
        return Ok(stream_response(ws));
    }
    let (rx, closer, last_rv) = (start.rx, start.closer, start.last_rv);
    let bookmarks = p.allow_bookmarks.then(|| {
        let mut i = tokio::time::interval_at(
            tokio::time::Instant::now() + st.bookmark_interval,
            st.bookmark_interval,
        );
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let ws = WatchStream {
        queue,
        rx,
        filter,
        deadline: tokio::time::Instant::now() + timeout,
        closer,
        bookmarks,
        last_rv,
        done: false,
        table,
    };
    Ok(stream_response(ws))
}

fn stream_response(ws: WatchStream) -> Response {
    let stream = futures::stream::unfold(ws, next_frame);
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}
