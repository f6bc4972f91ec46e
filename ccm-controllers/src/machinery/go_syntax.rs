//! Go's syntax for values that flags, the cloud-call budget and secure serving all read or
//! print: durations as `time.ParseDuration` parses and `time.Duration.String` prints them.
//! A leaf: it imports nothing of this crate.

use std::time::Duration;

/// Parses a Go duration (`time.ParseDuration`): an optional sign, then one or more
/// `<number><unit>` pairs with units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h` and optional fractions
/// (`1.5h`, `2m0s`, `300ms`). A bare `0` is zero. Negative durations are rejected here (every
/// duration flag of a CCM must be non-negative), with a message the flag error quotes.
///
/// Hand-written (about 40 lines) because `humantime` accepts a different syntax (`2min`,
/// spaces, no fractions) and Go's exact grammar is what operators' manifests contain.
pub fn parse_go_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration; use Go syntax such as 30s, 2m0s or 1h30m".to_owned());
    }
    let (negative, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(format!("invalid duration {input:?}"));
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "invalid duration {input:?}: expected a number; use Go syntax such as 30s, 2m0s or 1h30m"
            ));
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| {
            format!(
                "invalid duration {input:?}: bad number {:?}",
                &rest[..num_len]
            )
        })?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "invalid duration {input:?}: missing unit (ns, us, ms, s, m, h), e.g. 30s"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {input:?}: unknown unit {other:?} (use ns, us, ms, s, m, h)"
                ));
            }
        };
        total += number * seconds;
    }
    if negative && total > 0.0 {
        return Err(format!("{input:?} is negative; durations must be >= 0"));
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("invalid duration {input:?}: {e}"))
}

/// Formats a duration the way Go prints one (`2m0s`, `1h30m0s`, `500ms`, `0s`).
pub(crate) fn format_go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d < Duration::from_secs(1) {
        let nanos = d.as_nanos();
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}µs", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let frac = d.subsec_nanos();
    let s_part = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{:09}", frac);
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{s_part}")
    } else if m > 0 {
        format!("{m}m{s_part}")
    } else {
        s_part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let ok = [
            ("0", 0.0),
            ("0s", 0.0),
            ("15s", 15.0),
            ("2m0s", 120.0),
            ("1h30m", 5400.0),
            ("500ms", 0.5),
            ("1.5h", 5400.0),
            ("1m30.5s", 90.5),
            ("100us", 0.0001),
            ("+3s", 3.0),
        ];
        for (input, secs) in ok {
            let got = parse_go_duration(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert!(
                (got.as_secs_f64() - secs).abs() < 1e-9,
                "{input}: {got:?} != {secs}"
            );
        }
        for bad in ["", "15", "1x", "s", "-5s", "1.2.3s", "5 s", "--1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} should fail");
        }
        assert!(parse_go_duration("-5s").unwrap_err().contains("negative"));
    }

    #[test]
    fn go_duration_format() {
        assert_eq!(format_go_duration(Duration::from_secs(120)), "2m0s");
        assert_eq!(format_go_duration(Duration::from_secs(5400)), "1h30m0s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
    }
}
