//! Reading the runtime's `/metrics` exposition (OpenMetrics text).

use std::collections::BTreeMap;

/// The samples of a metrics exposition, `series -> value`.
pub(crate) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Checks the OpenMetrics text format: every line is a `# HELP`/`# TYPE`/`# UNIT` comment or
/// a sample `name{labels} value` of a declared family, and the exposition ends with `# EOF`.
pub(crate) fn assert_openmetrics(text: &str) {
    let mut families: Vec<(String, String)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "must end with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "bad comment {line:?}"
            );
            if kind == "TYPE" {
                let t = parts.next().unwrap();
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "info",
                        "unknown",
                        "stateset",
                        "summary",
                        "gaugehistogram"
                    ]
                    .contains(&t),
                    "bad type {line:?}"
                );
                families.push((name.to_owned(), t.to_owned()));
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}"));
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value in {line:?}"
        );
        let name = series.split('{').next().unwrap();
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            {
                assert!(
                    labels.starts_with('{') && labels.ends_with("\"}"),
                    "bad labels {line:?}"
                );
                for pair in labels[1..labels.len() - 1].split("\",") {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad label {line:?}"));
                    assert!(!k.is_empty() && v.starts_with('"'), "bad label {line:?}");
                }
            }
        }
        let declared = families.iter().any(|(family, t)| {
            let suffixes: &[&str] = match t.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name == format!("{family}{s}"))
        });
        assert!(declared, "sample {line:?} has no # TYPE");
    }
}
