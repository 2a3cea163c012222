//! `shoal daemon`: the per-host daemon (docs/daemon.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use shoal_net::daemon::config::DaemonConfig;

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The TOML configuration; without one, a single-host default (Unix
    /// socket at `$XDG_RUNTIME_DIR/shoal.sock` or `/tmp/shoal-<uid>.sock`,
    /// peers on loopback only).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "info")]
    log: tracing::Level,
}

pub fn run(args: DaemonArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_max_level(args.log)
        .with_writer(std::io::stderr)
        .init();
    let config = match &args.config {
        Some(path) => DaemonConfig::load(path)?,
        None => DaemonConfig::default(),
    };
    eprintln!(
        "shoal daemon {}: clients on {}, peers on {}",
        config.node,
        config.socket.display(),
        config.listen
    );
    shoal_net::daemon::run(config, None).context("daemon")
}
