//! Kubernetes Events, as the Go controllers emit them (same reasons, same types).
//!
//! Built on kube's `Recorder`, which writes `events.k8s.io/v1` Events (shown by
//! `kubectl describe` like core/v1 ones) and folds repeats within a few minutes into an event
//! series. Events are best effort: a failure to publish is logged, never fails a reconcile.

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

/// Publishes Events for one controller component (e.g. `cloud-node-controller`).
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
    component: String,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as `component` from this process instance (`instance` is the
    /// leader-election identity, or the hostname).
    pub fn new(client: Client, component: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: component.to_owned(),
            instance: Some(instance.to_owned()),
        };
        EventRecorder {
            recorder: Recorder::new(client, reporter),
            component: component.to_owned(),
        }
    }

    /// Emits a `Normal` event on `object`.
    pub async fn normal<K>(&self, object: &K, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object, EventType::Normal, reason, note.into())
            .await;
    }

    /// Emits a `Warning` event on `object`.
    pub async fn warning<K>(&self, object: &K, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object, EventType::Warning, reason, note.into())
            .await;
    }

    async fn publish<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        let reference = object.object_ref(&());
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(
                component = %self.component,
                reason,
                object = reference.name.as_deref().unwrap_or_default(),
                %error,
                "failed to publish event"
            );
        }
    }
}
