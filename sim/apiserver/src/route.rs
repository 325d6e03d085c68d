//! URL paths to routes: discovery documents or a resource (collection, object, subresource).

use crate::resources::{self, ResourceType};

/// What a URL path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz` and their sub-checks.
    Health,
    /// `/api`: the legacy group's versions.
    ApiVersions,
    /// `/apis`: every named group.
    ApiGroupList,
    /// `/apis/<group>`: one group's versions.
    ApiGroup(String),
    /// `/api/v1` or `/apis/<group>/<version>`: the resources of a group version (group, version).
    ResourceList(String, String),
    /// `/openapi/v2` (and its legacy paths).
    OpenApiV2,
    /// `/openapi/v3`: the index of the v3 documents.
    OpenApiV3Root,
    /// `/openapi/v3/api/<v>` or `/openapi/v3/apis/<g>/<v>`: one group version's document
    /// (group, version).
    OpenApiV3(String, String),
    /// A resource collection, object or subresource.
    Resource(ResourceRoute),
    /// Nothing this server serves: 404.
    NotFound,
}

/// A resource URL, split into what the store needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRoute {
    /// The resource type the URL names.
    pub resource: &'static ResourceType,
    /// The namespace of the URL (`/namespaces/<ns>/...`), None for cluster-wide requests.
    pub namespace: Option<String>,
    /// The object's name, None for a collection.
    pub name: Option<String>,
    /// The subresource after the name (`status`, `binding`, ...).
    pub subresource: Option<String>,
}

impl ResourceRoute {
    /// `pods` or `pods/binding`, the form used in logs and fault rules.
    pub fn resource_path(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.resource.plural),
            None => self.resource.plural.to_string(),
        }
    }
}

fn resource_route(group: &str, version: &str, segs: &[&str]) -> Route {
    let found = |plural: &str| resources::lookup(group, version, plural);
    let mk = |r: &'static ResourceType, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        if ns.is_some() && !r.namespaced {
            return Route::NotFound;
        }
        if let Some(s) = sub
            && !r.subresources.contains(&s)
        {
            return Route::NotFound;
        }
        Route::Resource(ResourceRoute {
            resource: r,
            namespace: ns.map(String::from),
            name: name.map(String::from),
            subresource: sub.map(String::from),
        })
    };
    match segs {
        ["namespaces", ns, plural, rest @ ..] if found(plural).is_some_and(|r| r.namespaced) => {
            let r = found(plural).expect("checked above");
            match rest {
                [] => mk(r, Some(ns), None, None),
                [name] => mk(r, Some(ns), Some(name), None),
                [name, sub] => mk(r, Some(ns), Some(name), Some(sub)),
                _ => Route::NotFound,
            }
        }
        [plural, rest @ ..] => match found(plural) {
            Some(r) => match rest {
                [] => mk(r, None, None, None),
                // A namespaced resource has no cluster-wide object paths.
                [name] if !r.namespaced => mk(r, None, Some(name), None),
                [name, sub] if !r.namespaced => mk(r, None, Some(name), Some(sub)),
                _ => Route::NotFound,
            },
            None => Route::NotFound,
        },
        [] => Route::NotFound,
    }
}

/// Maps a URL path to a route.
pub fn parse(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["livez"] | ["readyz"] => Route::Health,
        ["healthz", ..] | ["livez", ..] | ["readyz", ..] => Route::Health,
        ["api"] => Route::ApiVersions,
        ["apis"] => Route::ApiGroupList,
        ["openapi", "v2"] | ["swagger-2.0.0.pb-v1"] | ["swagger.json"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", "api", v] => Route::OpenApiV3(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApiV3(g.to_string(), v.to_string()),
        ["api", "v1"] => Route::ResourceList(String::new(), "v1".into()),
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis", g] => Route::ApiGroup(g.to_string()),
        ["apis", g, v] => Route::ResourceList(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourceRoute {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn paths() {
        let r = res("/api/v1/namespaces/default/pods/p/binding");
        assert_eq!(
            (
                r.resource.plural,
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            ("pods", Some("default"), Some("p"), Some("binding"))
        );
        let r = res("/api/v1/pods");
        assert!(r.namespace.is_none() && r.name.is_none());
        let r = res("/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.resource.plural, r.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        let r = res("/api/v1/namespaces/x/status");
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = res("/api/v1/nodes/n1/status");
        assert_eq!(
            (r.resource.plural, r.subresource.as_deref()),
            ("nodes", Some("status"))
        );
        let r = res("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l");
        assert_eq!(r.resource.kind, "Lease");
        assert_eq!(parse("/api/v1/pods/p"), Route::NotFound);
        assert_eq!(parse("/api/v1/namespaces/default/nodes"), Route::NotFound);
        assert_eq!(parse("/api/v1/nodes/n/binding"), Route::NotFound);
        assert_eq!(parse("/apis/apps/v1/deployments"), Route::NotFound);
        assert_eq!(
            parse("/apis/events.k8s.io/v1"),
            Route::ResourceList("events.k8s.io".into(), "v1".into())
        );
        assert_eq!(
            parse("/openapi/v3/apis/coordination.k8s.io/v1"),
            Route::OpenApiV3("coordination.k8s.io".into(), "v1".into())
        );
    }
}
