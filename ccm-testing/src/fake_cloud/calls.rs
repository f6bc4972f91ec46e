//! The path every operation takes (quota, latency, faults, then the change under the lock,
//! then the state file) and the call log it keeps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{CloudError, CloudResult, Route};

use super::{
    FakeCloud, FakeCloudConfig, QuotaConfig, State, StateFileError, quota, warn_unknown_operation,
};

/// One call to a [`FakeCloud`], as recorded in [`FakeCloud::call_log`].
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    /// The operation: the snake_case trait method name, e.g. `ensure_load_balancer`.
    pub operation: String,
    /// What the call was about: the node name (`instance_*`, `node_addresses`...), the provider
    /// ID (`*_by_provider_id`), `<namespace>/<name>` of the Service (load balancers), the
    /// destination CIDR (`create_route`, `delete_route`), the cluster name (`list_routes`,
    /// `master`), the number of Nodes (`describe_instances`: `3 nodes`), or empty.
    pub subject: String,
    /// The call's arguments.
    pub args: CallArgs,
    /// True when the quota rejected the call ([`CloudError::Retry`], nothing done).
    pub rejected: bool,
}

impl CallRecord {
    /// The backend host names of a load-balancer call (sorted, each once), if it had hosts.
    pub fn hosts(&self) -> Option<&[String]> {
        match &self.args {
            CallArgs::LoadBalancer {
                hosts: Some(hosts), ..
            }
            | CallArgs::LoadBalancers { hosts, .. } => Some(hosts),
            _ => None,
        }
    }

