//! Unit tests of the node IPAM planner: the rules of the reference, one test per rule.

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

#[test]
fn allocates_blocks_in_order_and_exhausts() {
    let mut set = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
    assert_eq!(set.max(), 4);
    let got: Vec<IpNet> = (0..4).map(|_| set.allocate_next().unwrap().0).collect();
    assert_eq!(
        got,
        ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"].map(net)
    );
    assert_eq!(set.allocate_next(), None);
    assert_eq!(set.usage(), 1.0);
}

/// The whole IPv6 space as one block (`::/0`, node mask 0; found by the `addresses` fuzz
/// target: the 128-bit shift overflowed).
#[test]
fn the_whole_ipv6_space_is_one_block() {
    let mut set = CidrSet::new(net("::/0"), 0).unwrap();
    assert_eq!(set.max(), 1);
    assert_eq!(set.allocate_next(), Some((net("::/0"), 0)));
    assert_eq!(set.allocate_next(), None);
    assert_eq!(set.release(&net("::/0")), Ok(1));
    set.occupy(&net("::/0")).unwrap();
    assert_eq!(set.allocated(), 1);
}

#[test]
fn release_makes_a_block_available_and_the_candidate_moves_on() {
    let mut set = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
    for _ in 0..3 {
        set.allocate_next().unwrap();
    }
    assert_eq!(set.release(&net("10.0.1.0/24")), Ok(1));
    // Next candidate is block 3 (after the last given), then wraps to the freed block 1.
    assert_eq!(set.allocate_next().unwrap(), (net("10.0.3.0/24"), 0));
    assert_eq!(set.allocate_next().unwrap(), (net("10.0.1.0/24"), 1));
    assert_eq!(set.allocate_next(), None);
}

#[test]
fn occupy_skips_taken_blocks_and_counts_tries() {
    let mut set = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
    set.occupy(&net("10.0.0.0/24")).unwrap();
    set.occupy(&net("10.0.1.0/24")).unwrap();
    assert_eq!(set.allocate_next().unwrap(), (net("10.0.2.0/24"), 2));
    assert_eq!(set.allocated(), 3);
}

#[test]
fn occupy_larger_and_smaller_cidrs() {
    let mut set = CidrSet::new(net("10.0.0.0/16"), 24).unwrap();
    // A /23 covers two blocks; a /25 one.
    set.occupy(&net("10.0.4.0/23")).unwrap();
    set.occupy(&net("10.0.9.128/25")).unwrap();
    assert_eq!(set.allocated(), 3);
    assert!(set.is_set(4) && set.is_set(5) && set.is_set(9));
    // A range containing the whole cluster CIDR takes everything.
    let mut small = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
    small.occupy(&net("10.0.0.0/8")).unwrap();
    assert_eq!(small.allocate_next(), None);
}

#[test]
fn occupy_out_of_range_or_other_family_is_an_error() {
    let mut set = CidrSet::new(net("10.0.0.0/16"), 24).unwrap();
    for bad in ["10.1.0.0/24", "fd00::/64", "192.168.0.0/16"] {
        assert!(
            matches!(set.occupy(&net(bad)), Err(OccupyError::OutOfRange { .. })),
            "{bad}"
        );
    }
    assert_eq!(set.allocated(), 0);
}

#[test]
fn a_block_with_two_holders_stays_used_until_both_release() {
    let mut set = CidrSet::new(net("10.0.0.0/23"), 24).unwrap();
    set.occupy(&net("10.0.0.0/24")).unwrap();
    set.occupy(&net("10.0.0.0/24")).unwrap();
    assert_eq!(set.release(&net("10.0.0.0/24")), Ok(0));
    assert!(set.is_set(0));
    assert_eq!(set.release(&net("10.0.0.0/24")), Ok(1));
    assert!(!set.is_set(0));
    // Releasing a free block is a no-op.
    assert_eq!(set.release(&net("10.0.0.0/24")), Ok(0));
    assert_eq!(set.allocated(), 0);
}

#[test]
fn ipv6_blocks_and_limits() {
    let mut set = CidrSet::new(net("fd00:10::/56"), 64).unwrap();
    assert_eq!(set.max(), 256);
    assert_eq!(set.allocate_next().unwrap().0, net("fd00:10::/64"));
    assert_eq!(set.allocate_next().unwrap().0, net("fd00:10:0:1::/64"));
    assert_eq!(
        CidrSet::new(net("fd00::/47"), 64).unwrap_err(),
        PoolError::SubNetTooBig {
            cluster: net("fd00::/47"),
            node_mask: 64
        }
    );
    assert!(CidrSet::new(net("fd00::/48"), 64).is_ok());
    // /128 blocks.
    let mut tiny = CidrSet::new(net("fd00::/127"), 128).unwrap();
    assert_eq!(tiny.allocate_next().unwrap().0, net("fd00::/128"));
    assert_eq!(tiny.allocate_next().unwrap().0, net("fd00::1/128"));
    assert_eq!(tiny.allocate_next(), None);
}

