//! The pure part of batched instance lookups: grouping Nodes into `describe_instances` calls,
//! reading one call's answer per Node, and what each controller makes of it.
//!
//! The rules of the [`InstancesBatch`](ccm_core::InstancesBatch) contract live here:
//! - a Node without an entry in the answer is **unknown** ([`Lookup::Missing`]), never gone;
//! - an error of the whole call says nothing about any Node ([`Lookup::CallFailed`], the same
//!   error for every Node of the call, so a `Retry` delays all of them);
//! - `NotImplemented` from the whole call means "use single calls" ([`Lookup::Unsupported`]).

use std::collections::HashSet;

use ccm_core::{
    CloudError, CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata, NodeView,
};

/// What one batch call said about one Node.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// The provider's answer for this Node.
    Answer(InstanceAnswer),
    /// The Node had no entry in the answer: unknown (as an `Error` answer), never gone.
    Missing,
    /// The whole call failed (this is its error): nothing is known about the Node.
    CallFailed(CloudError),
    /// The provider does not batch (no capability, or the call answered `NotImplemented`):
    /// ask with a single call.
    Unsupported,
}

fn node_name(node: &NodeView) -> &str {
    node.name()
}

/// Splits `nodes` into calls of at most `max` Nodes (at least 1), in order, each Node name
/// once (the contract: never the same Node twice; the first copy is kept).
pub(crate) fn group(nodes: Vec<NodeView>, max: usize) -> Vec<Vec<NodeView>> {
    let max = max.max(1);
    let mut seen = HashSet::new();
    let mut calls: Vec<Vec<NodeView>> = Vec::new();
    for node in nodes {
        if !seen.insert(node_name(&node).to_owned()) {
            continue;
        }
        match calls.last_mut() {
            Some(call) if call.len() < max => call.push(node),
            _ => calls.push(vec![node]),
        }
    }
    calls
}

/// An equal copy of a cloud error (`CloudError` is not `Clone`: its `Other` variant holds any
/// error, copied here as its message chain).
pub(crate) fn copy_error(error: &CloudError) -> CloudError {
    match error {
        CloudError::Retry { after, message } => CloudError::Retry {
            after: *after,
            message: message.clone(),
        },
        CloudError::InstanceNotFound => CloudError::InstanceNotFound,
        CloudError::NotImplemented => CloudError::NotImplemented,
        CloudError::ImplementedElsewhere => CloudError::ImplementedElsewhere,
        other => CloudError::msg(other.to_string()),
    }
}

/// An equal copy of a lookup (for a Node asked twice within one window).
pub(crate) fn copy_lookup(lookup: &Lookup) -> Lookup {
    match lookup {
        Lookup::Answer(InstanceAnswer::Found(m)) => {
            Lookup::Answer(InstanceAnswer::Found(m.clone()))
        }
        Lookup::Answer(InstanceAnswer::Shutdown(m)) => {
            Lookup::Answer(InstanceAnswer::Shutdown(m.clone()))
        }
        Lookup::Answer(InstanceAnswer::NotFound) => Lookup::Answer(InstanceAnswer::NotFound),
        Lookup::Answer(InstanceAnswer::Error(e)) => {
            Lookup::Answer(InstanceAnswer::Error(copy_error(e)))
        }
        Lookup::Missing => Lookup::Missing,
        Lookup::CallFailed(e) => Lookup::CallFailed(copy_error(e)),
        Lookup::Unsupported => Lookup::Unsupported,
    }
}

/// One call's result read per requested Node, in the order of `names`. Entries for names that
/// were not requested are ignored.
pub(crate) fn distribute(
    names: &[String],
    result: CloudResult<InstanceAnswers>,
) -> Vec<(String, Lookup)> {
    match result {
        Ok(mut answers) => names
            .iter()
            .map(|name| {
                let lookup = answers.remove(name).map_or(Lookup::Missing, Lookup::Answer);
                (name.clone(), lookup)
            })
            .collect(),
        Err(CloudError::NotImplemented) => names
            .iter()
            .map(|name| (name.clone(), Lookup::Unsupported))
            .collect(),
        Err(error) => names
            .iter()
            .map(|name| (name.clone(), Lookup::CallFailed(copy_error(&error))))
            .collect(),
    }
}

