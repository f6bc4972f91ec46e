//! Conformance checks of `LoadBalancer`.

use super::*;

pub(super) async fn ensure_idempotent(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let hosts = ctx.nodes()?;
    let first = ctx.ensure(hosts).await?;
    if !has_ingress(&first) {
        return Err(fail(
            format!(
                "ensure_load_balancer of {} to return a status with an ingress IP or hostname",
                service_ref(svc)
            ),
            format!("{first:?}"),
        ));
    }
    let second = ctx.ensure(hosts).await.map_err(|stop| {
        stop.expecting(format!(
            "a second ensure_load_balancer of {} with the same input to succeed (idempotent)",
            service_ref(svc)
        ))
    })?;
    if second != first {
        return Err(fail(
            format!(
                "a second ensure_load_balancer of {} with the same input to return the same status",
                service_ref(svc)
            ),
            format!("first {first:?}, then {second:?}"),
        ));
    }
    Ok(())
}

pub(super) async fn get_between(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let hosts = ctx.nodes()?;
    let svc = service_ref(svc);
    if let Some(status) = ctx.get_lb().await? {
        return Err(fail(
            format!(
                "get_load_balancer of {svc} to be None before ensure_load_balancer (the Service must have no load balancer when the suite starts)"
            ),
            format!("Some({status:?})"),
        ));
    }
    ctx.ensure(hosts).await?;
    if ctx.get_lb().await?.is_none() {
        return Err(fail(
            format!("get_load_balancer of {svc} to report it after ensure_load_balancer"),
            "None",
        ));
    }
    ctx.delete_lb().await?;
    if let Some(status) = ctx.get_lb().await? {
        return Err(fail(
            format!("get_load_balancer of {svc} to be None after ensure_load_balancer_deleted"),
            format!("Some({status:?})"),
        ));
    }
    Ok(())
}

pub(super) async fn probe_hosts(ctx: &Ctx<'_>, svc: &Service) -> Option<Option<BTreeSet<String>>> {
    let probe = ctx.input().lb_hosts_probe.as_ref()?;
    Some(probe(svc.clone()).await.map(|h| h.into_iter().collect()))
}

pub(super) async fn update_changes_hosts(ctx: &mut Ctx<'_>) -> Step {
    let (lb, svc) = ctx.lb()?;
    let nodes = ctx.nodes()?;
    let (first, rest) = nodes.split_at(1);
    ctx.ensure(first).await?;
    let cluster = ctx.cluster();
    for hosts in [rest, first] {
        let names: BTreeSet<String> = hosts.iter().map(name_of).collect();
        match ctx
            .call("update_load_balancer", || {
                lb.update_load_balancer(cluster, svc, hosts)
            })
            .await
        {
            Ok(()) => {}
            Err(CloudError::ImplementedElsewhere) => {
                return Err(not_offered(
                    "update_load_balancer answers ImplementedElsewhere for this Service",
                ));
            }
            Err(e) => {
                return Err(fail(
                    format!(
                        "update_load_balancer of {} to hosts {names:?} to succeed",
                        service_ref(svc)
                    ),
                    describe(&e),
                ));
            }
        }
        hosts_took_effect(ctx, svc, &names, "update_load_balancer").await?;
    }
    Ok(())
}

/// After a host update (`call`): the load balancer still exists and, with a probe, has exactly
/// `names` as hosts.
async fn hosts_took_effect(
    ctx: &Ctx<'_>,
    svc: &Service,
    names: &BTreeSet<String>,
    call: &str,
) -> Step {
    let key = service_ref(svc);
    if ctx.get_lb().await?.is_none() {
        return Err(fail(
            format!("get_load_balancer of {key} to still report it after {call}"),
            "None",
        ));
    }
    if let Some(observed) = probe_hosts(ctx, svc).await
        && observed.as_ref() != Some(names)
    {
        return Err(fail(
            format!("the load balancer of {key} to have the hosts {names:?} after {call}"),
            format!("the probe reports {observed:?}"),
        ));
    }
    Ok(())
}

