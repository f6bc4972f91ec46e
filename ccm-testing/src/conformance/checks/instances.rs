//! Conformance checks of `InstancesV2`, the legacy `Instances` and `Zones`.

use super::*;
use ccm_core::{ProviderId, Zones};

pub(super) async fn instance_metadata_stable(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let nodes = ctx.nodes()?;
    for node in nodes {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let first = ctx.metadata(v2, node).await?;
            for _ in 0..2 {
                let again = ctx.metadata(v2, node).await?;
                if again != first {
                    return Err(fail(
                        format!("the same instance_metadata on every call for node {name:?}"),
                        format!("it changed: {}", metadata_diff(&first, &again)),
                    ));
                }
            }
        } else if let Some(v1) = ctx.v1() {
            let mut answers = Vec::new();
            for _ in 0..3 {
                let to_succeed = |what: &str| format!("{what} of running node {name:?} to succeed");
                let addresses = ctx
                    .call_ok("node_addresses", to_succeed("node_addresses"), || {
                        v1.node_addresses(&name)
                    })
                    .await?;
                let instance_type = ctx
                    .call_ok("instance_type", to_succeed("instance_type"), || {
                        v1.instance_type(&name)
                    })
                    .await?;
                answers.push((addresses, instance_type));
            }
            if answers.windows(2).any(|w| w[0] != w[1]) {
                return Err(fail(
                    format!(
                        "the same node_addresses and instance_type on every call for node {name:?}"
                    ),
                    format!("{answers:?}"),
                ));
            }
        }
    }
    Ok(())
}

pub(super) async fn instance_labels_valid(ctx: &mut Ctx<'_>) -> Step {
    use crate::apiserver::validation::{label_value_errors, qualified_name_errors};
    let v2 = ctx.v2().ok_or_else(|| {
        not_offered("the provider offers no InstancesV2 (the legacy refresh reconciles no labels)")
    })?;
    for node in ctx.nodes()? {
        let name = name_of(node);
        let meta = ctx.metadata(v2, node).await?;
        let mut problems = Vec::new();
        for (what, value) in [
            ("zone", &meta.zone),
            ("region", &meta.region),
            ("instance type", &meta.instance_type),
        ] {
            problems.extend(
                label_value_errors(what, value)
                    .into_iter()
                    .map(|e| e.message),
            );
        }
        for (key, value) in &meta.additional_labels {
            let reserved = ["kubernetes.io/", "k8s.io/"].iter().any(|domain| {
                key.match_indices(domain)
                    .any(|(i, _)| i == 0 || key.as_bytes().get(i - 1) == Some(&b'.'))
            });
            if reserved {
                problems.push(format!(
                    "additional label {key:?}: in the kubernetes.io/k8s.io namespaces, which the framework never writes"
                ));
            }
            problems.extend(
                qualified_name_errors("additional label key", key)
                    .into_iter()
                    .chain(label_value_errors(
                        &format!("additional label {key:?}"),
                        value,
                    ))
                    .map(|e| e.message),
            );
        }
        if !problems.is_empty() {
            return Err(fail(
                format!("labels from instance_metadata of node {name:?} that a Node can carry"),
                problems.join("; "),
            ));
        }
    }
    Ok(())
}

pub(super) fn check_provider_id(schemes: &[String], pid: &str, node: &str, source: &str) -> Step {
    let parsed: ProviderId = pid.parse().map_err(|e| {
        fail(
            format!("a provider ID of the form <scheme>://<id> from {source} for node {node:?}"),
            format!("{pid:?}: {e}"),
        )
    })?;
    if !schemes.iter().any(|s| s == parsed.provider()) {
        return Err(fail(
            format!(
                "the provider ID from {source} for node {node:?} to have one of the schemes of provider_id_schemes() {schemes:?} (a Node of another scheme is another cloud's: the framework leaves it alone)"
            ),
            format!("{pid:?} (scheme {:?})", parsed.provider()),
        ));
    }
    Ok(())
}

/// The provider's declared provider-ID schemes, each a valid provider name, at least one.
fn declared_schemes(provider: &dyn ccm_core::CloudProvider) -> Result<Vec<String>, Stop> {
    let schemes: Vec<String> = provider
        .provider_id_schemes()
        .into_iter()
        .map(str::to_owned)
        .collect();
    if schemes.is_empty() {
        return Err(fail(
            "provider_id_schemes() to declare at least one scheme (the default is provider_name())",
            "an empty list: every Node with a provider ID would be another cloud's",
        ));
    }
    for scheme in &schemes {
        if let Err(e) = ProviderId::new(scheme.as_str(), "i") {
            return Err(fail(
                "every scheme of provider_id_schemes() to be a valid provider name",
                format!("{scheme:?}: {e}"),
            ));
        }
    }
    Ok(schemes)
}

