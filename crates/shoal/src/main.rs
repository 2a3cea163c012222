//! The `shoal` command. Thin: parse arguments, hand each subcommand to its
//! module (mini-redis style). `anyhow` lives only at this level.

mod bench_cmd;
mod check_cmd;
mod client_cmd;
mod daemon_cmd;
mod demo;
mod sim;

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
    /// A local cluster on loopback: one sender, N members, injected loss.
    Demo(demo::DemoArgs),
    /// Run a simulator scenario (paper experiments).
    Sim(sim::SimArgs),
    /// Judge recorded histories (JSON lines); exit status 1 on violations.
    Check(check_cmd::CheckArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Daemon(args) => daemon_cmd::run(args),
        Command::Send(args) => client_cmd::run_send(args),
        Command::Listen(args) => client_cmd::run_listen(args),
        Command::Status(args) => daemon_cmd::status(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Check(args) => return check_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