#[test]
fn mask_validation() {
    assert_eq!(
        CidrSet::new(net("10.0.0.0/16"), 8).unwrap_err(),
        PoolError::MaskTooShort {
            cluster: net("10.0.0.0/16"),
            node_mask: 8
        }
    );
    assert!(matches!(
        CidrSet::new(net("10.0.0.0/16"), 33),
        Err(PoolError::MaskTooLong { .. })
    ));
    // Equal masks: one block.
    assert_eq!(CidrSet::new(net("10.0.0.0/24"), 24).unwrap().max(), 1);
    // IPv4 has no difference limit in Go; memory grows only with the blocks used.
    let mut wide = CidrSet::new(net("10.0.0.0/8"), 32).unwrap();
    assert_eq!(wide.max(), 1 << 24);
    assert_eq!(wide.allocate_next().unwrap().0, net("10.0.0.0/32"));
    assert_eq!(wide.used.len(), 1);
    // A host address in --cluster-cidr is truncated (Go's ParseCIDR returns the network).
    assert_eq!(
        CidrSet::new(net("10.0.3.7/16"), 24).unwrap().cluster(),
        net("10.0.0.0/16")
    );
}

#[test]
fn service_range_is_kept_out_of_the_pool() {
    let pool = Pool::new(
        &[net("10.0.0.0/16")],
        &[24],
        &[net("10.0.8.0/22"), net("10.96.0.0/12"), net("fd00::/108")],
    )
    .unwrap();
    assert_eq!(pool.sets()[0].allocated(), 4);
    let mut pool = pool;
    let mut given = Vec::new();
    while let Ok(a) = pool.allocate(&format!("n{}", given.len())) {
        given.push(a.cidrs[0]);
    }
    assert_eq!(given.len(), 252);
    for cidr in &given {
        assert!(!net("10.0.8.0/22").contains(cidr), "{cidr}");
    }
    // A Service range containing the whole cluster CIDR leaves nothing.
    let mut none = Pool::new(&[net("10.0.0.0/24")], &[26], &[net("10.0.0.0/16")]).unwrap();
    assert!(none.allocate("a").is_err());
}

#[test]
fn dual_stack_allocates_one_per_family_in_cluster_order() {
    let mut pool = Pool::new(&[net("fd00::/120"), net("10.0.0.0/24")], &[124, 28], &[]).unwrap();
    let a = pool.allocate("a").unwrap();
    assert_eq!(a.cidrs, vec![net("fd00::/124"), net("10.0.0.0/28")]);
    let b = pool.allocate("b").unwrap();
    assert_eq!(b.cidrs, vec![net("fd00::10/124"), net("10.0.0.16/28")]);
    assert_eq!(pool.held_by("a"), Some(&a.cidrs[..]));
}

#[test]
fn exhaustion_of_the_second_family_leaves_nothing_reserved() {
    // IPv4 has 4 blocks, IPv6 only 2.
    let mut pool = Pool::new(&[net("10.0.0.0/22"), net("fd00::/127")], &[24, 128], &[]).unwrap();
    pool.allocate("a").unwrap();
    pool.allocate("b").unwrap();
    let err = pool.allocate("c").unwrap_err();
    assert_eq!(
        err,
        Exhausted {
            index: 1,
            cluster: net("fd00::/127")
        }
    );
    assert!(err.to_string().contains(NO_CIDRS_REMAINING));
    assert_eq!(
        pool.sets()[0].allocated(),
        2,
        "the IPv4 block was given back"
    );
    assert_eq!(pool.held_by("c"), None);
}

#[test]
fn allocate_is_idempotent_per_node_and_release_frees() {
    let mut pool = Pool::new(&[net("10.0.0.0/23")], &[24], &[]).unwrap();
    let first = pool.allocate("a").unwrap();
    assert_eq!(pool.allocate("a").unwrap().cidrs, first.cidrs);
    assert_eq!(pool.sets()[0].allocated(), 1);
    assert_eq!(pool.release("a"), first.cidrs);
    assert_eq!(pool.release("a"), Vec::<IpNet>::new());
    assert_eq!(pool.sets()[0].allocated(), 0);
    assert_eq!(pool.nodes(), 0);
}

#[test]
fn occupy_existing_then_allocate_never_repeats_a_cidr() {
    // The restart case: half the range is on existing Nodes, in no particular order.
    let mut pool = Pool::new(&[net("10.244.0.0/16")], &[24], &[]).unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in (0..256).step_by(2).rev() {
        let cidr = net(&format!("10.244.{i}.0/24"));
        let out = pool.occupy(&format!("old-{i}"), &[cidr]);
        assert_eq!(out, Occupied::default());
        seen.insert(cidr);
    }
    for i in 0..128 {
        let a = pool.allocate(&format!("new-{i}")).unwrap();
        assert!(seen.insert(a.cidrs[0]), "{} given twice", a.cidrs[0]);
    }
    assert!(pool.allocate("one-too-many").is_err());
    assert_eq!(seen.len(), 256);
}

