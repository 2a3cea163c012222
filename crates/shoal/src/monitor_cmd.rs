//! `shoal monitor`: a live terminal view of the cluster as the local
//! daemons see it (as Spread's `spmonitor` or `corosync-cpgtool`): `shoal
//! status` asked again every `--interval`, drawn with plain ANSI (no TUI
//! library), with rates computed between two refreshes. `--once` prints one
//! view and exits; `--json` prints each refresh as one JSON line.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::daemon_cmd::{status_text, status_value, with_addresses};

#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// A daemon's Unix socket; repeat it to watch several daemons [default:
    /// as `shoal status`: $SHOAL_SOCKET, else $XDG_RUNTIME_DIR/shoal.sock,
    /// else /tmp/shoal-<uid>.sock].
    #[arg(long)]
    socket: Vec<PathBuf>,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    interval: f64,
    /// Print one view and exit (rates need two refreshes: they are left out).
    #[arg(long)]
    once: bool,
    /// Print each refresh as one line of JSON: `{"daemons": [{"socket",
    /// "status" (as `shoal status --json`) or "error", "rates"}]}`, where
    /// `rates` (per second since the last refresh) is null the first time.
    #[arg(long)]
    json: bool,
}

/// The counters rates are computed from.
const COUNTERS: [&str; 6] = [
    "messages_sent",
    "messages_delivered",
    "datagrams_sent",
    "bytes_sent",
    "datagrams_received",
    "bytes_received",
];

/// The counters of a status text (those its lines name).
fn counters(text: &str) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let line = |prefix: &str| text.lines().find(|l| l.starts_with(prefix));
    let number = |s: &str| -> Option<u64> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if let Some(l) = line("messages: sent ") {
        let rest = &l["messages: sent ".len()..];
        out.extend(number(rest).map(|n| ("messages_sent", n)));
        let delivered = rest.split(" delivered ").nth(1).and_then(number);
        out.extend(delivered.map(|n| ("messages_delivered", n)));
    }
    if let Some(l) = line("datagrams: sent ") {
        // `datagrams: sent N (B bytes), received M (B bytes)`
        let (sent, received) = l["datagrams: sent ".len()..]
            .split_once("), received ")
            .unwrap_or(("", ""));
        let pair = |s: &str| -> (Option<u64>, Option<u64>) {
            let count = number(s);
            let bytes = s.split_once(" (").and_then(|(_, b)| number(b));
            (count, bytes)
        };
        let (d, b) = pair(sent);
        out.extend(d.map(|n| ("datagrams_sent", n)));
        out.extend(b.map(|n| ("bytes_sent", n)));
        let (d, b) = pair(received);
        out.extend(d.map(|n| ("datagrams_received", n)));
        out.extend(b.map(|n| ("bytes_received", n)));
    }
    out
}

/// Per-second rates between two samples of the counters.
fn rates(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
    secs: f64,
) -> BTreeMap<&'static str, f64> {
    COUNTERS
        .iter()
        .filter_map(|name| {
            let (a, b) = (before.get(name)?, after.get(name)?);
            (secs > 0.0).then(|| (*name, b.saturating_sub(*a) as f64 / secs))
        })
        .collect()
}

/// One daemon's last sample.
struct Sample {
    at: Instant,
    counters: BTreeMap<&'static str, u64>,
}

