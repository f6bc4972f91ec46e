//! The Event writer's bookkeeping: the writes in flight (Normal and Warning ones counted
//! apart, so Warnings never wait for a slot a Normal write holds) and the Normal repeats held
//! until their Event's repeat window ends (`budget.rs`).

use super::*;

/// The writes in flight, and per correlation key the repeat waiting for its Event's write to
/// finish.
#[derive(Default)]
pub(super) struct InFlight {
    tasks: JoinSet<()>,
    /// Per task: its Event's key and whether it is a Warning.
    keys: HashMap<Id, (u64, bool)>,
    waiting: HashMap<u64, Option<Job>>,
    pub(super) warnings: usize,
}

impl InFlight {
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn normal(&self) -> usize {
        self.tasks.len() - self.warnings
    }

    pub(super) fn start(&mut self, writes: &Arc<Writes>, job: Job) {
        let key = job.write.key;
        let warning = job.is_warning();
        self.warnings += usize::from(warning);
        let handle = self.tasks.spawn(writes.clone().write(job));
        self.keys.insert(handle.id(), (key, warning));
        self.waiting.insert(key, None);
    }

    /// Whether a write of Event `key` is in flight.
    pub(super) fn writing(&self, key: u64) -> bool {
        self.waiting.contains_key(&key)
    }

    /// Starts `job`, or folds it into the repeat waiting for its Event's write.
    pub(super) fn add(&mut self, writes: &Arc<Writes>, mut job: Job) {
        match self.waiting.get_mut(&job.write.key) {
            None => self.start(writes, job),
            Some(waiting) => {
                if let Some(earlier) = waiting.take() {
                    job.observations += earlier.observations;
                }
                *waiting = Some(job);
            }
        }
    }

    /// Waits for a write to finish; returns the repeat that waited for it, if any (`None`
    /// also when nothing is in flight).
    pub(super) async fn finished(&mut self) -> Option<Job> {
        let id = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => id,
            // The write task panicked or was aborted; its slot and key are free again.
            Err(e) => e.id(),
        };
        let (key, warning) = self.keys.remove(&id)?;
        self.warnings -= usize::from(warning);
        self.waiting.remove(&key).flatten()
    }
}

/// Normal repeats waiting for the end of their Event's repeat window, by correlation key.
#[derive(Default)]
pub(super) struct Held {
    jobs: HashMap<u64, (Instant, Job)>,
}

impl Held {
    /// Holds `job` until `due`, folding it into the repeat already held for its Event.
    pub(super) fn hold(&mut self, due: Instant, mut job: Job) {
        let key = job.write.key;
        if let Some((earlier_due, earlier)) = self.jobs.remove(&key) {
            job.observations += earlier.observations;
            self.jobs.insert(key, (earlier_due.min(due), job));
        } else {
            self.jobs.insert(key, (due, job));
        }
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.jobs.values().map(|(due, _)| *due).min()
    }

    /// The repeats due at `now` (all with `all`), taken out.
    pub(super) fn due(&mut self, now: Instant, all: bool) -> Vec<Job> {
        let keys: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, (due, _))| all || *due <= now)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| self.jobs.remove(&k).map(|(_, job)| job))
            .collect()
    }
}
