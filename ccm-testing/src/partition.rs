//! A TCP proxy that reproduces a silent network partition: [`PartitionProxy::freeze`] makes
//! every connection established through it stop carrying bytes, in both directions, without
//! closing it (no FIN, no RST), while new connections work as before.
//!
//! That is what a client sees when a NAT, a conntrack table or a load balancer in front of the
//! API server drops its flows, or when the backend behind an L7 load balancer hangs: the
//! frozen sockets stay open on the proxy, whose kernel keeps acknowledging what the client
//! sends until its buffers fill, so TCP keepalive cannot tell. Only an application-level
//! liveness bound finds such a connection dead.
//!
//! Put it in front of the in-process API server (`PartitionProxy::start(&server.url())`) or any
//! API server (`host:port` of a real cluster's URL; a TLS server then needs its name in the
//! client's `tls-server-name`, the proxy forwards bytes only), and point the client under test
//! at [`PartitionProxy::url`].
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use ccm_testing::apiserver::ApiServer;
//! use ccm_testing::partition::PartitionProxy;
//!
//! let server = ApiServer::start().await;
//! let proxy = PartitionProxy::start(&server.url()).await?;
//! // ... run the CCM with --master=proxy.url(), let it connect, then:
//! let frozen = proxy.freeze();
//! assert!(frozen > 0);
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// A TCP proxy whose established connections can be frozen (see the module docs). Dropping it
/// closes the listener and every connection, frozen or not.
#[derive(Debug)]
pub struct PartitionProxy {
    addr: SocketAddr,
    scheme: &'static str,
    shared: Arc<Shared>,
    _accept: AbortOnDropHandle<()>,
}

#[derive(Debug)]
struct Shared {
    /// Bumped by every freeze; a connection freezes when it changes.
    freezes: watch::Sender<u64>,
    /// Connections currently carrying bytes.
    open: AtomicUsize,
    /// New connections are frozen from the start (the API server unreachable altogether).
    freeze_new: AtomicBool,
    /// The sockets of the frozen connections, held open until the proxy drops.
    frozen: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Connections accepted while new ones freeze, held open until the proxy drops.
    held: Mutex<Vec<TcpStream>>,
}

impl PartitionProxy {
    /// Starts a proxy on `127.0.0.1:<free port>` to `upstream`: a URL (`http://127.0.0.1:8080`,
    /// `https://10.0.0.1:6443`; the port defaults from the scheme) or a `host:port`.
    ///
    /// # Errors
    ///
    /// If `upstream` has no host, or the listener cannot be bound.
    pub async fn start(upstream: &str) -> std::io::Result<PartitionProxy> {
        let (scheme, target) = upstream_address(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            freezes: watch::channel(0).0,
            open: AtomicUsize::new(0),
            freeze_new: AtomicBool::new(false),
            frozen: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
        });
        let accept =
            AbortOnDropHandle::new(tokio::spawn(accept_loop(listener, target, shared.clone())));
        Ok(PartitionProxy {
            addr,
            scheme,
            shared,
            _accept: accept,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's URL, with the upstream's scheme (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The connections currently carrying bytes (established and not frozen).
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// The connections frozen so far and still held open: those [`PartitionProxy::freeze`]
    /// froze and those accepted frozen while
    /// [`set_freeze_new_connections`](PartitionProxy::set_freeze_new_connections) was on.
    pub fn frozen_connections(&self) -> usize {
        let frozen = self
            .shared
            .frozen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let held = self
            .shared
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        frozen + held
    }

    /// With `true`, every connection made from now on is accepted and frozen at once (no byte
    /// reaches the upstream): the API server is silent altogether, as when the whole path to
    /// it hangs. `false` lets new connections work again.
    pub fn set_freeze_new_connections(&self, freeze: bool) {
        self.shared.freeze_new.store(freeze, Ordering::SeqCst);
    }

    /// Freezes every connection established now: from this moment each carries no byte in
    /// either direction and is never closed by the proxy (until it drops). Connections made
    /// afterwards work. Returns how many connections were carrying bytes when it was called.
    pub fn freeze(&self) -> usize {
        let open = self.shared.open.load(Ordering::SeqCst);
        self.shared.freezes.send_modify(|n| *n += 1);
        open
    }
}

/// `(scheme, host:port)` of `upstream`.
fn upstream_address(upstream: &str) -> std::io::Result<(&'static str, String)> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    if !upstream.contains("://") {
        return Ok(("http", upstream.to_owned()));
    }
    let uri: http::Uri = upstream
        .parse()
        .map_err(|e| invalid(format!("upstream {upstream:?}: {e}")))?;
    let scheme = if uri.scheme_str() == Some("https") {
        "https"
    } else {
        "http"
    };
    let host = uri
        .host()
        .ok_or_else(|| invalid(format!("upstream {upstream:?} has no host")))?;
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    Ok((scheme, format!("{host}:{port}")))
}

async fn accept_loop(listener: TcpListener, target: String, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        // Subscribed before the connection counts as open: a freeze from now on reaches it.
        let freezes = shared.freezes.subscribe();
        let target = target.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            if shared.freeze_new.load(Ordering::SeqCst) {
                // Held open, never read: the client's bytes sit in the proxy's kernel.
                shared
                    .held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(client);
                return;
            }
            let Ok(upstream) = TcpStream::connect(&target).await else {
                return; // the client sees its connection closed, as with an unreachable server
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            shared.open.fetch_add(1, Ordering::SeqCst);
            let frozen = forward(client, upstream, freezes).await;
            shared.open.fetch_sub(1, Ordering::SeqCst);
            if let Some(pair) = frozen {
                shared
                    .frozen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(pair);
            }
        });
    }
}

