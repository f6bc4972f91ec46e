//! Random fault injection ([`ApiFaults`]): a share of requests, chosen per verb and resource
//! by a seeded generator, is answered `500`, `429` with `Retry-After`, `409 Conflict` (writes
//! only), `410 Gone` (watches only, as after an etcd compaction), hangs before it is served, or
//! (watches only) has its stream closed mid-way. Off unless [`ApiServer::set_faults`] is
//! called; the `ccm-apiserver` binary takes the same rules as `--fault` flags.
//!
//! [`ApiServer::set_faults`]: super::ApiServer::set_faults

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::status::ApiError;
use super::{RequestRecord, lock};

/// What an [`ApiFaultRule`] does to a request it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ApiFaultKind {
    /// `500 InternalError`, nothing done.
    InternalError,
    /// `429 TooManyRequests` with `Retry-After` ([`ApiFaults::retry_after`]), nothing done.
    /// kube's client does not retry it by itself; the caller's backoff does.
    TooManyRequests,
    /// `409 Conflict` on a write (create, update, patch, delete), nothing done. Other verbs are
    /// never picked.
    Conflict,
    /// A watch answered as an expired one (`200` with one `ERROR` event carrying `410 Gone`):
    /// the informer must list again. Other verbs are never picked.
    WatchGone,
    /// The request waits [`ApiFaults::hang_for`] before it is served (as a stuck etcd or a
    /// slow admission webhook would make it); past the client's timeout, the client gives up
    /// while the request may still take effect.
    Hang,
    /// A watch stream is closed after a random time within [`ApiFaults::close_watches_within`]
    /// (a load balancer or the API server dropping the connection). Other verbs are never
    /// picked.
    WatchClose,
}

impl ApiFaultKind {
    /// Every kind, in the order of the `--fault` grammar's table.
    pub const ALL: [ApiFaultKind; 6] = [
        ApiFaultKind::InternalError,
        ApiFaultKind::TooManyRequests,
        ApiFaultKind::Conflict,
        ApiFaultKind::WatchGone,
        ApiFaultKind::Hang,
        ApiFaultKind::WatchClose,
    ];

    /// The kind's name in the `--fault` grammar and in [`ApiServer::fault_counts`](super::ApiServer::fault_counts):
    /// `500`, `429`, `409`, `410`, `hang`, `close`.
    pub fn name(self) -> &'static str {
        match self {
            ApiFaultKind::InternalError => "500",
            ApiFaultKind::TooManyRequests => "429",
            ApiFaultKind::Conflict => "409",
            ApiFaultKind::WatchGone => "410",
            ApiFaultKind::Hang => "hang",
            ApiFaultKind::WatchClose => "close",
        }
    }

    /// Whether a request with this verb can get this fault.
    fn applies_to(self, verb: &str) -> bool {
        match self {
            ApiFaultKind::Conflict => {
                matches!(verb, "create" | "update" | "patch" | "delete")
            }
            ApiFaultKind::WatchGone | ApiFaultKind::WatchClose => verb == "watch",
            ApiFaultKind::InternalError | ApiFaultKind::TooManyRequests | ApiFaultKind::Hang => {
                true
            }
        }
    }
}

/// One rule: a share `rate` (0 to 1) of the requests matching `verb` and `resource` gets the
/// fault `kind`.
///
/// As text (the `ccm-apiserver --fault` flag): `KIND:RATE[:VERB[:RESOURCE]]`, KIND one of
/// `500`, `429`, `409`, `410`, `hang`, `close`; VERB and RESOURCE (`nodes`, `services/status`)
/// default to `*`:
///
/// ```
/// use ccm_testing::apiserver::{ApiFaultKind, ApiFaultRule};
///
/// let rule: ApiFaultRule = "429:0.1:list:nodes".parse().unwrap();
/// assert_eq!(rule, ApiFaultRule::new(ApiFaultKind::TooManyRequests, 0.1).verb("list").resource("nodes"));
/// assert!("429:2".parse::<ApiFaultRule>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ApiFaultRule {
    kind: ApiFaultKind,
    rate: f64,
    verb: String,
    resource: String,
}

