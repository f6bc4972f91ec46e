//! The conformance suite's batch checks: FakeCloud with `InstancesBatch` passes them; a batch
//! that breaks the contract (calls a running Node gone, maps answers by position, declares a
//! size of 0) fails the check for that contract; a batch that leaves Nodes out passes, noted.

use std::sync::Arc;

use ccm_core::{
    CloudProvider, CloudResult, InstanceAnswer, InstanceAnswers, InstancesBatch, InstancesV2, Node,
    NodeView, ObjectMeta, async_trait,
};
use ccm_testing::conformance::{Check, CheckResult, ConformanceInput, Suite};
use ccm_testing::fake_cloud::FakeCloud;

const BATCH_CHECKS: [Check; 3] = [
    Check::BatchAgreesWithSingleCalls,
    Check::BatchSameAnswerWhateverTheGrouping,
    Check::BatchMaxSizeHonoured,
];

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn input() -> ConformanceInput {
    ConformanceInput::new("batch", vec![node("w-1"), node("w-2"), node("w-3")])
        .missing_node(node("gone-1"))
        .shutdown_node(node("stopped-1"))
}

fn fake() -> FakeCloud {
    FakeCloud::builder()
        .instances_batch(true)
        .missing_node("gone-.*")
        .shutdown_node("stopped-.*")
        .build()
}

async fn run(provider: Arc<dyn CloudProvider>, check: Check) -> CheckResult {
    Suite::new(provider, input()).run_check(check).await
}

/// How a broken batch breaks the contract.
#[derive(Clone, Copy)]
enum Breakage {
    /// Answers `NotFound` for `w-2`, which is running.
    RunningNodeGone,
    /// Maps the replies back to the Nodes in reverse order.
    ByPosition,
    /// Declares `max_batch_size` 0.
    ZeroSize,
    /// Leaves `w-1` out (allowed: unknown).
    LeavesOut,
}

/// FakeCloud with its batch broken one way.
struct Broken {
    cloud: FakeCloud,
    breakage: Breakage,
}

#[async_trait]
impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.cloud.instances_v2()
    }
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        Some(self)
    }
}

#[async_trait]
impl InstancesBatch for Broken {
    fn max_batch_size(&self) -> usize {
        match self.breakage {
            Breakage::ZeroSize => 0,
            _ => 100,
        }
    }
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        let batch = self.cloud.instances_batch().unwrap();
        let mut answers = batch.describe_instances(nodes).await?;
        match self.breakage {
            Breakage::RunningNodeGone => {
                if answers.contains_key("w-2") {
                    answers.insert("w-2".into(), InstanceAnswer::NotFound);
                }
            }
            Breakage::ByPosition => {
                // Sorted replies zipped with the request order: right only when the request
                // happens to be sorted.
                let names: Vec<String> = nodes.iter().map(|n| n.name().to_owned()).collect();
                answers = names.into_iter().zip(answers.into_values()).collect();
            }
            Breakage::LeavesOut => {
                answers.remove("w-1");
            }
            Breakage::ZeroSize => {}
        }
        Ok(answers)
    }
}

fn broken(breakage: Breakage) -> Arc<dyn CloudProvider> {
    Arc::new(Broken {
        cloud: fake(),
        breakage,
    })
}

#[tokio::test]
async fn fake_cloud_with_batches_passes_every_batch_check() {
    for check in BATCH_CHECKS {
        let result = run(fake().provider(), check).await;
        assert!(result.outcome.is_passed(), "{result}");
        assert!(result.notes.is_empty(), "{result}");
    }
}

#[tokio::test]
async fn batch_checks_are_skipped_without_the_capability() {
    let plain = FakeCloud::builder().build();
    for check in BATCH_CHECKS {
        let result = run(plain.provider(), check).await;
        assert!(result.outcome.is_skipped(), "{result}");
        assert!(result.to_string().contains("no InstancesBatch"), "{result}");
    }
}

#[tokio::test]
async fn a_batch_calling_a_running_node_gone_fails_agreement() {
    let result = run(
        broken(Breakage::RunningNodeGone),
        Check::BatchAgreesWithSingleCalls,
    )
    .await;
    assert!(result.outcome.is_failed(), "{result}");
    let text = result.to_string();
    assert!(
        text.contains("\"w-2\"") && text.contains("observed: NotFound"),
        "{text}"
    );
}

#[tokio::test]
async fn a_batch_mapping_replies_by_position_fails() {
    let provider = broken(Breakage::ByPosition);
    let agreement = run(provider.clone(), Check::BatchAgreesWithSingleCalls).await;
    assert!(agreement.outcome.is_failed(), "{agreement}");
    let grouping = run(provider, Check::BatchSameAnswerWhateverTheGrouping).await;
    assert!(grouping.outcome.is_failed(), "{grouping}");
    assert!(
        grouping.to_string().contains("however it is grouped"),
        "{grouping}"
    );
}

#[tokio::test]
async fn a_zero_batch_size_fails() {
    let result = run(broken(Breakage::ZeroSize), Check::BatchMaxSizeHonoured).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("at least 1"), "{result}");
}

#[tokio::test]
async fn a_node_left_out_is_unknown_not_a_failure() {
    let result = run(
        broken(Breakage::LeavesOut),
        Check::BatchAgreesWithSingleCalls,
    )
    .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert!(
        result
            .notes
            .iter()
            .any(|n| n.contains("w-1: no entry (unknown)")),
        "{result}"
    );
}
