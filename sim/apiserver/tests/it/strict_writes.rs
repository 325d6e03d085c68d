//! Writes the server must refuse, on every write path: a `metadata.resourceVersion` that is
//! not a string, and objects nested deeper than the server can read back (with a data dir
//! across a restart).

use crate::common;

use common::{http, http_json, start_with};
use hami_apiserver::Config;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = json!({"a": v});
    }
    v
}

#[tokio::test]
async fn resource_version_must_be_a_string() {
    let server = start_with(Config::default()).await;
    let (code, _) = http_json(
        &server,
        "POST",
        CMS,
        "application/json",
        &json!({"metadata": {"name": "c"}, "data": {"v": "0"}}),
    )
    .await;
    assert_eq!(code, 201);
    for i in 1..4 {
        let p = json!({"data": {"v": i.to_string()}});
        let (code, _) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/c"),
            "application/merge-patch+json",
            &p,
        )
        .await;
        assert_eq!(code, 200);
    }
    let stored = || {
        server
            .get_object("v1", "configmaps", "default", "c")
            .unwrap()
    };
    let before = stored();
    let write = |rv: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": rv}, "data": {"v": "stale"}});
    for rv in [json!(1), json!({"v": "1"}), Value::Null, json!(["1"])] {
        let (code, status) = http_json(
            &server,
            "PUT",
            &format!("{CMS}/c"),
            "application/json",
            &write(rv.clone()),
        )
        .await;
        assert_eq!(code, 400, "PUT with resourceVersion {rv}: {status}");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("metadata.resourceVersion must be a string"),
            "{status}"
        );
        let (code, _) = http_json(&server, "POST", CMS, "application/json", &{
            let mut o = write(rv.clone());
            o["metadata"]["name"] = json!("new");
            o
        })
        .await;
        assert_eq!(code, 400, "POST with resourceVersion {rv}");
        for ct in [
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ] {
            if rv.is_null() {
                continue; // null in a merge patch removes the field: unconditional, as in Kubernetes
            }
            let p = json!({"metadata": {"resourceVersion": rv}, "data": {"v": "stale"}});
            let (code, status) = http_json(&server, "PATCH", &format!("{CMS}/c"), ct, &p).await;
            assert_eq!(code, 422, "{ct} with resourceVersion {rv}: {status}");
        }
        let p = json!([{"op": "replace", "path": "/metadata/resourceVersion", "value": rv}, {"op": "replace", "path": "/data/v", "value": "stale"}]);
        let (code, status) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/c"),
            "application/json-patch+json",
            &p,
        )
        .await;
        assert_eq!(code, 422, "JSON patch to resourceVersion {rv}: {status}");
        if rv.is_null() {
            continue;
        }
        let mut apply = write(rv.clone());
        apply["data"]["v"] = json!("applied");
        let (code, _) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/c?fieldManager=t&force=true"),
            "application/apply-patch+yaml",
            &apply,
        )
        .await;
        assert_eq!(code, 422, "apply with resourceVersion {rv}");
    }
    assert_eq!(stored(), before, "nothing was written");
    assert!(
        server
            .get_object("v1", "configmaps", "default", "new")
            .is_none()
    );
    // A stale string is the 409 it always was; null in a merge patch is no precondition.
    let (code, _) = http_json(
        &server,
        "PUT",
        &format!("{CMS}/c"),
        "application/json",
        &write(json!("1")),
    )
    .await;
    assert_eq!(code, 409);
    let (code, _) = http_json(
        &server,
        "PATCH",
        &format!("{CMS}/c"),
        "application/merge-patch+json",
        &json!({"metadata": {"resourceVersion": null}, "data": {"v": "free"}}),
    )
    .await;
    assert_eq!(code, 200);
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "hami-apiserver-{tag}-{}",
        hami_apiserver::meta::new_uid()
    ))
}

/// A JSON path of `n` `a` segments.
fn path_a(n: usize) -> String {
    "/a".repeat(n)
}

