//! The serving flags, with Go's names and defaults (`SecureServingOptions`,
//! `DelegatingAuthenticationOptions`, `DelegatingAuthorizationOptions`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::machinery::go_syntax::parse_go_duration;
use rustls::SupportedCipherSuite;

/// HTTPS serving with delegated authentication and authorisation.
///
/// Flatten it into a clap parser (`#[command(flatten)]`). The flag names and defaults are those
/// of Go's cloud-controller-manager.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Secure serving")]
pub struct SecureServingArgs {
    /// The IP address on which to listen for the --secure-port port.
    #[arg(long = "bind-address", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,

    /// The port on which to serve HTTPS with authentication and authorization. If 0, don't
    /// serve HTTPS at all.
    #[arg(long = "secure-port", default_value_t = 10258)]
    pub secure_port: u16,

    /// The directory where the TLS certs are located. If --tls-cert-file and
    /// --tls-private-key-file are provided, this flag will be ignored. When set and the pair
    /// `cloud-controller-manager.crt`/`.key` is missing there, a self-signed pair is written.
    #[arg(long = "cert-dir")]
    pub cert_dir: Option<PathBuf>,

    /// File containing the default x509 certificate for HTTPS (CA cert, if any, concatenated
    /// after server cert). If neither this nor --cert-dir is given, a self-signed certificate
    /// for localhost/127.0.0.1 is generated in memory. Reloaded when the file changes.
    #[arg(long = "tls-cert-file")]
    pub tls_cert_file: Option<PathBuf>,

    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long = "tls-private-key-file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Minimum TLS version supported. Possible values: VersionTLS12, VersionTLS13 (default
    /// VersionTLS12; VersionTLS10 and VersionTLS11 are not supported by this server).
    #[arg(long = "tls-min-version", value_parser = parse_tls_version)]
    pub tls_min_version: Option<TlsVersion>,

    /// Comma-separated list of cipher suites for the server (Go/IANA names). If omitted, the
    /// default suites are used. Restricts TLS 1.2; TLS 1.3 suites are always enabled, as in Go.
    /// Supported: TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    /// TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305(_SHA256), TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    /// TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305(_SHA256),
    /// TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256.
    #[arg(long = "tls-cipher-suites", value_delimiter = ',', value_parser = parse_cipher_suite)]
    pub tls_cipher_suites: Vec<CipherSuite>,

    /// kubeconfig file pointing at the 'core' kubernetes server with enough rights to create
    /// tokenreviews.authentication.k8s.io. Optional: the main client is used when absent.
    #[arg(long = "authentication-kubeconfig")]
    pub authentication_kubeconfig: Option<PathBuf>,

    /// If false, the client CA for client-certificate authentication is looked up in the
    /// ConfigMap kube-system/extension-apiserver-authentication (key `client-ca-file`) when
    /// --client-ca-file is not given.
    #[arg(long = "authentication-skip-lookup", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub authentication_skip_lookup: bool,

    /// If true, failing to look up the client CA in the cluster is not fatal: the server starts
    /// without client-certificate authentication (bearer tokens still work).
    #[arg(long = "authentication-tolerate-lookup-failure", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub authentication_tolerate_lookup_failure: bool,

    /// If set, any request presenting a client certificate signed by one of the authorities in
    /// this PEM bundle is authenticated with the certificate's CommonName as user and its
    /// Organizations as groups.
    #[arg(long = "client-ca-file")]
    pub client_ca_file: Option<PathBuf>,

    /// The duration to cache responses from the webhook token authenticator (both
    /// authenticated and rejected tokens; review errors are never cached).
    #[arg(long = "authentication-token-webhook-cache-ttl", default_value = "10s", value_parser = parse_go_duration)]
    pub authentication_token_webhook_cache_ttl: Duration,

    /// kubeconfig file pointing at the 'core' kubernetes server with enough rights to create
    /// subjectaccessreviews.authorization.k8s.io. Optional: the main client is used when absent.
    #[arg(long = "authorization-kubeconfig")]
    pub authorization_kubeconfig: Option<PathBuf>,