/// What the cloud-node controller (initialisation and address refresh) makes of a lookup.
#[derive(Debug)]
pub(crate) enum MetadataLookup {
    /// The instance's metadata (`Found` or `Shutdown`), as `instance_metadata` answers it.
    Metadata(InstanceMetadata),
    /// The error `instance_metadata` would have returned: `NotFound` becomes
    /// `InstanceNotFound` (its not-found path), an `Error` answer or a failed call its error.
    Failed(CloudError),
    /// Unknown from the batch (missing from the answer) or no batching: one
    /// `instance_metadata` call for this Node.
    AskSingle,
}

/// The cloud-node controller's reading of a lookup.
pub(crate) fn metadata_lookup(lookup: Lookup) -> MetadataLookup {
    match lookup {
        Lookup::Answer(InstanceAnswer::Found(m) | InstanceAnswer::Shutdown(m)) => {
            MetadataLookup::Metadata(m)
        }
        Lookup::Answer(InstanceAnswer::NotFound) => {
            MetadataLookup::Failed(CloudError::InstanceNotFound)
        }
        Lookup::Answer(InstanceAnswer::Error(e)) | Lookup::CallFailed(e) => {
            MetadataLookup::Failed(e)
        }
        Lookup::Missing | Lookup::Unsupported => MetadataLookup::AskSingle,
    }
}

/// The node-lifecycle controller's reading of a lookup: the answers of `instance_exists` and
/// `instance_shutdown`, or `None` to ask them with single calls (no batching). A Node missing
/// from the answer, an `Error` answer and a failed call are errors for both questions: the
/// Node is skipped for this pass (never deleted, never tainted) and asked again in the next.
pub(crate) fn lifecycle_lookup(
    lookup: Lookup,
) -> Option<(Result<bool, CloudError>, Result<bool, CloudError>)> {
    match lookup {
        Lookup::Answer(InstanceAnswer::Found(_)) => Some((Ok(true), Ok(false))),
        Lookup::Answer(InstanceAnswer::Shutdown(_)) => Some((Ok(true), Ok(true))),
        Lookup::Answer(InstanceAnswer::NotFound) => Some((Ok(false), Ok(false))),
        Lookup::Answer(InstanceAnswer::Error(e)) | Lookup::CallFailed(e) => {
            let copy = copy_error(&e);
            Some((Err(e), Err(copy)))
        }
        Lookup::Missing => Some((
            Err(CloudError::msg("the node is missing from the batch answer")),
            Err(CloudError::msg("the node is missing from the batch answer")),
        )),
        Lookup::Unsupported => None,
    }
}

#[cfg(test)]
mod tests {
    use ccm_core::Node;
    use std::time::Duration;

    use super::*;

    fn node(name: &str) -> NodeView {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        NodeView::from(n)
    }

    fn names(calls: &[Vec<NodeView>]) -> Vec<Vec<String>> {
        calls
            .iter()
            .map(|c| c.iter().map(|n| node_name(n).to_owned()).collect())
            .collect()
    }

    fn meta(id: &str) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn group_splits_by_max_keeps_order_and_drops_duplicates() {
        let nodes = ["a", "b", "a", "c", "d", "e"].map(node).to_vec();
        assert_eq!(
            names(&group(nodes, 2)),
            vec![vec!["a", "b"], vec!["c", "d"], vec!["e"]]
        );
        // ceil(N / max) calls.
        let many: Vec<_> = (0..250).map(|i| node(&format!("n{i}"))).collect();
        assert_eq!(group(many, 100).len(), 3);
        // A zero maximum is taken as 1; nothing to ask, no call.
        assert_eq!(group(vec![node("a"), node("b")], 0).len(), 2);
        assert!(group(Vec::new(), 10).is_empty());
    }

