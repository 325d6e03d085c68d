//! A bounded log of the requests the server answered, for tests to assert on.

use std::collections::VecDeque;
use std::sync::Mutex;

/// One answered request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The HTTP method.
    pub method: String,
    /// The URL path, without the query.
    pub path: String,
    /// The query string, without the `?`; empty when there is none.
    pub query: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, ...) or `discovery`/`other`.
    pub verb: String,
    /// API group of the resource (`""` for core, and for non-resource paths).
    pub api_group: String,
    /// Resource plural with subresource (`pods/binding`), empty for non-resource paths.
    pub resource: String,
    /// The namespace of the URL, if any.
    pub namespace: Option<String>,
    /// The object name of the URL, if any.
    pub name: Option<String>,
    /// The request's Content-Type header.
    pub content_type: Option<String>,
    /// The request's User-Agent header (tells apart the clients of one test).
    pub user_agent: Option<String>,
    /// The authenticated user (`system:serviceaccount:<ns>:<name>`, ...); None when
    /// authentication is off.
    pub user: Option<String>,
    /// The request body, cut to the first 16 KiB.
    pub body: String,
    /// The HTTP status answered.
    pub status: u16,
}

const MAX_BODY: usize = 16 * 1024;

/// The last `capacity` requests answered; older ones are dropped as new ones come.
#[derive(Debug)]
pub struct RequestLog {
    records: Mutex<VecDeque<RequestRecord>>,
    capacity: usize,
}

impl RequestLog {
    /// An empty log keeping at most `capacity` records.
    pub fn new(capacity: usize) -> RequestLog {
        RequestLog {
            records: Mutex::new(VecDeque::new()),
            capacity,
        }
    }

    /// Records `rec`, its body cut to 16 KiB, dropping the oldest record when full.
    pub fn push(&self, mut rec: RequestRecord) {
        if rec.body.len() > MAX_BODY {
            let mut cut = MAX_BODY;
            while !rec.body.is_char_boundary(cut) {
                cut -= 1;
            }
            rec.body.truncate(cut);
        }
        let mut r = self.records.lock().unwrap_or_else(|p| p.into_inner());
        r.push_back(rec);
        while r.len() > self.capacity {
            r.pop_front();
        }
    }

    /// A copy of the records, oldest first.
    pub fn records(&self) -> Vec<RequestRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Records kept.
    pub fn len(&self) -> usize {
        self.records.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// No record is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every record.
    pub fn clear(&self) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