    /// A list of HTTP paths to skip during authentication and authorization: exact paths, or
    /// prefixes ending in `*`.
    #[arg(
        long = "authorization-always-allow-paths",
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez"
    )]
    pub authorization_always_allow_paths: Vec<String>,

    /// The duration to cache 'authorized' responses from the webhook authorizer.
    #[arg(long = "authorization-webhook-cache-authorized-ttl", default_value = "10s", value_parser = parse_go_duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,

    /// The duration to cache 'unauthorized' responses from the webhook authorizer.
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl", default_value = "10s", value_parser = parse_go_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
}

impl Default for SecureServingArgs {
    /// The Go defaults: `0.0.0.0:10258`, self-signed certificate, 10 s caches, always-allowed
    /// `/healthz,/readyz,/livez`.
    fn default() -> Self {
        Self {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            secure_port: 10258,
            cert_dir: None,
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_min_version: None,
            tls_cipher_suites: Vec::new(),
            authentication_kubeconfig: None,
            authentication_skip_lookup: false,
            authentication_tolerate_lookup_failure: false,
            client_ca_file: None,
            authentication_token_webhook_cache_ttl: Duration::from_secs(10),
            authorization_kubeconfig: None,
            authorization_always_allow_paths: vec![
                "/healthz".to_owned(),
                "/readyz".to_owned(),
                "/livez".to_owned(),
            ],
            authorization_webhook_cache_authorized_ttl: Duration::from_secs(10),
            authorization_webhook_cache_unauthorized_ttl: Duration::from_secs(10),
        }
    }
}

/// A TLS protocol version, by its Go name (`VersionTLS12`, `VersionTLS13`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2 (`VersionTLS12`).
    Tls12,
    /// TLS 1.3 (`VersionTLS13`).
    Tls13,
}

impl TlsVersion {
    /// The rustls protocol versions allowed when this is the minimum.
    pub(crate) fn allowed(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static BOTH: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static ONLY13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            Self::Tls12 => &BOTH,
            Self::Tls13 => &ONLY13,
        }
    }
}

/// Parses a Go TLS version name (`--tls-min-version`).
pub fn parse_tls_version(s: &str) -> Result<TlsVersion, String> {
    match s {
        "VersionTLS12" => Ok(TlsVersion::Tls12),
        "VersionTLS13" => Ok(TlsVersion::Tls13),
        "VersionTLS10" | "VersionTLS11" => Err(format!(
            "{s} is not supported: this server (rustls) implements TLS 1.2 and 1.3 only; use VersionTLS12 or VersionTLS13"
        )),
        _ => Err(format!(
            "unknown TLS version {s:?}; allowed values: VersionTLS12, VersionTLS13"
        )),
    }
}

/// A cipher suite named on `--tls-cipher-suites`, mapped onto the rustls suite.
#[derive(Debug, Clone, Copy)]
pub struct CipherSuite {
    name: &'static str,
    suite: SupportedCipherSuite,
}

impl CipherSuite {
    /// The Go/IANA name given on the command line (aliases resolved to the canonical name).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether this is a TLS 1.3 suite (Go ignores the list for TLS 1.3; so do we).
    pub(crate) fn is_tls13(&self) -> bool {
        self.suite.tls13().is_some()
    }

    pub(crate) fn suite(&self) -> SupportedCipherSuite {
        self.suite
    }
}

/// The suites Go accepts and rustls implements: (Go name, canonical name, rustls suite).
fn supported_suites() -> [(&'static str, &'static str, SupportedCipherSuite); 11] {
    use rustls::crypto::ring::cipher_suite as cs;
    [
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_AES_128_GCM_SHA256",
            "TLS_AES_128_GCM_SHA256",
            cs::TLS13_AES_128_GCM_SHA256,
        ),
        (
            "TLS_AES_256_GCM_SHA384",
            "TLS_AES_256_GCM_SHA384",
            cs::TLS13_AES_256_GCM_SHA384,
        ),
        (
            "TLS_CHACHA20_POLY1305_SHA256",
            "TLS_CHACHA20_POLY1305_SHA256",
            cs::TLS13_CHACHA20_POLY1305_SHA256,
        ),
    ]
}

