/// Instances: what the cloud-node and node-lifecycle controllers ask about Nodes.
pub struct AcmeInstances {
    api: acme_api::Client,
}

impl AcmeInstances {
    /// The Node's machine, or `None` if it does not exist. Looks it up by `spec.providerID`
    /// once the Node has one (names can be reused, IDs cannot), else by the Node's name.
    async fn machine(&self, node: &NodeView) -> CloudResult<Option<Machine>> {
        match node.provider_id() {
            "" => self.api.find_machine(node.name()).await.map_err(cloud_error),
            id => {
                let id: ProviderId = id.parse().map_err(CloudError::other)?;
                if id.provider() != PROVIDER_NAME {
                    return Err(CloudError::msg(format!("{id} is not an Acme machine")));
                }
                // The instance part is `<zone>/<machine-id>`.
                let machine_id = id.instance_id().rsplit('/').next().unwrap_or_default();
                match self.api.get_machine(machine_id).await {
                    Ok(machine) => Ok(Some(machine)),
                    Err(ApiError::NotFound) => Ok(None),
                    Err(e) => Err(cloud_error(e)),
                }
            }
        }
    }
}

#[async_trait]
impl InstancesV2 for AcmeInstances {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        // Ok(false) only when the cloud says the machine is gone: the Node is then deleted.
        // A stopped machine exists. An API failure is an error, never "gone".
        Ok(self.machine(node).await?.is_some())
    }

    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        // A machine that does not exist is not "shut down" (it is gone).
        Ok(self
            .machine(node)
            .await?
            .is_some_and(|m| m.state == MachineState::Stopped))
    }

    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        let machine = self
            .machine(node)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        let provider_id = ProviderId::new(PROVIDER_NAME, format!("{}/{}", machine.zone, machine.id))
            .map_err(CloudError::other)?;
        let mut addresses = vec![NodeAddress {
            type_: "InternalIP".into(),
            address: machine.private_ip.clone(),
        }];
        if let Some(ip) = &machine.public_ip {
            addresses.push(NodeAddress {
                type_: "ExternalIP".into(),
                address: ip.clone(),
            });
        }
        Ok(InstanceMetadata {
            provider_id: provider_id.to_string(),
            instance_type: machine.plan.clone(),
            node_addresses: addresses,
            // Acme zones are `<region>-<letter>`, e.g. `fra-1a` in region `fra-1`.
            region: machine.zone.trim_end_matches(char::is_alphabetic).to_owned(),
            zone: machine.zone.clone(),
            additional_labels: BTreeMap::from([(
                "acme.example.com/machine-id".to_owned(),
                machine.id.clone(),
            )]),
        })
    }
}
