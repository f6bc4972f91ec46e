//! The CCM process: fake-ccm started with its FakeCloud configuration, its `/metrics`, and its
//! memory and CPU from `/proc`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cli::Opts;
use crate::environment::{Env, LB_IP};

/// How long [`Ccm::metrics`] retries a failed read of `/metrics` before the run stops.
const METRICS_RETRY: Duration = Duration::from_secs(15);

pub(crate) struct Ccm {
    pub(crate) child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) http: kube::Client,
    pub(crate) log: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) clk_tck: f64,
    /// Started under `--ccm-wrapper` in a process group of its own, which is signalled whole
    /// (the wrapper's children would outlive a signal to the wrapper alone).
    pub(crate) group: bool,
    /// From the spawn to the first `/readyz` 200 (informers synced: with `--leader-elect=false`
    /// this is a restart's "process start → every informer synced").
    pub(crate) ready_after: Duration,
    /// Peak RSS (VmHWM) at that moment, in KB.
    pub(crate) ready_hwm_kb: u64,
}

impl Ccm {
    /// SIGTERM to fake-ccm itself, also when it runs under a wrapper (which then finishes,
    /// e.g. writes its profile, and exits).
    pub(crate) fn terminate(&self) {
        let pid = self.pid.to_string();
        let _ = if self.group {
            std::process::Command::new("pkill")
                .args(["-TERM", "-g", &pid, "-x", "fake-ccm"])
                .status()
        } else {
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
        };
    }
}

impl Drop for Ccm {
    fn drop(&mut self) {
        // `kill_on_drop` reaches the wrapper only; its process group holds the rest.
        if self.group {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pid)])
                .status();
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcStats {
    pub(crate) rss_kb: u64,
    pub(crate) hwm_kb: u64,
    pub(crate) cpu_s: f64,
}

/// Prometheus text: (name, labels) -> value.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metrics(pub(crate) Vec<(String, BTreeMap<String, String>, f64)>);

impl Metrics {
    pub(crate) fn parse(text: &str) -> Metrics {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            // Label values here never contain `",` (operation names, codes, methods, hosts).
            for pair in labels.split("\",") {
                if let Some((k, v)) = pair.split_once("=\"") {
                    map.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
                }
            }
            out.push((name.to_string(), map, value));
        }
        Metrics(out)
    }

    /// Sums `name` by the value of `label`.
    pub(crate) fn by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (n, labels, v) in &self.0 {
            if n == name {
                let key = labels.get(label).cloned().unwrap_or_default();
                *out.entry(key).or_insert(0.0) += v;
            }
        }
        out
    }

    /// Sums `name` by the value of `label`, over the series whose label `filter.0` is
    /// `filter.1` (e.g. one operation's calls by result).
    pub(crate) fn by_where(
        &self,
        name: &str,
        label: &str,
        filter: (&str, &str),
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (n, labels, v) in &self.0 {
            if n == name && labels.get(filter.0).map(String::as_str) == Some(filter.1) {
                let key = labels.get(label).cloned().unwrap_or_default();
                *out.entry(key).or_insert(0.0) += v;
            }
        }
        out
    }

    /// Cloud calls by result (`ok`, `retry` for a call the quota rejected, ...).
    pub(crate) fn cloud_results(&self) -> BTreeMap<String, f64> {
        self.by("cloud_provider_requests_total", "result")
    }

    pub(crate) fn cloud_calls(&self) -> BTreeMap<String, f64> {
        self.by("cloud_provider_requests_total", "operation")
    }

    /// API requests by method, reads (`GET`) left out: what "the CCM went quiet" is judged
    /// on, since the informers' watches end every 10 s and are resumed at once (a `GET` each:
    /// issue 42's liveness bound), so even a quiet CCM reads.
    pub(crate) fn api_writes(&self) -> BTreeMap<String, f64> {
        let mut writes = self.by("rest_client_requests_total", "method");
        writes.retain(|method, _| method != "GET");
        writes
    }
}

