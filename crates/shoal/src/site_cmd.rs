//! `shoal site`: one daemon of Spread's sites (`shoal_net::sites`), in a
//! process of its own, configured from a sites file. Applications connect
//! to its Unix socket (`--socket`) with the client libraries; an optional
//! built-in workload of clients joins a group, sends, and records their
//! histories for `shoal check`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use shoal_core::sites::{ClientError, Event, Service};
use shoal_net::sites::clients::{ClientServer, ClientSettings};
use shoal_net::sites::{SiteEngine, SitesPlan};
use shoal_net::{Clock, Endpoint, EventBatch, Node, SocketOptions};
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Args)]
pub struct SiteArgs {
    /// The sites file (TOML): every site, its daemons' ids and UDP
    /// addresses, the overlay links and the engine's settings
    /// (`docs/spread.md`, "Sites in real processes").
    #[arg(long)]
    config: PathBuf,
    /// This daemon's id in the sites file.
    #[arg(long)]
    id: u32,
    /// Serve clients on this Unix socket (the main daemon's client
    /// protocol: the Rust and Python libraries connect to it). A client
    /// named `n` is `#n#d<id>`.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Experiments: drop this fraction (0 to <1) of the datagrams this
    /// daemon receives, each on its own draw (Shoal's fault injection, on
    /// every datagram: ring and WAN alike).
    #[arg(long, default_value_t = 0.0, value_name = "FRACTION")]
    loss: f64,
    /// Experiments: hand every received datagram to the engine this many
    /// milliseconds late (a one-way link delay, with `--loss` at both
    /// ends of a link: a lossy WAN link of twice this round trip).
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    delay_ms: f64,
    /// Seeds the fault injection's generator.
    #[arg(long, default_value_t = 1)]
    fault_seed: u64,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long, value_name = "SECS")]
    run_for: Option<f64>,
    /// Clients of this daemon in the built-in workload (none by default:
    /// the daemon only relays and orders for its site).
    #[arg(long, default_value_t = 0)]
    clients: u32,
    /// The group every workload client joins and sends to.
    #[arg(long, default_value = "g")]
    group: String,
    /// Seconds after start when the workload clients connect and join (the
    /// other daemons should be up by then). With the site membership on,
    /// they wait on, up to 10 s more, until every site of the file is in
    /// this daemon's configuration.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    start_after: f64,
    /// Seconds the workload clients send for, from when they joined.
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    send_for: f64,
    /// Messages per second from each workload client.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Services the workload uses, in turn: unreliable, reliable, fifo,
    /// causal, agreed, safe.
    #[arg(long, value_delimiter = ',', default_value = "agreed,safe")]
    services: Vec<String>,
    /// Payload bytes per workload message (at least 8: the sequence
    /// number).
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Write the workload clients' histories here (JSON lines for `shoal
    /// check`), as they happen: a daemon killed leaves what its clients
    /// did up to then (a send is written before it is handed over).
    #[arg(long)]
    history: Option<PathBuf>,
}

fn service(name: &str) -> anyhow::Result<Service> {
    Ok(match name {
        "unreliable" => Service::Unreliable,
        "reliable" => Service::Reliable,
        "fifo" => Service::Fifo,
        "causal" => Service::Causal,
        "agreed" => Service::Agreed,
        "safe" => Service::Safe,
        other => {
            bail!("unknown service {other:?}: unreliable, reliable, fifo, causal, agreed or safe")
        }
    })
}

