//! Three `shoal daemon` processes on loopback, several clients each:
//! joins and leaves, every service type, a daemon killed with SIGKILL
//! and restarted, one stopped with SIGTERM, and bad input. Outcomes are
//! asserted with generous time bounds; nothing depends on this machine's
//! speed except how long the test takes.
//!
//! Every client records what it sends, delivers and sees as the history
//! checker's records (each payload carries its sender's sequence number),
//! and each test ends by draining its clients and judging that history with
//! `shoal-check` (`check_history`).

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shoal_wire::client::{code, decode, Frame, Limits, Reason, Service};

const PATIENCE: Duration = Duration::from_secs(40);

thread_local! {
    /// The records of this test's clients (each test runs on its own thread).
    static HISTORY: RefCell<Vec<shoal_check::Record>> = const { RefCell::new(Vec::new()) };
}

fn record(r: shoal_check::Record) {
    HISTORY.with(|h| h.borrow_mut().push(r));
}

/// Payloads start with this tag and the sender's sequence number (u64,
/// big-endian); `Client::recv` takes them off again.
const SEQ_TAG: &[u8; 2] = b"sq";

fn with_seq(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = SEQ_TAG.to_vec();
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn check_service(s: Service) -> shoal_check::Service {
    shoal_check::Service::ALL[s as usize]
}

/// A minimal blocking client speaking the frames directly (the daemon is
/// under test here, not the client library).
struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
    name: String,
    /// The private group the daemon gave it, once connected; a client
    /// without one (a status probe) records nothing.
    private: Option<String>,
    /// Sequence number of its last multicast.
    seq: u64,
    /// Its session's end is recorded.
    ended: bool,
}

