//! Test logging: the runtime's logs in the test's captured output, at a level a test chooses.
//!
//! `cargo test` shows a test's output only when it fails, but only output written through the
//! test harness's capture (`print!`), not straight to stderr. [`init`] installs, once per test
//! process, a global `tracing` subscriber that writes through that capture
//! (`tracing-subscriber`'s test writer), filtered by the environment variable [`LOG_ENV`]
//! (`CCM_TEST_LOG`, an `EnvFilter` directive list such as `ccm_controllers=debug,info`;
//! [`DEFAULT_DIRECTIVES`] when unset). [`ControllerHarness`](crate::harness::ControllerHarness)
//! calls it; a test that runs the whole runtime (`Builder::run_async`) calls it first, so that
//! the runtime's own logging setup (which keeps an already installed subscriber) logs there too.
//!
//! A global subscriber is one per process, shared by the tests running in parallel, so one test
//! cannot turn it up alone. [`capture`] turns the logs up for one test instead: it installs a
//! subscriber for the test's thread until the returned guard drops. With `#[tokio::test]`
//! (a current-thread runtime) every task of the test runs on that thread, so it sees all of
//! the test's logs; with a multi-threaded runtime use `CCM_TEST_LOG`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let _log = ccm_testing::logging::capture("ccm_controllers=debug,info");
//! tracing::debug!(target: "ccm_controllers", "shown in this test's output");
//! # }
//! ```

use std::sync::Once;

use tracing_subscriber::EnvFilter;

/// The environment variable with the global filter of the test logs.
pub const LOG_ENV: &str = "CCM_TEST_LOG";

/// The filter when [`LOG_ENV`] is unset: what the runtime logs by default (`-v=0`).
pub const DEFAULT_DIRECTIVES: &str = "info";

static INIT: Once = Once::new();

/// Installs the global test subscriber (once per process; later calls do nothing, and so does
/// this call if another global subscriber is installed already). An invalid `CCM_TEST_LOG`
/// falls back to [`DEFAULT_DIRECTIVES`] with a warning in the log.
pub fn init() {
    INIT.call_once(|| {
        let (filter, invalid) = match std::env::var(LOG_ENV) {
            Ok(directives) if !directives.trim().is_empty() => {
                match EnvFilter::try_new(&directives) {
                    Ok(f) => (f, None),
                    Err(e) => (EnvFilter::new(DEFAULT_DIRECTIVES), Some((directives, e))),
                }
            }
            _ => (EnvFilter::new(DEFAULT_DIRECTIVES), None),
        };
        let installed = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init()
            .is_ok();
        if let Some((directives, e)) = invalid
            && installed
        {
            tracing::warn!(
                "{LOG_ENV}={directives:?} is not a valid filter ({e}); using {DEFAULT_DIRECTIVES:?}"
            );
        }
    });
}

/// Logs of the current thread at `directives` (an `EnvFilter` list, e.g.
/// `"ccm_controllers=debug,info"`), written to the test's captured output, until the guard
/// drops. See the [module docs](self) for what "the current thread" covers.
///
/// # Panics
///
/// When `directives` is not a valid filter.
#[allow(clippy::panic)] // test helper: a misspelt filter must stop the test loudly
pub fn capture(directives: &str) -> TestLog {
    let filter = match EnvFilter::try_new(directives) {
        Ok(f) => f,
        Err(e) => panic!("logging::capture: {directives:?} is not a valid filter: {e}"),
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .finish();
    TestLog {
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

/// Keeps the logging of [`capture`] for the current thread until dropped.
#[derive(Debug)]
#[must_use = "the logging of `capture` ends when this guard drops"]
pub struct TestLog {
    _guard: tracing::subscriber::DefaultGuard,
}

/// Records the logs of the current thread at `directives` (as [`capture`]) into memory, so a
/// test can assert what was logged, until the returned guard drops. Plain text, one line per
/// event with its fields (`tracing-subscriber`'s default format, no colours). See the
/// [module docs](self) for what "the current thread" covers: use it in a current-thread
/// `#[tokio::test]`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let log = ccm_testing::logging::record("warn");
/// tracing::warn!(object = "default/web", "SyncLoadBalancerFailed: no capacity");
/// tracing::info!("not recorded at warn");
/// assert!(log.contains("SyncLoadBalancerFailed: no capacity"));
/// assert_eq!(log.lines_containing("default/web").len(), 1);
/// assert!(!log.contains("not recorded"));
/// # }
/// ```
///
/// # Panics
///
/// When `directives` is not a valid filter.
#[allow(clippy::panic)] // test helper: a misspelt filter must stop the test loudly
pub fn record(directives: &str) -> RecordedLog {
    let filter = match EnvFilter::try_new(directives) {
        Ok(f) => f,
        Err(e) => panic!("logging::record: {directives:?} is not a valid filter: {e}"),
    };
    let buffer = LogBuffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    RecordedLog {
        buffer,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

/// What [`record`] has recorded so far; recording ends when it drops.
#[derive(Debug)]
#[must_use = "the recording of `record` ends when this guard drops"]
pub struct RecordedLog {
    buffer: LogBuffer,
    _guard: tracing::subscriber::DefaultGuard,
}

impl RecordedLog {
    /// Everything recorded so far.
    pub fn text(&self) -> String {
        let bytes = crate::apiserver::lock_ignoring_poison(&self.buffer.0);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether a recorded line contains `needle`.
    pub fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// The recorded lines that contain `needle`.
    pub fn lines_containing(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// The shared buffer [`record`] writes into.
#[derive(Debug, Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::apiserver::lock_ignoring_poison(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
