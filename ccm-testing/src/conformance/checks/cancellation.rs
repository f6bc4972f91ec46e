//! Conformance check: a cancelled call leaves the cloud consistent.

use super::*;
use crate::conformance::panic_message;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

/// Polls `fut` once (`after` zero) or for at most `after`, then drops it. Fails on a panic.
pub(super) async fn cancel_after<T>(
    after: Duration,
    what: &str,
    fut: impl Future<Output = CloudResult<T>>,
) -> Step {
    let fut = AssertUnwindSafe(fut).catch_unwind();
    let polled = if after.is_zero() {
        // Exactly one poll, then drop: the cancellation point right after the first `.await`
        // that is pending.
        fut.now_or_never().map(Ok).unwrap_or_else(|| Err(()))
    } else {
        tokio::time::timeout(after, fut).await.map_err(|_| ())
    };
    match polled {
        Ok(Err(panic)) => Err(fail(
            format!("{what} not to panic"),
            format!("panicked: {}", panic_message(panic.as_ref())),
        )),
        // Finished in time (ok or error) or cancelled: both fine here.
        Ok(Ok(_)) | Err(_) => Ok(()),
    }
}

/// After `what`, an ensure then an ensure_load_balancer_deleted must leave the load balancer
/// as it was before the check (`before`: whether it existed).
async fn lb_as_before(ctx: &mut Ctx<'_>, hosts: &[NodeView], before: bool, what: &str) -> Step {
    let (_, svc) = ctx.lb()?;
    let state = |b: bool| if b { "exists" } else { "does not exist" };
    ctx.ensure(hosts).await?;
    ctx.delete_lb().await?;
    let now = ctx.get_lb().await?.is_some();
    if now != before {
        return Err(fail(
            format!(
                "after {what}, then ensure and ensure_load_balancer_deleted, the load balancer of {} to be as before ({})",
                service_ref(svc),
                state(before)
            ),
            format!("get_load_balancer: it {}", state(now)),
        ));
    }
    Ok(())
}

/// After `what`, deleting every listed route to `cidr` must leave none.
async fn delete_every_route_to(ctx: &Ctx<'_>, cidr: &str, what: &str) -> Step {
    for listed in ctx.listed_with(cidr).await? {
        ctx.delete_route(&listed).await?;
    }
    let left = ctx.listed_with(cidr).await?;
    if !left.is_empty() {
        return Err(fail(
            format!("after {what}, deleting every listed route to {cidr} to leave none"),
            format!("{left:?}"),
        ));
    }
    Ok(())
}

