//! The checks of the optional [`InstancesBatch`] capability: its answers must be the answers
//! of the single `InstancesV2` calls, whatever the grouping, within the declared batch size.
//!
//! A child module of `checks` (declared there), so it shares the suite's call helpers.

use std::collections::BTreeMap;

use ccm_core::{InstanceAnswer, InstanceAnswers, InstancesBatch, InstancesV2, NodeView};

use super::{Ctx, Step, Stop, describe, fail, metadata_diff, name_of, not_offered};

/// What the single calls say about one Node.
struct Single {
    exists: bool,
    shutdown: bool,
}

impl<'a> Ctx<'a> {
    /// The batch and single capabilities, or a skip.
    fn batch(&self) -> Result<(&'a dyn InstancesBatch, &'a dyn InstancesV2), Stop> {
        let batch = self
            .provider()
            .instances_batch()
            .ok_or_else(|| not_offered("the provider offers no InstancesBatch"))?;
        let v2 = self.v2().ok_or_else(|| {
            not_offered(
                "the provider offers InstancesBatch without InstancesV2 (the framework ignores it)",
            )
        })?;
        Ok((batch, v2))
    }

    /// Every Node the input names: the running ones, the missing one, the shut-down one.
    fn all_nodes(&self) -> Result<Vec<NodeView>, Stop> {
        let input = self.input();
        let mut nodes = self.nodes()?.to_vec();
        nodes.extend(input.missing_node.iter().cloned());
        nodes.extend(input.shutdown_node.iter().cloned());
        Ok(nodes)
    }

    /// One `describe_instances` call (repeated after a Retry, like every suite call).
    async fn describe(
        &self,
        batch: &dyn InstancesBatch,
        nodes: &[NodeView],
    ) -> Result<InstanceAnswers, Stop> {
        let expected = format!("describe_instances of {} nodes to succeed", nodes.len());
        self.call_ok("describe_instances", expected, || {
            batch.describe_instances(nodes)
        })
        .await
    }

    /// `describe_instances` in batches of at most `max_batch_size`, merged.
    async fn describe_all(
        &self,
        batch: &dyn InstancesBatch,
        nodes: &[NodeView],
    ) -> Result<InstanceAnswers, Stop> {
        let mut all = InstanceAnswers::new();
        for chunk in nodes.chunks(batch.max_batch_size().max(1)) {
            all.extend(self.describe(batch, chunk).await?);
        }
        Ok(all)
    }

    /// `instance_exists` and `instance_shutdown` of one Node (`NotImplemented` = not shut
    /// down), or `None` when a single call fails (the Node is then not compared).
    async fn single(&self, v2: &dyn InstancesV2, node: &NodeView) -> Option<Single> {
        let exists = self
            .call("instance_exists", || v2.instance_exists(node))
            .await
            .ok()?;
        let shutdown = match self
            .call("instance_shutdown", || v2.instance_shutdown(node))
            .await
        {
            Ok(shutdown) => shutdown,
            Err(e) if e.is_not_implemented() => false,
            Err(_) => return None,
        };
        Some(Single { exists, shutdown })
    }
}

/// What an answer says, for the report.
fn show(answer: Option<&InstanceAnswer>) -> String {
    match answer {
        None => "no entry (unknown)".into(),
        Some(InstanceAnswer::Found(m)) => format!("Found (provider ID {:?})", m.provider_id),
        Some(InstanceAnswer::Shutdown(m)) => {
            format!("Shutdown (provider ID {:?})", m.provider_id)
        }
        Some(InstanceAnswer::NotFound) => "NotFound".into(),
        Some(InstanceAnswer::Error(e)) => format!("Error: {}", describe(e)),
    }
}

