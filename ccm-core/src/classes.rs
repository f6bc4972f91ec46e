//! Load-balancer classes: which `type: LoadBalancer` Services a provider serves.
//!
//! A Service chooses its load-balancer implementation with `spec.loadBalancerClass` (GA since
//! Kubernetes 1.24). Go's service controller serves only Services **without** a class. A
//! provider here declares, with [`CloudProvider::load_balancer_classes`], the classes it serves
//! and whether it also serves Services without one; the default is exactly Go's: Services
//! without a class, and no class. See `docs/writing-a-provider.md`, "Load-balancer classes".
//!
//! [`CloudProvider::load_balancer_classes`]: crate::CloudProvider::load_balancer_classes

use std::collections::BTreeSet;

/// The load-balancer classes a provider serves, and whether it serves Services without a
/// class: the answer of
/// [`CloudProvider::load_balancer_classes`](crate::CloudProvider::load_balancer_classes).
///
/// The [`Default`] is [`LoadBalancerClasses::without_class`]: Services without
/// `spec.loadBalancerClass` only, as Go's service controller and every 0.2 provider.
///
/// ```
/// use ccm_core::LoadBalancerClasses;
///
/// // Services without a class (as today) and those of class `acme.example/internal`.
/// let classes = LoadBalancerClasses::without_class().with_class("acme.example/internal");
/// assert!(classes.serves(None));
/// assert!(classes.serves(Some("acme.example/internal")));
/// assert!(!classes.serves(Some("other.example/lb")));
///
/// // Only one class: Services without a class are left to another controller.
/// let only = LoadBalancerClasses::none().with_class("acme.example/alb");
/// assert!(!only.serves(None));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoadBalancerClasses {
    without_class: bool,
    classes: BTreeSet<String>,
}

impl Default for LoadBalancerClasses {
    fn default() -> Self {
        Self::without_class()
    }
}

impl LoadBalancerClasses {
    /// Services without a class, and no class: Go's behaviour and the default.
    pub fn without_class() -> Self {
        LoadBalancerClasses {
            without_class: true,
            classes: BTreeSet::new(),
        }
    }

    /// Nothing yet: neither Services without a class nor any class. Add classes with
    /// [`with_class`](Self::with_class).
    pub fn none() -> Self {
        LoadBalancerClasses {
            without_class: false,
            classes: BTreeSet::new(),
        }
    }

    /// These classes served too. The name must be a valid `spec.loadBalancerClass` (see
    /// [`check_load_balancer_class`]); the framework refuses to start with an invalid one and
    /// the conformance suite reports it.
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.classes.insert(class.into());
        self
    }

    /// Services without a class served too.
    pub fn and_without_class(mut self) -> Self {
        self.without_class = true;
        self
    }

    /// Whether Services without `spec.loadBalancerClass` are served.
    pub fn serves_without_class(&self) -> bool {
        self.without_class
    }

    /// The classes served, sorted (without the "no class" entry).
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.classes.iter().map(String::as_str)
    }

    /// Whether a Service of `class` (`None`: without a class) is served.
    pub fn serves(&self, class: Option<&str>) -> bool {
        match class {
            None => self.without_class,
            Some(class) => self.classes.contains(class),
        }
    }

    /// Every entry served: `None` for Services without a class (first, when served), then
    /// each class.
    pub fn entries(&self) -> impl Iterator<Item = Option<&str>> {
        self.without_class
            .then_some(None)
            .into_iter()
            .chain(self.classes().map(Some))
    }

    /// Whether nothing at all is served.
    pub fn is_empty(&self) -> bool {
        !self.without_class && self.classes.is_empty()
    }
}

/// Why a string is not a valid `spec.loadBalancerClass`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid load-balancer class {class:?}: {reason}")]
pub struct LoadBalancerClassError {
    /// The rejected value.
    pub class: String,
    /// What is wrong with it (the API server's rule).
    pub reason: &'static str,
}

/// Checks that `class` is a value the API server accepts in `spec.loadBalancerClass`: a
/// Kubernetes qualified name, `[prefix/]name`, the prefix a lowercase DNS subdomain of at most
/// 253 characters, the name at most 63 alphanumerics, `-`, `_` or `.`, starting and ending
/// with an alphanumeric (e.g. `acme.example/internal`). Kubernetes reserves names without a
/// prefix for end users; a provider should declare prefixed ones.
pub fn check_load_balancer_class(class: &str) -> Result<(), LoadBalancerClassError> {
    let fail = |reason| {
        Err(LoadBalancerClassError {
            class: class.to_owned(),
            reason,
        })
    };
    let (prefix, name) = match class.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, class),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return fail("the prefix before '/' must not be empty");
        }
        if !is_dns_subdomain(prefix) {
            return fail(
                "the prefix must be a lowercase DNS subdomain (a-z, 0-9, '-' and '.', at most 253 characters, e.g. 'example.com')",
            );
        }
    }
    if name.is_empty() {
        return fail("the name must not be empty");
    }
    if name.len() > 63 {
        return fail("the name (after any prefix) must be at most 63 characters");
    }
    let inner_ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = name
        .as_bytes()
        .first()
        .is_some_and(u8::is_ascii_alphanumeric)
        && name
            .as_bytes()
            .last()
            .is_some_and(u8::is_ascii_alphanumeric);
    if !inner_ok || !ends_ok {
        return fail(
            "the name must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric",
        );
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_gos_behaviour() {
        let d = LoadBalancerClasses::default();
        assert!(d.serves(None));
        assert!(!d.serves(Some("acme.example/lb")));
        assert_eq!(d.entries().collect::<Vec<_>>(), vec![None]);
        assert!(LoadBalancerClasses::none().is_empty());
    }

    #[test]
    fn entries_list_no_class_first_then_sorted_classes() {
        let c = LoadBalancerClasses::without_class()
            .with_class("z.example/b")
            .with_class("a.example/a")
            .with_class("a.example/a");
        assert_eq!(
            c.entries().collect::<Vec<_>>(),
            vec![None, Some("a.example/a"), Some("z.example/b")]
        );
    }

    #[test]
    fn class_names_follow_the_api_servers_rule() {
        for ok in [
            "acme.example/internal",
            "internal",
            "a",
            "example.com/My_Class.1",
        ] {
            assert!(check_load_balancer_class(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/x",
            "Example.com/x",
            "acme.example/",
            "acme.example/-x",
            "x y",
            "a/b/c",
            &"n".repeat(64),
        ] {
            assert!(check_load_balancer_class(bad).is_err(), "{bad:?}");
        }
        let err = check_load_balancer_class("bad class").unwrap_err();
        assert!(err.to_string().contains("\"bad class\""), "{err}");
    }
}
