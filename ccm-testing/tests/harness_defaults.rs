//! The harness's defaults, as a vendor's tests meet them, against the checked-in record
//! `ccm-testing/harness-defaults.txt`.
//!
//! A test written against the harness depends on its defaults: the flags the controller harness
//! starts controllers with, its backoff and timeouts, what the in-process API server adds beyond
//! storing (its admission switches), what `FakeCloud` answers when configured
//! with nothing, the conformance checks a report lists. A change to any of them changes what a
//! vendor's tests see without a compile error, so it must be deliberate: this test fails until
//! the record is rewritten (`CCM_BLESS=1 cargo test -p ccm-testing --test harness_defaults`), and
//! `.ci/changelog_check.py` fails a commit that rewrites the record without a CHANGELOG.md line.

use std::fmt::Write as _;
use std::path::Path;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::conformance::Check;
use ccm_testing::fake_cloud::{FakeCloudConfig, OPERATIONS};
use ccm_testing::harness::{
    HARNESS_IDENTITY, SETTLE_TIMEOUT, STOP_TIMEOUT, TEST_FLAGS, TEST_RETRY_BACKOFF,
};

const RECORD: &str = "harness-defaults.txt";

fn render() -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(
        "# The harness's defaults (ccm-testing/tests/harness_defaults.rs writes and checks this)."
            .into(),
    );
    line(String::new());
    line("## harness (ccm_testing::harness)".into());
    line(format!("TEST_FLAGS = {TEST_FLAGS:?}"));
    line(format!(
        "TEST_RETRY_BACKOFF = base {:?}, max {:?}",
        TEST_RETRY_BACKOFF.base, TEST_RETRY_BACKOFF.max
    ));
    line(format!("SETTLE_TIMEOUT = {SETTLE_TIMEOUT:?}"));
    line(format!("STOP_TIMEOUT = {STOP_TIMEOUT:?}"));
    line(format!("HARNESS_IDENTITY = {HARNESS_IDENTITY:?}"));
    line(format!(
        "KUBECONFIG_ENV = {:?}",
        ccm_testing::KUBECONFIG_ENV
    ));
    line(String::new());
    line(
        "## the in-process API server's behaviours (ApiServer::builder() / ApiServer::start())"
            .into(),
    );
    line(format!("{:#?}", ApiServer::builder()));
    line(String::new());
    line("## FakeCloudConfig::default() (YAML, as a cloud-config file)".into());
    let yaml = serde_norway::to_string(&FakeCloudConfig::default())
        .unwrap_or_else(|e| panic!("FakeCloudConfig::default() does not serialise: {e}"));
    for l in yaml.lines() {
        line(l.to_owned());
    }
    line(format!("operations = {OPERATIONS:?}"));
    line(String::new());
    line("## conformance checks (Check::ALL, in report order)".into());
    for check in Check::ALL {
        line(check.name().to_owned());
    }
    out
}

#[test]
fn harness_defaults_match_the_record() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORD);
    let now = render();
    if std::env::var_os("CCM_BLESS").is_some() {
        std::fs::write(&path, &now)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let recorded = std::fs::read_to_string(&path).unwrap_or_default();
    if recorded != now {
        let mut diff = String::new();
        for l in recorded.lines().filter(|l| !now.lines().any(|n| n == *l)) {
            let _ = writeln!(diff, "- {l}");
        }
        for l in now.lines().filter(|l| !recorded.lines().any(|r| r == *l)) {
            let _ = writeln!(diff, "+ {l}");
        }
        panic!(
            "the harness's defaults changed (a vendor's tests see this without a compile \
             error):\n{diff}\nIf intended: CCM_BLESS=1 cargo test -p ccm-testing --test \
             harness_defaults, commit {RECORD}, and add a CHANGELOG.md line saying what a \
             vendor has to do."
        );
    }
}
