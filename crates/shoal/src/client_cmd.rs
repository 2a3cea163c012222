//! `shoal send` and `shoal listen`: the client library from the command
//! line (docs/client.md).

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use shoal_client::{
    Client, ClientError, Endpoint, Membership, Message, Reason, Received, Service, DISCONNECT_WAIT,
};

/// Where the daemon is, and who we are to it.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The daemon's Unix socket [default: $SHOAL_SOCKET if set, else
    /// $XDG_RUNTIME_DIR/shoal.sock, else /tmp/shoal-<uid>.sock].
    #[arg(long, value_name = "PATH", conflicts_with = "tcp")]
    socket: Option<PathBuf>,
    /// Connect to a daemon's TCP listener instead (host:port).
    #[arg(long, value_name = "ADDR")]
    tcp: Option<SocketAddr>,
    /// The token the TCP listener requires.
    #[arg(long, value_name = "T", requires = "tcp")]
    token: Option<String>,
    /// The private name, unique on the daemon [default: the command's name
    /// and its process id, e.g. listen-4711].
    #[arg(long)]
    name: Option<String>,
    /// How long to keep retrying a daemon that has not joined its cluster
    /// yet (error code 10, e.g. just started), in seconds; 0 fails at once.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    wait: f64,
}

/// The daemon's Unix socket: `given`, else `$SHOAL_SOCKET` (as the
/// examples and the Python client read it), else the default path.
pub fn socket_path(given: Option<&std::path::Path>) -> PathBuf {
    match (given, std::env::var_os("SHOAL_SOCKET")) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => shoal_client::default_socket_path(),
    }
}

/// Whether `e` is the daemon saying it has not joined its cluster yet.
pub fn unavailable(e: &ClientError) -> bool {
    e.code() == Some(shoal_wire::client::code::UNAVAILABLE)
}

/// How long to sleep between two attempts to connect.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Connects (blocking), retrying for up to `wait` while the daemon answers
/// that it has not joined its cluster yet.
pub fn connect_retrying(
    endpoint: &Endpoint,
    name: &str,
    wait: Duration,
) -> Result<Client, ClientError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match Client::connect_to(endpoint, name) {
            Err(e) if unavailable(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(RETRY_PAUSE)
            }
            result => return result,
        }
    }
}

impl ConnectArgs {
    fn endpoint(&self) -> Endpoint {
        match (&self.tcp, &self.socket) {
            (Some(addr), _) => Endpoint::Tcp {
                addr: *addr,
                token: self.token.clone().unwrap_or_default(),
            },
            (None, Some(path)) => Endpoint::Unix(path.clone()),
            (None, None) => Endpoint::Unix(socket_path(None)),
        }
    }

    fn wait(&self) -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(self.wait)
            .map_err(|_| anyhow::anyhow!("--wait must be a number of seconds >= 0"))
    }

    fn name(&self, role: &str) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{role}-{}", std::process::id()))
    }
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The group to send to; several, comma-separated (g1,g2), get one
    /// message addressed to all of them.
    group: String,
    /// The message; `-` or none reads stdin and sends each line.
    message: Option<String>,
    /// The guarantee: unreliable, probabilistic, reliable, fifo, causal,
    /// agreed or safe.
    #[arg(long, default_value = "agreed")]
    service: Service,
    /// Send each message this many times.
    #[arg(long, default_value_t = 1)]
    count: u64,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// `shoal send`: connects, multicasts, says goodbye. An error the daemon