#[test]
fn occupy_is_idempotent_and_replaces_a_stale_reservation() {
    let mut pool = Pool::new(&[net("10.0.0.0/22")], &[24], &[]).unwrap();
    let reserved = pool.allocate("a").unwrap().cidrs;
    // The Node was given another CIDR by someone else: ours goes back.
    let out = pool.occupy("a", &[net("10.0.2.0/24")]);
    assert_eq!(out.replaced, reserved);
    assert_eq!(pool.sets()[0].allocated(), 1);
    assert_eq!(pool.occupy("a", &[net("10.0.2.0/24")]), Occupied::default());
    assert_eq!(pool.sets()[0].allocated(), 1);
}

#[test]
fn occupy_reports_cidrs_it_cannot_track() {
    let mut pool = Pool::new(&[net("10.0.0.0/16")], &[24], &[]).unwrap();
    let out = pool.occupy("a", &[net("10.0.1.0/24"), net("fd00::/64")]);
    assert_eq!(
        out.rejected,
        vec![OccupyError::NoClusterCidr {
            cidr: net("fd00::/64"),
            index: 1
        }]
    );
    assert_eq!(pool.held_by("a"), Some(&[net("10.0.1.0/24")][..]));
    let out = pool.occupy("b", &[net("192.168.0.0/24")]);
    assert!(matches!(out.rejected[..], [OccupyError::OutOfRange { .. }]));
    assert_eq!(pool.held_by("b"), None);
}

#[test]
fn two_nodes_with_the_same_cidr_keep_it_used_until_both_are_gone() {
    let mut pool = Pool::new(&[net("10.0.0.0/23")], &[24], &[]).unwrap();
    pool.occupy("a", &[net("10.0.0.0/24")]);
    pool.occupy("b", &[net("10.0.0.0/24")]);
    pool.release("a");
    assert_eq!(pool.allocate("c").unwrap().cidrs, vec![net("10.0.1.0/24")]);
    assert!(pool.allocate("d").is_err());
    pool.release("b");
    assert_eq!(pool.allocate("d").unwrap().cidrs, vec![net("10.0.0.0/24")]);
}

#[test]
fn a_service_range_inside_a_node_block_survives_the_node() {
    let mut pool = Pool::new(&[net("10.0.0.0/23")], &[24], &[net("10.0.0.0/28")]).unwrap();
    pool.occupy("a", &[net("10.0.0.0/24")]);
    pool.release("a");
    assert_eq!(pool.sets()[0].allocated(), 1);
    assert_eq!(pool.allocate("b").unwrap().cidrs, vec![net("10.0.1.0/24")]);
}

#[test]
fn mask_sizes_follow_go() {
    let v4 = [net("10.0.0.0/16")];
    let v6 = [net("fd00::/48")];
    let dual = [net("10.0.0.0/16"), net("fd00::/48")];
    assert_eq!(node_mask_sizes(&v4, 0, 0, 0), Ok(vec![24]));
    assert_eq!(node_mask_sizes(&v6, 0, 0, 0), Ok(vec![64]));
    assert_eq!(node_mask_sizes(&dual, 0, 0, 0), Ok(vec![24, 64]));
    assert_eq!(node_mask_sizes(&dual, 0, 26, 80), Ok(vec![26, 80]));
    assert_eq!(node_mask_sizes(&v4, 25, 0, 0), Ok(vec![25]));
    assert_eq!(node_mask_sizes(&v6, 72, 0, 0), Ok(vec![72]));
    assert_eq!(node_mask_sizes(&v4, 0, 26, 0), Ok(vec![26]));
    assert_eq!(node_mask_sizes(&v6, 0, 0, 80), Ok(vec![80]));
    for (clusters, m, m4, m6, msg) in [
        (&dual[..], 24, 0, 0, "not allowed with dual-stack"),
        (
            &v4[..],
            24,
            25,
            0,
            "not allowed if --node-cidr-mask-size is set",
        ),
        (&v6[..], 0, 25, 0, "single-stack IPv6"),
        (&v4[..], 0, 0, 64, "single-stack IPv4"),
    ] {
        let err = node_mask_sizes(clusters, m, m4, m6).unwrap_err();
        assert!(err.contains(msg), "{err}");
    }
}

#[test]
fn pod_cidrs_of_a_node() {
    let list = vec!["10.0.1.0/24".to_owned(), "fd00::/64".to_owned()];
    assert_eq!(
        node_pod_cidrs(Some(&list), Some("10.0.1.0/24")),
        Ok(vec![net("10.0.1.0/24"), net("fd00::/64")])
    );
    assert_eq!(
        node_pod_cidrs(None, Some("10.0.1.0/24")),
        Ok(vec![net("10.0.1.0/24")])
    );
    assert_eq!(node_pod_cidrs(Some(&[]), Some("")), Ok(vec![]));
    assert!(node_pod_cidrs(Some(&["bogus".to_owned()]), None).is_err());
}
