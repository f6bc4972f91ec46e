//! Pure pod-CIDR allocation: Go's `cidrset` (one bitmap of node-sized blocks per cluster CIDR)
//! and the range allocator's bookkeeping of which Node holds which blocks. No I/O.
//!
//! Hand-written (no crate slices a CIDR into a bitmap of fixed-size blocks with Go's candidate
//! order); `ipnet` does the address parsing and containment.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Go's `clusterSubnetMaxDiff`: an IPv6 node mask may be at most 16 bits longer than the
/// cluster mask (the bitmap would be too large otherwise).
pub(crate) const CLUSTER_SUBNET_MAX_DIFF: u8 = 16;

/// Go's `ErrCIDRRangeNoCIDRsRemaining`.
pub(crate) const NO_CIDRS_REMAINING: &str =
    "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range";

/// Why a pool could not be built (Go's validation messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    /// A node mask shorter than its cluster CIDR's mask.
    #[error(
        "invalid --cluster-cidr {cluster}: the mask size of the cluster CIDR must be less than or equal to the node CIDR mask size configured for its family (/{node_mask})"
    )]
    MaskTooShort {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask configured for its family.
        node_mask: u8,
    },
    /// A node mask longer than the address.
    #[error("node CIDR mask size /{node_mask} is not valid for {cluster}")]
    MaskTooLong {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask.
        node_mask: u8,
    },
    /// Go's `ErrCIDRSetSubNetTooBig` (IPv6 only).
    #[error(
        "New CIDR set failed; the node CIDR size is too big: /{node_mask} is more than {CLUSTER_SUBNET_MAX_DIFF} bits longer than {cluster}"
    )]
    SubNetTooBig {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask.
        node_mask: u8,
    },
}

/// A CIDR could not be marked as used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OccupyError {
    /// Not inside the cluster CIDR of its index (Go: "cidr %v is out the range of cluster cidr %v").
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange {
        /// The Node's CIDR.
        cidr: IpNet,
        /// The cluster CIDR of the same index.
        cluster: IpNet,
    },
    /// More CIDRs than cluster CIDRs (Go: "has an allocated cidr ... at index ... that does not
    /// exist in cluster cidrs configuration").
    #[error(
        "allocated cidr {cidr} at index {index} does not exist in the cluster cidrs configuration"
    )]
    NoClusterCidr {
        /// The Node's CIDR.
        cidr: IpNet,
        /// Its index in `spec.podCIDRs`.
        index: usize,
    },
}

/// No block left in one cluster CIDR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("failed to allocate cidr from cluster cidr {cluster} at idx:{index}: {NO_CIDRS_REMAINING}")]
pub(crate) struct Exhausted {
    /// The index of the exhausted cluster CIDR.
    pub(crate) index: usize,
    /// The exhausted cluster CIDR.
    pub(crate) cluster: IpNet,
}

/// The blocks of one cluster CIDR (Go's `CidrSet`): block `i` is the `i`-th node-sized subnet.
#[derive(Clone, Debug)]
pub(crate) struct CidrSet {
    cluster: IpNet,
    node_mask: u8,
    max: u64,
    /// One bit per block; grown on demand, so a large range costs memory only up to the
    /// highest block used.
    used: Vec<u64>,
    /// Holders of a block beyond the first (a reserved Service range, or two Nodes given the
    /// same CIDR by someone else): releasing one holder keeps the block used.
    extra: HashMap<u64, u32>,
    allocated: u64,
    next: u64,
}

/// What an allocation did, for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// One CIDR per cluster CIDR, in the cluster CIDRs' order.
    pub(crate) cidrs: Vec<IpNet>,
    /// Per cluster CIDR: blocks tried before a free one (Go's `allocation_tries_per_request`).
    pub(crate) tries: Vec<u64>,
}

fn family_bits(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    }
}