impl Client {
    /// Connects, retrying while the daemon is not ready yet.
    fn connect(socket: &Path, name: &str) -> Client {
        let start = Instant::now();
        loop {
            if let Ok(stream) = UnixStream::connect(socket) {
                let mut c = Client {
                    stream,
                    buf: Vec::new(),
                    name: name.to_string(),
                    private: None,
                    seq: 0,
                    ended: false,
                };
                c.send(&Frame::Connect {
                    name: name.to_string(),
                    token: String::new(),
                });
                match c.recv(Duration::from_secs(10)) {
                    Some(Frame::ConnectOk { private_group }) => {
                        c.private = Some(private_group);
                        return c;
                    }
                    Some(Frame::Error {
                        code: code::UNAVAILABLE,
                        ..
                    })
                    | None => {}
                    other => panic!("connect {name}: {other:?}"),
                }
            }
            assert!(
                start.elapsed() < PATIENCE,
                "daemon at {} never ready",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn send(&mut self, frame: &Frame) {
        let bytes = frame.to_vec().unwrap();
        self.stream.write_all(&bytes).unwrap();
    }

    fn join(&mut self, group: &str) {
        self.send(&Frame::Join {
            group: group.to_string(),
        });
    }

    /// Multicasts `payload` (with its sequence number in front) and
    /// records the send.
    fn multicast(&mut self, service: Service, group: &str, payload: &[u8]) {
        self.seq += 1;
        if let Some(me) = &self.private {
            record(shoal_check::Record::send(
                me,
                self.seq,
                check_service(service),
                &[group],
            ));
        }
        self.send(&Frame::Multicast {
            service,
            groups: vec![group.to_string()],
            payload: with_seq(self.seq, payload),
        });
    }

    /// Records what `frame` tells the history and strips the sequence
    /// number from a message's payload.
    fn observe(&mut self, frame: Frame) -> Frame {
        let Some(me) = self.private.clone() else {
            return frame;
        };
        match frame {
            Frame::Message {
                sender,
                service,
                groups,
                payload,
            } => {
                // A payload without a sequence number is recorded as seq 0,
                // which the checker reports as never sent.
                let (seq, payload) = match payload.strip_prefix(SEQ_TAG) {
                    Some(rest) if rest.len() >= 8 => (
                        u64::from_be_bytes(rest[..8].try_into().unwrap()),
                        rest[8..].to_vec(),
                    ),
                    _ => (0, payload),
                };
                let gs: Vec<&str> = groups.iter().map(String::as_str).collect();
                record(shoal_check::Record::deliver(
                    &me,
                    &sender,
                    seq,
                    check_service(service),
                    &gs,
                ));
                Frame::Message {
                    sender,
                    service,
                    groups,
                    payload,
                }
            }
            Frame::Membership {
                group,
                view_id,
                reason,
                transitional,
                quorum,
                members,
            } => {
                let ms: Vec<&str> = members.iter().map(String::as_str).collect();
                record(shoal_check::Record::view_as_announced(
                    &me,
                    &group,
                    view_id,
                    &ms,
                    transitional,
                    quorum,
                ));
                Frame::Membership {
                    group,
                    view_id,
                    reason,
                    transitional,
                    quorum,
                    members,
                }
            }
            other => other,
        }
    }

    /// Records the end of this client's session (once).
    fn end(&mut self, reason: &str) {
        if let (Some(me), false) = (&self.private, self.ended) {
            record(shoal_check::Record::ended(me, reason));
            self.ended = true;
        }
    }

    /// The next frame, or None after `timeout` or at EOF.
    fn recv(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((frame, used)) = decode(&self.buf, &Limits::default()).unwrap() {
                self.buf.drain(..used);
                return Some(self.observe(frame));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.end("the daemon closed the connection");
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return None,
                Err(e) => {
                    self.end(&format!("the connection broke: {e}"));
                    return None;
                }
            }
        }
    }

    /// Reads until `pred` matches a frame; returns the frames read.
    fn until(&mut self, what: &str, pred: impl FnMut(&Frame) -> bool) -> Vec<Frame> {
        self.until_or_dump(what, pred, &[])
    }

    /// As `until`; on a timeout the panic also shows these daemons' status.
    fn until_or_dump(
        &mut self,
        what: &str,
        mut pred: impl FnMut(&Frame) -> bool,
        daemons: &[PathBuf],
    ) -> Vec<Frame> {
        let start = Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < PATIENCE {
            if let Some(f) = self.recv(Duration::from_millis(500)) {
                let done = pred(&f);
                seen.push(f);
                if done {
                    return seen;
                }
            }
        }
        let statuses: Vec<String> = daemons.iter().map(|s| status(s)).collect();
        panic!(
            "{}: no {what} within {PATIENCE:?}; saw {seen:?}\n{}",
            self.name,
            statuses.join("\n---\n")
        );
    }

    /// Waits for a membership of `group` with exactly `n` members.
    fn until_members(&mut self, group: &str, n: usize) -> (Reason, Vec<String>) {
        let frames = self.until(&format!("{group} with {n} members"), |f| {
            matches!(f, Frame::Membership { group: g, members, .. } if g == group && members.len() == n)
        });
        match frames.last() {
            Some(Frame::Membership {
                reason, members, ..
            }) => (*reason, members.clone()),
            _ => unreachable!(),
        }
    }

    /// Collects `n` message payloads.
    fn messages(&mut self, n: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        self.until(&format!("{n} messages"), |f| {
            if let Frame::Message { payload, .. } = f {
                got.push(payload.clone());
            }
            got.len() >= n
        });
        got
    }
}

impl Drop for Client {
    /// The test stops reading it: nothing more is expected at it.
    fn drop(&mut self) {
        self.end("the test dropped it");
    }
}

/// Drains `clients` (each until a second passes with nothing new, or EOF),
/// then judges the history this test's clients recorded and asserts it
/// clean. On a violation the history is kept as JSON lines for `shoal check`.
fn check_history<'a>(clients: impl IntoIterator<Item = &'a mut Client>) {
    check_systems_apart(clients, &[]);
}

/// As `check_history`, for clients of separate systems (daemons that cannot
/// form one cluster): the clients named in each of `systems` are judged as
/// one history, the rest as another.
fn check_systems_apart<'a>(clients: impl IntoIterator<Item = &'a mut Client>, systems: &[&[&str]]) {
    for c in clients {
        let start = Instant::now();
        while c.recv(Duration::from_secs(1)).is_some() {
            assert!(start.elapsed() < PATIENCE, "{} never went quiet", c.name);
        }
    }
    let records = HISTORY.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let mut parts: Vec<Vec<shoal_check::Record>> = vec![Vec::new(); systems.len() + 1];
    for r in records {
        let i = systems
            .iter()
            .position(|names| names.contains(&r.client()))
            .unwrap_or(systems.len());
        parts[i].push(r);
    }
    for (i, records) in parts.into_iter().enumerate() {
        let text: String = records.iter().map(|r| r.to_json() + "\n").collect();
        let report = shoal_check::check(records);
        eprint!("{report}");
        if !report.is_clean() {
            let test = std::thread::current()
                .name()
                .unwrap_or("test")
                .replace("::", "-");
            let path = std::env::temp_dir().join(format!(
                "shoal-it-history-{test}-{i}-{}.jsonl",
                std::process::id()
            ));
            std::fs::write(&path, text).unwrap();
            panic!("history ({}):\n{report}", path.display());
        }
    }
}

struct Daemon {
    child: Option<Child>,
    config: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start(config: &Path, socket: &Path) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["daemon", "--log", "warn", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shoal daemon");
        Daemon {
            child: Some(child),
            config: config.to_path_buf(),
            socket: socket.to_path_buf(),
        }
    }

    fn restart(&mut self) {
        *self = Daemon::start(&self.config, &self.socket);
    }

    fn signal(&mut self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success());
    }

    /// Waits for the process to exit; its exit status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < PATIENCE, "daemon did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OTHER_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// Writes three configurations, daemon i with cluster key `keys[i]`;
