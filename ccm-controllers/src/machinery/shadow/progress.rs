//! What the shadow's controllers have compared so far, object by object, and the end of a
//! one-shot run that could not compare everything.
//!
//! A controller tells the recorder that it will compare an object ([`Shadow::expect`]: it
//! queued it), that it compared it ([`Shadow::compared`]: its plan ran to the end, the guards
//! saw every write and cloud call it planned) or that it could not ([`Shadow::not_compared`]:
//! a cloud or API error; the object is retried with backoff). An object deleted meanwhile is
//! dropped ([`Shadow::forget_object`]). The one-shot report lists, when the run ends, each
//! object expected and not compared, with the reason.

use std::collections::HashMap;

use serde::Serialize;

use super::Shadow;

/// Why an object was not compared when the one-shot run ended.
pub(crate) const REASON_CLOUD_ERROR: &str = "cloud error";
/// The object was still queued or in flight while calls waited for the cloud-call budget.
pub(crate) const REASON_BUDGET_SATURATED: &str = "budget saturated";
/// The object was still queued or in flight, the budget not saturated.
pub(crate) const REASON_STILL_PENDING: &str = "still pending";

/// How far one object's comparison got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// Queued, not compared yet.
    Expected,
    /// Compared at least once.
    Compared,
    /// The last attempt failed (the error), none succeeded yet.
    Failed(String),
}

/// An object the one-shot run did not compare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct NotCompared {
    /// `Node` or `Service`.
    pub kind: String,
    /// A Node's name, a Service's `namespace/name`.
    pub object: String,
    /// [`REASON_CLOUD_ERROR`], [`REASON_BUDGET_SATURATED`] or [`REASON_STILL_PENDING`].
    pub reason: String,
    /// The last error, for [`REASON_CLOUD_ERROR`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The end of a one-shot run before every object was compared (the settle time ran out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cutoff {
    /// Cloud calls were waiting for the budget when the run ended.
    pub budget_saturated: bool,
}

/// Progress by `(kind, object)`.
pub(super) type ProgressMap = HashMap<(String, String), Progress>;

impl Shadow {
    fn progress(&self) -> std::sync::MutexGuard<'_, ProgressMap> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A controller queued `kind/object` to compare it (a no-op once compared).
    pub(crate) fn expect(&self, kind: &str, object: &str) {
        self.progress()
            .entry((kind.to_owned(), object.to_owned()))
            .or_insert(Progress::Expected);
    }

    /// A controller compared `kind/object`.
    pub(crate) fn compared(&self, kind: &str, object: &str) {
        self.progress()
            .insert((kind.to_owned(), object.to_owned()), Progress::Compared);
    }

    /// A controller could not compare `kind/object` (`error`); it retries later. Kept as
    /// compared when an earlier attempt succeeded.
    pub(crate) fn not_compared(&self, kind: &str, object: &str, error: impl std::fmt::Display) {
        let mut progress = self.progress();
        let entry = progress
            .entry((kind.to_owned(), object.to_owned()))
            .or_insert(Progress::Expected);
        if *entry != Progress::Compared {
            *entry = Progress::Failed(error.to_string());
        }
    }

    /// `kind/object` is gone: nothing left to compare.
    pub(crate) fn forget_object(&self, kind: &str, object: &str) {
        self.progress()
            .remove(&(kind.to_owned(), object.to_owned()));
    }

    /// Ends a one-shot run before everything was compared: the report is incomplete.
    pub(crate) fn cut_off(&self, cutoff: Cutoff) {
        let _ = self.cutoff.set(cutoff);
    }

    /// The objects expected and not compared, sorted by kind and object; each with the
    /// reason. Objects still queued are "budget saturated" when the run was cut off while
    /// calls waited for the budget, else "still pending".
    pub(crate) fn not_compared_objects(&self) -> Vec<NotCompared> {
        let saturated = self.cutoff.get().is_some_and(|c| c.budget_saturated);
        let mut all: Vec<NotCompared> = self
            .progress()
            .iter()
            .filter_map(|((kind, object), p)| {
                let (reason, error) = match p {
                    Progress::Compared => return None,
                    Progress::Failed(e) => (REASON_CLOUD_ERROR, Some(e.clone())),
                    Progress::Expected if saturated => (REASON_BUDGET_SATURATED, None),
                    Progress::Expected => (REASON_STILL_PENDING, None),
                };
                Some(NotCompared {
                    kind: kind.clone(),
                    object: object.clone(),
                    reason: reason.to_owned(),
                    error,
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.kind, &a.object).cmp(&(&b.kind, &b.object)));
        all
    }

    /// Whether every object expected was compared.
    pub(crate) fn all_compared(&self) -> bool {
        self.progress().values().all(|p| *p == Progress::Compared)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::machinery::metrics::MetricsRegistry;

    #[test]
    fn an_object_compared_once_stays_compared_and_the_rest_say_why_not() {
        let shadow = Shadow::new(Duration::from_secs(60), &MetricsRegistry::new());
        for n in ["a", "b", "c", "d"] {
            shadow.expect("Node", n);
        }
        shadow.compared("Node", "a");
        shadow.not_compared("Node", "a", "later error");
        shadow.not_compared("Node", "b", "quota exceeded");
        shadow.forget_object("Node", "d");
        let reasons = |s: &Shadow| -> Vec<(String, String)> {
            s.not_compared_objects()
                .into_iter()
                .map(|n| (n.object, n.reason))
                .collect()
        };
        assert_eq!(
            reasons(&shadow),
            vec![
                ("b".to_owned(), REASON_CLOUD_ERROR.to_owned()),
                ("c".to_owned(), REASON_STILL_PENDING.to_owned())
            ]
        );
        assert!(!shadow.all_compared());
        shadow.cut_off(Cutoff {
            budget_saturated: true,
        });
        assert_eq!(reasons(&shadow)[1].1, REASON_BUDGET_SATURATED);
        assert_eq!(
            shadow.not_compared_objects()[0].error.as_deref(),
            Some("quota exceeded")
        );
    }
}