fn addr_to_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl CidrSet {
    /// Go's `NewCIDRSet`: the blocks of size `/node_mask` in `cluster`.
    pub(crate) fn new(cluster: IpNet, node_mask: u8) -> Result<Self, PoolError> {
        let cluster = cluster.trunc();
        let bits = family_bits(&cluster);
        if node_mask > bits {
            return Err(PoolError::MaskTooLong { cluster, node_mask });
        }
        if node_mask < cluster.prefix_len() {
            return Err(PoolError::MaskTooShort { cluster, node_mask });
        }
        let diff = node_mask - cluster.prefix_len();
        if bits == 128 && diff > CLUSTER_SUBNET_MAX_DIFF {
            return Err(PoolError::SubNetTooBig { cluster, node_mask });
        }
        Ok(CidrSet {
            cluster,
            node_mask,
            max: 1u64 << diff,
            used: Vec::new(),
            extra: HashMap::new(),
            allocated: 0,
            next: 0,
        })
    }

    /// The cluster CIDR.
    pub(crate) fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// How many blocks the range has (Go's `maxCIDRs`).
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// How many blocks are in use (allocated, occupied or reserved).
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// The share of blocks in use, 0 to 1 (Go's `cidrset_usage_cidrs`).
    pub(crate) fn usage(&self) -> f64 {
        self.allocated as f64 / self.max as f64
    }

    fn is_set(&self, i: u64) -> bool {
        self.used
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, i: u64) {
        let word = (i / 64) as usize;
        if self.used.len() <= word {
            self.used.resize(word + 1, 0);
        }
        self.used[word] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: u64) {
        if let Some(w) = self.used.get_mut((i / 64) as usize) {
            *w &= !(1 << (i % 64));
        }
    }

    /// The block with index `i`.
    fn block(&self, i: u64) -> IpNet {
        let shift = u32::from(family_bits(&self.cluster) - self.node_mask);
        let base = addr_to_u128(self.cluster.network());
        // A shift of 128 (`::/0` split into `/0` blocks) has one block, index 0.
        let addr = base + u128::from(i).checked_shl(shift).unwrap_or(0);
        match self.cluster {
            // In range by construction: `i < max` keeps the address inside the cluster CIDR.
            IpNet::V4(_) => IpNet::V4(
                Ipv4Net::new(Ipv4Addr::from(addr as u32), self.node_mask)
                    .unwrap_or_else(|_| Ipv4Net::default()),
            ),
            IpNet::V6(_) => IpNet::V6(
                Ipv6Net::new(Ipv6Addr::from(addr), self.node_mask)
                    .unwrap_or_else(|_| Ipv6Net::default()),
            ),
        }
    }

    /// The index of the block holding `addr` (which must be inside the cluster CIDR).
    fn index_of(&self, addr: IpAddr) -> u64 {
        let shift = u32::from(family_bits(&self.cluster) - self.node_mask);
        let offset = addr_to_u128(addr) - addr_to_u128(self.cluster.network());
        offset.checked_shr(shift).unwrap_or(0) as u64
    }

    /// The blocks `cidr` covers (Go's `getBeginningAndEndIndices`): all of them when `cidr`
    /// contains the cluster CIDR, else those from its first to its last address.
    fn range_of(&self, cidr: &IpNet) -> Option<(u64, u64)> {
        let cidr = cidr.trunc();
        if family_bits(&cidr) != family_bits(&self.cluster) {
            return None;
        }
        if cidr.contains(&self.cluster) {
            return Some((0, self.max - 1));
        }
        if !self.cluster.contains(&cidr) {
            return None;
        }
        Some((
            self.index_of(cidr.network()),
            self.index_of(cidr.broadcast()),
        ))
    }

    /// Go's `AllocateNext`: the first free block from the candidate after the last one given
    /// out, wrapping around. Returns the block and how many taken blocks were passed over.
    pub(crate) fn allocate_next(&mut self) -> Option<(IpNet, u64)> {
        if self.allocated >= self.max {
            return None;
        }
        let mut candidate = self.next;
        for tries in 0..self.max {
            if !self.is_set(candidate) {
                self.set(candidate);
                self.allocated += 1;
                self.next = (candidate + 1) % self.max;
                return Some((self.block(candidate), tries));
            }
            candidate = (candidate + 1) % self.max;
        }
        None
    }

    /// Go's `Occupy`: marks every block `cidr` covers as used (a block already used gets one
    /// more holder).
    pub(crate) fn occupy(&mut self, cidr: &IpNet) -> Result<(), OccupyError> {
        let (begin, end) = self.range_of(cidr).ok_or(OccupyError::OutOfRange {
            cidr: *cidr,
            cluster: self.cluster,
        })?;
        for i in begin..=end {
            if self.is_set(i) {
                *self.extra.entry(i).or_insert(0) += 1;
            } else {
                self.set(i);
                self.allocated += 1;
            }
        }
        Ok(())
    }

    /// Go's `Release`: drops one holder of every block `cidr` covers; a block without holders
    /// is free again. Returns how many blocks became free.
    pub(crate) fn release(&mut self, cidr: &IpNet) -> Result<u64, OccupyError> {
        let (begin, end) = self.range_of(cidr).ok_or(OccupyError::OutOfRange {
            cidr: *cidr,
            cluster: self.cluster,
        })?;
        let mut freed = 0;
        for i in begin..=end {
            if let Some(n) = self.extra.get_mut(&i) {
                *n -= 1;
                if *n == 0 {
                    self.extra.remove(&i);
                }
            } else if self.is_set(i) {
                self.clear(i);
                self.allocated -= 1;
                freed += 1;
            }
        }
        Ok(freed)
    }
}

