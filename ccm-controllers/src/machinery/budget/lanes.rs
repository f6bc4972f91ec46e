//! Priority lanes of the cloud-call budget.
//!
//! Under a quota, what a cloud call waits for (a token of `--cloud-api-qps`, the slot of an
//! operation the provider slowed down) is handed out by lane, not by arrival:
//!
//! 1. [`Lane::FirstEnsure`]: the first `ensure_load_balancer` of a Service that has no
//!    ingress yet: one call per Service, which a user waits for, and which must not wait for a
//!    burst of Nodes to be initialised (issue 43: in a bring-up, every load balancer before
//!    the last Node);
//! 2. [`Lane::Initialise`]: new Nodes' initialisation and the other load-balancer calls for
//!    changed Services, what a user waits for (the default: a call outside any lane is here);
//! 3. [`Lane::Lifecycle`]: the node-lifecycle checks of NotReady Nodes;
//! 4. [`Lane::Refresh`]: the periodic address refresh and resync work.
//!
//! A call waits at the gate while any call of a higher lane waits to be admitted; the calls of
//! the two lowest lanes pass the gate one at a time each, so a refresh of 100,000 Nodes never
//! holds more than one reservation ahead of an initialisation that arrives after it. A lower
//! lane therefore only gets what the higher ones leave over: a refresh that cannot fit its
//! period under the quota takes longer (the cloud-node controller then reports the period it
//! achieved, see `controllers/cloud_node/mod.rs`), and never starves initialisation. First
//! ensures are one per new Service: under a quota, Node initialisation waits only while new
//! Services' first ensures wait (300 of them at 20 calls/s: 15 s).
//!
//! A controller picks the lane of its calls with [`in_lane`] around the future that makes
//! them (a tokio task-local, so nothing changes in the provider traits).

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::Notify;

/// The priority of a cloud call; lower is served first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Lane {
    /// The first ensure of a Service without an ingress.
    FirstEnsure = 0,
    /// New Nodes' initialisation, the other calls for new or changed Services (the default).
    Initialise = 1,
    /// Node-lifecycle checks.
    Lifecycle = 2,
    /// Periodic address refresh and resync.
    Refresh = 3,
}

/// The lanes whose calls pass the gate one at a time: [`Lane::Lifecycle`] and
/// [`Lane::Refresh`].
const FIRST_SERIAL_LANE: usize = Lane::Lifecycle as usize;

tokio::task_local! {
    static LANE: Lane;
}

/// Runs `f` with its cloud calls in `lane`.
pub(crate) async fn in_lane<F: Future>(lane: Lane, f: F) -> F::Output {
    LANE.scope(lane, f).await
}

/// The lane of a call made here: the innermost [`in_lane`], else [`Lane::Initialise`].
pub(crate) fn current() -> Lane {
    LANE.try_with(|l| *l).unwrap_or(Lane::Initialise)
}

/// The gate: calls waiting to be admitted, per lane.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    waiting: Mutex<[usize; 4]>,
    changed: Notify,
    /// One admission at a time for [`Lane::Lifecycle`] and [`Lane::Refresh`].
    serial: [tokio::sync::Mutex<()>; 2],
}

/// Counts a call as waiting in its lane until it is admitted (or dropped).
struct Waiting<'a> {
    lanes: &'a Lanes,
    lane: usize,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.lanes.counts()[self.lane] -= 1;
        self.lanes.changed.notify_waiters();
    }
}

impl Lanes {
    fn counts(&self) -> std::sync::MutexGuard<'_, [usize; 4]> {
        // Plain counters, consistent after every statement; a panic elsewhere leaves them so.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls waiting to be admitted now, in every lane (for a token, a slot, a higher lane).
    pub(super) fn waiting(&self) -> usize {
        self.counts().iter().sum()
    }

