//! The real kubectl against the embedded server, every version on the machine: the PATH's
//! kubectl and `kubectl.1.27` … `kubectl.1.33` beside it (the Google Cloud SDK layout).
//! kubectl 1.32+ sends typed creates (`kubectl create namespace|configmap|secret|…`) as
//! protobuf; older ones as JSON. Each version runs create -f, every `kubectl create`
//! generator of the served kinds (and `create token`), apply (client- and server-side),
//! patch (merge, JSON, strategic), get, describe, get -w, cordon/drain (evictions) and delete.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The versions the matrix covers (`kubectl.1.N` beside the PATH's kubectl).
const MINORS: std::ops::RangeInclusive<u32> = 27..=33;

/// The PATH's kubectl, resolved (the SDK's is a dispatcher in the SDK's bin directory).
fn path_kubectl() -> PathBuf {
    let which = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("kubectl")).find(|k| k.is_file()))
        .expect("kubectl is not on PATH: these tests need the Google Cloud SDK's kubectl with kubectl.1.27 ... kubectl.1.33 beside it");
    std::fs::canonicalize(&which).expect("resolve kubectl")
}

/// `kubectl.1.<minor>` beside the PATH's kubectl; a clear failure when it is absent.
fn kubectl_minor(minor: u32) -> PathBuf {
    let real = path_kubectl();
    let dir = real.parent().expect("kubectl dir");
    let bin = dir.join(format!("kubectl.1.{minor}"));
    assert!(
        bin.is_file(),
        "kubectl.1.{minor} is absent from {} (the matrix needs kubectl.1.27 ... kubectl.1.33 there; install the Google Cloud SDK's kubectl components)",
        dir.display()
    );
    bin
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd.env("HOME", self.kubeconfig.parent().unwrap()); // a private discovery cache
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn kubectl");
        if let Some(input) = stdin {
            use tokio::io::AsyncWriteExt;
            let mut i = child.stdin.take().unwrap();
            i.write_all(input.as_bytes()).await.unwrap();
            drop(i);
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finished")
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args, None).await;
        assert!(ok, "{} {args:?} failed:\n{out}\n{err}", self.bin.display());
        out
    }

    async fn ok_stdin(&self, args: &[&str], input: &str) -> String {
        let (ok, out, err) = self.run(args, Some(input)).await;
        assert!(ok, "{} {args:?} failed:\n{out}\n{err}", self.bin.display());
        out
    }
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  containers:
  - name: main
    image: nginx:1.25
    env:
    - name: A
      value: \"1\"
";