pub(super) async fn delete_idempotent(ctx: &mut Ctx<'_>) -> Step {
    let hosts = ctx.nodes()?;
    delete_checked(ctx, "when no load balancer exists").await?;
    ctx.ensure(hosts).await?;
    delete_checked(ctx, "of an existing load balancer").await?;
    delete_checked(ctx, "a second time").await
}

pub(super) async fn delete_checked(ctx: &Ctx<'_>, when: &str) -> Step {
    let (lb, svc) = ctx.lb()?;
    let cluster = ctx.cluster();
    match ctx
        .call("ensure_load_balancer_deleted", || {
            lb.ensure_load_balancer_deleted(cluster, svc)
        })
        .await
    {
        Ok(()) => Ok(()),
        Err(CloudError::ImplementedElsewhere) => Err(fail(
            format!(
                "ensure_load_balancer_deleted of {} {when} never to answer ImplementedElsewhere",
                service_ref(svc)
            ),
            "ImplementedElsewhere",
        )),
        Err(e) => Err(fail(
            format!(
                "ensure_load_balancer_deleted of {} {when} to succeed",
                service_ref(svc)
            ),
            describe(&e),
        )),
    }
}

/// [`Check::LoadBalancerHostsBatchAgreesWithUpdate`](super::super::Check::LoadBalancerHostsBatchAgreesWithUpdate).
pub(super) async fn hosts_batch_agrees_with_update(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let class = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_deref());
    let batch = ctx
        .provider()
        .load_balancer_hosts_batch_for_class(class)
        .ok_or_else(|| not_offered("the provider offers no LoadBalancerHostsBatch"))?;
    if batch.max_batch_size() == 0 {
        return Err(fail(
            "max_batch_size() of LoadBalancerHostsBatch to be at least 1",
            "0",
        ));
    }
    let nodes = ctx.nodes()?;
    let (first, rest) = nodes.split_at(1);
    ctx.ensure(first).await?;
    let cluster = ctx.cluster();
    let key = service_ref(svc);
    let services = [Arc::new(svc.clone())];
    for hosts in [rest, first] {
        let names: BTreeSet<String> = hosts.iter().map(name_of).collect();
        let expected = format!("update_load_balancer_hosts of {key} to hosts {names:?} to succeed");
        // A per-Service Retry is repeated like a Retry of the whole call.
        let answers = ctx
            .call_ok("update_load_balancer_hosts", expected.clone(), || async {
                let answers = batch
                    .update_load_balancer_hosts(cluster, &services, hosts)
                    .await?;
                match answers.get(&key) {
                    Some(Err(CloudError::Retry { after, message })) => Err(CloudError::Retry {
                        after: *after,
                        message: message.clone(),
                    }),
                    _ => Ok(answers),
                }
            })
            .await?;
        match answers.get(&key) {
            Some(Ok(())) => {}
            Some(Err(CloudError::ImplementedElsewhere)) => {
                return Err(not_offered(
                    "update_load_balancer_hosts answers ImplementedElsewhere for this Service",
                ));
            }
            Some(Err(e)) => return Err(fail(expected, describe(e))),
            None => {
                return Err(fail(
                    format!(
                        "update_load_balancer_hosts to answer for {key}, whose load balancer exists (a Service left out of the answer costs a single update_load_balancer on every node sync)"
                    ),
                    format!("answers for {:?}", answers.keys().collect::<Vec<_>>()),
                ));
            }
        }
        hosts_took_effect(ctx, svc, &names, "update_load_balancer_hosts").await?;
    }
    Ok(())
}

