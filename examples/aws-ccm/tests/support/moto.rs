//! A real moto server (`moto[server]`, pinned) for the tests and the benchmark.
//!
//! On first use it is installed by this file into `examples/aws-ccm/.moto-venv` (a Python
//! virtual environment, git-ignored), under a file lock so that test binaries running in
//! parallel install it once. Each [`Moto`] is its own `moto_server` process on a loopback port
//! it binds itself, with its own state, killed when dropped. Nothing is skipped: a machine that
//! cannot get moto fails the tests with a message naming what is missing.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The moto release the tests are written against.
pub const MOTO_REQUIREMENT: &str = "moto[server]==5.2.1";

/// A running `moto_server`.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Installs moto if needed, then starts a server on a port of its own and waits until it
    /// answers HTTP.
    ///
    /// The server binds port 0 and the port is read from its startup line: a port picked here
    /// and handed over could be picked by a parallel test too before either server binds it,
    /// and the test whose server lost the race would talk to the other test's server until that
    /// one is killed (connection refused mid-test: seen in CI).
    pub fn start() -> Moto {
        let server = ensure_installed();
        let mut child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server.display()));
        let stderr = child.stderr.take().unwrap();
        let (port_tx, port_rx) = mpsc::channel();
        // Reads the startup lines until the port, then drains the request log for the server's
        // lifetime (a full pipe would block the server).
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            let mut startup = String::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(tx) = &port_tx {
                    startup.push_str(&line);
                    startup.push('\n');
                    if let Some(port) = listening_port(&line) {
                        let _ = tx.send(Ok(port));
                        port_tx = None;
                    }
                }
            }
            if let Some(tx) = port_tx {
                let _ = tx.send(Err(startup));
            }
        });
        let port = match port_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(port)) => port,
            Ok(Err(startup)) => {
                let _ = child.wait();
                panic!("moto_server exited before listening:\n{startup}")
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("moto_server did not say which port it listens on within 60 s")
            }
        };
        let mut moto = Moto { child, port };
        moto.wait_answering(Duration::from_secs(60));
        moto
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the server answers an HTTP request (an answer, not only an accepted
    /// connection: a connection to an unused local port can be a TCP self-connect).
    fn wait_answering(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("moto_server exited ({status}) before answering");
            }
            if self.answers() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "moto_server on port {} did not answer within {timeout:?}",
            self.port
        );
    }

    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        if stream
            .write_all(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut head = [0u8; 8];
        stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
    }
}

/// The port in werkzeug's startup line ` * Running on http://127.0.0.1:<port>`.
fn listening_port(line: &str) -> Option<u16> {
    let rest = line.split("Running on http://127.0.0.1:").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|port| *port != 0)
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn venv_dir() -> PathBuf {
    match std::env::var_os("AWS_CCM_MOTO_VENV") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".moto-venv"),
    }
}

/// The path of `moto_server` in the virtual environment, installing it first if needed.
pub fn ensure_installed() -> PathBuf {
    let venv = venv_dir();
    let server = venv.join("bin").join("moto_server");
    let marker = venv.join(format!(
        ".installed-{}",
        MOTO_REQUIREMENT.replace(['[', ']', '='], "_")
    ));
    if marker.exists() && server.exists() {
        return server;
    }
    std::fs::create_dir_all(venv.parent().unwrap()).unwrap();
    let lock_path = venv.with_extension("lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    fs4::fs_std::FileExt::lock_exclusive(&lock).unwrap();
    if !(marker.exists() && server.exists()) {
        install(&venv);
        std::fs::write(&marker, MOTO_REQUIREMENT).unwrap();
    }
    fs4::fs_std::FileExt::unlock(&lock).unwrap();
    server
}

fn install(venv: &Path) {
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .unwrap_or_else(|| {
            panic!(
                "the aws-ccm tests run a moto server ({MOTO_REQUIREMENT}) and install it into {}: \
                 python3 is missing (install python3 with its venv module, e.g. `apt-get install python3-venv`)",
                venv.display()
            )
        });
    eprintln!(
        "installing {MOTO_REQUIREMENT} into {} (once) ...",
        venv.display()
    );
    let _ = std::fs::remove_dir_all(venv);
    run(
        Command::new(python).args(["-m", "venv"]).arg(venv),
        "python3 -m venv failed: the venv module is missing (e.g. `apt-get install python3-venv`)",
    );
    let pip = venv.join("bin").join("pip");
    run(
        Command::new(&pip).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            MOTO_REQUIREMENT,
        ]),
        "pip could not install moto (is PyPI reachable? a proxy set in PIP_INDEX_URL?)",
    );
}

fn run(command: &mut Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    if !output.status.success() {
        panic!(
            "{what}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
