//! Flags: the runtime's command line (one argument per line of the input), including the
//! `--controllers` grammar, Go durations, and the CIDR flags read after parsing.
#![no_main]

use ccm_controllers::{NoArgs, parse_flags, parse_go_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_go_duration(text)
        && d.as_secs() < 1_000_000_000
    {
        // A duration that parses, printed back in nanoseconds, parses to the same value.
        let again = parse_go_duration(&format!("{}ns", d.as_nanos()));
        assert_eq!(again, Ok(d), "{text:?}");
    }
    let mut args = vec!["cloud-controller-manager"];
    args.extend(text.lines().take(64));
    if let Ok((options, NoArgs)) = parse_flags::<NoArgs>(&args) {
        let _ = options.validate();
        let _ = options.cluster_cidrs();
        let _ = options.service_cidrs();
    }
});
