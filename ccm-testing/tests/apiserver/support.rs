//! Helpers the API server tests share.

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use kube::core::ObjectMeta;

pub(crate) fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub(crate) fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta().resource_version.as_ref().unwrap().parse().unwrap()
}

pub(crate) fn configmap(ns: &str, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

pub(crate) fn cm(ns: &str, name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(crate) async fn raw(s: &ApiServer, req: http::Request<Vec<u8>>) -> (u16, serde_json::Value) {
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let (parts, body) = req.into_parts();
    let req = http::Request::from_parts(parts, kube::client::Body::from(body));
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

/// A started server with the Node `name` as kubelet registers it: the server, the Node API and
/// the created Node.
pub(crate) async fn server_with_node(name: &str) -> (ApiServer, Api<Node>, Node) {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    let node = nodes
        .create(&PostParams::default(), &kubelet_node(name).build())
        .await
        .unwrap();
    (s, nodes, node)
}