/// Go cipher-suite names that rustls deliberately does not implement (CBC, static RSA key
/// exchange, 3DES, RC4).
const GO_ONLY_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
];

/// Parses one `--tls-cipher-suites` entry (Go/IANA name).
pub fn parse_cipher_suite(s: &str) -> Result<CipherSuite, String> {
    let s = s.trim();
    let suites = supported_suites();
    if let Some((_, canonical, suite)) = suites.iter().find(|(go, _, _)| *go == s) {
        return Ok(CipherSuite {
            name: canonical,
            suite: *suite,
        });
    }
    let supported: Vec<&str> = suites.iter().map(|(go, _, _)| *go).collect();
    if GO_ONLY_SUITES.contains(&s) {
        Err(format!(
            "cipher suite {s} is accepted by Go but not implemented by this server (rustls has no CBC, static-RSA, 3DES or RC4 suites); supported: {}",
            supported.join(", ")
        ))
    } else {
        Err(format!(
            "unknown cipher suite {s:?}; supported: {}",
            supported.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_versions() {
        assert_eq!(parse_tls_version("VersionTLS12"), Ok(TlsVersion::Tls12));
        assert_eq!(parse_tls_version("VersionTLS13"), Ok(TlsVersion::Tls13));
        let e = parse_tls_version("VersionTLS11").unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        assert!(parse_tls_version("tls1.2").is_err());
    }

    #[test]
    fn cipher_suites() {
        let s = parse_cipher_suite("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305").unwrap();
        assert_eq!(s.name(), "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256");
        assert!(!s.is_tls13());
        assert!(
            parse_cipher_suite("TLS_AES_128_GCM_SHA256")
                .unwrap()
                .is_tls13()
        );
        let e = parse_cipher_suite("TLS_RSA_WITH_AES_128_CBC_SHA").unwrap_err();
        assert!(e.contains("not implemented"), "{e}");
        let e = parse_cipher_suite("NOPE").unwrap_err();
        assert!(e.contains("unknown cipher suite"), "{e}");
    }

    #[test]
    fn defaults_match_go() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            s: SecureServingArgs,
        }
        let cli = Cli::try_parse_from(["ccm"]).unwrap();
        let d = SecureServingArgs::default();
        assert_eq!(cli.s.bind_address, d.bind_address);
        assert_eq!(cli.s.secure_port, 10258);
        assert_eq!(
            cli.s.authorization_always_allow_paths,
            vec!["/healthz", "/readyz", "/livez"]
        );
        assert_eq!(
            cli.s.authentication_token_webhook_cache_ttl,
            Duration::from_secs(10)
        );
        assert_eq!(
            cli.s.authorization_webhook_cache_authorized_ttl,
            Duration::from_secs(10)
        );
        assert_eq!(
            cli.s.authorization_webhook_cache_unauthorized_ttl,
            Duration::from_secs(10)
        );
        let cli = Cli::try_parse_from([
            "ccm",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
            "--tls-min-version=VersionTLS13",
            "--authentication-skip-lookup",
            "--authentication-tolerate-lookup-failure=false",
            "--client-ca-file=/etc/ca.crt",
            "--authorization-webhook-cache-authorized-ttl=2m0s",
        ])
        .unwrap();
        assert_eq!(cli.s.tls_cipher_suites.len(), 2);
        assert_eq!(cli.s.tls_min_version, Some(TlsVersion::Tls13));
        assert!(cli.s.authentication_skip_lookup);
        assert!(!cli.s.authentication_tolerate_lookup_failure);
        assert_eq!(cli.s.client_ca_file, Some(PathBuf::from("/etc/ca.crt")));
        assert_eq!(
            cli.s.authorization_webhook_cache_authorized_ttl,
            Duration::from_secs(120)
        );
        let err = Cli::try_parse_from(["ccm", "--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--tls-cipher-suites"), "{err}");
    }
}
