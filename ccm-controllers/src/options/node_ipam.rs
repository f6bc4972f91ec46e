//! The flags of the node-IPAM controller.

use clap::Args;

/// Flags of the node-IPAM controller (Go's `NodeIPAMControllerOptions` and
/// `--cidr-allocator-type`); they take effect with `--allocate-node-cidrs=true`.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Node IPAM controller")]
pub struct NodeIpamArgs {
    /// The allocator of pod CIDRs: `RangeAllocator` (built in), or one the provider registered
    /// (e.g. `CloudAllocator`); any other name stops startup.
    #[arg(long, default_value = "RangeAllocator", value_name = "TYPE")]
    pub cidr_allocator_type: String,
    /// Mask size of a Node's pod CIDR for a single-stack cluster; default 24 for IPv4 and 64
    /// for IPv6 (0 = not set). Not allowed with dual stack.
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub node_cidr_mask_size: u8,
    /// Mask size of a Node's IPv4 pod CIDR; default 24 (0 = not set).
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pub node_cidr_mask_size_ipv4: u8,
    /// Mask size of a Node's IPv6 pod CIDR; default 64 (0 = not set).
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub node_cidr_mask_size_ipv6: u8,
    /// The Service CIDR (or an IPv4 and an IPv6 one, comma-separated): kept out of the pod CIDRs
    /// given to Nodes.
    #[arg(long, default_value = "", value_name = "CIDRS")]
    pub service_cluster_ip_range: String,
}