async fn exercise(bin: &Path, minor: u32) {
    let server = common::start().await;
    let dir = std::env::temp_dir().join(format!(
        "hami-apiserver-kubectl-{}",
        hami_apiserver::meta::new_uid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let k = Kubectl {
        bin: bin.to_path_buf(),
        kubeconfig,
    };
    let pod_file = dir.join("pod.yaml");
    std::fs::write(&pod_file, POD).unwrap();
    let pod_path = pod_file.to_str().unwrap();

    let ns = k.ok(&["get", "namespaces"]).await;
    assert!(ns.contains("kube-system") && ns.contains("Active"), "{ns}");
    assert!(
        k.ok(&["create", "-f", pod_path])
            .await
            .contains("pod/web created")
    );
    let (ok, _, err) = k.run(&["create", "-f", pod_path], None).await;
    assert!(!ok && err.contains("AlreadyExists"), "{err}");
    let table = k.ok(&["get", "pods"]).await;
    assert!(
        table.contains("NAME") && table.contains("web") && table.contains("Pending"),
        "{table}"
    );

    k.ok(&["annotate", "pod", "web", "hami.io/note=hello"])
        .await;
    k.ok(&["label", "pod", "web", "tier=gpu"]).await;
    k.ok(&[
        "patch",
        "pod",
        "web",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"merged":"yes"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "pod",
        "web",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/json","value":"yes"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "pod",
        "web",
        "--type",
        "strategic",
        "-p",
        r#"{"spec":{"containers":[{"name":"main","image":"nginx:1.26"}]}}"#,
    ])
    .await;
    let pod = server.get_object("v1", "pods", "default", "web").unwrap();
    assert_eq!(pod["metadata"]["annotations"]["hami.io/note"], "hello");
    for l in ["tier", "merged", "json"] {
        assert!(
            pod["metadata"]["labels"].get(l).is_some(),
            "label {l} missing: {pod}"
        );
    }
    assert_eq!(pod["spec"]["containers"][0]["image"], "nginx:1.26");
    assert_eq!(pod["spec"]["containers"][0]["env"][0]["name"], "A");

    let described = k.ok(&["describe", "pod", "web"]).await;
    assert!(
        described.contains("nginx:1.26") && described.contains("hami.io/note"),
        "{described}"
    );
    let labels = k
        .ok(&["get", "pods", "-l", "tier in (gpu),json", "-o", "name"])
        .await;
    assert_eq!(labels.trim(), "pod/web");

    // apply: create a ConfigMap, then change it (a strategic merge patch computed by kubectl)
    let cm =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: \"1\"\n  b: \"2\"\n";
    assert!(
        k.ok_stdin(&["apply", "-f", "-"], cm)
            .await
            .contains("configmap/cfg created")
    );
    let cm2 =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: \"1\"\n  c: \"3\"\n";
    assert!(
        k.ok_stdin(&["apply", "-f", "-"], cm2)
            .await
            .contains("configmap/cfg configured")
    );
    let cfg = server
        .get_object("v1", "configmaps", "default", "cfg")
        .unwrap();
    assert_eq!(
        cfg["data"],
        serde_json::json!({"a": "1", "c": "3"}),
        "apply removed b and added c"
    );
    assert!(
        cfg["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    // server-side apply, with a conflict between field managers and --force-conflicts
    let ssa = |v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  a: \"{v}\"\n")
    };
    assert!(
        k.ok_stdin(&["apply", "--server-side", "-f", "-"], &ssa("1"))
            .await
            .contains("serverside-applied")
    );
    let (ok, _, err) = k
        .run(
            &[
                "apply",
                "--server-side",
                "--field-manager",
                "other",
                "-f",
                "-",
            ],
            Some(&ssa("2")),
        )
        .await;
    assert!(!ok && err.contains("conflict with \"kubectl\""), "{err}");
    k.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &ssa("2"),
    )
    .await;
    assert_eq!(
        server
            .get_object("v1", "configmaps", "default", "ssa")
            .unwrap()["data"]["a"],
        "2"
    );

    // apply on an object created without it (the warning path real clusters print too)
    k.ok(&["apply", "-f", pod_path]).await;

    // get -w: an added pod shows up on the running watch, printed from server-side Tables
    let mut child = Command::new(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["get", "pods", "-w"])
        .env("HOME", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_default()
    };
    let header = next_line().await;
    assert!(
        header.starts_with("NAME") && header.contains("STATUS") && header.contains("RESTARTS"),
        "{header}"
    );
    let first = next_line().await;
    assert!(
        first.starts_with("web ") && first.contains("Pending"),
        "{first}"
    );
    server
        .create_object("v1", "pods", Some("default"), serde_json::json!({"metadata": {"name": "late"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap();
    let next = next_line().await;
    assert!(
        next.starts_with("late ") && next.contains("0/1") && next.contains("Pending"),
        "{next}"
    );
    child.kill().await.unwrap();

    generators(&server, &k, &dir, minor).await;
    drain(&server, &k, minor).await;

    assert!(
        k.ok(&["delete", "pod", "web"])
            .await
            .contains("pod \"web\" deleted")
    );
    let (ok, _, err) = k.run(&["get", "pod", "web"], None).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

macro_rules! matrix {
    ($($name:ident => $minor:expr),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            exercise(&kubectl_minor($minor), $minor).await;
        }
    )*};
}

matrix! {
    kubectl_1_27 => 27,
    kubectl_1_28 => 28,
    kubectl_1_29 => 29,
    kubectl_1_30 => 30,
    kubectl_1_31 => 31,
    kubectl_1_32 => 32,
    kubectl_1_33 => 33,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_on_path() {
    let bin = path_kubectl();
    let out = std::process::Command::new(&bin)
        .args(["version", "--client", "-o", "json"])
        .output()
        .expect("kubectl version");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("version JSON");
    let minor: u32 = v["clientVersion"]["minor"]
        .as_str()
        .and_then(|m| m.trim_end_matches('+').parse().ok())
        .expect("client minor version");
    assert!(MINORS.contains(&minor), "kubectl on PATH is 1.{minor}");
    exercise(&bin, minor).await;
}

/// Every imperative `kubectl create` generator of a kind this server serves; what each
/// stored is checked against what kubectl was asked for. kubectl >= 1.32 sends them as
/// protobuf, which the request log must show.
async fn generators(
    server: &hami_apiserver::RunningApiServer,
    k: &Kubectl,
    dir: &Path,
    minor: u32,
) {
    let (cert, key) = {
        let c = rcgen::generate_simple_self_signed(vec!["tls.example".to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    };
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    server.clear_request_log();
    let created: &[(&[&str], &str)] = &[
        (&["create", "namespace", "gen"], "namespace/gen created"),
        (
            &[
                "create",
                "configmap",
                "cfg1",
                "-n",
                "gen",
                "--from-literal=a=1",
                "--from-literal=empty=",
            ],
            "configmap/cfg1 created",
        ),
        (
            &[
                "create",
                "secret",
                "generic",
                "s1",
                "-n",
                "gen",
                "--from-literal=k=v",
                "--type=example.com/t",
            ],
            "secret/s1 created",
        ),
        (
            &[
                "create",
                "secret",
                "tls",
                "t1",
                "-n",
                "gen",
                &format!("--cert={}", cert_file.display()),
                &format!("--key={}", key_file.display()),
            ],
            "secret/t1 created",
        ),
        (
            &[
                "create",
                "secret",
                "docker-registry",
                "reg1",
                "-n",
                "gen",
                "--docker-server=registry.example",
                "--docker-username=u",
                "--docker-password=p",
            ],
            "secret/reg1 created",
        ),
        (
            &["create", "serviceaccount", "sa1", "-n", "gen"],
            "serviceaccount/sa1 created",
        ),
        (
            &["create", "quota", "q1", "-n", "gen", "--hard=cpu=1,pods=2"],
            "resourcequota/q1 created",
        ),
        (
            &[
                "create",
                "role",
                "r1",
                "-n",
                "gen",
                "--verb=get,list",
                "--resource=pods",
                "--resource-name=web",
            ],
            "role.rbac.authorization.k8s.io/r1 created",
        ),
        (
            &[
                "create",
                "rolebinding",
                "rb1",
                "-n",
                "gen",
                "--role=r1",
                "--user=alice",
                "--group=devs",
            ],
            "rolebinding.rbac.authorization.k8s.io/rb1 created",
        ),
        (
            &[
                "create",
                "clusterrole",
                "cr1",
                "--verb=get",
                "--resource=nodes,pods/status",
                "--non-resource-url=/healthz",
            ],
            "clusterrole.rbac.authorization.k8s.io/cr1 created",
        ),
        (
            &[
                "create",
                "clusterrolebinding",
                "crb1",
                "--clusterrole=cr1",
                "--serviceaccount=gen:sa1",
            ],
            "clusterrolebinding.rbac.authorization.k8s.io/crb1 created",
        ),
    ];
    for (args, want) in created {
        let out = k.ok(args).await;
        assert!(out.contains(want), "kubectl 1.{minor} {args:?}: {out}");
    }
    let obj = |av: &str, plural: &str, ns: &str, name: &str| {
        server
            .get_object(av, plural, ns, name)
            .unwrap_or_else(|| panic!("kubectl 1.{minor}: {plural} {ns}/{name} not stored"))
    };
    assert_eq!(
        obj("v1", "namespaces", "", "gen")["metadata"]["name"],
        "gen"
    );
    assert_eq!(
        obj("v1", "configmaps", "gen", "cfg1")["data"],
        serde_json::json!({"a": "1", "empty": ""})
    );
    let s1 = obj("v1", "secrets", "gen", "s1");
    assert_eq!(
        (s1["type"].as_str(), s1["data"]["k"].as_str()),
        (Some("example.com/t"), Some("dg=="))
    );
    let t1 = obj("v1", "secrets", "gen", "t1");
    assert_eq!(t1["type"], "kubernetes.io/tls");
    let b64 = |v: &serde_json::Value| -> Vec<u8> {
        serde_json::from_value::<k8s_openapi::ByteString>(v.clone())
            .unwrap()
            .0
    };
    assert_eq!(b64(&t1["data"]["tls.crt"]), cert.as_bytes());
    assert_eq!(b64(&t1["data"]["tls.key"]), key.as_bytes());
    let reg = obj("v1", "secrets", "gen", "reg1");
    assert_eq!(reg["type"], "kubernetes.io/dockerconfigjson");
    let cfg: serde_json::Value =
        serde_json::from_slice(&b64(&reg["data"][".dockerconfigjson"])).unwrap();
    assert_eq!(cfg["auths"]["registry.example"]["username"], "u");
    assert_eq!(
        obj("v1", "serviceaccounts", "gen", "sa1")["metadata"]["namespace"],
        "gen"
    );
    assert_eq!(
        obj("v1", "resourcequotas", "gen", "q1")["spec"]["hard"],
        serde_json::json!({"cpu": "1", "pods": "2"})
    );
    let rbac = "rbac.authorization.k8s.io/v1";
    assert_eq!(
        obj(rbac, "roles", "gen", "r1")["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "resourceNames": ["web"], "verbs": ["get", "list"]}])
    );
    let rb = obj(rbac, "rolebindings", "gen", "rb1");
    assert_eq!(
        rb["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r1"})
    );
    assert_eq!(
        rb["subjects"],
        serde_json::json!([
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "devs"}
        ])
    );
    let cr = obj(rbac, "clusterroles", "", "cr1");
    let rules = cr["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["nonResourceURLs"] == serde_json::json!(["/healthz"])),
        "{cr}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == serde_json::json!(["nodes", "pods/status"])),
        "{cr}"
    );
    assert_eq!(
        obj(rbac, "clusterrolebindings", "", "crb1")["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "sa1", "namespace": "gen"}])
    );
    // Which encoding kubectl used: protobuf from 1.32 on.
    let protobuf_posts = server
        .request_log()
        .iter()
        .filter(|r| r.method == "POST")
        .filter(|r| {
            r.content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"))
        })
        .count();
    if minor >= 32 {
        assert_eq!(
            protobuf_posts,
            created.len(),
            "kubectl 1.{minor} sends typed creates as protobuf"
        );
    }
    // `kubectl create token`: the serviceaccounts/token subresource.
    server.clear_request_log();
    let token = k
        .ok(&["create", "token", "sa1", "-n", "gen", "--duration=2h"])
        .await;
    let secret = obj("v1", "secrets", "gen", "sa1-token");
    assert_eq!(
        b64(&secret["data"]["token"]),
        token.trim().as_bytes(),
        "kubectl 1.{minor}"
    );
    let post = server
        .request_log()
        .into_iter()
        .find(|r| r.method == "POST")
        .expect("the token request");
    assert_eq!(post.resource, "serviceaccounts/token");
    if minor >= 32 {
        assert!(
            post.content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf")),
            "{post:?}"
        );
    }
    // Shown back by get (Tables), then deleted; the namespace takes its objects along.
    let listed = k
        .ok(&[
            "get",
            "configmaps,secrets,serviceaccounts,resourcequotas,roles,rolebindings",
            "-n",
            "gen",
            "-o",
            "name",
        ])
        .await;
    for want in [
        "configmap/cfg1",
        "secret/s1",
        "secret/t1",
        "secret/reg1",
        "serviceaccount/sa1",
        "resourcequota/q1",
        "role.rbac.authorization.k8s.io/r1",
        "rolebinding.rbac.authorization.k8s.io/rb1",
    ] {
        assert!(
            listed.lines().any(|l| l == want),
            "kubectl 1.{minor}: {want} missing from:\n{listed}"
        );
    }
    let described = k.ok(&["describe", "secret", "t1", "-n", "gen"]).await;
    assert!(
        described.contains("kubernetes.io/tls") && described.contains("tls.crt"),
        "{described}"
    );
    k.ok(&["delete", "clusterrolebinding", "crb1"]).await;
    k.ok(&["delete", "clusterrole/cr1"]).await;
    let out = k.ok(&["delete", "namespace", "gen"]).await;
    assert!(out.contains("namespace \"gen\" deleted"), "{out}");
    assert!(
        server
            .get_object("v1", "configmaps", "gen", "cfg1")
            .is_none()
    );
    assert!(server.get_object(rbac, "clusterroles", "", "cr1").is_none());
}

/// cordon (a patch), drain (evictions; kubectl sends them as JSON in every version), uncordon.
async fn drain(server: &hami_apiserver::RunningApiServer, k: &Kubectl, minor: u32) {
    server
        .create_object(
            "v1",
            "nodes",
            None,
            serde_json::json!({"metadata": {"name": "n-drain"}}),
        )
        .unwrap();
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            serde_json::json!({"metadata": {"name": "on-node"}, "spec": {"nodeName": "n-drain", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
    let node = || server.get_object("v1", "nodes", "", "n-drain").unwrap();
    k.ok(&["cordon", "n-drain"]).await;
    assert_eq!(node()["spec"]["unschedulable"], true, "kubectl 1.{minor}");
    server.clear_request_log();
    let out = k
        .ok(&[
            "drain",
            "n-drain",
            "--force",
            "--grace-period=0",
            "--timeout=30s",
        ])
        .await;
    assert!(out.contains("drained"), "kubectl 1.{minor}: {out}");
    assert!(
        server
            .get_object("v1", "pods", "default", "on-node")
            .is_none()
    );
    let eviction = server
        .request_log()
        .into_iter()
        .find(|r| r.resource == "pods/eviction")
        .expect("drain evicts");
    assert_eq!(eviction.status, 201);
    k.ok(&["uncordon", "n-drain"]).await;
    assert!(
        node()["spec"]
            .get("unschedulable")
            .is_none_or(|u| u == false)
    );
}
