//! A client-go-style work queue: keys are de-duplicated while waiting, never processed by two
//! workers at once, re-queued if they changed while being processed, and retried with
//! per-key exponential backoff.
//!
//! Written by hand because no crate offers these semantics together: kube's `Controller`
//! de-duplicates and serialises per object but has no per-key backoff (its `error_policy`
//! returns a fixed delay), exposes no queue depth, and can only be keyed by Kubernetes objects,
//! while the route and node-sync loops here queue synthetic keys.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::machinery::metrics::WorkQueueMetrics;

/// Per-key exponential backoff: `base * 2^failures`, capped at `max` (client-go's
/// `ItemExponentialFailureRateLimiter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Backoff {
    /// Go's default controller backoff: 5 ms to 1000 s.
    pub const CONTROLLER: Backoff = Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_secs(1000),
    };
    /// Go's service controller backoff: 5 s to 300 s.
    pub const SERVICE: Backoff = Backoff {
        base: Duration::from_secs(5),
        max: Duration::from_secs(300),
    };

    /// The delay after `failures` earlier failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.checked_pow(failures.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// A count of work in flight across controllers, and a way to wait until there is none.
///
/// Every [`WorkQueue`] made by [`ControllerContext::queue`](crate::ControllerContext::queue)
/// counts as one unit while it has a key waiting or being processed; controllers also hold an
/// [`ActivityGuard`] for work that runs outside a queue (a node-sync window, a monitor pass).
/// Keys waiting for a backoff or a `RequeueAfter` delay are not in flight. Tests use it to
/// know that the controllers have processed everything (`ccm_testing::harness`); the runtime
/// only keeps the count. Cheap to clone; clones share the count.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    inner: Arc<ActivityInner>,
}

#[derive(Debug, Default)]
struct ActivityInner {
    in_flight: AtomicUsize,
    started: AtomicU64,
    idle: Notify,
}

impl Activity {
    /// A new count at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one unit of work in flight until the guard drops.
    pub fn begin(&self) -> ActivityGuard {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        self.inner.started.fetch_add(1, Ordering::SeqCst);
        ActivityGuard {
            activity: self.clone(),
        }
    }

    /// The units of work in flight now.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// How many units of work ever began: equal values around a wait mean nothing started in
    /// between.
    pub fn started(&self) -> u64 {
        self.inner.started.load(Ordering::SeqCst)
    }

    /// Resolves once nothing is in flight (at once if nothing is).
    pub async fn wait_idle(&self) {
        loop {
            let idle = self.inner.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One unit of work counted by an [`Activity`] until dropped.
#[derive(Debug)]
pub struct ActivityGuard {
    activity: Activity,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let inner = &self.activity.inner;
        if inner.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            inner.idle.notify_waiters();
        }
    }
}

/// What a worker's handler tells the queue about one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; forget the key's failures.
    Done,
    /// Done for now; process the key again after this delay (e.g. the provider answered
    /// `CloudError::Retry`, or a periodic check). Failures are kept.
    RequeueAfter(Duration),
    /// Failed; retry after the key's exponential backoff.
    Failed,
}

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    failures: HashMap<T, u32>,
    added_at: HashMap<T, Instant>,
    shutting_down: bool,
    /// Held while a key waits or is processed, when the queue reports to an [`Activity`].
    busy: Option<ActivityGuard>,
}

struct Inner<T> {
    name: String,
    backoff: Backoff,
    state: Mutex<State<T>>,
    notify: Notify,
    shutdown: CancellationToken,
    metrics: Option<WorkQueueMetrics>,
    activity: Option<Activity>,
}

/// A work queue of keys. Cheap to clone; clones share the queue.
pub struct WorkQueue<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
        }
    }
}

