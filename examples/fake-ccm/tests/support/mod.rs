//! Starting and stopping the `fake-ccm` binary, shared by the tests that run it as a process.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;

/// `fake-ccm` against `server` with the FakeCloud config at `config`: no leader election, the
/// secure port `secure_port` on 127.0.0.1 (0: no HTTPS serving), no cloud routes, stdout
/// discarded, stderr inherited (the caller may change both), killed when dropped.
pub(crate) fn fake_ccm(
    server: &ApiServer,
    config: &Path,
    secure_port: u16,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"));
    cmd.arg(format!("--master={}", server.url()))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", config.display()))
        .arg("--leader-elect=false")
        .arg(format!("--secure-port={secure_port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--configure-cloud-routes=false")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// Sends `sig` (`TERM`, `KILL`, ...) to the process.
pub(crate) fn signal(ccm: &tokio::process::Child, sig: &str) {
    let pid = ccm.id().unwrap();
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// SIGTERM, then its exit status (within 60 s).
pub(crate) async fn stop(ccm: &mut tokio::process::Child) -> ExitStatus {
    signal(ccm, "TERM");
    tokio::time::timeout(Duration::from_secs(60), ccm.wait())
        .await
        .unwrap()
        .unwrap()
}

/// A port on 127.0.0.1 nothing listens on right now, for a process's `--secure-port`; never
/// the same one twice in this test binary (the OS may hand a just-released port out again, and
/// two tests running in parallel would then start their processes on one port).
pub(crate) fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
}
