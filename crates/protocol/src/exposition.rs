//! The two Prometheus exposition formats our `/metrics` endpoints speak, chosen by the
//! scraper's `Accept` header: OpenMetrics 1.0.0 (what `prometheus-client` encodes; only
//! for a client that names `application/openmetrics-text`, as Prometheus does) and the
//! classic text format 0.0.4 (the answer otherwise — no `Accept`, `*/*` — as the Go
//! client answers: what `curl … | promtool check metrics`, Prometheus with OpenMetrics
//! disabled and most ad-hoc tools read; issue 27).
//!
//! The formats differ only in framing, so 0.0.4 is produced from OpenMetrics text: no
//! `# EOF` and no `# UNIT`; a counter family is named as its samples (`x_total`); an
//! `info` family becomes a gauge `x_info`, `unknown` becomes `untyped`; `_created` samples
//! and exemplars, which 0.0.4 cannot carry, are dropped.

/// A `/metrics` body format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 (`application/openmetrics-text`).
    OpenMetrics,
    /// The classic text format 0.0.4 (`text/plain; version=0.0.4`).
    PrometheusText,
}

impl Format {
    /// The `Content-Type` of a body in this format.
    pub const fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format to answer a request with `Accept` header `accept`. OpenMetrics only when
    /// the client names `application/openmetrics-text` itself (wildcards never select it)
    /// with a quality above 0 and at least that of `text/plain` or `text/*` (the most
    /// specific of those gives the text its quality, RFC 9110 §12.5.1; `*/*` counts for
    /// neither, as in the Go client); 0.0.4 text otherwise, also
    /// when the header is absent, `*/*` or unreadable — the Go client's rule, so the usual
    /// `curl … | promtool check metrics` reads what it gets.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Format::PrometheusText;
        };
        let ranges: Vec<MediaRange> = accept.split(',').filter_map(MediaRange::parse).collect();
        let om = ranges
            .iter()
            .filter(|r| r.kind == "application" && r.subtype == "openmetrics-text")
            .map(|r| r.q)
            .max()
            .unwrap_or(0);
        // `*/*` selects neither (it would always tie); `text/*` speaks for `text/plain`.
        let text = if ranges.iter().any(|r| r.kind == "text") {
            quality(&ranges, "text", "plain")
        } else {
            0
        };
        if om > 0 && om >= text {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }

    /// `openmetrics` (as encoded by `prometheus-client`) in this format.
    pub fn encode(self, openmetrics: &str) -> String {
        match self {
            Format::OpenMetrics => openmetrics.to_owned(),
            Format::PrometheusText => to_prometheus_text(openmetrics),
        }
    }
}

struct MediaRange {
    kind: String,
    subtype: String,
    /// Quality in thousandths (RFC 9110 allows three decimals).
    q: u16,
}

impl MediaRange {
    fn parse(text: &str) -> Option<MediaRange> {
        let mut parts = text.split(';');
        let (kind, subtype) = parts.next()?.trim().split_once('/')?;
        let mut q = 1000;
        for param in parts {
            if let Some((name, value)) = param.split_once('=')
                && name.trim().eq_ignore_ascii_case("q")
            {
                q = parse_quality(value.trim())?;
            }
        }
        Some(MediaRange {
            kind: kind.trim().to_ascii_lowercase(),
            subtype: subtype.trim().to_ascii_lowercase(),
            q,
        })
    }
}

/// `0`, `0.5`, `1.000` → thousandths; anything else makes the range unusable.
fn parse_quality(value: &str) -> Option<u16> {
    let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u16 = match whole {
        "0" => 0,
        "1" => 1,
        _ => return None,
    };
    let frac: u16 = format!("{frac:0<3}").parse().ok()?;
    let q = whole * 1000 + frac;
    (q <= 1000).then_some(q)
}

/// The quality of `kind/subtype`: from the exact range if listed, else `kind/*`, else `*/*`.
fn quality(ranges: &[MediaRange], kind: &str, subtype: &str) -> u16 {
    let best =
        |pred: &dyn Fn(&MediaRange) -> bool| ranges.iter().filter(|r| pred(r)).map(|r| r.q).max();
    best(&|r| r.kind == kind && r.subtype == subtype)
        .or_else(|| best(&|r| r.kind == kind && r.subtype == "*"))
        .or_else(|| best(&|r| r.kind == "*" && r.subtype == "*"))
        .unwrap_or(0)
}

