//! Which Services the service controller serves: the load-balancer classes the provider
//! declares ([`CloudProvider::load_balancer_classes`](ccm_core::CloudProvider::load_balancer_classes)),
//! narrowed or renamed by the operator's `--load-balancer-classes`. Pure: the one place that
//! maps a Service's `spec.loadBalancerClass` to "ours, with this implementation" or "not ours".

use std::collections::BTreeMap;
use std::fmt;

use ccm_core::{LoadBalancerClasses, check_load_balancer_class};
use k8s_openapi::api::core::v1::Service;

/// How `--load-balancer-classes` writes "Services without a class".
pub const NO_CLASS: &str = "-";

/// One entry of `--load-balancer-classes`: the Services of `class` are served with the
/// provider's implementation of its declared `provider_class`.
///
/// Written `CLASS` (served with the provider's implementation of the same class) or
/// `CLASS=PROVIDER_CLASS` (renamed), where `-` stands for "no class" on either side:
/// `--load-balancer-classes=-,acme.example/internal` serves Services without a class and those
/// of `acme.example/internal`; `--load-balancer-classes=team-b.example/lb=-` serves only
/// Services of class `team-b.example/lb`, with the implementation the provider uses for
/// Services without a class (so a second instance of one CCM can serve a class of its own).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServedClass {
    /// The `spec.loadBalancerClass` of the Services served; `None`: Services without a class.
    pub class: Option<String>,
    /// The class the provider declares whose implementation serves them; `None`: the
    /// provider's implementation for Services without a class.
    pub provider_class: Option<String>,
}

fn class_text(class: Option<&str>) -> &str {
    class.unwrap_or(NO_CLASS)
}

impl fmt::Display for ServedClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = class_text(self.class.as_deref());
        if self.class == self.provider_class {
            f.write_str(class)
        } else {
            write!(f, "{class}={}", class_text(self.provider_class.as_deref()))
        }
    }
}

fn parse_class(text: &str) -> Result<Option<String>, String> {
    let text = text.trim();
    if text == NO_CLASS {
        return Ok(None);
    }
    check_load_balancer_class(text)
        .map_err(|e| format!("{e} (write '{NO_CLASS}' for Services without a class)"))?;
    Ok(Some(text.to_owned()))
}

impl ServedClass {
    /// Parses the value of `--load-balancer-classes`: a comma-separated list of `CLASS` or
    /// `CLASS=PROVIDER_CLASS`, `-` meaning "no class". Each class must be a valid
    /// `spec.loadBalancerClass`, and no class may be served twice.
    pub fn parse_list(value: &str) -> Result<Vec<ServedClass>, String> {
        if value.trim().is_empty() {
            return Err(format!(
                "must name at least one class ('{NO_CLASS}' for Services without a class); to serve no load balancer, disable the controller with --controllers=*,-service-lb-controller"
            ));
        }
        let mut served: Vec<ServedClass> = Vec::new();
        for entry in value.split(',') {
            let (class, provider_class) = match entry.split_once('=') {
                Some((class, provider)) => (parse_class(class)?, parse_class(provider)?),
                None => {
                    let class = parse_class(entry)?;
                    (class.clone(), class)
                }
            };
            if served.iter().any(|s| s.class == class) {
                return Err(format!(
                    "class {:?} is listed twice",
                    class_text(class.as_deref())
                ));
            }
            served.push(ServedClass {
                class,
                provider_class,
            });
        }
        Ok(served)
    }
}

/// The classes the controller serves, each with the provider's declared class whose
/// implementation serves it. The [`Default`] is Go's: Services without a class only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServedClasses {
    /// Service class (`None`: without a class) → the provider's declared class.
    routes: BTreeMap<Option<String>, Option<String>>,
}

impl Default for ServedClasses {
    fn default() -> Self {
        ServedClasses {
            routes: BTreeMap::from([(None, None)]),
        }
    }
}

