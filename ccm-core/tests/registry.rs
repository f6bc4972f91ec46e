//! The registry seen from a crate that is not `ccm-core`: registration through the macro,
//! lookup by name, and one distinct error for each misuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use ccm_core::{
    BoxError, CloudProvider, InstanceMetadata, InstancesV2, Node, NodeView, RegistryError,
    async_trait, build_provider, is_registered, register_cloud_provider, registered_providers,
};

struct Alpha;
struct Beta {
    zone: String,
}

#[async_trait]
impl CloudProvider for Alpha {
    fn provider_name(&self) -> &str {
        "alpha"
    }
}

#[async_trait]
impl CloudProvider for Beta {
    fn provider_name(&self) -> &str {
        "beta"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Beta {
    async fn instance_exists(&self, _: &NodeView) -> ccm_core::CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _: &NodeView) -> ccm_core::CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _: &NodeView) -> ccm_core::CloudResult<InstanceMetadata> {
        Ok(InstanceMetadata {
            zone: self.zone.clone(),
            ..Default::default()
        })
    }
}

fn build_alpha(_: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    Ok(Arc::new(Alpha))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BetaConfig {
    zone: String,
}

fn build_beta(config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    let Some(config) = config else {
        return Err("beta needs --cloud-config".into());
    };
    let config: BetaConfig = ccm_core::parse_cloud_config(config)?;
    Ok(Arc::new(Beta { zone: config.zone }))
}

fn build_twice(_: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    Ok(Arc::new(Alpha))
}

register_cloud_provider!("alpha", build_alpha);
register_cloud_provider!("beta", build_beta);
// A misuse: two registrations under one name.
register_cloud_provider!("twice", build_twice);
register_cloud_provider!("twice", build_twice);

#[test]
fn lists_registered_names_sorted_once_each() {
    assert_eq!(registered_providers(), ["alpha", "beta", "twice"]);
    assert!(is_registered("alpha"));
    assert!(!is_registered("gamma"));
}

#[tokio::test]
async fn builds_each_provider_by_name() {
    let alpha = build_provider("alpha", None).unwrap();
    assert_eq!(alpha.provider_name(), "alpha");
    assert!(alpha.instances_v2().is_none());

    let beta = build_provider("beta", Some(b"zone: beta-1\n")).unwrap();
    assert_eq!(beta.provider_name(), "beta");
    let meta = beta
        .instances_v2()
        .unwrap()
        .instance_metadata(&NodeView::from_node(&Node::default()))
        .await
        .unwrap();
    assert_eq!(meta.zone, "beta-1");
}

#[test]
fn unknown_name_lists_registered_names() {
    let err = build_provider("gamma", None).err().unwrap();
    assert!(matches!(&err, RegistryError::Unknown { name, .. } if name == "gamma"));
    assert_eq!(
        err.to_string(),
        "unknown cloud provider \"gamma\" (registered: alpha, beta, twice); if the provider lives \
         in its own crate, name it in main.rs with `use <provider_crate> as _;` so the linker \
         keeps its registration"
    );
}

#[test]
fn duplicate_name_is_an_error() {
    let err = build_provider("twice", None).err().unwrap();
    assert!(matches!(&err, RegistryError::Duplicate { count: 2, .. }));
    assert_eq!(
        err.to_string(),
        "cloud provider \"twice\" is registered 2 times; each name must be registered exactly once"
    );
}

#[test]
fn factory_failure_is_wrapped_with_the_provider_name() {
    let err = build_provider("beta", None).err().unwrap();
    assert!(matches!(&err, RegistryError::Factory { name, .. } if name == "beta"));
    assert_eq!(
        err.to_string(),
        "could not init cloud provider \"beta\": beta needs --cloud-config"
    );
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "beta needs --cloud-config"
    );

    let err = build_provider("beta", Some(b"zone: b\nzones: c\n"))
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "could not init cloud provider \"beta\": invalid cloud config at line 2, column 1: unknown field `zones`"
        ),
        "{text}"
    );
}
