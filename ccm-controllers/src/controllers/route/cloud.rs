//! The route controller's cloud calls: a plan's deletes and creates, at most so many in flight.

use std::time::{Duration, Instant};

use ccm_core::{CloudError, Routes};
use tokio::sync::Semaphore;

use super::plan::{RouteCreate, RoutePlan};

/// What went wrong while executing a plan.
#[derive(Debug, Default)]
pub(super) struct ExecResult {
    /// Failed creates, with the error and how long the attempt took (from before waiting for a
    /// permit, as Go measures).
    pub(super) failed_creates: Vec<(RouteCreate, CloudError, Duration)>,
    /// Deletes that failed with an error other than `Retry`.
    pub(super) failed_deletes: usize,
    /// The longest `Retry` delay a delete asked for.
    pub(super) delete_retry_after: Option<Duration>,
}

/// How the log lines name a call that answered `Ok`: in shadow mode the cloud guard answers
/// a mutating call without sending it, and the log must not read as if the route changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Calls {
    /// The calls reach the provider.
    Sent,
    /// Shadow mode: the guard keeps them from the cloud.
    Shadowed,
}

impl Calls {
    fn deleted(self) -> &'static str {
        match self {
            Calls::Sent => "deleted route",
            Calls::Shadowed => "shadow: would delete route (not sent)",
        }
    }

    fn created(self) -> &'static str {
        match self {
            Calls::Sent => "created route",
            Calls::Shadowed => "shadow: would create route (not sent)",
        }
    }
}

/// Runs a plan's deletes and creates against the provider, at most `ops` permits' worth in
/// flight. When the plan says so, every delete finishes before the first create starts.
pub(super) async fn execute(
    routes: &dyn Routes,
    cluster_name: &str,
    plan: &RoutePlan,
    ops: &Semaphore,
    calls: Calls,
) -> ExecResult {
    let deletes = futures::future::join_all(plan.deletes.iter().map(|route| async move {
        let started = Instant::now();
        let Ok(_permit) = ops.acquire().await else {
            return Err(CloudError::msg("route operations closed"));
        };
        tracing::info!(route = %route.name, cidr = %route.destination_cidr, target = %route.target_node, "deleting route");
        let result = routes.delete_route(cluster_name, route).await;
        match &result {
            Ok(()) => tracing::info!(
                route = %route.name, cidr = %route.destination_cidr,
                after = ?started.elapsed(), "{}", calls.deleted()
            ),
            Err(error) => tracing::warn!(
                route = %route.name, cidr = %route.destination_cidr,
                after = ?started.elapsed(), %error, "could not delete route"
            ),
        }
        result
    }));
    let creates = futures::future::join_all(plan.creates.iter().map(|create| async move {
        let started = Instant::now();
        let result = create_route(routes, cluster_name, create, ops, calls).await;
        (create, result, started.elapsed())
    }));
    let (delete_results, create_results) = if plan.deletes_before_creates {
        let d = deletes.await;
        (d, creates.await)
    } else {
        futures::join!(deletes, creates)
    };
    let mut out = ExecResult::default();
    for result in delete_results {
        match result {
            Ok(()) => {}
            Err(e) => match e.retry_after() {
                Some(after) => {
                    out.delete_retry_after =
                        Some(out.delete_retry_after.unwrap_or_default().max(after));
                }
                None => out.failed_deletes += 1,
            },
        }
    }
    for (create, result, took) in create_results {
        if let Err(e) = result {
            out.failed_creates.push((create.clone(), e, took));
        }
    }
    out
}

/// One create call, holding an operation permit.
pub(super) async fn create_route(
    routes: &dyn Routes,
    cluster_name: &str,
    create: &RouteCreate,
    ops: &Semaphore,
    calls: Calls,
) -> Result<(), CloudError> {
    let started = Instant::now();
    let Ok(_permit) = ops.acquire().await else {
        return Err(CloudError::msg("route operations closed"));
    };
    let node = &create.route.target_node;
    let cidr = &create.route.destination_cidr;
    tracing::info!(%node, %cidr, hint = %create.name_hint, throttled = ?started.elapsed(), "creating route");
    let result = routes
        .create_route(cluster_name, &create.name_hint, &create.route)
        .await;
    match &result {
        Ok(()) => {
            tracing::info!(%node, %cidr, hint = %create.name_hint, after = ?started.elapsed(), "{}", calls.created())
        }
        Err(error) => {
            tracing::warn!(%node, %cidr, hint = %create.name_hint, after = ?started.elapsed(), %error, "could not create route")
        }
    }
    result
}

