//! Conformance check: concurrent calls are safe.

use super::*;
use crate::conformance::panic_message;

/// Runs `n` copies of a task at once on the runtime (threads, when it has several).
pub(super) async fn parallel<T, F, Fut>(n: usize, make: F) -> Vec<Result<T, String>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for handle in handles {
        out.push(handle.await.map_err(|e| {
            if e.is_panic() {
                format!("panicked: {}", panic_message(e.into_panic().as_ref()))
            } else {
                e.to_string()
            }
        }));
    }
    out
}

pub(super) fn flatten<T>(r: Result<CloudResult<T>, String>) -> Result<T, String> {
    r.and_then(|inner| inner.map_err(|e| describe(&e)))
}

pub(super) async fn concurrency(ctx: &mut Ctx<'_>) -> Step {
    let provider: Arc<dyn CloudProvider> = ctx.suite.provider.clone();
    let input = ctx.input();
    let (timeout, budget) = (input.call_timeout, input.retry_budget);
    let n = input.parallelism.max(1);
    let mut exercised = false;

    if let (Some(v2), Ok(nodes)) = (ctx.v2(), ctx.nodes()) {
        exercised = true;
        let mut sequential = Vec::new();
        for node in nodes {
            sequential.push(ctx.metadata(v2, node).await?);
        }
        let total = n.max(nodes.len());
        let answers = parallel(total, |i| {
            let provider = provider.clone();
            let node = nodes[i % nodes.len()].clone();
            async move {
                let Some(v2) = provider.instances_v2() else {
                    return Err(CloudError::msg("instances_v2() became None"));
                };
                call_with_retry(timeout, budget, "instance_metadata", || {
                    v2.instance_metadata(&node)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            let node = &nodes[i % nodes.len()];
            let expected = &sequential[i % nodes.len()];
            match flatten(answer) {
                Ok(meta) if &meta == expected => {}
                Ok(meta) => {
                    return Err(fail(
                        format!(
                            "parallel instance_metadata of node {:?} to answer as a sequential call",
                            name_of(node)
                        ),
                        format!("it differs: {}", metadata_diff(expected, &meta)),
                    ));
                }
                Err(e) => {
                    return Err(fail(
                        format!(
                            "parallel instance_metadata of node {:?} to succeed",
                            name_of(node)
                        ),
                        e,
                    ));
                }
            }
        }
    }

    if let (Ok((_, svc)), Ok(nodes)) = (ctx.lb(), ctx.nodes()) {
        exercised = true;
        let cluster = ctx.cluster().to_owned();
        let before = ctx.get_lb().await?.is_some();
        ctx.lb_touched = true;
        // Half the tasks ensure, the other half read while the writes are in flight.
        let answers = parallel(2 * n, |i| {
            let (provider, svc, nodes, cluster) = (
                provider.clone(),
                svc.clone(),
                nodes.to_vec(),
                cluster.clone(),
            );
            async move {
                let Some(lb) = provider.load_balancer() else {
                    return Err(CloudError::msg("load_balancer() became None"));
                };
                if i % 2 == 1 {
                    return call_with_retry(timeout, budget, "get_load_balancer", || {
                        lb.get_load_balancer(&cluster, &svc)
                    })
                    .await
                    .map(|_| ());
                }
                call_with_retry(timeout, budget, "ensure_load_balancer", || {
                    lb.ensure_load_balancer(&cluster, &svc, &nodes)
                })
                .await
                .map(|_| ())
            }
        })
        .await;
        for answer in answers {
            match flatten(answer) {
                Ok(_) => {}
                Err(e) if e.contains("implemented_elsewhere") => {
                    return Err(not_offered(
                        "ensure_load_balancer answers ImplementedElsewhere",
                    ));
                }
                Err(e) => {
                    return Err(fail(
                        format!(
                            "{n} parallel ensure_load_balancer of {} (with {n} get_load_balancer) to all succeed",
                            service_ref(svc)
                        ),
                        e,
                    ));
                }
            }
        }
        if ctx.get_lb().await?.is_none() {
            return Err(fail(
                format!(
                    "get_load_balancer of {} to report it after parallel ensure_load_balancer",
                    service_ref(svc)
                ),
                "None",
            ));
        }
        ctx.delete_lb().await?;
        let now = ctx.get_lb().await?.is_some();
        if now != before {
            return Err(fail(
                format!(
                    "after parallel ensure then ensure_load_balancer_deleted, get_load_balancer of {} to answer as before ({})",
                    service_ref(svc),
                    if before { "exists" } else { "does not exist" }
                ),
                if now {
                    "it exists"
                } else {
                    "it does not exist"
                },
            ));
        }
    }

    if let (Ok((_, cidr, _)), Ok(nodes)) = (ctx.routes(), ctx.nodes()) {
        exercised = true;
        let subnets = split_cidr(cidr, n);
        for subnet in &subnets {
            require_unused_cidr(ctx, subnet).await?;
        }
        ctx.routes_touched = true;
        let cluster = ctx.cluster().to_owned();
        let answers = parallel(subnets.len(), |i| {
            let node = nodes[i % nodes.len()].clone();
            let route = ctx.route_for(&node, &subnets[i]);
            let hint = Ctx::name_hint(&node, &format!("-{i}"));
            let (provider, cluster) = (provider.clone(), cluster.clone());
            async move {
                let Some(routes) = provider.routes() else {
                    return Err(CloudError::msg("routes() became None"));
                };
                call_with_retry(timeout, budget, "create_route", || {
                    routes.create_route(&cluster, &hint, &route)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            if let Err(e) = flatten(answer) {
                return Err(fail(
                    format!("parallel create_route of {} to succeed", subnets[i]),
                    e,
                ));
            }
        }
        let listed = ctx.list_routes().await?;
        let mut to_delete = Vec::new();
        for subnet in &subnets {
            let matching: Vec<&Route> = listed
                .iter()
                .filter(|r| same_cidr(&r.destination_cidr, subnet))
                .collect();
            if matching.len() != 1 {
                return Err(fail(
                    format!(
                        "exactly one route to {subnet} after {} parallel create_route calls",
                        subnets.len()
                    ),
                    format!("{matching:?}"),
                ));
            }
            to_delete.extend(matching.into_iter().cloned());
        }
        let answers = parallel(to_delete.len(), |i| {
            let route = to_delete[i].clone();
            let (provider, cluster) = (provider.clone(), cluster.clone());
            async move {
                let Some(routes) = provider.routes() else {
                    return Err(CloudError::msg("routes() became None"));
                };
                call_with_retry(timeout, budget, "delete_route", || {
                    routes.delete_route(&cluster, &route)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            if let Err(e) = flatten(answer) {
                return Err(fail(
                    format!(
                        "parallel delete_route of {} to succeed",
                        to_delete[i].destination_cidr
                    ),
                    e,
                ));
            }
        }
        let left: Vec<Route> = ctx
            .list_routes()
            .await?
            .into_iter()
            .filter(|r| subnets.iter().any(|s| same_cidr(&r.destination_cidr, s)))
            .collect();
        if !left.is_empty() {
            return Err(fail(
                "no route left after parallel delete_route of every created route",
                format!("{left:?}"),
            ));
        }
    }

    if exercised {
        Ok(())
    } else {
        Err(nothing_to_exercise(
            ctx,
            "nothing to call in parallel: no InstancesV2 with nodes, no LoadBalancer with a Service, no Routes with a CIDR",
        ))
    }
}

/// Up to `n` distinct sub-networks of `cidr` (four bits longer prefix), or `cidr` alone when
/// it cannot be split.
pub(super) fn split_cidr(cidr: &str, n: usize) -> Vec<String> {
    let Ok(net) = cidr.parse::<IpNet>() else {
        return vec![cidr.to_owned()];
    };
    let prefix = net.prefix_len().saturating_add(4).min(net.max_prefix_len());
    match net.subnets(prefix) {
        Ok(subnets) if prefix > net.prefix_len() => {
            subnets.take(n).map(|s| s.to_string()).collect()
        }
        _ => vec![net.trunc().to_string()],
    }
}
