//! `shoal daemon`: the per-host daemon (docs/daemon.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use shoal_net::daemon::config::DaemonConfig;

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The TOML configuration; without one, a single-host default (Unix
    /// socket at `$XDG_RUNTIME_DIR/shoal.sock` or `/tmp/shoal-<uid>.sock`,
    /// listening on 127.0.0.1:4804, no peers).
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
    let context = match &args.config {
        Some(path) => format!("daemon ({})", path.display()),
        None => "daemon".to_string(),
    };
    shoal_net::daemon::run(config, None).context(context)
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's Unix socket (default: the daemon's default).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// `shoal status`: asks the local daemon for its state and prints it.
pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    use shoal_wire::client::{decode, Frame, Limits};
    use std::io::{Read, Write};

    let path = args
        .socket
        .unwrap_or_else(shoal_wire::client::default_socket_path);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "no daemon at {} (is `shoal daemon` running?)",
            path.display()
        )
    })?;
    stream.write_all(&Frame::Status.to_vec()?)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Some((frame, _)) = decode(&buf, &Limits::default())? {
            match frame {
                Frame::StatusReply { text } => {
                    println!("{text}");
                    return Ok(());
                }
                Frame::Error { code, text } => anyhow::bail!("{text} (code {code})"),
                other => anyhow::bail!("unexpected answer {other:?}"),
            }
        }
        let n = stream
            .read(&mut chunk)
            .context("reading the daemon's answer")?;
        anyhow::ensure!(n > 0, "the daemon closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}
