//! The `shoal` command. Thin: parse arguments, hand each subcommand to its
//! module (mini-redis style). `anyhow` lives only at this level.

mod bench_cmd;
mod check_cmd;
mod client_cmd;
mod daemon_cmd;
mod demo;
mod monitor_cmd;
mod sim;
mod site_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Shoal: group communication (Bimodal Multicast, virtual synchrony over
/// gossip, Spread-style daemons).
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The per-host daemon: serves clients, joins its peer daemons.
    Daemon(daemon_cmd::DaemonArgs),
    /// Multicast a message (or each line of stdin) to a group.
    Send(client_cmd::SendArgs),
    /// Join groups and print the messages and views that arrive.
    Listen(client_cmd::ListenArgs),
    /// Throughput and latency through daemons on loopback.
    Bench(bench_cmd::BenchArgs),
    /// The local daemon's view, peers, clients, groups and counters.
    Status(daemon_cmd::StatusArgs),
    /// A live view of the cluster: `shoal status` of one or more daemons,
    /// refreshed, with rates.
    Monitor(monitor_cmd::MonitorArgs),
    /// A local cluster on loopback: one sender, N members, injected loss.
    Demo(demo::DemoArgs),
    /// Run a simulator scenario (paper experiments).
    Sim(Box<sim::SimArgs>),
    /// One daemon of Spread's sites (the Ring inside a site, Hop links
    /// between sites), from a sites file, with an optional built-in
    /// workload of clients that record histories.
    Site(site_cmd::SiteArgs),
    /// Judge recorded histories (JSON lines); exit status 1 on violations.
    Check(check_cmd::CheckArgs),
    /// Write the manual pages (shoal.1, shoal-daemon.1, ...) into a directory.
    Man(ManArgs),
}

#[derive(Debug, clap::Args)]
struct ManArgs {
    /// Where to write the pages (created if missing), e.g.
    /// /usr/local/share/man/man1.
    dir: std::path::PathBuf,
}

/// `shoal man DIR`: one page per command, generated from these clap
/// definitions, so the pages say what `--help` says.
fn man(args: ManArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    use clap::CommandFactory;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    clap_mangen::generate_to(Cli::command(), &args.dir)
        .with_context(|| format!("writing manual pages to {}", args.dir.display()))?;
    Ok(())
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Daemon(args) => daemon_cmd::run(args),
        Command::Send(args) => client_cmd::run_send(args),
        Command::Listen(args) => client_cmd::run_listen(args),
        Command::Status(args) => daemon_cmd::status(args),
        Command::Monitor(args) => monitor_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Sim(args) => {
            sim::rerun_with_huge_pages();
            sim::run(*args)
        }
        Command::Site(args) => site_cmd::run(args),
        Command::Check(args) => return check_cmd::run(args),
        Command::Man(args) => man(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, `a: b: c`, skipping a cause whose
/// text the line already ends with (an error that prints its source and
/// also returns it as `source()` would otherwise say it twice).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_its_errors_text_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address in use");
        let e = anyhow::Error::new(shoal_net::daemon::DaemonError::Io {
            what: "bind 127.0.0.1:1".into(),
            source: io,
        })
        .context("daemon");
        assert_eq!(one_line(&e), "daemon: bind 127.0.0.1:1: Address in use");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }

    #[test]
    fn man_writes_a_page_per_command() {
        let dir = std::env::temp_dir().join(format!("shoal-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        man(ManArgs { dir: dir.clone() }).unwrap();
        for page in [
            "shoal.1",
            "shoal-daemon.1",
            "shoal-send.1",
            "shoal-status.1",
        ] {
            let text = std::fs::read_to_string(dir.join(page)).unwrap();
            assert!(text.starts_with(".ie \\n(.g .ds Aq"), "{page}: {text}");
        }
        let daemon = std::fs::read_to_string(dir.join("shoal-daemon.1")).unwrap();
        assert!(daemon.contains("ready"), "{daemon}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn help_promises_nothing_for_later() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(!help.contains("later"), "{help}");
        for sub in ["daemon", "send", "listen", "status", "bench"] {
            assert!(help.contains(sub), "{sub} in {help}");
        }
    }
}
