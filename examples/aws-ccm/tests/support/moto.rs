//! A real moto server (`moto[server]`, pinned) for the tests and the benchmark.
//!
//! On first use it is installed by this file into `examples/aws-ccm/.moto-venv` (a Python
//! virtual environment, git-ignored), under a file lock so that test binaries running in
//! parallel install it once. Each [`Moto`] is its own `moto_server` process on a free loopback
//! port, with its own state, killed when dropped. Nothing is skipped: a machine that cannot get
//! moto fails the tests with a message naming what is missing.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The moto release the tests are written against.
pub const MOTO_REQUIREMENT: &str = "moto[server]==5.2.1";

/// A running `moto_server`.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Installs moto if needed, then starts a server on a free port and waits until it answers.
    pub fn start() -> Moto {
        let server = ensure_installed();
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new(&server)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", server.display()));
            let mut moto = Moto { child, port };
            if moto.wait_ready(Duration::from_secs(60)) {
                return moto;
            }
            // Lost the port to someone else (or a slow start): try another one.
            let _ = moto.child.kill();
        }
        panic!("moto_server did not start on any of five free ports");
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.write_all(b"GET /moto-api/ HTTP/1.0\r\n\r\n");
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
