//! `shoal bench`: throughput and latency through the daemons.
//!
//! By default it starts its own daemons on loopback (`shoal daemon`
//! processes with generated configurations), connects clients to them over their Unix sockets, and measures:
//!
//! - `--mode stream`: the senders multicast `--count` messages as fast as
//!   flow control allows (or at `--rate`); every receiver counts deliveries;
//!   messages/s is what *every* receiver got divided by the time from the
//!   first send to the last receiver's last delivery. Latency is one-way,
//!   send to delivery, on the one clock of this process.
//! - `--mode echo`: a client multicasts a message, a client on another
//!   daemon answers it, and the first measures the round trip; one message
//!   outstanding at a time (low load).
//!
//! In stream mode the senders stay within 16 MiB of the slowest receiver
//! (the daemons disconnect a receiver 32 MiB behind rather than slow the
//! sender). With daemons of its own, the bench also prints the CPU time
//! they and its clients used per message (steadier than wall time on a
//! shared machine; in stream mode counted from the end of the joins, so
//! that `--groups` setup is not charged to the messages), and whether the sender's daemon is the committee's
//! primary.
//!
//! Figures go to stdout and, with `--out`, to a CSV row appended to a file.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use shoal_wire::client::{decode, Frame, Limits, Reason, Service};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Stream,
    Echo,
    /// Resident memory of one `shoal daemon` process serving `--clients`
    /// clients that join `--groups` groups in all.
    Memory,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value = "stream")]
    mode: Mode,
    /// Daemons to start on loopback (ignored with --sockets).
    #[arg(long, default_value_t = 3)]
    daemons: usize,
    /// Use running daemons at these Unix sockets instead of starting any
    /// (main daemons, or site daemons of `shoal site --socket`).
    #[arg(long, value_delimiter = ',')]
    sockets: Vec<PathBuf>,
    /// Receiving clients per daemon.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Sending clients (the first N receivers also send).
    #[arg(long, default_value_t = 1)]
    senders: usize,
    /// Payload bytes (at least 16: a sequence number and a timestamp).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per sender (stream) or round trips (echo).
    #[arg(long, default_value_t = 100_000)]
    count: u64,
    /// Messages per second per sender; 0 sends as fast as the daemon takes them.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Messages a stream sender hands its daemon per write, as the client
    /// library's `multicast_batch` does (1: one write per message). With
    /// `--rate`, a batch leaves when its first message is due.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch: u64,
    /// Service type.
    #[arg(long, default_value = "fifo")]
    service: Service,
    /// Groups joined in all (memory mode); in stream mode, every client
    /// joins this many groups and the senders spread their messages over
    /// them in turn (0: one group).
    #[arg(long, default_value_t = 0)]
    groups: usize,
    /// The daemons the bench starts carry `reliable` and `fifo` over QSM
    /// regions (`[qsm] enabled = true`).
    #[arg(long)]
    qsm: bool,
    /// With --qsm: the regions use per-region IP multicast on loopback
    /// (`[qsm] multicast`, 256 addresses of 239.255.0.0/16 chosen from this
    /// process's id, TTL 0) instead of one unicast per other member.
    #[arg(long, requires = "qsm")]
    qsm_multicast: bool,
    /// Every client also joins a group of its daemon alone
    /// (`bench-own<d>`), so that the daemons' group sets differ and the
    /// measured group spans one region per daemon: with --qsm it keeps the
    /// total order, unless --qsm-hybrid.
    #[arg(long)]
    split_regions: bool,
    /// With --qsm: the measured group (and each of --groups) is a `[qsm]
    /// hybrid` group, carried by an instance of its own.
    #[arg(long, requires = "qsm")]
    qsm_hybrid: bool,
    /// Append a CSV row with the results to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Start the daemons from this `shoal` executable instead of this one
    /// (to compare two builds with the same clients).
    #[arg(long)]
    daemon_exe: Option<PathBuf>,
    /// Committee size k of the daemons the bench starts (`committee_size`;
    /// the daemon's default is 3, P000's experiments use 1). With
    /// --sockets, the committee size the bench waits for.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    committee: u32,
    /// The daemons the bench starts send pbcast's first phase by IP
    /// multicast (a group of 239.255.0.0/16 chosen from this process's id,
    /// pinned to loopback with TTL 0) instead of the unicast relay tree.
    #[arg(long)]
    multicast: bool,
}