#[tokio::test]
async fn one_depth_rule_on_every_write_path_and_across_restart() {
    let dir = temp_dir("depth");
    let config = Config {
        data_dir: Some(dir.clone()),
        ..Config::default()
    };
    let cm = |name: &str, x: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "x": x});
    {
        let server = start_with(config.clone()).await;
        // The rule counts the stored object, managedFields included (which mirror every
        // field a few levels down), so `x` may nest some 95 levels.
        let (code, s) = http_json(
            &server,
            "POST",
            CMS,
            "application/json",
            &cm("ok", nested(90)),
        )
        .await;
        assert_eq!(code, 201, "{s}");
        let (code, s) = http_json(
            &server,
            "POST",
            CMS,
            "application/json",
            &cm("deep", nested(100)),
        )
        .await;
        assert_eq!(code, 422, "{s}");
        assert!(
            s["message"].as_str().unwrap().contains("deeper than 100"),
            "{s}"
        );
        // YAML bodies are not bounded by the JSON parser.
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: deepyaml\nx: {}{}\n",
            "{a: ".repeat(101),
            "}".repeat(101)
        );
        let (code, s) = http(
            &server,
            "POST",
            CMS,
            &[("Content-Type", "application/yaml")],
            yaml.as_bytes(),
        )
        .await;
        // (the YAML parser's own budget, 64 levels, is stricter still: a clear 400)
        assert_eq!(code, 400, "{}", String::from_utf8_lossy(&s));
        assert!(String::from_utf8_lossy(&s).contains("budget"));
        let (code, _) = http_json(
            &server,
            "PUT",
            &format!("{CMS}/ok"),
            "application/json",
            &cm("ok", nested(100)),
        )
        .await;
        assert_eq!(code, 422);
        for ct in [
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ] {
            let (code, _) = http_json(
                &server,
                "PATCH",
                &format!("{CMS}/ok"),
                ct,
                &json!({"x": nested(100)}),
            )
            .await;
            assert_eq!(code, 422, "{ct}");
        }
        let (code, _) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/ok?fieldManager=t&force=true"),
            "application/apply-patch+yaml",
            &cm("ok", nested(100)),
        )
        .await;
        assert_eq!(code, 422, "apply");
        // JSON patch: each operation is small, together they nest ~180 levels (past the
        // 128 at which serde_json, and so every reader, gives up).
        let ops = json!([
            {"op": "add", "path": "/y", "value": nested(90)},
            {"op": "add", "path": format!("/y{}/b", path_a(89)), "value": nested(90)},
        ]);
        let (code, s) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/ok"),
            "application/json-patch+json",
            &ops,
        )
        .await;
        assert_eq!(code, 422, "{s}");
        // The same patch within the limit is stored and survives the restart.
        let ops = json!([
            {"op": "add", "path": "/y", "value": nested(45)},
            {"op": "add", "path": format!("/y{}/b", path_a(44)), "value": nested(44)},
        ]);
        let (code, s) = http_json(
            &server,
            "PATCH",
            &format!("{CMS}/ok"),
            "application/json-patch+json",
            &ops,
        )
        .await;
        assert_eq!(code, 200, "{s}");
        server.shutdown().await;
    }
    let server = start_with(config.clone()).await;
    let ok = server
        .get_object("v1", "configmaps", "default", "ok")
        .expect("the acknowledged write survived the restart");
    assert_eq!(ok["x"], nested(90));
    assert!(ok["y"].pointer(&format!("{}/b", path_a(44))).is_some());
    for name in ["deep", "deepyaml"] {
        assert!(
            server
                .get_object("v1", "configmaps", "default", name)
                .is_none()
        );
    }
    // Every reader parses it: a list and a Table list.
    let (code, list) = http(&server, "GET", CMS, &[], b"").await;
    assert_eq!(code, 200);
    let list: Value = serde_json::from_slice(&list).expect("the list parses");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (code, table) = http(
        &server,
        "GET",
        &format!("{CMS}?includeObject=Object"),
        &[("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")],
        b"",
    )
    .await;
    assert_eq!(code, 200);
    serde_json::from_slice::<Value>(&table).expect("the Table parses");
    server.shutdown().await;

    // Loading a data dir applies the same rule, naming the file and line.
    let bad = temp_dir("depth-load");
    std::fs::create_dir_all(&bad).unwrap();
    let line = json!({"rv": 5, "r": "/v1/configmaps", "op": "put", "obj": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d", "namespace": "default", "resourceVersion": "5"}, "x": nested(100)}});
    std::fs::write(bad.join("objects.jsonl"), format!("{line}\n{line}\n")).unwrap();
    let err = hami_apiserver::ApiServer::start(Config {
        data_dir: Some(bad.clone()),
        ..Config::default()
    })
    .await
    .err()
    .expect("a data dir with a too-deep object is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("objects.jsonl line 1") && msg.contains("deeper than 100"),
        "{msg}"
    );
    // A complete last line that cannot be loaded is damage too, not a torn write.
    std::fs::write(bad.join("objects.jsonl"), format!("{line}\n")).unwrap();
    assert!(
        hami_apiserver::ApiServer::start(Config {
            data_dir: Some(bad.clone()),
            ..Config::default()
        })
        .await
        .is_err()
    );
    std::fs::remove_dir_all(&bad).ok();
    std::fs::remove_dir_all(&dir).ok();
}