/// Every cluster CIDR's blocks and which Node holds which CIDRs: the range allocator's state.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    sets: Vec<CidrSet>,
    held: HashMap<String, Vec<IpNet>>,
}

/// What [`Pool::occupy`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupied {
    /// CIDRs the Node had that could not be marked (out of every cluster CIDR): not tracked.
    pub(crate) rejected: Vec<OccupyError>,
    /// The CIDRs the pool had recorded for this Node before, now released (it holds others).
    pub(crate) replaced: Vec<IpNet>,
}

impl Pool {
    /// One [`CidrSet`] per cluster CIDR (with the node mask of the same index), with `reserved`
    /// (the Service ranges) taken out wherever they overlap a cluster CIDR.
    pub(crate) fn new(
        clusters: &[IpNet],
        node_masks: &[u8],
        reserved: &[IpNet],
    ) -> Result<Self, PoolError> {
        let mut sets = clusters
            .iter()
            .zip(node_masks)
            .map(|(c, m)| CidrSet::new(*c, *m))
            .collect::<Result<Vec<_>, _>>()?;
        for r in reserved {
            for set in &mut sets {
                // Go's filterOutServiceRange: only where the ranges overlap.
                if set.range_of(r).is_some() {
                    let _ = set.occupy(r);
                }
            }
        }
        Ok(Pool {
            sets,
            held: HashMap::new(),
        })
    }

    /// The cluster CIDRs' sets, in order.
    pub(crate) fn sets(&self) -> &[CidrSet] {
        &self.sets
    }

    /// The CIDRs the pool holds for `node`.
    #[cfg(test)]
    pub(crate) fn held_by(&self, node: &str) -> Option<&[IpNet]> {
        self.held.get(node).map(Vec::as_slice)
    }

    /// How many Nodes hold CIDRs.
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> usize {
        self.held.len()
    }

    /// The names of the Nodes that hold CIDRs.
    pub(crate) fn held_nodes(&self) -> Vec<String> {
        self.held.keys().cloned().collect()
    }

    /// Records that `node` has `cidrs` (its `spec.podCIDRs`, index `i` from cluster CIDR `i`):
    /// marks them used. Idempotent; when the pool held other CIDRs for the Node (given out here,
    /// but the Node got others), those are released. A CIDR outside its cluster CIDR is
    /// reported and not tracked; the others are.
    pub(crate) fn occupy(&mut self, node: &str, cidrs: &[IpNet]) -> Occupied {
        let mut out = Occupied::default();
        if self.held.get(node).is_some_and(|h| h == cidrs) {
            return out;
        }
        out.replaced = self.release(node);
        let mut tracked = Vec::with_capacity(cidrs.len());
        for (index, cidr) in cidrs.iter().enumerate() {
            let Some(set) = self.sets.get_mut(index) else {
                out.rejected
                    .push(OccupyError::NoClusterCidr { cidr: *cidr, index });
                continue;
            };
            match set.occupy(cidr) {
                Ok(()) => tracked.push(*cidr),
                Err(e) => out.rejected.push(e),
            }
        }
        if !tracked.is_empty() {
            self.held.insert(node.to_owned(), tracked);
        }
        out
    }