/// A blocking connection speaking the client frames by hand, for the
/// memory figure only: thousands of connections, each with a 4 KiB read
/// buffer (the client library's grows to 64 KiB on its first read, which
/// thousands of connections in the bench's own process would pay for).
/// The measured paths (stream, echo) use the client library.
struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded.
    at: usize,
    chunk: Vec<u8>,
}

impl Conn {
    fn connect(socket: &Path, name: &str) -> anyhow::Result<Conn> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stream = match UnixStream::connect(socket) {
                Ok(s) => s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(e).with_context(|| format!("connect {}", socket.display())),
            };
            let mut c = Conn {
                stream,
                buf: Vec::new(),
                at: 0,
                chunk: vec![0; 256 * 1024],
            };
            c.send(&Frame::Connect {
                name: name.to_string(),
                token: String::new(),
            })?;
            match c.recv()? {
                Frame::ConnectOk { .. } => return Ok(c),
                Frame::Error { code, text } if code == shoal_wire::client::code::UNAVAILABLE => {
                    if Instant::now() > deadline {
                        bail!("{text}");
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => bail!("connect {name}: {other:?}"),
            }
        }
    }

    /// A connection with a small read buffer (thousands of them at once).
    fn small(mut self) -> Conn {
        self.chunk = vec![0; 4096];
        self.chunk.shrink_to_fit();
        self
    }

    fn send(&mut self, frame: &Frame) -> anyhow::Result<()> {
        self.stream.write_all(&frame.to_vec()?)?;
        Ok(())
    }

    fn recv(&mut self) -> anyhow::Result<Frame> {
        loop {
            if let Some((frame, used)) = decode(&self.buf[self.at..], &Limits::default())? {
                self.at += used;
                return Ok(frame);
            }
            // Keep only the undecoded tail (one move per read, not per frame).
            self.buf.drain(..self.at);
            self.at = 0;
            let n = self.stream.read(&mut self.chunk)?;
            if n == 0 {
                bail!("the daemon closed the connection");
            }
            self.buf.extend_from_slice(&self.chunk[..n]);
        }
    }
}