    /// Runs `admission` (the wait for a token and the operation's slot) once no call of a
    /// higher lane waits for its own.
    pub(super) async fn admit<F: Future>(&self, lane: Lane, admission: F) -> F::Output {
        let index = lane as usize;
        self.counts()[index] += 1;
        let _waiting = Waiting {
            lanes: self,
            lane: index,
        };
        let _serial = match index
            .checked_sub(FIRST_SERIAL_LANE)
            .and_then(|i| self.serial.get(i))
        {
            Some(serial) => Some(serial.lock().await),
            None => None,
        };
        loop {
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.counts()[..index].iter().all(|&n| n == 0) {
                break;
            }
            notified.await;
        }
        admission.await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use ccm_core::{CloudProvider, CloudResult, InstanceMetadata, InstancesV2, Node, NodeView};

    use super::{Lane, in_lane};
    use crate::machinery::budget::{BudgetConfig, BudgetedProvider};
    use crate::machinery::metrics::MetricsRegistry;

    /// Records the name of every Node asked about, in the order the calls reach the cloud.
    #[derive(Default)]
    struct Recording(Mutex<Vec<String>>);

    impl CloudProvider for Recording {
        fn provider_name(&self) -> &str {
            "recording"
        }
        fn instances_v2(&self) -> Option<&dyn InstancesV2> {
            Some(self)
        }
    }

    #[async_trait]
    impl InstancesV2 for Recording {
        async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
            self.0.lock().unwrap().push(node.name().to_owned());
            Ok(true)
        }
        async fn instance_shutdown(&self, _: &NodeView) -> CloudResult<bool> {
            Ok(false)
        }
        async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
            self.0.lock().unwrap().push(node.name().to_owned());
            Ok(InstanceMetadata::default())
        }
    }

    fn node(name: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n
    }

    /// 1 call per second, burst 1. A refresh of 20 Nodes starts first, 5 lifecycle checks
    /// half a second later, 5 initialisations a second after that: once the initialisations
    /// arrive they go next (behind at most the one refresh call and the one lifecycle call
    /// already holding a reservation), then the lifecycle checks, then the rest of the refresh.
    #[tokio::test(start_paused = true)]
    async fn initialisation_goes_before_lifecycle_checks_before_refresh() {
        let cloud = Arc::new(Recording::default());
        let budgeted = BudgetedProvider::new(
            cloud.clone(),
            &BudgetConfig {
                rate_limit: Some((1.0, 1)),
                timeout: None,
            },
            &MetricsRegistry::new(),
        );
        let mut tasks = tokio::task::JoinSet::new();
        let spawn = |tasks: &mut tokio::task::JoinSet<()>, lane: Lane, name: String| {
            let budgeted = budgeted.clone();
            tasks.spawn(in_lane(lane, async move {
                let v2 = budgeted.instances_v2().unwrap();
                match lane {
                    Lane::Lifecycle => v2
                        .instance_exists(&ccm_core::NodeView::from_node(&node(&name)))
                        .await
                        .map(|_| ()),
                    _ => v2
                        .instance_metadata(&ccm_core::NodeView::from_node(&node(&name)))
                        .await
                        .map(|_| ()),
                }
                .unwrap();
            }));
        };
        for i in 0..20 {
            spawn(&mut tasks, Lane::Refresh, format!("refresh-{i:02}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..5 {
            spawn(&mut tasks, Lane::Lifecycle, format!("lifecycle-{i}"));
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        for i in 0..5 {
            spawn(&mut tasks, Lane::Initialise, format!("init-{i}"));
        }
        tasks.join_all().await;
        let order = cloud.0.lock().unwrap().clone();
        let kinds: Vec<&str> = order
            .iter()
            .map(|n| n.split('-').next().unwrap_or_default())
            .collect();
        // t=0 refresh-00 (the burst); t=1 refresh-01 (reserved before anything else came).
        // lifecycle-0 reserved at t=0.5 behind it; then every init, every other lifecycle
        // check, and the rest of the refresh.
        let mut expected = vec!["refresh", "refresh", "lifecycle"];
        expected.extend(["init"; 5]);
        expected.extend(["lifecycle"; 4]);
        expected.extend(["refresh"; 18]);
        assert_eq!(kinds, expected, "{order:?}");
        // Each lane in its own arrival order.
        let refresh: Vec<_> = order.iter().filter(|n| n.starts_with("refresh")).collect();
        assert!(refresh.windows(2).all(|w| w[0] < w[1]), "{refresh:?}");
    }

    /// While a Service's first ensure waits for its admission (here: its operation's pace, as
    /// after the cloud answered `Retry`), a Node initialisation that arrives does not start its
    /// own (with another operation's pace it would go first and spend the cloud's quota); it
    /// starts once the ensure is admitted. A lifecycle check waits for both.
    #[tokio::test]
    async fn an_initialisation_waits_while_a_first_ensure_waits_for_admission() {
        use super::Lanes;
        let lanes = Arc::new(Lanes::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let admitted = |order: &Arc<Mutex<Vec<&'static str>>>, name: &'static str| {
            let order = order.clone();
            async move { order.lock().unwrap().push(name) }
        };
        let ensure = {
            let (lanes, order) = (lanes.clone(), order.clone());
            tokio::spawn(async move {
                lanes
                    .admit(Lane::FirstEnsure, async move {
                        released.await.unwrap();
                        order.lock().unwrap().push("ensure");
                    })
                    .await;
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(lanes.waiting(), 1);
        let init = {
            let (lanes, a) = (lanes.clone(), admitted(&order, "init"));
            tokio::spawn(async move { lanes.admit(Lane::Initialise, a).await })
        };
        let check = {
            let (lanes, a) = (lanes.clone(), admitted(&order, "lifecycle"));
            tokio::spawn(async move { lanes.admit(Lane::Lifecycle, a).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            order.lock().unwrap().is_empty(),
            "nothing admitted before the ensure"
        );
        release.send(()).unwrap();
        for task in [ensure, init, check] {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["ensure", "init", "lifecycle"]);
    }

    /// Refresh calls that arrive while initialisations keep coming wait; as soon as the
    /// initialisations stop, the refresh proceeds (it is slowed, never stopped).
    #[tokio::test(start_paused = true)]
    async fn a_refresh_waits_for_initialisation_but_is_not_lost() {
        let cloud = Arc::new(Recording::default());
        let budgeted = BudgetedProvider::new(
            cloud.clone(),
            &BudgetConfig {
                rate_limit: Some((10.0, 1)),
                timeout: None,
            },
            &MetricsRegistry::new(),
        );
        let refresh = {
            let budgeted = budgeted.clone();
            tokio::spawn(in_lane(Lane::Refresh, async move {
                let v2 = budgeted.instances_v2().unwrap();
                for i in 0..3 {
                    v2.instance_metadata(&ccm_core::NodeView::from_node(&node(&format!(
                        "refresh-{i}"
                    ))))
                    .await
                    .unwrap();
                }
            }))
        };
        let init = {
            let budgeted = budgeted.clone();
            tokio::spawn(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for i in 0..30 {
                    let budgeted = budgeted.clone();
                    tasks.spawn(async move {
                        let v2 = budgeted.instances_v2().unwrap();
                        v2.instance_metadata(&ccm_core::NodeView::from_node(&node(&format!(
                            "init-{i:02}"
                        ))))
                        .await
                        .unwrap();
                    });
                }
                tasks.join_all().await;
            })
        };
        init.await.unwrap();
        refresh.await.unwrap();
        let order = cloud.0.lock().unwrap().clone();
        let last_init = order.iter().rposition(|n| n.starts_with("init")).unwrap();
        let refresh_before = order[..last_init]
            .iter()
            .filter(|n| n.starts_with("refresh"))
            .count();
        // At most the refresh calls admitted before the initialisations arrived (the one
        // with the burst's token and the one holding the next reservation) went before the
        // last initialisation; the third waited, and was still made.
        assert!(refresh_before <= 2, "{order:?}");
        assert_eq!(order.len(), 33);
    }
}
