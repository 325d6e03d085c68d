//! Links to the shipped Grafana dashboards (`deploy/grafana/`: `hami-rs-vgpu` per pod and
//! container, `hami-rs-scheduler` per node and card) for ranges longer than the UI keeps
//! in memory. The UI learns Grafana's address from `--grafana-url` (`HAMI_UI_GRAFANA_URL`);
//! without it a page says so instead of showing a link that leads nowhere.

use crate::html::{esc, url_segment};

/// The vGPU dashboard's uid (`deploy/grafana/hami-rs-vgpu.json`).
pub const VGPU_DASHBOARD: &str = "hami-rs-vgpu";
/// The scheduler dashboard's uid (`deploy/grafana/hami-rs-scheduler.json`).
pub const SCHEDULER_DASHBOARD: &str = "hami-rs-scheduler";
/// The range a link opens: a day, four times the longest the UI shows.
pub const LINK_RANGE: &str = "now-24h";

/// Checks `--grafana-url`: an `http://` or `https://` URL of Grafana's root (a sub-path
/// such as `/grafana` is fine), without query or fragment; a trailing `/` is dropped.
pub fn parse_base(url: &str) -> Result<String, String> {
    let url = url.trim();
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| {
            format!("--grafana-url {url:?}: write Grafana's http:// or https:// address, e.g. https://grafana.example.com")
        })?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("--grafana-url {url:?}: the address has no host"));
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "--grafana-url {url:?}: give Grafana's root address alone (no query, fragment or spaces); the UI adds the dashboard's path"
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// The URL of dashboard `uid` at `base` with its variables set (`var-<name>=<value>`), over
/// the last day; escaped for an `href`.
pub fn dashboard(base: &str, uid: &str, vars: &[(&str, &str)]) -> String {
    let mut out = format!("{base}/d/{uid}?from={LINK_RANGE}&to=now");
    for (k, v) in vars {
        out.push_str(&format!("&var-{k}={}", url_segment(v)));
    }
    esc(&out)
}

/// One dashboard to link: its words, its uid and its variables.
pub struct Dashboard<'a> {
    /// What it shows, for the link's text.
    pub label: &'a str,
    /// Its uid.
    pub uid: &'a str,
    /// The variables that narrow it to this page's subject.
    pub vars: Vec<(&'a str, &'a str)>,
}

/// The sentence under a page's charts: links to `dashboards` for longer ranges, or, where
/// the UI was not told Grafana's address, that no link is shown and how to get one.
pub fn longer_ranges(grafana: Option<&str>, dashboards: &[Dashboard<'_>]) -> String {
    match grafana {
        Some(base) => {
            let links: Vec<String> = dashboards
                .iter()
                .map(|d| {
                    format!(
                        "<a class=\"grafana\" href=\"{}\">{}</a>",
                        dashboard(base, d.uid, &d.vars),
                        esc(d.label)
                    )
                })
                .collect();
            format!(
                "<p class=\"longer\">Longer ranges in Grafana (the last 24 h; change the range there): {}.</p>",
                links.join(", ")
            )
        }
        None => "<p class=\"longer muted\">Longer ranges: the shipped Grafana dashboards (deploy/grafana/) keep them; no link here because the UI was not given Grafana's address (start it with --grafana-url URL or HAMI_UI_GRAFANA_URL).</p>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_checked_and_named_in_the_error() {
        assert_eq!(
            parse_base("https://grafana.example.com/"),
            Ok("https://grafana.example.com".into())
        );
        assert_eq!(
            parse_base("http://monitoring:3000/grafana"),
            Ok("http://monitoring:3000/grafana".into())
        );
        assert!(parse_base("grafana:3000").unwrap_err().contains("http://"));
        assert!(parse_base("http:///x").unwrap_err().contains("no host"));
        assert!(
            parse_base("http://g/?orgId=1")
                .unwrap_err()
                .contains("no query")
        );
    }

    #[test]
    fn links_name_the_dashboard_and_its_variables_or_say_why_there_is_none() {
        let pod = [Dashboard {
            label: "this pod's GPU use",
            uid: VGPU_DASHBOARD,
            vars: vec![("namespace", "ml"), ("pod", "train <1>")],
        }];
        let html = longer_ranges(Some("https://g.example"), &pod);
        assert!(
            html.contains("href=\"https://g.example/d/hami-rs-vgpu?from=now-24h&amp;to=now&amp;var-namespace=ml&amp;var-pod=train%20%3C1%3E\""),
            "{html}"
        );
        let none = longer_ranges(None, &pod);
        assert!(
            !none.contains("<a ") && none.contains("--grafana-url"),
            "{none}"
        );
    }

    #[test]
    fn the_linked_uids_and_variables_are_the_shipped_dashboards() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana");
        for (uid, vars) in [
            (VGPU_DASHBOARD, &["namespace", "pod", "node"][..]),
            (SCHEDULER_DASHBOARD, &["node"][..]),
        ] {
            let path = format!("{dir}/{uid}.json");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let board: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(board["uid"], uid, "{path}");
            let names: Vec<&str> = board["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v["name"].as_str())
                .collect();
            for v in vars {
                assert!(names.contains(v), "{path} has no ${v}: {names:?}");
            }
        }
    }
}