/// A client of the library applications link (`shoal-client`), for the
/// measured paths (stream, echo): connects, retrying for up to 30 s while
/// the daemon starts or joins its peers.
fn client(socket: &Path, name: &str) -> anyhow::Result<shoal_client::Client> {
    let endpoint = shoal_client::Endpoint::Unix(socket.to_path_buf());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match shoal_client::Client::connect_to(&endpoint, name) {
            Ok(c) => return Ok(c),
            Err(shoal_client::ClientError::Unreachable { .. }) if Instant::now() < deadline => {}
            Err(shoal_client::ClientError::Daemon { code, .. })
                if code == shoal_wire::client::code::UNAVAILABLE && Instant::now() < deadline => {}
            Err(e) => return Err(e).with_context(|| format!("connect {name}")),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Receives until a join view of `group` with `n` members.
fn wait_members(c: &mut shoal_client::Client, group: &str, n: usize) -> anyhow::Result<()> {
    loop {
        if let shoal_client::Received::Membership(v) = c.receive()? {
            if v.group == group && v.members.len() == n && v.reason == Reason::Join {
                return Ok(());
            }
        }
    }
}

/// Daemon processes started by the bench (`shoal daemon` with generated
/// configurations), killed on drop.
struct LocalCluster {
    sockets: Vec<PathBuf>,
    children: Vec<std::process::Child>,
    dir: PathBuf,
}

impl LocalCluster {
    /// The daemons `args` asks for (`--daemons`, `--daemon-exe`,
    /// `--committee`, `--multicast`, the `--qsm` flags, `--groups`).
    fn start(args: &BenchArgs) -> anyhow::Result<LocalCluster> {
        let (n, committee, multicast, groups) =
            (args.daemons, args.committee, args.multicast, args.groups);
        let (qsm, qsm_multicast, qsm_hybrid) = (args.qsm, args.qsm_multicast, args.qsm_hybrid);
        let exe = match args.daemon_exe.as_deref() {
            Some(e) => e.to_path_buf(),
            None => std::env::current_exe()?,
        };
        let dir = std::env::temp_dir().join(format!("shoal-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let addrs: Vec<std::net::SocketAddr> = (0..n)
            .map(|_| {
                std::net::UdpSocket::bind("127.0.0.1:0")
                    .and_then(|s| s.local_addr())
                    .context("pick a UDP port")
            })
            .collect::<anyhow::Result<_>>()?;
        // One group per bench process, so that concurrent benches and tests
        // on this host never hear each other.
        let multicast_line = if multicast {
            let pid = std::process::id();
            let port = std::net::UdpSocket::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            format!(
                "multicast = \"239.255.{}.{}:{port}\"\n",
                (pid >> 8) & 0xff,
                (pid & 0xff).max(1)
            )
        } else {
            String::new()
        };
        // Regions: 239.255.P.0 .. 239.255.P.255 at a port of their own.
        let qsm_line = if qsm_multicast {
            let port = std::net::UdpSocket::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            format!(
                "multicast = \"239.255.{}.0:{port}\"\n",
                (std::process::id() >> 4) & 0xff
            )
        } else {
            String::new()
        };
        let qsm_line = if qsm_hybrid {
            let names: Vec<String> = std::iter::once("\"bench\"".to_string())
                .chain((0..groups).map(|g| format!("\"g{g:05}\"")))
                .collect();
            format!("{qsm_line}hybrid = [{}]\n", names.join(", "))
        } else {
            qsm_line
        };
        let mut cluster = LocalCluster {
            sockets: Vec::new(),
            children: Vec::new(),
            dir: dir.clone(),
        };
        for i in 0..n {
            let socket = dir.join(format!("d{i}.sock"));
            let peers: Vec<String> = addrs
                .iter()
                .filter(|a| **a != addrs[i])
                .map(|a| format!("\"{a}\""))
                .collect();
            let config = dir.join(format!("d{i}.toml"));
            std::fs::write(
                &config,
                format!(
                    "node = \"d{i}\"\nsocket = \"{}\"\nlisten = \"{}\"\npeers = [{}]\n{multicast_line}\n[cluster]\nfound_after = 500\n\n[cluster.vsync]\ncommittee_size = {committee}\n[limits]\ngroups_per_client = {}\n[qsm]\nenabled = {qsm}\n{qsm_line}",
                    socket.display(),
                    addrs[i],
                    peers.join(", "),
                    groups.max(256) + 1
                ),
            )?;
            let child = std::process::Command::new(&exe)
                .args(["daemon", "--log", "error", "--config"])
                .arg(&config)
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("start shoal daemon")?;
            cluster.children.push(child);
            cluster.sockets.push(socket);
        }
        Ok(cluster)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until every daemon's committee is full (min(k, daemons)): a
/// young cluster changes view once more to fill it, and a view change
/// pauses sending for `ack_wait` (P000 §5.2), which would be measured as a
/// one-second stall.
fn wait_for_committee(sockets: &[PathBuf], k: u32) -> anyhow::Result<()> {
    let want = format!("committee: {} ", sockets.len().min(k as usize));
    let deadline = Instant::now() + Duration::from_secs(30);
    for socket in sockets {
        loop {
            let text = status(socket)?;
            // A site daemon (`shoal site --socket`) has no committee: it
            // is ready once it is live in its site.
            let site_ready = text.starts_with("site daemon") && text.contains("\nlive true\n");
            if text.contains(&want) || site_ready {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the daemons' committee never filled"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// A daemon's `shoal status` text; empty if it does not answer yet.
fn status(socket: &Path) -> anyhow::Result<String> {
    let endpoint = shoal_client::Endpoint::Unix(socket.to_path_buf());
    match shoal_client::status(&endpoint, Duration::from_secs(10)) {
        Ok(text) => Ok(text),
        Err(shoal_client::ClientError::Unreachable { .. }) => Ok(String::new()),
        Err(e) => bail!("status: {e}"),
    }
}

/// Whether the daemon at `socket` is the committee's primary (its clients'
/// messages are sequenced without a round trip to another daemon).
fn is_primary(socket: &Path) -> bool {
    status(socket).is_ok_and(|t| t.contains("this daemon is the primary"))
}

fn payload(size: usize, seq: u64, sent_ns: u64) -> Vec<u8> {
    let mut p = vec![0u8; size.max(16)];
    p[..8].copy_from_slice(&seq.to_be_bytes());
    p[8..16].copy_from_slice(&sent_ns.to_be_bytes());
    p
}

fn stamp(p: &[u8]) -> (u64, u64) {
    let mut a = [0; 8];
    let mut b = [0; 8];
    a.copy_from_slice(&p[..8]);
    b.copy_from_slice(&p[8..16]);
    (u64::from_be_bytes(a), u64::from_be_bytes(b))
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.size >= 16, "--size must be at least 16");
    if args.mode == Mode::Memory {
        return memory(&args);
    }
    let _cluster;
    let mut pids = Vec::new();
    let sockets = if args.sockets.is_empty() {
        let c = LocalCluster::start(&args)?;
        let s = c.sockets.clone();
        pids = c.children.iter().map(|c| c.id()).collect();
        _cluster = c;
        s
    } else {
        for socket in &args.sockets {
            // A missing daemon fails here, not as a silent wait for its
            // committee.
            UnixStream::connect(socket)
                .with_context(|| format!("--sockets: no daemon at {}", socket.display()))?;
        }
        args.sockets.clone()
    };
    wait_for_committee(&sockets, args.committee)?;
    let mut cpu_before = cpu_seconds(&pids);
    let result = match args.mode {
        // From the end of the joins: with --groups, joining (and with
        // --qsm, a flush round per batch of joins) is setup, not the cost
        // of a message.
        Mode::Stream => stream(&args, &sockets, || cpu_before = cpu_seconds(&pids)),
        Mode::Echo => echo(&args, &sockets),
        Mode::Memory => unreachable!("handled above"),
    };
    if args.qsm {
        // What the regions carried, and how (`to region addresses`: by
        // per-region IP multicast).
        for (i, socket) in sockets.iter().enumerate() {
            let text = status(socket).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains("qsm: sent")) {
                println!("d{i} {}", line.trim());
            }
        }
    }
    // CPU time is steadier than wall time on a shared machine: the daemons'
    // and this process's CPU per message multicast.
    if let (Some((d0, b0)), Some((d1, b1))) = (cpu_before, cpu_seconds(&pids)) {
        let per = |s: f64| s * 1e6 / (args.count * args.senders as u64).max(1) as f64;
        println!(
            "cpu: daemons {:.2} s ({:.2} µs per message), bench clients {:.2} s ({:.2} µs per message)",
            d1 - d0,
            per(d1 - d0),
            b1 - b0,
            per(b1 - b0)
        );
    }
    result
}

/// CPU seconds (user + system, every thread) used so far by the daemons
/// `pids` together and by this process; `None` without daemons of our own.
fn cpu_seconds(pids: &[u32]) -> Option<(f64, f64)> {
    fn of(pid: &str) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may contain spaces).
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, in clock ticks
        // (USER_HZ, 100 on Linux).
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / 100.0)
    }
    if pids.is_empty() {
        return None;
    }
    let daemons = pids
        .iter()
        .map(|p| of(&p.to_string()))
        .sum::<Option<f64>>()?;
    Some((daemons, of("self")?))
}

/// `joined` is called once every client has seen every group's members.
fn stream(args: &BenchArgs, sockets: &[PathBuf], joined: impl FnOnce()) -> anyhow::Result<()> {
    let group = "bench";
    // With --groups, messages go to these in turn (one per batch).
    let spread: Arc<Vec<String>> = Arc::new((0..args.groups).map(|g| format!("g{g:05}")).collect());
    let mut conns = Vec::new();
    for (d, socket) in sockets.iter().enumerate() {
        for k in 0..args.clients {
            let mut c = client(socket, &format!("bench{d}x{k}"))?;
            c.join(group)?;
            if args.split_regions {
                c.join(&format!("bench-own{d}"))?;
            }
            for g in spread.iter() {
                c.join(g)?;
            }
            conns.push(c);
        }
    }
    let setup = Instant::now();
    let n = conns.len();
    anyhow::ensure!(
        args.senders >= 1 && args.senders <= n,
        "--senders must be 1..={n}"
    );
    for c in conns.iter_mut() {
        wait_members(c, group, n)?;
        if let Some(last) = spread.last() {
            wait_members(c, last, n)?;
        }
    }
    if !spread.is_empty() {
        println!(
            "{} groups joined by {n} clients in {:.1} s",
            spread.len(),
            setup.elapsed().as_secs_f64()
        );
    }
    joined();
    let expected = args.count * args.senders as u64;
    let origin = Instant::now();
    let barrier = Arc::new(Barrier::new(n + args.senders));
    let progress = indicatif::ProgressBar::new(expected * n as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} deliveries {per_sec}")
            .expect("template"),
    );
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    // Deliveries so far at each receiver. The daemons do not slow a sender
    // down for a receiver that falls behind: they disconnect the receiver
    // once `client_queue` bytes (32 MiB) wait for it. So the senders stay
    // within half of that of the slowest receiver, as an application
    // that wants every receiver to keep up would; this measures what every
    // receiver sustains.
    let delivered: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let window = (16u64 << 20) / (args.size as u64 + 64);
    for (i, conn) in conns.into_iter().enumerate() {
        let (mut out, mut conn) = conn.split();
        if i < args.senders {
            let barrier = barrier.clone();
            let delivered = delivered.clone();
            let senders_n = args.senders as u64;
            let (count, rate, size, service, batch) =
                (args.count, args.rate, args.size, args.service, args.batch);
            let spread = spread.clone();
            senders.push(std::thread::spawn(move || -> anyhow::Result<()> {
                barrier.wait();
                let start = Instant::now();
                let mut payloads = Vec::with_capacity(batch as usize);
                for first in (0..count).step_by(batch as usize) {
                    loop {
                        let slowest = delivered
                            .iter()
                            .map(|d| d.load(Ordering::Relaxed))
                            .min()
                            .unwrap_or(0);
                        if (first * senders_n).saturating_sub(slowest) <= window {
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    if rate > 0 {
                        let due = start + Duration::from_secs_f64(first as f64 / rate as f64);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                    payloads.clear();
                    for seq in first..(first + batch).min(count) {
                        let now = origin.elapsed().as_nanos() as u64;
                        payloads.push(payload(size, seq, now));
                    }
                    let to = match spread.len() {
                        0 => group,
                        g => spread[(first / batch) as usize % g].as_str(),
                    };
                    out.multicast_batch(service, &[to], &payloads)?;
                }
                Ok(())
            }));
        }
        let barrier = barrier.clone();
        let progress = progress.clone();
        let delivered = delivered.clone();
        // A receiver keeps its connection until every receiver has finished
        // (the thread returns it): a client leaving is a group change, and
        // with --qsm a change point, which would make the slower receivers
        // wait for a flush that the measurement should not include.
        receivers.push(std::thread::spawn(
            move || -> anyhow::Result<(u64, Histogram<u64>, u64, shoal_client::RecvHalf)> {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
                barrier.wait();
                let mut got = 0u64;
                let mut last = 0u64;
                while got < expected {
                    match conn.receive()? {
                        shoal_client::Received::Message(m) => {
                            let now = origin.elapsed().as_nanos() as u64;
                            let (_, sent) = stamp(&m.payload);
                            hist.record(now.saturating_sub(sent).max(1))?;
                            got += 1;
                            delivered[i].store(got, Ordering::Relaxed);
                            last = now;
                            if got.is_multiple_of(1024) {
                                progress.inc(1024);
                            }
                        }
                        shoal_client::Received::Membership(_) => {}
                    }
                }
                Ok((got, hist, last, conn))
            },
        ));
    }
    let start_ns = origin.elapsed().as_nanos() as u64;
    for s in senders {
        s.join().expect("sender thread")?;
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut end_ns = 0;
    let mut finished = Vec::new();
    for r in receivers {
        let (_, hist, last, conn) = r.join().expect("receiver thread")?;
        all.add(&hist)?;
        end_ns = end_ns.max(last);
        finished.push(conn);
    }
    drop(finished);
    progress.finish_and_clear();
    let secs = (end_ns.saturating_sub(start_ns)) as f64 / 1e9;
    let rate = expected as f64 / secs;
    let us = |q: f64| all.value_at_quantile(q) as f64 / 1e3;
    println!(
        "stream: {} daemons, {n} receivers, {} sender(s) writing {} per write, {} B, {}: {expected} messages to every receiver in {secs:.2} s = {rate:.0} msgs/s per receiver; latency p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs; the first sender's daemon is {}the committee's primary",
        sockets.len(),
        args.senders,
        args.batch,
        args.size,
        args.service.name(),
        us(0.5),
        us(0.99),
        us(0.999),
        if is_primary(&sockets[0]) { "" } else { "not " }
    );
    write_row(
        args,
        sockets.len(),
        &format!(
            "stream,{rate:.0},{:.1},{:.1},{:.1}",
            us(0.5),
            us(0.99),
            us(0.999)
        ),
    )
}

fn echo(args: &BenchArgs, sockets: &[PathBuf]) -> anyhow::Result<()> {
    // With one daemon both clients use it: the setting of the peers'
    // single-daemon echo figures (Spread's `lo`, Corosync on one node).
    let pong_socket = sockets.get(1).unwrap_or(&sockets[0]);
    let (ping, pong) = ("bench-ping", "bench-pong");
    let mut a = client(&sockets[0], "pinger")?;
    let mut b = client(pong_socket, "ponger")?;
    a.join(pong)?;
    b.join(ping)?;
    wait_members(&mut a, pong, 1)?;
    wait_members(&mut b, ping, 1)?;
    let service = args.service;
    let rounds = args.count;
    let echoer = std::thread::spawn(move || -> anyhow::Result<()> {
        for _ in 0..rounds {
            loop {
                if let shoal_client::Received::Message(m) = b.receive()? {
                    b.multicast(service, &[pong], &m.payload)?;
                    break;
                }
            }
        }
        Ok(())
    });
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let origin = Instant::now();
    for seq in 0..rounds {
        let sent = origin.elapsed().as_nanos() as u64;
        a.multicast(service, &[ping], &payload(args.size, seq, sent))?;
        loop {
            if let shoal_client::Received::Message(m) = a.receive()? {
                let (s, t) = stamp(&m.payload);
                anyhow::ensure!(s == seq, "echo out of order");
                hist.record((origin.elapsed().as_nanos() as u64 - t).max(1))?;
                break;
            }
        }
        if args.rate > 0 {
            std::thread::sleep(Duration::from_secs_f64(1.0 / args.rate as f64));
        }
    }
    echoer.join().expect("echo thread")?;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    println!(
        "echo: {} B {} round trip {} over {rounds} rounds: p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs; primary: {}",
        args.size,
        args.service.name(),
        if sockets.len() == 1 { "through one daemon" } else { "between two daemons" },
        us(0.5),
        us(0.99),
        us(0.999),
        match (is_primary(&sockets[0]), is_primary(pong_socket)) {
            (true, _) => "the pinger's daemon",
            (_, true) => "the ponger's daemon",
            _ => "a third daemon",
        }
    );
    write_row(
        args,
        sockets.len(),
        &format!("echo,,{:.1},{:.1},{:.1}", us(0.5), us(0.99), us(0.999)),
    )
}

fn write_row(args: &BenchArgs, daemons: usize, figures: &str) -> anyhow::Result<()> {
    let Some(path) = &args.out else {
        return Ok(());
    };
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    if fresh {
        writeln!(
            f,
            "daemons,clients,senders,size,service,count,rate,mode,msgs_per_s,p50_us,p99_us,p999_us"
        )?;
    }
    writeln!(
        f,
        "{daemons},{},{},{},{},{},{},{figures}",
        args.clients,
        args.senders,
        args.size,
        args.service.name(),
        args.count,
        args.rate
    )?;
    Ok(())
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

fn memory(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("shoal-bench-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("d.sock");
    let clients = args.clients.max(1);
    let per_client = args.groups.div_ceil(clients).max(1);
    let config = dir.join("d.toml");
    let listen = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nlisten = \"{listen}\"\n[limits]\nclients = {}\ngroups_per_client = {}\n",
            socket.display(),
            clients + 16,
            per_client
        ),
    )?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["daemon", "--log", "warn", "--config"])
        .arg(&config)
        .spawn()
        .context("start shoal daemon")?;
    let result = (|| -> anyhow::Result<(u64, u64)> {
        let mut conns = vec![Conn::connect(&socket, "probe")?.small()];
        std::thread::sleep(Duration::from_millis(300));
        let idle = rss_kib(child.id())?;
        for i in 0..clients {
            let mut c = Conn::connect(&socket, &format!("m{i}"))?.small();
            for g in 0..per_client {
                let group = i * per_client + g;
                if group < args.groups {
                    c.send(&Frame::Join {
                        group: format!("group-{group}"),
                    })?;
                }
            }
            conns.push(c);
        }
        // Every join has been applied once the last one is announced.
        if args.groups > 0 {
            let last = conns.last_mut().expect("a client");
            let name = format!("group-{}", args.groups - 1);
            loop {
                if let Frame::Membership { group, .. } = last.recv()? {
                    if group == name {
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        Ok((idle, rss_kib(child.id())?))
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (idle, loaded) = result?;
    println!(
        "memory: one daemon, {clients} clients, {} groups: RSS {:.1} MiB (idle {:.1} MiB)",
        args.groups,
        loaded as f64 / 1024.0,
        idle as f64 / 1024.0
    );
    write_row(args, 1, &format!("memory,,{:.1},,", loaded as f64 / 1024.0))
}
