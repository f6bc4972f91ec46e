//! `/debug/pprof/`: CPU profiles in pprof's format, Go's `--profiling` (on by default), served on
//! the secure port behind the same delegated authentication and authorization as `/metrics`
//! (the path is in no `--authorization-always-allow-paths` by default).
//!
//! - `/debug/pprof/profile?seconds=N`: samples the whole process's CPU time at 100 Hz for N
//!   seconds (30 when missing or not a positive integer, as Go) and answers the profile as a
//!   gzip-compressed `perftools.profiles.Profile`, as Go's `net/http/pprof` does: `go tool
//!   pprof https://.../debug/pprof/profile?seconds=10` reads it. One profile at a time, as in
//!   Go: a second request meanwhile gets 500. The sampler is `pprof` (tikv's, SIGPROF-based);
//!   a request that goes away before the end stops the profile early.
//! - `/debug/pprof/cmdline`: the command line, arguments separated by NUL bytes, as Go.
//! - `/debug/pprof/`: an index of these; `/debug/pprof` redirects there, as Go.
//! - Any other `/debug/pprof/<name>`: 404 `Unknown profile`. Go's heap, goroutine, block,
//!   mutex, threadcreate, allocs and trace profiles are Go runtime profiles with no Rust
//!   counterpart here (`--contention-profiling`, which turns on Go's block and mutex profiles,
//!   is accepted and warned about).

use std::io::Write as _;
use std::sync::mpsc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use pprof::protos::Message as _;
use serde::Deserialize;
use tokio::sync::oneshot;

/// Go's sampling rate (`runtime.SetCPUProfileRate` default).
const FREQUENCY_HZ: i32 = 100;

/// Go's profile length when `seconds` is missing or invalid.
const DEFAULT_SECONDS: u64 = 30;

/// The routes under `/debug/pprof`.
pub(crate) fn router() -> Router {
    Router::new()
        .route(
            "/debug/pprof",
            get(|| async { Redirect::to("/debug/pprof/") }),
        )
        .route("/debug/pprof/", get(index))
        .route("/debug/pprof/profile", get(profile))
        .route("/debug/pprof/cmdline", get(cmdline))
        .route("/debug/pprof/{name}", get(unknown))
}

async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        "<html><head><title>/debug/pprof/</title></head><body>\n\
         <p>Profiles:</p>\n<ul>\n\
         <li><a href=\"profile?seconds=30\">profile</a>: CPU profile; add <code>seconds=N</code> \
         for its length. After you get the profile file, use the <code>go tool pprof</code> \
         command to investigate the profile.</li>\n\
         <li><a href=\"cmdline\">cmdline</a>: the command line of the current program.</li>\n\
         </ul>\n</body></html>\n",
    )
        .into_response()
}

async fn cmdline() -> Response {
    let args: Vec<String> = std::env::args().collect();
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        args.join("\0"),
    )
        .into_response()
}

async fn unknown(Path(_name): Path<String>) -> Response {
    (
        StatusCode::NOT_FOUND,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "Unknown profile\n",
    )
        .into_response()
}

#[derive(Deserialize)]
struct ProfileQuery {
    seconds: Option<String>,
}

/// The profile's length: `seconds` when a positive integer, else Go's 30.
fn profile_length(seconds: Option<&str>) -> Duration {
    let seconds = seconds
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(DEFAULT_SECONDS);
    Duration::from_secs(seconds)
}

async fn profile(Query(query): Query<ProfileQuery>) -> Response {
    let length = profile_length(query.seconds.as_deref());
    // The sampler's guard is not `Send`: it lives on a thread of its own, which ends the
    // profile early when this request goes away (the `_stop` sender is dropped).
    let (_stop, stopped) = mpsc::channel::<()>();
    let (done, result) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("cpu-profile".into())
        .spawn(move || {
            let _ = done.send(cpu_profile(length, &stopped));
        });
    if let Err(e) = spawned {
        return server_error(format!("Could not enable CPU profiling: {e}"));
    }
    match result.await {
        Ok(Ok(body)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            body,
        )
            .into_response(),
        Ok(Err(message)) => server_error(message),
        Err(_) => server_error("Could not enable CPU profiling: the profiler stopped".into()),
    }
}

fn server_error(message: String) -> Response {
    tracing::warn!(%message, "CPU profile failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        message,
    )
        .into_response()
}

/// Samples the process for `length` (less if `stop` disconnects) and returns the profile,
/// gzip-compressed protobuf. Blocks the calling thread.
fn cpu_profile(length: Duration, stop: &mpsc::Receiver<()>) -> Result<Vec<u8>, String> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| match e {
            pprof::Error::Running => {
                "Could not enable CPU profiling: cpu profiling already in use".to_owned()
            }
            e => format!("Could not enable CPU profiling: {e}"),
        })?;
    if let Err(mpsc::RecvTimeoutError::Disconnected) = stop.recv_timeout(length) {
        return Err("the request went away before the profile ended".to_owned());
    }
    let report = guard.report().build().map_err(|e| e.to_string())?;
    drop(guard);
    let profile = report.pprof().map_err(|e| e.to_string())?;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&profile.encode_to_vec())
        .and_then(|()| gzip.finish())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_is_gos() {
        assert_eq!(profile_length(Some("5")), Duration::from_secs(5));
        for invalid in [
            None,
            Some(""),
            Some("0"),
            Some("-3"),
            Some("1.5"),
            Some("x"),
        ] {
            assert_eq!(
                profile_length(invalid),
                Duration::from_secs(30),
                "{invalid:?}"
            );
        }
    }
}