    #[test]
    fn missing_node_is_unknown_never_gone() {
        let requested = vec!["a".to_owned(), "b".to_owned()];
        let mut answers = InstanceAnswers::new();
        answers.insert("a".into(), InstanceAnswer::NotFound);
        answers.insert("stranger".into(), InstanceAnswer::NotFound);
        let got = distribute(&requested, Ok(answers));
        assert_eq!(got.len(), 2, "entries not requested are ignored");
        assert!(matches!(got[0], (ref n, Lookup::Answer(InstanceAnswer::NotFound)) if n == "a"));
        assert!(matches!(got[1], (ref n, Lookup::Missing) if n == "b"));
        // Lifecycle: missing is an error for both questions (skipped, never deleted).
        let (exists, shutdown) = lifecycle_lookup(Lookup::Missing).unwrap();
        assert!(exists.is_err() && shutdown.is_err());
        // Cloud-node: missing is asked again with a single call.
        assert!(matches!(
            metadata_lookup(Lookup::Missing),
            MetadataLookup::AskSingle
        ));
    }

    #[test]
    fn retry_of_the_whole_call_reaches_every_node_of_it() {
        let requested: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let got = distribute(
            &requested,
            Err(CloudError::Retry {
                after: Duration::from_secs(3),
                message: "429".into(),
            }),
        );
        assert_eq!(got.len(), 3);
        for (_, lookup) in got {
            match metadata_lookup(lookup) {
                MetadataLookup::Failed(CloudError::Retry { after, .. }) => {
                    assert_eq!(after, Duration::from_secs(3));
                }
                other => panic!("expected a Retry, got {other:?}"),
            }
        }
    }

    #[test]
    fn other_call_errors_fail_every_node_and_not_implemented_means_single_calls() {
        let requested = vec!["a".to_owned(), "b".to_owned()];
        for (_, lookup) in distribute(&requested, Err(CloudError::msg("boom"))) {
            let (exists, _) = lifecycle_lookup(lookup).unwrap();
            assert_eq!(exists.unwrap_err().to_string(), "boom");
        }
        for (_, lookup) in distribute(&requested, Err(CloudError::NotImplemented)) {
            assert!(matches!(lookup, Lookup::Unsupported));
            assert!(lifecycle_lookup(copy_lookup(&lookup)).is_none());
            assert!(matches!(metadata_lookup(lookup), MetadataLookup::AskSingle));
        }
    }

    #[test]
    fn answers_read_as_the_single_calls_would() {
        let found = Lookup::Answer(InstanceAnswer::Found(meta("x://1")));
        let (e, s) = lifecycle_lookup(copy_lookup(&found)).unwrap();
        assert_eq!((e.unwrap(), s.unwrap()), (true, false));
        assert!(
            matches!(metadata_lookup(found), MetadataLookup::Metadata(m) if m.provider_id == "x://1")
        );

        let down = Lookup::Answer(InstanceAnswer::Shutdown(meta("x://2")));
        let (e, s) = lifecycle_lookup(copy_lookup(&down)).unwrap();
        assert_eq!((e.unwrap(), s.unwrap()), (true, true));
        assert!(matches!(metadata_lookup(down), MetadataLookup::Metadata(_)));

        let gone = Lookup::Answer(InstanceAnswer::NotFound);
        let (e, _) = lifecycle_lookup(copy_lookup(&gone)).unwrap();
        assert!(!e.unwrap());
        assert!(matches!(
            metadata_lookup(gone),
            MetadataLookup::Failed(CloudError::InstanceNotFound)
        ));

        let error = Lookup::Answer(InstanceAnswer::Error(CloudError::msg("denied")));
        let (e, s) = lifecycle_lookup(copy_lookup(&error)).unwrap();
        assert!(e.is_err() && s.is_err());
        assert!(
            matches!(metadata_lookup(error), MetadataLookup::Failed(e) if e.to_string() == "denied")
        );
    }
}
