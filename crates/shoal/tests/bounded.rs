//! A real `shoal daemon` process on loopback under clients that misbehave
//! in bulk: a thousand that stop reading, a thousand that join one group,
//! a hundred TCP connections that never authenticate and announce huge
//! frames. The daemon's memory is read from `/proc/<pid>/status` (`VmHWM`,
//! the peak resident set) and held to the ceiling `docs/daemon.md`
//! documents. Every socket is on loopback or a Unix socket in a temporary
//! directory.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shoal_wire::client::{code, decode, features, Frame, Limits, Service};

/// The documented ceiling of the daemon's resident memory (bytes).
const CEILING: u64 = 256 << 20;
const PATIENCE: Duration = Duration::from_secs(40);

struct Daemon {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    /// A lone daemon; `extra` is appended to its configuration.
    fn start(name: &str, extra: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("shoal-bounded-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let udp = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let socket = dir.join("d.sock");
        let config = dir.join("d.toml");
        let text = format!(
            "node = \"d\"\nsocket = {:?}\nlisten = \"{udp}\"\n[cluster]\nfound_after = 300\n{extra}",
            socket.display().to_string()
        );
        std::fs::write(&config, text).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["daemon", "--log", "warn", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shoal daemon");
        let d = Daemon { child, socket, dir };
        // Ready once it accepts a client.
        let start = Instant::now();
        loop {
            if let Some(c) = Conn::unix(&d.socket, "probe", false) {
                drop(c);
                return d;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the daemon never accepted a client"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `(VmRSS, VmHWM)` in bytes.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the daemon is running");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn status(&self) -> String {
        let mut c = Conn::raw_unix(&self.socket);
        c.send(&Frame::Status);
        match c.recv(Duration::from_secs(10)) {
            Some(Frame::StatusReply { text }) => text,
            other => panic!("status: {other:?}"),
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client speaking the frames directly.
struct Conn<S> {
    stream: S,
    buf: Vec<u8>,
}

impl Conn<UnixStream> {
    fn raw_unix(socket: &Path) -> Conn<UnixStream> {
        Conn {
            stream: UnixStream::connect(socket).expect("connect"),
            buf: Vec::new(),
        }
    }

    /// Connected as `name` (asking for membership deltas, as the client
    /// libraries do, or not), or `None` if the daemon refused.
    fn unix(socket: &Path, name: &str, deltas: bool) -> Option<Conn<UnixStream>> {
        let stream = UnixStream::connect(socket).ok()?;
        let mut c = Conn {
            stream,
            buf: Vec::new(),
        };
        let (name, token) = (name.to_string(), String::new());
        c.send(&if deltas {
            Frame::ConnectExt {
                name,
                token,
                features: features::MEMBERSHIP_DELTAS,
            }
        } else {
            Frame::Connect { name, token }
        });
        match c.recv(Duration::from_secs(10)) {
            Some(Frame::ConnectOk { .. }) => Some(c),
            _ => None,
        }
    }
}

/// A stream whose reads can time out.
trait Timed {
    fn read_timeout(&self, t: Duration);
}

impl Timed for UnixStream {
    fn read_timeout(&self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
    }
}

impl Timed for TcpStream {
    fn read_timeout(&self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
    }
}

impl<S: Read + Write + Timed> Conn<S> {
    fn send(&mut self, frame: &Frame) {
        let bytes = frame.to_vec().unwrap();
        self.stream.write_all(&bytes).unwrap();
    }

    /// The next frame, `None` at EOF or after `wait`.
    fn recv(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Ok(Some((frame, n))) = decode(&self.buf, &Limits::default()) {
                self.buf.drain(..n);
                return Some(frame);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.stream.read_timeout(left.max(Duration::from_millis(1)));
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return None,
            }
        }
    }
}

/// Whether this process may hold `n` more descriptors (the test opens
/// about 1,000 connections; the daemon as many).
fn descriptors_for(n: u64) -> bool {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if soft < n {
        println!("SKIPPED: the open-files limit is {soft}; this test needs {n} (ulimit -n)");
        return false;
    }
    true
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn status_line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find(|l| l.starts_with(prefix)).unwrap_or("")
}

#[test]
fn a_thousand_clients_that_stop_reading_keep_the_daemon_under_its_ceiling() {
    if !descriptors_for(2_200) {
        return;
    }
    let started = Instant::now();
    let mut d = Daemon::start("noread", "");
    let n = 1_000;
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = Conn::unix(&d.socket, &format!("r{i}"), true).expect("connected");
        c.send(&Frame::Join { group: "g".into() });
        // From here on the client reads nothing.
        idle.push(c);
    }
    let (rss, _) = d.memory();
    println!(
        "{n} clients joined one group: daemon RSS {:.1} MiB",
        mib(rss)
    );
    // One sender pushes 1 KiB messages to all of them: 4 GiB of frames
    // wanted, far past every queue's bound.
    let mut sender = Conn::unix(&d.socket, "sender", true).expect("sender");
    let payload = vec![7u8; 1024];
    let mut peak = 0;
    for round in 0..4_000 {
        sender.send(&Frame::Multicast {
            service: Service::Agreed,
            groups: vec!["g".into()],
            payload: payload.clone(),
        });
        if round % 200 == 0 {
            peak = peak.max(d.memory().0);
        }
    }
    // Let the daemon work through what it took.
    std::thread::sleep(Duration::from_secs(3));
    let (rss, hwm) = d.memory();
    let status = d.status();
    println!(
        "after 4,000 x 1 KiB to {n} clients that do not read: RSS {:.1} MiB, peak {:.1} MiB (VmHWM), {:?} s\n{}\n{}",
        mib(rss),
        mib(hwm),
        started.elapsed().as_secs(),
        status_line(&status, "client queues"),
        status_line(&status, "slow clients"),
    );
    if let Ok(secs) = std::env::var("SHOAL_BOUNDED_WAIT") {
        std::thread::sleep(Duration::from_secs(secs.parse().unwrap()));
        let (rss, _) = d.memory();
        println!(
            "{secs} s later: RSS {:.1} MiB; {}",
            mib(rss),
            status_line(&d.status(), "client queues")
        );
    }
    assert!(d.alive(), "the daemon is running");
    assert!(
        hwm < CEILING,
        "peak RSS {:.1} MiB over the {:.0} MiB ceiling",
        mib(hwm),
        mib(CEILING)
    );
    drop(idle);
}

#[test]
fn a_hundred_unauthenticated_tcp_connections_announcing_huge_frames_hold_nothing() {
    if !descriptors_for(400) {
        return;
    }
    let tcp = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let d = Daemon::start(
        "preauth",
        &format!(
            "[tcp]\naddress = \"{tcp}\"\ntoken = \"sesame\"\n[limits]\nconnect_timeout = 1000\n"
        ),
    );
    let (_, before) = d.memory();
    // A frame header announcing 9.5 MB, then 64 KiB of it.
    let mut huge = (9_500_000u32).to_be_bytes().to_vec();
    huge.extend_from_slice(&[2, 5]);
    huge.extend(std::iter::repeat_n(0u8, 64 * 1024));
    let mut conns: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(tcp).unwrap();
            let _ = s.write_all(&huge);
            s
        })
        .collect();
    // A wrong token, then a huge frame: refused, nothing more read.
    let mut wrong = Conn {
        stream: TcpStream::connect(tcp).unwrap(),
        buf: Vec::new(),
    };
    wrong.send(&Frame::Connect {
        name: "x".into(),
        token: "guess".into(),
    });
    let _ = wrong.stream.write_all(&huge);
    // Silent ones: closed after connect_timeout.
    let mut silent: Vec<Conn<TcpStream>> = (0..20)
        .map(|_| Conn {
            stream: TcpStream::connect(tcp).unwrap(),
            buf: Vec::new(),
        })
        .collect();
    for s in conns.iter_mut() {
        let mut c = Conn {
            stream: s.try_clone().unwrap(),
            buf: Vec::new(),
        };
        match c.recv(Duration::from_secs(10)) {
            Some(Frame::Error { code: c, text }) => {
                assert_eq!(c, code::MALFORMED, "{text}");
                assert!(text.contains("before Connect"), "{text}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
        assert_eq!(c.recv(Duration::from_secs(10)), None, "then closed");
    }
    match wrong.recv(Duration::from_secs(10)) {
        Some(Frame::Error { code: c, .. }) => assert_eq!(c, code::AUTH),
        other => panic!("{other:?}"),
    }
    assert_eq!(wrong.recv(Duration::from_secs(10)), None, "then closed");
    let t = Instant::now();
    for c in silent.iter_mut() {
        match c.recv(Duration::from_secs(10)) {
            Some(Frame::Error { code: c, text }) => {
                assert_eq!(c, code::PROTOCOL);
                assert!(text.contains("no Connect within 1000 ms"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    let (_, after) = d.memory();
    println!(
        "100 TCP connections announcing 9.5 MB frames: daemon peak RSS {:.1} MiB before, {:.1} MiB after",
        mib(before),
        mib(after)
    );
    // Each may hold at most a few KiB before it is closed.
    assert!(after < before + (16 << 20), "{after} vs {before}");
    let status = d.status();
    assert!(
        status_line(&status, "client queues").contains("connect timeouts 20"),
        "{}",
        status_line(&status, "client queues")
    );
}