/// Copies bytes both ways until either side closes (`None`) or a freeze comes (the two
/// sockets, to be held open).
async fn forward(
    mut client: TcpStream,
    mut upstream: TcpStream,
    mut freezes: watch::Receiver<u64>,
) -> Option<(TcpStream, TcpStream)> {
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            biased;
            _ = freezes.changed() => return Some((client, upstream)),
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    tokio::select! {
                        biased;
                        _ = freezes.changed() => return Some((client, upstream)),
                        written = upstream.write_all(&up[..n]) => if written.is_err() { return None },
                    }
                }
            },
            read = upstream.read(&mut down) => match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    tokio::select! {
                        biased;
                        _ = freezes.changed() => return Some((client, upstream)),
                        written = client.write_all(&down[..n]) => if written.is_err() { return None },
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_frozen_connection_carries_nothing_and_a_new_one_works() {
        // An echo server upstream.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = PartitionProxy::start(&format!("http://{echo_addr}"))
            .await
            .unwrap();
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 4];
        old.write_all(b"ping").await.unwrap();
        old.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        assert_eq!(proxy.freeze(), 1);
        // The write is accepted (the proxy's kernel takes it), no answer comes, no close.
        old.write_all(b"ping").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(300), old.read(&mut buf)).await;
        assert!(
            silent.is_err(),
            "the frozen connection stays silent and open"
        );
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        new.write_all(b"pong").await.unwrap();
        new.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        assert_eq!(proxy.frozen_connections(), 1);
    }

    #[tokio::test]
    async fn connections_made_while_new_ones_freeze_are_silent_and_counted_as_frozen() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        let _echo = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Ok((mut conn, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        }));
        let proxy = PartitionProxy::start(&upstream.to_string()).await.unwrap();
        proxy.set_freeze_new_connections(true);
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 4];
        held.write_all(b"ping").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(300), held.read(&mut buf)).await;
        assert!(
            silent.is_err(),
            "a connection made during the partition stays silent and open"
        );
        assert_eq!(proxy.frozen_connections(), 1);
        assert_eq!(proxy.open_connections(), 0);

        proxy.set_freeze_new_connections(false);
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        new.write_all(b"pong").await.unwrap();
        new.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        assert_eq!(
            proxy.frozen_connections(),
            1,
            "the held one stays held, the new one works"
        );
    }
}