/// Colours, only on a terminal.
struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// The lines showing one daemon.
fn render(
    socket: &str,
    text: &str,
    rates: Option<&BTreeMap<&'static str, f64>>,
    style: &Style,
) -> Vec<String> {
    let v = status_value(text);
    let field = |k: &str| v["fields"][k].as_str().unwrap_or("?").to_string();
    let quorum = if v["quorum"] == true {
        style.paint("32", "quorum held")
    } else {
        style.paint("31;1", "quorum NOT held")
    };
    let annotated = with_addresses(text);
    let line = |prefix: &str| {
        annotated
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or("?")
            .to_string()
    };
    let mut out = vec![
        format!(
            "{} {} ({})  {quorum}  clients {}  groups {}",
            style.paint("1", "daemon"),
            style.paint("1", &field("node")),
            line("id: "),
            field("clients"),
            field("groups"),
        ),
        format!("  socket: {socket}"),
        format!("  daemons' view: {}", field("daemons' view")),
        format!("  daemons in view: {}", line("daemons in view: ")),
    ];
    out.push(match rates {
        Some(r) => {
            let get = |k: &str| r.get(k).copied().unwrap_or(0.0);
            format!(
                "  per second: messages sent {:.1}, delivered {:.1}; datagrams out {:.1} ({:.1} kB), in {:.1} ({:.1} kB)",
                get("messages_sent"),
                get("messages_delivered"),
                get("datagrams_sent"),
                get("bytes_sent") / 1000.0,
                get("datagrams_received"),
                get("bytes_received") / 1000.0,
            )
        }
        None => "  per second: (after the next refresh)".to_string(),
    });
    out.push(format!("  messages: {}", line("messages: ")));
    out.push(format!("  drops: {}", line("drops: ")));
    out.push(format!(
        "  slow clients disconnected {}",
        line("slow clients disconnected ")
    ));
    let groups = v["groups"].as_array().cloned().unwrap_or_default();
    out.push(format!("  {}", style.paint("1", "groups")));
    if groups.is_empty() {
        out.push("    (none)".into());
    }
    for g in groups {
        let members: Vec<&str> = g["members"]
            .as_array()
            .map(|m| m.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        out.push(format!(
            "    {:<20} {}",
            g["name"].as_str().unwrap_or("?"),
            members.join(", ")
        ));
    }
    let clients = v["clients"].as_array().cloned().unwrap_or_default();
    out.push(format!("  {}", style.paint("1", "clients of this daemon")));
    if clients.is_empty() {
        out.push("    (none)".into());
    }
    for c in clients {
        let groups: Vec<&str> = c["groups"]
            .as_array()
            .map(|m| m.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        out.push(format!(
            "    {:<20} queued {:>9} B  {}",
            c["name"].as_str().unwrap_or("?"),
            c["queued_bytes"].as_u64().unwrap_or(0),
            groups.join(", ")
        ));
    }
    out
}

/// `shoal monitor`.
pub fn run(args: MonitorArgs) -> anyhow::Result<()> {
    let interval = Duration::try_from_secs_f64(args.interval)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--interval must be a number of seconds > 0"))?;
    let sockets: Vec<PathBuf> = if args.socket.is_empty() {
        vec![crate::client_cmd::socket_path(None)]
    } else {
        args.socket
            .iter()
            .map(|s| crate::client_cmd::socket_path(Some(s)))
            .collect()
    };
    let style = Style {
        on: !args.json && std::io::stdout().is_terminal(),
    };
    let mut last: Vec<Option<Sample>> = sockets.iter().map(|_| None).collect();
    let mut stdout = std::io::stdout().lock();
    loop {
        let mut screen = Vec::new();
        let mut objects = Vec::new();
        let mut reached = 0;
        for (i, socket) in sockets.iter().enumerate() {
            let shown = socket.display().to_string();
            match status_text(socket) {
                Ok(text) => {
                    reached += 1;
                    let now = Sample {
                        at: Instant::now(),
                        counters: counters(&text),
                    };
                    let r = last[i].as_ref().map(|before| {
                        let secs = now.at.duration_since(before.at).as_secs_f64();
                        rates(&before.counters, &now.counters, secs)
                    });
                    if args.json {
                        objects.push(serde_json::json!({
                            "socket": shown,
                            "status": status_value(&text),
                            "rates": r,
                        }));
                    } else {
                        screen.extend(render(&shown, &text, r.as_ref(), &style));
                        screen.push(String::new());
                    }
                    last[i] = Some(now);
                }
                Err(e) => {
                    last[i] = None;
                    if args.json {
                        objects
                            .push(serde_json::json!({ "socket": shown, "error": e.to_string() }));
                    } else {
                        screen.push(style.paint("31", &format!("{shown}: {e}")));
                        screen.push(String::new());
                    }
                }
            }
        }
        if args.json {
            writeln!(stdout, "{}", serde_json::json!({ "daemons": objects }))?;
        } else {
            if !args.once {
                // Home and clear, then the view.
                write!(stdout, "\x1b[H\x1b[2J")?;
                writeln!(
                    stdout,
                    "shoal monitor: {} daemon(s), every {:.1} s (Ctrl-C to quit)\n",
                    sockets.len(),
                    interval.as_secs_f64()
                )?;
            }
            for line in &screen {
                writeln!(stdout, "{line}")?;
            }
        }
        stdout.flush()?;
        if args.once {
            if reached == 0 {
                anyhow::bail!("no daemon answered");
            }
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "node: a\nid: 0.5\ndaemons in view: 0.5\nquorum: held\nclients: 1\ngroups: 1\nmessages: sent 10 delivered 25; batches sent 3 received 3; fragments sent 0\nslow clients disconnected 0; malformed batches 0\ndatagrams: sent 100 (20000 bytes), received 50 (9000 bytes)\ndrops: unknown source 0, failed authentication 0, io errors 0, too large 0, slot conflicts 0\nslots: 0 127.0.0.1:9000 (this daemon)\ngroup chat: #x#a, #y#b\nclient #x#a: groups chat; queued 0 bytes";

    #[test]
    fn counters_and_rates_come_from_the_status_lines() {
        let c = counters(TEXT);
        assert_eq!(c["messages_sent"], 10);
        assert_eq!(c["messages_delivered"], 25);
        assert_eq!(c["datagrams_sent"], 100);
        assert_eq!(c["bytes_sent"], 20_000);
        assert_eq!(c["datagrams_received"], 50);
        assert_eq!(c["bytes_received"], 9_000);
        let later = counters(&TEXT.replace("sent 10 ", "sent 30 "));
        let r = rates(&c, &later, 2.0);
        assert_eq!(r["messages_sent"], 10.0);
        assert_eq!(r["messages_delivered"], 0.0);
    }

    #[test]
    fn the_view_shows_quorum_groups_members_and_clients() {
        let lines = render("/s", TEXT, None, &Style { on: false }).join("\n");
        for want in [
            "daemon a (0.5 at 127.0.0.1:9000)  quorum held  clients 1  groups 1",
            "daemons in view: 0.5 at 127.0.0.1:9000",
            "    chat                 #x#a, #y#b",
            "    #x#a                 queued         0 B  chat",
            "  messages: sent 10 delivered 25;",
            "  drops: unknown source 0,",
            "(after the next refresh)",
        ] {
            assert!(lines.contains(want), "{want:?} in\n{lines}");
        }
        let lost = render(
            "/s",
            &TEXT.replace("quorum: held", "quorum: not held"),
            None,
            &Style { on: true },
        );
        assert!(
            lost[0].contains("\x1b[31;1mquorum NOT held\x1b[0m"),
            "{}",
            lost[0]
        );
    }
}
