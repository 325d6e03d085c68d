//! The live What-if page (issue 31 item 8) and its defrag plan (issue 32 item 2) in
//! Chromium: against the embedded API server holding two MI210 nodes, each half taken by a
//! replica of one ReplicaSet, and a 48 GiB pod that waits, the page's forms are filled and
//! submitted as a person would ("+1 node like n1"; a plan for the waiting pod), each
//! answer shows its before/after or its moves and commands, and every state of the page is
//! axe-clean (WCAG A/AA) at 1440 and 390 px, light and dark, with no console error (the
//! UI's Content-Security-Policy holds) and no sideways scroll of the page itself.
//!
//! Needs what `browser.rs` needs: `chromium`, `chromium-driver` and
//! `npm ci --prefix crates/webui/tests/axe`.

use std::path::Path;
use std::time::Duration;

use hami_apiserver::{ApiServer, Config};
use serde_json::json;

// The browser test's WebDriver client, compiled here too (its items are private to that
// test's module); this test uses part of it.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "browser/webdriver.rs"]
mod webdriver;

use webdriver::Browser;

/// `hami.io/node-amd-register` with one MI210 (64 GiB, 104 CUs, 10 shares).
fn register(id: &str) -> String {
    format!(
        r#"[{{"id":"{id}","index":0,"count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}}]"#
    )
}

fn pod(name: &str, node: Option<(&str, &str)>, mib: u64) -> serde_json::Value {
    let mut limits = json!({"amd.com/gpu": "1", "amd.com/gpumem": mib.to_string()});
    let mut meta = json!({"name": name, "namespace": "default"});
    let mut spec = json!({"schedulerName": "hami-scheduler",
        "containers": [{"name": "main", "image": "rocm"}]});
    if let Some((node, card)) = node {
        limits["amd.com/gpucores"] = json!("25");
        meta["annotations"] = json!({"hami.io/vgpu-node": node,
            "hami.io/amd-devices-allocated": format!("{card},AMD Instinct MI210,{mib},26:;"),
            "hami.io/bind-phase": "success"});
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "web", "uid": "uid-web", "controller": true}]);
        meta["labels"] = json!({"app": "web"});
        spec["nodeName"] = json!(node);
    }
    spec["containers"][0]["resources"] = json!({"limits": limits});
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}})
}

#[test]
fn the_live_what_if_page_in_chromium() {
    let _machine = crate::MACHINE.blocking_write();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let axe_path = repo.join("crates/webui/tests/axe/node_modules/axe-core/axe.min.js");
    let axe_source = std::fs::read_to_string(&axe_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `npm ci --prefix crates/webui/tests/axe` (CI does)",
            axe_path.display()
        )
    });
    let browser = Browser::start(repo.join("target/webui-screenshots"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server, ui) = runtime.block_on(async {
        let server = ApiServer::start(Config::default()).await.unwrap();
        for (name, id) in [("n1", "CARD-A"), ("n2", "CARD-B")] {
            server
                .create_object(
                    "v1",
                    "nodes",
                    None,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                        "annotations": {"hami.io/node-amd-register": register(id)}}}),
                )
                .unwrap();
        }
        for (name, node, mib) in [
            ("web-a", Some(("n1", "CARD-A")), 32768),
            ("web-b", Some(("n2", "CARD-B")), 32768),
            ("wait", None, 49152),
        ] {
            server
                .create_object("v1", "pods", Some("default"), pod(name, node, mib))
                .unwrap();
        }
        server
            .create_object(
                "policy/v1",
                "poddisruptionbudgets",
                Some("default"),
                json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "web-pdb", "namespace": "default"},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
                    "status": {"disruptionsAllowed": 1, "currentHealthy": 2,
                        "desiredHealthy": 1, "expectedPods": 2}}),
            )
            .unwrap();
        let client =
            kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ui = hami_webui::start(client, listener, vec![], Duration::from_secs(5)).unwrap();
        (server, ui)
    });
    let url = ui.url();
    let mut problems = Vec::new();
    let mut check = |browser: &Browser, name: &str| {
        let errors = browser.console_errors();
        if !errors.is_empty() {
            problems.push(format!("{name}: console errors: {errors:?}"));
        }
        let violations = browser.axe(&axe_source);
        if !violations.is_empty() {
            problems.push(format!("{name}: axe: {violations:?}"));
        }
        let overflow = browser.js(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
        );
        if overflow.as_i64() != Some(0) {
            problems.push(format!(
                "{name}: the page scrolls sideways by {overflow} px"
            ));
        }
        browser.screenshot(name);
    };

    browser.go(&format!("{url}whatif/live"));
    browser.wait(
        "return document.querySelector('option[value=\"default/wait\"]') !== null && document.querySelector('option[value=\"n2\"]') !== null;",
        "the live What-if forms listing the waiting pod and the nodes",
    );

    // "+1 node like n1", typed and submitted: the waiting pod is placed on the new node.
    browser.js("document.querySelector('input[name=add]').value = '1'; document.querySelector('input[name=like]').value = 'n1'; document.querySelector('form[action=\"/whatif/live\"] button').click(); return true;");
    browser.wait(
        "return document.getElementById('live-result') !== null;",
        "the before and after",
    );
    let text = browser.js("return document.querySelector('main').innerText;");
    let text = text.as_str().unwrap_or_default();
    assert!(
        text.contains("0 would be placed now and 1 after the edits")
            && text.contains("n1-whatif-1"),
        "{text}"
    );
    for width in [1440, 390] {
        for dark in [false, true] {
            browser.emulate(width, dark);
            check(&browser, &format!("whatif-live-{width}-{dark}"));
        }
    }
    browser.emulate(1440, false);

    // The defrag form, for the waiting pod, pods of any age: one move, and the commands.
    browser.js("document.querySelector('input[name=target][value=pod]').checked = true; document.querySelector('select[name=pod]').value = 'default/wait'; document.querySelector('input[name=min_age]').value = '0'; document.querySelector('form[action=\"/whatif/defrag\"] button').click(); return true;");
    browser.wait(
        "return document.getElementById('defrag-result') !== null;",
        "the defrag plan",
    );
    let text = browser.js("return document.querySelector('main').innerText;");
    let text = text.as_str().unwrap_or_default();
    assert!(
        text.contains("reached (1 move(s), shortfall 1 → 0)")
            && text.contains("hami defrag apply defrag-plan.yaml --min-age-seconds 0 --execute")
            && text.contains("default/web-pdb allows 1"),
        "{text}"
    );
    for width in [1440, 390] {
        for dark in [false, true] {
            browser.emulate(width, dark);
            check(&browser, &format!("whatif-defrag-{width}-{dark}"));
        }
    }
    browser.emulate_reset();

    // A bad edit: the page says what to change, and stays axe-clean.
    browser.go(&format!("{url}whatif/live"));
    browser.js("document.querySelector('input[name=add]').value = '0'; document.querySelector('input[name=like]').value = 'n1'; document.querySelector('form[action=\"/whatif/live\"] button').click(); return true;");
    browser.wait(
        "return document.body.innerText.indexOf('adds no node') >= 0;",
        "the refusal of add=0",
    );
    let _ = browser.console_errors(); // the 400 status itself is logged by Chromium
    let violations = browser.axe(&axe_source);
    assert!(violations.is_empty(), "refusal page: axe: {violations:?}");

    assert!(problems.is_empty(), "{}", problems.join("\n"));
    ui.shutdown();
    runtime.block_on(server.shutdown());
    drop(browser);
}
