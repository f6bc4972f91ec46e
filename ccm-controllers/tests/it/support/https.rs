//! HTTPS requests to the runtime's serving port.

use std::time::Duration;

/// GET `https://<addr><path>` (the server's certificate is self-signed); returns (status, body),
/// status 0 when the server cannot be reached.
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    match client.get(format!("https://{addr}{path}")).send().await {
        Ok(resp) => (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        ),
        Err(_) => (0, String::new()),
    }
}
