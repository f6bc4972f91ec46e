//! `--profiling` (Go's flag, on by default): the `fake-ccm` binary serves CPU profiles at
//! `/debug/pprof/profile` on its secure port to whom `/metrics` is served (a bearer token the
//! API server's TokenReview authenticates and its SubjectAccessReview allows), as a
//! gzip-compressed pprof protobuf; anyone else is refused, and `--profiling=false` serves none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use pprof::protos::Message as _;

mod support;

use support::free_port;

const PROFILER: &str = "profiler-token";
const NOBODY: &str = "nobody-token";

fn https() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true) // the self-signed serving certificate
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Starts fake-ccm serving on a free port; returns it and the base URL once `/healthz`
/// answers and the process is still running (a process that exits first, e.g. because
/// something else took the port, is started again on another port).
async fn start(
    server: &ApiServer,
    config: &std::path::Path,
    extra: &[&str],
) -> (tokio::process::Child, String) {
    let client = https();
    for _ in 0..5 {
        let port = free_port();
        let mut ccm = support::fake_ccm(server, config, port)
            .args(extra)
            .spawn()
            .unwrap();
        let base = format!("https://127.0.0.1:{port}");
        for _ in 0..300 {
            if ccm.try_wait().unwrap().is_some() {
                break;
            }
            if let Ok(r) = client.get(format!("{base}/healthz")).send().await
                && r.status() == 200
                && ccm.try_wait().unwrap().is_none()
            {
                return (ccm, base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if ccm.try_wait().unwrap().is_none() {
            panic!("fake-ccm never served /healthz on {base}");
        }
    }
    panic!("fake-ccm exited before serving, five times");
}

async fn get(url: &str, token: Option<&str>) -> (u16, Vec<u8>) {
    let mut request = https().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

fn config_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "fake-ccm-profiling-{name}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, "zone: test-zone\n").unwrap();
    path
}

#[tokio::test]
async fn a_cpu_profile_is_served_as_pprof_to_whom_metrics_is() {
    let server = ApiServer::start().await;
    server.add_token(PROFILER, "profiler", &[]);
    server.allow_non_resource("profiler", "get", "/debug/pprof/*");
    server.allow_non_resource("profiler", "get", "/metrics");
    server.add_token(NOBODY, "nobody", &[]);
    let config = config_file("on");
    let (mut ccm, base) = start(&server, &config, &[]).await;

    // Refused without credentials (401) and to a user the SubjectAccessReview denies (403),
    // exactly as /metrics.
    let profile_url = format!("{base}/debug/pprof/profile?seconds=2");
    for path in ["/debug/pprof/profile?seconds=1", "/metrics"] {
        assert_eq!(get(&format!("{base}{path}"), None).await.0, 401, "{path}");
        assert_eq!(
            get(&format!("{base}{path}"), Some(NOBODY)).await.0,
            403,
            "{path}"
        );
    }

    // Two profiles asked for at once: one is served, the other refused as Go refuses it (one
    // CPU profile at a time), while the process is kept busy with TLS handshakes so that the
    // profile has samples.
    let profiles: Vec<_> = (0..2)
        .map(|_| {
            let url = profile_url.clone();
            tokio::spawn(async move { get(&url, Some(PROFILER)).await })
        })
        .collect();
    while !profiles.iter().all(|p| p.is_finished()) {
        let _ = get(&format!("{base}/metrics"), Some(PROFILER)).await;
    }
    let mut answers = Vec::new();
    for p in profiles {
        answers.push(p.await.unwrap());
    }
    answers.sort();
    let [(status, body), (refused, message)] = <[_; 2]>::try_from(answers).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(refused, 500);
    assert_eq!(
        String::from_utf8_lossy(&message),
        "Could not enable CPU profiling: cpu profiling already in use"
    );

    // A gzip-compressed perftools.profiles.Profile, as Go's net/http/pprof serves it.
    assert_eq!(&body[..2], &[0x1f, 0x8b], "gzip");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .unwrap();
    let profile = pprof::protos::Profile::decode(&raw[..]).unwrap();
    let string = |i: i64| profile.string_table[usize::try_from(i).unwrap()].as_str();
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (string(t.ty), string(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(profile.period, 10_000_000, "100 Hz, as Go");
    let seconds = Duration::from_nanos(u64::try_from(profile.duration_nanos).unwrap());
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(10)).contains(&seconds),
        "{seconds:?}"
    );
    assert!(!profile.sample.is_empty(), "a busy process has samples");
    assert!(
        profile
            .function
            .iter()
            .any(|f| string(f.name).contains("ccm_controllers") || string(f.name).contains("tokio")),
        "symbolized function names"
    );

    // The index and the command line; Go's runtime profiles are unknown here.
    let (status, index) = get(&format!("{base}/debug/pprof/"), Some(PROFILER)).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&index).contains("href=\"profile?seconds=30\""));
    let (status, cmdline) = get(&format!("{base}/debug/pprof/cmdline"), Some(PROFILER)).await;
    assert_eq!(status, 200);
    assert!(
        cmdline
            .split(|b| *b == 0)
            .any(|a| a == b"--cloud-provider=fake")
    );
    assert_eq!(
        get(&format!("{base}/debug/pprof/heap"), Some(PROFILER))
            .await
            .0,
        404
    );

    assert!(support::stop(&mut ccm).await.success());
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn profiling_false_serves_no_profile() {
    let server = ApiServer::start().await;
    server.add_token(PROFILER, "profiler", &[]);
    server.allow_non_resource("profiler", "get", "/debug/pprof/*");
    let config = config_file("off");
    let (mut ccm, base) = start(&server, &config, &["--profiling=false"]).await;
    let (status, _) = get(
        &format!("{base}/debug/pprof/profile?seconds=1"),
        Some(PROFILER),
    )
    .await;
    assert_eq!(status, 404);
    assert!(support::stop(&mut ccm).await.success());
    let _ = std::fs::remove_file(config);
}