/// reports (a refused service, a bad group) fails the command.
pub fn run_send(args: SendArgs) -> anyhow::Result<()> {
    let groups: Vec<&str> = args.group.split(',').collect();
    let client = connect_retrying(
        &args.connect.endpoint(),
        &args.connect.name("send"),
        args.connect.wait()?,
    )?;
    let (mut send, mut recv) = client.split();
    // The daemon answers nothing to a multicast but a refusal; a thread
    // watches for one so a long send stops at the first.
    let (refused_tx, refused) = mpsc::channel();
    std::thread::spawn(move || {
        let result = loop {
            match recv.receive() {
                // Not a member of anything: nothing is delivered to us.
                Ok(_) => {}
                Err(ClientError::Disconnected) => break None,
                Err(e) => break Some(e),
            }
        };
        let _ = refused_tx.send(result);
    });
    let check = |refused: &mpsc::Receiver<Option<ClientError>>| match refused.try_recv() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Err(ClientError::Disconnected),
        Err(_) => Ok(()),
    };

    let mut send_one = |payload: &[u8]| -> Result<(), ClientError> {
        for _ in 0..args.count {
            if let Err(e) = send.multicast(args.service, &groups, payload) {
                // A closed connection: the daemon may have said why.
                return match refused.recv_timeout(DISCONNECT_WAIT) {
                    Ok(Some(why)) => Err(why),
                    _ => Err(e),
                };
            }
            check(&refused)?;
        }
        Ok(())
    };
    match args.message.as_deref() {
        Some(message) if message != "-" => send_one(message.as_bytes())?,
        _ => {
            for line in std::io::stdin().lock().split(b'\n') {
                let mut line = line.context("reading stdin")?;
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                send_one(&line)?;
            }
        }
    }

    // Goodbye; the daemon then closes, after any refusal still pending.
    match send.disconnect() {
        Ok(()) | Err(ClientError::Disconnected) => {}
        Err(e) => return Err(e.into()),
    }
    match refused.recv_timeout(DISCONNECT_WAIT) {
        Ok(Some(e)) => Err(e.into()),
        // Closed, or slow to close: what we sent was taken.
        Ok(None) | Err(_) => Ok(()),
    }
}

#[derive(Debug, Args)]
pub struct ListenArgs {
    /// The groups to join.
    #[arg(required = true)]
    groups: Vec<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// `shoal listen`: joins the groups and prints one line per message or
/// view until Ctrl-C (then disconnects cleanly) or the daemon disconnects.
pub fn run_listen(args: ListenArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(listen(args))
}

async fn listen(args: ListenArgs) -> anyhow::Result<()> {
    use shoal_client::tokio::Client;

    let endpoint = args.connect.endpoint();
    let name = args.connect.name("listen");
    let deadline = tokio::time::Instant::now() + args.connect.wait()?;
    let mut client = loop {
        match Client::connect_to(&endpoint, &name).await {
            Err(e) if unavailable(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY_PAUSE).await
            }
            result => break result?,
        }
    };
    for group in &args.groups {
        client.join(group).await?;
    }
    let mut out = std::io::stdout().lock();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let received = tokio::select! {
            r = client.receive() => r,
            _ = &mut ctrl_c => break,
        };
        let line = match received {
            Ok(Received::Message(m)) => message_line(&m),
            Ok(Received::Membership(v)) => view_line(&v),
            // A refused join (a bad group name, a limit) or a slow-client
            // disconnect: the listener cannot do what it was asked, so it
            // ends with that error rather than listening on without it.
            Err(e @ ClientError::Daemon { .. }) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.disconnect()).await;
                return Err(e.into());
            }
            Err(ClientError::Disconnected) => {
                eprintln!("the daemon closed the connection");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        // A closed stdout (`shoal listen g | head`) ends the listener.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    // A goodbye, not waiting long for it on Ctrl-C.
    let _ = tokio::time::timeout(Duration::from_secs(1), client.disconnect()).await;
    Ok(())
}

/// `message <group,...> from <sender> [<service>]: <payload>`.
fn message_line(m: &Message) -> String {
    format!(
        "message {} from {} [{}]: {}",
        m.groups.join(","),
        m.sender,
        m.service.name(),
        String::from_utf8_lossy(&m.payload)
    )
}