/// [`Check::BatchAgreesWithSingleCalls`](super::super::Check::BatchAgreesWithSingleCalls).
pub(super) async fn agrees_with_single_calls(ctx: &mut Ctx<'_>) -> Step {
    let (batch, v2) = ctx.batch()?;
    let nodes = ctx.all_nodes()?;
    let answers = ctx.describe_all(batch, &nodes).await?;
    let mut unknown = Vec::new();
    for node in &nodes {
        let name = name_of(node);
        let answer = answers.get(&name);
        let Some(answer) = answer.filter(|a| a.exists().is_some()) else {
            // Missing or Error: unknown, which the contract allows (the framework asks again).
            unknown.push(format!("{name}: {}", show(answer)));
            continue;
        };
        let Some(single) = ctx.single(v2, node).await else {
            ctx.notes.push(format!(
                "node {name:?}: a single call failed, batch answer not compared"
            ));
            continue;
        };
        let expected = match (single.exists, single.shutdown) {
            (false, _) => "NotFound (instance_exists answered false)",
            (true, true) => "Shutdown (instance_exists true, instance_shutdown true)",
            (true, false) => "Found (instance_exists true, instance_shutdown false)",
        };
        let agrees = answer.exists() == Some(single.exists)
            && (!single.exists || answer.is_shutdown() == Some(single.shutdown));
        if !agrees {
            return Err(fail(
                format!("for node {name:?} the batch answer {expected}"),
                show(Some(answer)),
            ));
        }
        if let Some(batch_meta) = answer.metadata() {
            let meta = ctx.metadata(v2, node).await?;
            if batch_meta != &meta {
                return Err(fail(
                    format!("for node {name:?} the metadata instance_metadata answers"),
                    format!(
                        "the batch's differs (single -> batch): {}",
                        metadata_diff(&meta, batch_meta)
                    ),
                ));
            }
        }
    }
    // The input says what each Node is: a batch must never call a running Node gone.
    let input = ctx.input();
    let expect = |node: &NodeView, allowed: &[&str], why: &str| -> Step {
        let name = name_of(node);
        let answer = answers.get(&name);
        let kind = match answer {
            None | Some(InstanceAnswer::Error(_)) => return Ok(()),
            Some(InstanceAnswer::Found(_)) => "Found",
            Some(InstanceAnswer::Shutdown(_)) => "Shutdown",
            Some(InstanceAnswer::NotFound) => "NotFound",
        };
        if allowed.contains(&kind) {
            Ok(())
        } else {
            Err(fail(
                format!("{} for {why} {name:?}", allowed.join(" or ")),
                show(answer),
            ))
        }
    };
    for node in ctx.nodes()? {
        expect(node, &["Found"], "running node")?;
    }
    if let Some(node) = &input.missing_node {
        expect(node, &["NotFound"], "missing node")?;
    }
    if let Some(node) = &input.shutdown_node {
        expect(node, &["Shutdown", "Found"], "shut-down node")?;
    }
    let requested: Vec<String> = nodes.iter().map(name_of).collect();
    let extra: Vec<&String> = answers.keys().filter(|k| !requested.contains(k)).collect();
    if !extra.is_empty() {
        ctx.notes.push(format!(
            "answers for nodes not asked about (ignored by the framework): {extra:?}"
        ));
    }
    if !unknown.is_empty() {
        ctx.notes.push(format!(
            "left unknown by the batch (allowed; asked again by the framework): {}",
            unknown.join("; ")
        ));
    }
    Ok(())
}

/// [`Check::BatchSameAnswerWhateverTheGrouping`](super::super::Check::BatchSameAnswerWhateverTheGrouping).
pub(super) async fn same_answer_whatever_the_grouping(ctx: &mut Ctx<'_>) -> Step {
    let (batch, _) = ctx.batch()?;
    let nodes = ctx.all_nodes()?;
    let together = ctx.describe_all(batch, &nodes).await?;
    let mut reversed_nodes = nodes.clone();
    reversed_nodes.reverse();
    let reversed = ctx.describe_all(batch, &reversed_nodes).await?;
    let mut alone = InstanceAnswers::new();
    for node in &nodes {
        alone.extend(ctx.describe(batch, std::slice::from_ref(node)).await?);
    }
    let summary = |answers: &InstanceAnswers, name: &str| -> Option<String> {
        // Unknown answers may differ between calls (a transient error); known ones may not.
        answers
            .get(name)
            .filter(|a| a.exists().is_some())
            .map(|a| format!("{} {:?}", show(Some(a)), a.metadata()))
    };
    for node in &nodes {
        let name = name_of(node);
        let answers: BTreeMap<&str, Option<String>> = [
            ("all nodes in one batch", summary(&together, &name)),
            ("the same nodes in reverse order", summary(&reversed, &name)),
            ("the node alone", summary(&alone, &name)),
        ]
        .into();
        let known: Vec<(&&str, &String)> = answers
            .iter()
            .filter_map(|(how, a)| a.as_ref().map(|a| (how, a)))
            .collect();
        if let Some((first_how, first)) = known.first()
            && let Some((how, other)) = known.iter().find(|(_, a)| a != first)
        {
            return Err(fail(
                format!("the same answer for node {name:?} however it is grouped"),
                format!("{first_how}: {first}; {how}: {other}"),
            ));
        }
    }
    Ok(())
}

/// [`Check::BatchMaxSizeHonoured`](super::super::Check::BatchMaxSizeHonoured).
pub(super) async fn max_size_honoured(ctx: &mut Ctx<'_>) -> Step {
    let (batch, _) = ctx.batch()?;
    let max = batch.max_batch_size();
    if max == 0 {
        return Err(fail(
            "max_batch_size() of at least 1",
            "0 (the framework would send one Node per call)",
        ));
    }
    let nodes = ctx.all_nodes()?;
    // The largest batch the input allows, up to the declared maximum: every Node gets an entry
    // or is left out, and no call fails for its size.
    let full: Vec<NodeView> = nodes.iter().take(max).cloned().collect();
    let answers = ctx.describe(batch, &full).await?;
    if answers.is_empty() {
        ctx.notes.push(format!(
            "a batch of {} nodes answered nothing (every node unknown)",
            full.len()
        ));
    }
    Ok(())
}