/// returns (config, socket) paths.
fn cluster_files(dir: &Path, keys: [&str; 3]) -> Vec<(PathBuf, PathBuf)> {
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_udp_port()).collect();
    let names = ["a", "b", "c"];
    (0..3)
        .map(|i| {
            let socket = dir.join(format!("{}.sock", names[i]));
            let peers: Vec<String> = addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| format!("\"{a}\""))
                .collect();
            let text = format!(
                "node = \"{}\"\nsocket = \"{}\"\nlisten = \"{}\"\npeers = [{}]\n\n[auth]\nkey = \"{}\"\n\n[cluster]\nfound_after = 1000\n\n[cluster.vsync]\nview_period = 2000\n",
                names[i],
                socket.display(),
                addrs[i],
                peers.join(", "),
                keys[i]
            );
            let config = dir.join(format!("{}.toml", names[i]));
            std::fs::write(&config, text).unwrap();
            (config, socket)
        })
        .collect()
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-it-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn three_daemons_serve_groups_through_failure_restart_and_shutdown() {
    let dir = temp_dir("three");
    let files = cluster_files(&dir, [KEY; 3]);
    let mut daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();

    // Two clients per daemon, all in "g".
    let mut clients: Vec<Client> = Vec::new();
    for (d, (_, socket)) in files.iter().enumerate() {
        for k in 0..2 {
            let mut c = Client::connect(socket, &format!("c{d}{k}"));
            c.join("g");
            clients.push(c);
        }
    }
    for c in clients.iter_mut() {
        let (_, members) = c.until_members("g", 6);
        assert!(members.contains(&"#c00#a".to_string()), "{members:?}");
    }

    // Agreed: every client delivers every message in one order.
    for (i, c) in clients.iter_mut().enumerate() {
        for m in 0..10u8 {
            c.multicast(Service::Agreed, "g", &[i as u8, m]);
        }
    }
    let orders: Vec<Vec<Vec<u8>>> = clients.iter_mut().map(|c| c.messages(60)).collect();
    for o in &orders[1..] {
        assert_eq!(o, &orders[0], "agreed order differs");
    }

    // Every service is carried, safe included (held until every daemon
    // holds it). The total order's services arrive in the sender's order;
    // unreliable and probabilistic go by pbcast alone and may come first.
    let name = |s: &Service| s.name().as_bytes().to_vec();
    let ordered = |s: &&Service| !matches!(s, Service::Unreliable | Service::Probabilistic);
    for service in Service::ALL {
        clients[0].multicast(service, "g", service.name().as_bytes());
    }
    for c in clients.iter_mut() {
        let got = c.messages(Service::ALL.len());
        let mut all: Vec<Vec<u8>> = Service::ALL.iter().map(name).collect();
        let mut sorted = got.clone();
        sorted.sort();
        all.sort();
        assert_eq!(sorted, all);
        let in_order: Vec<Vec<u8>> = Service::ALL.iter().filter(ordered).map(name).collect();
        let got_ordered: Vec<Vec<u8>> = got.into_iter().filter(|p| in_order.contains(p)).collect();
        assert_eq!(got_ordered, in_order);
    }

    // A private group (`#name#daemon`) reaches that client only: the others'
    // next message is the one ordered after it.
    clients[4].multicast(Service::Fifo, "#c00#a", b"private");
    clients[4].multicast(Service::Agreed, "g", b"public");
    assert_eq!(
        clients[0].messages(2),
        vec![b"private".to_vec(), b"public".to_vec()]
    );
    for c in clients[1..].iter_mut() {
        assert_eq!(c.messages(1), vec![b"public".to_vec()]);
    }

    // The client library's batch: many messages in one write, ordered as
    // consecutive FIFO messages of that client.
    let batch: Vec<Vec<u8>> = (0..300u16).map(|i| i.to_be_bytes().repeat(50)).collect();
    let endpoint = shoal_client::Endpoint::Unix(files[1].1.clone());
    let mut batcher = shoal_client::Client::connect_to(&endpoint, "batcher").unwrap();
    let me = batcher.private_group().to_string();
    let tagged: Vec<Vec<u8>> = (1..).zip(&batch).map(|(seq, p)| with_seq(seq, p)).collect();
    for seq in 1..=tagged.len() as u64 {
        record(shoal_check::Record::send(
            &me,
            seq,
            shoal_check::Service::Fifo,
            &["g"],
        ));
    }
    batcher
        .multicast_batch(Service::Fifo, &["g"], &tagged)
        .unwrap();
    for c in clients.iter_mut() {
        assert_eq!(c.messages(batch.len()), batch);
    }
    batcher.disconnect().unwrap();
    record(shoal_check::Record::ended(&me, "disconnected"));

    // Garbage on a connection: an error frame, the connection closed, the
    // daemon still serving the others.
    let mut bad = UnixStream::connect(&files[0].1).unwrap();
    bad.write_all(&[0, 0, 0, 3, 9, 9, 9]).unwrap();
    let mut reply = Vec::new();
    bad.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = bad.read_to_end(&mut reply);
    match decode(&reply, &Limits::default()) {
        Ok(Some((Frame::Error { code, .. }, _))) => assert_eq!(code, code::MALFORMED),
        other => panic!("garbage got {other:?}"),
    }

    // Wait until every daemon is a backup (the committee fills one view
    // after the joins; before that, losing the primary would stop the
    // cluster, docs/daemon.md).
    let start = Instant::now();
    while !files
        .iter()
        .all(|(_, s)| status(s).contains("committee: 3 "))
    {
        assert!(start.elapsed() < PATIENCE, "committee never filled");
        std::thread::sleep(Duration::from_millis(100));
    }

    // SIGKILL daemon c: the survivors see its clients go (network), and
    // keep delivering everything their peers send.
    daemons[2].signal("-KILL");
    daemons[2].wait();
    clients.truncate(4);
    for c in clients.iter_mut() {
        let (reason, members) = c.until_members("g", 4);
        assert_eq!(reason, Reason::Network, "{members:?}");
    }
    for (i, c) in clients.iter_mut().enumerate() {
        for m in 0..5u8 {
            c.multicast(Service::Fifo, "g", &[100 + i as u8, m]);
        }
    }
    let survivors: Vec<PathBuf> = files[..2].iter().map(|(_, s)| s.clone()).collect();
    for c in clients.iter_mut() {
        let mut got = Vec::new();
        c.until_or_dump(
            "20 messages",
            |f| {
                if let Frame::Message { payload, .. } = f {
                    got.push(payload.clone());
                }
                got.len() >= 20
            },
            &survivors,
        );
        for i in 0..4u8 {
            let from_i: Vec<u8> = got
                .iter()
                .filter(|p| p[0] == 100 + i)
                .map(|p| p[1])
                .collect();
            assert_eq!(from_i, vec![0, 1, 2, 3, 4], "fifo from {i}");
        }
    }

    // Restart c: it rejoins, and its new client sees the whole group.
    daemons[2].restart();
    let mut late = Client::connect(&files[2].1, "late");
    late.join("g");
    let (_, members) = late.until_members("g", 5);
    assert!(members.contains(&"#c10#b".to_string()), "{members:?}");
    clients[0].until_members("g", 5);

    // SIGTERM daemon b: its clients are told, the others see them leave
    // as a disconnect (not a failure), and b exits cleanly.
    daemons[1].signal("-TERM");
    let frames = clients[2].until("shutdown notice", |f| {
        matches!(
            f,
            Frame::Error {
                code: code::SHUTDOWN,
                ..
            }
        )
    });
    assert!(!frames.is_empty());
    let (reason, members) = clients[0].until_members("g", 3);
    assert_eq!(reason, Reason::Disconnect, "{members:?}");
    assert!(daemons[1].wait().success());
    check_history(clients.iter_mut().chain([&mut late]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Asks a daemon for its status text.
fn status(socket: &Path) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(&Frame::Status.to_vec().unwrap()).unwrap();
    let mut c = Client {
        stream,
        buf: Vec::new(),
        name: "status".to_string(),
        private: None,
        seq: 0,
        ended: false,
    };
    match c.recv(PATIENCE) {
        Some(Frame::StatusReply { text }) => text,
        other => panic!("status: {other:?}"),
    }
}

/// The address a status `text` names on its line starting with `prefix`
/// (a listener configured on port 0 reports the port it got).
fn bound_address(text: &str, prefix: &str) -> SocketAddr {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} line in status: {text}"))
}

#[test]
fn a_daemon_without_the_cluster_key_cannot_join_or_inject() {
    let dir = temp_dir("key");
    let files = cluster_files(&dir, [KEY, KEY, OTHER_KEY]);
    // Port 0: the daemon binds a free port and names it in its status (a
    // port picked here and released could be taken by then; it was, once).
    let mut text = std::fs::read_to_string(&files[0].0).unwrap();
    text.push_str("\n[metrics]\naddress = \"127.0.0.1:0\"\n");
    std::fs::write(&files[0].0, text).unwrap();
    let _daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let mut clients = one_client_each_joining_g(&files, "k");
    // The two daemons with the key share the group; the third is alone
    // (it founded a cluster of its own, deaf to the others).
    clients[0].until_members("g", 2);
    clients[1].until_members("g", 2);
    clients[2].until_members("g", 1);
    clients[2].multicast(Service::Agreed, "g", b"intruder");
    clients[0].multicast(Service::Agreed, "g", b"member");
    let got = clients[1].messages(1);
    assert_eq!(got, vec![b"member".to_vec()]);
    assert!(clients[1].recv(Duration::from_secs(1)).is_none());
    let text = status(&files[0].1);
    let dropped: u64 = text
        .lines()
        .find_map(|l| l.split("failed authentication ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("status names authentication drops");
    assert!(dropped > 0, "{text}");

    // The Prometheus endpoint says the same.
    let metrics = bound_address(&text, "metrics on ");
    let mut http = std::net::TcpStream::connect(metrics).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    http.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let value = |name: &str| -> u64 {
        page.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {page}"))
    };
    assert!(value("shoal_drops_total{reason=\"failed_authentication\"}") > 0);
    assert_eq!(value("shoal_clients"), 1);
    assert_eq!(value("shoal_view_members"), 2);
    assert!(value("shoal_packets_sent_total{kind=\"gossip\"}") > 0);
    // The engines' buffers are reported (values depend on timing).
    for held in [
        "shoal_vsync_store_records",
        "shoal_vsync_store_bytes",
        "shoal_vsync_pending_records",
        "shoal_pbcast_buffered_messages",
    ] {
        value(held);
    }
    // The daemon without the key founded a cluster of its own, which reuses
    // view ids of the other: two systems, each judged alone.
    check_systems_apart(&mut clients, &[&["#k2#c"]]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One daemon, no peers, with a TCP listener on a free port (named in its
/// status: `tcp clients on`) and a small client queue.
fn single_daemon(dir: &Path) -> (PathBuf, PathBuf) {
    let socket = dir.join("solo.sock");
    let config = dir.join("solo.toml");
    let text = format!(
        "node = \"solo\"\nsocket = \"{}\"\nlisten = \"{}\"\n\n[tcp]\naddress = \"127.0.0.1:0\"\ntoken = \"sesame\"\n\n[limits]\nclient_queue = 200000\n\n[cluster]\nfound_after = 300\n",
        socket.display(),
        free_udp_port(),
    );
    std::fs::write(&config, text).unwrap();
    (config, socket)
}

#[test]
fn a_slow_reader_is_disconnected_with_its_reason_and_nothing_more_is_buffered_for_it() {
    let dir = temp_dir("slow");
    let (config, socket) = single_daemon(&dir);
    let _daemon = Daemon::start(&config, &socket);
    let mut slow = Client::connect(&socket, "slow");
    slow.join("flood");
    slow.until_members("flood", 1);
    // The sender is not a member (open group), so only `slow` receives.
    let mut fast = Client::connect(&socket, "fast");
    let payload = vec![7u8; 1024];
    for _ in 0..5_000 {
        fast.multicast(Service::Fifo, "flood", &payload);
    }
    // Now read: some messages, then the reason, then the end.
    let frames = slow.until("the slow-client error", |f| {
        matches!(f, Frame::Error { .. })
    });
    assert!(matches!(
        frames.last(),
        Some(Frame::Error {
            code: code::SLOW_CLIENT,
            ..
        })
    ));
    // What reached it is what its 200 KB queue and the socket buffers held
    // when the daemon gave up (a few hundred 1 KB messages), not the 5 MB
    // sent: the daemon does not keep buffering for a reader that does not
    // read.
    let delivered = frames
        .iter()
        .filter(|f| matches!(f, Frame::Message { .. }))
        .count();
    assert!(delivered < 2_000, "{delivered}");
    assert!(
        slow.recv(Duration::from_secs(5)).is_none(),
        "closed after the reason"
    );
    // The daemon serves on.
    let mut other = Client::connect(&socket, "other");
    other.join("g2");
    other.until_members("g2", 1);
    check_history([&mut slow, &mut fast, &mut other]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tcp_clients_need_the_token() {
    let dir = temp_dir("tcp");
    let (config, socket) = single_daemon(&dir);
    let _daemon = Daemon::start(&config, &socket);
    // Wait until the daemon serves (over the Unix socket).
    Client::connect(&socket, "probe");
    let tcp = bound_address(&status(&socket), "tcp clients on ");
    let ask = |token: &str| -> Frame {
        let mut s = std::net::TcpStream::connect(tcp).unwrap();
        let hello = Frame::Connect {
            name: "remote".into(),
            token: token.into(),
        };
        s.write_all(&hello.to_vec().unwrap()).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((f, _)) = decode(&buf, &Limits::default()).unwrap() {
                return f;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "closed without an answer");
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    assert!(matches!(
        ask("wrong"),
        Frame::Error {
            code: code::AUTH,
            ..
        }
    ));
    assert!(matches!(
        ask(""),
        Frame::Error {
            code: code::AUTH,
            ..
        }
    ));
    assert!(matches!(ask("sesame"), Frame::ConnectOk { .. }));
    check_history(std::iter::empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon stopped (SIGSTOP) past its committee timeout is evicted; when
/// it runs again it rejoins under its next incarnation and keeps its client,
/// who hears a transitional membership with itself alone, then the merged
/// one, and whose messages reach everyone again. (Until the joining daemon
/// waited for one member's whole table, the checker found one view id with
/// two member lists in some runs; 4 runs of 4 are clean since.)
#[test]
fn a_daemon_evicted_while_stopped_rejoins_with_its_client() {
    let (dir, mut daemons, mut clients, sockets) = committee_of_three("evict", "e");
    daemons[2].signal("-STOP");
    for c in &mut clients[..2] {
        let frames = c.until_or_dump(
            "g with 2 members",
            |f| matches!(f, Frame::Membership { members, .. } if members.len() == 2),
            &sockets[..2],
        );
        assert!(
            matches!(
                frames.last(),
                Some(Frame::Membership {
                    reason: Reason::Network,
                    ..
                })
            ),
            "{frames:?}"
        );
    }
    daemons[2].signal("-CONT");
    let alone = clients[2].until_or_dump(
        "a network membership with itself alone",
        |f| matches!(f, Frame::Membership { reason: Reason::Network, members, .. } if members.len() == 1),
        &sockets,
    );
    assert!(
        !alone.iter().any(|f| matches!(f, Frame::Error { .. })),
        "{alone:?}"
    );
    for c in clients.iter_mut() {
        let (reason, members) = c.until_members("g", 3);
        assert_eq!(reason, Reason::Network, "{members:?}");
    }
    fifo_reaches_everyone(&mut clients, 2);
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a client writes while its daemon is stopped (SIGSTOP) past its
/// committee timeout is delivered once the daemon runs again and rejoins,
/// or the client is told it was not: the history checker judges it.
#[test]
fn what_a_client_writes_while_its_daemon_is_stopped_is_not_lost_silently() {
    let (dir, mut daemons, mut clients, sockets) = committee_of_three("stopped-writes", "w");
    daemons[2].signal("-STOP");
    for m in 0..20u8 {
        clients[2].multicast(Service::Fifo, "g", &[m]);
    }
    for c in &mut clients[..2] {
        c.until_or_dump(
            "g with 2 members",
            |f| matches!(f, Frame::Membership { members, .. } if members.len() == 2),
            &sockets[..2],
        );
    }
    daemons[2].signal("-CONT");
    for c in clients.iter_mut() {
        c.until_members("g", 3);
    }
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The primary daemon stopped (SIGSTOP) past its committee timeout is alive
/// but silent, as across a network cut: a backup takes over and the other
/// two daemons move on without it, deciding their Newview with a majority
/// (docs/vsync.md, "Newviews chosen by a majority"). Resumed, the old
/// primary holds a stale role and a stale view; it must not order anything
/// beside the new primary. The clients of the two daemons that stayed
/// deliver the same agreed sequence, every message of theirs included, and
/// the resumed daemon rejoins with its client.
#[test]
fn a_primary_daemon_stopped_past_its_timeout_resumes_without_splitting_the_order() {
    let (dir, mut daemons, mut clients, sockets) = committee_of_three("primary-stop", "p");
    let primary = (0..3)
        .find(|&i| status(&sockets[i]).contains("; primary next gseq"))
        .expect("one daemon is the primary");
    let others: Vec<usize> = (0..3).filter(|&i| i != primary).collect();
    // Messages in flight through the primary as it stops, then more while
    // it is stopped (ordered only once a backup took over).
    for m in 0..5u8 {
        for &i in &others {
            clients[i].multicast(Service::Agreed, "g", &[i as u8, m]);
        }
    }
    daemons[primary].signal("-STOP");
    for m in 5..10u8 {
        for &i in &others {
            clients[i].multicast(Service::Agreed, "g", &[i as u8, m]);
        }
    }
    let mut orders = Vec::new();
    for &i in &others {
        let mut got = Vec::new();
        clients[i].until_or_dump(
            "the 20 agreed messages of the two daemons that stayed",
            |f| {
                if let Frame::Message { payload, .. } = f {
                    got.push(payload.clone());
                }
                got.iter().filter(|p| p.len() == 2).count() >= 20
            },
            &sockets,
        );
        orders.push(got);
    }
    assert_eq!(orders[0], orders[1], "agreed order differs");
    daemons[primary].signal("-CONT");
    for c in clients.iter_mut() {
        c.until_members("g", 3);
    }
    fifo_reaches_everyone(&mut clients, primary);
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three daemons (in `temp_dir(tag)`), a client of each in "g" (names
/// `{prefix}0..2`), and their sockets, once the committee is full: until
/// then its primary alone orders (k = 1 in effect), and a stopped daemon
/// could stop the cluster.
fn committee_of_three(
    tag: &str,
    prefix: &str,
) -> (PathBuf, Vec<Daemon>, Vec<Client>, Vec<PathBuf>) {
    let dir = temp_dir(tag);
    let files = cluster_files(&dir, [KEY; 3]);
    let daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let clients = one_client_each_in_g(&files, prefix);
    let sockets: Vec<PathBuf> = files.iter().map(|(_, s)| s.clone()).collect();
    until_committee_full(&sockets[0]);
    (dir, daemons, clients, sockets)
}

/// Waits until the daemon at `socket` reports a committee of three.
fn until_committee_full(socket: &Path) {
    let start = Instant::now();
    while !status(socket).contains("committee: 3 ") {
        assert!(start.elapsed() < PATIENCE, "{}", status(socket));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `(base, committed)` from a committee member's `vsync state` status line.
fn collection_state(socket: &Path) -> Option<(u64, u64)> {
    let text = status(socket);
    let line = text.lines().find(|l| l.contains("vsync state:"))?;
    let line = &line[line.find("committee epoch")?..];
    let after = |key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((after(" base ")?, after(" committed ")?))
}

/// With no view change due for a minute, the daemons still collect what
/// every daemon delivered (`progress_interval`, 100 ms): each committee
/// member's collection base reaches its committed frontier once the
/// cluster is quiet. (With `progress_interval = 0` it fails: the base stays
/// at the last view change's checkpoint, 6 against 13 committed when tried.)
#[test]
fn the_daemons_collect_what_every_daemon_delivered_between_view_changes() {
    let dir = temp_dir("collect");
    let files = cluster_files(&dir, [KEY; 3]);
    for (config, _) in &files {
        let text = std::fs::read_to_string(config).unwrap();
        std::fs::write(
            config,
            text.replace("view_period = 2000", "view_period = 60000"),
        )
        .unwrap();
    }
    let _daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let mut clients = one_client_each_in_g(&files, "k");
    let sockets: Vec<PathBuf> = files.iter().map(|(_, s)| s.clone()).collect();
    until_committee_full(&sockets[0]);
    let before = collection_state(&sockets[0]).expect("a committee member");
    for from in 0..3 {
        fifo_reaches_everyone(&mut clients, from);
    }
    for socket in &sockets {
        let start = Instant::now();
        loop {
            let (base, committed) = collection_state(socket).expect("a committee member");
            if base == committed && committed > before.1 {
                break;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "base {base}, committed {committed} (before the traffic: {before:?})\n{}",
                status(socket)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client on each daemon (`{prefix}0`, `{prefix}1`, ...), each asking to
/// join group "g".
fn one_client_each_joining_g(files: &[(PathBuf, PathBuf)], prefix: &str) -> Vec<Client> {
    files
        .iter()
        .enumerate()
        .map(|(i, (_, socket))| {
            let mut c = Client::connect(socket, &format!("{prefix}{i}"));
            c.join("g");
            c
        })
        .collect()
}

/// As `one_client_each_joining_g`, once each client sees all of them in "g".
fn one_client_each_in_g(files: &[(PathBuf, PathBuf)], prefix: &str) -> Vec<Client> {
    let mut clients = one_client_each_joining_g(files, prefix);
    for c in clients.iter_mut() {
        c.until_members("g", files.len());
    }
    clients
}

/// Client `from` multicasts 20 FIFO messages to "g"; every client gets them
/// all, in order.
fn fifo_reaches_everyone(clients: &mut [Client], from: usize) {
    let sent: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 100]).collect();
    for payload in &sent {
        clients[from].multicast(Service::Fifo, "g", payload);
    }
    for c in clients.iter_mut() {
        assert_eq!(c.messages(sent.len()), sent);
    }
}

/// An administratively scoped group `239.255.{third}.x` (x from this
/// process, so that concurrent runs do not share it) on a free port.
fn test_group(third: u8) -> std::net::SocketAddrV4 {
    let last = (std::process::id() % 250) as u8 + 1;
    let port = free_udp_port().port();
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, third, last), port)
}

/// A socket of this test that also receives `group`'s datagrams on
/// loopback, as each daemon's does (SO_REUSEADDR).
fn group_listener(group: std::net::SocketAddrV4) -> UdpSocket {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
    socket.set_reuse_address(true).unwrap();
    socket.bind(&SocketAddr::V4(group).into()).unwrap();
    socket
        .join_multicast_v4(group.ip(), &std::net::Ipv4Addr::LOCALHOST)
        .unwrap();
    let socket: UdpSocket = socket.into();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    socket
}

/// `multicast = "239.255.x.y:port"`: the daemons' first phase goes by IP
/// multicast on loopback (a listener of the test sees their datagrams on the
/// group), and clients on every daemon get every message, in order.
#[test]
fn daemons_deliver_over_ip_multicast_on_loopback() {
    let dir = temp_dir("mcast");
    let files = cluster_files(&dir, [KEY, KEY, KEY]);
    let group = test_group(77);
    for (config, _) in &files {
        let text = std::fs::read_to_string(config).unwrap();
        let text = text.replacen("\n[auth]", &format!("multicast = \"{group}\"\n\n[auth]"), 1);
        std::fs::write(config, text).unwrap();
    }
    let listener = group_listener(group);
    let _daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let mut clients = one_client_each_in_g(&files, "m");
    fifo_reaches_everyone(&mut clients, 0);
    let mut buf = [0u8; 65_536];
    let deadline = Instant::now() + PATIENCE;
    let mut seen = 0;
    while seen == 0 && Instant::now() < deadline {
        if listener.recv_from(&mut buf).is_ok() {
            seen += 1;
        }
    }
    assert!(seen > 0, "no datagram on the multicast group");
    // Every daemon took the group's datagrams as its peers' own: none
    // dropped as from an unknown source or failing authentication.
    for (_, socket) in &files {
        let text = status(socket);
        assert!(
            text.contains("drops: unknown source 0, failed authentication 0,"),
            "{text}"
        );
    }
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `discovery = "239.255.x.y:port"` and a `slot` each, no `peers`: the
/// daemons find each other by multicast presence on loopback, learn each
/// other's addresses, form one cluster and deliver every message, in order,
/// to a client on each. None drops a datagram as a slot conflict or from an
/// unknown source, until a fourth daemon claims a slot already taken.
#[test]
fn daemons_without_peers_discover_each_other_by_ip_multicast() {
    let dir = temp_dir("discovery");
    let files = cluster_files(&dir, [KEY, KEY, KEY]);
    let group = test_group(78);
    for (slot, (config, _)) in files.iter().enumerate() {
        let text = std::fs::read_to_string(config).unwrap();
        let peers = text.lines().find(|l| l.starts_with("peers = ")).unwrap();
        let text = text.replacen(peers, &format!("discovery = \"{group}\"\nslot = {slot}"), 1);
        std::fs::write(config, text).unwrap();
    }
    let _daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let mut clients = one_client_each_in_g(&files, "d");
    fifo_reaches_everyone(&mut clients, 2);
    for (_, socket) in &files {
        let text = status(socket);
        assert!(text.contains("(3 members"), "{text}");
        assert!(
            text.contains("drops: unknown source 0, failed authentication 0,"),
            "{text}"
        );
        assert!(text.contains("slot conflicts 0"), "{text}");
    }

    // A fourth daemon configured with slot 1 at another address: the others
    // refuse its datagrams as slot conflicts and keep serving their clients.
    let socket = dir.join("dup.sock");
    let config = dir.join("dup.toml");
    let text = std::fs::read_to_string(&files[1].0).unwrap();
    let listen = text.lines().find(|l| l.starts_with("listen = ")).unwrap();
    let text = text
        .replacen("node = \"b\"", "node = \"dup\"", 1)
        .replacen(
            &files[1].1.display().to_string(),
            &socket.display().to_string(),
            1,
        )
        .replacen(listen, &format!("listen = \"{}\"", free_udp_port()), 1);
    std::fs::write(&config, text).unwrap();
    let _dup = Daemon::start(&config, &socket);
    let start = Instant::now();
    while slot_conflicts(&files[0].1) == 0 {
        assert!(start.elapsed() < PATIENCE, "no slot conflict counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    clients[0].multicast(Service::Fifo, "g", b"after");
    for c in clients.iter_mut() {
        assert_eq!(c.messages(1), vec![b"after".to_vec()]);
    }
    assert!(status(&files[0].1).contains("(3 members"));
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The "slot conflicts" counter of a daemon's status.
fn slot_conflicts(socket: &Path) -> u64 {
    let text = status(socket);
    text.lines()
        .find_map(|l| l.split("slot conflicts ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("status names slot conflicts: {text}"))
}

/// `(sent, hybrid)` from a daemon's `qsm: sent S (hybrid H)` status line.
fn qsm_sent(socket: &Path) -> (u64, u64) {
    let text = status(socket);
    let line = text
        .lines()
        .find_map(|l| l.split("qsm: sent ").nth(1))
        .unwrap_or_else(|| panic!("status has a qsm line: {text}"));
    let num = |s: &str| -> u64 {
        s.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number in {line}"))
    };
    let hybrid = line.split("(hybrid ").nth(1).expect("hybrid count");
    (num(line), num(hybrid))
}

/// `[qsm] hybrid = ["g"]`: each daemon's client is also in a group of its
/// own, so the three daemons are three regions and "g" spans all of them
/// (without the setting it keeps the total order). "g" is carried by an
/// instance of its own: FIFO messages reach everyone, in order, by it.
#[test]
fn a_hybrid_group_over_three_regions_is_carried_by_its_own_instance() {
    let dir = temp_dir("hybrid");
    let files = cluster_files(&dir, [KEY; 3]);
    for (config, _) in &files {
        let mut text = std::fs::read_to_string(config).unwrap();
        text.push_str("\n[qsm]\nenabled = true\nhybrid = [\"g\"]\n");
        std::fs::write(config, text).unwrap();
    }
    let _daemons: Vec<Daemon> = files.iter().map(|(c, s)| Daemon::start(c, s)).collect();
    let mut clients = one_client_each_in_g(&files, "h");
    for (i, c) in clients.iter_mut().enumerate() {
        let own = format!("own{i}");
        c.join(&own);
        c.until_members(&own, 1);
    }
    let sockets: Vec<PathBuf> = files.iter().map(|(_, s)| s.clone()).collect();
    until_committee_full(&sockets[0]);
    for socket in &sockets {
        let start = Instant::now();
        while !status(socket).contains("hybrid instance") {
            assert!(start.elapsed() < PATIENCE, "{}", status(socket));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Until every daemon's OPEN of the instance has come back in the total
    // order, messages go by the order; then by the instance.
    let start = Instant::now();
    loop {
        fifo_reaches_everyone(&mut clients, 0);
        if qsm_sent(&sockets[0]).1 > 0 {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{}", status(&sockets[0]));
    }
    let before = qsm_sent(&sockets[0]);
    fifo_reaches_everyone(&mut clients, 0);
    fifo_reaches_everyone(&mut clients, 1);
    let after = qsm_sent(&sockets[0]);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (20, 20),
        "daemon 0 sent its 20 by the hybrid instance: {}",
        status(&sockets[0])
    );
    assert!(qsm_sent(&sockets[1]).1 >= 20, "{}", status(&sockets[1]));
    check_history(&mut clients);
    let _ = std::fs::remove_dir_all(&dir);
}
