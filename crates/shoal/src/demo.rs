//! `shoal demo`: a pbcast group on loopback, the zero-configuration way to
//! see Shoal work.
//!
//! N members run in this process, each on its own thread with its own UDP
//! socket (`shoal-net`). Member 0 multicasts at a fixed rate (or as fast as
//! flow control allows) while every member drops a share of the datagrams
//! it receives; gossip repairs the losses. Each payload starts with its send
//! time (ns on the process clock shared by all members), so every delivery
//! yields a latency. At the end a table shows, per member, what it
//! delivered, how much came by gossip repair, what was lost, latency
//! percentiles and throughput. The exit status is non-zero if any member
//! lost a message or did not deliver every message sent.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use bytes::{BufMut, Bytes, BytesMut};
use clap::ValueEnum;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_core::pbcast::{self, Event, Pbcast};
use shoal_core::{Instant, NodeId};
use shoal_net::{
    AddressBook, Clock, Command, Endpoint, EventBatch, FaultConfig, MulticastGroup, Node,
    NodeConfig, RuntimeStats, SocketOptions,
};
use tokio::sync::mpsc;

/// Arguments of `shoal demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Members in the group (member 0 sends), at least 2.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Messages per second from the sender; 0 = as fast as flow control allows.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Bytes per message (at least 8: the send timestamp).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Probability that a member drops a datagram it receives, in [0, 1).
    #[arg(long, default_value_t = 0.02)]
    loss: f64,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// First-phase transport (IP multicast measured faster: bench/RESULTS.md).
    #[arg(long, value_enum, default_value_t = Transport::Multicast)]
    transport: Transport,
    /// After sending stops, wait at most this many seconds for repairs.
    #[arg(long, default_value_t = 10.0)]
    settle: f64,
    /// Flow control: the sender's messages in flight beyond the slowest
    /// member's progress (the engine's `send_window`).
    #[arg(long, default_value_t = DEFAULT_SEND_WINDOW)]
    send_window: u32,
    /// Seeds the engines and the loss injection.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    /// The sender sends each datagram to every member.
    Unicast,
    /// One IP multicast per datagram, group 239.255.x.y, pinned to 127.0.0.1, TTL 0.
    Multicast,
}

/// Largest UDP payload on loopback: the engine packs messages up to it.
const DATAGRAM_SIZE: usize = 65_507;
/// Bytes of the send timestamp at the head of each payload.
const STAMP_LEN: usize = 8;

/// The engine's default send window.
const DEFAULT_SEND_WINDOW: u32 = 4096;

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let config = engine_config(&args);
    validate(&args, &config)?;
    let clock = Clock::new();
    let mut nodes = start_members(&args, &config, clock)?;
    let tallies: Vec<Arc<Tally>> = (0..args.nodes)
        .map(|_| Arc::new(Tally::default()))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the demo's runtime")?;
    let outcome = runtime.block_on(drive(&args, clock, &mut nodes, &tallies))?;
    let mut reports = Vec::new();
    for node in nodes {
        let id = node.id();
        let (engine, runtime_stats) = node.shutdown().with_context(|| format!("member {id}"))?;
        reports.push((engine.stats().clone(), runtime_stats));
    }
    let run = outcome.run;
    let receipts = runtime.block_on(outcome.collect())?;
    print_report(&args, &run, &receipts, &reports);
    check(&run, &receipts)
}

fn engine_config(args: &DemoArgs) -> pbcast::Config {
    pbcast::Config {
        max_datagram_size: DATAGRAM_SIZE,
        ip_multicast: args.transport == Transport::Multicast,
        send_window: NonZeroU32::new(args.send_window),
        ..pbcast::Config::default()
    }
}