impl ServedClasses {
    /// What the controller serves: the operator's `--load-balancer-classes` when given (each
    /// provider class must be one the provider declares), else every class the provider
    /// declares, under its own name. The error names the problem and what the provider
    /// declares.
    pub(crate) fn resolve(
        declared: &LoadBalancerClasses,
        operator: Option<&[ServedClass]>,
    ) -> Result<Self, String> {
        for class in declared.classes() {
            check_load_balancer_class(class)
                .map_err(|e| format!("the cloud provider declares an {e}"))?;
        }
        let routes: BTreeMap<_, _> = match operator {
            None => declared
                .entries()
                .map(|c| (c.map(str::to_owned), c.map(str::to_owned)))
                .collect(),
            Some(entries) => {
                let mut routes = BTreeMap::new();
                for entry in entries {
                    if !declared.serves(entry.provider_class.as_deref()) {
                        return Err(format!(
                            "--load-balancer-classes: {entry}: the cloud provider serves no {}; it declares {}",
                            match &entry.provider_class {
                                None => "Services without a class".to_owned(),
                                Some(c) => format!("class {c:?}"),
                            },
                            describe(declared)
                        ));
                    }
                    if routes
                        .insert(entry.class.clone(), entry.provider_class.clone())
                        .is_some()
                    {
                        return Err(format!(
                            "--load-balancer-classes: class {:?} is listed twice",
                            class_text(entry.class.as_deref())
                        ));
                    }
                }
                routes
            }
        };
        if routes.is_empty() {
            return Err(
                "the cloud provider declares no load-balancer class and serves no Service without a class".to_owned(),
            );
        }
        Ok(ServedClasses { routes })
    }

    /// Serves exactly these: for tests.
    #[cfg(test)]
    pub(crate) fn of(entries: &[(Option<&str>, Option<&str>)]) -> Self {
        ServedClasses {
            routes: entries
                .iter()
                .map(|(c, p)| (c.map(str::to_owned), p.map(str::to_owned)))
                .collect(),
        }
    }

    /// The provider class whose implementation serves Services of `class`, or `None` (the
    /// outer option) when this controller does not serve them.
    pub(crate) fn provider_class(&self, class: Option<&str>) -> Option<Option<&str>> {
        self.routes
            .get(&class.map(str::to_owned))
            .map(Option::as_deref)
    }

    /// Whether Services of `class` (`None`: without a class) are served.
    pub(crate) fn serves_class(&self, class: Option<&str>) -> bool {
        self.provider_class(class).is_some()
    }

    /// The distinct provider classes behind the served classes (each implementation once).
    pub(crate) fn provider_classes(&self) -> Vec<Option<&str>> {
        let mut classes: Vec<Option<&str>> = self.routes.values().map(Option::as_deref).collect();
        classes.sort();
        classes.dedup();
        classes
    }

    /// Each served class with the provider class behind it.
    pub(crate) fn routes(&self) -> impl Iterator<Item = (Option<&str>, Option<&str>)> {
        self.routes
            .iter()
            .map(|(class, provider_class)| (class.as_deref(), provider_class.as_deref()))
    }

    /// The provider classes whose implementations may hold the load balancer of `service`,
    /// which is being cleaned up: the one of the class it was last handled under (`handled`,
    /// when that class is served), else the one of its own class (when served), else every
    /// implementation: a type change away from LoadBalancer clears the class, and then
    /// nothing says which implementation made the load balancer (each is asked, and deletes
    /// what it has).
    pub(crate) fn cleanup_provider_classes(
        &self,
        service: &Service,
        handled: Option<&Service>,
    ) -> Vec<Option<&str>> {
        let served = |s: &Service| {
            is_load_balancer_type(s)
                .then(|| self.provider_class(class_of(s)))
                .flatten()
        };
        match handled.and_then(served).or_else(|| served(service)) {
            Some(provider_class) => vec![provider_class],
            None => self.provider_classes(),
        }
    }

