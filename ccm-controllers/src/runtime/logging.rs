//! Logging: the global `tracing` subscriber the logging flags configure, writing Go's log
//! formats (format.rs): klog's text header or component-base's JSON.

mod format;

use crate::options::{LogFormat, LoggingArgs};

/// Installs the global tracing subscriber (once per process; later calls keep the first).
/// `RUST_LOG` wins over `-v` and `--vmodule`; `--logging-format` picks klog's text or Go's
/// JSON; with `--log-{text,json}-split-stream`, errors go to stderr and the rest to stdout
/// (Go's split). Neither format has colours, whether stderr is a terminal or not.
pub(super) fn init_logging(args: &LoggingArgs) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let (directives, _) = args.vmodule_directives();
        let spec = std::iter::once(args.level().to_owned())
            .chain(directives)
            .collect::<Vec<_>>()
            .join(",");
        EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new(args.level()))
    });
    let writer = if args.split_stream() {
        BoxMakeWriter::new(
            std::io::stderr
                .with_max_level(tracing::Level::ERROR)
                .or_else(std::io::stdout),
        )
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .event_format(format::GoFormat::new(args.log_format == LogFormat::Json))
        .try_init();
}