fn validate(args: &DemoArgs, config: &pbcast::Config) -> anyhow::Result<()> {
    ensure!(
        args.nodes >= 2,
        "--nodes must be at least 2 (one sender, one receiver), got {}",
        args.nodes
    );
    ensure!(
        args.nodes <= 64,
        "--nodes must be at most 64 on one machine, got {}",
        args.nodes
    );
    ensure!(
        (0.0..1.0).contains(&args.loss),
        "--loss must be in [0, 1), got {}",
        args.loss
    );
    let max = config.max_payload();
    ensure!(
        (STAMP_LEN..=max).contains(&args.size),
        "--size must be between {STAMP_LEN} (the timestamp) and {max} (one datagram), got {}",
        args.size
    );
    ensure!(
        args.duration.is_finite() && args.duration > 0.0 && args.duration <= 86_400.0,
        "--duration must be positive seconds (at most a day), got {}",
        args.duration
    );
    ensure!(
        args.settle.is_finite() && (0.0..=3_600.0).contains(&args.settle),
        "--settle must be between 0 and 3600 seconds, got {}",
        args.settle
    );
    ensure!(
        args.rate <= 10_000_000,
        "--rate must be at most 10,000,000 msgs/s, got {}",
        args.rate
    );
    Ok(())
}

/// Binds every member's sockets, then starts each member's runtime.
fn start_members(
    args: &DemoArgs,
    config: &pbcast::Config,
    clock: Clock,
) -> anyhow::Result<Vec<Node<Pbcast>>> {
    let options = SocketOptions::default();
    let mut endpoints = Vec::new();
    for _ in 0..args.nodes {
        endpoints.push(Endpoint::bind_loopback(&options).context("binding a member's socket")?);
    }
    if args.transport == Transport::Multicast {
        let group = demo_group()?;
        for endpoint in &mut endpoints {
            endpoint
                .join(group, &options)
                .context("joining the multicast group on loopback")?;
        }
    }
    let book = AddressBook::new(endpoints.iter().map(Endpoint::local_addr).collect())?;
    let members: Vec<NodeId> = book.members().collect();
    let mut nodes = Vec::new();
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let me = NodeId(i as u32);
        let seed = args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        let engine = Pbcast::new(me, &members, config.clone(), seed, clock.now())?;
        let mut node_config = NodeConfig::new(book.clone());
        node_config.faults = FaultConfig {
            drop_probability: args.loss,
            seed: seed ^ 0x5eed_fa17,
            ..FaultConfig::default()
        };
        nodes.push(Node::spawn(engine, endpoint, node_config, clock)?);
    }
    Ok(nodes)
}

/// An admin-scoped group and port that differ between concurrent demos.
fn demo_group() -> anyhow::Result<MulticastGroup> {
    let pid = std::process::id();
    let ip = Ipv4Addr::new(239, 255, (pid >> 8) as u8, pid as u8);
    let port = 20_000 + (pid % 30_000) as u16;
    Ok(MulticastGroup::new(SocketAddrV4::new(ip, port))?)
}

// ---- running ----------------------------------------------------------------

/// What one member's application saw, updated live for the progress bar.
#[derive(Debug, Default)]
struct Tally {
    delivered: AtomicU64,
    lost: AtomicU64,
}

impl Tally {
    fn done(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed) + self.lost.load(Ordering::Relaxed)
    }
}

/// What one member's application saw, in full, at the end.
#[derive(Debug)]
struct Receipt {
    delivered: u64,
    recovered: u64,
    lost: u64,
    /// Deliveries out of FIFO order or duplicated (must stay 0).
    out_of_order: u64,
    /// Send-to-delivery latency, µs.
    latency_us: Histogram<u64>,
    last_delivery: Option<Instant>,
}

/// The sending phase's figures.
#[derive(Debug, Clone, Copy)]
struct RunFigures {
    sent: u64,
    started: Instant,
    send_ended: Instant,
    settled: Instant,
}

struct Outcome {
    run: RunFigures,
    consumers: Vec<tokio::task::JoinHandle<Receipt>>,
}

impl Outcome {
    async fn collect(self) -> anyhow::Result<Vec<Receipt>> {
        let mut receipts = Vec::new();
        for consumer in self.consumers {
            receipts.push(consumer.await.context("a member's consumer failed")?);
        }
        Ok(receipts)
    }
}

