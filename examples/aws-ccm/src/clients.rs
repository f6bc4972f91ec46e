//! The two AWS SDK clients (EC2, ELBv2), configured for a CCM.
//!
//! - HTTPS through aws-smithy-http-client on rustls with the `ring` provider, the one the rest
//!   of ccm-rs uses: the SDK's default client would bring aws-lc-rs, which needs cmake to build
//!   and leaves rustls with two providers and no default (a panic in kube's TLS client).
//! - One attempt per request: the framework's cloud-call budget (`--cloud-api-qps`) is the one
//!   place that rate-limits, and throttling answers become `CloudError::Retry`
//!   ([`crate::errors`]), so the controller waits instead of the SDK retrying behind its back.
//! - Credentials from the SDK's default chain (environment, profile, web identity, ECS, IMDS),
//!   resolved on first use so that building the provider needs no runtime.
//! - Every HTTP request counted ([`RequestCounter`]), for the benchmark and the tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::provider_config::ProviderConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider, future};
use aws_sdk_ec2::config::{BehaviorVersion, Region};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use tokio::sync::OnceCell;

use crate::config::AwsConfig;

/// Counts the HTTP requests the SDK sends (one per attempt; with one attempt, one per call).
#[derive(Clone, Debug, Default)]
pub struct RequestCounter(Arc<AtomicU64>);

impl RequestCounter {
    /// The number of requests sent so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The SDK's default credential chain, built on first use (building it is async).
#[derive(Debug)]
struct LazyDefaultChain {
    region: Region,
    http: SharedHttpClient,
    chain: OnceCell<DefaultCredentialsChain>,
}

impl ProvideCredentials for LazyDefaultChain {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move {
            let chain = self
                .chain
                .get_or_init(|| async {
                    let config = ProviderConfig::default().with_http_client(self.http.clone());
                    DefaultCredentialsChain::builder()
                        .configure(config)
                        .region(self.region.clone())
                        .build()
                        .await
                })
                .await;
            chain.provide_credentials().await
        })
    }
}

/// The EC2 and ELBv2 clients of one provider, sharing one HTTP client and one counter.
#[derive(Clone, Debug)]
pub struct Clients {
    /// EC2: instances, route tables.
    pub ec2: aws_sdk_ec2::Client,
    /// ELBv2: network load balancers, target groups, listeners.
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
    /// Every request both clients sent.
    pub requests: RequestCounter,
}

impl Clients {
    /// Builds the clients for `config`; `credentials` replaces the default chain (tests).
    pub fn new(config: &AwsConfig, credentials: Option<Credentials>) -> Clients {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let region = Region::new(config.region.clone());
        let credentials = match credentials {
            Some(static_credentials) => SharedCredentialsProvider::new(static_credentials),
            None => SharedCredentialsProvider::new(LazyDefaultChain {
                region: region.clone(),
                http: http.clone(),
                chain: OnceCell::new(),
            }),
        };
        // One attempt; the operation timeout bounds a call even when the framework's
        // --cloud-api-timeout is longer.
        let retry = RetryConfig::standard().with_max_attempts(1);
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .operation_attempt_timeout(Duration::from_secs(30))
            .build();
        let requests = RequestCounter::default();

        let mut ec2 = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(region.clone())
            .credentials_provider(credentials.clone())
            .http_client(http.clone())
            .retry_config(retry.clone())
            .timeout_config(timeouts.clone())
            .interceptor(requests.clone());
        let mut elb = aws_sdk_elasticloadbalancingv2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(region)
            .credentials_provider(credentials)
            .http_client(http)
            .retry_config(retry)
            .timeout_config(timeouts)
            .interceptor(requests.clone());
        if let Some(url) = &config.endpoint_url {
            ec2 = ec2.endpoint_url(url);
            elb = elb.endpoint_url(url);
        }
        Clients {
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
            requests,
        }
    }
}
