//! The provider registry: providers register by name at link time and are built by name at
//! startup from `--cloud-provider` and `--cloud-config`.
//!
//! Registration goes through [`inventory`](https://docs.rs/inventory), so a provider registers
//! itself with one macro call at item level, and the framework finds it without a central list:
//!
//! ```
//! use std::sync::Arc;
//! use ccm_core::{register_cloud_provider, BoxError, CloudProvider};
//!
//! struct Acme;
//! impl CloudProvider for Acme {
//!     fn provider_name(&self) -> &str { "acme" }
//! }
//!
//! fn build_acme(_cloud_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
//!     Ok(Arc::new(Acme))
//! }
//!
//! register_cloud_provider!("acme", build_acme);
//!
//! # fn main() {
//! let provider = ccm_core::build_provider("acme", None).unwrap();
//! assert_eq!(provider.provider_name(), "acme");
//! # }
//! ```
//!
//! # Keeping the provider linked
//!
//! The Rust linker drops a library crate that the final binary never names, and its
//! registration with it: the registry is then silently empty. When the provider lives in its
//! own crate, the binary's `main.rs` must name that crate:
//!
//! ```ignore
//! use acme_cloud_provider as _; // keeps the `register_cloud_provider!` of that crate linked
//! ```
//!
//! Lookups of an unknown name fail with the list of registered names, which makes a dropped
//! registration obvious.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::{BoxError, CloudProvider};

/// Builds a provider from the contents of the `--cloud-config` file (`None` when the flag was not
/// given). The Rust counterpart of Go's `cloudprovider.Factory`.
pub type ProviderFactory = fn(Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError>;

/// One registered provider. Created by [`register_cloud_provider!`](crate::register_cloud_provider);
/// vendors do not build it by hand.
#[derive(Debug)]
pub struct ProviderRegistration {
    /// The name given to `--cloud-provider`.
    pub name: &'static str,
    /// The factory that builds the provider.
    pub factory: ProviderFactory,
}

inventory::collect!(ProviderRegistration);

/// Registers a cloud provider under a name, at item level in any crate linked into the binary.
///
/// `$factory` is a function `fn(Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError>`
/// receiving the contents of `--cloud-config`. Registering the same name twice is reported when
/// that name is looked up ([`RegistryError::Duplicate`]).
///
/// When the provider lives in a library crate, the binary must name that crate
/// (`use acme_cloud_provider as _;`), or the linker drops it together with this registration;
/// see the [registry module docs](crate::registry).
///
/// ```
/// use std::sync::Arc;
/// use ccm_core::{register_cloud_provider, BoxError, CloudProvider};
///
/// struct Acme;
/// impl CloudProvider for Acme {
///     fn provider_name(&self) -> &str { "acme-macro-doc" }
/// }
/// fn build(_: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> { Ok(Arc::new(Acme)) }
///
/// register_cloud_provider!("acme-macro-doc", build);
/// # fn main() { assert!(ccm_core::registered_providers().contains(&"acme-macro-doc")); }
/// ```
#[macro_export]
macro_rules! register_cloud_provider {
    ($name:expr, $factory:path $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::ProviderRegistration { name: $name, factory: $factory }
        }
    };
}

/// Why a provider could not be built from the registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No provider is registered under this name.
    #[error(
        "unknown cloud provider {name:?} (registered: {}); if the provider lives in its own crate, name it in main.rs with `use <provider_crate> as _;` so the linker keeps its registration",
        registered_list(.registered)
    )]
    Unknown {
        /// The name asked for.
        name: String,
        /// Every registered name, sorted.
        registered: Vec<&'static str>,
    },
    /// More than one provider is registered under this name.
    #[error(
        "cloud provider {name:?} is registered {count} times; each name must be registered exactly once"
    )]
    Duplicate {
        /// The name asked for.
        name: String,
        /// How many registrations carry it.
        count: usize,
    },
    /// The provider's factory failed.
    #[error("could not init cloud provider {name:?}: {source}")]
    Factory {
        /// The provider's name.
        name: String,
        /// The factory's error.
        #[source]
        source: BoxError,
    },
}