impl<T> WorkQueue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// A queue named `name` (the `name` label of the work-queue metrics).
    pub fn new(
        name: impl Into<String>,
        backoff: Backoff,
        metrics: Option<WorkQueueMetrics>,
    ) -> Self {
        Self::build(name.into(), backoff, metrics, None)
    }

    /// Like [`WorkQueue::new`], counting one unit in `activity` while a key waits or is
    /// processed.
    pub fn with_activity(
        name: impl Into<String>,
        backoff: Backoff,
        metrics: Option<WorkQueueMetrics>,
        activity: Activity,
    ) -> Self {
        Self::build(name.into(), backoff, metrics, Some(activity))
    }

    fn build(
        name: String,
        backoff: Backoff,
        metrics: Option<WorkQueueMetrics>,
        activity: Option<Activity>,
    ) -> Self {
        WorkQueue {
            inner: Arc::new(Inner {
                name,
                backoff,
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    failures: HashMap::new(),
                    added_at: HashMap::new(),
                    shutting_down: false,
                    busy: None,
                }),
                notify: Notify::new(),
                shutdown: CancellationToken::new(),
                metrics,
                activity,
            }),
        }
    }

    /// Takes or drops the queue's unit of [`Activity`] after a state change.
    fn track(&self, st: &mut State<T>) {
        let Some(activity) = &self.inner.activity else {
            return;
        };
        let busy = !st.processing.is_empty() || (!st.shutting_down && !st.dirty.is_empty());
        match (busy, st.busy.is_some()) {
            (true, false) => st.busy = Some(activity.begin()),
            (false, true) => st.busy = None,
            _ => {}
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A poisoned lock only means a panic elsewhere while holding it; the state itself is
        // always consistent between statements, so keep going.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Adds a key now. A key already waiting is not added twice; a key being processed is
    /// queued again once its worker is done.
    pub fn add(&self, key: T) {
        let mut st = self.lock();
        if st.shutting_down || st.dirty.contains(&key) {
            return;
        }
        st.dirty.insert(key.clone());
        self.track(&mut st);
        if let Some(m) = &self.inner.metrics {
            m.adds(&self.inner.name);
        }
        if st.processing.contains(&key) {
            return;
        }
        st.added_at.insert(key.clone(), Instant::now());
        st.queue.push_back(key);
        self.update_depth(&st);
        drop(st);
        self.inner.notify.notify_one();
    }

    /// Adds a key after `delay`.
    pub fn add_after(&self, key: T, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = self.clone();
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(delay) => queue.add(key),
            }
        });
    }

    /// Adds a key after its backoff delay, counting one more failure.
    pub fn add_rate_limited(&self, key: T) {
        let delay = {
            let mut st = self.lock();
            let failures = st.failures.entry(key.clone()).or_insert(0);
            let delay = self.inner.backoff.delay(*failures);
            *failures = failures.saturating_add(1);
            delay
        };
        if let Some(m) = &self.inner.metrics {
            m.retries(&self.inner.name);
        }
        self.add_after(key, delay);
    }

    /// Forgets a key's failures, resetting its backoff.
    pub fn forget(&self, key: &T) {
        self.lock().failures.remove(key);
    }

    /// How many failures the key has had since it was last forgotten.
    pub fn num_requeues(&self, key: &T) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the next key, waiting for one. `None` once the queue is shut down: waiting keys
    /// are then abandoned (the next leader re-lists everything).
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.inner.notify.notified();
            {
                let mut st = self.lock();
                if st.shutting_down {
                    return None;
                }
                if let Some(key) = st.queue.pop_front() {
                    st.dirty.remove(&key);
                    st.processing.insert(key.clone());
                    self.track(&mut st);
                    let waited = st.added_at.remove(&key).map(|t| t.elapsed());
                    self.update_depth(&st);
                    drop(st);
                    if let (Some(m), Some(w)) = (&self.inner.metrics, waited) {
                        m.queue_duration(&self.inner.name, w);
                    }
                    // Another key may be waiting for another worker.
                    self.inner.notify.notify_one();
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks a key as processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &T) {
        let mut st = self.lock();
        st.processing.remove(key);
        self.track(&mut st);
        if st.dirty.contains(key) && !st.shutting_down {
            st.added_at.insert(key.clone(), Instant::now());
            st.queue.push_back(key.clone());
            self.update_depth(&st);
            drop(st);
            self.inner.notify.notify_one();
        }
    }

    /// Stops handing out keys: [`WorkQueue::get`] returns `None` from now on and delayed adds
    /// are dropped. Keys being processed finish normally.
    pub fn shut_down(&self) {
        {
            let mut st = self.lock();
            st.shutting_down = true;
            self.track(&mut st);
        }
        self.inner.shutdown.cancel();
        self.inner.notify.notify_waiters();
    }

    /// Whether [`WorkQueue::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    fn update_depth(&self, st: &State<T>) {
        if let Some(m) = &self.inner.metrics {
            m.depth(&self.inner.name, st.queue.len());
        }
    }

    /// Runs `workers` workers until `shutdown` fires, then waits for in-flight keys to finish.
    ///
    /// Each worker takes a key, runs `handler`, and applies its [`Outcome`]. A handler never
    /// runs twice at once for the same key.
    pub async fn run_workers<F, Fut>(&self, workers: usize, shutdown: CancellationToken, handler: F)
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let stopper = {
            let queue = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                shutdown.cancelled().await;
                queue.shut_down();
            })
        };
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..workers.max(1) {
            let queue = self.clone();
            let handler = handler.clone();
            tasks.spawn(async move {
                while let Some(key) = queue.get().await {
                    let started = Instant::now();
                    let outcome = handler(key.clone()).await;
                    if let Some(m) = &queue.inner.metrics {
                        m.work_duration(&queue.inner.name, started.elapsed());
                    }
                    match outcome {
                        Outcome::Done => queue.forget(&key),
                        Outcome::RequeueAfter(delay) => queue.add_after(key.clone(), delay),
                        Outcome::Failed => queue.add_rate_limited(key.clone()),
                    }
                    queue.done(&key);
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        stopper.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff::SERVICE;
        assert_eq!(b.delay(0), Duration::from_secs(5));
        assert_eq!(b.delay(1), Duration::from_secs(10));
        assert_eq!(b.delay(5), Duration::from_secs(160));
        assert_eq!(b.delay(6), Duration::from_secs(300));
        assert_eq!(b.delay(100), Duration::from_secs(300));
        assert_eq!(Backoff::CONTROLLER.delay(0), Duration::from_millis(5));
        assert_eq!(Backoff::CONTROLLER.delay(40), Duration::from_secs(1000));
    }

    #[tokio::test]
    async fn dedups_waiting_keys_and_requeues_dirty_processing_keys() {
        let q = WorkQueue::new("t", Backoff::CONTROLLER, None);
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let k = q.get().await.unwrap();
        assert_eq!(k, "a");
        // Added while processing: not handed out until done.
        q.add("a");
        assert_eq!(q.get().await.unwrap(), "b");
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.get().await.unwrap(), "a");
        q.done(&"a");
        q.done(&"b");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn activity_counts_a_queue_while_a_key_waits_or_is_processed() {
        let activity = Activity::new();
        let q = WorkQueue::with_activity("t", Backoff::CONTROLLER, None, activity.clone());
        assert_eq!(activity.in_flight(), 0);
        q.add("a");
        q.add("b");
        assert_eq!(activity.in_flight(), 1, "one unit per busy queue");
        let a = q.get().await.unwrap();
        let b = q.get().await.unwrap();
        q.done(&a);
        assert_eq!(activity.in_flight(), 1, "b is still being processed");
        q.add(b);
        q.done(&b);
        assert_eq!(activity.in_flight(), 1, "b was re-queued while processed");
        let b = q.get().await.unwrap();
        let waiter = tokio::spawn({
            let activity = activity.clone();
            async move { activity.wait_idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.done(&b);
        waiter.await.unwrap();
        assert_eq!(activity.in_flight(), 0);
        // Shut down with a key waiting: abandoned keys are not in flight.
        q.add("c");
        assert_eq!(activity.in_flight(), 1);
        q.shut_down();
        assert_eq!(activity.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_per_key() {
        let q = WorkQueue::new("t", Backoff::SERVICE, None);
        q.add_rate_limited("a");
        q.add_rate_limited("a");
        assert_eq!(q.num_requeues(&"a"), 2);
        tokio::time::sleep(Duration::from_millis(4900)).await;
        assert!(q.is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(q.len(), 1);
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
    }

    #[tokio::test]
    async fn workers_never_run_one_key_twice_at_once_and_drain_on_shutdown() {
        let q = WorkQueue::new("t", Backoff::CONTROLLER, None);
        let running = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        for _ in 0..5 {
            q.add("same");
        }
        let (r, m, c) = (running.clone(), max_seen.clone(), calls.clone());
        let q2 = q.clone();
        let runner = tokio::spawn({
            let q = q.clone();
            let shutdown = shutdown.clone();
            async move {
                q.run_workers(4, shutdown, move |_k| {
                    let (r, m, c, q2) = (r.clone(), m.clone(), c.clone(), q2.clone());
                    async move {
                        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                        m.fetch_max(now, Ordering::SeqCst);
                        if c.fetch_add(1, Ordering::SeqCst) == 0 {
                            q2.add("same");
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        r.fetch_sub(1, Ordering::SeqCst);
                        Outcome::Done
                    }
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        shutdown.cancel();
        runner.await.unwrap();
        assert_eq!(max_seen.load(Ordering::SeqCst), 1);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(q.get().await.is_none());
    }
}