/// OpenMetrics text → Prometheus text 0.0.4 (see the module comment).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The HELP line waits for its TYPE line, which decides the 0.0.4 family name.
    let mut help: Option<(&str, &str)> = None;
    // The current family: its OpenMetrics name and type.
    let mut family: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (renamed, kind_004) = match kind {
                "counter" if !name.ends_with("_total") => (format!("{name}_total"), "counter"),
                "counter" => (name.to_owned(), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some((help_name, text)) = help.take()
                && help_name == name
            {
                out.push_str(&format!("# HELP {renamed} {text}\n"));
            }
            out.push_str(&format!("# TYPE {renamed} {kind_004}\n"));
            family = Some((name, kind));
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            // `# EOF`, `# UNIT` and any other comment.
            continue;
        }
        let sample_name = line.split(['{', ' ']).next().unwrap_or_default();
        if let Some((name, kind)) = family
            && matches!(kind, "counter" | "histogram" | "summary")
            && sample_name.strip_prefix(name) == Some("_created")
        {
            continue;
        }
        out.push_str(strip_exemplar(line));
        out.push('\n');
    }
    out
}

/// A sample line without its exemplar (` # {...} value`), outside quoted label values.
fn strip_exemplar(line: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '#' if !quoted => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        use Format::*;
        let cases = [
            // No Accept, or one naming no format: the 0.0.4 text (curl, promtool users).
            (None, PrometheusText),
            (Some(""), PrometheusText),
            (Some("*/*"), PrometheusText),
            (Some("application/*"), PrometheusText),
            // Prometheus 2.x by default.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text"), OpenMetrics),
            // Prometheus with OpenMetrics disabled, curl -H, promtool users.
            (
                Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"),
                PrometheusText,
            ),
            (Some("text/plain"), PrometheusText),
            (Some("TEXT/Plain; charset=utf-8"), PrometheusText),
            (Some("text/*"), PrometheusText),
            (
                Some("text/plain;q=0.5, application/openmetrics-text;q=0.4"),
                PrometheusText,
            ),
            (
                Some("text/plain;q=0.5, application/openmetrics-text;q=0.5"),
                OpenMetrics,
            ),
            // Named, even at a low quality, it beats a wildcard.
            (
                Some("*/*;q=0.9, application/openmetrics-text;q=0.1"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0, text/plain;q=0"),
                PrometheusText,
            ),
            (Some("application/json"), PrometheusText),
            (Some("text/plain;q=2, garbage"), PrometheusText),
            (Some("text/plain;q=0.5"), PrometheusText),
        ];
        for (accept, want) in cases {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn prometheus_text_from_openmetrics() {
        let om = "# HELP requests Requests.\n# TYPE requests counter\nrequests_total{a=\"x # y\"} 3 # {trace=\"1\"} 1.0\nrequests_created 17\n\
                  # HELP up_seconds Up.\n# TYPE up_seconds gauge\n# UNIT up_seconds seconds\nup_seconds 1.5\n\
                  # HELP build Build.\n# TYPE build info\nbuild_info{v=\"1\"} 1\n\
                  # HELP odd Odd.\n# TYPE odd unknown\nodd 2\n\
                  # HELP lat Latency.\n# TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 1\nlat_sum 0.5\nlat_count 1\n# EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP requests_total Requests.\n# TYPE requests_total counter\nrequests_total{a=\"x # y\"} 3\n\
             # HELP up_seconds Up.\n# TYPE up_seconds gauge\nup_seconds 1.5\n\
             # HELP build_info Build.\n# TYPE build_info gauge\nbuild_info{v=\"1\"} 1\n\
             # HELP odd Odd.\n# TYPE odd untyped\nodd 2\n\
             # HELP lat Latency.\n# TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 1\nlat_sum 0.5\nlat_count 1\n"
        );
        assert_eq!(Format::OpenMetrics.encode(om), om);
        assert!(
            Format::PrometheusText
                .content_type()
                .contains("version=0.0.4")
        );
    }
}
