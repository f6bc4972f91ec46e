//! Conformance checks of `Routes`.

use super::*;

pub(super) async fn routes_round_trip(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    ctx.create_route(node, cidr, "").await?;
    let listed = ctx.listed_with(cidr).await?;
    let Some(route) = listed.first() else {
        return Err(fail(
            format!("list_routes to return the route to {cidr} after create_route"),
            "no route with that destination CIDR",
        ));
    };
    if route.target_node != name_of(node) {
        return Err(fail(
            format!(
                "the listed route to {cidr} to target node {:?}",
                name_of(node)
            ),
            format!("{route:?}"),
        ));
    }
    ctx.delete_route(route).await?;
    let left = ctx.listed_with(cidr).await?;
    if !left.is_empty() {
        return Err(fail(
            format!("no route to {cidr} after delete_route"),
            format!("{left:?}"),
        ));
    }
    Ok(())
}

pub(super) async fn routes_create_existing(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    ctx.create_route(node, cidr, "").await?;
    ctx.create_route(node, cidr, "").await.map_err(|stop| {
        stop.expecting(format!(
            "creating the existing route to {cidr} again to succeed"
        ))
    })?;
    let listed = ctx.listed_with(cidr).await?;
    if listed.len() > 1 {
        return Err(fail(
            format!("at most one route to {cidr} after creating it twice"),
            format!("{listed:?}"),
        ));
    }
    Ok(())
}

pub(super) async fn routes_delete_missing(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    let never_created = ctx.route_for(node, cidr);
    ctx.delete_route(&never_created).await.map_err(|stop| {
        stop.expecting(format!(
            "delete_route of a route to {cidr} that was never created to succeed"
        ))
    })?;
    ctx.create_route(node, cidr, "").await?;
    let listed = ctx.listed_with(cidr).await?;
    for route in &listed {
        ctx.delete_route(route).await?;
    }
    for route in &listed {
        ctx.delete_route(route).await.map_err(|stop| {
            stop.expecting(format!(
                "delete_route of the already deleted route {:?} to succeed",
                route.name
            ))
        })?;
    }
    Ok(())
}

/// The one route listed to `cidr`, or a failure naming `what` went before. (Its target node is
/// `routes_round_trip`'s business.)
pub(super) async fn the_route_to(ctx: &Ctx<'_>, cidr: &str, what: &str) -> Result<Route, Stop> {
    let listed = ctx.listed_with(cidr).await?;
    match listed.as_slice() {
        [route] => Ok(route.clone()),
        _ => Err(fail(
            format!("exactly one listed route to {cidr} {what}"),
            format!("routes listed to {cidr}: {listed:?}"),
        )),
    }
}

pub(super) async fn routes_dual_stack(ctx: &mut Ctx<'_>) -> Step {
    let (_, v4, node) = ctx.routes()?;
    let v6 = ctx
        .input()
        .ipv6_route_cidr
        .as_deref()
        .ok_or_else(|| skip("no IPv6 route CIDR given (ConformanceInput::ipv6_route_cidr)"))?;
    if !matches!(v4.parse::<IpNet>(), Ok(IpNet::V4(_))) {
        return Err(skip(format!(
            "ConformanceInput::route_cidr {v4:?} is not an IPv4 CIDR"
        )));
    }
    if !matches!(v6.parse::<IpNet>(), Ok(IpNet::V6(_))) {
        return Err(skip(format!(
            "ConformanceInput::ipv6_route_cidr {v6:?} is not an IPv6 CIDR"
        )));
    }
    require_unused_cidr(ctx, v4).await?;
    require_unused_cidr(ctx, v6).await?;
    let hint = Ctx::name_hint(node, "");
    // As the route controller does for a dual-stack Node: one route per pod CIDR, both under
    // the Node's UID.
    ctx.create_route(node, v4, "").await?;
    ctx.create_route(node, v6, "").await?;
    let created = format!("after create_route of {v4} and of {v6}, both with name hint {hint:?}");
    let route_v4 = the_route_to(ctx, v4, &created).await?;
    the_route_to(ctx, v6, &created).await?;
    // The IPv4 route goes (e.g. the Node lost that pod CIDR); the IPv6 one must stay.
    ctx.delete_route(&route_v4).await?;
    let left = ctx.listed_with(v4).await?;
    if !left.is_empty() {
        return Err(fail(
            format!("no route to {v4} after delete_route"),
            format!("{left:?}"),
        ));
    }
    the_route_to(
        ctx,
        v6,
        &format!("after delete_route of the route to {v4} (same name hint)"),
    )
    .await?;
    // The controller creates the IPv6 route again after a lost answer or a restart.
    ctx.create_route(node, v6, "").await?;
    let route_v6 = the_route_to(
        ctx,
        v6,
        &format!("after create_route of the existing route to {v6} again"),
    )
    .await?;
    ctx.delete_route(&route_v6).await?;
    let left: Vec<Route> = ctx
        .list_routes()
        .await?
        .into_iter()
        .filter(|r| inside(v4, &r.destination_cidr) || inside(v6, &r.destination_cidr))
        .collect();
    if !left.is_empty() {
        return Err(fail(
            format!("no route inside {v4} or {v6} after deleting both routes"),
            format!("{left:?}"),
        ));
    }
    Ok(())
}