pub(super) async fn cancellation(ctx: &mut Ctx<'_>) -> Step {
    let delays = [Duration::ZERO, ctx.input().cancel_after];
    let mut exercised = false;

    if let (Some(v2), Ok(nodes)) = (ctx.v2(), ctx.nodes()) {
        exercised = true;
        let node = &nodes[0];
        let name = name_of(node);
        let before = ctx.metadata(v2, node).await?;
        for after in delays {
            cancel_after(
                after,
                "a cancelled instance_metadata",
                v2.instance_metadata(node),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_exists",
                v2.instance_exists(node),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_shutdown",
                v2.instance_shutdown(node),
            )
            .await?;
            if let Some(batch) = ctx.provider().instances_batch() {
                cancel_after(
                    after,
                    "a cancelled describe_instances",
                    batch.describe_instances(std::slice::from_ref(node)),
                )
                .await?;
            }
            let again = ctx.metadata(v2, node).await?;
            if again != before {
                return Err(fail(
                    format!(
                        "instance_metadata of node {name:?} after a cancelled call to answer as before"
                    ),
                    format!("it changed: {}", metadata_diff(&before, &again)),
                ));
            }
        }
    }

    if let (Some(v1), Ok(nodes)) = (ctx.v1(), ctx.nodes()) {
        exercised = true;
        let node = &nodes[0];
        let name = name_of(node);
        let pid = ctx.provider_id_of(node).await.unwrap_or_default();
        let answers = || async {
            (
                ctx.call("instance_id", || v1.instance_id(&name)).await.ok(),
                ctx.call("node_addresses", || v1.node_addresses(&name))
                    .await
                    .ok(),
                ctx.call("instance_type", || v1.instance_type(&name))
                    .await
                    .ok(),
            )
        };
        let before = answers().await;
        for after in delays {
            cancel_after(
                after,
                "a cancelled node_addresses",
                v1.node_addresses(&name),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled node_addresses_by_provider_id",
                v1.node_addresses_by_provider_id(&pid),
            )
            .await?;
            cancel_after(after, "a cancelled instance_id", v1.instance_id(&name)).await?;
            cancel_after(after, "a cancelled instance_type", v1.instance_type(&name)).await?;
            cancel_after(
                after,
                "a cancelled instance_type_by_provider_id",
                v1.instance_type_by_provider_id(&pid),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_exists_by_provider_id",
                v1.instance_exists_by_provider_id(&pid),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_shutdown_by_provider_id",
                v1.instance_shutdown_by_provider_id(&pid),
            )
            .await?;
            if let Some(zones) = ctx.provider().zones() {
                cancel_after(
                    after,
                    "a cancelled get_zone_by_provider_id",
                    zones.get_zone_by_provider_id(&pid),
                )
                .await?;
                cancel_after(
                    after,
                    "a cancelled get_zone_by_node_name",
                    zones.get_zone_by_node_name(&name),
                )
                .await?;
            }
            let again = answers().await;
            if again != before {
                return Err(fail(
                    format!(
                        "instance_id, node_addresses and instance_type of node {name:?} after cancelled legacy calls to answer as before: {before:?}"
                    ),
                    format!("{again:?}"),
                ));
            }
        }
    }

    if let (Ok((lb, svc)), Ok(hosts)) = (ctx.lb(), ctx.nodes()) {
        exercised = true;
        let cluster = ctx.cluster();
        let before = ctx.get_lb().await?.is_some();
        for after in delays {
            ctx.lb_touched = true;
            cancel_after(
                after,
                "a cancelled ensure_load_balancer",
                lb.ensure_load_balancer(cluster, svc, hosts),
            )
            .await?;
            lb_as_before(ctx, hosts, before, "a cancelled ensure_load_balancer").await?;

            ctx.ensure(hosts).await?;
            cancel_after(
                after,
                "a cancelled get_load_balancer",
                lb.get_load_balancer(cluster, svc),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled update_load_balancer",
                lb.update_load_balancer(cluster, svc, &hosts[..1]),
            )
            .await?;
            if let Some(batch) = ctx.provider().load_balancer_hosts_batch() {
                let services = [std::sync::Arc::new(svc.clone())];
                cancel_after(
                    after,
                    "a cancelled update_load_balancer_hosts",
                    batch.update_load_balancer_hosts(cluster, &services, &hosts[..1]),
                )
                .await?;
            }
            let answer = ctx
                .call("update_load_balancer", || {
                    lb.update_load_balancer(cluster, svc, hosts)
                })
                .await;
            succeeded(
                tolerate(answer, CloudError::is_implemented_elsewhere, ()),
                format!(
                    "update_load_balancer of {} after a cancelled update to succeed",
                    service_ref(svc)
                ),
            )?;
            if ctx.get_lb().await?.is_none() {
                return Err(fail(
                    format!(
                        "get_load_balancer of {} to report it after a cancelled then a completed update_load_balancer",
                        service_ref(svc)
                    ),
                    "None",
                ));
            }
            cancel_after(
                after,
                "a cancelled ensure_load_balancer_deleted",
                lb.ensure_load_balancer_deleted(cluster, svc),
            )
            .await?;
            lb_as_before(
                ctx,
                hosts,
                before,
                "a cancelled ensure_load_balancer_deleted",
            )
            .await?;
        }
    }

    if let Ok((routes, cidr, node)) = ctx.routes() {
        exercised = true;
        require_unused_cidr(ctx, cidr).await?;
        let cluster = ctx.cluster();
        let route = ctx.route_for(node, cidr);
        let hint = Ctx::name_hint(node, "");
        for after in delays {
            ctx.routes_touched = true;
            cancel_after(
                after,
                "a cancelled list_routes",
                routes.list_routes(cluster),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled create_route",
                routes.create_route(cluster, &hint, &route),
            )
            .await?;
            delete_every_route_to(ctx, cidr, "a cancelled create_route").await?;
            ctx.create_route(node, cidr, "").await?;
            for listed in ctx.listed_with(cidr).await? {
                cancel_after(
                    after,
                    "a cancelled delete_route",
                    routes.delete_route(cluster, &listed),
                )
                .await?;
            }
            delete_every_route_to(ctx, cidr, "a cancelled delete_route").await?;
        }
    }

    if exercised {
        Ok(())
    } else {
        Err(nothing_to_exercise(
            ctx,
            "nothing to cancel: no InstancesV2 with nodes, no LoadBalancer with a Service, no Routes with a CIDR",
        ))
    }
}
