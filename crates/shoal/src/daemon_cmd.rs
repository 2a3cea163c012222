//! `shoal daemon` and `shoal status`: the per-host daemon (docs/daemon.md)
//! and the query of its state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Write the line `ready` to this inherited file descriptor (a pipe or
    /// a file) once the daemon accepts clients (it has joined its cluster).
    /// The descriptor itself stays open: wait for the line, not for EOF.
    /// With `$NOTIFY_SOCKET` set (systemd `Type=notify`), `READY=1` is sent
    /// there too, with or without this flag.
    #[arg(long, value_name = "N")]
    ready_fd: Option<u32>,
}

pub fn run(args: DaemonArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_max_level(args.log)
        .with_writer(std::io::stderr)
        .init();
    let config = match &args.config {
        // Its errors name the file.
        Some(path) => DaemonConfig::load(path)?,
        None => DaemonConfig::default(),
    };
    // Open the readiness descriptor now, so a bad one fails at start.
    let ready_file = match args.ready_fd {
        Some(fd) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/self/fd/{fd}"))
                .with_context(|| format!("--ready-fd {fd}: not an open descriptor"))?,
        ),
        None => None,
    };
    let notify = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty());
    eprintln!("{}", banner(&config));
    let on_ready: shoal_net::daemon::server::OnReady = Box::new(move || {
        tracing::info!("accepting clients");
        if let Some(mut file) = ready_file {
            use std::io::Write;
            if let Err(e) = file.write_all(b"ready\n") {
                tracing::warn!(error = %e, "cannot write to --ready-fd");
            }
        }
        if let Some(path) = notify {
            if let Err(e) = sd_notify(&path, "READY=1") {
                tracing::warn!(error = %e, "cannot notify $NOTIFY_SOCKET");
            }
        }
    });
    let context = match &args.config {
        Some(path) => format!("daemon ({})", path.display()),
        None => "daemon".to_string(),
    };
    shoal_net::daemon::server::run_with(config, None, Some(on_ready)).context(context)
}

/// The startup line: the daemon's name, where clients reach it, its own
/// UDP address and the peers it was given.
fn banner(config: &DaemonConfig) -> String {
    let peers = if config.discovery.is_some() {
        "found by discovery".to_string()
    } else if config.peers.is_empty() {
        "none (a cluster of one)".to_string()
    } else {
        config
            .peers
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "shoal daemon {}: clients on {}, daemons' UDP on {}, peers: {peers}",
        config.node,
        config.socket.display(),
        config.listen
    )
}

/// Sends `state` to the service manager's notification socket (`sd_notify`
/// of systemd: one datagram on a Unix socket; `@` starts an abstract name).
pub(crate) fn sd_notify(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::UnixDatagram;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), Path::new(path))?;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's Unix socket [default: $SHOAL_SOCKET if set, else
    /// $XDG_RUNTIME_DIR/shoal.sock, else /tmp/shoal-<uid>.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// First wait until the daemon accepts clients (it is running and has
    /// joined its cluster); fail after --timeout.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, requires = "wait")]
    timeout: f64,
    /// Print the status as one JSON object: `lines` (the daemon's text,
    /// line by line), `fields` (each `key: value` line as a string value),
    /// `daemons` (those in view: `id`, `address` where known, `this`),
    /// `quorum`, `groups` (`name`, `members`) and `clients` (`name`,
    /// `groups`, `queued_bytes`).
    #[arg(long)]
    json: bool,
}

/// `shoal status`: asks the local daemon for its state and prints it.
pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    let path = crate::client_cmd::socket_path(args.socket.as_deref());
    if args.wait {
        let timeout = Duration::try_from_secs_f64(args.timeout)
            .map_err(|_| anyhow::anyhow!("--timeout must be a number of seconds >= 0"))?;
        wait_ready(&path, timeout)?;
    }
    let raw = status_text(&path)?;
    if args.json {
        println!("{}", status_json(&raw));
    } else {
        println!("{}", with_addresses(&raw));
    }
    Ok(())
}

