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
//! the default one, or `$SHOAL_SOCKET`.

use std::io::BufRead;

use shoal_client::{Client, ClientError, Endpoint, Received, Service};

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

    let mut client = Client::connect_to(&endpoint, &name)?;
    eprintln!(
        "connected to {endpoint} as {}; joining {group}",
        client.private_group()
    );
    client.join(&group)?;
    let (mut send, mut recv) = client.split();

    let printer = std::thread::spawn(move || loop {
        match recv.receive() {
            Ok(Received::Message(m)) => {
                println!("<{}> {}", m.sender, String::from_utf8_lossy(&m.payload))
            }
            Ok(Received::Membership(v)) => println!(
                "* {} is now {} ({:?})",
                v.group,
                v.members.join(", "),
                v.reason
            ),
            // A refused request: say so and go on.
            Err(ClientError::Daemon { code, text }) => eprintln!("daemon: {text} (code {code})"),
            Err(ClientError::Disconnected) => return,
            Err(e) => {
                eprintln!("error: {e}");
                return;
            }
        }
    });

    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(ClientError::Io)?;
        send.multicast(Service::Agreed, &[group.as_str()], line.as_bytes())?;
    }
    // The daemon closes the connection; the printer sees it and ends.
    send.disconnect()?;
    let _ = printer.join();
    Ok(())
}
