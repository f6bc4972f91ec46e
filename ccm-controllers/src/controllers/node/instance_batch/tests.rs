//! [`describe_all`]'s pacing: calls spread evenly over the period given, or all at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::{
    CloudProvider, CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata, InstancesBatch,
    InstancesV2, Node,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::describe_all;

/// Answers every Node `Found`, 2 Nodes per call, recording when each call started.
struct Recording {
    started: Mutex<Vec<Instant>>,
}

impl CloudProvider for Recording {
    fn provider_name(&self) -> &str {
        "recording"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Recording {
    async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &Node) -> CloudResult<InstanceMetadata> {
        Ok(InstanceMetadata::default())
    }
}

#[async_trait]
impl InstancesBatch for Recording {
    fn max_batch_size(&self) -> usize {
        2
    }
    async fn describe_instances(&self, nodes: &[Arc<Node>]) -> CloudResult<InstanceAnswers> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        Ok(nodes
            .iter()
            .map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                (name, InstanceAnswer::Found(InstanceMetadata::default()))
            })
            .collect())
    }
}

fn nodes(n: usize) -> Vec<Arc<Node>> {
    (0..n)
        .map(|i| {
            let mut node = Node::default();
            node.metadata.name = Some(format!("n{i}"));
            Arc::new(node)
        })
        .collect()
}

/// The offset of each call's start from `origin`, sorted.
async fn run(spread: Duration) -> (Vec<Duration>, usize) {
    let cloud = Recording {
        started: Mutex::new(Vec::new()),
    };
    let origin = Instant::now();
    let answers = describe_all(&cloud, nodes(10), 0, spread, &CancellationToken::new())
        .await
        .unwrap_or_default();
    let mut offsets: Vec<Duration> = cloud
        .started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|t| *t - origin)
        .collect();
    offsets.sort();
    (offsets, answers.len())
}

#[tokio::test(start_paused = true)]
async fn calls_start_evenly_over_the_spread() {
    // 10 Nodes, 2 per call: 5 calls over 10 s start at 0, 2, 4, 6 and 8 s.
    let (offsets, answered) = run(Duration::from_secs(10)).await;
    assert_eq!(answered, 10);
    let secs: Vec<u64> = offsets.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [0, 2, 4, 6, 8]);
}

#[tokio::test(start_paused = true)]
async fn without_a_spread_the_calls_go_out_at_once() {
    let (offsets, answered) = run(Duration::ZERO).await;
    assert_eq!(answered, 10);
    assert_eq!(offsets, [Duration::ZERO; 5]);
}
