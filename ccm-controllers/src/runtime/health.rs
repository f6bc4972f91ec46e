//! Health and metrics over HTTP (axum): `/healthz`, `/livez`, `/readyz`, `/metrics`.
//!
//! - `/healthz` and `/livez`: 200 `ok` while the process works; 500 once the lease is lost.
//! - `/readyz`: 200 `ok` when the shared informers have synced and this process leads (or runs
//!   without election), or when it stands by healthily (it can read the Lease); 503 with the
//!   reason otherwise, and from the moment shutdown starts. A leader is also not ready while
//!   a watch (e.g. the shared Node informer's) lost its connection as dead and has had no live
//!   watch since for longer than the read-idle bound (`runtime/client/liveness.rs`): it sees
//!   no change in the cluster. `/livez` stays 200 then: a restart would not mend the network.
//! - `/metrics`: the registry in OpenMetrics text format.
//!
//! The router is served over HTTPS with delegated authentication and authorization by
//! [`secure_serving`](crate::secure_serving) on `--bind-address:--secure-port` (Go's 10258);
//! the probes are in `--authorization-always-allow-paths` by default. Go has no `/readyz` or
//! `/livez`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;

use crate::machinery::metrics::MetricsRegistry;
use crate::runtime::client::{READ_IDLE_TIMEOUT, WatchLiveness};
use crate::runtime::leader::LeaderState;

/// What the probes report; shared between the runtime and the server.
#[derive(Debug)]
pub(crate) struct Health {
    /// Election state.
    pub leader: watch::Sender<LeaderState>,
    /// The shared informers have listed once.
    pub synced: AtomicBool,
    /// Shutdown has started.
    pub shutting_down: AtomicBool,
    /// Whether the watches have live connections.
    pub watches: WatchLiveness,
}

impl Health {
    /// Initial state: not synced, not shutting down, `leader` as given, the watches' liveness
    /// read from `watches`.
    pub(crate) fn new(leader: LeaderState, watches: WatchLiveness) -> Arc<Self> {
        Arc::new(Health {
            leader: watch::channel(leader).0,
            synced: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            watches,
        })
    }

    /// `(healthy, reason)` for `/healthz` and `/livez`.
    pub(crate) fn live(&self) -> (bool, Cow<'static, str>) {
        match *self.leader.borrow() {
            LeaderState::Lost => (false, "leader election lost".into()),
            _ => (true, "ok".into()),
        }
    }

    /// `(ready, reason)` for `/readyz`.
    pub(crate) fn ready(&self) -> (bool, Cow<'static, str>) {
        if self.shutting_down.load(Ordering::SeqCst) {
            return (false, "shutting down".into());
        }
        let synced = self.synced.load(Ordering::SeqCst);
        match *self.leader.borrow() {
            LeaderState::Lost => (false, "leader election lost".into()),
            LeaderState::Standby { healthy: true } => (true, "ok".into()),
            LeaderState::Standby { healthy: false } => (
                false,
                "standing by, but the leader Lease cannot be read".into(),
            ),
            LeaderState::Leading | LeaderState::Disabled if synced => {
                let down = self.watches.down_longer_than(READ_IDLE_TIMEOUT);
                if down.is_empty() {
                    return (true, "ok".into());
                }
                let which: Vec<String> = down
                    .iter()
                    .map(|(path, d)| format!("{path} for {}s", d.as_secs()))
                    .collect();
                (
                    false,
                    format!(
                        "no live watch (its connection to the API server was found dead): {}",
                        which.join(", ")
                    )
                    .into(),
                )
            }
            LeaderState::Leading | LeaderState::Disabled => {
                (false, "shared informers have not synced yet".into())
            }
        }
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<MetricsRegistry>,
}

fn probe((ok, reason): (bool, Cow<'static, str>), failure: StatusCode) -> Response {
    let status = if ok { StatusCode::OK } else { failure };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        reason,
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    probe(s.health.live(), StatusCode::INTERNAL_SERVER_ERROR)
}

async fn readyz(State(s): State<AppState>) -> Response {
    probe(s.health.ready(), StatusCode::SERVICE_UNAVAILABLE)
}

async fn metrics(State(s): State<AppState>) -> Response {
    match s.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The router serving the four paths.
pub(crate) fn router(health: Arc<Health>, registry: Arc<MetricsRegistry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            health,
            metrics: registry,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_per_state() {
        let cases = [
            // (state, synced, shutting down) -> (live, ready)
            (LeaderState::Disabled, false, false, true, false),
            (LeaderState::Disabled, true, false, true, true),
            (LeaderState::Leading, false, false, true, false),
            (LeaderState::Leading, true, false, true, true),
            (
                LeaderState::Standby { healthy: true },
                false,
                false,
                true,
                true,
            ),
            (
                LeaderState::Standby { healthy: false },
                false,
                false,
                true,
                false,
            ),
            (LeaderState::Lost, true, false, false, false),
            (LeaderState::Leading, true, true, true, false),
        ];
        for (state, synced, stopping, live, ready) in cases {
            let h = Health::new(state, WatchLiveness::default());
            h.synced.store(synced, Ordering::SeqCst);
            h.shutting_down.store(stopping, Ordering::SeqCst);
            assert_eq!(
                h.live().0,
                live,
                "{state:?} synced={synced} stopping={stopping}"
            );
            assert_eq!(
                h.ready().0,
                ready,
                "{state:?} synced={synced} stopping={stopping}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_is_not_ready_while_a_watch_has_been_dead_longer_than_the_bound() {
        let watches = WatchLiveness::default();
        let h = Health::new(LeaderState::Leading, watches.clone());
        h.synced.store(true, Ordering::SeqCst);
        watches.down("/api/v1/nodes");
        assert!(
            h.ready().0,
            "a dead connection just found is being replaced"
        );
        tokio::time::advance(READ_IDLE_TIMEOUT + std::time::Duration::from_secs(1)).await;
        let (ready, reason) = h.ready();
        assert!(!ready);
        assert!(reason.contains("/api/v1/nodes"), "{reason}");
        assert!(
            h.live().0,
            "/livez stays up: a restart would not mend the network"
        );
    }
}