pub(super) async fn provider_id_well_formed(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let provider_name = ctx.provider().provider_name().to_owned();
    let schemes = declared_schemes(ctx.provider())?;
    for node in ctx.nodes()? {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let meta = ctx.metadata(v2, node).await?;
            if meta.provider_id.is_empty() {
                if spec_provider_id(node).is_none() {
                    return Err(fail(
                        format!(
                            "a provider ID in instance_metadata for node {name:?}, which has no spec.providerID"
                        ),
                        "an empty provider_id",
                    ));
                }
            } else {
                check_provider_id(&schemes, &meta.provider_id, &name, "instance_metadata")?;
            }
        }
        if let Some(v1) = ctx.v1() {
            match ctx.call("instance_id", || v1.instance_id(&name)).await {
                Ok(id) => {
                    let pid = format!("{provider_name}://{id}");
                    check_provider_id(&schemes, &pid, &name, "instance_id")?;
                }
                // Go: NotImplemented leaves spec.providerID empty, allowed.
                Err(CloudError::NotImplemented) => {}
                Err(e) => {
                    return Err(fail(
                        format!("instance_id of running node {name:?} to succeed"),
                        describe(&e),
                    ));
                }
            }
        }
    }
    Ok(())
}

pub(super) async fn instance_exists_false_for_unknown(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let node = ctx
        .input()
        .missing_node
        .as_ref()
        .ok_or_else(|| skip("no missing node given (ConformanceInput::missing_node)"))?;
    let name = name_of(node);
    let mut checked = false;
    if let Some(v2) = ctx.v2() {
        checked = true;
        let expected = format!("instance_exists of the missing node {name:?} to be Ok(false)");
        let answer = ctx
            .call("instance_exists", || v2.instance_exists(node))
            .await;
        let exists = succeeded(
            answer,
            format!("{expected}, not an error (an error never lets the Node be deleted)"),
        )?;
        expect_value(exists, false, expected)?;
    }
    if let (Some(v1), Some(pid)) = (ctx.v1(), spec_provider_id(node)) {
        checked = true;
        let answer = ctx
            .call("instance_exists_by_provider_id", || {
                v1.instance_exists_by_provider_id(&pid)
            })
            .await;
        let exists = succeeded(
            answer,
            format!(
                "instance_exists_by_provider_id({pid:?}) of a missing instance to be Ok(false), not an error"
            ),
        )?;
        expect_value(
            exists,
            false,
            format!("instance_exists_by_provider_id({pid:?}) to be Ok(false)"),
        )?;
    }
    if checked {
        Ok(())
    } else {
        Err(skip(
            "the provider offers only the legacy Instances: give the missing node a spec.providerID",
        ))
    }
}

pub(super) async fn instance_exists_true_for_existing(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let mut nodes: Vec<(&NodeView, &str)> = ctx.nodes()?.iter().map(|n| (n, "running")).collect();
    if let Some(node) = ctx.input().shutdown_node.as_ref() {
        nodes.push((node, "shut-down"));
    }
    for (node, state) in nodes {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let expected = format!("instance_exists of the {state} node {name:?} to be Ok(true)");
            let answer = ctx
                .call("instance_exists", || v2.instance_exists(node))
                .await;
            let exists = succeeded(answer, expected.clone())?;
            expect_value(exists, true, format!("{expected} (false deletes the Node)"))?;
        }
        let pid = match ctx.v1() {
            Some(_) => ctx.provider_id_of(node).await,
            None => None,
        };
        if ctx.v1().is_some() && pid.is_none() {
            ctx.notes.push(format!(
                "no provider ID known for node {name:?}: instance_exists_by_provider_id not checked"
            ));
        }
        if let (Some(v1), Some(pid)) = (ctx.v1(), pid) {
            let answer = ctx
                .call("instance_exists_by_provider_id", || {
                    v1.instance_exists_by_provider_id(&pid)
                })
                .await;
            expect_answer(
                answer,
                true,
                format!(
                    "instance_exists_by_provider_id({pid:?}) of the {state} node {name:?} to be Ok(true)"
                ),
            )?;
        }
    }
    Ok(())
}