impl ApiFaultRule {
    /// A rule for every verb and resource the kind applies to. A rate outside 0 to 1 is
    /// clamped (NaN is 0).
    pub fn new(kind: ApiFaultKind, rate: f64) -> Self {
        ApiFaultRule {
            kind,
            rate: if rate.is_nan() {
                0.0
            } else {
                rate.clamp(0.0, 1.0)
            },
            verb: "*".to_owned(),
            resource: "*".to_owned(),
        }
    }

    /// Only requests with this verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`, or `*`).
    pub fn verb(mut self, verb: &str) -> Self {
        verb.clone_into(&mut self.verb);
        self
    }

    /// Only requests on this resource (`nodes`, `services/status`, or `*`).
    pub fn resource(mut self, resource: &str) -> Self {
        resource.clone_into(&mut self.resource);
        self
    }

    /// The fault this rule injects.
    pub fn kind(&self) -> ApiFaultKind {
        self.kind
    }

    fn matches(&self, r: &RequestRecord) -> bool {
        self.kind.applies_to(&r.verb)
            && (self.verb == "*" || self.verb == r.verb)
            && (self.resource == "*" || self.resource == r.resource_path())
    }
}

/// Why a `--fault` rule cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid fault rule {rule:?}: {reason} (expected KIND:RATE[:VERB[:RESOURCE]], KIND one of 500, 429, 409, 410, hang, close; RATE from 0 to 1)"
)]
pub struct ApiFaultRuleError {
    rule: String,
    reason: String,
}

impl FromStr for ApiFaultRule {
    type Err = ApiFaultRuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ApiFaultRuleError {
            rule: s.to_owned(),
            reason: reason.to_owned(),
        };
        let mut parts = s.split(':');
        let kind = parts.next().unwrap_or_default().trim();
        let kind = ApiFaultKind::ALL
            .into_iter()
            .find(|k| k.name() == kind)
            .ok_or_else(|| err("unknown kind"))?;
        let rate: f64 = parts
            .next()
            .ok_or_else(|| err("no rate"))?
            .trim()
            .parse()
            .map_err(|_| err("the rate is not a number"))?;
        if !(0.0..=1.0).contains(&rate) {
            return Err(err("the rate is not between 0 and 1"));
        }
        let mut rule = ApiFaultRule::new(kind, rate);
        for (i, part) in parts.enumerate() {
            let part = part.trim();
            if part.is_empty() || part.chars().any(char::is_whitespace) {
                return Err(err("an empty verb or resource"));
            }
            match i {
                0 => rule.verb = part.to_owned(),
                1 => rule.resource = part.to_owned(),
                _ => return Err(err("too many parts")),
            }
        }
        Ok(rule)
    }
}

/// The fault injection of an [`ApiServer`](super::ApiServer): rules, their durations and the
/// seed of the generator that picks the requests. Everything is off by default.
///
/// ```
/// use std::time::Duration;
/// use ccm_testing::apiserver::{ApiFaultKind, ApiFaultRule, ApiFaults};
///
/// let faults = ApiFaults::seeded(7)
///     .rule(ApiFaultRule::new(ApiFaultKind::InternalError, 0.05))
///     .rule(ApiFaultRule::new(ApiFaultKind::TooManyRequests, 0.05).verb("patch"))
///     .rule(ApiFaultRule::new(ApiFaultKind::Conflict, 0.1).resource("services"))
///     .rule(ApiFaultRule::new(ApiFaultKind::WatchClose, 0.5))
///     .retry_after(Duration::from_secs(1))
///     .close_watches_within(Duration::from_secs(3));
/// # let _ = faults;
/// ```
///
/// The rules are consulted in order; the first that picks a request decides its fault. The
/// generator is seeded, so the sequence of decisions is the same on every run; which request
/// gets which decision depends on the order in which concurrent requests arrive.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiFaults {
    seed: u64,
    rules: Vec<ApiFaultRule>,
    retry_after: Duration,
    hang: Duration,
    close_within: Duration,
}

