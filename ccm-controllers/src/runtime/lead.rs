//! Leader election and the leading phase: while this process leads, the shared informers, the
//! provider's `initialize`, the enabled controllers, until shutdown or a lost lease; then the
//! drain (`--shutdown-grace-period`).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ccm_core::{CloudProvider, InitContext, Node};
use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::client::ClientFactory;
use super::entry::{ControllerEntry, StartArgs};
use super::health::Health;
use super::leader::{self, ElectionConfig, LeaderState};
use crate::machinery::budget::BudgetedProvider;
use crate::machinery::context::{ContextParams, ControllerContext};
use crate::machinery::error::ControllerError;
use crate::machinery::events::{DEFAULT_FLUSH_TIMEOUT, EventBroadcaster};
use crate::machinery::go_syntax::format_go_duration;
use crate::machinery::metrics::{MetricsRegistry, WorkQueueMetrics};
use crate::options::Options;

/// The labels of `running_managed_controllers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ManagedLabels {
    manager: String,
    name: String,
}

/// The label of `leader_election_master_status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LeaseLabel {
    name: String,
}

/// How the leading phase ended.
enum Lead {
    /// Stopped (signal, or a fatal controller/initialize error) with this exit code; the lease
    /// may be released.
    Done(i32),
    /// The lease was lost.
    Lost(String),
}

/// Why the leading phase stops before or while the controllers run.
enum Stop {
    /// Shutdown was requested: exit code 0 after the drain.
    Shutdown,
    /// A fatal error (logged): exit code 1 after the drain.
    Failed,
    /// The lease was lost: stop at once.
    Lost(String),
}

/// Fires with the reason when the lease is lost; `None` when there is no election.
type LostLease<'a> = Option<&'a mut oneshot::Receiver<String>>;

/// The controller tasks: each ends with its index in [`LeadEnv::enabled`] and its result.
type ControllerTasks = JoinSet<(usize, Result<(), ControllerError>)>;

/// What the leading phase needs, built by the startup steps.
pub(super) struct LeadEnv {
    pub(super) options: Arc<Options>,
    pub(super) vendor: Arc<dyn Any + Send + Sync>,
    /// The root client (leader election, the provider's `initialize`).
    pub(super) client: Client,
    /// The shared informers' client (root credentials).
    pub(super) informer_client: Client,
    /// Makes each controller's client.
    pub(super) clients: ClientFactory,
    /// The Event writer's own client (Events of no controller).
    pub(super) event_client: Client,
    pub(super) budgeted: Arc<BudgetedProvider>,
    pub(super) metrics: Arc<MetricsRegistry>,
    pub(super) workqueue_metrics: WorkQueueMetrics,
    pub(super) running: Family<ManagedLabels, Gauge>,
    pub(super) health: Arc<Health>,
    pub(super) identity: String,
    pub(super) enabled: Vec<ControllerEntry>,
    pub(super) strip_node: fn(&mut Node),
    /// Shadow mode's recorder (`runtime/shadow.rs`).
    pub(super) shadow: Option<Arc<crate::machinery::shadow::Shadow>>,
}

/// With `--leader-elect`, waits for the lease and leads while holding it (releasing it after a
/// graceful stop); without, leads at once. Returns the exit code.
pub(super) async fn elect_and_lead(
    env: &LeadEnv,
    election: bool,
    master_status: &Family<LeaseLabel, Gauge>,
    shutdown: &CancellationToken,
) -> i32 {
    if !election {
        return match env.lead(shutdown, None).await {
            Lead::Lost(_) => 1,
            Lead::Done(code) => code,
        };
    }
    let health = &env.health;
    let lease = LeaseLabel {
        name: env
            .options
            .leader_election
            .leader_elect_resource_name
            .clone(),
    };
    master_status.get_or_create(&lease).set(0);
    let config = ElectionConfig::from_args(&env.options.leader_election, env.identity.clone());
    tracing::info!(identity = %config.identity, lease = %format!("{}/{}", config.namespace, config.name), "attempting to acquire the leader lease");
    let factory = env.clients.clone();
    let election = leader::spawn(
        move || {
            factory
                .root_credentials_client(leader::LEADER_ELECTION_CLIENT_NAME)
                .map_err(|e| e.to_string())
        },
        config.clone(),
        health.leader.clone(),
        shutdown.clone(),
    );
    let acquired = match election {
        Ok(acquired) => acquired,
        Err(error) => {
            tracing::error!(%error, "could not start the leader election's thread");
            return 1;
        }
    };
    match acquired.await.ok() {
        None => 0,
        Some(mut held) => {
            tracing::info!(identity = %config.identity, "became the leader");
            health.leader.send_replace(LeaderState::Leading);
            master_status.get_or_create(&lease).set(1);
            let outcome = env.lead(shutdown, Some(&mut held.lost)).await;
            match outcome {
                Lead::Lost(reason) => {
                    tracing::error!("leaderelection lost: {reason}");
                    health.leader.send_replace(LeaderState::Lost);
                    master_status.get_or_create(&lease).set(0);
                    1
                }
                Lead::Done(code) => {
                    held.release(Duration::from_secs(5)).await;
                    master_status.get_or_create(&lease).set(0);
                    code
                }
            }
        }
    }
}

