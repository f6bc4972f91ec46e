//! The `--controllers` grammar (Go's `IsControllerEnabled`).
//!
//! Items are evaluated in order and the first explicit mention of a controller wins: `name`
//! enables it, `-name` disables it, `*` enables every controller that is not disabled by
//! default. Without `*` and without an explicit mention, a controller is off. Aliases are
//! rewritten to canonical names (also after `-`). Unknown names are an error.

/// A controller name the grammar knows: its canonical name, its aliases, and whether `*`
/// enables it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KnownController {
    /// The canonical name, e.g. `service-lb-controller`.
    pub name: String,
    /// Other accepted names, e.g. `service`.
    pub aliases: Vec<String>,
    /// When true, `*` does not enable it; only an explicit `name` does (Go's
    /// `ControllersDisabledByDefault`).
    pub disabled_by_default: bool,
}

/// A `--controllers` value that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for --controllers: {0}")]
pub(crate) struct ControllersFlagError(pub String);

/// The parsed `--controllers` value: items with aliases rewritten to canonical names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControllerSelection {
    items: Vec<Item>,
    disabled_by_default: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Star,
    Enable(String),
    Disable(String),
}

impl ControllerSelection {
    /// Parses the items of `--controllers` against the known controllers.
    pub(crate) fn parse(
        items: &[String],
        known: &[KnownController],
    ) -> Result<Self, ControllersFlagError> {
        let resolve = |name: &str| -> Result<String, ControllersFlagError> {
            known
                .iter()
                .find(|k| k.name == name || k.aliases.iter().any(|a| a == name))
                .map(|k| k.name.clone())
                .ok_or_else(|| {
                    ControllersFlagError(format!(
                        "{name:?} is not in the list of known controllers ({})",
                        describe(known)
                    ))
                })
        };
        let mut parsed = Vec::new();
        for raw in items {
            let item = raw.trim();
            if item.is_empty() {
                if items.len() == 1 {
                    // `--controllers=` : an explicitly empty list, nothing runs.
                    continue;
                }
                return Err(ControllersFlagError(format!(
                    "empty name in {:?}",
                    items.join(",")
                )));
            }
            parsed.push(if item == "*" {
                Item::Star
            } else if let Some(name) = item.strip_prefix('-') {
                Item::Disable(resolve(name)?)
            } else {
                Item::Enable(resolve(item)?)
            });
        }
        Ok(ControllerSelection {
            items: parsed,
            disabled_by_default: known
                .iter()
                .filter(|k| k.disabled_by_default)
                .map(|k| k.name.clone())
                .collect(),
        })
    }

    /// Whether the controller with this canonical name runs.
    pub(crate) fn is_enabled(&self, canonical: &str) -> bool {
        let mut star = false;
        for item in &self.items {
            match item {
                Item::Enable(n) if n == canonical => return true,
                Item::Disable(n) if n == canonical => return false,
                Item::Star => star = true,
                _ => {}
            }
        }
        star && !self.disabled_by_default.iter().any(|n| n == canonical)
    }
}

fn describe(known: &[KnownController]) -> String {
    if known.is_empty() {
        return "none registered".to_owned();
    }
    known
        .iter()
        .map(|k| {
            if k.aliases.is_empty() {
                k.name.clone()
            } else {
                format!("{} (alias {})", k.name, k.aliases.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtins() -> Vec<KnownController> {
        [
            ("cloud-node-controller", "cloud-node"),
            ("cloud-node-lifecycle-controller", "cloud-node-lifecycle"),
            ("service-lb-controller", "service"),
            ("node-route-controller", "route"),
        ]
        .into_iter()
        .map(|(n, a)| KnownController {
            name: n.to_owned(),
            aliases: vec![a.to_owned()],
            disabled_by_default: false,
        })
        .chain([KnownController {
            name: "acme-tagger".to_owned(),
            aliases: vec![],
            disabled_by_default: true,
        }])
        .collect()
    }

    const ALL: [&str; 5] = [
        "cloud-node-controller",
        "cloud-node-lifecycle-controller",
        "service-lb-controller",
        "node-route-controller",
        "acme-tagger",
    ];

    fn enabled(flag: &str) -> Result<Vec<&'static str>, String> {
        let items: Vec<String> = flag.split(',').map(str::to_owned).collect();
        let sel = ControllerSelection::parse(&items, &builtins()).map_err(|e| e.to_string())?;
        Ok(ALL.into_iter().filter(|n| sel.is_enabled(n)).collect())
    }

    #[test]
    fn grammar_table() {
        let cases: &[(&str, &[&str])] = &[
            (
                "*",
                &[
                    "cloud-node-controller",
                    "cloud-node-lifecycle-controller",
                    "service-lb-controller",
                    "node-route-controller",
                ],
            ),
            (
                "*,-route",
                &[
                    "cloud-node-controller",
                    "cloud-node-lifecycle-controller",
                    "service-lb-controller",
                ],
            ),
            (
                "-node-route-controller,*",
                &[
                    "cloud-node-controller",
                    "cloud-node-lifecycle-controller",
                    "service-lb-controller",
                ],
            ),
            ("service", &["service-lb-controller"]),
            (
                "service-lb-controller,cloud-node",
                &["cloud-node-controller", "service-lb-controller"],
            ),
            // First explicit mention wins.
            ("service,-service", &["service-lb-controller"]),
            ("-service,service", &[]),
            (
                "-service-lb-controller,service,*",
                &[
                    "cloud-node-controller",
                    "cloud-node-lifecycle-controller",
                    "node-route-controller",
                ],
            ),
            // Disabled by default: only an explicit mention enables it.
            (
                "*,acme-tagger",
                &[
                    "cloud-node-controller",
                    "cloud-node-lifecycle-controller",
                    "service-lb-controller",
                    "node-route-controller",
                    "acme-tagger",
                ],
            ),
            ("acme-tagger", &["acme-tagger"]),
            ("-cloud-node,-cloud-node-lifecycle", &[]),
            ("", &[]),
        ];
        for (flag, want) in cases {
            assert_eq!(enabled(flag).as_deref(), Ok(*want), "--controllers={flag}");
        }
    }

    #[test]
    fn unknown_names_are_rejected() {
        for flag in ["ipam", "*,-bogus", "Service", "service,,route"] {
            let err = enabled(flag).unwrap_err();
            assert!(err.starts_with("invalid value for --controllers"), "{err}");
        }
        let err = enabled("*,-bogus").unwrap_err();
        assert!(
            err.contains("\"bogus\" is not in the list of known controllers")
                && err.contains("service-lb-controller (alias service)"),
            "{err}"
        );
    }
}