/// Waits until the daemon at `path` accepts a client: connects (as a
/// client named `status-<pid>`) and says goodbye at once.
fn wait_ready(path: &Path, timeout: Duration) -> anyhow::Result<()> {
    let endpoint = shoal_client::Endpoint::Unix(path.to_path_buf());
    let name = format!("status-{}", std::process::id());
    let deadline = Instant::now() + timeout;
    let mut last;
    loop {
        match shoal_client::Client::connect_to(&endpoint, &name) {
            Ok(client) => {
                let _ = client.disconnect();
                return Ok(());
            }
            Err(e) => last = e,
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "the daemon at {} did not accept clients within {:.1} s (last: {last})",
                path.display(),
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon's status text, asked through the client library.
pub(crate) fn status_text(path: &Path) -> anyhow::Result<String> {
    let endpoint = shoal_client::Endpoint::Unix(path.to_path_buf());
    match shoal_client::status(&endpoint, Duration::from_secs(10)) {
        Ok(text) => Ok(text),
        Err(shoal_client::ClientError::Unreachable { .. }) => anyhow::bail!(
            "no daemon at {} (is `shoal daemon` running?)",
            path.display()
        ),
        Err(e) => Err(anyhow::anyhow!("asking the daemon for its status: {e}")),
    }
}

/// Each slot's address, from the `slots` line.
pub(crate) fn slot_addresses(text: &str) -> std::collections::BTreeMap<String, String> {
    let mut slots = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(list) = line.strip_prefix("slots: ") else {
            continue;
        };
        for entry in list.split(", ") {
            let mut words = entry.split(' ');
            if let (Some(slot), Some(addr)) = (words.next(), words.next()) {
                if slot.parse::<u32>().is_ok() {
                    slots.insert(slot.to_string(), addr.to_string());
                }
            }
        }
    }
    slots
}

/// The daemon ids (`slot.incarnation`) of the `id`, `daemons in view` and
/// `committee` lines followed by the address of their slot, taken from the
/// `slots` line (`0.8943351` becomes `0.8943351 at 127.0.0.1:9000`).
pub(crate) fn with_addresses(text: &str) -> String {
    let slots = slot_addresses(text);
    let annotate = |line: &str| {
        let mut out = String::new();
        let mut run = String::new();
        let flush = |run: &mut String, out: &mut String| {
            out.push_str(run);
            if let Some((slot, inc)) = run.split_once('.') {
                let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                if digits(slot) && digits(inc) {
                    if let Some(addr) = slots.get(slot) {
                        out.push_str(" at ");
                        out.push_str(addr);
                    }
                }
            }
            run.clear();
        };
        for c in line.chars() {
            if c.is_ascii_digit() || c == '.' {
                run.push(c);
            } else {
                flush(&mut run, &mut out);
                out.push(c);
            }
        }
        flush(&mut run, &mut out);
        out
    };
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let ids = ["id: ", "daemons in view: ", "committee: "];
        match ids
            .iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)))
        {
            Some((prefix, rest)) => out.push(format!("{prefix}{}", annotate(rest))),
            None => out.push(line.to_string()),
        }
    }
    out.join("\n")
}

/// The status text as JSON (see [`status_value`]).
fn status_json(text: &str) -> String {
    status_value(text).to_string()
}

