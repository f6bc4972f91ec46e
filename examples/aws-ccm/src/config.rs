//! The cloud-config file (`--cloud-config`): where the cluster lives in AWS.
//!
//! ```yaml
//! region: eu-west-1                 # required
//! vpc: vpc-0abc                     # required: the VPC of the Nodes (target groups live in it)
//! subnets: [subnet-0a, subnet-0b]   # where the NLBs of Services without a class go
//! internalSubnets: [subnet-0c]      # optional: where internal NLBs (class
//!                                   # aws-ccm.ccm-rs.io/internal-nlb) go; default `subnets`
//! routeTable: rtb-0abc              # optional: pod-CIDR routes go here (no routes without it)
//! endpointUrl: http://127.0.0.1:5000  # optional: one endpoint for EC2 and ELBv2 (moto, a proxy)
//! loadBalancerScheme: internet-facing # or internal (default internet-facing)
//! provisioningRetrySeconds: 15      # how long to wait for a provisioning NLB (default 15)
//! ```

use std::time::Duration;

use ccm_core::{BoxError, parse_cloud_config};
use serde::Deserialize;

/// The parsed cloud-config (camelCase keys, unknown keys rejected).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsConfig {
    /// The AWS region of every API call, e.g. `eu-west-1`.
    pub region: String,
    /// The VPC of the cluster's instances; target groups are created in it.
    pub vpc: String,
    /// The subnets the network load balancers of Services without a class are placed in; no
    /// load balancers for them without subnets.
    #[serde(default)]
    pub subnets: Vec<String>,
    /// The subnets the internal network load balancers of class
    /// [`INTERNAL_NLB_CLASS`](crate::INTERNAL_NLB_CLASS) are placed in (typically private
    /// ones). Unset: [`subnets`](Self::subnets); empty: the class is not served.
    #[serde(default)]
    pub internal_subnets: Option<Vec<String>>,
    /// The route table pod-CIDR routes are written to; no route capability without it.
    #[serde(default)]
    pub route_table: Option<String>,
    /// One endpoint URL for EC2 and ELBv2 instead of the regional AWS endpoints.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// `internet-facing` (default) or `internal`.
    #[serde(default = "default_scheme")]
    pub load_balancer_scheme: String,
    /// Seconds to wait before asking again about a load balancer that is still provisioning.
    #[serde(default = "default_provisioning_retry")]
    pub provisioning_retry_seconds: u64,
}

fn default_scheme() -> String {
    "internet-facing".to_owned()
}

fn default_provisioning_retry() -> u64 {
    15
}

impl AwsConfig {
    /// Parses and validates a cloud-config file's contents. The error names the field.
    pub fn parse(contents: &[u8]) -> Result<AwsConfig, BoxError> {
        let config: AwsConfig = parse_cloud_config(contents)?;
        config.validate()?;
        Ok(config)
    }

    /// The subnets of the internal network load balancers: `internalSubnets`, else `subnets`.
    pub fn internal_load_balancer_subnets(&self) -> &[String] {
        self.internal_subnets.as_deref().unwrap_or(&self.subnets)
    }

    /// The delay of the `CloudError::Retry` answered for a provisioning load balancer.
    pub fn provisioning_retry(&self) -> Duration {
        Duration::from_secs(self.provisioning_retry_seconds.max(1))
    }

    fn validate(&self) -> Result<(), BoxError> {
        if self.region.trim().is_empty() {
            return Err("invalid cloud config: `region` must not be empty".into());
        }
        expect_prefix("vpc", &self.vpc, "vpc-")?;
        for subnet in &self.subnets {
            expect_prefix("subnets", subnet, "subnet-")?;
        }
        for subnet in self.internal_subnets.iter().flatten() {
            expect_prefix("internalSubnets", subnet, "subnet-")?;
        }
        if let Some(table) = &self.route_table {
            expect_prefix("routeTable", table, "rtb-")?;
        }
        if let Some(url) = &self.endpoint_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!(
                "invalid cloud config: `endpointUrl` {url:?} must start with http:// or https://"
            )
            .into());
        }
        if !matches!(
            self.load_balancer_scheme.as_str(),
            "internet-facing" | "internal"
        ) {
            return Err(format!(
                "invalid cloud config: `loadBalancerScheme` {:?} must be internet-facing or internal",
                self.load_balancer_scheme
            )
            .into());
        }
        Ok(())
    }
}

fn expect_prefix(field: &str, value: &str, prefix: &str) -> Result<(), BoxError> {
    if value.len() > prefix.len() && value.starts_with(prefix) {
        Ok(())
    } else {
        Err(format!(
            "invalid cloud config: `{field}` {value:?} is not an ID of the form {prefix}..."
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_config() {
        let config = AwsConfig::parse(
            b"region: us-east-1\nvpc: vpc-1\nsubnets: [subnet-1]\nrouteTable: rtb-1\nendpointUrl: http://127.0.0.1:5000\n",
        )
        .map_err(|e| e.to_string());
        let config = config
            .as_ref()
            .map(|c| (c.route_table.clone(), c.load_balancer_scheme.clone()));
        assert_eq!(config, Ok((Some("rtb-1".into()), "internet-facing".into())));
    }

    #[test]
    fn internal_subnets_default_to_subnets_and_an_empty_list_means_none() {
        let subnets = |text: &str| {
            AwsConfig::parse(format!("region: r\nvpc: vpc-1\n{text}").as_bytes())
                .map(|c| c.internal_load_balancer_subnets().to_vec())
                .map_err(|e| e.to_string())
        };
        let ids = |ids: &[&str]| Ok(ids.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(subnets("subnets: [subnet-a]\n"), ids(&["subnet-a"]));
        assert_eq!(
            subnets("subnets: [subnet-a]\ninternalSubnets: [subnet-b, subnet-c]\n"),
            ids(&["subnet-b", "subnet-c"])
        );
        assert_eq!(
            subnets("subnets: [subnet-a]\ninternalSubnets: []\n"),
            ids(&[])
        );
        assert_eq!(subnets(""), ids(&[]));
    }

    #[test]
    fn names_the_bad_field() {
        let cases: [(&[u8], &str); 7] = [
            (b"vpc: vpc-1\n", "missing field `region`"),
            (b"region: ''\nvpc: vpc-1\n", "`region` must not be empty"),
            (b"region: r\nvpc: v-1\n", "`vpc` \"v-1\""),
            (
                b"region: r\nvpc: vpc-1\nsubnets: [sub-1]\n",
                "`subnets` \"sub-1\"",
            ),
            (
                b"region: r\nvpc: vpc-1\ninternalSubnets: [subnet-1, net-2]\n",
                "`internalSubnets` \"net-2\"",
            ),
            (
                b"region: r\nvpc: vpc-1\nrouteTables: rtb-1\n",
                "unknown field `routeTables`",
            ),
            (
                b"region: r\nvpc: vpc-1\nendpointUrl: localhost:5000\n",
                "`endpointUrl`",
            ),
        ];
        for (input, expected) in cases {
            let err = AwsConfig::parse(input)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }
}