/// [`Check::LoadBalancerClassesDeclared`](super::super::Check::LoadBalancerClassesDeclared).
pub(super) async fn classes_declared(ctx: &mut Ctx<'_>) -> Step {
    let provider = ctx.provider();
    let declared = provider.load_balancer_classes();
    let offers_any = provider.load_balancer().is_some()
        || declared
            .entries()
            .any(|c| provider.load_balancer_for_class(c).is_some());
    if !offers_any {
        return Err(not_offered("the provider offers no LoadBalancer"));
    }
    if declared.is_empty() {
        return Err(fail(
            "load_balancer_classes to declare a class or Services without a class (the service controller serves nothing otherwise)",
            "LoadBalancerClasses::none()",
        ));
    }
    for class in declared.classes() {
        if let Err(e) = ccm_core::check_load_balancer_class(class) {
            return Err(fail(
                "every declared load-balancer class to be a valid spec.loadBalancerClass",
                e.to_string(),
            ));
        }
    }
    for class in declared.entries() {
        if provider.load_balancer_for_class(class).is_none() {
            return Err(fail(
                format!(
                    "load_balancer_for_class({class:?}) to offer the implementation of a declared entry"
                ),
                "None",
            ));
        }
    }
    let svc = ctx.input_service()?;
    let hosts = ctx.nodes()?;
    let cluster = ctx.cluster();
    for class in declared.classes() {
        let Some(lb) = provider.load_balancer_for_class(Some(class)) else {
            continue;
        };
        let mut classed = svc.clone();
        classed.spec.get_or_insert_default().load_balancer_class = Some(class.to_owned());
        let classed = &classed;
        let what = format!("{} of class {class}", service_ref(classed));
        let ensured = ctx
            .call("ensure_load_balancer", || {
                lb.ensure_load_balancer(cluster, classed, hosts)
            })
            .await;
        let reported = ctx
            .call("get_load_balancer", || {
                lb.get_load_balancer(cluster, classed)
            })
            .await;
        ctx.call_ok(
            "ensure_load_balancer_deleted",
            format!("ensure_load_balancer_deleted of {what} to succeed"),
            || lb.ensure_load_balancer_deleted(cluster, classed),
        )
        .await?;
        match ensured {
            Ok(status) if has_ingress(&status) => {}
            Ok(status) => {
                return Err(fail(
                    format!("ensure_load_balancer of {what} to return an ingress"),
                    format!("{status:?}"),
                ));
            }
            Err(e) => {
                return Err(fail(
                    format!("ensure_load_balancer of {what} to succeed"),
                    describe(&e),
                ));
            }
        }
        if !matches!(reported, Ok(Some(_))) {
            return Err(fail(
                format!("get_load_balancer of {what} to report it after ensure_load_balancer"),
                format!("{reported:?}"),
            ));
        }
        let after = ctx
            .call("get_load_balancer", || {
                lb.get_load_balancer(cluster, classed)
            })
            .await;
        if !matches!(after, Ok(None)) {
            return Err(fail(
                format!(
                    "get_load_balancer of {what} to report none after ensure_load_balancer_deleted"
                ),
                format!("{after:?}"),
            ));
        }
    }
    Ok(())
}

pub(super) async fn ip_modes_valid(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let class = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_deref());
    let modes = ctx.provider().load_balancer_ip_modes(class);
    if !modes.allows(modes.default_mode()) {
        return Err(fail(
            format!("load_balancer_ip_modes({class:?}) to allow its own default mode"),
            format!("{modes:?}"),
        ));
    }
    let hosts = ctx.nodes()?;
    let status = ctx.ensure(hosts).await?;
    for (i, entry) in status.ingress.iter().flatten().enumerate() {
        let Some(mode) = entry.ip_mode.as_deref() else {
            continue;
        };
        let has_ip = entry.ip.as_deref().is_some_and(|ip| !ip.is_empty());
        let expected = match ccm_core::IpMode::parse(mode) {
            None => "an ipMode of VIP or Proxy (the API server rejects any other)",
            Some(_) if !has_ip => "no ipMode on an entry without an ip (the API server rejects it)",
            Some(m) if m != modes.default_mode() && !modes.allows(m) => {
                "an ipMode the class's load_balancer_ip_modes declares (its default or an allowed one)"
            }
            Some(_) => continue,
        };
        return Err(fail(
            format!(
                "ensure_load_balancer of {} to return, in ingress[{i}], {expected}",
                service_ref(svc)
            ),
            format!("{entry:?}; declared {modes:?}"),
        ));
    }
    Ok(())
}
