//! `cargo run --release -p quickstart`: a real cloud-controller-manager (all four controllers,
//! leader election on) against an in-process Kubernetes API server and a fake cloud, playing a
//! cluster bring-up. Exits 0 only if the final state is the expected one.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use quickstart::{PlayOptions, Progress, play};

/// Plays a cluster bring-up against a real CCM with a fake cloud.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Nodes that register (as kubelets with --cloud-provider=external do).
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 10)]
    services: usize,
    /// Nodes that leave (their instances disappear) after the Services are up.
    #[arg(long, default_value_t = 3)]
    leaving: usize,
    /// Latency of every fake cloud call, in milliseconds.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Play against this real cluster instead of the in-process API server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Seconds each phase may take before the play gives up.
    #[arg(long, default_value_t = 120)]
    phase_timeout: u64,
}

/// Progress bars on a terminal, plain lines otherwise.
struct Console {
    bar: Mutex<Option<ProgressBar>>,
    terminal: bool,
}

impl Progress for Console {
    fn start(&self, phase: &str, total: usize) {
        if self.terminal {
            let bar = ProgressBar::new(total as u64);
            if let Ok(style) =
                ProgressStyle::with_template("{msg:<30} [{bar:40}] {pos}/{len} {elapsed}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(phase.to_owned());
            *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
        } else {
            println!("{phase}: 0/{total}");
        }
    }
    fn update(&self, done: usize) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            bar.set_position(done as u64);
        }
    }
    fn finish(&self, message: &str) {
        match self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(bar) => bar.finish_with_message(message.to_owned()),
            None => println!("{message}"),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The CCM runs in this process and would log every step at INFO; the quickstart shows its
    // own progress instead. Installed first, this subscriber wins over the runtime's (which
    // keeps an existing one). `RUST_LOG=info` brings the CCM's logs back.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let options = PlayOptions {
        nodes: args.nodes,
        services: args.services,
        leaving: args.leaving,
        latency: Duration::from_millis(args.latency_ms),
        kubeconfig: args.kubeconfig,
        phase_timeout: Duration::from_secs(args.phase_timeout),
    };
    let console = Console {
        bar: Mutex::new(None),
        terminal: std::io::stdout().is_terminal(),
    };
    println!(
        "quickstart: {} nodes, {} LoadBalancer Services, {} nodes leaving, cloud latency {} ms",
        options.nodes, options.services, options.leaving, args.latency_ms
    );
    match play(&options, &console).await {
        Ok(report) => {
            println!("{}", report.render());
            if report.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("quickstart failed: {e}");
            ExitCode::FAILURE
        }
    }
}
