//! Provider IDs, CIDRs (`--cluster-cidr`, route destinations, the range allocator's blocks),
//! the node-IP annotation and the in-process server's `--fault` rules. The input is text
//! whose lines feed the parsers.
#![no_main]

use ccm_controllers::fuzzing;
use ccm_core::ProviderId;
use ccm_testing::apiserver::ApiFaultRule;
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let second = lines.next().unwrap_or_default();

    // A provider ID that parses prints back to the same text and parses to the same value.
    if let Ok(id) = first.parse::<ProviderId>() {
        let printed = id.to_string();
        assert_eq!(printed.parse::<ProviderId>().as_ref(), Ok(&id), "{first:?}");
        assert!(ProviderId::new(id.provider(), id.instance_id()).is_ok());
    }
    let _ = first.parse::<ApiFaultRule>();
    fuzzing::node_ip_annotation(first);
    fuzzing::route_cidrs(first, second);
    let _ = ccm_controllers::controllers::route::parse_cluster_cidrs(second);

    // The range allocator: the first line a cluster CIDR and node mask (`10.0.0.0/16 24`),
    // the next lines CIDRs to occupy, the bytes of the last line the steps.
    let mut words = first.split_whitespace();
    let (Some(cluster), Some(mask)) = (words.next(), words.next()) else {
        return;
    };
    let (Ok(cluster), Ok(mask)) = (cluster.parse::<IpNet>(), mask.parse::<u8>()) else {
        return;
    };
    let rest: Vec<&str> = std::iter::once(second).chain(lines).collect();
    let others: Vec<IpNet> = rest.iter().filter_map(|l| l.trim().parse().ok()).collect();
    let steps = rest.last().map(|l| l.as_bytes()).unwrap_or_default();
    fuzzing::cidr_set(cluster, mask, &others, &steps[..steps.len().min(256)]);
});