pub(crate) fn diff(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

pub(crate) fn clk_tck() -> f64 {
    // `getconf CLK_TCK` instead of libc::sysconf: the workspace forbids unsafe code.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

impl Ccm {
    pub(crate) async fn start(env: &Env, opts: &Opts, routes: bool) -> Ccm {
        Ccm::start_with(env, opts, routes, "").await
    }

    /// As [`Ccm::start`], with `extra_config` appended to FakeCloud's cloud config (e.g. a
    /// `state_file:` shared by two processes).
    pub(crate) async fn start_with(
        env: &Env,
        opts: &Opts,
        routes: bool,
        extra_config: &str,
    ) -> Ccm {
        Ccm::start_named(env, opts, routes, extra_config, "").await
    }

    /// As [`Ccm::start_with`], for one of several replicas running at once: `replica` names
    /// its log and cloud config files. With `--leader-elect...` in `opts.ccm_args` it runs
    /// with leader election (else `--leader-elect=false`); it is then ready, and this returns,
    /// as soon as it stands by.
    pub(crate) async fn start_named(
        env: &Env,
        opts: &Opts,
        routes: bool,
        extra_config: &str,
        replica: &str,
    ) -> Ccm {
        let dir = std::env::temp_dir();
        let config = dir.join(format!("{}{replica}-fake-cloud.yaml", env.run));
        // One ingress IP for every load balancer: the Services created `ready` carry it.
        let mut cloud_config = format!("latency_ms: {}\nlb_ip: {LB_IP}\n", opts.latency_ms);
        if let Some(quota) = opts.quota {
            let burst = quota.ceil().max(1.0) as u32;
            cloud_config.push_str(&format!(
                "quota:\n  overall: {{per_second: {quota}, burst: {burst}}}\n"
            ));
        }
        if opts.batch || opts.lb_batch {
            cloud_config.push_str("capabilities:\n");
        }
        if opts.batch {
            cloud_config.push_str("  instances_batch: true\n");
        }
        if opts.lb_batch {
            cloud_config.push_str("  load_balancer_hosts_batch: true\n");
        }
        if let Some(max) = opts.max_batch_size {
            cloud_config.push_str(&format!("max_batch_size: {max}\n"));
        }
        cloud_config.push_str(extra_config);
        std::fs::write(&config, cloud_config).unwrap();
        let log = dir.join(format!("{}{replica}-fake-ccm.log", env.run));
        let port = crate::support::free_port();
        let binary = env!("CARGO_BIN_EXE_fake-ccm");
        let mut cmd = match opts.ccm_wrapper.as_deref().map(str::split_whitespace) {
            Some(mut words) => {
                let mut cmd =
                    tokio::process::Command::new(words.next().expect("empty --ccm-wrapper"));
                cmd.args(words).arg(binary).process_group(0);
                cmd
            }
            None => tokio::process::Command::new(binary),
        };
        match (&env.server, &env.kubeconfig) {
            (Some(s), _) => cmd.arg(format!("--master={}", s.url())),
            (None, Some(k)) => cmd.arg(format!("--kubeconfig={}", k.display())),
            (None, None) => unreachable!(),
        };
        let election = opts
            .ccm_args
            .iter()
            .any(|a| a == "--leader-elect" || a.starts_with("--leader-elect="));
        if !election {
            cmd.arg("--leader-elect=false");
        }
        cmd.arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", config.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            // HTTPS with a self-signed certificate and delegated authorisation, as in Go;
            // the harness reads /metrics without credentials.
            .arg("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics");
        if routes {
            cmd.arg("--configure-cloud-routes=true")
                .arg("--cluster-cidr=10.0.0.0/8");
        } else {
            cmd.arg("--configure-cloud-routes=false");
        }
        cmd.args(&opts.ccm_args);
        if !opts.ccm_log_directives.is_empty() {
            // RUST_LOG wins over `-v`: on top of the harness's own RUST_LOG, else `info`.
            let base = std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "info".to_owned());
            let spec = std::iter::once(base.as_str())
                .chain(opts.ccm_log_directives.iter().copied())
                .collect::<Vec<_>>()
                .join(",");
            cmd.env("RUST_LOG", spec);
        }
        let logfile = std::fs::File::create(&log).unwrap();
        let spawned = Instant::now();
        let child = cmd
            .stdout(Stdio::from(logfile.try_clone().unwrap()))
            .stderr(Stdio::from(logfile))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        eprintln!(
            "[bench] fake-ccm pid {pid}, metrics on 127.0.0.1:{port}, log {}",
            log.display()
        );
        let url: http::Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let mut http_config = kube::Config::new(url);
        http_config.accept_invalid_certs = true;
        let http = kube::Client::try_from(http_config).unwrap();
        let mut ccm = Ccm {
            child,
            pid,
            http,
            log,
            config,
            clk_tck: clk_tck(),
            group: opts.ccm_wrapper.is_some(),
            ready_after: Duration::ZERO,
            ready_hwm_kb: 0,
        };
        ccm.wait_ready(Duration::from_secs(600)).await;
        ccm.ready_after = spawned.elapsed();
        ccm.ready_hwm_kb = ccm.proc().hwm_kb;
        if let Some(synced) = ccm.synced_after_start() {
            // The harness may see /readyz late when it is busy serving the API: the CCM's
            // own log line is the figure.
            ccm.ready_after = synced;
        }
        eprintln!(
            "[bench] fake-ccm ready {:.2} s after its start (peak RSS {:.1} MB)",
            ccm.ready_after.as_secs_f64(),
            ccm.ready_hwm_kb as f64 / 1024.0
        );
        ccm
    }

    /// From fake-ccm's first log line ("starting cloud-controller-manager") to its "shared
    /// informers synced", by the log's own timestamps.
    fn synced_after_start(&self) -> Option<Duration> {
        let started = self.logged_at("starting cloud-controller-manager")?;
        let synced = self.logged_at("shared informers synced")?;
        Duration::try_from(synced.duration_since(started)).ok()
    }

    /// The timestamp of the first line of fake-ccm's log that contains `needle`.
    pub(crate) fn logged_at(&self, needle: &str) -> Option<jiff::Timestamp> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log.lines().find(|l| l.contains(needle))?;
        line_time(line)
    }

    pub(crate) async fn get(&self, path: &str) -> Result<String, kube::Error> {
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        self.http.request_text(req).await
    }

    pub(crate) async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.get("/readyz").await.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("[bench] fake-ccm exited with {status}:\n{log}");
            }
            if Instant::now() > deadline {
                panic!(
                    "[bench] fake-ccm not ready after {timeout:?}; log {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the CCM has sent no API request for 3 s (its own client metrics; at most
    /// 120 s), so that writes still queued behind the client rate limiter are counted.
    /// Waits until the CCM's Event writer holds nothing back (`event_recorder_held` 0: no
    /// repeat waiting for its window, no summary waiting for its burst to end; at most 120 s),
    /// then for [`Ccm::quiet`]: the Events of the run are then all written and counted.
    pub(crate) async fn events_settled(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let held: f64 = self
                .metrics()
                .await
                .0
                .iter()
                .filter(|(name, _, _)| name == "event_recorder_held")
                .map(|(_, _, v)| *v)
                .sum();
            if held == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.quiet().await;
    }

    pub(crate) async fn quiet(&self) {
        let still = Duration::from_secs(3);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = -1.0;
        let mut since = Instant::now();
        while Instant::now() < deadline {
            let total: f64 = self.metrics().await.api_writes().values().sum();
            if total != last {
                last = total;
                since = Instant::now();
            } else if since.elapsed() >= still {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!("[bench] the CCM still writes after 120 s; measuring anyway");
    }

    /// The CCM's `/metrics`. A failed read is retried with backoff for up to
    /// [`METRICS_RETRY`] (a connection reset by a CCM busy with 100,000 Nodes once ended a
    /// failover run that had been going for six minutes), then the run stops with the last
    /// error and the CCM's log.
    pub(crate) async fn metrics(&self) -> Metrics {
        let deadline = Instant::now() + METRICS_RETRY;
        let mut wait = Duration::from_millis(100);
        loop {
            match self.get("/metrics").await {
                Ok(text) => return Metrics::parse(&text),
                Err(error) if Instant::now() + wait < deadline => {
                    eprintln!(
                        "[bench] reading fake-ccm's /metrics failed ({error}); retrying in {wait:?}"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(error) => panic!(
                    "[bench] fake-ccm's /metrics could not be read for {METRICS_RETRY:?}: {error}; log {}",
                    self.log.display()
                ),
            }
        }
    }

    pub(crate) fn proc(&self) -> ProcStats {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ProcStats {
            rss_kb: field("VmRSS:"),
            hwm_kb: field("VmHWM:"),
            cpu_s: ticks as f64 / self.clk_tck,
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; its exit code, `None` when
    /// it still runs (or was killed by a signal).
    pub(crate) async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }

    /// SIGTERM, then up to 30 s for a graceful exit.
    pub(crate) async fn stop(mut self) {
        self.terminate();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(s)) if s.success() => {}
            Ok(Ok(s)) => eprintln!(
                "[bench] fake-ccm exited with {s}; log {}",
                self.log.display()
            ),
            _ => {
                eprintln!("[bench] fake-ccm did not stop within 30 s; killing it");
                let _ = self.child.kill().await;
            }
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Polls the CCM's cloud-call counters for `ops` and remembers when they last changed.
pub(crate) struct CallWatch {
    pub(crate) last_change: Arc<Mutex<Option<Instant>>>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl CallWatch {
    pub(crate) fn start(ccm: &Ccm, ops: &'static [&'static str]) -> CallWatch {
        let last_change = Arc::new(Mutex::new(None));
        let lc = last_change.clone();
        let http = ccm.http.clone();
        let task = tokio::spawn(async move {
            let mut last = -1.0;
            loop {
                let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
                if let Ok(text) = http.request_text(req).await {
                    let now = Instant::now();
                    let calls = Metrics::parse(&text).cloud_calls();
                    let total: f64 = ops.iter().filter_map(|o| calls.get(*o)).sum();
                    if last >= 0.0 && total != last {
                        *lc.lock().unwrap() = Some(now);
                    }
                    last = total;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        CallWatch { last_change, task }
    }

    pub(crate) fn last_change(&self) -> Option<Instant> {
        *self.last_change.lock().unwrap()
    }
}

impl Drop for CallWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The time in the klog header of a line of fake-ccm's log (`I1127 20:35:19.717632 ...`:
/// local time, month and day without a year; the year is the harness's own, or the one before
/// when that would put the line in the future, across New Year's Eve).
pub(crate) fn line_time(line: &str) -> Option<jiff::Timestamp> {
    let header = line.get(1..21)?;
    let digits = |range: std::ops::Range<usize>| header.get(range)?.parse::<i32>().ok();
    let (month, day) = (digits(0..2)?, digits(2..4)?);
    let (hour, minute, second) = (digits(5..7)?, digits(8..10)?, digits(11..13)?);
    let micros = digits(14..20)?;
    let now = jiff::Zoned::now();
    let at = |year: i16| {
        jiff::civil::DateTime::new(
            year,
            i8::try_from(month).ok()?,
            i8::try_from(day).ok()?,
            i8::try_from(hour).ok()?,
            i8::try_from(minute).ok()?,
            i8::try_from(second).ok()?,
            micros * 1000,
        )
        .ok()?
        .to_zoned(now.time_zone().clone())
        .ok()
        .map(|z| z.timestamp())
    };
    let this_year = at(now.year())?;
    if this_year > now.timestamp() + jiff::SignedDuration::from_hours(24) {
        at(now.year() - 1)
    } else {
        Some(this_year)
    }
}

/// Reads fake-ccm's log as it grows: each call returns the complete lines written since the
/// last one that contain a needle (a 100,000-Node run's log is too large to read whole at
/// every poll).
pub(crate) struct LogTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl LogTail {
    /// From the start of `ccm`'s log.
    pub(crate) fn new(ccm: &Ccm) -> LogTail {
        LogTail {
            path: ccm.log.clone(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The new complete lines containing `needle`.
    pub(crate) fn lines_containing(&mut self, needle: &str) -> Vec<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut buf = std::mem::take(&mut self.partial);
        if let Ok(mut f) = std::fs::File::open(&self.path)
            && f.seek(SeekFrom::Start(self.offset)).is_ok()
            && let Ok(read) = f.read_to_end(&mut buf)
        {
            self.offset += read as u64;
        }
        let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.partial = buf.split_off(complete);
        String::from_utf8_lossy(&buf)
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// FakeCloud's "load balancers by host count" line
/// (`ccm-testing/src/fake_cloud/host_counts.rs`): its time and host count -> load balancers.
pub(crate) fn host_counts_line(line: &str) -> Option<(jiff::Timestamp, BTreeMap<usize, usize>)> {
    let at = line_time(line)?;
    let field = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("by_host_count="))?
        .trim_matches('"');
    let mut counts = BTreeMap::new();
    if field != "none" {
        for pair in field.split(',') {
            let (hosts, lbs) = pair.split_once('=')?;
            counts.insert(hosts.parse().ok()?, lbs.parse().ok()?);
        }
    }
    Some((at, counts))
}

/// The message of that line.
pub(crate) const HOST_COUNTS_MESSAGE: &str = "fake cloud: load balancers by host count";
