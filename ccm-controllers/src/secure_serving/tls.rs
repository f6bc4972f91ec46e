//! TLS for the secure port: rustls (ring provider only), the serving certificate from files
//! (reloaded when they change) or self-signed in memory, `--tls-min-version` and
//! `--tls-cipher-suites`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use super::Error;
use super::args::{SecureServingArgs, TlsVersion};

/// File names of the pair written to / read from `--cert-dir` (Go's pair name
/// `cloud-controller-manager`).
pub(crate) const PAIR_NAME: &str = "cloud-controller-manager";

/// How often the certificate files are re-read. Go re-reads every minute and on file-system
/// notifications; polling two small files every few seconds is as prompt and needs no watcher.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The crypto provider with the cipher suites the flags allow.
pub(crate) fn provider(args: &SecureServingArgs) -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    if !args.tls_cipher_suites.is_empty() {
        // As in Go, the list restricts TLS 1.0–1.2 only; TLS 1.3 suites stay enabled.
        let mut suites: Vec<rustls::SupportedCipherSuite> = Vec::new();
        for wanted in args.tls_cipher_suites.iter().filter(|s| !s.is_tls13()) {
            if !suites.iter().any(|s| s.suite() == wanted.suite().suite()) {
                suites.push(wanted.suite());
            }
        }
        suites.extend(
            provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some())
                .copied(),
        );
        provider.cipher_suites = suites;
    }
    provider
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CertSource {
    /// A certificate/key pair on disk, watched for changes.
    Files {
        /// PEM certificate chain (leaf first).
        cert: PathBuf,
        /// PEM private key.
        key: PathBuf,
    },
    /// A self-signed certificate for `localhost`/`127.0.0.1`, generated in memory.
    SelfSigned,
}

/// Decides the certificate source from the flags (Go: explicit files win, then `--cert-dir`,
/// then an in-memory self-signed pair). With `--cert-dir`, a missing pair is generated and
/// written there first.
pub(crate) fn cert_source(args: &SecureServingArgs) -> Result<CertSource, Error> {
    match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            return Ok(CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            });
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(Error::InvalidFlag(
                "--tls-cert-file and --tls-private-key-file must be given together".to_owned(),
            ));
        }
        (None, None) => {}
    }
    let Some(dir) = &args.cert_dir else {
        return Ok(CertSource::SelfSigned);
    };
    let cert = dir.join(format!("{PAIR_NAME}.crt"));
    let key = dir.join(format!("{PAIR_NAME}.key"));
    if !(cert.exists() && key.exists()) {
        let (cert_pem, key_pem) = self_signed_pem()?;
        std::fs::create_dir_all(dir).map_err(|source| Error::CertFile {
            path: dir.clone(),
            source,
        })?;
        write_file(&cert, cert_pem.as_bytes(), 0o644)?;
        write_file(&key, key_pem.as_bytes(), 0o600)?;
        tracing::info!(cert = %cert.display(), "generated self-signed serving certificate in --cert-dir");
    }
    Ok(CertSource::Files { cert, key })
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| Error::CertFile {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    f.write_all(data).map_err(io)
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, valid for one year (as Go's
/// `GenerateSelfSignedCertKey`), as PEM (certificate, private key).
pub(crate) fn self_signed_pem() -> Result<(String, String), Error> {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(Error::SelfSigned)?;
    let now = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC);
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("localhost@{}", now.timestamp().as_second()),
    );
    let today = now.date();
    let next_year = today.saturating_add(jiff::Span::new().years(1));
    let month = |m: i8| u8::try_from(m).unwrap_or(1);
    params.not_before = rcgen::date_time_ymd(
        i32::from(today.year()),
        month(today.month()),
        month(today.day()),
    );
    params.not_after = rcgen::date_time_ymd(
        i32::from(next_year.year()),
        month(next_year.month()),
        month(next_year.day()),
    );
    let key = rcgen::KeyPair::generate().map_err(Error::SelfSigned)?;
    let cert = params.self_signed(&key).map_err(Error::SelfSigned)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Parses a PEM certificate chain and private key and checks that they belong together.
pub(crate) fn load_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot parse the certificate PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block found in the certificate file".to_owned());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("cannot parse the private key PEM: {e}"))?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| format!("certificate and private key do not form a usable pair: {e}"))
}

/// Serves whatever pair was loaded last; [`watch_files`] swaps in new pairs.
#[derive(Debug)]
pub(crate) struct ReloadingResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingResolver {
    fn new(key: CertifiedKey) -> Self {
        Self {
            current: RwLock::new(Arc::new(key)),
        }
    }

