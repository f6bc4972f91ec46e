//! Every Warning Event is also a WARN log line, with the object and the note (which carries
//! the error), so an operator reading `kubectl logs` sees what `kubectl get events` shows: Go's
//! controllers log each failed sync ("error processing service ... (retrying with exponential
//! backoff)") and its event broadcaster logs the Events too.
//!
//! Logged when the Event is recorded, before the queue, the correlator and the spam filter, so
//! an Event that is dropped or held back is still logged. Per component, object and reason, at
//! most one line per [`WARN_LOG_INTERVAL`]: a Service whose load balancer fails on every retry
//! logs its first failure at once and then once per interval, saying how many it kept quiet
//! about, so one crash-looping object cannot flood the log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::time::Instant;

/// At most one WARN line per component, object and reason in this interval.
pub const WARN_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The (component, object, reason) keys remembered at most; past it, the keys not logged
/// within the last interval are forgotten (their next Warning logs at once).
const MAX_KEYS: usize = 10_000;

/// When each key last logged, and how many of its Warnings were not logged since.
#[derive(Debug, Default)]
pub(super) struct WarningLog {
    keys: Mutex<HashMap<String, (Instant, u64)>>,
}

impl WarningLog {
    /// Logs the Warning `reason`/`note` on `object` at WARN, unless this component logged one
    /// with that reason on that object within the interval (then it is counted).
    pub(super) fn log(&self, component: &str, object: &ObjectReference, reason: &str, note: &str) {
        let kind = object.kind.as_deref().unwrap_or_default();
        let name = match (&object.namespace, &object.name) {
            (Some(ns), Some(name)) if !ns.is_empty() => format!("{ns}/{name}"),
            (_, Some(name)) => name.clone(),
            _ => String::new(),
        };
        let Some(suppressed) = self.due(format!("{component}\u{0}{kind}\u{0}{name}\u{0}{reason}"))
        else {
            return;
        };
        if suppressed == 0 {
            tracing::warn!(component, kind, object = %name, reason, "{reason}: {note}");
        } else {
            tracing::warn!(
                component,
                kind,
                object = %name,
                reason,
                suppressed,
                "{reason}: {note} ({suppressed} more like it in the last {WARN_LOG_INTERVAL:?} \
                 were not logged)"
            );
        }
    }

    /// `Some(suppressed since the last line)` when `key` may log now.
    fn due(&self, key: String) -> Option<u64> {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((last, suppressed)) = keys.get_mut(&key) {
            if now.duration_since(*last) < WARN_LOG_INTERVAL {
                *suppressed += 1;
                return None;
            }
            *last = now;
            return Some(std::mem::take(suppressed));
        }
        if keys.len() >= MAX_KEYS {
            keys.retain(|_, (last, _)| now.duration_since(*last) < WARN_LOG_INTERVAL);
        }
        keys.insert(key, (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_object_and_reason_per_interval() {
        let log = WarningLog::default();
        let key = |object: &str, reason: &str| format!("c\u{0}Service\u{0}{object}\u{0}{reason}");
        assert_eq!(log.due(key("ns/a", "SyncLoadBalancerFailed")), Some(0));
        assert_eq!(log.due(key("ns/a", "SyncLoadBalancerFailed")), None);
        assert_eq!(log.due(key("ns/a", "SyncLoadBalancerFailed")), None);
        // Another object, another reason: logged at once.
        assert_eq!(log.due(key("ns/b", "SyncLoadBalancerFailed")), Some(0));
        assert_eq!(log.due(key("ns/a", "UpdateLoadBalancerFailed")), Some(0));
        tokio::time::advance(WARN_LOG_INTERVAL).await;
        assert_eq!(log.due(key("ns/a", "SyncLoadBalancerFailed")), Some(2));
        assert_eq!(log.due(key("ns/a", "SyncLoadBalancerFailed")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_keys_are_bounded() {
        let log = WarningLog::default();
        for i in 0..MAX_KEYS {
            assert_eq!(log.due(format!("k{i}")), Some(0));
        }
        tokio::time::advance(WARN_LOG_INTERVAL).await;
        assert_eq!(log.due("new".into()), Some(0));
        assert_eq!(
            log.keys.lock().unwrap().len(),
            1,
            "the old keys were forgotten"
        );
    }
}
