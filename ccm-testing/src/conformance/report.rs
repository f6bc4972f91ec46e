//! What a suite run reports: one [`CheckResult`] per check, its [`Outcome`], and for a skip
//! its [`SkipKind`].

use std::fmt;

use super::Check;

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The provider keeps the contract.
    Passed,
    /// The provider breaks the contract.
    Failed {
        /// What the contract requires.
        expected: String,
        /// What the provider did.
        observed: String,
    },
    /// The check did not run.
    Skipped {
        /// Which kind of skip: the capability is not offered, the input lacks something, or
        /// the caller skipped it.
        kind: SkipKind,
        /// Why, in words.
        reason: String,
    },
}

/// Why a check was skipped, so a vendor can tell "my provider does not offer this" from "the
/// check could not run" ([`Report::assert_nothing_skipped_that_is_offered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SkipKind {
    /// The provider does not offer the capability the check needs: its accessor answers
    /// `None` (e.g. no `Routes`), or the call answers `NotImplemented` or
    /// `ImplementedElsewhere`.
    NotOffered,
    /// The input lacks what the check needs (no Service, no route CIDR, no missing node, ...):
    /// the provider may offer the capability; give the input to run the check.
    InputMissing,
    /// The caller named the check in [`Suite::skip`](super::Suite::skip).
    ByCaller,
}

impl fmt::Display for SkipKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipKind::NotOffered => "capability not offered",
            SkipKind::InputMissing => "input missing",
            SkipKind::ByCaller => "skipped by the caller",
        })
    }
}

impl Outcome {
    /// True for [`Outcome::Passed`].
    pub fn is_passed(&self) -> bool {
        matches!(self, Outcome::Passed)
    }

    /// True for [`Outcome::Failed`].
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed { .. })
    }

    /// True for [`Outcome::Skipped`].
    pub fn is_skipped(&self) -> bool {
        matches!(self, Outcome::Skipped { .. })
    }

    /// The kind of skip, for [`Outcome::Skipped`].
    pub fn skip_kind(&self) -> Option<SkipKind> {
        match self {
            Outcome::Skipped { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// The check.
    pub check: Check,
    /// What happened.
    pub outcome: Outcome,
    /// Remarks that do not change the outcome, e.g. a cleanup that failed.
    pub notes: Vec<String>,
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Outcome::Passed => write!(f, "PASS {}", self.check)?,
            Outcome::Failed { expected, observed } => write!(
                f,
                "FAIL {}\n     expected: {expected}\n     observed: {observed}",
                self.check
            )?,
            Outcome::Skipped {
                kind: SkipKind::ByCaller,
                ..
            } => write!(f, "SKIP {} ({})", self.check, SkipKind::ByCaller)?,
            Outcome::Skipped { kind, reason } => {
                write!(f, "SKIP {} ({kind}: {reason})", self.check)?;
            }
        }
        for note in &self.notes {
            write!(f, "\n     note: {note}")?;
        }
        Ok(())
    }
}

/// The results of a suite run, one per check, in run order. Its `Display` is the report a
/// vendor reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// One result per check.
    pub results: Vec<CheckResult>,
}

impl Report {
    /// The passed checks.
    pub fn passed(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.outcome.is_passed())
    }

    /// The failed checks.
    pub fn failed(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.outcome.is_failed())
    }

    /// The skipped checks.
    pub fn skipped(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.outcome.is_skipped())
    }

    /// The skipped checks whose capability the provider may offer: every skip but
    /// [`SkipKind::NotOffered`] and [`SkipKind::ByCaller`] (the caller named those itself).
    /// A check added to the suite later shows up here only when the provider offers what it
    /// checks and the input does not let it run.
    pub fn skipped_but_maybe_offered(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| {
            r.outcome
                .skip_kind()
                .is_some_and(|k| !matches!(k, SkipKind::NotOffered | SkipKind::ByCaller))
        })
    }

    /// Panics with the whole report when a check failed, or when a check was skipped for
    /// another reason than "capability not offered" or the caller's [`Suite::skip`](super::Suite::skip): the
    /// assertion for a vendor's test that holds when the suite gains checks, where an exact
    /// list of skipped checks would break (docs/testing.md, "Pinning a conformance report").
    #[track_caller]
    pub fn assert_nothing_skipped_that_is_offered(&self) {
        self.assert_success();
        let maybe_offered: Vec<String> = self
            .skipped_but_maybe_offered()
            .map(ToString::to_string)
            .collect();
        assert!(
            maybe_offered.is_empty(),
            "provider conformance: {} check(s) skipped that the provider may offer (give the \
             input they name, or Suite::skip them):\n{}\n\n{self}",
            maybe_offered.len(),
            maybe_offered.join("\n")
        );
    }

    /// True when no check failed.
    pub fn is_success(&self) -> bool {
        self.failed().next().is_none()
    }

    /// The result of one check, if it was run.
    pub fn get(&self, check: Check) -> Option<&CheckResult> {
        self.results.iter().find(|r| r.check == check)
    }

    /// Panics with the whole report when a check failed; for vendors' tests.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.is_success(), "provider conformance failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let not_offered = self
            .skipped()
            .filter(|r| r.outcome.skip_kind() == Some(SkipKind::NotOffered))
            .count();
        writeln!(
            f,
            "provider conformance: {} passed, {} failed, {} skipped ({not_offered} not offered)",
            self.passed().count(),
            self.failed().count(),
            self.skipped().count()
        )?;
        for result in &self.results {
            writeln!(f, "{result}")?;
        }
        Ok(())
    }
}
