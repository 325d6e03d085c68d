//! Reading the samples of a Prometheus text body (0.0.4 or OpenMetrics 1.0.0: they share
//! the sample line), as the web UI does with the monitors' `/metrics` and Prometheus's
//! `/federate`. Comments (`# HELP`, `# TYPE`, `# EOF`) are skipped; a line that is not a
//! sample is counted, not fatal: one bad series must not hide the others.

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name as written (with any `_total` suffix).
    pub name: String,
    /// Label pairs in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The sample value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of `body`, and how many lines could not be read.
pub fn parse_samples(body: &str) -> (Vec<Sample>, usize) {
    let mut samples = Vec::new();
    let mut bad = 0;
    for line in body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(sample) => samples.push(sample),
            None => bad += 1,
        }
    }
    (samples, bad)
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_ascii_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Labels up to the closing brace; returns them and the text after the brace.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([' ', ',']);
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = text.find('=')?;
        let name = text[..eq].trim().to_owned();
        text = text[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = text.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((name, value));
        text = &text[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_and_escapes() {
        let body = "# HELP a_b help\n# TYPE a_b gauge\na_b{pod=\"p\\\"1\",ns=\"x\\\\y\\n\"} 42.5\nplain 7 1700000000\n# EOF\n";
        let (samples, bad) = parse_samples(body);
        assert_eq!(bad, 0);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].label("pod"), Some("p\"1"));
        assert_eq!(samples[0].label("ns"), Some("x\\y\n"));
        assert_eq!(samples[0].value, 42.5);
        assert_eq!(samples[1].name, "plain");
        assert!(samples[1].labels.is_empty());
    }

    #[test]
    fn bad_lines_are_counted_not_fatal() {
        let body = "ok 1\n{x=\"1\"} 2\nbad{x=\"1\" 3\nworse{x=1} 4\nnovalue\nv NaNx\nlast{a=\"b\",} +Inf\n";
        let (samples, bad) = parse_samples(body);
        assert_eq!(bad, 5);
        assert_eq!(samples.len(), 2);
        assert!(samples[1].value.is_infinite());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in ".{0,200}") {
            let _ = parse_samples(&body);
        }

        #[test]
        fn label_values_round_trip(value in "[ -~\\n]{0,30}") {
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let (samples, bad) = parse_samples(&format!("m{{l=\"{escaped}\"}} 1\n"));
            proptest::prop_assert_eq!(bad, 0);
            proptest::prop_assert_eq!(samples[0].label("l"), Some(value.as_str()));
        }
    }
}
