//! Leader election on a `coordination.k8s.io/v1` Lease, with `kube-lease-manager`.
//!
//! Default Lease `kube-system/cloud-controller-manager`, identity `hostname_<uuid>` (as Go).
//! Mapping of Go's flags onto `kube-lease-manager` (which counts whole seconds):
//!
//! - `--leader-elect-lease-duration` → the Lease's `leaseDurationSeconds` (rounded up);
//! - `--leader-elect-retry-period` → the leader renews every retry period (the manager's
//!   "grace" is `duration - retry period`), and a standby re-reads the Lease every retry period;
//! - `--leader-elect-renew-deadline` → the leader reads its Lease every retry period (as
//!   client-go does) and declares the lease lost (the process exits non-zero) when another
//!   identity holds it or its last renewal is older than the renew deadline, so it stops before
//!   a standby may take over at expiry.
//!
//! RBAC: the manager reads, creates and **patches** the Lease (server-side apply and strategic
//! merge patches); Go's client-go updates it with PUT. A ClusterRole written for a Go CCM
//! (`leases: create, get, update`) must also grant `patch`.
//!
//! A standby does not use the manager's own wait (which sleeps until the holder's lease
//! *expires*, so a released lease would be taken over only after the lease duration): each
//! retry period it builds a fresh manager (one GET of the Lease) and tries once. A lease the
//! leader released on graceful shutdown is therefore taken over within one retry period.
//!
//! The election runs on a thread of its own, with a one-thread Tokio runtime and a client of
//! its own (user agent `leader-election`, as Go's `leader-election` client): tokio schedules
//! tasks cooperatively, so a reconcile or a provider call that keeps a worker thread busy (CPU
//! work, or a blocking call in an async function) would otherwise delay the renewals until the
//! leader lost its Lease while working normally. Found at 100,000 Nodes / 10,000 Services,
//! where the start-up's 10,000 load-balancer ensures kept the leader from renewing for 40 s.
//! Go's goroutines are preempted, so Go's leader keeps renewing under the same load; this
//! thread gives ours the same guarantee.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseParams};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::machinery::go_syntax::format_go_duration;
use crate::options::{LeaderElectionArgs, ceil_secs};

/// The user agent suffix of the election's own client (Go's `leader-election` client).
pub(crate) const LEADER_ELECTION_CLIENT_NAME: &str = "leader-election";

/// Where this process stands in the election (also what `/readyz` and `/healthz` report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaderState {
    /// Leader election is off: this process runs controllers.
    Disabled,
    /// Trying to acquire; `healthy` is false when the last attempt failed (API unreachable).
    Standby {
        /// Whether the last attempt could read/write the Lease.
        healthy: bool,
    },
    /// Holding the lease.
    Leading,
    /// The lease was lost; the process is exiting.
    Lost,
}

/// The election settings.
#[derive(Clone, Debug)]
pub(crate) struct ElectionConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This process's identity.
    pub identity: String,
    /// Lease duration (whole seconds, >= 2).
    pub lease_duration: Duration,
    /// How long renewals may fail before the lease counts as lost.
    pub renew_deadline: Duration,
    /// Renew / retry interval.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// From the flags, with `identity` (see [`default_identity`]).
    pub(crate) fn from_args(args: &LeaderElectionArgs, identity: String) -> Self {
        ElectionConfig {
            namespace: args.leader_elect_resource_namespace.clone(),
            name: args.leader_elect_resource_name.clone(),
            identity,
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
        }
    }

    fn params(&self) -> LeaseParams {
        let duration = ceil_secs(self.lease_duration).max(2);
        let retry = ceil_secs(self.retry_period).max(1);
        // grace: renew `retry` seconds after the last renewal; 1 <= grace < duration.
        let grace = duration.saturating_sub(retry).clamp(1, duration - 1);
        // The field manager stays the library's default (`kube-lease-manager-<identity>`): it
        // must differ between replicas for server-side apply to detect concurrent locking.
        LeaseParams::new(self.identity.clone(), duration, grace)
    }
}

