//! Shadow mode in the runtime (`--shadow`, `--shadow-report`): what the startup steps change
//! for it, the `/shadow/divergences` endpoint, and the one-shot report. The guards and the
//! recorder are in `machinery/shadow`.

use std::io::Write;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::machinery::budget::BudgetConfig;
use crate::machinery::context::ControllerContext;
use crate::machinery::go_syntax::format_go_duration;
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::shadow::Shadow;
use crate::options::{Options, SHADOW_DEFAULT_CLOUD_API_QPS};

/// The exit code of a one-shot shadow that found divergences.
pub(super) const EXIT_DIVERGENCES: i32 = 3;

/// The path of the divergences endpoint on the secure port.
pub(super) const DIVERGENCES_PATH: &str = "/shadow/divergences";

/// The recorder, in shadow mode; logs what the mode changes.
pub(super) fn start(options: &Options, metrics: &MetricsRegistry) -> Option<Arc<Shadow>> {
    let args = &options.shadow;
    if !args.enabled() {
        return None;
    }
    tracing::info!(
        pending_grace = %format_go_duration(args.shadow_pending_grace),
        "shadow mode: no Lease, API writes as dryRun=All, no Events, no mutating cloud call"
    );
    if options.use_service_account_credentials() {
        tracing::warn!(
            "shadow mode: --use-service-account-credentials is ignored (creating ServiceAccounts and tokens would write); every controller uses the root credentials"
        );
    }
    Some(Shadow::new(args.shadow_pending_grace, metrics))
}

/// The budget: in shadow mode `--cloud-api-qps` defaults to [`SHADOW_DEFAULT_CLOUD_API_QPS`]
/// (burst twice that), so a shadow never eats the quota the leader needs.
pub(super) fn budget_config(options: &Options, shadow: bool) -> BudgetConfig {
    let mut config = options.budget_config();
    if shadow && config.rate_limit.is_none() {
        config.rate_limit = Some((
            SHADOW_DEFAULT_CLOUD_API_QPS,
            (SHADOW_DEFAULT_CLOUD_API_QPS * 2.0).ceil() as u32,
        ));
    }
    config
}

/// Adds `GET /shadow/divergences` (the report as JSON) to `router`, in shadow mode. It is
/// served behind the same authentication and authorization as `/metrics`.
pub(super) fn with_endpoint(router: Router, shadow: Option<&Arc<Shadow>>) -> Router {
    match shadow {
        Some(shadow) => router.merge(
            Router::new()
                .route(DIVERGENCES_PATH, get(divergences))
                .with_state(shadow.clone()),
        ),
        None => router,
    }
}

async fn divergences(State(shadow): State<Arc<Shadow>>) -> Response {
    axum::Json(shadow.report()).into_response()
}

/// Started with the leading phase: the recorder follows the shared informers; a one-shot
/// shadow stops the process (`shutdown`) once the controllers ran for `--shadow-duration` and
/// every object was compared (the controllers' queues went idle).
pub(super) fn spawn(
    shadow: Option<&Arc<Shadow>>,
    options: &Options,
    ctx: &ControllerContext,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    let Some(shadow) = shadow else {
        return;
    };
    tasks.spawn(shadow.clone().watch(
        ctx.nodes.clone(),
        ctx.services.clone(),
        ctx.ownership().clone(),
    ));
    if options.shadow.shadow_report.is_none() {
        return;
    }
    let duration = options.shadow.shadow_duration;
    let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
    tasks.spawn(async move {
        if !ctx.wait_for_sync().await {
            return;
        }
        tokio::time::sleep(duration).await;
        ctx.activity().wait_idle().await;
        tracing::info!("shadow: one-shot run complete; stopping");
        shutdown.cancel();
    });
}

/// After a one-shot run: writes the report to `--shadow-report` and the summary to `out`;
/// the exit code is [`EXIT_DIVERGENCES`] when there are divergences, else `code`.
pub(super) fn finish(
    options: &Options,
    shadow: Option<&Arc<Shadow>>,
    code: i32,
    out: &mut dyn Write,
) -> i32 {
    let (Some(shadow), Some(path)) = (shadow, options.shadow.shadow_report.as_ref()) else {
        return code;
    };
    if code != 0 {
        return code;
    }
    let report = shadow.report();
    let written = serde_json::to_vec_pretty(&report)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(path, json));
    if let Err(e) = written {
        tracing::error!(
            "--shadow-report={}: cannot write the report: {e}",
            path.display()
        );
        return 1;
    }
    if let Err(e) = report.write_summary(out) {
        tracing::warn!("cannot write the shadow summary to stdout: {e}");
    }
    if report.divergences.is_empty() {
        0
    } else {
        EXIT_DIVERGENCES
    }
}
