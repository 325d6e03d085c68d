//! Whether a POST comes from the UI's own pages. The UI asks for no login, so without this
//! any page on another site could submit the What-if form in its visitors' browsers (and
//! make the UI plan for it); browsers say where a request comes from in `Origin` (every
//! POST) and `Sec-Fetch-Site`, which pages cannot forge. A client that sends neither
//! (curl, scripts) is not a browser carrying someone else's page, and is let through.

/// Checks a POST's `Host`, `Origin` and `Sec-Fetch-Site` headers: `Err` says why it is
/// refused and what to do instead (403).
pub fn check(
    host: Option<&str>,
    origin: Option<&str>,
    sec_fetch_site: Option<&str>,
) -> Result<(), String> {
    const OWN_PAGE: &str = "open the What-if page of this UI and submit the form there";
    if let Some(site) = sec_fetch_site
        && matches!(site.trim(), "cross-site" | "same-site")
    {
        return Err(format!(
            "this form was posted from another site (Sec-Fetch-Site: {site}); the UI plans only what its own pages post: {OWN_PAGE}"
        ));
    }
    let Some(origin) = origin else {
        return Ok(());
    };
    // `null` (a sandboxed frame, a data: or file: page) has no scheme and never matches.
    let matches = origin
        .trim()
        .split_once("://")
        .is_some_and(|(scheme, rest)| {
            let own = host.and_then(|h| authority(h, scheme));
            own.is_some() && authority(rest, scheme) == own
        });
    if matches {
        Ok(())
    } else {
        Err(format!(
            "this form was posted from {origin}, not from this UI ({}): the UI plans only what its own pages post: {OWN_PAGE} (behind a proxy, keep the Host header: it is compared with Origin)",
            host.unwrap_or("no Host header")
        ))
    }
}

/// `host[:port]` lower-cased, the scheme's default port dropped; `None` when it is no
/// authority (a path, credentials, or empty).
fn authority(text: &str, scheme: &str) -> Option<String> {
    let text = text.trim().to_ascii_lowercase();
    if text.is_empty() || text.contains(['/', '@', '?', '#', ' ']) {
        return None;
    }
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => Some(":80"),
        "https" => Some(":443"),
        _ => None,
    };
    Some(match default_port {
        Some(port) => text.strip_suffix(port).unwrap_or(&text).to_owned(),
        None => text,
    })
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn own_pages_pass_and_other_sites_are_refused() {
        let host = Some("127.0.0.1:8088");
        assert_eq!(
            check(host, Some("http://127.0.0.1:8088"), Some("same-origin")),
            Ok(())
        );
        assert_eq!(check(host, None, None), Ok(()), "curl sends neither");
        assert_eq!(
            check(Some("ui.example"), Some("https://UI.example:443"), None),
            Ok(())
        );
        assert_eq!(
            check(Some("ui.example:80"), Some("http://ui.example"), None),
            Ok(())
        );
        for (origin, site) in [
            (Some("http://evil.example"), Some("cross-site")),
            (Some("http://evil.example"), None),
            (Some("http://127.0.0.1:3000"), Some("same-site")),
            (Some("http://127.0.0.1:3000"), None),
            (Some("null"), None),
            (Some("http://127.0.0.1:8088.evil.example"), None),
            (Some("http://user@127.0.0.1:8088"), None),
            (None, Some("cross-site")),
        ] {
            let e = check(host, origin, site).unwrap_err();
            assert!(
                e.contains("What-if page of this UI"),
                "{origin:?} {site:?}: {e}"
            );
        }
        assert!(check(None, Some("http://127.0.0.1:8088"), None).is_err());
    }
}
