//! Faults armed on operations: how a [`Fault`] is armed, fires and is used up.

use ccm_core::CloudError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{ArmedFault, FakeCloud, Fault, State, warn_unknown_operation};

impl FakeCloud {
    /// Arms a fault on an operation (a snake_case trait method name, see [`OPERATIONS`](super::OPERATIONS); an
    /// unknown name is logged as a warning and never fires). Faults already armed on the
    /// operation stay armed and are consulted first.
    pub fn inject(&self, op: &str, fault: Fault) {
        warn_unknown_operation(op);
        self.lock()
            .faults
            .entry(op.to_owned())
            .or_default()
            .push(arm(fault));
    }

    /// Disarms every fault on every operation.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }
}

impl State {
    /// Consults the faults armed on `op`; the first that fires gives the error.
    pub(super) fn fire_fault(&mut self, op: &str) -> Option<CloudError> {
        let faults = self.faults.get_mut(op)?;
        let mut fired = None;
        for fault in faults.iter_mut() {
            fired = match fault {
                ArmedFault::FailNext(left) if *left > 0 => {
                    *left -= 1;
                    Some(injected(op))
                }
                ArmedFault::Probability { p, rng } => rng.random_bool(*p).then(|| injected(op)),
                ArmedFault::Retry { after, left } if *left > 0 => {
                    *left -= 1;
                    Some(CloudError::retry(
                        *after,
                        format!("fake cloud: injected retry of {op}"),
                    ))
                }
                ArmedFault::RetryProbability { p, after, rng } => rng.random_bool(*p).then(|| {
                    CloudError::retry(*after, format!("fake cloud: injected retry of {op}"))
                }),
                ArmedFault::NotImplemented => Some(CloudError::NotImplemented),
                ArmedFault::InstanceNotFound => Some(CloudError::InstanceNotFound),
                _ => None,
            };
            if fired.is_some() {
                break;
            }
        }
        faults.retain(|f| {
            !matches!(
                f,
                ArmedFault::FailNext(0) | ArmedFault::Retry { left: 0, .. }
            )
        });
        if let Some(e) = &fired {
            tracing::debug!(operation = op, kind = e.kind(), "fake cloud fault injected");
        }
        fired
    }
}

impl State {
    /// Consults the [`Fault::TimeoutAfterEffect`] faults armed on `op`, once its call took
    /// effect: the error the caller gets instead of the answer, if one fires.
    pub(super) fn fire_after_effect(&mut self, op: &str) -> Option<CloudError> {
        let faults = self.faults.get_mut(op)?;
        faults.iter_mut().find_map(|fault| match fault {
            ArmedFault::TimeoutAfterEffect { p, rng } => rng.random_bool(*p).then(|| {
                tracing::debug!(
                    operation = op,
                    kind = "timeout_after_effect",
                    "fake cloud fault injected"
                );
                CloudError::msg(format!(
                    "fake cloud: injected timeout of {op} after it took effect"
                ))
            }),
            _ => None,
        })
    }
}

/// A probability rand accepts: out-of-range values are clamped (NaN never fires).
fn clamp(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

fn injected(op: &str) -> CloudError {
    CloudError::msg(format!("fake cloud: injected failure of {op}"))
}

pub(super) fn arm(fault: Fault) -> ArmedFault {
    match fault {
        Fault::FailNext(n) => ArmedFault::FailNext(n),
        Fault::FailWithProbability { p, seed } => ArmedFault::Probability {
            // Out-of-range values are clamped (NaN never fails) rather than panicking in rand.
            p: clamp(p),
            rng: Box::new(ChaCha8Rng::seed_from_u64(seed)),
        },
        Fault::RetryWithProbability { p, after, seed } => ArmedFault::RetryProbability {
            p: clamp(p),
            after,
            rng: Box::new(ChaCha8Rng::seed_from_u64(seed)),
        },
        Fault::TimeoutAfterEffect { p, seed } => ArmedFault::TimeoutAfterEffect {
            p: clamp(p),
            rng: Box::new(ChaCha8Rng::seed_from_u64(seed)),
        },
        Fault::Retry { after, count } => ArmedFault::Retry { after, left: count },
        Fault::NotImplemented => ArmedFault::NotImplemented,
        Fault::InstanceNotFound => ArmedFault::InstanceNotFound,
    }
}