/// The status text as a JSON object: `{"lines": [...], "fields": {key:
/// value}, "daemons": [{"id", "address", "this"}], "quorum", "groups":
/// [{"name", "members"}], "clients": [{"name", "groups", "queued_bytes"}]}`,
/// where `fields` holds each line of the form `key: value` (the first line
/// with a key, if several share it), `daemons` the daemons in view
/// (`address` null where the slot's address is not known), and `groups`
/// and `clients` come from the `group` and `client` lines.
pub(crate) fn status_value(text: &str) -> serde_json::Value {
    let slots = slot_addresses(text);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or("")
            .to_string()
    };
    let me = field("id: ");
    let daemons: Vec<serde_json::Value> = field("daemons in view: ")
        .split(", ")
        .filter(|id| !id.is_empty())
        .map(|id| {
            let address = id.split_once('.').and_then(|(slot, _)| slots.get(slot));
            serde_json::json!({ "id": id, "address": address, "this": id == me })
        })
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    let mut fields = serde_json::Map::new();
    for line in &lines {
        if let Some((key, value)) = line.split_once(": ") {
            if !key.is_empty() && !fields.contains_key(key) {
                fields.insert(key.to_string(), serde_json::Value::from(value));
            }
        }
    }
    let groups: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("group "))
        .filter_map(|rest| rest.split_once(": "))
        .map(|(name, members)| {
            let members: Vec<&str> = members.split(", ").filter(|m| !m.is_empty()).collect();
            serde_json::json!({ "name": name, "members": members })
        })
        .collect();
    let clients: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("client #"))
        .filter_map(|rest| {
            let (name, rest) = rest.rsplit_once(": groups ")?;
            let (groups, queued) = rest.rsplit_once("; queued ")?;
            let queued: u64 = queued.strip_suffix(" bytes")?.parse().ok()?;
            let groups: Vec<&str> = groups.split(',').filter(|g| *g != "-").collect();
            Some(serde_json::json!({ "name": format!("#{name}"), "groups": groups, "queued_bytes": queued }))
        })
        .collect();
    let quorum = field("quorum: ") == "held";
    serde_json::json!({
        "lines": lines,
        "fields": fields,
        "daemons": daemons,
        "quorum": quorum,
        "groups": groups,
        "clients": clients,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_tells_the_daemons_own_address_from_its_peers() {
        let config = DaemonConfig::parse(
            "node = \"a\"\nsocket = \"/tmp/a.sock\"\nlisten = \"127.0.0.1:9000\"\npeers = [\"127.0.0.1:9001\"]\n",
        )
        .unwrap();
        assert_eq!(
            banner(&config),
            "shoal daemon a: clients on /tmp/a.sock, daemons' UDP on 127.0.0.1:9000, peers: 127.0.0.1:9001"
        );
        let alone = DaemonConfig::parse("socket = \"/tmp/s.sock\"\n").unwrap();
        assert!(banner(&alone).ends_with("peers: none (a cluster of one)"));
    }

    #[test]
    fn status_json_keeps_every_line_and_the_key_value_ones_as_fields() {
        let json = status_json("node: a\nid: 0.12\nsafe: held 0 (waiting now 0)\nno key here");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["lines"].as_array().unwrap().len(), 4);
        assert_eq!(v["fields"]["node"], "a");
        assert_eq!(v["fields"]["id"], "0.12");
        assert_eq!(v["fields"]["safe"], "held 0 (waiting now 0)");
        assert_eq!(v["fields"].as_object().unwrap().len(), 3);
        assert_eq!(v["daemons"], serde_json::json!([]));
    }

    #[test]
    fn status_json_lists_groups_members_and_clients() {
        let text = "node: a\nquorum: held\ngroup chat: #x#a, #y#b\ngroup solo: #y#b\nclient #x#a: groups chat,log; queued 12 bytes\nclient #z#a: groups -; queued 0 bytes";
        let v = status_value(text);
        assert_eq!(v["quorum"], true);
        assert_eq!(
            v["groups"],
            serde_json::json!([
                { "name": "chat", "members": ["#x#a", "#y#b"] },
                { "name": "solo", "members": ["#y#b"] },
            ])
        );
        assert_eq!(
            v["clients"],
            serde_json::json!([
                { "name": "#x#a", "groups": ["chat", "log"], "queued_bytes": 12 },
                { "name": "#z#a", "groups": [], "queued_bytes": 0 },
            ])
        );
        assert_eq!(status_value("quorum: not held")["quorum"], false);
    }

    #[test]
    fn status_json_lists_the_daemons_in_view_with_their_addresses() {
        let text = "node: a\nid: 1.77\ndaemons in view: 0.5, 1.77, 2.9\nslots: 0 127.0.0.1:9000, 1 127.0.0.1:9001 (this daemon)";
        let v: serde_json::Value = serde_json::from_str(&status_json(text)).unwrap();
        assert_eq!(
            v["daemons"],
            serde_json::json!([
                { "id": "0.5", "address": "127.0.0.1:9000", "this": false },
                { "id": "1.77", "address": "127.0.0.1:9001", "this": true },
                { "id": "2.9", "address": null, "this": false },
            ])
        );
    }

    #[test]
    fn daemon_ids_are_followed_by_their_slots_address() {
        let text = "node: a\nid: 1.77\ndaemons in view: 0.5, 1.77, 2.9\ncommittee: 2 (0.5, 1.77)\nuptime: 2.5s\nslots: 0 127.0.0.1:9000, 1 127.0.0.1:9001 (this daemon)";
        assert_eq!(
            with_addresses(text),
            "node: a\nid: 1.77 at 127.0.0.1:9001\ndaemons in view: 0.5 at 127.0.0.1:9000, 1.77 at 127.0.0.1:9001, 2.9\ncommittee: 2 (0.5 at 127.0.0.1:9000, 1.77 at 127.0.0.1:9001)\nuptime: 2.5s\nslots: 0 127.0.0.1:9000, 1 127.0.0.1:9001 (this daemon)"
        );
    }

    #[test]
    fn sd_notify_sends_one_datagram() {
        let dir = std::env::temp_dir().join(format!("shoal-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let listener = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        sd_notify(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