/// Go's identity: `<hostname>_<uuid>`.
pub(crate) fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// Runs a standby until this process acquires the lease (returns the manager holding it), or
/// `stop` fires (returns `None`). Publishes [`LeaderState::Standby`] on `state`.
pub(crate) async fn acquire(
    client: &Client,
    config: &ElectionConfig,
    state: &watch::Sender<LeaderState>,
    stop: &CancellationToken,
) -> Option<LeaseManager> {
    loop {
        let attempt = async {
            let manager = LeaseManagerBuilder::new(client.clone(), config.name.clone())
                .with_namespace(config.namespace.clone())
                .with_parameters(config.params())
                .build()
                .await?;
            match tokio::time::timeout(config.retry_period, manager.changed()).await {
                Ok(Ok(true)) => Ok(Some(manager)),
                Ok(Ok(false)) | Err(_) => Ok(None),
                Ok(Err(e)) => Err(e),
            }
        };
        let started = Instant::now();
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            result = attempt => match result {
                Ok(Some(manager)) => return Some(manager),
                Ok(None) => {
                    state.send_replace(LeaderState::Standby { healthy: true });
                }
                Err(e) => {
                    tracing::warn!(error = %e, lease = %format!("{}/{}", config.namespace, config.name), "leader election attempt failed");
                    state.send_replace(LeaderState::Standby { healthy: false });
                }
            },
        }
        // At most one attempt per retry period.
        let next = started + config.retry_period;
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// The leader's renewal, on the election thread (see the module docs).
pub(crate) struct Held {
    /// Resolves when the lease is lost (with the reason).
    pub(crate) lost: oneshot::Receiver<String>,
    release: CancellationToken,
    /// Resolves when the renewal has ended (after the release, when asked for).
    ended: oneshot::Receiver<()>,
    /// Dropping `Held` (e.g. the runtime's future is dropped) stops renewing without releasing.
    _abandon: DropGuard,
}

impl Held {
    /// Stops renewing and releases the lease (so a standby takes over at once), waiting at most
    /// `timeout` for the release call.
    pub(crate) async fn release(self, timeout: Duration) {
        self.release.cancel();
        if tokio::time::timeout(timeout, self.ended).await.is_err() {
            tracing::warn!("releasing the lease timed out; a standby takes over when it expires");
        }
    }
}

/// Starts the election on a thread of its own (see the module docs): a standby until the
/// lease is acquired ([`acquire`], publishing [`LeaderState::Standby`] on `state`), then the
/// renewal ([`keep`]). The receiver resolves with the held lease, or fails when `stop` fired
/// first or the election's client could not be built (logged).
pub(crate) fn spawn(
    make_client: impl FnOnce() -> Result<Client, String> + Send + 'static,
    config: ElectionConfig,
    state: watch::Sender<LeaderState>,
    stop: CancellationToken,
) -> std::io::Result<oneshot::Receiver<Held>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut acquired_tx, acquired) = oneshot::channel();
    std::thread::Builder::new()
        .name("leader-election".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let client = match make_client() {
                    Ok(client) => client,
                    Err(error) => {
                        tracing::error!(%error, "could not build the leader election's client");
                        return;
                    }
                };
                // A standby whose runtime stopped waiting (its future dropped) stops too.
                let standby = tokio::select! {
                    manager = acquire(&client, &config, &state, &stop) => manager,
                    () = acquired_tx.closed() => None,
                };
                let Some(manager) = standby else {
                    return;
                };
                let (lost_tx, lost) = oneshot::channel();
                let (ended_tx, ended) = oneshot::channel();
                let release = CancellationToken::new();
                let abandon = CancellationToken::new();
                let held = Held {
                    lost,
                    release: release.clone(),
                    ended,
                    _abandon: abandon.clone().drop_guard(),
                };
                if acquired_tx.send(held).is_err() {
                    // Nobody leads with it (the runtime is stopping): give it back.
                    release.cancel();
                }
                keep(manager, client, &config, lost_tx, release, abandon).await;
                let _ = ended_tx.send(());
            });
        })?;
    Ok(acquired)
}

