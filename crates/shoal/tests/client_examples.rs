//! The client library (`shoal-client`) and its example programs against two
//! real `shoal daemon` processes on loopback: self-discard and message
//! types across daemons, the replicated key-value store with replicas
//! joining during load (state transfer), and the work queue with a worker
//! joining and one leaving while jobs arrive.
//!
//! The examples' code is compiled in here (`#[path]` modules) and each
//! program's `run`/`work`/`submit` is called on its own thread with a
//! channel for stdin and a shared buffer for stdout: everything the
//! program does but parse its command line. Every wait is bounded by a
//! generous `PATIENCE`; nothing depends on this machine's speed but how
//! long the test takes.

#[path = "../../shoal-client/examples/chat.rs"]
mod chat;
#[path = "../../shoal-client/examples/kv.rs"]
mod kv;
#[path = "../../shoal-client/examples/workq.rs"]
mod workq;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use shoal_client::{
    code, Client, ClientError, Endpoint, Membership, Received, SendOptions, Service,
};

const PATIENCE: Duration = Duration::from_secs(60);
const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two daemons `a` and `b` on loopback in a fresh directory, each serving
/// clients and both in one cluster.
struct Cluster {
    daemons: Vec<Daemon>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.daemons.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Cluster {
    fn start(tag: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("shoal-ex-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let addrs = [free_udp_port(), free_udp_port()];
        let mut daemons = Vec::new();
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            let socket = dir.join(format!("{name}.sock"));
            let text = format!(
                "node = \"{name}\"\nsocket = \"{}\"\nlisten = \"{}\"\npeers = [\"{}\"]\n\n\
                 [auth]\nkey = \"{KEY}\"\n\n[cluster]\nfound_after = 1000\n\n\
                 [cluster.vsync]\nview_period = 2000\n",
                socket.display(),
                addrs[i],
                addrs[1 - i],
            );
            let config = dir.join(format!("{name}.toml"));
            std::fs::write(&config, text).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_shoal"))
                .args(["daemon", "--log", "warn", "--config"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start shoal daemon");
            daemons.push(Daemon { child, socket });
        }
        let cluster = Cluster { daemons, dir };
        cluster.wait_joined();
        cluster
    }

    fn endpoint(&self, i: usize) -> Endpoint {
        Endpoint::Unix(self.daemons[i].socket.clone())
    }

    /// Connects, retrying while the daemon starts or joins its peers.
    fn connect(&self, i: usize, name: &str) -> Client {
        let start = Instant::now();
        loop {
            match Client::connect_to(&self.endpoint(i), name) {
                Ok(c) => return c,
                Err(ClientError::Daemon { code: c, .. }) if c == code::UNAVAILABLE => {}
                Err(ClientError::Unreachable { .. }) => {}
                Err(e) => panic!("connect {name}: {e}"),
            }
            assert!(
                start.elapsed() < PATIENCE,
                "daemon {i} never accepted {name}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Until a client of each daemon sees the other in one group: the two
    /// daemons are one cluster.
    fn wait_joined(&self) {
        let mut a = self.connect(0, "probe-a");
        let mut b = self.connect(1, "probe-b");
        a.join("probe").unwrap();
        b.join("probe").unwrap();
        for c in [&mut a, &mut b] {
            until_view(c, "probe", 2);
        }
        a.disconnect().unwrap();
        b.disconnect().unwrap();
    }
}

fn until_view(c: &mut Client, group: &str, members: usize) -> Membership {
    let start = Instant::now();
    while start.elapsed() < PATIENCE {
        if let Some(Received::Membership(v)) =
            c.receive_timeout(Duration::from_millis(200)).unwrap()
        {
            if v.group == group && v.members.len() == members {
                return v;
            }
        }
    }
    panic!(
        "{}: no view of {group} with {members} members",
        c.private_group()
    );
}

/// `n` messages (views skipped): (payload, type).
fn messages(c: &mut Client, n: usize) -> Vec<(Vec<u8>, u16)> {
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < n {
        assert!(
            start.elapsed() < PATIENCE,
            "{}: only {got:?}",
            c.private_group()
        );
        if let Some(Received::Message(m)) = c.receive_timeout(Duration::from_millis(200)).unwrap() {
            got.push((m.payload, m.mess_type));
        }
    }
    got
}

#[test]
fn self_discard_and_message_types_cross_daemons() {
    let cluster = Cluster::start("discard");
    let mut alice = cluster.connect(0, "alice");
    let mut alice2 = cluster.connect(0, "alice2");
    let mut bob = cluster.connect(1, "bob");
    assert_eq!((alice.name(), alice.daemon()), ("alice", "a"));
    for c in [&mut alice, &mut alice2, &mut bob] {
        c.join("g").unwrap();
    }
    for c in [&mut alice, &mut alice2, &mut bob] {
        until_view(c, "g", 3);
    }
    let typed = |t| SendOptions {
        self_discard: false,
        mess_type: t,
    };
    alice.set_self_discard(true);
    alice.multicast(Service::Agreed, &["g"], b"1").unwrap();
    alice
        .multicast_with(
            Service::Fifo,
            &["g"],
            &[7; 200_000],
            SendOptions {
                self_discard: true,
                mess_type: 5,
            },
        )
        .unwrap();
    alice
        .multicast_with(Service::Agreed, &["g"], b"3", typed(9))
        .unwrap();
    let want = vec![
        (b"1".to_vec(), 0),
        (vec![7; 200_000], 5),
        (b"3".to_vec(), 9),
    ];
    assert_eq!(messages(&mut bob, 3), want);
    assert_eq!(messages(&mut alice2, 3), want);
    assert_eq!(messages(&mut alice, 1), vec![(b"3".to_vec(), 9)]);
    assert!(alice
        .receive_timeout(Duration::from_millis(500))
        .unwrap()
        .is_none());
}

/// A program's stdout: lines appended by its thread, read by the test.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Output {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits until the output has a line equal to `line` after `from`
    /// lines; the index after it.
    fn wait_line(&self, from: usize, line: &str) -> usize {
        let start = Instant::now();
        loop {
            let lines = self.lines();
            if let Some(i) = lines[from.min(lines.len())..]
                .iter()
                .position(|l| l == line)
            {
                return from + i + 1;
            }
            assert!(start.elapsed() < PATIENCE, "no {line:?} in {lines:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One example program on its own thread: its stdin and stdout.
struct Program {
    input: Option<mpsc::Sender<String>>,
    output: Output,
    thread: Option<std::thread::JoinHandle<Result<(), ClientError>>>,
}

impl Program {
    fn kv(endpoint: Endpoint, group: &str, name: &str) -> Program {
        let (input, lines) = mpsc::channel();
        let output = Output::default();
        let out = output.clone();
        let (group, name) = (group.to_string(), name.to_string());
        let thread = std::thread::spawn(move || kv::run(&endpoint, &group, &name, lines, out));
        Program {
            input: Some(input),
            output,
            thread: Some(thread),
        }
    }

    fn worker(endpoint: Endpoint, group: &str, name: &str) -> Program {
        let (input, lines) = mpsc::channel();
        let output = Output::default();
        let out = output.clone();
        let (group, name) = (group.to_string(), name.to_string());
        let thread = std::thread::spawn(move || workq::work(&endpoint, &group, &name, lines, out));
        Program {
            input: Some(input),
            output,
            thread: Some(thread),
        }
    }

    fn chat(endpoint: Endpoint, group: &str, name: &str) -> Program {
        let (input, lines) = mpsc::channel();
        let output = Output::default();
        let out = output.clone();
        let (group, name) = (group.to_string(), name.to_string());
        let thread = std::thread::spawn(move || chat::run(&endpoint, &group, &name, lines, out));
        Program {
            input: Some(input),
            output,
            thread: Some(thread),
        }
    }

    fn send(&self, line: &str) {
        self.input.as_ref().unwrap().send(line.to_string()).unwrap();
    }

    /// Closes stdin and waits for the program to end.
    fn end(&mut self) {
        self.input = None;
        let thread = self.thread.take().unwrap();
        let start = Instant::now();
        while !thread.is_finished() {
            assert!(start.elapsed() < PATIENCE, "the program did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        thread.join().unwrap().unwrap();
    }
}

/// `sync`, then `dump`: the replica's map once its own updates are in.
fn dump(p: &Program) -> BTreeMap<String, String> {
    let from = p.output.lines().len();
    p.send("sync");
    let at = p.output.wait_line(from, "synced");
    p.send("dump");
    let end = p.output.wait_line(at, "end");
    p.output.lines()[at..end - 1]
        .iter()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn kv_replicas_that_join_during_load_end_with_the_same_map() {
    let cluster = Cluster::start("kv");
    let mut r1 = Program::kv(cluster.endpoint(0), "store", "r1");
    let mut r2 = None;
    let mut r3 = None;
    for i in 0..600 {
        r1.send(&format!("set k{i} v{i}"));
        if i % 3 == 0 {
            r1.send(&format!("del k{}", i / 2));
        }
        if i == 100 {
            r2 = Some(Program::kv(cluster.endpoint(1), "store", "r2"));
        }
        if i == 250 {
            r3 = Some(Program::kv(cluster.endpoint(0), "store", "r3"));
        }
        if i >= 300 && i % 10 == 0 {
            // The joiners write too, once they hold the state.
            r2.as_ref().unwrap().send(&format!("set w{i} from-r2"));
            r3.as_ref().unwrap().send(&format!("set w{i} from-r3"));
        }
        // Paced, so that the joins fall inside the load.
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let (mut r2, mut r3) = (r2.unwrap(), r3.unwrap());
    // Each replica's map once its own updates are applied; then, after all
    // three syncs, every map again: every update is in by then.
    for p in [&r1, &r2, &r3] {
        dump(p);
    }
    let maps: Vec<_> = [&r1, &r2, &r3].iter().map(|p| dump(p)).collect();
    assert_eq!(maps[0], maps[1], "r1 and r2");
    assert_eq!(maps[0], maps[2], "r1 and r3");
    let mut want = BTreeMap::new();
    for i in 0..600 {
        want.insert(format!("k{i}"), format!("v{i}"));
        if i % 3 == 0 {
            want.remove(&format!("k{}", i / 2));
        }
    }
    for (k, v) in &maps[0] {
        if k.starts_with('w') {
            assert!(v == "from-r2" || v == "from-r3", "{k}={v}");
        } else {
            assert_eq!(want.get(k), Some(v), "{k}");
        }
    }
    assert_eq!(
        maps[0].keys().filter(|k| k.starts_with('k')).count(),
        want.len()
    );
    assert_eq!(maps[0].keys().filter(|k| k.starts_with('w')).count(), 30);
    for p in [&mut r1, &mut r2, &mut r3] {
        p.end();
    }
}

/// The `did ID PAYLOAD` lines of workers: id → how many times.
fn done_jobs(workers: &[&Program]) -> BTreeMap<String, usize> {
    let mut done = BTreeMap::new();
    for w in workers {
        for l in w.output.lines().iter().filter(|l| l.starts_with("did ")) {
            let id = l.split(' ').nth(1).unwrap().to_string();
            *done.entry(id).or_insert(0) += 1;
        }
    }
    done
}

#[test]
fn workq_does_each_job_once_while_workers_join_and_leave() {
    let cluster = Cluster::start("workq");
    let mut w1 = Program::worker(cluster.endpoint(0), "jobs", "w1");
    let mut w2 = Program::worker(cluster.endpoint(1), "jobs", "w2");
    // The workers are in before jobs come (a job sent to a group with no
    // members reaches nobody).
    for w in [&w1, &w2] {
        w.output.wait_line(0, "ready");
    }

    let (jobs, lines) = mpsc::channel();
    let endpoint = cluster.endpoint(0);
    let submitter = std::thread::spawn(move || workq::submit(&endpoint, "jobs", "boss", lines));
    let mut w3 = None;
    for i in 0..300 {
        jobs.send(format!("job-{i}")).unwrap();
        if i == 100 {
            // A worker joins while jobs arrive; the rest come once it is in.
            let w = Program::worker(cluster.endpoint(1), "jobs", "w3");
            w.output.wait_line(0, "ready");
            w3 = Some(w);
        }
        if i == 200 {
            // w1 leaves cleanly: what it had not done goes to the others.
            w1.end();
        }
        if i % 20 == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    drop(jobs);
    submitter.join().unwrap().unwrap();
    let mut w3 = w3.unwrap();
    let start = Instant::now();
    loop {
        let done = done_jobs(&[&w1, &w2, &w3]);
        if done.len() == 300 {
            assert!(done.values().all(|n| *n == 1), "a job done twice: {done:?}");
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{} of 300 jobs done",
            done.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The late worker did some of them.
    assert!(w3.output.lines().iter().any(|l| l.starts_with("did ")));
    for w in [&mut w2, &mut w3] {
        w.end();
    }
}

/// A log of payloads: the state of the tokio test's replicas.
#[derive(Default)]
struct Log(Vec<Vec<u8>>);

impl shoal_client::state::Replica for Log {
    fn apply(&mut self, m: &shoal_client::Message) {
        self.0.push(m.payload.clone());
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.join(&b'\n')
    }
    fn restore(&mut self, s: &[u8]) {
        // An empty snapshot is an empty log (the join may be ordered before
        // any entry), not one empty entry.
        self.0 = if s.is_empty() {
            Vec::new()
        } else {
            s.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
        };
    }
}

#[test]
fn a_tokio_joiner_gets_the_state_of_a_blocking_member_under_load() {
    use shoal_client::state::StateTransfer;
    let cluster = Cluster::start("tokio-state");
    let mut alice = cluster.connect(0, "alice");
    let mut a_state = StateTransfer::new("log", alice.private_group());
    let mut a_log = Log::default();
    alice.join("log").unwrap();
    let start = Instant::now();
    while !a_state.is_ready() {
        assert!(start.elapsed() < PATIENCE);
        if let Some(e) = alice.receive_timeout(Duration::from_millis(20)).unwrap() {
            let _ = a_state.handle(&mut a_log, e);
            alice.send_pending(&mut a_state).unwrap();
        }
    }
    let entry = |i: u32| format!("entry {i}").into_bytes();
    let mut sent = 0;
    for _ in 0..50 {
        alice
            .multicast(Service::Agreed, &["log"], &entry(sent))
            .unwrap();
        sent += 1;
    }
    let endpoint = cluster.endpoint(1);
    let joiner = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = shoal_client::tokio::Client::connect_to(&endpoint, "bob")
                .await
                .unwrap();
            let mut st = StateTransfer::new("log", c.private_group());
            let mut log = Log::default();
            c.join("log").await.unwrap();
            while !(st.is_ready() && log.0.len() >= 150) {
                let e = tokio::time::timeout(PATIENCE, c.receive())
                    .await
                    .expect("an event in time")
                    .unwrap();
                let _ = st.handle(&mut log, e);
                c.send_pending(&mut st).await.unwrap();
            }
            c.disconnect().await.unwrap();
            log.0
        })
    });
    // Alice keeps writing, and answers the request, while bob joins.
    while !joiner.is_finished() {
        assert!(start.elapsed() < PATIENCE, "bob never caught up");
        if sent < 150 {
            alice
                .multicast(Service::Agreed, &["log"], &entry(sent))
                .unwrap();
            sent += 1;
        }
        if let Some(e) = alice.receive_timeout(Duration::from_millis(5)).unwrap() {
            let _ = a_state.handle(&mut a_log, e);
            alice.send_pending(&mut a_state).unwrap();
        }
    }
    let got = joiner.join().unwrap();
    assert_eq!(got, (0..150).map(entry).collect::<Vec<_>>());
    assert_eq!(a_state.provided(), 1);
}

#[test]
fn chat_lines_reach_every_member_in_one_order() {
    let cluster = Cluster::start("chat");
    let mut alice = Program::chat(cluster.endpoint(0), "lobby", "alice");
    let mut bob = Program::chat(cluster.endpoint(1), "lobby", "bob");
    for p in [&alice, &bob] {
        p.output
            .wait_line(0, "* lobby is now #alice#a, #bob#b (Join)");
    }
    for i in 0..5 {
        alice.send(&format!("a{i}"));
        bob.send(&format!("b{i}"));
    }
    let said = |p: &Program| -> Vec<String> {
        p.output
            .lines()
            .into_iter()
            .filter(|l| l.starts_with('<'))
            .collect()
    };
    let start = Instant::now();
    while said(&alice).len() < 10 || said(&bob).len() < 10 {
        assert!(
            start.elapsed() < PATIENCE,
            "{:?} {:?}",
            said(&alice),
            said(&bob)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(said(&alice), said(&bob));
    assert!(said(&alice).contains(&"<#alice#a> a4".to_string()));
    alice.end();
    bob.end();
}

/// The Python `kv.py` (a process) joins a store the Rust `kv` holds: the
/// two libraries speak one state-transfer protocol.
#[test]
fn a_python_kv_replica_joins_a_rust_one() {
    use std::io::{BufRead, BufReader};
    let cluster = Cluster::start("kv-mixed");
    let mut r1 = Program::kv(cluster.endpoint(0), "mixed", "rust");
    for i in 0..200 {
        r1.send(&format!("set k{i} v{i}"));
    }
    // The Rust replica holds these 200 before the Python one joins (on a
    // loaded machine it may not even be in the group yet; the Python one
    // would then found the store alone, and its first dump would lack them).
    assert_eq!(dump(&r1).len(), 200);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python/examples/kv.py");
    let mut py = Command::new("python3")
        .arg(&script)
        .args(["mixed", "python"])
        .env("SHOAL_SOCKET", &cluster.daemons[1].socket)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 (Python 3.11 or later) runs the Python example");
    let mut py_in = py.stdin.take().unwrap();
    let (lines_tx, py_lines) = mpsc::channel();
    let stdout = py.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    for i in 200..400 {
        r1.send(&format!("set k{i} v{i}"));
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    writeln!(py_in, "set from-python yes\nsync\ndump").unwrap();
    py_in.flush().unwrap();
    let mut py_map = BTreeMap::new();
    let mut synced = false;
    loop {
        let line = py_lines
            .recv_timeout(PATIENCE)
            .expect("the Python replica answers");
        match line.as_str() {
            "synced" => synced = true,
            "end" => break,
            l if synced => {
                let (k, v) = l.split_once('=').unwrap();
                py_map.insert(k.to_string(), v.to_string());
            }
            _ => {}
        }
    }
    // The Rust replica's map once everything sent before is in.
    let rust_map = dump(&r1);
    let py_again = {
        writeln!(py_in, "sync\ndump").unwrap();
        py_in.flush().unwrap();
        let mut map = BTreeMap::new();
        let mut synced = false;
        loop {
            let line = py_lines.recv_timeout(PATIENCE).unwrap();
            match line.as_str() {
                "synced" => synced = true,
                "end" => break,
                l if synced => {
                    let (k, v) = l.split_once('=').unwrap();
                    map.insert(k.to_string(), v.to_string());
                }
                _ => {}
            }
        }
        map
    };
    assert_eq!(py_again, rust_map);
    assert_eq!(rust_map.len(), 401);
    assert_eq!(rust_map.get("from-python").map(String::as_str), Some("yes"));
    assert!(py_map.len() >= 201, "{}", py_map.len());
    drop(py_in);
    let status = py.wait().unwrap();
    assert!(status.success());
    r1.end();
}