/// Sends for `--duration`, then waits (bounded) for every member to finish.
async fn drive(
    args: &DemoArgs,
    clock: Clock,
    nodes: &mut [Node<Pbcast>],
    tallies: &[Arc<Tally>],
) -> anyhow::Result<Outcome> {
    let consumers = nodes
        .iter_mut()
        .zip(tallies)
        .map(|(node, tally)| {
            let events = node.take_events().expect("taken once");
            tokio::spawn(consume(events, Arc::clone(tally)))
        })
        .collect();
    let bar = progress_bar(args);
    let started = clock.now();
    let sent = Arc::new(AtomicU64::new(0));
    let sender = tokio::spawn(send(
        nodes[0].commands(),
        clock,
        args.rate,
        args.size,
        Duration::from_secs_f64(args.duration),
        Arc::clone(&sent),
    ));
    while !sender.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        update_bar(&bar, clock, started, &sent, tallies);
    }
    sender.await.context("the sender failed")?;
    let send_ended = clock.now();
    let total = sent.load(Ordering::Relaxed);
    bar.set_message(format!("sent {total}; waiting for repairs"));
    let settle_deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.settle);
    while tallies.iter().any(|t| t.done() < total) && tokio::time::Instant::now() < settle_deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settled = clock.now();
    bar.finish_and_clear();
    let run = RunFigures {
        sent: total,
        started,
        send_ended,
        settled,
    };
    Ok(Outcome { run, consumers })
}

fn progress_bar(args: &DemoArgs) -> ProgressBar {
    let bar = ProgressBar::new((args.duration * 1000.0) as u64);
    let style = ProgressStyle::with_template("{spinner} {elapsed:>3} [{bar:30}] {msg}")
        .expect("valid template")
        .progress_chars("=> ");
    bar.set_style(style);
    bar
}

fn update_bar(
    bar: &ProgressBar,
    clock: Clock,
    started: Instant,
    sent: &AtomicU64,
    tallies: &[Arc<Tally>],
) {
    let elapsed = clock.now() - started;
    bar.set_position(elapsed.as_millis() as u64);
    let slowest = tallies.iter().map(|t| t.done()).min().unwrap_or(0);
    let sent = sent.load(Ordering::Relaxed);
    let rate = sent as f64 / elapsed.as_secs_f64().max(1e-3);
    bar.set_message(format!(
        "sent {sent} ({rate:.0}/s), slowest member at {slowest}"
    ));
}

/// Member 0's application: `rate` messages/s (0: as fast as the node takes
/// them) for `duration`. A tick every millisecond sends whatever the rate
/// owes by then, so high rates go out in small bursts without spinning.
async fn send(
    commands: mpsc::Sender<Command>,
    clock: Clock,
    rate: u64,
    size: usize,
    duration: Duration,
    sent: Arc<AtomicU64>,
) {
    let start = clock.now();
    let end = start + duration;
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut count = 0u64;
    loop {
        let now = clock.now();
        if now >= end {
            break;
        }
        let owed = if rate == 0 {
            // Back-pressure from the bounded channel does the pacing.
            1024
        } else {
            let due = ((now - start).as_secs_f64() * rate as f64) as u64 + 1;
            due.saturating_sub(count)
        };
        for _ in 0..owed {
            if commands
                .send(Command::Multicast(stamped(clock, size)))
                .await
                .is_err()
            {
                return;
            }
            count += 1;
        }
        sent.store(count, Ordering::Relaxed);
        if rate != 0 {
            ticker.tick().await;
        }
    }
    sent.store(count, Ordering::Relaxed);
}

/// A payload of `size` bytes starting with the send time.
fn stamped(clock: Clock, size: usize) -> Bytes {
    let mut payload = BytesMut::with_capacity(size);
    payload.put_u64(clock.now().as_nanos());
    payload.put_bytes(0, size - STAMP_LEN);
    payload.freeze()
}

/// One member's application: counts deliveries and losses, checks FIFO
/// order, records latencies.
async fn consume(
    mut events: mpsc::UnboundedReceiver<EventBatch<Event>>,
    tally: Arc<Tally>,
) -> Receipt {
    let mut receipt = Receipt {
        delivered: 0,
        recovered: 0,
        lost: 0,
        out_of_order: 0,
        latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
        last_delivery: None,
    };
    let mut next_seq = 0u64;
    while let Some(batch) = events.recv().await {
        for event in batch.events {
            on_event(&mut receipt, &mut next_seq, batch.at, event);
        }
        tally.delivered.store(receipt.delivered, Ordering::Relaxed);
        tally.lost.store(receipt.lost, Ordering::Relaxed);
    }
    receipt
}