    /// Reserves one CIDR per cluster CIDR for `node` (Go's `AllocateOrOccupyCIDR` for a Node
    /// without CIDRs). When the pool already holds CIDRs for the Node (an earlier attempt whose
    /// write failed), returns those. When one cluster CIDR is exhausted, nothing stays reserved.
    pub(crate) fn allocate(&mut self, node: &str) -> Result<Allocation, Exhausted> {
        if let Some(held) = self.held.get(node) {
            return Ok(Allocation {
                cidrs: held.clone(),
                tries: vec![0; held.len()],
            });
        }
        let mut cidrs = Vec::with_capacity(self.sets.len());
        let mut tries = Vec::with_capacity(self.sets.len());
        for index in 0..self.sets.len() {
            match self.sets[index].allocate_next() {
                Some((cidr, t)) => {
                    cidrs.push(cidr);
                    tries.push(t);
                }
                None => {
                    for (set, cidr) in self.sets.iter_mut().zip(&cidrs) {
                        let _ = set.release(cidr);
                    }
                    return Err(Exhausted {
                        index,
                        cluster: self.sets[index].cluster,
                    });
                }
            }
        }
        self.held.insert(node.to_owned(), cidrs.clone());
        Ok(Allocation { cidrs, tries })
    }

    /// Releases what the pool holds for `node` (a deleted Node, or a reservation that was not
    /// written). Returns the released CIDRs.
    pub(crate) fn release(&mut self, node: &str) -> Vec<IpNet> {
        let Some(cidrs) = self.held.remove(node) else {
            return Vec::new();
        };
        for (set, cidr) in self.sets.iter_mut().zip(&cidrs) {
            let _ = set.release(cidr);
        }
        cidrs
    }
}

/// Node mask sizes per cluster CIDR, Go's `setNodeCIDRMaskSizes`: `--node-cidr-mask-size` (`0`
/// = unset) for single-stack, the per-family flags otherwise; defaults /24 and /64.
pub(crate) fn node_mask_sizes(
    clusters: &[IpNet],
    mask: u8,
    mask_v4: u8,
    mask_v6: u8,
) -> Result<Vec<u8>, String> {
    let sorted = |v4: u8, v6: u8| -> Vec<u8> {
        clusters
            .iter()
            .map(|c| match c {
                IpNet::V4(_) => v4,
                IpNet::V6(_) => v6,
            })
            .collect()
    };
    let (mut v4, mut v6) = (DEFAULT_NODE_MASK_V4, DEFAULT_NODE_MASK_V6);
    if clusters.len() > 1 {
        if mask != 0 {
            return Err(
                "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".into(),
            );
        }
        if mask_v4 != 0 {
            v4 = mask_v4;
        }
        if mask_v6 != 0 {
            v6 = mask_v6;
        }
        return Ok(sorted(v4, v6));
    }
    let single_v6 = matches!(clusters.first(), Some(IpNet::V6(_)));
    if mask != 0 {
        if mask_v4 != 0 || mask_v6 != 0 {
            return Err("usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily specific flags".into());
        }
        return Ok(sorted(mask, mask));
    }
    if mask_v4 != 0 {
        if single_v6 {
            return Err(
                "usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster"
                    .into(),
            );
        }
        v4 = mask_v4;
    }
    if mask_v6 != 0 {
        if !single_v6 {
            return Err(
                "usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster"
                    .into(),
            );
        }
        v6 = mask_v6;
    }
    Ok(sorted(v4, v6))
}

/// Go's default node mask for IPv4 (`defaultNodeMaskCIDRIPv4`).
pub const DEFAULT_NODE_MASK_V4: u8 = 24;
/// Go's default node mask for IPv6 (`defaultNodeMaskCIDRIPv6`).
pub const DEFAULT_NODE_MASK_V6: u8 = 64;

/// Parses `spec.podCIDRs` (or the single `spec.podCIDR` when the list is empty).
pub(crate) fn node_pod_cidrs(
    pod_cidrs: Option<&[String]>,
    pod_cidr: Option<&str>,
) -> Result<Vec<IpNet>, String> {
    let raw: Vec<&str> = match pod_cidrs {
        Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
        _ => pod_cidr.filter(|s| !s.is_empty()).into_iter().collect(),
    };
    raw.into_iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| format!("spec.podCIDRs: {s:?} is not a CIDR ({e})"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
