//! Every non-core config file we ship, checked field by field against the UPSTREAM types.
//!
//! The only one is kube-scheduler's `KubeSchedulerConfiguration`
//! (`kubescheduler.config.k8s.io/v1`), mounted from the `hami-kube-scheduler-config`
//! ConfigMap. kube-scheduler decodes it strictly and case-sensitively (sigs.k8s.io/json):
//! an unknown or misspelt field is fatal and the sidecar crash-loops. The schema below is
//! written from kubernetes' `staging/src/k8s.io/kube-scheduler/config/v1/types.go` and
//! `staging/src/k8s.io/component-base/config/v1alpha1/types.go` (the json tags, verbatim),
//! independently of our serde structs, so our serializer cannot agree with itself again.
//! Both the typed rendering and Helm's rendering of the chart are checked.

use crate::peers::Case;
use hami_manifests::settings::{KubeVersion, Settings, TlsMode};
use serde_json::{Value, json};

/// The Go field types that occur in these structs.
#[derive(Clone, Copy)]
enum Ty {
    Bool,
    Str,
    Int32,
    Int64,
    Float32,
    /// metav1.Duration: a Go `time.ParseDuration` string.
    Duration,
    /// []byte: base64 in JSON.
    Bytes,
    /// runtime.RawExtension: any JSON object.
    Raw,
    Struct(&'static [(&'static str, Ty)]),
    List(&'static Ty),
}

use Ty::*;

const LEADER_ELECTION: &[(&str, Ty)] = &[
    ("leaderElect", Bool),
    ("leaseDuration", Duration),
    ("renewDeadline", Duration),
    ("retryPeriod", Duration),
    ("resourceLock", Str),
    ("resourceName", Str),
    ("resourceNamespace", Str),
];
const CLIENT_CONNECTION: &[(&str, Ty)] = &[
    ("kubeconfig", Str),
    ("acceptContentTypes", Str),
    ("contentType", Str),
    ("qps", Float32),
    ("burst", Int32),
];
const PLUGIN: &[(&str, Ty)] = &[("name", Str), ("weight", Int32)];
const PLUGIN_SET: &[(&str, Ty)] = &[
    ("enabled", List(&Struct(PLUGIN))),
    ("disabled", List(&Struct(PLUGIN))),
];
const PLUGINS: &[(&str, Ty)] = &[
    ("preEnqueue", Struct(PLUGIN_SET)),
    ("queueSort", Struct(PLUGIN_SET)),
    ("preFilter", Struct(PLUGIN_SET)),
    ("filter", Struct(PLUGIN_SET)),
    ("postFilter", Struct(PLUGIN_SET)),
    ("preScore", Struct(PLUGIN_SET)),
    ("score", Struct(PLUGIN_SET)),
    ("reserve", Struct(PLUGIN_SET)),
    ("permit", Struct(PLUGIN_SET)),
    ("preBind", Struct(PLUGIN_SET)),
    ("bind", Struct(PLUGIN_SET)),
    ("postBind", Struct(PLUGIN_SET)),
    ("multiPoint", Struct(PLUGIN_SET)),
];
const PLUGIN_CONFIG: &[(&str, Ty)] = &[("name", Str), ("args", Raw)];
const PROFILE: &[(&str, Ty)] = &[
    ("schedulerName", Str),
    ("percentageOfNodesToScore", Int32),
    ("plugins", Struct(PLUGINS)),
    ("pluginConfig", List(&Struct(PLUGIN_CONFIG))),
];
const TLS_CONFIG: &[(&str, Ty)] = &[
    ("insecure", Bool),
    ("serverName", Str),
    ("certFile", Str),
    ("keyFile", Str),
    ("caFile", Str),
    ("certData", Bytes),
    ("keyData", Bytes),
    ("caData", Bytes),
];
const MANAGED_RESOURCE: &[(&str, Ty)] = &[("name", Str), ("ignoredByScheduler", Bool)];
const EXTENDER: &[(&str, Ty)] = &[
    ("urlPrefix", Str),
    ("filterVerb", Str),
    ("preemptVerb", Str),
    ("prioritizeVerb", Str),
    ("weight", Int64),
    ("bindVerb", Str),
    ("enableHTTPS", Bool),
    ("tlsConfig", Struct(TLS_CONFIG)),
    ("httpTimeout", Duration),
    ("nodeCacheCapable", Bool),
    ("managedResources", List(&Struct(MANAGED_RESOURCE))),
    ("ignorable", Bool),
];
/// `KubeSchedulerConfiguration`: TypeMeta and the inlined DebuggingConfiguration included.
const CONFIGURATION: &[(&str, Ty)] = &[
    ("apiVersion", Str),
    ("kind", Str),
    ("parallelism", Int32),
    ("leaderElection", Struct(LEADER_ELECTION)),
    ("clientConnection", Struct(CLIENT_CONNECTION)),
    ("enableProfiling", Bool),
    ("enableContentionProfiling", Bool),
    ("percentageOfNodesToScore", Int32),
    ("podInitialBackoffSeconds", Int64),
    ("podMaxBackoffSeconds", Int64),
    ("profiles", List(&Struct(PROFILE))),
    ("extenders", List(&Struct(EXTENDER))),
    ("delayCacheUntilActive", Bool),
];

