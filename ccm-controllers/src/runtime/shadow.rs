//! Shadow mode in the runtime (`--shadow`, `--shadow-report`): what the startup steps change
//! for it, the `/shadow/divergences` endpoint, and the one-shot report. The guards and the
//! recorder are in `machinery/shadow`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::machinery::budget::{BudgetConfig, BudgetedProvider};
use crate::machinery::context::ControllerContext;
use crate::machinery::go_syntax::format_go_duration;
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::shadow::Shadow;
use crate::machinery::shadow::progress::Cutoff;
use crate::options::{Options, SHADOW_DEFAULT_CLOUD_API_QPS};

/// The exit code of a one-shot shadow that found divergences (whether or not it compared
/// every object: a divergence found is a finding).
pub(super) const EXIT_DIVERGENCES: i32 = 3;
/// The exit code of a one-shot shadow that found no divergence but could not compare every
/// object within `--shadow-duration` plus `--shadow-settle-time` (never read as "clean").
pub(super) const EXIT_INCOMPLETE: i32 = 4;

/// How often the one-shot checks, after `--shadow-duration`, whether every object was compared.
const SETTLE_POLL: Duration = Duration::from_millis(200);

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
/// every object was compared and the controllers' queues went idle, or, at the latest,
/// `--shadow-settle-time` later, whatever is still queued or in flight. Cut off with objects
/// not compared, the report lists them, with "budget saturated" when cloud calls were waiting
/// for the budget (`budgeted`) then.
pub(super) fn spawn(
    shadow: Option<&Arc<Shadow>>,
    options: &Options,
    ctx: &ControllerContext,
    budgeted: &Arc<BudgetedProvider>,
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
    let settle = options.shadow.shadow_settle_time;
    let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
    let (shadow, budgeted) = (shadow.clone(), budgeted.clone());
    tasks.spawn(async move {
        if !ctx.wait_for_sync().await {
            return;
        }
        tokio::time::sleep(duration).await;
        let settled = async {
            while !(shadow.all_compared() && ctx.activity().in_flight() == 0) {
                tokio::time::sleep(SETTLE_POLL).await;
            }
        };
        if tokio::time::timeout(settle, settled).await.is_ok() {
            tracing::info!("shadow: one-shot run complete; stopping");
        } else if shadow.all_compared() {
            // Periodic work (e.g. an address refresh pass) still runs: every object was
            // compared, the report is complete.
            tracing::info!(
                settle_time = %format_go_duration(settle),
                "shadow: one-shot run complete (every object compared; periodic work still in flight); stopping"
            );
        } else {
            let budget_saturated = budgeted.waiting_for_budget() > 0;
            shadow.cut_off(Cutoff { budget_saturated });
            tracing::warn!(
                settle_time = %format_go_duration(settle),
                not_compared = shadow.not_compared_objects().len(),
                budget_saturated,
                "shadow: one-shot run cut off at --shadow-duration plus --shadow-settle-time with objects not compared; the report lists them"
            );
        }
        shutdown.cancel();
    });
}

/// After a one-shot run: writes the report to `--shadow-report` and the summary to `out`;
/// the exit code is `code` when the run failed (1), else [`EXIT_DIVERGENCES`] when there are
/// divergences, else [`EXIT_INCOMPLETE`] when objects were not compared, else 0.
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
    if !report.divergences.is_empty() {
        EXIT_DIVERGENCES
    } else if !report.complete {
        EXIT_INCOMPLETE
    } else {
        0
    }
}