fn on_event(receipt: &mut Receipt, next_seq: &mut u64, at: Instant, event: Event) {
    match event {
        Event::Deliver {
            seq,
            payload,
            recovered,
            ..
        } => {
            receipt.delivered += 1;
            receipt.recovered += u64::from(recovered);
            // FIFO: strictly increasing. Gaps are allowed here (a `Lost`
            // event may come before the deliveries that precede its range).
            receipt.out_of_order += u64::from(seq < *next_seq);
            *next_seq = seq + 1;
            receipt.last_delivery = Some(at);
            if let Some(stamp) = payload.get(..STAMP_LEN) {
                let sent = u64::from_be_bytes(stamp.try_into().expect("8 bytes"));
                let latency = at - Instant::from_nanos(sent);
                receipt
                    .latency_us
                    .saturating_record(latency.as_micros() as u64);
            }
        }
        Event::Lost { range, .. } => receipt.lost += range.len(),
    }
}

// ---- reporting ----------------------------------------------------------------

fn print_report(
    args: &DemoArgs,
    run: &RunFigures,
    receipts: &[Receipt],
    reports: &[(pbcast::Stats, RuntimeStats)],
) {
    let send_secs = (run.send_ended - run.started).as_secs_f64();
    println!(
        "shoal demo: {} members on loopback ({:?} first phase), {} B messages, injected loss {}",
        args.nodes, args.transport, args.size, args.loss
    );
    println!(
        "sent: {} messages in {:.2} s ({:.0} msgs/s); settled {:.2} s after sending stopped",
        run.sent,
        send_secs,
        run.sent as f64 / send_secs.max(1e-9),
        (run.settled - run.send_ended).as_secs_f64()
    );
    println!();
    println!(
        "{:<8} {:>10} {:>10} {:>6} {:>9} {:>9} {:>10} {:>9} {:>8}",
        "member",
        "delivered",
        "recovered",
        "lost",
        "p50_ms",
        "p99_ms",
        "msgs/s",
        "datagrams",
        "dropped"
    );
    for (i, (receipt, (_engine, net))) in receipts.iter().zip(reports).enumerate() {
        let role = if i == 0 { "*" } else { "" };
        println!(
            "{:<8} {:>10} {:>10} {:>6} {:>9.3} {:>9.3} {:>10.0} {:>9} {:>8}",
            format!("n{i}{role}"),
            receipt.delivered,
            receipt.recovered,
            receipt.lost,
            receipt.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            receipt.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            throughput(run, receipt),
            net.datagrams_received,
            net.fault_drops,
        );
    }
    println!();
    println!("* n0 is the sender (it delivers its own messages). msgs/s: deliveries over the time from the first send to the member's last delivery.");
    let members: Vec<f64> = receipts[1..].iter().map(|r| throughput(run, r)).collect();
    let min = members.iter().copied().fold(f64::INFINITY, f64::min);
    println!("throughput: {min:.0} msgs/s per receiving member (slowest)");
    let ooo: u64 = receipts.iter().map(|r| r.out_of_order).sum();
    if ooo > 0 {
        println!("FIFO violations: {ooo}");
    }
}

/// Deliveries per second from the first send to this member's last delivery.
fn throughput(run: &RunFigures, receipt: &Receipt) -> f64 {
    let Some(last) = receipt.last_delivery else {
        return 0.0;
    };
    receipt.delivered as f64 / (last - run.started).as_secs_f64().max(1e-9)
}

fn check(run: &RunFigures, receipts: &[Receipt]) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for (i, receipt) in receipts.iter().enumerate() {
        if receipt.lost > 0 {
            failures.push(format!("n{i} lost {} messages", receipt.lost));
        }
        if receipt.delivered != run.sent {
            failures.push(format!(
                "n{i} delivered {} of {}",
                receipt.delivered, run.sent
            ));
        }
        if receipt.out_of_order > 0 {
            failures.push(format!(
                "n{i} delivered {} out of FIFO order",
                receipt.out_of_order
            ));
        }
    }
    if failures.is_empty() {
        println!(
            "result: ok, every member delivered all {} messages",
            run.sent
        );
        return Ok(());
    }
    println!("result: FAILED");
    bail!("{}", failures.join("; "))
}