    fn set(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// Builds the rustls server configuration and, for file-backed certificates, starts the task
/// that reloads them until `shutdown`.
pub(crate) fn server_config(
    args: &SecureServingArgs,
    client_ca: Option<(String, Vec<u8>)>,
    shutdown: &CancellationToken,
) -> Result<Arc<ServerConfig>, Error> {
    let provider = Arc::new(provider(args));
    let client_verifier = client_ca
        .map(|(source, pem)| {
            tracing::info!(%source, "client certificates signed by this CA are authenticated");
            super::client_ca::verifier(&source, &pem, provider.clone())
        })
        .transpose()?;
    let source = cert_source(args)?;
    let resolver = match &source {
        CertSource::SelfSigned => {
            let (cert, key) = self_signed_pem()?;
            let pair = load_pair(cert.as_bytes(), key.as_bytes(), &provider).map_err(|reason| {
                Error::Certificate {
                    path: PathBuf::from("<self-signed>"),
                    reason,
                }
            })?;
            tracing::info!(
                "serving with a self-signed certificate for localhost/127.0.0.1 generated in memory"
            );
            Arc::new(ReloadingResolver::new(pair))
        }
        CertSource::Files { cert, key } => {
            let read = |p: &Path| {
                std::fs::read(p).map_err(|source| Error::CertFile {
                    path: p.to_owned(),
                    source,
                })
            };
            let (cert_pem, key_pem) = (read(cert)?, read(key)?);
            let pair =
                load_pair(&cert_pem, &key_pem, &provider).map_err(|reason| Error::Certificate {
                    path: cert.clone(),
                    reason,
                })?;
            let resolver = Arc::new(ReloadingResolver::new(pair));
            tokio::spawn(watch_files(
                cert.clone(),
                key.clone(),
                (cert_pem, key_pem),
                resolver.clone(),
                provider.clone(),
                shutdown.clone(),
            ));
            resolver
        }
    };
    let versions = args.tls_min_version.unwrap_or(TlsVersion::Tls12).allowed();
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(Error::Tls)?;
    let mut config = match client_verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    }
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Re-reads the pair every [`RELOAD_INTERVAL`]; a changed, valid pair replaces the served one.
/// An invalid pair (for example the certificate already replaced but not yet the key) is logged
/// once and the last good pair stays in use; it is retried on the next tick.
async fn watch_files(
    cert: PathBuf,
    key: PathBuf,
    mut loaded: (Vec<u8>, Vec<u8>),
    resolver: Arc<ReloadingResolver>,
    provider: Arc<CryptoProvider>,
    shutdown: CancellationToken,
) {
    let mut last_failed: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let contents = match (tokio::fs::read(&cert).await, tokio::fs::read(&key).await) {
            (Ok(c), Ok(k)) => (c, k),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(cert = %cert.display(), key = %key.display(), error = %e,
                    "cannot read the serving certificate files; keeping the current certificate");
                continue;
            }
        };
        if contents == loaded || last_failed.as_ref() == Some(&contents) {
            continue;
        }
        match load_pair(&contents.0, &contents.1, &provider) {
            Ok(pair) => {
                resolver.set(pair);
                tracing::info!(cert = %cert.display(), "reloaded the serving certificate");
                loaded = contents;
                last_failed = None;
            }
            Err(reason) => {
                tracing::warn!(cert = %cert.display(), key = %key.display(), %reason,
                    "the changed serving certificate files are not usable; keeping the current certificate");
                last_failed = Some(contents);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_loads() {
        let (c, k) = self_signed_pem().unwrap();
        let provider = rustls::crypto::ring::default_provider();
        load_pair(c.as_bytes(), k.as_bytes(), &provider).unwrap();
    }

    #[test]
    fn mismatched_pair_is_rejected() {
        let (c, _) = self_signed_pem().unwrap();
        let (_, k) = self_signed_pem().unwrap();
        let provider = rustls::crypto::ring::default_provider();
        let e = load_pair(c.as_bytes(), k.as_bytes(), &provider).unwrap_err();
        assert!(e.contains("do not form a usable pair"), "{e}");
        let e = load_pair(b"", k.as_bytes(), &provider).unwrap_err();
        assert!(e.contains("no CERTIFICATE"), "{e}");
    }

    #[test]
    fn cipher_suite_flag_restricts_tls12_only() {
        let args = SecureServingArgs {
            tls_cipher_suites: vec![
                super::super::args::parse_cipher_suite("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
                    .unwrap(),
            ],
            ..SecureServingArgs::default()
        };
        let p = provider(&args);
        let tls12: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_none())
            .collect();
        assert_eq!(tls12.len(), 1);
        assert_eq!(
            tls12[0].suite(),
            rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        );
        assert_eq!(
            p.cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some())
                .count(),
            3
        );
    }

    #[test]
    fn cert_dir_gets_a_generated_pair() {
        let dir = tempfile::tempdir().unwrap();
        let args = SecureServingArgs {
            cert_dir: Some(dir.path().join("certs")),
            ..SecureServingArgs::default()
        };
        let src = cert_source(&args).unwrap();
        let CertSource::Files { cert, key } = &src else {
            panic!("expected files, got {src:?}");
        };
        assert!(cert.ends_with("cloud-controller-manager.crt"));
        let first = std::fs::read(cert).unwrap();
        // A second start reuses the pair.
        assert_eq!(cert_source(&args).unwrap(), src);
        assert_eq!(std::fs::read(cert).unwrap(), first);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let half = SecureServingArgs {
            tls_cert_file: Some(cert.clone()),
            ..SecureServingArgs::default()
        };
        assert!(matches!(cert_source(&half), Err(Error::InvalidFlag(_))));
    }
}
