//! The flags of what the node controllers do beyond Go's `k8s.io/cloud-provider` to keep Nodes
//! true to the cloud, each off by default (docs/controllers.md, "Keeping Nodes true to the
//! cloud").

use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

use crate::machinery::go_syntax::parse_go_duration;

/// `--node-deletion-mode`: what a confirmed "gone" answer does to a Node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum NodeDeletionMode {
    /// Delete the Node (Go's behaviour, after `--node-deletion-grace-period`).
    #[default]
    Delete,
    /// Never delete: mark the Node with the `CloudProviderInstanceNotFound` condition, for
    /// operators who delete Nodes through their own tooling.
    Mark,
}

/// Flags of the node controllers beyond Go, each off by default.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Node controllers, beyond Go (each off by default)")]
pub struct NodeCloudStateArgs {
    /// Bring zone, region, instance type (GA and beta labels) and the provider's additional
    /// labels in step with the cloud at every status refresh (`--node-status-update-frequency`,
    /// from the answer the refresh already gets: no extra cloud call). Go writes them once,
    /// at initialisation. The cloud's value wins over an edited or removed label.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub reconcile_cloud_labels: bool,
    /// While the cloud reports a Node's instance gone (before the deletion, or instead of it
    /// with `--node-deletion-mode=mark`), the Node carries the condition
    /// `CloudProviderInstanceNotFound=True`; `False` once the instance is found again.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub node_instance_not_found_condition: bool,
    /// `delete` (Go) deletes a Node whose instance is confirmed gone; `mark` never deletes it
    /// and sets the `CloudProviderInstanceNotFound` condition instead.
    #[arg(long, value_enum, default_value_t = NodeDeletionMode::Delete, value_name = "MODE")]
    pub node_deletion_mode: NodeDeletionMode,
    /// When set, a Node whose instance the cloud has reported shut down for this long, and
    /// NotReady for as long, gets `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// (its Pods are deleted and their volumes detached at once); removed when the instance
    /// runs again or the Node is Ready. Unset (default): never.
    #[arg(long, value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_out_of_service_after: Option<Duration>,
}