    /// The `<namespace>/<name>` of every Service of a load-balancer call: one for the single
    /// calls, every Service of an `update_load_balancer_hosts` batch in the order given.
    pub fn services(&self) -> Vec<&str> {
        match &self.args {
            CallArgs::LoadBalancer { service, .. } => vec![service.as_str()],
            CallArgs::LoadBalancers { services, .. } => {
                services.iter().map(String::as_str).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The node names of an instance call: one for the single calls, every Node of a
    /// `describe_instances` batch in the order given.
    pub fn node_names(&self) -> Vec<&str> {
        match &self.args {
            CallArgs::Node { name, .. } | CallArgs::NodeName(name) => vec![name.as_str()],
            CallArgs::Nodes(names) => names.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// The arguments of one recorded call ([`CallRecord::args`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CallArgs {
    /// No arguments (`initialize`, `get_zone`, `list_clusters`).
    None,
    /// An `InstancesV2` call: the Node's name and `spec.providerID`.
    Node {
        /// `metadata.name`.
        name: String,
        /// `spec.providerID`, when set.
        provider_id: Option<String>,
    },
    /// `describe_instances`: the Nodes' names, in the order given.
    Nodes(Vec<String>),
    /// A legacy lookup by node name.
    NodeName(String),
    /// A lookup by provider ID.
    ProviderId(String),
    /// `current_node_name`'s hostname or `add_ssh_key_to_all_instances`' user.
    Text(String),
    /// A load-balancer call.
    LoadBalancer {
        /// The cluster name.
        cluster_name: String,
        /// `<namespace>/<name>` of the Service.
        service: String,
        /// The backend host names (sorted, each once) of `ensure_load_balancer` and
        /// `update_load_balancer`; `None` for the calls without hosts. Shared with the
        /// stored load balancers, not copied.
        hosts: Option<Arc<[String]>>,
    },
    /// `update_load_balancer_hosts`: many load balancers given the same hosts.
    LoadBalancers {
        /// The cluster name.
        cluster_name: String,
        /// `<namespace>/<name>` of each Service, in the order given.
        services: Vec<String>,
        /// The backend host names (sorted, each once), shared with the stored load balancers.
        hosts: Arc<[String]>,
    },
    /// `list_routes` or `master`: the cluster name.
    Cluster(String),
    /// `create_route` or `delete_route`.
    Route {
        /// The cluster name.
        cluster_name: String,
        /// The name hint (`create_route` only).
        name_hint: Option<String>,
        /// The route as passed.
        route: Route,
    },
}

/// The operations that change the load balancers or routes (and so rewrite the state file).
const MUTATING: &[&str] = &[
    "ensure_load_balancer",
    "update_load_balancer",
    "update_load_balancer_hosts",
    "ensure_load_balancer_deleted",
    "create_route",
    "delete_route",
];

/// Traces a call's start, and its end when dropped (also when the call is cancelled).
struct CallTrace {
    op: &'static str,
    subject: String,
}

impl CallTrace {
    fn start(op: &'static str, subject: String) -> Self {
        tracing::debug!(operation = op, subject = %subject, "fake cloud call started");
        CallTrace { op, subject }
    }
}

impl Drop for CallTrace {
    fn drop(&mut self) {
        tracing::debug!(operation = self.op, subject = %self.subject, "fake cloud call ended");
    }
}

impl FakeCloud {
    /// How many times `op` (a snake_case trait method name, see [`OPERATIONS`](super::OPERATIONS)) was called since
    /// the start or the last [`FakeCloud::reset_calls`], including calls that failed or were
    /// cancelled.
    pub fn call_count(&self, op: &str) -> usize {
        self.lock().counts.get(op).copied().unwrap_or(0)
    }

    /// The call counts of every operation called at least once.
    pub fn call_counts(&self) -> BTreeMap<String, usize> {
        self.lock().counts.clone()
    }

    /// The calls in the order they were made: every call, or the most recent
    /// `call_log_limit` (default 10,000) when more were made. [`FakeCloud::call_count`] and
    /// [`FakeCloud::rejected_count`] count every call whatever the limit.
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.lock().calls.iter().cloned().collect()
    }

    /// The recorded calls of one operation, in the order they were made (within the call
    /// log's limit, see [`FakeCloud::call_log`]).
    pub fn calls_of(&self, op: &str) -> Vec<CallRecord> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.operation == op)
            .cloned()
            .collect()
    }

    /// How many calls of `op` the quota rejected (they are in [`FakeCloud::call_count`] too).
    pub fn rejected_count(&self, op: &str) -> usize {
        self.lock().rejected.get(op).copied().unwrap_or(0)
    }

    /// The rejected-call counts of every operation the quota rejected at least once.
    pub fn rejected_counts(&self) -> BTreeMap<String, usize> {
        self.lock().rejected.clone()
    }

    /// Forgets the recorded calls, counts and rejected counts.
    pub fn reset_calls(&self) {
        let mut st = self.lock();
        st.calls.clear();
        st.counts.clear();
        st.rejected.clear();
    }

    /// Replaces the quota (as `quota` in the config); the new buckets start full.
    pub fn set_quota(&self, quota: &QuotaConfig) {
        self.lock().quota = quota::Quota::new(quota);
    }

    /// Sets the delay of every operation without its own override.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Sets the delay of one operation, overriding [`FakeCloud::set_latency`].
    pub fn set_operation_latency(&self, op: &str, latency: Duration) {
        warn_unknown_operation(op);
        self.lock().operation_latency.insert(op.to_owned(), latency);
    }

    /// Records a call (with the arguments `args` gives), applies the quota, waits the
    /// latency, consults the faults, then runs `f` under the lock; a successful change of the
    /// load balancers or routes is written to the state file.
    pub(super) async fn call<T>(
        &self,
        op: &'static str,
        subject: impl Into<String>,
        args: impl FnOnce(&mut State) -> CallArgs,
        f: impl FnOnce(&FakeCloudConfig, &mut State) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let subject = subject.into();
        // Calls that change the cloud are traced where they start and end, so that a test
        // watching a process's log knows when one is in flight (the chaos scenario kills it
        // then).
        let _trace = MUTATING
            .contains(&op)
            .then(|| CallTrace::start(op, subject.clone()));
        self.call_inner(op, subject, args, f).await
    }

    async fn call_inner<T>(
        &self,
        op: &'static str,
        subject: String,
        args: impl FnOnce(&mut State) -> CallArgs,
        f: impl FnOnce(&FakeCloudConfig, &mut State) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let (latency, throttled) = {
            let mut st = self.lock();
            let args = args(&mut st);
            let throttled = if op == "initialize" {
                None
            } else {
                st.quota.admit(op).err()
            };
            // Bounded, so that a long-running fake cloud (fake-ccm, the quickstart) does not
            // grow with every call it answers.
            let limit = self.inner.config.call_log_limit;
            if limit > 0 {
                if st.calls.len() >= limit {
                    st.calls.pop_front();
                }
                st.calls.push_back(CallRecord {
                    operation: op.to_owned(),
                    subject,
                    args,
                    rejected: throttled.is_some(),
                });
            }
            *st.counts.entry(op.to_owned()).or_default() += 1;
            if throttled.is_some() {
                *st.rejected.entry(op.to_owned()).or_default() += 1;
            }
            let latency = st.operation_latency.get(op).copied().unwrap_or(st.latency);
            (latency, throttled)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if let Some(after) = throttled {
            return Err(CloudError::retry(
                after,
                format!("fake cloud: quota exceeded for {op} (429 Too Many Requests)"),
            ));
        }
        let mut st = self.lock();
        if let Some(err) = st.fire_fault(op) {
            return Err(err);
        }
        let result = f(&self.inner.config, &mut st);
        // After every call that changed some load balancer's hosts, also a failed one.
        st.host_counts.log_if_changed();
        let result = result?;
        if MUTATING.contains(&op) {
            self.persist(&st).map_err(CloudError::other)?;
        }
        if let Some(err) = st.fire_after_effect(op) {
            return Err(err);
        }
        Ok(result)
    }

    /// Writes the state file, when there is one.
    pub(super) fn persist(&self, st: &State) -> Result<(), StateFileError> {
        // Under the state lock, so the file always follows the order of the changes. A test
        // double can afford the blocking write; the benchmarks run without a state file.
        match &self.inner.state_file {
            Some(path) => st.snapshot().save(path),
            None => Ok(()),
        }
    }
}