fn registered_list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Every registered provider name, sorted, each once.
pub fn registered_providers() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = inventory::iter::<ProviderRegistration>
        .into_iter()
        .map(|r| r.name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Whether a provider is registered under `name`.
pub fn is_registered(name: &str) -> bool {
    inventory::iter::<ProviderRegistration>
        .into_iter()
        .any(|r| r.name == name)
}

/// Builds the provider registered under `name`, passing it the `--cloud-config` contents.
///
/// Fails with [`RegistryError::Unknown`] (listing the registered names),
/// [`RegistryError::Duplicate`], or [`RegistryError::Factory`] wrapping the factory's error with
/// the provider's name.
pub fn build_provider(
    name: &str,
    cloud_config: Option<&[u8]>,
) -> Result<Arc<dyn CloudProvider>, RegistryError> {
    let matches: Vec<&ProviderRegistration> = inventory::iter::<ProviderRegistration>
        .into_iter()
        .filter(|r| r.name == name)
        .collect();
    match matches.as_slice() {
        [] => Err(RegistryError::Unknown {
            name: name.to_owned(),
            registered: registered_providers(),
        }),
        [registration] => {
            (registration.factory)(cloud_config).map_err(|source| RegistryError::Factory {
                name: name.to_owned(),
                source,
            })
        }
        many => Err(RegistryError::Duplicate {
            name: name.to_owned(),
            count: many.len(),
        }),
    }
}

/// A cloud-config file that could not be parsed into the provider's config type.
#[derive(Debug, thiserror::Error)]
#[error("invalid cloud config{}: {message}", location(*.line, *.column))]
pub struct CloudConfigError {
    /// The 1-based line of the problem, when known.
    pub line: Option<usize>,
    /// The 1-based column of the problem, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

fn location(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l}, column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

/// Deserialises the contents of `--cloud-config` (YAML or JSON) into the provider's own config
/// type. An empty file is read as an empty mapping, so a config type whose fields all have
/// defaults accepts it. The error names the line and column of the problem.
///
/// ```
/// #[derive(serde::Deserialize, Debug)]
/// #[serde(deny_unknown_fields)]
/// struct AcmeConfig { region: String, #[serde(default)] token_file: Option<String> }
///
/// let cfg: AcmeConfig = ccm_core::parse_cloud_config(b"region: eu-1\n").unwrap();
/// assert_eq!(cfg.region, "eu-1");
/// let cfg: AcmeConfig = ccm_core::parse_cloud_config(br#"{"region": "eu-2"}"#).unwrap();
/// assert_eq!(cfg.region, "eu-2");
/// let err = ccm_core::parse_cloud_config::<AcmeConfig>(b"region: eu-1\nregoin: x\n").unwrap_err();
/// assert_eq!(err.line, Some(2));
/// ```
pub fn parse_cloud_config<T: DeserializeOwned>(contents: &[u8]) -> Result<T, CloudConfigError> {
    let trimmed = contents.iter().position(|b| !b.is_ascii_whitespace());
    let Some(first) = trimmed else {
        return serde_norway::from_str("{}").map_err(yaml_error);
    };
    if matches!(contents[first], b'{' | b'[') {
        return serde_json::from_slice(contents).map_err(|e| CloudConfigError {
            line: Some(e.line()),
            column: Some(e.column()),
            message: e
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_owned(),
        });
    }
    serde_norway::from_slice(contents).map_err(yaml_error)
}

fn yaml_error(e: serde_norway::Error) -> CloudConfigError {
    let loc = e.location();
    let full = e.to_string();
    // serde_norway appends " at line L column C" to its messages; the location is reported
    // separately.
    let message = full.split(" at line ").next().unwrap_or(&full).to_owned();
    CloudConfigError {
        line: loc.as_ref().map(|l| l.line()),
        column: loc.as_ref().map(|l| l.column()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        #[serde(default)]
        zone: Option<String>,
        #[serde(default)]
        latency_ms: u64,
    }

    #[test]
    fn empty_config_is_an_empty_mapping() {
        let cfg: Cfg = parse_cloud_config(b"  \n").unwrap();
        assert_eq!(
            cfg,
            Cfg {
                zone: None,
                latency_ms: 0
            }
        );
    }

    #[test]
    fn yaml_error_names_line() {
        let err = parse_cloud_config::<Cfg>(b"zone: a\nlatency_ms: many\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        let text = err.to_string();
        assert!(
            text.starts_with("invalid cloud config at line 2, column"),
            "{text}"
        );
        assert!(
            text.contains("latency_ms") || text.contains("invalid type"),
            "{text}"
        );
    }

    #[test]
    fn json_error_names_line() {
        let err =
            parse_cloud_config::<Cfg>(b"{\n  \"zone\": \"a\",\n  \"bogus\": 1\n}").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(err.to_string().contains("unknown field `bogus`"), "{err}");
    }
}
