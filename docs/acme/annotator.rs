use std::sync::Arc;

use ccm_controllers::{Backoff, Change, ControllerContext, ControllerError, Outcome};
use ccm_core::{CloudError, Node};
use kube::api::{Api, Patch, PatchParams};

/// The annotation this controller maintains.
pub const ANNOTATION_INSTANCE_TYPE: &str = "acme.example.com/instance-type";

/// Pure planning: the merge patch that brings the Node's annotation to `instance_type`, or
/// `None` when it is already there.
pub fn plan(node: &Node, instance_type: &str) -> Option<serde_json::Value> {
    let annotations = node.metadata.annotations.as_ref();
    let current = annotations.and_then(|a| a.get(ANNOTATION_INSTANCE_TYPE));
    (current.map(String::as_str) != Some(instance_type)).then(|| {
        serde_json::json!({"metadata": {"annotations": {ANNOTATION_INSTANCE_TYPE: instance_type}}})
    })
}

/// Annotates every initialised Node with its instance type, as the cloud reports it.
pub async fn run_annotator(ctx: ControllerContext) -> Result<(), ControllerError> {
    if ctx.cloud.instances_v2().is_none() {
        // Logged and skipped by the runtime, like a built-in controller.
        return Err(ControllerError::MissingCapability {
            controller: "acme-annotator",
            capability: "instances_v2",
        });
    }
    // Waits for the first list; then every Node in the store arrives once as `Applied`,
    // followed by every change.
    let Some(mut changes) = ctx.nodes.subscribe().await else {
        return Err(ControllerError::NotSynced("acme-annotator"));
    };
    let queue = ctx.queue::<String>("acme-annotator", Backoff::CONTROLLER);

    // Informer changes -> queue.
    let feeder = {
        let (queue, nodes, shutdown) = (queue.clone(), ctx.nodes.clone(), ctx.shutdown.clone());
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = shutdown.cancelled() => break,
                    change = changes.recv() => change,
                };
                match change {
                    Some(Change::Applied { new, .. }) => {
                        queue.add(new.metadata.name.clone().unwrap_or_default());
                    }
                    Some(Change::Resync) => {
                        for node in nodes.list() {
                            queue.add(node.metadata.name.clone().unwrap_or_default());
                        }
                    }
                    Some(Change::Deleted(_)) => {}
                    None => break,
                }
            }
        })
    };

    // Queue -> cloud call -> pure plan -> patch of our annotation only.
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    let cloud = Arc::clone(&ctx.cloud);
    let store = ctx.nodes.clone();
    queue
        .run_workers(4, ctx.shutdown.clone(), move |name: String| {
            let (nodes_api, cloud, store) = (nodes_api.clone(), cloud.clone(), store.clone());
            async move {
                let Some(node) = store.get(&name) else {
                    return Outcome::Done; // deleted meanwhile
                };
                let has_provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_ref());
                if has_provider_id.is_none() {
                    return Outcome::Done; // not initialised yet; its update will requeue it
                }
                let Some(instances) = cloud.instances_v2() else {
                    return Outcome::Done;
                };
                let metadata = match instances.instance_metadata(&ccm_core::NodeView::from_node(&node)).await {
                    Ok(metadata) => metadata,
                    Err(CloudError::Retry { after, .. }) => return Outcome::RequeueAfter(after),
                    Err(e) => {
                        tracing::warn!(node = %name, "instance_metadata failed: {e}");
                        return Outcome::Failed; // exponential backoff
                    }
                };
                let Some(patch) = plan(&node, &metadata.instance_type) else {
                    return Outcome::Done;
                };
                match nodes_api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => Outcome::Done,
                    Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Done,
                    Err(e) => {
                        tracing::warn!(node = %name, "patching the annotation failed: {e}");
                        Outcome::Failed
                    }
                }
            }
        })
        .await;
    feeder.abort();
    Ok(())
}
