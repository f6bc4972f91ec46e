//! Health and metrics over HTTP (axum): `/healthz`, `/livez`, `/readyz`, `/metrics`.
//!
//! - `/healthz` and `/livez`: 200 `ok` while the process works; 500 once the lease is lost.
//! - `/readyz`: 200 `ok` when the shared informers have synced and this process leads (or runs
//!   without election), or when it stands by healthily (it can read the Lease); 503 with the
//!   reason otherwise, and from the moment shutdown starts.
//! - `/metrics`: the registry in OpenMetrics text format.
//!
//! The router is served over HTTPS with delegated authentication and authorization by
//! [`secure_serving`](crate::secure_serving) on `--bind-address:--secure-port` (Go's 10258);
//! the probes are in `--authorization-always-allow-paths` by default. Go has no `/readyz` or
//! `/livez`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;

use crate::machinery::metrics::MetricsRegistry;
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
}

impl Health {
    /// Initial state: not synced, not shutting down, `leader` as given.
    pub(crate) fn new(leader: LeaderState) -> Arc<Self> {
        Arc::new(Health {
            leader: watch::channel(leader).0,
            synced: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
        })
    }

    /// `(healthy, reason)` for `/healthz` and `/livez`.
    pub(crate) fn live(&self) -> (bool, &'static str) {
        match *self.leader.borrow() {
            LeaderState::Lost => (false, "leader election lost"),
            _ => (true, "ok"),
        }
    }

    /// `(ready, reason)` for `/readyz`.
    pub(crate) fn ready(&self) -> (bool, &'static str) {
        if self.shutting_down.load(Ordering::SeqCst) {
            return (false, "shutting down");
        }
        let synced = self.synced.load(Ordering::SeqCst);
        match *self.leader.borrow() {
            LeaderState::Lost => (false, "leader election lost"),
            LeaderState::Standby { healthy: true } => (true, "ok"),
            LeaderState::Standby { healthy: false } => {
                (false, "standing by, but the leader Lease cannot be read")
            }
            LeaderState::Leading | LeaderState::Disabled if synced => (true, "ok"),
            LeaderState::Leading | LeaderState::Disabled => {
                (false, "shared informers have not synced yet")
            }
        }
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<MetricsRegistry>,
}

fn probe((ok, reason): (bool, &'static str), failure: StatusCode) -> Response {
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
            let h = Health::new(state);
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
}
