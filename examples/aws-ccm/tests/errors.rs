//! AWS error answers over real HTTP (a tiny server answering what AWS answers when it
//! throttles or fails), through the SDK into the provider: throttling and 5xx become
//! `CloudError::Retry` with a delay, after exactly one request (the SDK does not retry).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_ccm::errors::{SERVER_ERROR_DELAY, THROTTLE_DELAY};
use aws_ccm::{AwsCloud, AwsConfig};
use aws_credential_types::Credentials;
use ccm_core::{CloudProvider, InstancesV2, Node, NodeView};
use ccm_testing::builders::load_balancer_service;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves every request with `status` and `body`; counts the requests.
async fn answering(status: u16, body: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut read = 0;
                // Read the head and the body (Content-Length) of one request.
                loop {
                    let Ok(n) = stream.read(&mut buf[read..]).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read += n;
                    let text = String::from_utf8_lossy(&buf[..read]).to_string();
                    if let Some(head_end) = text.find("\r\n\r\n") {
                        let length = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if read >= head_end + 4 + length {
                            break;
                        }
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let response = format!(
                    "HTTP/1.1 {status} Error\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (url, count)
}

fn cloud(url: &str) -> AwsCloud {
    let config = AwsConfig::parse(
        format!("region: us-east-1\nvpc: vpc-1\nsubnets: [subnet-1]\nendpointUrl: {url}\n")
            .as_bytes(),
    )
    .unwrap();
    AwsCloud::new(
        config,
        Some(Credentials::new("testing", "testing", None, None, "test")),
    )
}

fn node() -> NodeView {
    let mut node = Node::default();
    node.metadata.name = Some("ip-10-0-0-1.ec2.internal".into());
    node.spec = Some(ccm_core::k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some("aws:///us-east-1a/i-0123456789abcdef0".into()),
        ..Default::default()
    });
    NodeView::from(node)
}

const EC2_THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r-1</RequestID></Response>";
const EC2_INTERNAL: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InternalError</Code><Message>An internal error has occurred</Message></Error></Errors><RequestID>r-2</RequestID></Response>";
const EC2_DENIED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to perform this operation.</Message></Error></Errors><RequestID>r-3</RequestID></Response>";
const ELB_THROTTLED: &str = "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>r-4</RequestId></ErrorResponse>";

#[tokio::test]
async fn ec2_throttling_is_a_retry_after_one_request() {
    let (url, count) = answering(503, EC2_THROTTLED).await;
    let cloud = cloud(&url);
    let err = cloud.instance_metadata(&node()).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(THROTTLE_DELAY), "{err}");
    assert!(err.to_string().contains("RequestLimitExceeded"), "{err}");
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "the SDK must not retry on its own"
    );
    // Not "gone": a throttled existence check is an error, never false.
    assert!(cloud.instance_exists(&node()).await.is_err());
}

#[tokio::test]
async fn ec2_server_errors_are_retries() {
    let (url, count) = answering(500, EC2_INTERNAL).await;
    let err = cloud(&url).instance_shutdown(&node()).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(SERVER_ERROR_DELAY), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn other_errors_are_failures_with_the_aws_code() {
    let (url, _) = answering(403, EC2_DENIED).await;
    let err = cloud(&url).instance_metadata(&node()).await.unwrap_err();
    assert_eq!(err.retry_after(), None);
    assert!(err.to_string().contains("UnauthorizedOperation"), "{err}");
}

#[tokio::test]
async fn elb_throttling_is_a_retry() {
    let (url, count) = answering(400, ELB_THROTTLED).await;
    let mut service = load_balancer_service("default", "web").build();
    service.metadata.uid = Some("0c8a1d3e-0000-4000-8000-000000000001".into());
    let cloud = cloud(&url);
    let err = cloud
        .load_balancer()
        .unwrap()
        .get_load_balancer("c1", &service)
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(THROTTLE_DELAY), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
