//! An echo service on a Shoal group, with the async client.
//!
//! ```text
//! shoal daemon &
//! cargo run -p shoal-client --example async_echo -- echo
//! shoal listen echo &
//! shoal send echo "hello"     # listen prints "hello", then "echo: hello"
//! ```
//!
//! Joins the group and answers every message from someone else with
//! `echo: <payload>`, multicast to the groups it came to (service fifo).
//! It does not answer echoes, so two of them do not ping-pong. It stops on
//! Ctrl-C (disconnecting cleanly) or when the daemon goes away. The
//! daemon's socket is the default one, or `$SHOAL_SOCKET`.

use shoal_client::tokio::Client;
use shoal_client::{ClientError, Endpoint, Received, Service};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ClientError> {
    let group = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "echo".to_string());
    let endpoint = match std::env::var_os("SHOAL_SOCKET") {
        Some(path) => Endpoint::Unix(path.into()),
        None => Endpoint::default(),
    };
    let mut client = Client::connect_to(&endpoint, &format!("echo-{}", std::process::id())).await?;
    client.join(&group).await?;
    eprintln!("{} echoes on {group}", client.private_group());

    loop {
        let received = tokio::select! {
            r = client.receive() => r,
            _ = tokio::signal::ctrl_c() => break,
        };
        match received {
            Ok(Received::Message(m))
                if m.sender != client.private_group() && !m.payload.starts_with(b"echo: ") =>
            {
                let mut echo = b"echo: ".to_vec();
                echo.extend_from_slice(&m.payload);
                client.multicast(Service::Fifo, &m.groups, &echo).await?;
            }
            Ok(Received::Message(_)) => {}
            Ok(Received::Membership(v)) => {
                eprintln!("{} #{}: {}", v.group, v.view_id, v.members.join(", "))
            }
            Err(ClientError::Daemon { code, text }) => eprintln!("daemon: {text} (code {code})"),
            Err(ClientError::Disconnected) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    client.disconnect().await
}