/// Go's event text for a failed create.
pub(super) fn failed_create_message(
    create: &RouteCreate,
    took: Duration,
    error: &CloudError,
) -> String {
    format!(
        "Could not create route {} {} for node {} after {:?}: {}",
        create.name_hint, create.route.destination_cidr, create.route.target_node, took, error
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::controllers::route::DEFAULT_MAX_CONCURRENT_OPERATIONS;
    use ccm_core::Route;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A provider whose calls take a while, counting how many run at once.
    #[derive(Default)]
    struct SlowRoutes {
        running: AtomicUsize,
        max_running: AtomicUsize,
        calls: Mutex<Vec<String>>,
        fail_creates_for: Option<String>,
    }

    impl SlowRoutes {
        async fn op(&self, what: String) {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.calls.lock().unwrap().push(what);
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl Routes for SlowRoutes {
        async fn list_routes(&self, _: &str) -> ccm_core::CloudResult<Vec<Route>> {
            Ok(Vec::new())
        }
        async fn create_route(
            &self,
            _: &str,
            _hint: &str,
            route: &Route,
        ) -> ccm_core::CloudResult<()> {
            self.op(format!("create {}", route.target_node)).await;
            if self.fail_creates_for.as_deref() == Some(route.target_node.as_str()) {
                return Err(CloudError::msg("quota exceeded"));
            }
            Ok(())
        }
        async fn delete_route(&self, _: &str, route: &Route) -> ccm_core::CloudResult<()> {
            self.op(format!("delete {}", route.name)).await;
            if route.name == "retry" {
                return Err(CloudError::retry(Duration::from_secs(7), "busy"));
            }
            if route.name == "fail" {
                return Err(CloudError::msg("boom"));
            }
            Ok(())
        }
    }

    fn create(node: &str) -> RouteCreate {
        RouteCreate {
            name_hint: format!("uid-{node}"),
            route: Route {
                target_node: node.into(),
                destination_cidr: "10.244.1.0/24".into(),
                ..Route::default()
            },
        }
    }

    fn delete(name: &str) -> Route {
        Route {
            name: name.into(),
            ..Route::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_the_limit_of_operations_is_in_flight() {
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            creates: (0..300).map(|i| create(&format!("n{i}"))).collect(),
            deletes: (0..100).map(|i| delete(&format!("d{i}"))).collect(),
            ..RoutePlan::default()
        };
        let ops = Semaphore::new(DEFAULT_MAX_CONCURRENT_OPERATIONS);
        let result = execute(&routes, "k", &plan, &ops, Calls::Sent).await;
        assert!(result.failed_creates.is_empty());
        assert_eq!(routes.calls.lock().unwrap().len(), 400);
        assert_eq!(routes.max_running.load(Ordering::SeqCst), 200);
    }

    #[test]
    fn shadowed_calls_are_logged_as_not_sent() {
        // The log lines of `execute` and `create_route` after an `Ok` take their text from
        // these (a log capture here would race with other tests' threads over tracing's
        // per-callsite interest cache).
        assert_eq!(Calls::Sent.created(), "created route");
        assert_eq!(Calls::Sent.deleted(), "deleted route");
        assert_eq!(
            Calls::Shadowed.created(),
            "shadow: would create route (not sent)"
        );
        assert_eq!(
            Calls::Shadowed.deleted(),
            "shadow: would delete route (not sent)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deletes_finish_before_creates_when_the_plan_says_so() {
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            creates: vec![create("a"), create("b")],
            deletes: vec![delete("old-a"), delete("old-b")],
            deletes_before_creates: true,
            ..RoutePlan::default()
        };
        execute(&routes, "k", &plan, &Semaphore::new(200), Calls::Sent).await;
        let calls = routes.calls.lock().unwrap().clone();
        assert!(
            calls[..2].iter().all(|c| c.starts_with("delete")),
            "{calls:?}"
        );
        assert!(
            calls[2..].iter().all(|c| c.starts_with("create")),
            "{calls:?}"
        );

        // Otherwise they run together.
        let routes = SlowRoutes::default();
        let plan = RoutePlan {
            deletes_before_creates: false,
            ..plan
        };
        execute(&routes, "k", &plan, &Semaphore::new(200), Calls::Sent).await;
        assert_eq!(routes.max_running.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_collected_without_stopping_the_rest() {
        let routes = SlowRoutes {
            fail_creates_for: Some("b".into()),
            ..SlowRoutes::default()
        };
        let plan = RoutePlan {
            creates: vec![create("a"), create("b"), create("c")],
            deletes: vec![delete("retry"), delete("fail"), delete("ok")],
            ..RoutePlan::default()
        };
        let result = execute(&routes, "k", &plan, &Semaphore::new(200), Calls::Sent).await;
        assert_eq!(routes.calls.lock().unwrap().len(), 6);
        assert_eq!(result.failed_creates.len(), 1);
        let (c, e, took) = &result.failed_creates[0];
        assert_eq!(c.route.target_node, "b");
        assert_eq!(
            failed_create_message(c, *took, e),
            format!(
                "Could not create route uid-b 10.244.1.0/24 for node b after {took:?}: quota exceeded"
            )
        );
        assert_eq!(result.failed_deletes, 1);
        assert_eq!(result.delete_retry_after, Some(Duration::from_secs(7)));
    }
}