    /// The served classes, as `--load-balancer-classes` writes them (for logs).
    pub(crate) fn describe(&self) -> String {
        self.routes
            .iter()
            .map(|(class, provider_class)| {
                ServedClass {
                    class: class.clone(),
                    provider_class: provider_class.clone(),
                }
                .to_string()
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A provider's declaration as `--load-balancer-classes` writes it: `-,acme.example/a`.
fn describe(declared: &LoadBalancerClasses) -> String {
    let entries: Vec<&str> = declared.entries().map(class_text).collect();
    if entries.is_empty() {
        "nothing".to_owned()
    } else {
        entries.join(",")
    }
}

fn is_load_balancer_type(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer"))
}

/// An Event note, with the Service's class when it has one: `Ensured load balancer` stays
/// Go's note for a Service without a class; `Ensured load balancer (class
/// acme.example/internal)` tells which implementation acted when several serve one cluster.
pub(crate) fn note_with_class(note: &str, service: &Service) -> String {
    match class_of(service) {
        Some(class) => format!("{note} (class {class})"),
        None => note.to_owned(),
    }
}

/// The Service's `spec.loadBalancerClass` (`None`: without a class, or no spec).
pub(crate) fn class_of(service: &Service) -> Option<&str> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(class: Option<&str>, provider_class: Option<&str>) -> ServedClass {
        ServedClass {
            class: class.map(str::to_owned),
            provider_class: provider_class.map(str::to_owned),
        }
    }

    #[test]
    fn parses_the_flag() {
        assert_eq!(
            ServedClass::parse_list("-,acme.example/a,team.example/b=-,x.example/c=acme.example/a")
                .unwrap(),
            vec![
                entry(None, None),
                entry(Some("acme.example/a"), Some("acme.example/a")),
                entry(Some("team.example/b"), None),
                entry(Some("x.example/c"), Some("acme.example/a")),
            ]
        );
        for (bad, says) in [
            ("", "at least one class"),
            ("-,-", "listed twice"),
            ("a.example/x,Bad Class", "\"Bad Class\""),
            ("a.example/x=", "\"\""),
        ] {
            let err = ServedClass::parse_list(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn displays_as_written() {
        let list = "-,acme.example/a,team.example/b=-";
        let written: Vec<String> = ServedClass::parse_list(list)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(written.join(","), list);
    }

    #[test]
    fn without_the_flag_serves_what_the_provider_declares() {
        let go = ServedClasses::resolve(&LoadBalancerClasses::default(), None).unwrap();
        assert_eq!(go, ServedClasses::default());
        assert!(go.serves_class(None));
        assert!(!go.serves_class(Some("acme.example/a")));

        let declared = LoadBalancerClasses::without_class().with_class("acme.example/a");
        let both = ServedClasses::resolve(&declared, None).unwrap();
        assert_eq!(
            both.provider_class(Some("acme.example/a")),
            Some(Some("acme.example/a"))
        );
        assert_eq!(both.provider_class(None), Some(None));
        assert_eq!(both.describe(), "-,acme.example/a");
    }

    #[test]
    fn the_flag_narrows_and_renames() {
        let declared = LoadBalancerClasses::without_class().with_class("acme.example/a");
        let narrowed = ServedClasses::resolve(
            &declared,
            Some(&ServedClass::parse_list("acme.example/a").unwrap()),
        )
        .unwrap();
        assert!(!narrowed.serves_class(None));
        assert!(narrowed.serves_class(Some("acme.example/a")));

        let renamed = ServedClasses::resolve(
            &declared,
            Some(&ServedClass::parse_list("team.example/b=-,team.example/c=-").unwrap()),
        )
        .unwrap();
        assert!(!renamed.serves_class(None));
        assert_eq!(renamed.provider_class(Some("team.example/b")), Some(None));
        assert_eq!(renamed.provider_classes(), vec![None]);
    }

    #[test]
    fn cleanup_asks_the_implementation_it_was_handled_with() {
        let classes =
            ServedClasses::of(&[(None, None), (Some("a.example/x"), Some("a.example/p"))]);
        let classed = Service {
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_class: Some("a.example/x".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut cluster_ip = classed.clone();
        if let Some(spec) = cluster_ip.spec.as_mut() {
            spec.type_ = Some("ClusterIP".into());
            spec.load_balancer_class = None;
        }
        assert_eq!(
            classes.cleanup_provider_classes(&classed, None),
            vec![Some("a.example/p")]
        );
        assert_eq!(
            classes.cleanup_provider_classes(&cluster_ip, Some(&classed)),
            vec![Some("a.example/p")]
        );
        // Nothing says whose it was: every implementation.
        assert_eq!(
            classes.cleanup_provider_classes(&cluster_ip, None),
            vec![None, Some("a.example/p")]
        );
        assert_eq!(
            note_with_class("Ensured load balancer", &cluster_ip),
            "Ensured load balancer"
        );
        assert_eq!(
            note_with_class("Ensured load balancer", &classed),
            "Ensured load balancer (class a.example/x)"
        );
    }

    #[test]
    fn a_class_the_provider_does_not_declare_is_refused_by_name() {
        let err = ServedClasses::resolve(
            &LoadBalancerClasses::default(),
            Some(&ServedClass::parse_list("acme.example/a").unwrap()),
        )
        .unwrap_err();
        assert!(err.contains("\"acme.example/a\""), "{err}");
        assert!(err.contains("it declares -"), "{err}");

        let err = ServedClasses::resolve(
            &LoadBalancerClasses::none().with_class("acme.example/a"),
            Some(&ServedClass::parse_list("-").unwrap()),
        )
        .unwrap_err();
        assert!(err.contains("no Services without a class"), "{err}");

        let err = ServedClasses::resolve(&LoadBalancerClasses::none(), None).unwrap_err();
        assert!(err.contains("declares no load-balancer class"), "{err}");

        let err =
            ServedClasses::resolve(&LoadBalancerClasses::none().with_class("bad class"), None)
                .unwrap_err();
        assert!(err.contains("declares an invalid"), "{err}");
    }
}
