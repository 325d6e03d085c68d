//! HTML building blocks: escaping, the page frame (navigation, banners, the live-refresh
//! script), tables. Server-rendered so reading needs no JavaScript and no build step.

use std::fmt::Write;

/// Escapes text for HTML content and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes a path segment for an href (names are DNS labels, but nothing is trusted).
pub fn url_segment(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A rendered page and its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// HTTP status, e.g. 404 for an unknown node.
    pub status: u16,
    /// The whole document.
    pub html: String,
}

/// The stylesheet every page links (`/static/style.css`).
pub const CSS: &str = include_str!("../assets/style.css");
/// The script that refreshes live pages (`/static/live.js`).
pub const LIVE_JS: &str = include_str!("../assets/live.js");

/// The frame every page shares. `live` pages refresh their `<main>` where JavaScript runs.
pub fn frame(title: &str, banners: &[String], live: bool, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{} · hami</title><link rel=\"stylesheet\" href=\"/static/style.css\"><link rel=\"icon\" href=\"data:,\"></head><body{}>",
        esc(title),
        if live { " data-live=\"5\"" } else { "" }
    );
    out.push_str("<header><nav aria-label=\"Main\"><a class=\"brand\" href=\"/\">hami</a> <a href=\"/\">Overview</a> <a href=\"/cards\">Cards</a> <a href=\"/pods\">Pods</a> <a href=\"/whatif\">What-if</a></nav></header><main id=\"main\">");
    out.push_str(&banner_html(banners));
    out.push_str(body);
    out.push_str("</main><footer>Read-only view of the cluster. <span id=\"live-status\"></span></footer><script src=\"/static/live.js\" defer></script></body></html>");
    out
}

/// The banners (watch errors, unreachable monitors) as alert `<div>`s, escaped.
pub fn banner_html(banners: &[String]) -> String {
    let mut out = String::new();
    for b in banners {
        let _ = write!(out, "<div class=\"banner\" role=\"alert\">{}</div>", esc(b));
    }
    out
}

/// A 404 page saying `what` was not found.
pub fn not_found(what: &str, banners: &[String]) -> Page {
    Page {
        status: 404,
        html: frame(
            "Not found",
            banners,
            false,
            &format!(
                "<h1>Not found</h1><p>{} does not exist (or has not been seen by the watchers yet). <a href=\"/\">Back to the overview</a>.</p>",
                esc(what)
            ),
        ),
    }
}

/// A table with a caption, header cells and pre-rendered (escaped) cells, in a box that
/// scrolls sideways where the screen is narrower than the table.
pub fn table(caption: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::with_capacity(64 * rows.len() + 256);
    // Wide tables scroll in place on a narrow screen; the scrolling box is focusable (and
    // named) so a keyboard can scroll it too.
    let _ = write!(
        out,
        "<div class=\"scroll\" role=\"group\" tabindex=\"0\" aria-label=\"{c}\"><table><caption>{c}</caption><thead><tr>",
        c = esc(caption)
    );
    for h in headers {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    out
}

/// MiB as a short human figure.
pub fn mib(value: f64) -> String {
    if value >= 1024.0 {
        format!("{:.1} GiB", value / 1024.0)
    } else {
        format!("{value:.0} MiB")
    }
}

/// Seconds since the epoch as UTC `HH:MM:SS`.
pub fn clock(at: i64) -> String {
    let s = at.rem_euclid(86400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `since HH:MM UTC` of a moment (seconds since the epoch).
pub fn since(at: i64) -> String {
    format!("since {} UTC", &clock(at)[..5])
}

/// How old a sample taken at `at` is at `now`, for a figure: `as of 12 s ago`.
pub fn age(at: i64, now: i64) -> String {
    let s = (now - at).max(0);
    let text = match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    };
    format!(
        "<span class=\"age\" title=\"sampled at {} UTC\">as of {text} ago</span>",
        clock(at)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            esc("<a href=\"x\">'&"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
        );
        assert_eq!(url_segment("a b/ü"), "a%20b%2F%C3%BC");
        let page = not_found("Pod <x>", &["api <down>".into()]);
        assert_eq!(page.status, 404);
        assert!(page.html.contains("Pod &lt;x&gt;"));
        assert!(page.html.contains("role=\"alert\">api &lt;down&gt;"));
        assert_eq!(clock(3600 + 61), "01:01:01");
    }
}
