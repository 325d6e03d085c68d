//! A bounded log of the requests the server answered, for tests to assert on.

use std::collections::VecDeque;
use std::sync::Mutex;

/// One answered request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, ...) or `discovery`/`other`.
    pub verb: String,
    /// API group of the resource (`""` for core, and for non-resource paths).
    pub api_group: String,
    /// Resource plural with subresource (`pods/binding`), empty for non-resource paths.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
    /// The authenticated user (`system:serviceaccount:<ns>:<name>`, ...); None when
    /// authentication is off.
    pub user: Option<String>,
    /// The request body, cut to the first 16 KiB.
    pub body: String,
    pub status: u16,
}

const MAX_BODY: usize = 16 * 1024;

#[derive(Debug)]
pub struct RequestLog {
    records: Mutex<VecDeque<RequestRecord>>,
    capacity: usize,
}

impl RequestLog {
    pub fn new(capacity: usize) -> RequestLog {
        RequestLog {
            records: Mutex::new(VecDeque::new()),
            capacity,
        }
    }

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

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
