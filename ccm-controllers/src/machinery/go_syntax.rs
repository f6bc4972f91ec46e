//! Go's syntax for values that flags, the cloud-call budget and secure serving all read or
//! print: durations as `time.ParseDuration` parses and `time.Duration.String` prints them.
//! A leaf: it imports nothing of this crate.

use std::time::Duration;

/// Parses a Go duration (`time.ParseDuration`): an optional sign, then one or more
/// `<number><unit>` pairs with units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h` and optional fractions
/// (`1.5h`, `2m0s`, `300ms`, `.5s`). A bare `0` is zero. Negative durations are rejected here
/// (every duration flag of a CCM must be non-negative), with a message the flag error quotes.
///
/// Arithmetic is in whole nanoseconds, as Go's: `2321h232m` is exactly 8,369,520 s (a
/// floating-point sum would be off by a nanosecond), a fraction is truncated to the nanosecond,
/// and a duration above Go's maximum (2^63 ns, about 292 years) is an error, not a wrap.
///
/// Hand-written (about 60 lines) because `humantime` accepts a different syntax (`2min`,
/// spaces, no fractions), `kube::core::Duration` sums each term as an `f64` (the error this
/// parser avoids), and Go's exact grammar is what operators' manifests contain.
pub fn parse_go_duration(input: &str) -> Result<Duration, String> {
    /// Go's limit: a `time.Duration` is an int64 of nanoseconds.
    const MAX_NANOS: u128 = 1 << 63;
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
    let overflow = || {
        format!("invalid duration {input:?}: longer than Go's maximum (2562047h47m16.854775807s)")
    };
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let mut whole: u128 = 0;
        for digit in rest[..int_len].bytes() {
            whole = whole * 10 + u128::from(digit - b'0');
            if whole > MAX_NANOS {
                return Err(overflow());
            }
        }
        rest = &rest[int_len..];
        // The fraction's digits as an integer over 10^scale; digits past what 2^63 can hold are
        // read and ignored, as Go does.
        let (mut fraction, mut scale, mut fraction_len) = (0u128, 1u128, 0usize);
        if let Some(after_dot) = rest.strip_prefix('.') {
            fraction_len = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            for digit in after_dot[..fraction_len].bytes() {
                let longer = fraction * 10 + u128::from(digit - b'0');
                // Past 30 digits a digit is worth less than 10^-17 ns of an hour: dropped.
                if longer <= MAX_NANOS && scale < 10u128.pow(30) {
                    fraction = longer;
                    scale *= 10;
                }
            }
            rest = &after_dot[fraction_len..];
        }
        if int_len == 0 && fraction_len == 0 {
            return Err(format!(
                "invalid duration {input:?}: expected a number; use Go syntax such as 30s, 2m0s or 1h30m"
            ));
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
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
        total += whole * unit_nanos + fraction * unit_nanos / scale;
        if total > MAX_NANOS {
            return Err(overflow());
        }
    }
    if negative && total > 0 {
        return Err(format!("{input:?} is negative; durations must be >= 0"));
    }
    if total == MAX_NANOS {
        // 2^63 ns fits only as Go's most negative duration, which is rejected above.
        return Err(overflow());
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| overflow())?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| overflow())?;
    Ok(Duration::new(secs, nanos))
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

    /// Go sums whole nanoseconds: no floating-point error, fractions truncated, 2^63 ns the
    /// limit (the fuzzer found `2321h232m` parsing to 8369520.000000001s with a float sum).
    #[test]
    fn go_durations_are_exact_nanoseconds() {
        let exact = [
            ("2321h232m", Duration::from_secs(8_369_520)),
            ("1.1s", Duration::from_millis(1_100)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("0.1ns", Duration::ZERO),
            ("1.0000000019s", Duration::new(1, 1)),
            (
                "2562047h47m16.854775807s",
                Duration::new(9_223_372_036, 854_775_807),
            ),
            (
                "9223372036854775807ns",
                Duration::new(9_223_372_036, 854_775_807),
            ),
            (
                "1.00000000000000000000000000000000000000001s",
                Duration::from_secs(1),
            ),
            (
                "0.99999999999999999999999999999999999999h",
                Duration::new(3599, 999_999_999),
            ),
        ];
        for (input, want) in exact {
            assert_eq!(parse_go_duration(input), Ok(want), "{input}");
        }
        for too_long in [
            "2562048h",
            "9223372036854775808ns",
            "99999999999999999999999s",
            "2562047h47m16.854775808s",
        ] {
            let err = parse_go_duration(too_long).unwrap_err();
            assert!(err.contains("maximum"), "{too_long}: {err}");
        }
        for bad in [".s", ".", "1..5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} should fail");
        }
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