/// `view <group> #<view_id> <reason>: <member,...>`, then what changed
/// since the previous view (`; joined: a,b; left: c`) where anything did.
fn view_line(v: &Membership) -> String {
    let reason = match v.reason {
        Reason::Join => "join",
        Reason::Leave => "leave",
        Reason::Disconnect => "disconnect",
        Reason::Network => "network",
    };
    let kind = if v.transitional { " transitional" } else { "" };
    let quorum = if v.quorum { "" } else { " (no quorum)" };
    let mut changes = String::new();
    if !v.joined().is_empty() {
        changes.push_str(&format!("; joined: {}", v.joined().join(",")));
    }
    if !v.left().is_empty() {
        changes.push_str(&format!("; left: {}", v.left().join(",")));
    }
    format!(
        "view {} #{}{kind} {reason}{quorum}: {}{changes}",
        v.group,
        v.view_id,
        v.members.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let m = Message {
            sender: "#alice#h1".into(),
            service: Service::Fifo,
            groups: vec!["g1".into(), "g2".into()],
            mess_type: 0,
            payload: b"hello \xff".to_vec(),
        };
        assert_eq!(
            message_line(&m),
            "message g1,g2 from #alice#h1 [fifo]: hello \u{fffd}"
        );
        let v = Membership::new(
            "g1",
            4,
            Reason::Network,
            false,
            true,
            vec!["#alice#h1".into(), "#bob#h2".into()],
        );
        assert_eq!(view_line(&v), "view g1 #4 network: #alice#h1,#bob#h2");
        let t = Membership::new(
            "g1",
            4,
            Reason::Network,
            true,
            false,
            vec!["#alice#h1".into()],
        );
        assert_eq!(
            view_line(&t),
            "view g1 #4 transitional network (no quorum): #alice#h1"
        );
        let t = t.with_changes(vec![], vec!["#bob#h2".into()]);
        assert_eq!(
            view_line(&t),
            "view g1 #4 transitional network (no quorum): #alice#h1; left: #bob#h2"
        );
    }

    #[test]
    fn arguments() {
        use clap::Parser;

        #[derive(Debug, Parser)]
        struct Send {
            #[command(flatten)]
            args: SendArgs,
        }
        let s = Send::try_parse_from(["send", "g"]).unwrap().args;
        assert_eq!(s.service, Service::Agreed);
        assert_eq!(s.count, 1);
        assert_eq!(s.message, None);
        assert_eq!(s.connect.endpoint(), Endpoint::default());
        assert!(s.connect.name("send").starts_with("send-"));
        let s = Send::try_parse_from([
            "send",
            "g",
            "hi",
            "--service",
            "fifo",
            "--tcp",
            "127.0.0.1:4804",
            "--token",
            "t",
            "--name",
            "me",
            "--count",
            "3",
        ])
        .unwrap()
        .args;
        assert_eq!(s.service, Service::Fifo);
        assert_eq!(s.count, 3);
        assert_eq!(s.message.as_deref(), Some("hi"));
        assert_eq!(
            s.connect.endpoint(),
            Endpoint::Tcp {
                addr: "127.0.0.1:4804".parse().unwrap(),
                token: "t".into()
            }
        );
        assert_eq!(s.connect.name("send"), "me");
        assert!(Send::try_parse_from(["send", "g", "--service", "fast"]).is_err());
        assert!(Send::try_parse_from(["send", "g", "--token", "t"]).is_err());
        assert!(
            Send::try_parse_from(["send", "g", "--socket", "/s", "--tcp", "127.0.0.1:1"]).is_err()
        );

        #[derive(Debug, Parser)]
        struct Listen {
            #[command(flatten)]
            args: ListenArgs,
        }
        assert!(Listen::try_parse_from(["listen"]).is_err());
        let l = Listen::try_parse_from(["listen", "a", "b", "--socket", "/tmp/x.sock"])
            .unwrap()
            .args;
        assert_eq!(l.groups, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(
            l.connect.endpoint(),
            Endpoint::Unix(PathBuf::from("/tmp/x.sock"))
        );
    }
}
