//! Instances: which Nodes exist, are shut down or fail, the metadata they answer with, and
//! the addresses derived from a Node's name.

use ccm_core::{CloudError, CloudResult, InstanceMetadata, NodeAddress};

use super::{FakeCloud, FakeCloudConfig, NodeAnswer, State, compile_patterns};

impl FakeCloud {
    /// Sets the chosen answers for one Node (as `nodes.<name>` in the config), replacing any.
    pub fn set_node(&self, name: &str, answer: NodeAnswer) {
        self.lock().nodes.insert(name.to_owned(), answer);
    }

    /// Forgets the chosen answers for one Node: it gets the default answers again.
    pub fn remove_node(&self, name: &str) {
        self.lock().nodes.remove(name);
    }

    /// Replaces the patterns of nodes whose instances do not exist (regular expressions matched
    /// against the whole node name; invalid ones are logged and ignored).
    pub fn set_missing_nodes(&self, patterns: &[&str]) {
        let compiled = compile_patterns("missing_nodes", patterns);
        self.lock().missing = compiled;
    }

    /// Replaces the patterns of nodes whose instances are shut down (regular expressions matched
    /// against the whole node name; invalid ones are logged and ignored).
    pub fn set_shutdown_nodes(&self, patterns: &[&str]) {
        let compiled = compile_patterns("shutdown_nodes", patterns);
        self.lock().shutdown = compiled;
    }
}

impl State {
    pub(super) fn is_missing(&self, node_name: &str) -> bool {
        match self.nodes.get(node_name).and_then(|a| a.exists) {
            Some(exists) => !exists,
            None => {
                self.missing.iter().any(|r| r.is_match(node_name))
                    || self.in_missing_file(node_name)
            }
        }
    }

    /// Whether `missing_nodes_file` lists the node (a file that cannot be read lists none).
    fn in_missing_file(&self, node_name: &str) -> bool {
        let Some(path) = &self.missing_file else {
            return false;
        };
        std::fs::read_to_string(path)
            .is_ok_and(|names| names.lines().any(|line| line.trim() == node_name))
    }

    pub(super) fn is_shutdown(&self, node_name: &str) -> bool {
        !self.is_missing(node_name)
            && match self.nodes.get(node_name).and_then(|a| a.shutdown) {
                Some(shutdown) => shutdown,
                None => self.shutdown.iter().any(|r| r.is_match(node_name)),
            }
    }

    /// The error every lookup of this Node answers (`nodes.<name>.error`), if any.
    pub(super) fn node_error(&self, node_name: &str) -> CloudResult<()> {
        match self.nodes.get(node_name).and_then(|a| a.error.as_deref()) {
            Some(message) => Err(CloudError::msg(format!(
                "fake cloud: node {node_name}: {message}"
            ))),
            None => Ok(()),
        }
    }

    /// The node name whose chosen answer has this provider ID, if any.
    pub(super) fn node_with_provider_id(&self, provider_id: &str) -> Option<&str> {
        self.nodes
            .iter()
            .find(|(_, a)| a.provider_id.as_deref() == Some(provider_id))
            .map(|(name, _)| name.as_str())
    }

    /// The metadata of an existing, answering instance.
    pub(super) fn metadata(
        &self,
        cfg: &FakeCloudConfig,
        name: &str,
    ) -> CloudResult<InstanceMetadata> {
        self.node_error(name)?;
        if self.is_missing(name) {
            return Err(CloudError::InstanceNotFound);
        }
        let answer = self.nodes.get(name);
        let pick = |field: Option<&String>, default: &String| field.unwrap_or(default).clone();
        Ok(InstanceMetadata {
            provider_id: answer
                .and_then(|a| a.provider_id.clone())
                .unwrap_or_else(|| format!("{}://{name}", cfg.provider_name)),
            instance_type: pick(
                answer.and_then(|a| a.instance_type.as_ref()),
                &cfg.instance_type,
            ),
            node_addresses: answer
                .and_then(|a| a.addresses.clone())
                .unwrap_or_else(|| node_addresses(cfg, name)),
            zone: pick(answer.and_then(|a| a.zone.as_ref()), &cfg.zone),
            region: pick(answer.and_then(|a| a.region.as_ref()), &cfg.region),
            additional_labels: answer
                .and_then(|a| a.additional_labels.clone())
                .unwrap_or_else(|| cfg.additional_labels.clone()),
        })
    }
}

/// FNV-1a, 64 bits. Hand-written (six lines) because the derived addresses must stay the same
/// across Rust releases, which `std`'s `DefaultHasher` does not promise.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The `InternalIP` of a node: `10.a.b.c` from a hash of its name, `c` in 1..=254.
pub(crate) fn internal_ip(node_name: &str) -> String {
    let h = stable_hash(node_name);
    format!(
        "10.{}.{}.{}",
        (h >> 8) & 0xff,
        (h >> 16) & 0xff,
        1 + (h % 254)
    )
}

/// The `ExternalIP` of a node: in `198.18.0.0/15` from a hash of its name, last octet 1..=254.
pub(crate) fn external_ip(node_name: &str) -> String {
    let h = stable_hash(node_name);
    format!(
        "198.{}.{}.{}",
        18 + ((h >> 24) & 1),
        (h >> 32) & 0xff,
        1 + ((h >> 40) % 254)
    )
}

/// The addresses of a node's instance: InternalIP, ExternalIP (when configured), Hostname.
pub(crate) fn node_addresses(config: &FakeCloudConfig, node_name: &str) -> Vec<NodeAddress> {
    let mut addresses = vec![NodeAddress {
        type_: "InternalIP".into(),
        address: internal_ip(node_name),
    }];
    if config.external_ip {
        addresses.push(NodeAddress {
            type_: "ExternalIP".into(),
            address: external_ip(node_name),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: node_name.to_owned(),
    });
    addresses
}
