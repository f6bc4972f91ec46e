//! Client certificates: the cluster's client CA (looked up or given by flag), and the
//! authentication ConfigMap lookup.

use axum::http::StatusCode;
use ccm_controllers::secure_serving::{SecureServingArgs, serve_on};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{AuthConfigMap, MockApi, app, get_with, https_builder, start};

struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

fn new_ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

fn client_identity(ca: &Ca, cn: &str, org: &str) -> reqwest::Identity {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    reqwest::Identity::from_pem(pem.as_bytes()).unwrap()
}

async fn get_as(url: &str, identity: reqwest::Identity) -> Result<StatusCode, reqwest::Error> {
    let client = https_builder().identity(identity).build().unwrap();
    Ok(client.get(url).send().await?.status())
}

#[tokio::test]
async fn client_certificate_signed_by_the_cluster_client_ca_authenticates() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(
        api.configmap_gets(),
        1,
        "the client CA is looked up at start"
    );

    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(api.token_reviews(), 0, "no TokenReview for a certificate");
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["spec"]["user"], "alice");
    assert_eq!(
        review["spec"]["groups"],
        json!(["team-a", "system:authenticated"])
    );

    // The certificate's subject is still authorised: mallory may not read /metrics.
    let status = get_as(&srv.url("/metrics"), client_identity(&ca, "mallory", "x"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Without a certificate, bearer tokens keep working.
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let rogue = new_ca("rogue");
    let result = get_as(
        &srv.url("/metrics"),
        client_identity(&rogue, "alice", "team-a"),
    )
    .await;
    assert!(result.is_err(), "handshake must fail: {result:?}");
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn client_ca_file_flag_is_used_without_lookup() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("file-ca");
    std::fs::write(dir.path().join("ca.crt"), &ca.pem).unwrap();
    let args = SecureServingArgs {
        client_ca_file: Some(dir.path().join("ca.crt")),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(api.configmap_gets(), 0);
    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    srv.stop().await;
}

#[tokio::test]
async fn skip_lookup_means_no_client_certificates() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let args = SecureServingArgs {
        authentication_skip_lookup: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(api.configmap_gets(), 0);
    // The server does not ask for a certificate, so the request has no credentials.
    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

#[tokio::test]
async fn missing_auth_configmap_is_fine() {
    let api = MockApi::start().await;
    api.set_auth_configmap(AuthConfigMap::Missing);
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(api.configmap_gets(), 1);
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}

#[tokio::test]
async fn forbidden_lookup_fails_start_unless_tolerated() {
    let api = MockApi::start().await;
    api.set_auth_configmap(AuthConfigMap::Forbidden);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &SecureServingArgs::default(),
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("extension-apiserver-authentication"), "{err}");
    assert!(
        err.contains("--role=extension-apiserver-authentication-reader"),
        "the error says how to fix it: {err}"
    );

    let args = SecureServingArgs {
        authentication_tolerate_lookup_failure: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}
