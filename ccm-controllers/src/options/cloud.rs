//! `--cloud-provider`, `--cloud-config`, `--allow-untagged-cloud`, `--managed-node-selector`.

use std::path::PathBuf;

use clap::{ArgAction, Args};

use super::parse_path;
use crate::machinery::label_selector::ManagedNodeSelector;

/// The cloud provider and its configuration.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Cloud provider")]
pub struct CloudArgs {
    /// The provider to run, by its registered name (required).
    #[arg(long, value_name = "NAME")]
    pub cloud_provider: Option<String>,
    /// Path to the provider's configuration file; its bytes are passed to the provider's
    /// factory. An unreadable file stops startup.
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub cloud_config: Option<PathBuf>,
    /// Start even though the provider does not tag cloud resources with a cluster ID
    /// (deprecated in Go, still honoured).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allow_untagged_cloud: bool,
    /// A label selector (kubectl's `-l` syntax, e.g. `node.example.com/cloud=acme`) of the
    /// Nodes this cloud-controller-manager manages; Nodes it does not select are left to
    /// another one: never initialised, deleted, tainted, load-balanced, routed or given a pod
    /// CIDR, and never asked about in the cloud. Nodes whose provider ID names another
    /// provider are left alone with or without it. Unset (the default): every other Node is
    /// ours, as in Go. A selector that does not parse stops startup.
    #[arg(long, value_name = "SELECTOR")]
    pub managed_node_selector: Option<ManagedNodeSelector>,
}