impl Default for ApiFaults {
    fn default() -> Self {
        ApiFaults::seeded(0)
    }
}

impl ApiFaults {
    /// No rules yet, with this seed; `Retry-After: 1`, hangs of 5 s, watches closed within 5 s.
    pub fn seeded(seed: u64) -> Self {
        ApiFaults {
            seed,
            rules: Vec::new(),
            retry_after: Duration::from_secs(1),
            hang: Duration::from_secs(5),
            close_within: Duration::from_secs(5),
        }
    }

    /// Adds a rule (consulted after those added before).
    pub fn rule(mut self, rule: ApiFaultRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// The `Retry-After` of injected `429`s (whole seconds, rounded up; default 1 s).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// How long a [`ApiFaultKind::Hang`] request waits before it is served (default 5 s).
    pub fn hang_for(mut self, hang: Duration) -> Self {
        self.hang = hang;
        self
    }

    /// A watch picked by [`ApiFaultKind::WatchClose`] ends after a random time up to this
    /// (default 5 s).
    pub fn close_watches_within(mut self, within: Duration) -> Self {
        self.close_within = within;
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[ApiFaultRule] {
        &self.rules
    }
}

/// The armed faults of a running server, with their generator and what they injected.
#[derive(Debug, Default)]
pub(crate) struct Armed {
    inner: Mutex<Option<(ApiFaults, ChaCha8Rng)>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

/// What the armed faults do to one request.
#[derive(Debug, Default)]
pub(crate) struct Roll {
    /// Answer with this error instead of serving the request.
    pub(crate) error: Option<ApiError>,
    /// Wait this long before serving.
    pub(crate) delay: Option<Duration>,
    /// End the response body after this long.
    cut_after: Option<Duration>,
}

impl Armed {
    pub(crate) fn set(&self, faults: Option<ApiFaults>) {
        *lock(&self.inner) = faults.map(|f| {
            let rng = ChaCha8Rng::seed_from_u64(f.seed);
            (f, rng)
        });
    }

    pub(crate) fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.counts)
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect()
    }

    /// Decides the fault of one request (none when faults are off or no rule picks it).
    pub(crate) fn roll(&self, r: &RequestRecord) -> Roll {
        let mut guard = lock(&self.inner);
        let Some((faults, rng)) = guard.as_mut() else {
            return Roll::default();
        };
        let Some(kind) = faults
            .rules
            .iter()
            .find(|rule| rule.matches(r) && rng.random_bool(rule.rate))
            .map(ApiFaultRule::kind)
        else {
            return Roll::default();
        };
        let mut roll = Roll::default();
        match kind {
            ApiFaultKind::InternalError => {
                roll.error = Some(super::http::injected_error(500, None));
            }
            ApiFaultKind::TooManyRequests => {
                roll.error = Some(super::http::injected_error(429, Some(faults.retry_after)));
            }
            ApiFaultKind::Conflict => roll.error = Some(conflict(r)),
            ApiFaultKind::WatchGone => {
                roll.error = Some(ApiError::expired(
                    "The resourceVersion for the provided watch is too old.",
                ));
            }
            ApiFaultKind::Hang => roll.delay = Some(faults.hang),
            ApiFaultKind::WatchClose => {
                let max = faults.close_within.as_millis().max(1);
                let ms = rng.random_range(0..=max);
                roll.cut_after = Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
            }
        }
        drop(guard);
        *lock(&self.counts).entry(kind.name()).or_default() += 1;
        roll
    }
}

/// kube-apiserver's words for a write that lost a race.
fn conflict(r: &RequestRecord) -> ApiError {
    let name = r.name.as_deref().unwrap_or_default();
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again (injected)",
            r.resource
        ),
    )
}

impl Roll {
    /// The response as the client sees it: cut short when the roll says so.
    pub(crate) fn finish(self, resp: Response) -> Response {
        let Some(after) = self.cut_after else {
            return resp;
        };
        let (parts, body) = resp.into_parts();
        let cut = body
            .into_data_stream()
            .take_until(tokio::time::sleep(after));
        Response::from_parts(parts, Body::from_stream(cut))
    }
}
