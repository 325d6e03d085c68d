//! The real kubectl against the embedded server: the oldest and the newest kubectl found
//! next to the PATH's kubectl (`kubectl.1.27` … `kubectl.1.33` in the Google Cloud SDK).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The oldest and newest `kubectl.1.N` beside the PATH's kubectl.
fn kubectl_versions() -> (PathBuf, PathBuf) {
    let which = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("kubectl")).find(|k| k.is_file()))
        .expect("kubectl is not on PATH: these tests need the Google Cloud SDK's kubectl with kubectl.1.27 ... kubectl.1.33 beside it");
    let real = std::fs::canonicalize(&which).expect("resolve kubectl");
    let dir = real.parent().expect("kubectl dir");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .expect("read kubectl dir")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("kubectl.1.")?.parse::<u32>().ok()?;
            Some((minor, e.path()))
        })
        .collect();
    versions.sort();
    assert!(
        !versions.is_empty(),
        "no kubectl.1.N binaries beside {} (expected the Google Cloud SDK layout)",
        real.display()
    );
    (
        versions[0].1.clone(),
        versions[versions.len() - 1].1.clone(),
    )
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

async fn exercise(bin: &Path) {
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

    assert!(
        k.ok(&["delete", "pod", "web"])
            .await
            .contains("pod \"web\" deleted")
    );
    let (ok, _, err) = k.run(&["get", "pod", "web"], None).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn oldest_kubectl() {
    exercise(&kubectl_versions().0).await;
}

#[tokio::test]
async fn newest_kubectl() {
    exercise(&kubectl_versions().1).await;
}
