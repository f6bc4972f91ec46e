//! TLS: the self-signed certificate, the minimum version and cipher suites, certificate files
//! served and reloaded, and the serving address and shutdown.

use axum::http::StatusCode;
use ccm_controllers::secure_serving::{SecureServingArgs, TlsVersion, serve, serve_on};
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{MockApi, app, get_with, https, https_builder, start};

async fn peer_certificate(url: &str, builder: reqwest::ClientBuilder) -> Vec<u8> {
    let resp = builder.build().unwrap().get(url).send().await.unwrap();
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("TLS info with a peer certificate")
        .to_vec()
}

#[tokio::test]
async fn self_signed_certificate_for_localhost_is_served() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let der = peer_certificate(&srv.url("/healthz"), https_builder()).await;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(cert.subject(), cert.issuer(), "self-signed");
    let san = cert.subject_alternative_name().unwrap().unwrap();
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            x509_parser::extensions::GeneralName::IPAddress(ip) => format!("{ip:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert!(names.contains(&"localhost".to_owned()), "{names:?}");
    assert!(names.contains(&"[127, 0, 0, 1]".to_owned()), "{names:?}");
    assert!(
        cert.validity().is_valid(),
        "valid now: {:?}",
        cert.validity()
    );
    // Plain HTTP on the secure port does not get a response.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", srv.addr.port()))
        .send()
        .await;
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "plain HTTP must not be served"
    );
    srv.stop().await;
}

#[tokio::test]
async fn tls_min_version_is_enforced() {
    let api = MockApi::start().await;
    let tls12_only = || https_builder().max_tls_version(reqwest::tls::Version::TLS_1_2);

    // Default minimum is TLS 1.2: a TLS 1.2 client gets through.
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let resp = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await;
    assert_eq!(resp.unwrap().status(), StatusCode::OK);
    srv.stop().await;

    // --tls-min-version=VersionTLS13 refuses it; a TLS 1.3 client still works.
    let args = SecureServingArgs {
        tls_min_version: Some(TlsVersion::Tls13),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let err = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .expect_err("TLS 1.2 handshake must fail");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    let resp = https_builder()
        .min_tls_version(reqwest::tls::Version::TLS_1_3)
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;
}

#[tokio::test]
async fn cipher_suite_restriction_applies_to_tls12() {
    let api = MockApi::start().await;
    // Our certificate is ECDSA, so an RSA-only TLS 1.2 suite list leaves no usable suite.
    let rsa_only = SecureServingArgs {
        tls_cipher_suites: vec![
            ccm_controllers::secure_serving::parse_cipher_suite(
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            )
            .unwrap(),
        ],
        ..SecureServingArgs::default()
    };
    let srv = start(rsa_only.clone(), api.client()).await;
    let tls12_only = || https_builder().max_tls_version(reqwest::tls::Version::TLS_1_2);
    assert!(
        tls12_only()
            .build()
            .unwrap()
            .get(srv.url("/healthz"))
            .send()
            .await
            .is_err(),
        "no ECDSA TLS 1.2 suite is allowed"
    );
    // TLS 1.3 suites are unaffected, as in Go.
    let resp = https().get(srv.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;

    let ecdsa = SecureServingArgs {
        tls_cipher_suites: vec![
            ccm_controllers::secure_serving::parse_cipher_suite(
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            )
            .unwrap(),
        ],
        ..SecureServingArgs::default()
    };
    let srv = start(ecdsa, api.client()).await;
    let resp = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;
}

fn write_pair(dir: &Path, cn: &str) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    // Write to temporary names and rename, as a Secret volume update does (atomically).
    std::fs::write(dir.join("tls.crt.tmp"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key.tmp"), key.serialize_pem()).unwrap();
    std::fs::rename(dir.join("tls.key.tmp"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("tls.crt.tmp"), dir.join("tls.crt")).unwrap();
    cert.der().to_vec()
}

async fn wait_for_certificate(url: &str, want: &[u8]) -> bool {
    for _ in 0..200 {
        if peer_certificate(url, https_builder()).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn certificate_files_are_served_and_reloaded() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let first = write_pair(dir.path(), "first");
    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_private_key_file: Some(dir.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let url = srv.url("/healthz");
    assert_eq!(peer_certificate(&url, https_builder()).await, first);

    let second = write_pair(dir.path(), "second");
    assert_ne!(first, second);
    assert!(
        wait_for_certificate(&url, &second).await,
        "the replaced certificate is served within 20 s"
    );

    // A broken replacement is refused and the last good pair stays in use.
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(peer_certificate(&url, https_builder()).await, second);
    // Once the files are good again they are picked up.
    let third = write_pair(dir.path(), "third");
    assert!(wait_for_certificate(&url, &third).await);
    srv.stop().await;
}

#[tokio::test]
async fn bad_certificate_files_fail_at_start_with_a_clear_error() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), "a");
    let other = tempfile::tempdir().unwrap();
    write_pair(other.path(), "b");
    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_private_key_file: Some(other.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &args,
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("tls.crt"), "{err}");
    assert!(err.contains("do not form a usable pair"), "{err}");

    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("missing.crt")),
        tls_private_key_file: Some(dir.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &args,
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("missing.crt"), "{err}");
}

#[tokio::test]
async fn secure_port_zero_disables_serving() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        secure_port: 0,
        ..SecureServingArgs::default()
    };
    let server = serve(app(), &args, api.client(), CancellationToken::new())
        .await
        .unwrap();
    assert!(server.is_none());
}

#[tokio::test]
async fn serve_binds_the_configured_address_and_stops_on_shutdown() {
    let api = MockApi::start().await;
    // Find a free port, then ask serve() to bind exactly that.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let args = SecureServingArgs {
        bind_address: "127.0.0.1".parse().unwrap(),
        secure_port: port,
        ..SecureServingArgs::default()
    };
    let shutdown = CancellationToken::new();
    let server = serve(app(), &args, api.client(), shutdown.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(server.local_addr().port(), port);
    let (status, _) = get_with(&format!("https://127.0.0.1:{port}/healthz"), None).await;
    assert_eq!(status, StatusCode::OK);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("server stops after shutdown")
        .unwrap();
    assert!(
        https()
            .get(format!("https://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_err(),
        "nothing listens after shutdown"
    );
}
