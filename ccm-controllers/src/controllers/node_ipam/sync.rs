//! The range allocator's reconciler: one Node at a time, decide from the pool (pure, in
//! [`plan`](super::plan)) and write with [`patch`](super::patch).

use std::sync::{Arc, Mutex};

use ccm_core::Node;
use ipnet::IpNet;
use kube::ResourceExt;
use kube::api::Api;

use super::metrics::PoolMetrics;
use super::patch::{WriteError, write_pod_cidrs};
use super::plan::{self, Occupied, Pool};
use crate::machinery::context::ControllerContext;
use crate::machinery::events::EventRecorder;
use crate::machinery::workqueue::Outcome;

/// Go's reason when a Node cannot get a CIDR (the range is exhausted).
pub const REASON_CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
/// Go's reason when the CIDRs could not be written to the Node.
pub const REASON_CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
/// Reason of the Warning when a Node's pod CIDRs cannot be tracked (unparsable, or outside
/// every cluster CIDR). Go stops the controller in that case; here the Node is skipped.
pub const REASON_INVALID_POD_CIDR: &str = "InvalidPodCIDR";

/// The node-IPAM reconciler (range allocator).
pub(crate) struct Reconciler {
    ctx: ControllerContext,
    api: Api<Node>,
    pool: Mutex<Pool>,
    recorder: EventRecorder,
    metrics: PoolMetrics,
}

impl Reconciler {
    pub(crate) fn new(
        ctx: ControllerContext,
        pool: Pool,
        recorder: EventRecorder,
        metrics: PoolMetrics,
    ) -> Self {
        metrics.observe(pool.sets());
        Reconciler {
            api: Api::all(ctx.client.clone()),
            ctx,
            pool: Mutex::new(pool),
            recorder,
            metrics,
        }
    }

    fn with_pool<T>(&self, f: impl FnOnce(&mut Pool) -> T) -> T {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut pool);
        self.metrics.observe(pool.sets());
        out
    }

    /// Marks the pod CIDRs a Node already has as used (at start, before any allocation, and
    /// whenever a Node shows CIDRs). Returns whether the Node has pod CIDRs.
    pub(crate) fn occupy_existing(&self, node: &Node) -> bool {
        let name = node.name_any();
        let spec = node.spec.as_ref();
        let cidrs = match plan::node_pod_cidrs(
            spec.and_then(|s| s.pod_cidrs.as_deref()),
            spec.and_then(|s| s.pod_cidr.as_deref()),
        ) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node = %name, "cannot track the node's pod CIDRs: {e}");
                self.recorder.warning(node, REASON_INVALID_POD_CIDR, e);
                return true;
            }
        };
        if cidrs.is_empty() {
            return false;
        }
        let out = self.with_pool(|p| p.occupy(&name, &cidrs));
        self.report_occupied(node, &out);
        true
    }

    fn report_occupied(&self, node: &Node, out: &Occupied) {
        let name = node.name_any();
        if !out.replaced.is_empty() {
            tracing::info!(node = %name, released = ?out.replaced, "node has other pod CIDRs than the ones reserved for it; released the reservation");
        }
        for e in &out.rejected {
            tracing::warn!(node = %name, "cannot track the node's pod CIDR: {e}");
            self.recorder
                .warning(node, REASON_INVALID_POD_CIDR, e.to_string());
        }
    }

    /// Releases what a deleted Node held.
    pub(crate) fn release(&self, name: &str) {
        let released = self.with_pool(|p| {
            let cidrs = p.release(name);
            for (set, _) in p.sets().iter().zip(&cidrs) {
                self.metrics.released(set);
            }
            cidrs
        });
        if !released.is_empty() {
            tracing::debug!(node = %name, cidrs = ?released, "released the pod CIDRs of a deleted node");
        }
    }

    /// Releases the CIDRs of Nodes the pool holds but the store no longer has (deletes missed
    /// while the watch was down).
    pub(crate) fn release_missing(&self) {
        let held: Vec<String> = self.with_pool(|p| p.held_nodes());
        for name in held {
            if self.ctx.nodes.get(&name).is_none() {
                self.release(&name);
            }
        }
    }

    /// Gives the Node named `name` its pod CIDRs if it has none (Go's `syncNode`).
    pub(crate) async fn sync(&self, name: &str) -> Outcome {
        // The planner, the Events and the guarded write read the whole Node: a copy of the view.
        let Some(node) = self
            .ctx
            .nodes
            .get(name)
            .map(|view| Arc::new(view.to_node()))
        else {
            self.release(name);
            return Outcome::Done;
        };
        if node.metadata.deletion_timestamp.is_some() {
            self.release(name);
            return Outcome::Done;
        }
        if self.occupy_existing(&node) {
            return Outcome::Done;
        }
        if !self.ctx.ownership().owns(&node) {
            // Another cloud's Node gets no pod CIDR from us (machinery/ownership.rs); the CIDRs
            // it has are marked used above, so none is given twice.
            return Outcome::Done;
        }
        let allocation = self.with_pool(|p| {
            let a = p.allocate(name);
            if let Ok(a) = &a {
                for (set, tries) in p.sets().iter().zip(&a.tries) {
                    self.metrics.allocated(set, *tries);
                }
            }
            a
        });
        let cidrs: Vec<IpNet> = match allocation {
            Ok(a) => a.cidrs,
            Err(exhausted) => {
                let (used, max) = self.with_pool(|p| {
                    let set = &p.sets()[exhausted.index];
                    (set.allocated(), set.max())
                });
                tracing::error!(
                    node = %name,
                    cluster_cidr = %exhausted.cluster,
                    used, max,
                    "{exhausted}: every node CIDR of {} is in use ({used} of {max}); widen --cluster-cidr or lengthen the node CIDR mask size",
                    exhausted.cluster
                );
                self.recorder.normal(
                    node.as_ref(),
                    REASON_CIDR_NOT_AVAILABLE,
                    format!("Node {name} status is now: {REASON_CIDR_NOT_AVAILABLE}"),
                );
                return Outcome::Failed;
            }
        };
        match write_pod_cidrs(&self.api, &node, &cidrs).await {
            Ok(_) => {
                let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
                tracing::info!(node = %name, pod_cidrs = ?list, "set node PodCIDR");
                Outcome::Done
            }
            Err(WriteError::NotFound) => {
                self.release(name);
                Outcome::Done
            }
            Err(WriteError::Precondition) => {
                // It has CIDRs now (from someone else), or is another Node under this name:
                // read it fresh and go again; the reservation is kept until then.
                match self.api.get_opt(name).await {
                    Ok(Some(fresh)) if fresh.metadata.uid == node.metadata.uid => {
                        if self.occupy_existing(&fresh) {
                            Outcome::Done
                        } else {
                            Outcome::Failed
                        }
                    }
                    Ok(Some(_)) => Outcome::Failed,
                    Ok(None) => {
                        self.release(name);
                        Outcome::Done
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, "reading the node after a refused CIDR patch: {e}");
                        Outcome::Failed
                    }
                }
            }
            Err(WriteError::Kube(e)) => {
                // The reservation stays with this Node (no CIDR is given twice even if the
                // write did land); the retry writes the same CIDRs.
                tracing::error!(node = %name, "failed to update node PodCIDR: {e}");
                self.recorder.normal(
                    node.as_ref(),
                    REASON_CIDR_ASSIGNMENT_FAILED,
                    format!("Node {name} status is now: {REASON_CIDR_ASSIGNMENT_FAILED}"),
                );
                Outcome::Failed
            }
        }
    }
}
