//! Client-certificate authentication: the client CA from `--client-ca-file` or, as Go's
//! delegated authentication does, from the ConfigMap
//! `kube-system/extension-apiserver-authentication` (key `client-ca-file`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::Error;
use super::args::SecureServingArgs;
use super::auth::{AUTHENTICATED_GROUP, UserInfo};

/// Namespace and name of the ConfigMap the API server publishes its client CA in.
pub(crate) const AUTH_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// See [`AUTH_CONFIGMAP_NAMESPACE`].
pub(crate) const AUTH_CONFIGMAP_NAME: &str = "extension-apiserver-authentication";
const CLIENT_CA_KEY: &str = "client-ca-file";

/// The client CA bundle (PEM) and where it came from, or `None` when client certificates are
/// not authenticated. Read once at start-up.
pub(crate) async fn load(
    args: &SecureServingArgs,
    client: &kube::Client,
) -> Result<Option<(String, Vec<u8>)>, Error> {
    if let Some(path) = &args.client_ca_file {
        let pem = std::fs::read(path).map_err(|source| Error::CertFile {
            path: path.clone(),
            source,
        })?;
        return Ok(Some((path.display().to_string(), pem)));
    }
    if args.authentication_skip_lookup {
        return Ok(None);
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), AUTH_CONFIGMAP_NAMESPACE);
    match api.get_opt(AUTH_CONFIGMAP_NAME).await {
        Ok(Some(cm)) => Ok(cm
            .data
            .and_then(|mut d| d.remove(CLIENT_CA_KEY))
            .filter(|ca| !ca.trim().is_empty())
            .map(|ca| {
                (
                    format!(
                        "configmap/{AUTH_CONFIGMAP_NAME} in {AUTH_CONFIGMAP_NAMESPACE} ({CLIENT_CA_KEY})"
                    ),
                    ca.into_bytes(),
                )
            })),
        // Go ignores a missing ConfigMap: no client CA.
        Ok(None) => Ok(None),
        Err(e) => {
            let message = match &e {
                kube::Error::Api(s) if s.code == 403 => format!(
                    "{e}. Usually fixed by 'kubectl create rolebinding -n {AUTH_CONFIGMAP_NAMESPACE} ROLEBINDING_NAME \
                     --role=extension-apiserver-authentication-reader --serviceaccount=YOUR_NS:YOUR_SA'"
                ),
                _ => e.to_string(),
            };
            if args.authentication_tolerate_lookup_failure {
                tracing::warn!(error = %message,
                    "error looking up in-cluster authentication configuration; continuing without client-certificate authentication \
                     (set --authentication-tolerate-lookup-failure=false to require the lookup to succeed)");
                Ok(None)
            } else {
                Err(Error::ClientCaLookup(message))
            }
        }
    }
}

/// A verifier that asks for a client certificate, accepts connections without one, and refuses
/// the handshake when a presented certificate is not signed by the bundle (as Go's
/// `VerifyClientCertIfGiven`).
pub(crate) fn verifier(
    source: &str,
    pem: &[u8],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, Error> {
    let bad = |reason: String| Error::ClientCa {
        source_name: source.to_owned(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| bad(format!("cannot parse the PEM bundle: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CERTIFICATE block found".to_owned()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// The user of a verified client certificate, as Go's `CommonNameUserConversion`: user =
/// CommonName, groups = Organizations. `None` without a CommonName (then the request is
/// authenticated by its bearer token, if any).
pub(crate) fn user_from_cert(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let username = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())?
        .to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    groups.push(AUTHENTICATED_GROUP.to_owned());
    Some(UserInfo {
        username,
        uid: String::new(),
        groups,
        extra: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_is_common_name_and_groups_are_organizations() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "prometheus");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "monitoring");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let user = user_from_cert(cert.der()).unwrap();
        assert_eq!(user.username, "prometheus");
        assert_eq!(user.groups, vec!["monitoring", "system:authenticated"]);

        let mut params = rcgen::CertificateParams::new(vec!["x".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(user_from_cert(cert.der()), None, "no CommonName, no user");
    }

    #[test]
    fn bad_bundles_are_named() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let Err(e) = verifier("ca.pem", b"nothing here", provider) else {
            panic!("accepted an empty bundle");
        };
        let e = e.to_string();
        assert!(e.contains("ca.pem") && e.contains("no CERTIFICATE"), "{e}");
    }
}