/// What a shutdown answer must be: `Some(true)` shut down, `Some(false)` not, `None` anything
/// but `Ok(true)`.
pub(super) fn check_shutdown(
    answer: CloudResult<bool>,
    want: Option<bool>,
    what: &str,
    notes: &mut Vec<String>,
) -> Step {
    match (answer, want) {
        (Ok(got), Some(want)) if got == want => Ok(()),
        (Ok(false), None) | (Err(_), None) => Ok(()),
        // Go reads NotImplemented as "not shut down".
        (Err(CloudError::NotImplemented), Some(false)) => Ok(()),
        (Err(CloudError::NotImplemented), Some(true)) => {
            notes.push(format!(
                "{what}: NotImplemented, so shut-down instances cannot be tainted"
            ));
            Ok(())
        }
        (Ok(true), None) => Err(fail(
            format!("{what} not to be Ok(true): a missing instance is not shut down"),
            "Ok(true)",
        )),
        (Ok(got), Some(want)) => Err(fail(
            format!("{what} to be Ok({want})"),
            format!("Ok({got})"),
        )),
        (Err(e), Some(want)) => Err(fail(format!("{what} to be Ok({want})"), describe(&e))),
    }
}

pub(super) async fn instance_shutdown_consistent(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let mut cases: Vec<(&NodeView, Option<bool>, &str)> = ctx
        .nodes()?
        .iter()
        .map(|n| (n, Some(false), "running"))
        .collect();
    if let Some(node) = ctx.input().shutdown_node.as_ref() {
        cases.push((node, Some(true), "shut-down"));
    }
    if let Some(node) = ctx.input().missing_node.as_ref() {
        cases.push((node, None, "missing"));
    }
    let mut notes = Vec::new();
    for (node, want, state) in cases {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let answer = ctx
                .call("instance_shutdown", || v2.instance_shutdown(node))
                .await;
            check_shutdown(
                answer,
                want,
                &format!("instance_shutdown of the {state} node {name:?}"),
                &mut notes,
            )?;
        }
        let pid = if want.is_none() {
            spec_provider_id(node)
        } else {
            ctx.provider_id_of(node).await
        };
        if let (Some(v1), Some(pid)) = (ctx.v1(), pid) {
            let answer = ctx
                .call("instance_shutdown_by_provider_id", || {
                    v1.instance_shutdown_by_provider_id(&pid)
                })
                .await;
            check_shutdown(
                answer,
                want,
                &format!("instance_shutdown_by_provider_id({pid:?}) of the {state} node {name:?}"),
                &mut notes,
            )?;
        }
    }
    ctx.notes.extend(notes);
    Ok(())
}

pub(super) async fn zones_non_empty(ctx: &mut Ctx<'_>) -> Step {
    let zones: &dyn Zones = ctx
        .provider()
        .zones()
        .ok_or_else(|| not_offered("the provider offers no Zones"))?;
    for node in ctx.nodes()? {
        let name = name_of(node);
        let by_pid = match ctx.provider_id_of(node).await {
            Some(pid) => Some(
                ctx.call("get_zone_by_provider_id", || {
                    zones.get_zone_by_provider_id(&pid)
                })
                .await,
            ),
            None => None,
        };
        let zone = match by_pid {
            Some(Ok(zone)) => zone,
            // The framework falls back to the lookup by name.
            _ => {
                ctx.call_ok(
                    "get_zone_by_node_name",
                    format!("a zone for the running node {name:?}"),
                    || zones.get_zone_by_node_name(&name),
                )
                .await?
            }
        };
        if zone.failure_domain.is_empty() || zone.region.is_empty() {
            return Err(fail(
                format!(
                    "a non-empty zone and region for node {name:?} from a provider offering Zones"
                ),
                format!("{zone:?}"),
            ));
        }
    }
    Ok(())
}