/// Resolves when the lease is lost (never when there is no election).
async fn lost_signal(lost: &mut LostLease<'_>) -> String {
    match lost {
        Some(rx) => match (&mut **rx).await {
            Ok(reason) => reason,
            // The renewal task ended without a message: it was told to release.
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The process's Event writer task.
struct EventWriterTask {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl LeadEnv {
    fn managed(&self, entry: &ControllerEntry) -> ManagedLabels {
        ManagedLabels {
            manager: "cloud-controller-manager".to_owned(),
            name: entry.metric_name().to_owned(),
        }
    }

    /// Runs the informers, `initialize` and the controllers until shutdown, a lost lease or a
    /// fatal error; then drains.
    async fn lead(&self, shutdown: &CancellationToken, mut lost: LostLease<'_>) -> Lead {
        let work = shutdown.child_token();
        let mut informers = JoinSet::new();
        let (events, event_writer) = self.start_event_writer();
        let ctx = ControllerContext::start(
            ContextParams {
                client: self.informer_client.clone(),
                clients: Some(self.clients.clone()),
                cloud: self.budgeted.clone(),
                metrics: self.metrics.clone(),
                workqueue_metrics: self.workqueue_metrics.clone(),
                shutdown: work.clone(),
                cluster_name: self.options.cluster_name().to_owned(),
                identity: self.identity.clone(),
                strip_node: self.strip_node,
                events,
            },
            &mut informers,
        );
        let ctx = ctx.with_managed_node_selector(self.options.cloud.managed_node_selector.clone());
        let ctx = match &self.shadow {
            Some(shadow) => ctx.into_shadow(shadow.clone()),
            None => ctx,
        };
        super::shadow::spawn(
            self.shadow.as_ref(),
            &self.options,
            &ctx,
            &self.budgeted,
            shutdown,
            &mut informers,
        );
        let mut controllers = ControllerTasks::new();
        let stop = self
            .run_controllers(&ctx, &work, &mut lost, &mut controllers)
            .await;
        work.cancel();
        let lead = match stop {
            Stop::Lost(reason) => {
                // Another process leads now: stop at once (queued Events are dropped, as the
                // Go process exits at once).
                controllers.abort_all();
                informers.abort_all();
                event_writer.task.abort();
                self.stop_all();
                return Lead::Lost(reason);
            }
            Stop::Failed => Lead::Done(1),
            Stop::Shutdown => Lead::Done(0),
        };
        self.drain(controllers, informers, event_writer).await;
        lead
    }

    /// One Event writer for the process. It stops after the controllers drained (not with the
    /// controllers' shutdown), so the Events of their last in-flight work are flushed too.
    fn start_event_writer(&self) -> (EventBroadcaster, EventWriterTask) {
        let (events, event_writer) =
            EventBroadcaster::new(self.event_client.clone(), &self.identity, &self.metrics);
        let stop = CancellationToken::new();
        let task = AbortOnDropHandle::new(tokio::spawn(
            event_writer.run(stop.clone(), DEFAULT_FLUSH_TIMEOUT),
        ));
        (events, EventWriterTask { stop, task })
    }

    /// Waits for the informers, initializes the provider, starts the enabled controllers and
    /// watches them until told to stop.
    async fn run_controllers(
        &self,
        ctx: &ControllerContext,
        work: &CancellationToken,
        lost: &mut LostLease<'_>,
        controllers: &mut ControllerTasks,
    ) -> Stop {
        let started = async {
            self.wait_for_informers(ctx, work, lost).await?;
            self.initialize_provider(work, lost).await?;
            self.start_controllers(ctx, work, lost, controllers).await
        }
        .await;
        match started {
            Ok(()) => self.watch_controllers(work, lost, controllers).await,
            Err(stop) => stop,
        }
    }

    /// Waits for the shared informers' first list (`/readyz` reports it).
    async fn wait_for_informers(
        &self,
        ctx: &ControllerContext,
        work: &CancellationToken,
        lost: &mut LostLease<'_>,
    ) -> Result<(), Stop> {
        tokio::select! {
            synced = ctx.wait_for_sync() => {
                if synced {
                    self.health.synced.store(true, Ordering::SeqCst);
                    tracing::info!("shared informers synced");
                } else if !work.is_cancelled() {
                    tracing::error!("shared informers stopped before they synced");
                    return Err(Stop::Failed);
                }
            }
            () = work.cancelled() => return Err(Stop::Shutdown),
            reason = lost_signal(lost) => return Err(Stop::Lost(reason)),
        }
        if work.is_cancelled() {
            return Err(Stop::Shutdown);
        }
        Ok(())
    }

    /// The provider's `initialize`, through the budget.
    async fn initialize_provider(
        &self,
        work: &CancellationToken,
        lost: &mut LostLease<'_>,
    ) -> Result<(), Stop> {
        let init = self.budgeted.initialize(InitContext::new(
            Some(self.client.clone()),
            work.clone(),
            self.options.cluster_name(),
        ));
        tokio::select! {
            result = init => if let Err(e) = result {
                tracing::error!("cloud provider initialize failed: {e}");
                return Err(Stop::Failed);
            },
            () = work.cancelled() => return Err(Stop::Shutdown),
            reason = lost_signal(lost) => return Err(Stop::Lost(reason)),
        }
        Ok(())
    }

    /// Starts the enabled controllers in order, `--controller-start-interval` apart.
    async fn start_controllers(
        &self,
        ctx: &ControllerContext,
        work: &CancellationToken,
        lost: &mut LostLease<'_>,
        controllers: &mut ControllerTasks,
    ) -> Result<(), Stop> {
        let args = StartArgs {
            options: self.options.clone(),
            vendor: self.vendor.clone(),
        };
        let interval = self.options.generic.controller_start_interval;
        for (i, entry) in self.enabled.iter().enumerate() {
            if work.is_cancelled() {
                break;
            }
            tracing::info!(controller = %entry.name, client = entry.client_name(), "starting controller");
            // The controller's own client (with --use-service-account-credentials its
            // ServiceAccount's token, fetched now, as Go's `ClientOrDie`).
            let own = tokio::select! {
                own = ctx.clone().for_client(entry.client_name()) => own,
                () = work.cancelled() => break,
                reason = lost_signal(lost) => return Err(Stop::Lost(reason)),
            };
            let own = match own {
                Ok(own) => own,
                Err(e) => {
                    tracing::error!(controller = %entry.name, "cannot start the controller: {e}");
                    return Err(Stop::Failed);
                }
            };
            self.running.get_or_create(&self.managed(entry)).set(1);
            let fut = (entry.start)(own, args.clone());
            controllers.spawn(async move { (i, fut.await) });
            if !interval.is_zero() && i + 1 < self.enabled.len() {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = work.cancelled() => {}
                }
            }
        }
        Ok(())
    }

    /// Runs until told to stop, the lease is lost or a controller fails.
    async fn watch_controllers(
        &self,
        work: &CancellationToken,
        lost: &mut LostLease<'_>,
        controllers: &mut ControllerTasks,
    ) -> Stop {
        loop {
            tokio::select! {
                () = work.cancelled() => return Stop::Shutdown,
                reason = lost_signal(lost) => return Stop::Lost(reason),
                Some(joined) = controllers.join_next() => {
                    if self.finished(joined).is_err() {
                        return Stop::Failed;
                    }
                }
            }
        }
    }

    /// The graceful stop: `/readyz` turns 503, in-flight reconciles and cloud calls get
    /// `--shutdown-grace-period`, the controllers' queued Events are flushed, the informers
    /// stop.
    async fn drain(
        &self,
        mut controllers: ControllerTasks,
        mut informers: JoinSet<()>,
        event_writer: EventWriterTask,
    ) {
        self.health.shutting_down.store(true, Ordering::SeqCst);
        let grace = self.options.serving.shutdown_grace_period;
        tracing::info!(
            grace = %format_go_duration(grace),
            in_flight_cloud_calls = self.budgeted.in_flight(),
            "stopping controllers; waiting for in-flight work"
        );
        let drain = async {
            while let Some(joined) = controllers.join_next().await {
                let _ = self.finished(joined);
            }
            self.budgeted.wait_idle(grace).await
        };
        let drained = tokio::time::timeout(grace, drain).await.unwrap_or(false);
        if !drained {
            tracing::warn!(
                in_flight_cloud_calls = self.budgeted.in_flight(),
                "--shutdown-grace-period elapsed with work in flight; abandoning it"
            );
            controllers.abort_all();
        }
        // The controllers are done: flush their queued Events (bounded by the flush timeout).
        event_writer.stop.cancel();
        let _ = event_writer.task.await;
        informers.abort_all();
        while informers.join_next().await.is_some() {}
        self.stop_all();
    }

    /// Handles a controller task that ended. `Err(())` means fatal.
    fn finished(
        &self,
        joined: Result<(usize, Result<(), ControllerError>), tokio::task::JoinError>,
    ) -> Result<(), ()> {
        match joined {
            Ok((i, result)) => {
                let Some(entry) = self.enabled.get(i) else {
                    return Ok(());
                };
                self.running.get_or_create(&self.managed(entry)).set(0);
                match result {
                    Ok(()) => {
                        tracing::info!(controller = %entry.name, "controller stopped");
                        Ok(())
                    }
                    Err(e @ ControllerError::MissingCapability { .. }) => {
                        tracing::warn!(controller = %entry.name, "skipping controller: {e}");
                        Ok(())
                    }
                    Err(e) => {
                        tracing::error!(controller = %entry.name, "controller failed: {e}");
                        Err(())
                    }
                }
            }
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => {
                tracing::error!("a controller panicked: {e}");
                Err(())
            }
        }
    }

    fn stop_all(&self) {
        for entry in &self.enabled {
            self.running.get_or_create(&self.managed(entry)).set(0);
        }
    }
}
