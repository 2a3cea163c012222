//! A line chat over a Shoal group, with the blocking client.
//!
//! ```text
//! shoal daemon &
//! cargo run -p shoal-client --example chat -- lobby alice
//! cargo run -p shoal-client --example chat -- lobby bob     # another terminal
//! ```
//!
//! Joins the group, prints what arrives (messages and views) on one thread,
//! and multicasts each line typed on stdin (service agreed, so everyone sees
//! the lines in the same order). End with Ctrl-D. The daemon's socket is
//! the default one, or `$SHOAL_SOCKET`. (`run` is the program without its
//! command line, which the real-daemon tests call.)

use std::io::{BufRead, Write};
use std::sync::mpsc;

use shoal_client::{Client, ClientError, Endpoint, Received, Service};

#[allow(dead_code)]
fn main() -> Result<(), ClientError> {
    let mut args = std::env::args().skip(1);
    let group = args.next().unwrap_or_else(|| "lobby".to_string());
    let name = args
        .next()
        .unwrap_or_else(|| format!("chat-{}", std::process::id()));
    let endpoint = match std::env::var_os("SHOAL_SOCKET") {
        Some(path) => Endpoint::Unix(path.into()),
        None => Endpoint::default(),
    };
    let (lines, input) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    run(&endpoint, &group, &name, input, std::io::stdout())
}

/// Runs the chat until `input` ends: each line multicast to `group`, what
/// arrives printed to `out`.
pub fn run(
    endpoint: &Endpoint,
    group: &str,
    name: &str,
    input: mpsc::Receiver<String>,
    mut out: impl Write + Send + 'static,
) -> Result<(), ClientError> {
    let mut client = Client::connect_to(endpoint, name)?;
    eprintln!(
        "connected to {endpoint} as {}; joining {group}",
        client.private_group()
    );
    client.join(group)?;
    let (mut send, mut recv) = client.split();

    let printer = std::thread::spawn(move || loop {
        let line = match recv.receive() {
            Ok(Received::Message(m)) => {
                format!("<{}> {}", m.sender, String::from_utf8_lossy(&m.payload))
            }
            Ok(Received::Membership(v)) => format!(
                "* {} is now {} ({:?})",
                v.group,
                v.members.join(", "),
                v.reason
            ),
            // A refused request: say so and go on.
            Err(ClientError::Daemon { code, text }) => {
                eprintln!("daemon: {text} (code {code})");
                continue;
            }
            Err(ClientError::Disconnected) => return,
            Err(e) => {
                eprintln!("error: {e}");
                return;
            }
        };
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return;
        }
    });

    for line in input {
        send.multicast(Service::Agreed, &[group], line.as_bytes())?;
    }
    // The daemon closes the connection; the printer sees it and ends.
    send.disconnect()?;
    let _ = printer.join();
    Ok(())
}
