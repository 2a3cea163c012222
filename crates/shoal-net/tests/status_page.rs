//! The status page of a real daemon on loopback, loaded in headless
//! Chromium (Debian's `chromium`): the test asserts what the page shows
//! after its script fetched `/status.json`. Where no Chromium can be found
//! or run, the browser part is skipped with a message saying so (the JSON
//! is still checked). The same daemon answers a client's flow-control
//! query.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shoal_client::{Client, Endpoint, Membership, Received, Service};
use shoal_net::daemon::config::DaemonConfig;
use shoal_net::daemon::server;

/// Bounds a failing test; nothing here waits for its full length.
const BOUND: Duration = Duration::from_secs(30);

struct Daemon {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        // A free UDP port for the daemons' protocol (picked and released:
        // a lone daemon has no peers that must know it beforehand).
        let udp = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let socket = dir.join("d.sock");
        let text = format!(
            "node = \"s1\"\nsocket = {:?}\nlisten = \"{udp}\"\n[metrics]\naddress = \"127.0.0.1:0\"\n",
            socket.display().to_string()
        );
        let config = DaemonConfig::parse(&text).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || server::run(config, Some(rx)).unwrap());
        Daemon {
            stop: Some(tx),
            thread: Some(thread),
            socket,
        }
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.socket.clone())
    }

    /// A client, once the daemon accepts them.
    fn client(&self, name: &str) -> Client {
        let deadline = Instant::now() + BOUND;
        loop {
            match Client::connect_to(&self.endpoint(), name) {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("no daemon: {e}"),
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first view of `group` with `n` members `client` gets.
fn until_members(client: &mut Client, group: &str, n: usize) -> Membership {
    let deadline = Instant::now() + BOUND;
    while Instant::now() < deadline {
        if let Ok(Some(Received::Membership(v))) =
            client.receive_timeout(Duration::from_millis(200))
        {
            if v.group == group && v.members.len() == n {
                return v;
            }
        }
    }
    panic!("no view of {group} with {n} members");
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    // In pieces, as a client may send it.
    for piece in ["GET ", path, " HTTP/1.1\r\nhost: x\r\n\r\n"] {
        s.write_all(piece.as_bytes()).unwrap();
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The first Chromium found on the path.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// The page's DOM after its script ran, or why it could not be had.
fn dump_dom(browser: &Path, url: &str, profile: &Path) -> Result<String, String> {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            // Timers run on virtual time: the page refreshes (every 2 s)
            // at least twice, so its rates have two samples.
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", browser.display()))?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("Chromium did not finish within 90 s".into());
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    if dom.contains("<html") {
        Ok(dom)
    } else {
        Err(format!(
            "Chromium printed no page ({}); stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn the_status_page_shows_the_daemon_groups_clients_and_history() {
    let dir = std::env::temp_dir().join(format!("shoal-status-page-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let daemon = Daemon::start(&dir);
    let mut alice = daemon.client("alice");
    let mut bob = daemon.client("bob");
    alice.join("chat").unwrap();
    // Alone first: joins sent at once over two connections may be
    // ordered either way.
    let first = until_members(&mut alice, "chat", 1);
    assert_eq!(first.joined(), ["#alice#s1".to_string()]);
    bob.join("chat").unwrap();
    bob.join("news").unwrap();
    // The library's joined list, from a real daemon's views.
    let both = until_members(&mut alice, "chat", 2);
    assert_eq!(both.joined(), ["#bob#s1".to_string()]);
    assert!(both.left().is_empty());
    alice
        .multicast(Service::Agreed, &["chat"], b"hello")
        .unwrap();

    // The flow-control query against the real daemon.
    let state = alice.flow_control_state(BOUND).unwrap();
    let flow = state.daemon.expect("the daemon answered");
    assert!(flow.accepting);
    assert_eq!(flow.queue_limit, 32 << 20);
    assert_eq!(state.client_pending_bytes, 0);

    // The membership query: a client that never joined sees the members
    // of the group the two others joined (its table had both when alice
    // heard the view of two).
    let mut carol = daemon.client("carol");
    let members = carol.members("chat", BOUND).unwrap();
    assert_eq!(
        members,
        Some(vec!["#alice#s1".to_string(), "#bob#s1".to_string()])
    );
    assert_eq!(carol.members("nobody", BOUND).unwrap(), Some(Vec::new()));

    let text = shoal_client::status(&daemon.endpoint(), BOUND).unwrap();
    assert!(
        text.contains("\ngroup chat: #alice#s1, #bob#s1\n"),
        "{text}"
    );
    assert!(
        text.contains("\nclient #bob#s1: groups chat,news; queued "),
        "{text}"
    );
    let metrics: SocketAddr = text
        .lines()
        .find_map(|l| l.strip_prefix("metrics on "))
        .and_then(|a| a.parse().ok())
        .expect("the metrics listener's address");

    let json = http_get(metrics, "/status.json");
    assert!(json.starts_with("HTTP/1.1 200"), "{json}");
    let body = json.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["node"], "s1");
    assert_eq!(v["quorum"], true);
    assert_eq!(
        v["groups"],
        serde_json::json!([
            { "name": "chat", "members": ["#alice#s1", "#bob#s1"] },
            { "name": "news", "members": ["#bob#s1"] },
        ])
    );
    assert_eq!(v["clients"][1]["name"], "#bob#s1");
    assert!(v["counters"]["client_messages_sent"].as_u64().unwrap() >= 1);
    assert_eq!(v["history"][0]["kind"], "view");
    assert_eq!(v["drops"]["slow_client"], 0);
    let page = http_get(metrics, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<title>Shoal daemon status</title>"));

    let Some(browser) = chromium() else {
        eprintln!(
            "SKIPPED the browser part: no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
        );
        return;
    };
    let url = format!("http://{metrics}/");
    let dom = match dump_dom(&browser, &url, &dir.join("profile")) {
        Ok(dom) => dom,
        Err(why) => {
            eprintln!("SKIPPED the browser part: {why}");
            return;
        }
    };
    let shows = |what: &str| assert!(dom.contains(what), "the page lacks {what:?}:\n{dom}");
    shows("<span id=\"node\">s1</span>");
    shows("<span id=\"quorum\" class=\"badge held\">held</span>");
    shows("<span id=\"error\"></span>");
    shows("<tr><td>chat</td><td>#alice#s1, #bob#s1</td></tr>");
    shows("<tr><td>news</td><td>#bob#s1</td></tr>");
    shows("<td>#bob#s1</td><td>chat, news</td>");
    shows("<td>client messages sent</td>");
    shows("<td>slow client</td><td class=\"n\">0</td>");
    shows("this daemon primary");
    // The history's one view: this daemon founding its group, with quorum.
    assert!(
        dom.contains("<td>view</td>") && dom.contains("<td>held</td></tr>"),
        "no view in the history:\n{dom}"
    );
    // Two samples: a rate is a number, not the first sample's "…".
    let rates = dom
        .split("<table id=\"rates\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap();
    assert!(
        !rates.contains('…'),
        "the rates never had two samples:\n{rates}"
    );
    drop(alice);
    drop(bob);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