/// Go's `time.ParseDuration`: one or more `<decimal><unit>`.
fn go_duration(s: &str) -> bool {
    let mut rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest == "0" {
        return true;
    }
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if n == 0 {
            return false;
        }
        rest = &rest[n..];
        let unit = ["ns", "us", "µs", "ms", "s", "m", "h"]
            .iter()
            .filter(|u| rest.starts_with(**u))
            .max_by_key(|u| u.len());
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

/// Every way `v` breaks the upstream type `ty`, with its JSON path.
fn check(v: &Value, ty: Ty, path: &str, out: &mut Vec<String>) {
    let bad = |what: &str, out: &mut Vec<String>| out.push(format!("{path}: {what}, got {v}"));
    match ty {
        Bool => {
            if !v.is_boolean() {
                bad("want a bool", out)
            }
        }
        Str => {
            if !v.is_string() {
                bad("want a string", out)
            }
        }
        Int32 => {
            if v.as_i64().is_none_or(|n| i32::try_from(n).is_err()) {
                bad("want an int32", out)
            }
        }
        Int64 => {
            if v.as_i64().is_none() {
                bad("want an int64", out)
            }
        }
        Float32 => {
            if !v.is_number() {
                bad("want a number", out)
            }
        }
        Duration => {
            if !v.as_str().is_some_and(go_duration) {
                bad("want a Go duration such as 30s", out)
            }
        }
        Bytes => {
            if !v.is_string() {
                bad("want base64 bytes", out)
            }
        }
        Raw => {
            if !v.is_object() {
                bad("want an object", out)
            }
        }
        List(item) => match v.as_array() {
            Some(a) => {
                for (i, x) in a.iter().enumerate() {
                    check(x, *item, &format!("{path}[{i}]"), out);
                }
            }
            None => bad("want a list", out),
        },
        Struct(fields) => match v.as_object() {
            Some(m) => {
                for (k, x) in m {
                    match fields.iter().find(|(name, _)| name == k) {
                        Some((_, t)) => check(x, *t, &format!("{path}.{k}"), out),
                        None => {
                            let near = fields
                                .iter()
                                .find(|(name, _)| name.eq_ignore_ascii_case(k))
                                .map(|(n, _)| format!(" (upstream spells it {n:?})"))
                                .unwrap_or_default();
                            out.push(format!("{path}.{k}: unknown field{near}"));
                        }
                    }
                }
            }
            None => bad("want an object", out),
        },
    }
}

fn problems(config_yaml: &str) -> Vec<String> {
    let v: Value = serde_saphyr::from_str(config_yaml)
        .unwrap_or_else(|e| panic!("KubeSchedulerConfiguration is not YAML: {e}"));
    let mut out = Vec::new();
    check(&v, Struct(CONFIGURATION), "", &mut out);
    if v["apiVersion"] != "kubescheduler.config.k8s.io/v1"
        || v["kind"] != "KubeSchedulerConfiguration"
    {
        out.push(format!(
            "not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration: {} {}",
            v["apiVersion"], v["kind"]
        ));
    }
    // The extender must be usable: the verbs we serve, HTTPS since we serve TLS.
    let ext = &v["extenders"][0];
    for (k, want) in [
        ("filterVerb", json!("filter")),
        ("bindVerb", json!("bind")),
        ("preemptVerb", json!("preempt")),
        ("enableHTTPS", json!(true)),
    ] {
        if ext[k] != want {
            out.push(format!(".extenders[0].{k}: want {want}, got {}", ext[k]));
        }
    }
    out
}

#[test]
fn the_schema_catches_the_shipped_bug_and_its_cousins() {
    let good = hami_manifests::kube_scheduler_config::config_yaml(&Settings::default()).unwrap();
    assert_eq!(problems(&good), Vec::<String>::new());
    for (from, to, needle) in [
        (
            "enableHTTPS",
            "enableHttps",
            "upstream spells it \"enableHTTPS\"",
        ),
        ("nodeCacheCapable", "nodeCachecapable", "unknown field"),
        ("httpTimeout: 30s", "httpTimeout: 30", "Go duration"),
        (
            "ignoredByScheduler: true",
            "ignoredByScheduler: \"true\"",
            "want a bool",
        ),
    ] {
        assert!(good.contains(from), "{from} not in {good}");
        let broken = good.replacen(from, to, 1);
        let p = problems(&broken);
        assert!(p.iter().any(|e| e.contains(needle)), "{to}: {p:?}");
    }
    assert!(
        go_duration("1m30s") && go_duration("300ms") && !go_duration("30") && !go_duration("s")
    );
}

#[test]
fn the_typed_kube_scheduler_config_uses_only_upstream_fields() {
    for kv in crate::peers::kube_versions() {
        for tls in [TlsMode::Certgen, TlsMode::CertManager] {
            let mut s = Settings {
                kube_version: KubeVersion::parse(&kv).unwrap(),
                ..Settings::default()
            };
            s.values.tls.mode = tls;
            let yaml = hami_manifests::kube_scheduler_config::config_yaml(&s).unwrap();
            assert_eq!(problems(&yaml), Vec::<String>::new(), "{kv}: {yaml}");
        }
    }
}

#[test]
fn helms_rendering_of_the_config_uses_only_upstream_fields() {
    let cases: Vec<Case> = crate::peers::kube_versions()
        .iter()
        .flat_map(|kv| {
            [
                Case::new("defaults", "hami-system", kv, json!({})),
                Case::new(
                    "renamed",
                    "gpu",
                    kv,
                    json!({"scheduler": {"schedulerName": "gpu-scheduler", "replicas": 2}, "tls": {"mode": "cert-manager"}}),
                ),
            ]
        })
        .map(|mut c| {
            c.lint = false;
            c.validate = false;
            c
        })
        .collect();
    let answer = crate::peers::run(&cases, &[]);
    for r in &answer.cases {
        assert!(r.error.is_none(), "{}: {:?}", r.name, r.error);
        let configs: Vec<String> = r
            .objects()
            .into_iter()
            .filter(|(_, v)| v["kind"] == "ConfigMap")
            .filter_map(|(_, v)| v["data"]["config.yaml"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            configs.len(),
            1,
            "{}: one KubeSchedulerConfiguration",
            r.name
        );
        assert_eq!(problems(&configs[0]), Vec::<String>::new(), "{}", r.name);
    }
}