pub fn run(args: SiteArgs) -> anyhow::Result<()> {
    let plan = SitesPlan::load(&args.config)?;
    let services = args
        .services
        .iter()
        .map(|s| service(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if services.is_empty() {
        bail!("--services names none");
    }
    if args.clients > 0 && !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a positive number of messages per second");
    }
    let addr = plan.addr(args.id)?;
    let clock = Clock::new();
    let mut engine = plan.engine(args.id, clock.now())?;
    // The sites file's per-link delay and loss draw from --fault-seed too.
    engine.seed_link_faults(args.fault_seed ^ (u64::from(args.id) << 32));
    let endpoint = Endpoint::bind(addr, &SocketOptions::default())
        .with_context(|| format!("daemon {} at {addr}", args.id))?;
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut config = plan.node_config(epoch)?;
    if !(0.0..1.0).contains(&args.loss) {
        bail!("--loss must be at least 0 and below 1");
    }
    if !(args.delay_ms >= 0.0 && args.delay_ms.is_finite()) {
        bail!("--delay-ms must be a number of milliseconds, at least 0");
    }
    config.faults = shoal_net::FaultConfig {
        drop_probability: args.loss,
        delay: Duration::from_secs_f64(args.delay_ms / 1e3),
        seed: args.fault_seed,
        ..shoal_net::FaultConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    // The daemon's loop is a task of the thread that serves its clients:
    // an event for a client and a client's request are handed over within
    // the thread (a task wake-up), not to another thread. On three daemons
    // of one two-core host this took about 17% off their CPU.
    let mut node = runtime.block_on(async { Node::spawn_task(engine, endpoint, config, clock) })?;
    let events = node.take_events().expect("events taken once");
    eprintln!(
        "site daemon {} ({}) at {addr}: {} sites, {} daemons",
        args.id,
        plan.topology.sites[usize::from(
            plan.topology
                .site_of(shoal_core::NodeId(args.id))
                .expect("validated")
                .0
        )]
        .name,
        plan.topology.sites.len(),
        plan.addrs.len()
    );
    let history = match &args.history {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut workload = Workload::new(&args, services, history, clock);
    let server_stats = runtime.block_on(async {
        let server = match &args.socket {
            Some(path) => {
                let mut settings = ClientSettings::new(path.clone(), format!("d{}", args.id));
                // A client frame may carry what the engine takes.
                settings.limits.payload_max = plan.engine.max_payload;
                Some(
                    ClientServer::bind(settings, node.controls())
                        .with_context(|| format!("client socket {}", path.display()))?,
                )
            }
            None => None,
        };
        if let Some(path) = &args.socket {
            eprintln!("site daemon {}: clients on {}", args.id, path.display());
        }
        // SIGTERM (a service manager's stop) ends the run as SIGINT does:
        // the daemon stops and prints its counters. Handled from before
        // the daemon says it is ready.
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("SIGTERM handler")?;
        // systemd `Type=notify`: ready once the client socket is open (a
        // client's requests wait there until the daemon is live in its
        // site).
        if let Some(path) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) {
            if let Err(e) = crate::daemon_cmd::sd_notify(&path, "READY=1") {
                eprintln!("site daemon {}: cannot notify $NOTIFY_SOCKET: {e}", args.id);
            }
        }
        workload
            .run(&args, &node, events, server.as_ref(), &mut terminate)
            .await?;
        let stopped = node.stop().await?;
        anyhow::Ok((server.map(|s| s.stats()), stopped))
    })?;
    let (server_stats, (engine, stats)) = server_stats;
    workload.flush().context("writing the history")?;
    let d = engine.daemon();
    println!(
        "site daemon {}: gateway {}, live {}, sent {}, refused {}, delivered {}, views {}, clients dropped {}, site state founded {} taken {} given {}, datagrams in {} out {}, refused by auth {}, bad {}, resent {} (left to hop {}), markers {}, tokens {}, ring gathers {}",
        args.id,
        d.is_gateway(),
        d.is_live(),
        workload.sent,
        workload.refused,
        workload.delivered,
        workload.views,
        workload.dropped,
        d.stats().foundings,
        d.stats().snapshots_taken,
        d.stats().snapshots_sent,
        stats.datagrams_received,
        stats.datagrams_sent,
        stats.auth_dropped,
        d.stats().bad_datagrams,
        d.stats().resent,
        d.stats().resend_skipped,
        d.stats().markers,
        d.ring_stats().tokens,
        d.ring_stats().gathers,
    );
    let h = d.hop_stats();
    println!(
        "site daemon {} hop links: data sent {}, retransmissions {}, received {}, duplicates {}, recovered {}, nacks sent {}, nacks received {}",
        args.id, h.data_sent, h.retransmissions, h.data_received, h.duplicates, h.recovered, h.nacks_sent, h.nacks_received
    );
    let st = d.stats();
    let (epoch, sites, changing) = d.configuration();
    println!(
        "site daemon {} configuration: epoch {epoch}, sites {:?}{}, changes completed {}, commits made {} taken {} stale {} superseded {}",
        args.id,
        sites.iter().map(|s| s.0).collect::<Vec<_>>(),
        if changing { " (changing)" } else { "" },
        st.configurations,
        st.commits_made,
        st.commits_taken,
        st.stale_commits,
        st.superseded,
    );
    if st.sent_in_parts > 0 || st.parts_refused > 0 || st.ring_refused > 0 {
        println!(
            "site daemon {}: messages sent in parts {}, parts refused {}, ring queue refusals {}",
            args.id, st.sent_in_parts, st.parts_refused, st.ring_refused
        );
    }
    let a = engine.stats();
    if a.link_held > 0 || a.link_dropped > 0 || a.link_queue_dropped > 0 {
        println!(
            "site daemon {} link faults: dropped {}, queue full {}, held {}, handed over late by {:.0} us on average",
            args.id,
            a.link_dropped,
            a.link_queue_dropped,
            a.link_held,
            a.link_late_us as f64 / a.link_held.max(1) as f64
        );
    }
    if a.uplink_dropped > 0 || a.downlink_dropped > 0 {
        println!(
            "site daemon {} access link: uplink queue full {}, downlink queue full {}",
            args.id, a.uplink_dropped, a.downlink_dropped
        );
    }
    if let Some(s) = server_stats {
        println!(
            "site daemon {} clients: connections {}, messages in {}, frames out {}, orphaned {}, slow {}, queue-full waits {}",
            args.id, s.connections, s.messages_in, s.frames_out, s.orphaned, s.slow, s.queue_full_waits
        );
    }
    Ok(())
}

/// The built-in clients and what they recorded.
struct Workload {
    names: Vec<String>,
    services: Vec<Service>,
    next_seq: BTreeMap<String, u64>,
    history: Option<std::io::BufWriter<std::fs::File>>,
    clock: Clock,
    sent: u64,
    refused: u64,
    delivered: u64,
    views: u64,
    dropped: u64,
}

/// Whether the daemon's site membership is on.
async fn node_membership_on(node: &Node<SiteEngine>) -> anyhow::Result<bool> {
    let (tx, rx) = oneshot::channel();
    node.control(move |e, _, _| {
        let _ = tx.send(e.daemon_mut().membership_enabled());
    });
    rx.await.context("daemon stopped")
}

/// Whether every site of the topology is in the daemon's configuration,
/// and the change to it complete.
async fn every_site_in(node: &Node<SiteEngine>) -> anyhow::Result<bool> {
    let (tx, rx) = oneshot::channel();
    node.control(move |e, _, _| {
        let d = e.daemon_mut();
        let all = d.topology_sites();
        let (_, sites, changing) = d.configuration();
        let _ = tx.send(!changing && sites.len() == all);
    });
    rx.await.context("daemon stopped")
}

impl Workload {
    fn new(
        args: &SiteArgs,
        services: Vec<Service>,
        history: Option<std::io::BufWriter<std::fs::File>>,
        clock: Clock,
    ) -> Workload {
        let names: Vec<String> = (0..args.clients)
            .map(|c| format!("#c{c}#d{}", args.id))
            .collect();
        Workload {
            next_seq: names.iter().map(|n| (n.clone(), 1)).collect(),
            names,
            services,
            history,
            clock,
            sent: 0,
            refused: 0,
            delivered: 0,
            views: 0,
            dropped: 0,
        }
    }

    async fn run(
        &mut self,
        args: &SiteArgs,
        node: &Node<SiteEngine>,
        mut events: mpsc::UnboundedReceiver<EventBatch<Event>>,
        server: Option<&ClientServer>,
        terminate: &mut tokio::signal::unix::Signal,
    ) -> anyhow::Result<()> {
        let start = tokio::time::Instant::now();
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
        let mut join_at = start + secs(args.start_after);
        let give_up_waiting = join_at + Duration::from_secs(10);
        let mut stop_sending = join_at + secs(args.send_for);
        let end = args.run_for.map(|s| start + secs(s));
        let far = start + Duration::from_secs(86_400 * 365);
        let gap = if args.clients > 0 {
            secs(1.0 / args.rate)
        } else {
            Duration::from_secs(3600)
        };
        let mut next_send = join_at + gap;
        let wait_for_sites = node_membership_on(node).await?;
        let mut joined = args.clients == 0;
        let mut round = 0usize;
        loop {
            let wake = if !joined {
                join_at
            } else if next_send < stop_sending {
                next_send
            } else {
                far
            };
            tokio::select! {
                batch = events.recv() => match batch {
                    Some(batch) => self.record(batch, server)?,
                    None => bail!("daemon {} stopped", args.id),
                },
                _ = tokio::time::sleep_until(wake) => {
                    if !joined {
                        let now = tokio::time::Instant::now();
                        if wait_for_sites && now < give_up_waiting && !every_site_in(node).await? {
                            join_at = now + Duration::from_millis(50);
                            continue;
                        }
                        joined = true;
                        self.join(node, &args.group).await?;
                        stop_sending = now + secs(args.send_for);
                        next_send = now + gap;
                    } else {
                        self.send_round(node, args, round).await?;
                        round += 1;
                        next_send += gap;
                    }
                }
                _ = tokio::time::sleep_until(end.unwrap_or(far)) => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
            }
        }
        // What the daemon handed over before it stops.
        while let Ok(batch) = events.try_recv() {
            self.record(batch, server)?;
        }
        Ok(())
    }

    async fn join(&mut self, node: &Node<SiteEngine>, group: &str) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        let names = self.names.clone();
        let group = group.to_string();
        node.control(move |e, now, _| {
            let d = e.daemon_mut();
            let mut result = Ok(());
            for n in &names {
                d.connect(n);
                result = result.and(d.join(now, n, &group));
            }
            let _ = tx.send(result);
        });
        rx.await
            .context("daemon stopped")?
            .context("joining the group")?;
        Ok(())
    }

    /// One message from each client. Its send is recorded (and written)
    /// first; a message the daemon refuses (its queue is full) is then
    /// recorded as not delivered.
    async fn send_round(
        &mut self,
        node: &Node<SiteEngine>,
        args: &SiteArgs,
        round: usize,
    ) -> anyhow::Result<()> {
        for (i, name) in self.names.clone().into_iter().enumerate() {
            let service = self.services[(round + i) % self.services.len()];
            let seq = self.next_seq[&name];
            let mut payload = vec![0u8; args.size.max(8)];
            payload[..8].copy_from_slice(&seq.to_be_bytes());
            let groups = vec![args.group.clone()];
            self.next_seq.insert(name.clone(), seq + 1);
            self.push(shoal_check::Record::Send {
                client: name.clone(),
                msg: shoal_check::MsgId {
                    sender: name.clone(),
                    seq,
                },
                service: service.into(),
                groups: groups.clone(),
                at_ns: Some(self.clock.now().as_nanos()),
            })?;
            self.flush()?;
            let (tx, rx) = oneshot::channel();
            let (client, to) = (name.clone(), groups);
            node.control(move |e, now, _| {
                let r = e
                    .daemon_mut()
                    .send(now, &client, service, &to, Bytes::from(payload));
                let _ = tx.send((r, now));
            });
            let (result, now) = rx.await.context("daemon stopped")?;
            match result {
                Ok(()) => self.sent += 1,
                Err(ClientError::QueueFull) => {
                    self.refused += 1;
                    self.push(shoal_check::Record::NotDelivered {
                        client: name,
                        first: seq,
                        last: seq,
                        at_ns: Some(now.as_nanos()),
                    })?;
                }
                Err(e) => return Err(e).context("sending"),
            }
        }
        Ok(())
    }

    fn push(&mut self, record: shoal_check::Record) -> anyhow::Result<()> {
        if let Some(out) = &mut self.history {
            serde_json::to_writer(&mut *out, &record)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if let Some(out) = &mut self.history {
            out.flush()?;
        }
        Ok(())
    }

    /// Records the workload clients' events and hands the socket's
    /// clients theirs.
    fn record(
        &mut self,
        batch: EventBatch<Event>,
        server: Option<&ClientServer>,
    ) -> anyhow::Result<()> {
        let at_ns = Some(batch.at.as_nanos());
        for ev in batch.events {
            let client = match &ev {
                Event::Deliver { client, .. }
                | Event::View { client, .. }
                | Event::Dropped { client } => client,
            };
            if !self.next_seq.contains_key(client) {
                if let Some(server) = server {
                    server.dispatch(ev);
                }
                continue;
            }
            match ev {
                Event::Deliver {
                    client,
                    sender,
                    service,
                    groups,
                    payload,
                    transitional,
                } => {
                    self.delivered += 1;
                    let seq = payload
                        .get(..8)
                        .map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
                    self.push(shoal_check::Record::Deliver {
                        client,
                        msg: shoal_check::MsgId { sender, seq },
                        service: service.into(),
                        groups,
                        transitional,
                        at_ns,
                    })?;
                }
                Event::View {
                    client,
                    group,
                    view_id,
                    members,
                    transitional,
                    ..
                } => {
                    self.views += 1;
                    self.push(shoal_check::Record::View {
                        client,
                        group,
                        view_id,
                        members,
                        transitional,
                        quorum: None,
                        at_ns,
                    })?;
                }
                Event::Dropped { client } => {
                    self.dropped += 1;
                    self.push(shoal_check::Record::Ended {
                        client,
                        reason: "dropped by its daemon".into(),
                        at_ns,
                    })?;
                }
            }
        }
        // A batch is written whole, so that a daemon killed leaves whole
        // lines.
        self.flush()
    }
}