/// Renews through the manager until it reports the lease lost; failed renewals are logged and
/// retried every retry period (the deadline is enforced by the watchdog in [`hold`]).
///
/// Each round (wait for the renewal times, then renew) is bounded by half of
/// `--leader-elect-renew-deadline`: a renewal hanging on a dead connection is abandoned (its
/// connection closed) and tried again on a new one while the deadline still allows it to
/// succeed, instead of waiting out the client's read-idle bound (13 s, more than the 10 s
/// deadline). The watchdog in [`keep`] still steps down at the deadline if no renewal lands.
async fn renew(manager: &LeaseManager, retry_period: Duration, renew_deadline: Duration) -> String {
    let round = (renew_deadline / 2).max(retry_period + Duration::from_secs(1));
    loop {
        match tokio::time::timeout(round, manager.changed()).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return "another process holds the lease".to_owned(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewing the leader lease failed; retrying");
                tokio::time::sleep(retry_period).await;
            }
            // A round is cut every `round` even when healthy (`changed` returns only on a change
            // of holder); the next one re-syncs the state and renews as due.
            Err(_) => {
                tracing::debug!(bound = ?round, "lease renewal round ended; starting the next")
            }
        }
    }
}

/// Keeps renewing the lease held by `manager` until `release` fires (then releases it), until
/// `abandon` fires (stops without releasing), or until it is lost (the reason goes to `lost`).
///
/// A watchdog reads the Lease every retry period (as client-go's leader does): the lease is
/// lost when another identity holds it, or when its last renewal is older than
/// `--leader-elect-renew-deadline` (renewals failing, or hanging). The leader then stops before
/// a standby may take over at the lease's expiry.
async fn keep(
    manager: LeaseManager,
    client: Client,
    config: &ElectionConfig,
    lost_tx: oneshot::Sender<String>,
    release: CancellationToken,
    abandon: CancellationToken,
) {
    let stop = release;
    {
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let outcome: Option<String> = {
            let renewer = renew(&manager, config.retry_period, config.renew_deadline);
            tokio::pin!(renewer);
            let mut tick = tokio::time::interval(config.retry_period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_renew = SystemTime::now();
            loop {
                tokio::select! {
                    biased;
                    () = abandon.cancelled() => return,
                    () = stop.cancelled() => break None,
                    reason = &mut renewer => break Some(reason),
                    _ = tick.tick() => {
                        if let Ok(Ok(lease)) =
                            tokio::time::timeout(config.retry_period, api.get(&config.name)).await
                        {
                            let spec = lease.spec.unwrap_or_default();
                            if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
                                break Some(format!(
                                    "the lease is now held by {:?}",
                                    spec.holder_identity.unwrap_or_default()
                                ));
                            }
                            if let Some(renewed) = spec.renew_time {
                                last_renew = SystemTime::from(renewed.0);
                            }
                        }
                        let age = SystemTime::now()
                            .duration_since(last_renew)
                            .unwrap_or(Duration::ZERO);
                        if age > config.renew_deadline {
                            break Some(format!(
                                "the lease was not renewed within --leader-elect-renew-deadline ({})",
                                format_go_duration(config.renew_deadline)
                            ));
                        }
                    }
                }
            }
        };
        match outcome {
            Some(reason) => {
                let _ = lost_tx.send(reason);
            }
            None => match tokio::time::timeout(
                config.retry_period.max(Duration::from_secs(5)),
                manager.release(),
            )
            .await
            {
                Ok(Ok(())) => tracing::info!("released the leader lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not release the leader lease"),
                Err(_) => tracing::warn!("releasing the leader lease timed out"),
            },
        }
    }
}