pub(super) async fn legacy_consistent(ctx: &mut Ctx<'_>) -> Step {
    let (Some(v1), Some(v2)) = (ctx.v1(), ctx.v2()) else {
        return Err(not_offered(
            "the provider does not offer both Instances (v1) and InstancesV2",
        ));
    };
    let provider_name = ctx.provider().provider_name().to_owned();
    let mismatch = |what: &str, name: &str, v1: String, v2: String| {
        fail(
            format!("{what} of node {name:?} to be the same from Instances (v1) and InstancesV2"),
            format!("v1: {v1}, v2: {v2}"),
        )
    };
    let on_legacy_path = |what: &str, name: &str| {
        format!("{what} of running node {name:?} to succeed on the legacy path")
    };
    for node in ctx.nodes()? {
        let name = name_of(node);
        let meta = ctx.metadata(v2, node).await?;
        match ctx.call("instance_id", || v1.instance_id(&name)).await {
            Ok(id) => {
                let pid = format!("{provider_name}://{id}");
                if !meta.provider_id.is_empty() && pid != meta.provider_id {
                    return Err(mismatch("the provider ID", &name, pid, meta.provider_id));
                }
            }
            Err(CloudError::NotImplemented) => {}
            Err(e) => {
                return Err(fail(on_legacy_path("instance_id", &name), describe(&e)));
            }
        }
        let pid = if meta.provider_id.is_empty() {
            spec_provider_id(node).unwrap_or_default()
        } else {
            meta.provider_id.clone()
        };
        let instance_type = ctx
            .call_ok(
                "instance_type_by_provider_id",
                on_legacy_path("instance_type_by_provider_id", &name),
                || v1.instance_type_by_provider_id(&pid),
            )
            .await?;
        if instance_type != meta.instance_type {
            return Err(mismatch(
                "the instance type",
                &name,
                instance_type,
                meta.instance_type,
            ));
        }
        let addresses = ctx
            .call_ok(
                "node_addresses_by_provider_id",
                on_legacy_path("node_addresses_by_provider_id", &name),
                || v1.node_addresses_by_provider_id(&pid),
            )
            .await?;
        if address_set(&addresses) != address_set(&meta.node_addresses) {
            return Err(mismatch(
                "the addresses",
                &name,
                format!("{addresses:?}"),
                format!("{:?}", meta.node_addresses),
            ));
        }
        let exists_v1 = ctx
            .call_ok(
                "instance_exists_by_provider_id",
                on_legacy_path("instance_exists_by_provider_id", &name),
                || v1.instance_exists_by_provider_id(&pid),
            )
            .await?;
        let exists_v2 = ctx
            .call_ok(
                "instance_exists",
                on_legacy_path("instance_exists (v2)", &name),
                || v2.instance_exists(node),
            )
            .await?;
        if exists_v1 != exists_v2 {
            return Err(mismatch(
                "existence",
                &name,
                exists_v1.to_string(),
                exists_v2.to_string(),
            ));
        }
        let answer = ctx
            .call("instance_shutdown_by_provider_id", || {
                v1.instance_shutdown_by_provider_id(&pid)
            })
            .await;
        let shut_v1 = succeeded(
            tolerate(answer, CloudError::is_not_implemented, false),
            on_legacy_path("instance_shutdown_by_provider_id", &name),
        )?;
        let answer = ctx
            .call("instance_shutdown", || v2.instance_shutdown(node))
            .await;
        let shut_v2 = succeeded(
            tolerate(answer, CloudError::is_not_implemented, false),
            on_legacy_path("instance_shutdown (v2)", &name),
        )?;
        if shut_v1 != shut_v2 {
            return Err(mismatch(
                "the shutdown state",
                &name,
                shut_v1.to_string(),
                shut_v2.to_string(),
            ));
        }
        if let Some(zones) = ctx.provider().zones()
            && !meta.zone.is_empty()
        {
            let zone = ctx
                .call_ok(
                    "get_zone_by_provider_id",
                    on_legacy_path("get_zone_by_provider_id", &name),
                    || zones.get_zone_by_provider_id(&pid),
                )
                .await?;
            if zone.failure_domain != meta.zone || zone.region != meta.region {
                return Err(mismatch(
                    "the zone and region",
                    &name,
                    format!("{}/{}", zone.failure_domain, zone.region),
                    format!("{}/{}", meta.zone, meta.region),
                ));
            }
        }
    }
    Ok(())
}

pub(super) async fn legacy_instance_id_not_found(ctx: &mut Ctx<'_>) -> Step {
    let v1 = ctx
        .v1()
        .ok_or_else(|| not_offered("the provider offers no Instances (v1)"))?;
    let node = ctx
        .input()
        .missing_node
        .as_ref()
        .ok_or_else(|| skip("no missing node given (ConformanceInput::missing_node)"))?;
    let name = name_of(node);
    match ctx.call("instance_id", || v1.instance_id(&name)).await {
        Err(CloudError::InstanceNotFound) => Ok(()),
        Err(CloudError::NotImplemented) => Err(not_offered("instance_id answers NotImplemented")),
        Ok(id) => Err(fail(
            format!("instance_id of the missing node {name:?} to be InstanceNotFound"),
            format!("Ok({id:?})"),
        )),
        Err(e) => Err(fail(
            format!("instance_id of the missing node {name:?} to be InstanceNotFound"),
            describe(&e),
        )),
    }
}
