//! The write path of the Event writer: one Event written (created, or its series patched),
//! retried as the [module documentation](super) says, and its outcome counted.

use super::*;

/// What the write tasks share.
pub(super) struct Writes {
    pub(super) client: Client,
    pub(super) instance: String,
    pub(super) shared: Arc<Shared>,
    pub(super) fail_log: Mutex<LogLimiter>,
    pub(super) max_tries: u32,
    pub(super) sleep: Duration,
    pub(super) stop: CancellationToken,
    pub(super) flush_timeout: Duration,
    /// Set once, by whoever first sees `stop` fire: `flush_timeout` after that.
    pub(super) flush_deadline: OnceLock<Instant>,
}

impl Writes {
    /// The flush deadline (call only once `stop` fired).
    pub(super) fn deadline(&self) -> Instant {
        *self
            .flush_deadline
            .get_or_init(|| Instant::now() + self.flush_timeout)
    }

    /// Writes one Event, retrying as the module documentation says, and counts the outcome.
    pub(super) async fn write(self: Arc<Self>, job: Job) {
        let mut create = job.write.count <= 1;
        let mut tries = 0u32;
        let mut attempted = false;
        loop {
            let started = Instant::now();
            let Some(result) = self.attempt(&job, create).await else {
                self.abandoned(
                    &job,
                    attempted,
                    "abandoned an event write at the flush deadline",
                );
                return;
            };
            attempted = true;
            let overloaded =
                matches!(&result, Err(kube::Error::Api(s)) if s.code == 429 || s.code >= 500);
            self.shared.pacing.observe(started.elapsed(), overloaded);
            let error = match result {
                Ok(()) => {
                    if job.observations == 0 {
                        self.shared.count("summaries", 1);
                    }
                    self.shared.count("written", job.observations);
                    return;
                }
                Err(error) => error,
            };
            if !create && matches!(&error, kube::Error::Api(s) if s.is_not_found()) {
                // The Event the repeat counts on is gone: as client-go, create it anew (same
                // name, same count) in the same try.
                create = true;
                self.shared.count("retried", 1);
                continue;
            }
            tries += 1;
            if !retryable(&error) {
                self.failed(&job, &error, "will not retry");
                return;
            }
            if tries >= self.max_tries {
                self.failed(&job, &error, "retry limit exceeded");
                return;
            }
            // Randomise the first sleep, as client-go, so that clients do not retry in step.
            let delay = if tries == 1 {
                self.sleep.mul_f64(rand::random::<f64>())
            } else {
                self.sleep
            };
            let wake = Instant::now() + delay;
            if !self.stop.is_cancelled() {
                let max_tries = self.max_tries;
                self.warn_failure(
                    &job,
                    &error,
                    format_args!("retrying in {delay:?} (try {tries} of {max_tries})"),
                );
                tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(wake) => {}
                    () = self.stop.cancelled() => {}
                }
            }
            if self.stop.is_cancelled() && wake > self.deadline() {
                self.failed(&job, &error, "the flush deadline comes before the next try");
                return;
            }
            tokio::time::sleep_until(wake).await;
            self.shared.count("retried", 1);
        }
    }

    /// One write of `job` (a create, or a PATCH of the series); `None` when it was abandoned
    /// at the flush deadline.
    pub(super) async fn attempt(&self, job: &Job, create: bool) -> Option<Result<(), kube::Error>> {
        let publish = self.publish(job, create);
        tokio::pin!(publish);
        if self.stop.is_cancelled() {
            return tokio::time::timeout_at(self.deadline(), publish).await.ok();
        }
        tokio::select! {
            biased;
            result = &mut publish => Some(result),
            () = self.stop.cancelled() => {
                tokio::time::timeout_at(self.deadline(), publish).await.ok()
            }
        }
    }

    pub(super) async fn publish(&self, job: &Job, create: bool) -> Result<(), kube::Error> {
        let Job { queued, write, .. } = job;
        let namespace = queued.regarding.namespace.as_deref().unwrap_or("default");
        let client = queued.client.as_ref().unwrap_or(&self.client).clone();
        let api: Api<K8sEvent> = Api::namespaced(client, namespace);
        let series = (write.count > 1).then_some(EventSeries {
            count: write.count,
            last_observed_time: MicroTime(write.last),
        });
        if !create {
            let patch = serde_json::json!({ "series": series });
            api.patch(&write.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(());
        }
        let type_ = match queued.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(write.name.clone()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(write.first)),
            series,
            type_: Some(type_.to_owned()),
            reason: Some(queued.reason.clone()),
            action: Some(queued.reason.clone()),
            note: Some(write.note.clone()),
            regarding: Some(queued.regarding.clone()),
            reporting_controller: Some(queued.component.to_string()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        };
        api.create(&PostParams::default(), &event).await?;
        Ok(())
    }

    /// Counts and logs an Event given up on after a failed attempt.
    pub(super) fn failed(&self, job: &Job, error: &kube::Error, why: &str) {
        self.shared.count("failed", job.observations);
        self.shared
            .not_written(&job.queued, "failed", job.observations);
        self.warn_failure(job, error, format_args!("{why}"));
    }

    /// Logs a failed write of `job` and what happens to it next (`outcome`), at most once
    /// per [`LOG_INTERVAL`]: the failures in between are only counted.
    pub(super) fn warn_failure(
        &self,
        job: &Job,
        error: &kube::Error,
        outcome: std::fmt::Arguments<'_>,
    ) {
        let due = self
            .fail_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow();
        if let Some(suppressed) = due {
            let queued = &job.queued;
            tracing::warn!(
                component = %queued.component,
                reason = %queued.reason,
                object = queued.regarding.name.as_deref().unwrap_or_default(),
                %error,
                suppressed,
                "failed to publish event, {outcome} (failures in the next {LOG_INTERVAL:?} are only counted in event_recorder_events_total)"
            );
        }
    }

    /// Counts and logs an Event whose write was cut short by the flush deadline: `failed` if
    /// an earlier attempt had failed, else `dropped`.
    pub(super) fn abandoned(&self, job: &Job, attempted: bool, why: &str) {
        let (result, cause) = if attempted {
            ("failed", "failed")
        } else {
            ("dropped", "shutdown")
        };
        self.shared.count(result, job.observations);
        self.shared
            .not_written(&job.queued, cause, job.observations);
        let queued = &job.queued;
        tracing::warn!(
            component = %queued.component,
            reason = %queued.reason,
            object = queued.regarding.name.as_deref().unwrap_or_default(),
            "{why}"
        );
    }
}

/// Whether trying the write again may succeed (see the module documentation): transport
/// errors, unreadable answers, `429` and `5xx` are retried; a request that could not be built
/// and every other error status are not.
fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => false,
        _ => true,
    }
}
