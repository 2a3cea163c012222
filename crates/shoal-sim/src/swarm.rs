//! The fault swarm: whole clusters (daemon engines and their clients) in
//! virtual time under faults drawn from a seed, judged by the history
//! checker (`shoal-check`), as TigerBeetle's VOPR judges its replicas.
//!
//! One run: `daemons` daemon engines ([`shoal_core::daemon::Daemon`], the
//! code the real daemon runs) on a simulated network, clients attached to
//! them that join and leave groups, multicast with every service type
//! (sizes up to fragmented), read slowly, disconnect and reconnect. A fault
//! phase draws crashes and restarts, sleeps (short, and long enough to be
//! evicted), partitions and heals, loss, duplication, reordering, slow
//! clients and graceful stops. Then a liveness phase heals everything and
//! requires the daemons to converge on one view within a bound. Every
//! client's sends, deliveries, views and end are records for the checker.
//!
//! Deterministic: the same seed gives the same run (the trace hash).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_check::{MsgId, Record, Report};
use shoal_core::daemon::membership::{self, Membership};
use shoal_core::daemon::{ClientInput, Daemon, DaemonEvent, Limits, SessionId, Settings};
use shoal_core::{Destination, Engine, Instant, NodeId};
use shoal_wire::client::{self, Frame, Service};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// The daemons' membership settings: the daemon's defaults, with the
/// engines' datagrams of 16 KB when the transport fragments (as a daemon
/// beyond loopback sends them: `engine_datagram` 16,384 less its envelope).
fn membership_config(cfg: &SwarmConfig) -> membership::Config {
    let mut c = membership::Config::daemon_defaults();
    if cfg.fragment_bytes.is_some() {
        c.vsync.pbcast.max_datagram_size = 16_000;
    }
    c.vsync.repair_done_apart = cfg.fragment_bytes.is_some() || cfg.repair_done_apart;
    if let Some(period) = cfg.view_period {
        c.vsync.view_period = period;
    }
    c
}

/// What one run is made of (all drawn from the seed unless set).
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    pub seed: u64,
    /// Daemons, 2 to 9.
    pub daemons: usize,
    /// Clients per daemon (at a time).
    pub clients_per_daemon: usize,
    /// Length of the fault phase.
    pub fault_phase: Duration,
    /// The liveness phase: the daemons must converge within this.
    pub converge_within: Duration,
    /// Which fault kinds may be drawn.
    pub faults: FaultKinds,
    /// Faults at fixed times, beside the drawn ones (a scenario to pin).
    pub script: Vec<(Duration, Scripted)>,
    /// Daemons carry `reliable` and `fifo` over QSM regions (`[qsm]`).
    pub qsm: bool,
    /// With `qsm`: group `g0` is a `[qsm] hybrid` group (an instance of
    /// its own).
    pub qsm_hybrid: bool,
    /// The number of drawn faults (2 to 8) is multiplied by this: a long
    /// fault phase keeps the density of a drawn one. Default 1.
    pub fault_count_factor: u32,
    /// Loss on every datagram all run long, under the drawn network
    /// faults' (a daemon's `[faults] loss`, as the long schedule across
    /// hosts runs). Default 0.
    pub floor_loss_ppm: u32,
    /// Datagrams travel as fragments of this many bytes, each lost on its
    /// own, and a datagram arrives only whole (the daemon's transport
    /// beyond loopback: `engine_datagram` cut into `max_datagram`
    /// fragments). Default none: a datagram is lost as one.
    pub fragment_bytes: Option<usize>,
    /// The daemons' periodic view change (`[cluster.vsync] view_period`)
    /// instead of the default 20 s: a short one (the long schedule across
    /// hosts runs 2 s) puts more faults in the middle of a view change.
    pub view_period: Option<Duration>,
    /// The daemons' vsync sends a repair answer's end apart
    /// (`repair_done_apart`) even unfragmented; with fragments it always
    /// does, as the daemon beyond loopback.
    pub repair_done_apart: bool,
}

/// A fault at a fixed time ([`SwarmConfig::script`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scripted {
    /// The daemon stops (SIGSTOP) for this long.
    Sleep(usize, Duration),
    Crash(usize),
    /// These daemons are cut off from the others until `Heal`.
    Partition(Vec<usize>),
    Heal,
    /// Graceful stop (SIGTERM); it restarts a little later.
    Stop(usize),
}

/// Fault kinds a run may draw.
#[derive(Debug, Clone, Copy)]
pub struct FaultKinds {
    pub crashes: bool,
    pub sleeps: bool,
    pub partitions: bool,
    pub network: bool,
    pub slow_clients: bool,
    pub stops: bool,
}

impl FaultKinds {
    pub const ALL: FaultKinds = FaultKinds {
        crashes: true,
        sleeps: true,
        partitions: true,
        network: true,
        slow_clients: true,
        stops: true,
    };
    pub const NONE: FaultKinds = FaultKinds {
        crashes: false,
        sleeps: false,
        partitions: false,
        network: false,
        slow_clients: false,
        stops: false,
    };
}

impl SwarmConfig {
    /// A run of `seed` with its shape drawn from the seed.
    pub fn from_seed(seed: u64) -> SwarmConfig {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5eed_5a1a);
        SwarmConfig {
            seed,
            daemons: rng.random_range(2..=5),
            clients_per_daemon: rng.random_range(1..=3),
            fault_phase: Duration::from_secs(rng.random_range(10..=25)),
            converge_within: Duration::from_secs(30),
            faults: FaultKinds::ALL,
            script: Vec::new(),
            qsm: false,
            qsm_hybrid: false,
            fault_count_factor: 1,
            floor_loss_ppm: 0,
            fragment_bytes: None,
            view_period: None,
            repair_done_apart: false,
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    /// Daemons in the cluster.
    pub daemons: usize,
    pub report: Report,
    /// The daemons converged on one view of all of them in the liveness
    /// phase, and every message sent then reached every member.
    pub converged: bool,
    /// Why not, when not.
    pub liveness: Option<String>,
    /// A hash of every event handled, in order (determinism check).
    pub trace_hash: u64,
    /// Simulated time at the end.
    pub sim_time: Duration,
    pub events: u64,
    /// The last lines of the trace, for a failing seed.
    pub trace_tail: Vec<String>,
    /// The faults the seed drew (and any scripted), with their times.
    /// (A broken engine invariant is not an outcome: it panics the run.)
    pub faults_drawn: Vec<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.report.is_clean() && self.converged
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A datagram reaches a daemon's socket.
    Datagram { to: usize, from: u32, bytes: Bytes },
    /// A daemon's timer (stale when `at` is not its current deadline).
    Timer { slot: usize },
    /// A client acts (stale when `step` is not its latest).
    ClientStep { client: usize, step: u64 },
    /// A client reads what its daemon wrote to it.
    ClientRead { client: usize },
    /// A fault, or its end.
    Fault(Fault),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Crash(usize),
    Restart(usize),
    Sleep(usize, u64),
    Wake(usize),
    Partition(Vec<usize>),
    Heal,
    Slow(usize, u64),
    Stop(usize),
    Network { loss_ppm: u32, dup_ppm: u32 },
    Liveness,
}

struct DaemonSlot {
    engine: Option<Daemon>,
    incarnation: u32,
    asleep: bool,
    /// Datagrams that reached a sleeping daemon's socket.
    backlog: VecDeque<(u32, Bytes)>,
    /// Client inputs that reached a sleeping daemon.
    client_backlog: VecDeque<ClientInput>,
    deadline: Option<Instant>,
    next_session: SessionId,
    stopping: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// Waiting to connect (retrying).
    Idle,
    Connecting,
    Connected,
}

struct Client {
    daemon: usize,
    session: SessionId,
    /// The name for this incarnation of the client.
    name: String,
    generation: u32,
    private: Option<String>,
    state: ClientState,
    seq: u64,
    groups: BTreeSet<String>,
    /// Bytes the daemon wrote, not read yet.
    inbox: VecDeque<Bytes>,
    buf: Vec<u8>,
    slow_until: u64,
    read_scheduled: bool,
    /// Sent messages not yet seen delivered back (for the liveness check).
    unconfirmed: BTreeSet<u64>,
    /// The latest step scheduled: one chain of steps per client.
    step: u64,
}

struct World {
    cfg: SwarmConfig,
    rng: Xoshiro256PlusPlus,
    now: u64,
    order: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    daemons: Vec<DaemonSlot>,
    clients: Vec<Client>,
    partition: Option<Vec<usize>>,
    loss_ppm: u32,
    dup_ppm: u32,
    records: Vec<Record>,
    hasher: std::collections::hash_map::DefaultHasher,
    events: u64,
    trace: VecDeque<String>,
    /// Every trace line, kept only when `SWARM_DUMP` asks for it.
    full_trace: Vec<String>,
    keep_trace: bool,
    faults_drawn: Vec<String>,
    liveness: bool,
    /// No client acts from this time on.
    quiet_from: u64,
    membership_config: membership::Config,
}

const GROUPS: [&str; 3] = ["g0", "g1", "g2"];
const TRACE_TAIL: usize = 40;
/// The end of a run with no new sends: long enough for any message to be
/// delivered everywhere once the network is healed.
const DRAIN: u64 = 8 * SEC;

/// At the end, a daemon whose next gseq is more than this behind another's
/// has not converged: it is still delivering the total order. (A periodic
/// view change under way at the end may leave one daemon a Newview or a
/// RECEIVED batch behind.)
const DELIVERY_LAG_MAX: u64 = 4;

/// Runs one seed.
pub fn run(cfg: SwarmConfig) -> Outcome {
    let mut w = World::new(cfg);
    w.schedule_faults();
    let end_faults = w.cfg.fault_phase.as_nanos() as u64;
    w.push(end_faults, Ev::Fault(Fault::Liveness));
    let end = end_faults + w.cfg.converge_within.as_nanos() as u64;
    // Clients stop sending this long before the end, so that what they
    // sent has settled when the history is judged.
    w.quiet_from = end.saturating_sub(DRAIN);
    let progress = std::env::var("SWARM_PROGRESS").is_ok();
    // `SWARM_STATUS_MS=N` (with `SWARM_DUMP`): every N simulated ms, each
    // running daemon's `shoal status` lines go into the dumped trace (not
    // into the trace hash).
    let status_every = std::env::var("SWARM_STATUS_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0 && w.keep_trace)
        .map(|ms| ms * 1_000_000);
    let mut next_status = status_every.unwrap_or(u64::MAX);
    let (mut same_time, mut last_at) = (0u64, 0u64);
    while let Some(Reverse((at, _, ev))) = w.queue.pop() {
        if at > end {
            break;
        }
        if at == last_at {
            same_time += 1;
            // Virtual time that stops advancing is a livelock: fail loudly.
            assert!(
                same_time < 1_000_000,
                "seed {}: a million events at {at} ns, last {ev:?}; trace:\n{}",
                w.cfg.seed,
                w.trace.iter().cloned().collect::<Vec<_>>().join("\n")
            );
        } else {
            same_time = 0;
            last_at = at;
        }
        if progress && w.events.is_multiple_of(100_000) {
            eprintln!("{} events, {:.3} s, {:?}", w.events, at as f64 / 1e9, ev);
        }
        w.now = at;
        while at >= next_status {
            w.status_to_trace(next_status);
            next_status += status_every.unwrap_or(u64::MAX);
        }
        w.handle(ev);
    }
    w.now = end;
    let (converged, liveness) = w.converged();
    let trace_hash = w.hasher.finish();
    let records = std::mem::take(&mut w.records);
    if let Ok(dir) = std::env::var("SWARM_DUMP") {
        // The whole history and trace of this seed, for a failing seed.
        let dir = std::path::Path::new(&dir).join(format!("seed-{}", w.cfg.seed));
        let _ = std::fs::create_dir_all(&dir);
        let lines: Vec<String> = records.iter().map(Record::to_json).collect();
        let _ = std::fs::write(dir.join("history.jsonl"), lines.join("\n") + "\n");
        let _ = std::fs::write(dir.join("trace.txt"), w.full_trace.join("\n") + "\n");
    }
    let report = shoal_check::check(records);
    Outcome {
        seed: w.cfg.seed,
        daemons: w.cfg.daemons,
        report,
        converged,
        liveness,
        trace_hash,
        sim_time: Duration::from_nanos(w.now),
        events: w.events,
        trace_tail: w.trace.into_iter().collect(),
        faults_drawn: w.faults_drawn,
    }
}

impl World {
    fn new(cfg: SwarmConfig) -> World {
        let rng = Xoshiro256PlusPlus::seed_from_u64(cfg.seed);
        let mut w = World {
            rng,
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            daemons: Vec::new(),
            clients: Vec::new(),
            partition: None,
            loss_ppm: 0,
            dup_ppm: 0,
            records: Vec::new(),
            hasher: Default::default(),
            events: 0,
            trace: VecDeque::new(),
            full_trace: Vec::new(),
            keep_trace: std::env::var("SWARM_DUMP").is_ok(),
            faults_drawn: Vec::new(),
            liveness: false,
            quiet_from: u64::MAX,
            membership_config: membership_config(&cfg),
            cfg,
        };
        for slot in 0..w.cfg.daemons {
            w.daemons.push(DaemonSlot {
                engine: None,
                incarnation: 0,
                asleep: false,
                backlog: VecDeque::new(),
                client_backlog: VecDeque::new(),
                deadline: None,
                next_session: 1,
                stopping: false,
            });
            w.start_daemon(slot);
        }
        for d in 0..w.cfg.daemons {
            for _ in 0..w.cfg.clients_per_daemon {
                let i = w.clients.len();
                w.clients.push(Client {
                    daemon: d,
                    session: 0,
                    name: String::new(),
                    generation: 0,
                    private: None,
                    state: ClientState::Idle,
                    seq: 0,
                    groups: BTreeSet::new(),
                    inbox: VecDeque::new(),
                    buf: Vec::new(),
                    slow_until: 0,
                    read_scheduled: false,
                    unconfirmed: BTreeSet::new(),
                    step: 0,
                });
                let at = w.rng.random_range(100 * MS..3 * SEC);
                w.schedule_step(i, at);
            }
        }
        w
    }

    fn schedule_step(&mut self, c: usize, at: u64) {
        self.clients[c].step += 1;
        let step = self.clients[c].step;
        self.push(at, Ev::ClientStep { client: c, step });
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.order += 1;
        self.queue.push(Reverse((at, self.order, ev)));
    }

    /// Each running daemon's status lines, into the full trace only.
    fn status_to_trace(&mut self, at: u64) {
        let now = Instant::from_nanos(at);
        for (slot, d) in self.daemons.iter().enumerate() {
            if let Some(engine) = &d.engine {
                for line in engine.status_lines(now) {
                    self.full_trace.push(format!(
                        "{:>9.3} ms d{slot} status: {line}",
                        at as f64 / 1e6
                    ));
                }
            }
        }
    }

    fn note(&mut self, line: String) {
        line.hash(&mut self.hasher);
        self.now.hash(&mut self.hasher);
        if self.trace.len() == TRACE_TAIL {
            self.trace.pop_front();
        }
        let line = format!("{:>9.3} ms {line}", self.now as f64 / 1e6);
        if self.keep_trace {
            self.full_trace.push(line.clone());
        }
        self.trace.push_back(line);
    }

    // ---- daemons ------------------------------------------------------------

    fn start_daemon(&mut self, slot: usize) {
        let d = &mut self.daemons[slot];
        d.incarnation += 1;
        let inc = d.incarnation;
        let seed = self.cfg.seed.wrapping_mul(1_000_003) ^ ((slot as u64) << 32) ^ u64::from(inc);
        let now = Instant::from_nanos(self.now);
        // As the real daemon does, from the (virtual) clock: restarts
        // never reuse an id the previous process took at a rejoin. (The
        // virtual clock reads as 8 ms past the epoch at 0: incarnation 1.)
        let first = membership::first_incarnation(8 + self.now / 1_000_000);
        let m = Membership::new(
            slot as u32,
            self.cfg.daemons as u32,
            first,
            self.membership_config.clone(),
            seed,
            now,
        )
        .expect("valid settings");
        let batch_max = self.membership_config.vsync.max_payload();
        let mut settings = Settings::new(&format!("d{slot}"), Limits::default(), batch_max);
        settings.epoch_floor = self.now / 1_000_000;
        settings.qsm.enabled = self.cfg.qsm;
        if self.cfg.qsm_hybrid {
            settings.qsm.hybrid = vec![GROUPS[0].to_string()];
        }
        let d = &mut self.daemons[slot];
        d.engine = Some(Daemon::new(settings, m));
        d.asleep = false;
        d.stopping = false;
        d.backlog.clear();
        d.client_backlog.clear();
        d.deadline = None;
        self.note(format!("d{slot} starts (incarnation {inc})"));
        self.after_daemon(slot);
    }

    /// Drains a daemon's outputs and schedules its timer.
    fn after_daemon(&mut self, slot: usize) {
        let now = Instant::from_nanos(self.now);
        let mut transmits = Vec::new();
        let mut events = Vec::new();
        let Some(engine) = self.daemons[slot].engine.as_mut() else {
            return;
        };
        while let Some(t) = engine.poll_transmit(now) {
            transmits.push(t);
        }
        while let Some(ev) = engine.poll_event() {
            events.push(ev);
        }
        #[cfg(debug_assertions)]
        engine.check_invariants();
        let from = engine.node_id().0;
        let deadline = engine.poll_timeout();
        for t in transmits {
            match t.destination {
                Destination::Node(to) => {
                    self.send_datagram(slot, membership::slot_of(to) as usize, from, &t.payload)
                }
                Destination::Multicast => {
                    for to in 0..self.cfg.daemons {
                        if to != slot {
                            self.send_datagram(slot, to, from, &t.payload);
                        }
                    }
                }
            }
        }
        for ev in events {
            self.daemon_event(slot, ev);
        }
        let d = &mut self.daemons[slot];
        if d.deadline != deadline {
            d.deadline = deadline;
            if let Some(t) = deadline {
                let at = t.as_nanos().max(self.now);
                self.push(at, Ev::Timer { slot });
            }
        }
    }

    fn send_datagram(&mut self, from_slot: usize, to: usize, from: u32, payload: &Bytes) {
        if to >= self.cfg.daemons || to == from_slot {
            return;
        }
        if let Some(side) = &self.partition {
            if side.contains(&from_slot) != side.contains(&to) {
                return;
            }
        }
        let loss = (self.loss_ppm + self.cfg.floor_loss_ppm).min(1_000_000);
        let fragments = self
            .cfg
            .fragment_bytes
            .map_or(1, |f| payload.len().div_ceil(f.max(1)).max(1));
        for _ in 0..fragments {
            if self.rng.random_range(0..1_000_000) < loss {
                return;
            }
        }
        let copies = if self.rng.random_range(0..1_000_000) < self.dup_ppm {
            2
        } else {
            1
        };
        for _ in 0..copies {
            // 100-300 us, with jitter that reorders.
            let delay = self.rng.random_range(100_000..300_000);
            self.push(
                self.now + delay,
                Ev::Datagram {
                    to,
                    from,
                    bytes: payload.clone(),
                },
            );
        }
    }

    fn daemon_event(&mut self, slot: usize, ev: DaemonEvent) {
        match ev {
            DaemonEvent::Frames(session, bytes) => {
                if let Some(c) = self.client_of(slot, session) {
                    self.clients[c].inbox.push_back(bytes);
                    self.schedule_read(c);
                }
            }
            DaemonEvent::Close(session, last) => {
                if let Some(c) = self.client_of(slot, session) {
                    if let Some(b) = last {
                        self.clients[c].inbox.push_back(b);
                    }
                    // Read what is left, then the connection is gone.
                    self.read_all(c);
                    self.end_client(c, "closed by its daemon");
                }
            }
            DaemonEvent::Membership { me, event } => {
                let line = match event {
                    shoal_core::daemon::MembershipChange::View(v) => format!(
                        "d{slot} ({me}) view {} members {:?}",
                        shoal_core::vsync::display_view(v.id),
                        v.members.iter().map(|m| m.0).collect::<Vec<_>>()
                    ),
                    shoal_core::daemon::MembershipChange::Removed { view, reason } => {
                        let view = shoal_core::vsync::display_view(view);
                        format!("d{slot} ({me}) removed from view {view}: {reason:?}")
                    }
                };
                self.note(line);
            }
            DaemonEvent::Stopped => {
                self.note(format!("d{slot} stopped"));
                self.crash(slot, "its daemon stopped");
                let at = self.now + self.rng.random_range(500 * MS..3 * SEC);
                self.push(at, Ev::Fault(Fault::Restart(slot)));
            }
        }
    }

    fn client_of(&self, slot: usize, session: SessionId) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.daemon == slot && c.session == session && c.state != ClientState::Idle)
    }

    fn crash(&mut self, slot: usize, why: &str) {
        self.daemons[slot].engine = None;
        self.daemons[slot].deadline = None;
        self.daemons[slot].backlog.clear();
        self.daemons[slot].client_backlog.clear();
        for c in 0..self.clients.len() {
            if self.clients[c].daemon == slot
                && matches!(
                    self.clients[c].state,
                    ClientState::Connected | ClientState::Connecting
                )
            {
                self.end_client(c, why);
            }
        }
    }

    fn hand_to_daemon(&mut self, slot: usize, input: ClientInput) {
        let d = &mut self.daemons[slot];
        if d.engine.is_none() {
            return;
        }
        if d.asleep {
            d.client_backlog.push_back(input);
            return;
        }
        let now = Instant::from_nanos(self.now);
        d.engine
            .as_mut()
            .expect("checked")
            .handle_client(now, input);
        self.after_daemon(slot);
    }

    // ---- clients ------------------------------------------------------------

    fn schedule_read(&mut self, c: usize) {
        let client = &mut self.clients[c];
        if client.read_scheduled {
            return;
        }
        client.read_scheduled = true;
        let at = (self.now + 20_000).max(client.slow_until);
        self.push(at, Ev::ClientRead { client: c });
    }

    fn read_all(&mut self, c: usize) {
        let mut written = 0;
        let mut frames = Vec::new();
        {
            let client = &mut self.clients[c];
            while let Some(chunk) = client.inbox.pop_front() {
                written += chunk.len();
                client.buf.extend_from_slice(&chunk);
            }
            let mut used = 0;
            while let Ok(Some((f, n))) = client::decode(&client.buf[used..], &Default::default()) {
                used += n;
                frames.push(f);
            }
            client.buf.drain(..used);
        }
        for f in frames {
            self.client_frame(c, f);
        }
        if written > 0 && self.clients[c].state == ClientState::Connected {
            let (slot, session) = (self.clients[c].daemon, self.clients[c].session);
            self.hand_to_daemon(slot, ClientInput::Written(session, written));
        }
    }

    fn client_frame(&mut self, c: usize, frame: Frame) {
        let at_ns = Some(self.now);
        match frame {
            Frame::ConnectOk { private_group } => {
                let client = &mut self.clients[c];
                client.private = Some(private_group);
                client.state = ClientState::Connected;
            }
            Frame::Message {
                sender,
                service,
                groups,
                payload,
            } => {
                let Some(me) = self.clients[c].private.clone() else {
                    return;
                };
                let Some(seq) = parse_seq(&payload) else {
                    self.note(format!("c{c} got a message it cannot parse"));
                    return;
                };
                if sender == me {
                    self.clients[c].unconfirmed.remove(&seq);
                }
                self.records.push(Record::Deliver {
                    client: me,
                    msg: MsgId { sender, seq },
                    service: check_service(service),
                    groups,
                    transitional: false,
                    at_ns,
                });
            }
            Frame::Membership {
                group,
                view_id,
                members,
                transitional,
                quorum,
                ..
            } => {
                let Some(me) = self.clients[c].private.clone() else {
                    return;
                };
                self.records.push(Record::View {
                    client: me,
                    group,
                    view_id,
                    members,
                    transitional,
                    quorum: Some(quorum),
                    at_ns,
                });
            }
            Frame::Error { code, text } => {
                if code == client::code::UNAVAILABLE && self.clients[c].private.is_none() {
                    // Not joined its cluster yet: try again later.
                    self.clients[c].state = ClientState::Idle;
                    let at = self.now + 300 * MS;
                    self.schedule_step(c, at);
                    return;
                }
                self.note(format!("c{c} error {code}: {text}"));
            }
            _ => {}
        }
    }

    fn end_client(&mut self, c: usize, why: &str) {
        let client = &mut self.clients[c];
        if let Some(me) = client.private.take() {
            self.records.push(Record::Ended {
                client: me,
                reason: why.to_string(),
                at_ns: Some(self.now),
            });
        }
        client.state = ClientState::Idle;
        client.groups.clear();
        client.inbox.clear();
        client.buf.clear();
        client.unconfirmed.clear();
        let at = self.now + self.rng.random_range(200 * MS..2 * SEC);
        self.schedule_step(c, at);
    }

    fn client_step(&mut self, c: usize) {
        if self.now >= self.quiet_from {
            return;
        }
        let state = self.clients[c].state;
        let slot = self.clients[c].daemon;
        match state {
            ClientState::Idle => {
                let d = &mut self.daemons[slot];
                if d.engine.is_none() {
                    let at = self.now + 500 * MS;
                    self.schedule_step(c, at);
                    return;
                }
                let session = d.next_session;
                d.next_session += 1;
                let client = &mut self.clients[c];
                client.generation += 1;
                client.name = format!("c{c}x{}", client.generation);
                client.session = session;
                client.seq = 0;
                client.state = ClientState::Connecting;
                let name = client.name.clone();
                self.hand_to_daemon(
                    slot,
                    ClientInput::Opened {
                        id: session,
                        tcp: false,
                    },
                );
                let connect = Frame::Connect {
                    name,
                    token: String::new(),
                };
                self.hand_to_daemon(slot, ClientInput::Frame(session, connect));
                let at = self.now + 50 * MS;
                self.schedule_step(c, at);
            }
            ClientState::Connecting => {
                let at = self.now + 50 * MS;
                self.schedule_step(c, at);
            }
            ClientState::Connected => {
                self.client_action(c);
                let gap = if self.liveness { 50 * MS } else { 20 * MS };
                let at = self.now + self.rng.random_range(gap / 2..gap * 2);
                self.schedule_step(c, at);
            }
        }
    }

    fn client_action(&mut self, c: usize) {
        let slot = self.clients[c].daemon;
        let session = self.clients[c].session;
        let roll = self.rng.random_range(0..100);
        let quiet = self.liveness;
        if self.clients[c].groups.is_empty() || roll < 8 {
            let g = GROUPS[self.rng.random_range(0..GROUPS.len())].to_string();
            if self.clients[c].groups.insert(g.clone()) {
                self.hand_to_daemon(slot, ClientInput::Frame(session, Frame::Join { group: g }));
            }
            return;
        }
        if roll < 11 && !quiet {
            let g = self.clients[c]
                .groups
                .iter()
                .next()
                .cloned()
                .expect("non-empty");
            self.clients[c].groups.remove(&g);
            self.hand_to_daemon(slot, ClientInput::Frame(session, Frame::Leave { group: g }));
            return;
        }
        if roll < 12 && !quiet {
            self.note(format!("c{c} disconnects"));
            self.hand_to_daemon(slot, ClientInput::Frame(session, Frame::Disconnect));
            self.read_all(c);
            self.end_client(c, "disconnected");
            return;
        }
        // A multicast to one of its groups, or to two groups.
        let mut groups: Vec<String> = vec![self.pick_group(c)];
        if self.rng.random_range(0..4) == 0 {
            let other = GROUPS[self.rng.random_range(0..GROUPS.len())].to_string();
            if !groups.contains(&other) {
                groups.push(other);
            }
        }
        let service = Service::ALL[self.rng.random_range(0..Service::ALL.len())];
        let size = match self.rng.random_range(0..50) {
            0 => self.rng.random_range(70_000..200_000),
            1..=5 => self.rng.random_range(1_000..10_000),
            _ => self.rng.random_range(16..200),
        };
        let client = &mut self.clients[c];
        client.seq += 1;
        let seq = client.seq;
        let me = client.private.clone().expect("connected");
        if service as u8 >= Service::Reliable as u8 {
            client.unconfirmed.insert(seq);
        }
        let payload = make_payload(seq, size);
        self.records.push(Record::Send {
            client: me.clone(),
            msg: MsgId { sender: me, seq },
            service: check_service(service),
            groups: groups.clone(),
            at_ns: Some(self.now),
        });
        let frame = Frame::Multicast {
            service,
            groups,
            payload,
        };
        self.hand_to_daemon(slot, ClientInput::Frame(session, frame));
    }

    fn pick_group(&mut self, c: usize) -> String {
        let groups: Vec<&String> = self.clients[c].groups.iter().collect();
        groups[self.rng.random_range(0..groups.len())].clone()
    }

    // ---- faults -------------------------------------------------------------

    fn schedule_faults(&mut self) {
        for (at, scripted) in self.cfg.script.clone() {
            let fault = match scripted {
                Scripted::Sleep(d, dur) => Fault::Sleep(d, dur.as_nanos() as u64),
                Scripted::Crash(d) => Fault::Crash(d),
                Scripted::Partition(side) => Fault::Partition(side),
                Scripted::Heal => Fault::Heal,
                Scripted::Stop(d) => Fault::Stop(d),
            };
            self.faults_drawn
                .push(format!("{:.3} s {fault:?} (scripted)", at.as_secs_f64()));
            self.push(at.as_nanos() as u64, Ev::Fault(fault));
        }
        let end = self.cfg.fault_phase.as_nanos() as u64;
        let kinds = self.cfg.faults;
        let n = self.cfg.daemons;
        let count = self.rng.random_range(2..=8) * self.cfg.fault_count_factor.max(1);
        for _ in 0..count {
            let at = self.rng.random_range(3 * SEC..end.max(3 * SEC + 1));
            let slot = self.rng.random_range(0..n);
            let fault = match self.rng.random_range(0..6) {
                0 if kinds.crashes => Fault::Crash(slot),
                1 if kinds.sleeps => {
                    // Short, or long enough to be evicted.
                    let ms = if self.rng.random_bool(0.5) {
                        self.rng.random_range(50..800)
                    } else {
                        self.rng.random_range(2_000..8_000)
                    };
                    Fault::Sleep(slot, ms * MS)
                }
                2 if kinds.partitions && n > 1 => {
                    let mut side: Vec<usize> =
                        (0..n).filter(|_| self.rng.random_bool(0.5)).collect();
                    if side.is_empty() || side.len() == n {
                        side = vec![slot];
                    }
                    Fault::Partition(side)
                }
                3 if kinds.network => Fault::Network {
                    loss_ppm: self.rng.random_range(0..50_000),
                    dup_ppm: self.rng.random_range(0..20_000),
                },
                4 if kinds.slow_clients => {
                    let c = self.rng.random_range(0..self.clients.len());
                    Fault::Slow(c, self.rng.random_range(200..5_000) * MS)
                }
                5 if kinds.stops => Fault::Stop(slot),
                _ => continue,
            };
            self.faults_drawn
                .push(format!("{:.3} s {fault:?}", at as f64 / 1e9));
            self.push(at, Ev::Fault(fault));
        }
    }

    fn fault(&mut self, fault: Fault) {
        self.note(format!("fault {fault:?}"));
        match fault {
            Fault::Crash(slot) => {
                if self.daemons[slot].engine.is_some() {
                    self.crash(slot, "its daemon crashed");
                    let at = self.now + self.rng.random_range(500 * MS..5 * SEC);
                    self.push(at, Ev::Fault(Fault::Restart(slot)));
                }
            }
            Fault::Restart(slot) => {
                if self.daemons[slot].engine.is_none() {
                    self.start_daemon(slot);
                }
            }
            Fault::Sleep(slot, dur) => {
                if self.daemons[slot].engine.is_some() && !self.daemons[slot].asleep {
                    self.daemons[slot].asleep = true;
                    let at = self.now + dur;
                    self.push(at, Ev::Fault(Fault::Wake(slot)));
                }
            }
            Fault::Wake(slot) => self.wake(slot),
            Fault::Partition(side) => {
                self.partition = Some(side);
                let at = self.now + self.rng.random_range(SEC..6 * SEC);
                self.push(at, Ev::Fault(Fault::Heal));
            }
            Fault::Heal => self.partition = None,
            Fault::Network { loss_ppm, dup_ppm } => {
                self.loss_ppm = loss_ppm;
                self.dup_ppm = dup_ppm;
            }
            Fault::Slow(c, dur) => {
                self.clients[c].slow_until = self.now + dur;
            }
            Fault::Stop(slot) => {
                let now = Instant::from_nanos(self.now);
                let d = &mut self.daemons[slot];
                if let (Some(engine), false) = (d.engine.as_mut(), d.asleep) {
                    d.stopping = true;
                    engine.begin_shutdown(now);
                    self.after_daemon(slot);
                }
            }
            Fault::Liveness => {
                self.liveness = true;
                self.partition = None;
                self.loss_ppm = 0;
                self.dup_ppm = 0;
                for slot in 0..self.cfg.daemons {
                    if self.daemons[slot].asleep {
                        self.wake(slot);
                    }
                    if self.daemons[slot].engine.is_none() {
                        self.start_daemon(slot);
                    }
                }
                for c in &mut self.clients {
                    c.slow_until = 0;
                }
            }
        }
    }

    fn wake(&mut self, slot: usize) {
        if !self.daemons[slot].asleep {
            return;
        }
        self.daemons[slot].asleep = false;
        let now = Instant::from_nanos(self.now);
        let backlog: Vec<_> = self.daemons[slot].backlog.drain(..).collect();
        let inputs: Vec<_> = self.daemons[slot].client_backlog.drain(..).collect();
        // As the real daemon's loop takes them after SIGCONT: client input
        // first, then the datagrams, then its timers.
        if let Some(engine) = self.daemons[slot].engine.as_mut() {
            for input in inputs {
                engine.handle_client(now, input);
            }
            for (from, bytes) in backlog {
                engine.handle_datagram_bytes(now, NodeId(from), &bytes);
            }
            engine.handle_timeout(now);
        }
        self.after_daemon(slot);
    }

    // ---- the loop -------------------------------------------------------------

    fn handle(&mut self, ev: Ev) {
        self.events += 1;
        let now = Instant::from_nanos(self.now);
        match ev {
            Ev::Datagram { to, from, bytes } => {
                let d = &mut self.daemons[to];
                let Some(engine) = d.engine.as_mut() else {
                    return;
                };
                if d.asleep {
                    // The socket buffer holds a few hundred datagrams.
                    if d.backlog.len() < 512 {
                        d.backlog.push_back((from, bytes));
                    }
                    return;
                }
                (from, bytes.len()).hash(&mut self.hasher);
                engine.handle_datagram_bytes(now, NodeId(from), &bytes);
                self.after_daemon(to);
            }
            Ev::Timer { slot } => {
                let d = &mut self.daemons[slot];
                if d.asleep || d.deadline.is_none_or(|t| t.as_nanos() > self.now) {
                    return;
                }
                let Some(engine) = d.engine.as_mut() else {
                    return;
                };
                d.deadline = None;
                engine.handle_timeout(now);
                self.after_daemon(slot);
            }
            Ev::ClientStep { client, step } => {
                if step == self.clients[client].step {
                    self.client_step(client);
                }
            }
            Ev::ClientRead { client } => {
                self.clients[client].read_scheduled = false;
                if self.clients[client].slow_until > self.now {
                    self.schedule_read(client);
                    return;
                }
                self.read_all(client);
            }
            Ev::Fault(f) => self.fault(f),
        }
    }

    /// After the liveness phase: one view of every daemon, everywhere.
    fn converged(&self) -> (bool, Option<String>) {
        let mut views = BTreeMap::new();
        for (slot, d) in self.daemons.iter().enumerate() {
            let Some(engine) = &d.engine else {
                return (false, Some(format!("d{slot} is not running")));
            };
            let m = engine.membership();
            if !m.is_member() {
                return (false, Some(format!("d{slot} is not a member")));
            }
            if !engine.sessions().holds_table() {
                return (false, Some(format!("d{slot} still waits for its table")));
            }
            views.insert(slot, (m.vsync().view_id(), m.vsync().members().len()));
        }
        let first = views.values().next().copied();
        if views.values().any(|v| Some(*v) != first)
            || first.is_some_and(|(_, n)| n != self.cfg.daemons)
        {
            return (false, Some(format!("daemons' views differ: {views:?}")));
        }
        // One view, but a daemon still far behind in the total order (under
        // heavy loss, repair may not have caught up by the end): what its
        // clients miss is then a matter of time, and the run says so.
        let next: Vec<u64> = self
            .daemons
            .iter()
            .filter_map(|d| d.engine.as_ref())
            .map(|e| e.membership().vsync().next_gseq())
            .collect();
        let ahead = next.iter().copied().max().unwrap_or(0);
        if let Some(slot) = next.iter().position(|n| n + DELIVERY_LAG_MAX < ahead) {
            let behind = next[slot];
            return (
                false,
                Some(format!(
                    "d{slot} still delivering: next gseq {behind}, another daemon's {ahead}"
                )),
            );
        }
        (true, None)
    }
}

fn make_payload(seq: u64, size: usize) -> Vec<u8> {
    let mut p = seq.to_be_bytes().to_vec();
    p.resize(size.max(8), 0xAB);
    p
}

fn parse_seq(payload: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(payload.get(..8)?.try_into().ok()?))
}

fn check_service(s: Service) -> shoal_check::Service {
    use shoal_check::Service as C;
    match s {
        Service::Unreliable => C::Unreliable,
        Service::Probabilistic => C::Probabilistic,
        Service::Reliable => C::Reliable,
        Service::Fifo => C::Fifo,
        Service::Causal => C::Causal,
        Service::Agreed => C::Agreed,
        Service::Safe => C::Safe,
    }
}

/// What a caller fixes of every seed's drawn shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    pub daemons: Option<usize>,
    pub clients_per_daemon: Option<usize>,
    pub no_faults: bool,
    /// Daemons with `[qsm]` on.
    pub qsm: bool,
    /// [`SwarmConfig::qsm_hybrid`].
    pub qsm_hybrid: bool,
    /// A fault phase of this length instead of the drawn 10-25 s, with
    /// proportionally more faults (one drawn count per 17.5 s, the drawn
    /// phase's mean): the long runs that find what builds up over time.
    pub fault_phase: Option<Duration>,
    /// [`SwarmConfig::floor_loss_ppm`].
    pub floor_loss_ppm: u32,
    /// [`SwarmConfig::fragment_bytes`].
    pub fragment_bytes: Option<usize>,
    /// [`SwarmConfig::view_period`].
    pub view_period: Option<Duration>,
    /// [`SwarmConfig::repair_done_apart`].
    pub repair_done_apart: bool,
}

/// Runs seeds `seeds` on `threads` threads; returns outcomes in seed order.
pub fn run_seeds(seeds: std::ops::Range<u64>, threads: usize) -> Vec<Outcome> {
    run_seeds_shaped(seeds, threads, Shape::default())
}

/// As [`run_seeds`], with `shape` overriding what each seed draws.
pub fn run_seeds_shaped(seeds: std::ops::Range<u64>, threads: usize, shape: Shape) -> Vec<Outcome> {
    let seeds: Vec<u64> = seeds.collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(seed) = seeds.get(i) else { break };
                let mut cfg = SwarmConfig::from_seed(*seed);
                cfg.daemons = shape.daemons.unwrap_or(cfg.daemons);
                cfg.clients_per_daemon = shape.clients_per_daemon.unwrap_or(cfg.clients_per_daemon);
                if shape.no_faults {
                    cfg.faults = FaultKinds::NONE;
                }
                cfg.qsm = shape.qsm;
                cfg.qsm_hybrid = shape.qsm_hybrid;
                cfg.floor_loss_ppm = shape.floor_loss_ppm;
                cfg.fragment_bytes = shape.fragment_bytes;
                cfg.view_period = shape.view_period;
                cfg.repair_done_apart = shape.repair_done_apart;
                if let Some(phase) = shape.fault_phase {
                    cfg.fault_phase = phase;
                    cfg.fault_count_factor = (phase.as_secs_f64() / 17.5).round().max(1.0) as u32;
                }
                let outcome = run(cfg);
                results.lock().expect("not poisoned").push(outcome);
            });
        }
    });
    let mut all = results.into_inner().expect("not poisoned");
    all.sort_by_key(|o| o.seed);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds that pass today, covering every fault kind between them: a
    /// change that breaks one of them is a regression.
    const GREEN: [u64; 8] = [2, 3, 5, 6, 7, 9, 10, 12];

    fn describe(o: &Outcome) -> String {
        format!(
            "seed {}: converged {} ({:?})\n{}\nfaults: {}\ntrace tail:\n{}",
            o.seed,
            o.converged,
            o.liveness,
            o.report,
            o.faults_drawn.join("; "),
            o.trace_tail.join("\n")
        )
    }

    #[test]
    fn a_seed_gives_the_same_run() {
        let a = run(SwarmConfig::from_seed(3));
        let b = run(SwarmConfig::from_seed(3));
        assert_eq!(a.trace_hash, b.trace_hash);
        assert_eq!(a.events, b.events);
    }

    /// Datagrams in fragments at 5% loss each (43% of the engines' 16 KB
    /// datagrams lost) and reordered: the committee's primary once answered
    /// each reordered replica ack by sending the whole replication window
    /// again, each datagram of which drew another ack. These seeds ran
    /// 240,000 to 1,560,000 events (one took 8.5 GB in a longer run); with
    /// the resend left to the heartbeat, 81,000 to 100,000. Counted in
    /// events, which the seed fixes, not in time.
    #[test]
    fn reordered_replica_acks_under_heavy_loss_do_not_storm() {
        for seed in [1, 2, 4] {
            let mut cfg = SwarmConfig::from_seed(seed);
            cfg.daemons = 5;
            cfg.clients_per_daemon = 1;
            cfg.floor_loss_ppm = 50_000;
            cfg.fragment_bytes = Some(1472);
            let o = run(cfg);
            assert!(o.events < 200_000, "seed {seed}: {} events", o.events);
        }
    }

    /// Under 5% loss on every fragment (43% of 16 KB datagrams lost), two
    /// daemons of a minority component merge back. One had been told the
    /// gseq of the other's batch and held it behind a `safe` message; its
    /// sender had not, took the batch for unsequenced and sent it again
    /// after the rejoin: the holder gave the held copy to its clients in
    /// their transitional views and the new order's copy after. Now a
    /// daemon cut off sends nothing it had in flight again: its messages go
    /// to its clients' transitional views (`Sessions::cut_off_in_flight`).
    /// (This seed still fails to converge and breaks `safe` under this
    /// loss: not traced.)
    #[test]
    fn a_batch_sent_again_after_a_merge_is_not_delivered_twice() {
        let mut cfg = SwarmConfig::from_seed(10);
        cfg.floor_loss_ppm = 50_000;
        cfg.fragment_bytes = Some(1472);
        let o = run(cfg);
        assert_eq!(
            o.report.count(shoal_check::Kind::Duplicate),
            0,
            "{}",
            describe(&o)
        );
    }

    /// Under 5% loss on every fragment, with 60 s of faults: d0 was cut
    /// off, and its old cluster, still listing the dropped incarnation,
    /// began an epoch of view ids with slot 0 as owner; d0 later founded a
    /// group alone and counted on from the same epoch, so one view id of
    /// `g2` came with two member lists (`view-membership`). A lone founder
    /// now starts its epoch from the clock (fix 40).
    #[test]
    fn a_founder_never_names_a_view_as_its_old_cluster_did() {
        assert_ok_under_heavy_loss(123);
    }

    /// The harshest shape (`--daemons 5 --floor-loss 0.05 --fragment-bytes
    /// 1472 --fault-phase 60`): 43% of the daemons' datagrams lost.
    fn heavy_loss(seed: u64) -> SwarmConfig {
        let mut cfg = SwarmConfig::from_seed(seed);
        cfg.daemons = 5;
        cfg.floor_loss_ppm = 50_000;
        cfg.fragment_bytes = Some(1472);
        cfg.fault_phase = Duration::from_secs(60);
        cfg.fault_count_factor = 3; // as `--fault-phase 60` sets it
        cfg
    }

    fn assert_ok_under_heavy_loss(seed: u64) {
        assert_run_ok(heavy_loss(seed));
    }

    fn assert_run_ok(cfg: SwarmConfig) {
        let o = run(cfg);
        assert!(o.ok(), "{}", describe(&o));
    }

    /// d1 joined at view 6 while the others kept their `safe` batches
    /// held (fix 37) across view 7 and released them at view 8, in
    /// transitional views; d1's table, made in that release, said "a
    /// release" but not at which view, and d1 released at view 7, the
    /// first after the table's point: its client delivered in regular
    /// views what the others' delivered a view later in transitional ones
    /// (`virtual-synchrony`). The table now names the view (fix 42).
    #[test]
    fn a_joiner_releases_at_the_view_the_others_released_at() {
        assert_ok_under_heavy_loss(197);
    }

    /// Fix 45 (seeds 9, 55 and 86 of the harshest shape, `not converged`):
    /// two daemons of a view of four crashed or left and came back under
    /// new ids; the two left could never gather the old view's majority,
    /// and waited out `view_period + partition_grace` (25 s) before
    /// starting over, too late to converge by the end of the run. A member
    /// now leaves at once when a majority of its view is heard under newer
    /// ids (`majority_gone_deadline`).
    #[test]
    fn members_leave_a_view_whose_majority_restarted() {
        for seed in [9, 55, 86] {
            assert_ok_under_heavy_loss(seed);
        }
    }

    /// Plain shape, seeds 3972 and 6514: two groups formed apart both
    /// admitted the same joiners, so each listed daemons of the other.
    /// With both numbering their records and views from 0, members took
    /// the other group's records for their own at the same global
    /// sequence numbers (3972: d0's own batches never came back and were
    /// sent again behind later ones, `fifo` and `causal`) and installed
    /// the other group's view (6514: d2 waited for its table to the end).
    /// Each group founded alone now numbers apart (fix 47).
    #[test]
    fn two_groups_formed_apart_never_take_each_others_records() {
        assert_ok(3972);
        assert_ok(6514);
    }

    /// Harshest shape, seed 454: d3 was cut off at 15.8 s while its
    /// client `c6` was in the transitional view of a deferred removal of
    /// `g2`, holding a `safe` message it had acknowledged; the others found
    /// it stable and delivered it in that view. The cut-off walk showed `c6`
    /// the regular view that ends it at once, and `c6` was gone before d3
    /// was back to deliver the message in its own transitional view
    /// (`safe`). The view now waits for the daemon's return (fix 46).
    #[test]
    fn a_client_cut_off_in_a_transitional_view_stays_there_until_its_daemon_is_back() {
        assert_ok_under_heavy_loss(454);
    }

    /// Harshest shape, seeds 811 and 837 (`view-membership`): d4 joined and
    /// installed its table on arrival, while the others applied its table
    /// item only once the `safe` batches held before it went. At the next
    /// view change (d2 left) the others still counted d4 as waiting for its
    /// table and released at once in transitional views without d2's
    /// clients; d4 counted itself settled, deferred, and showed its
    /// client that transitional view only two views later, without d0's
    /// clients too: one view id, two member lists. A joiner now counts
    /// itself settled at its own table item in the order (fix 48).
    #[test]
    fn a_joiner_is_settled_where_the_others_apply_its_table() {
        for seed in [811, 837] {
            assert_ok_under_heavy_loss(seed);
        }
    }

    /// Harshest shape, seed 655 (`view-membership`): d2, the primary, had
    /// its Newview for view 9 accepted by itself, d1 and d4 (a majority of
    /// five) and installed it; d1, its backup, took over across a partition
    /// and asked d1, d3 and d0, which reported no Newview, while its own
    /// acceptance was left out of its reports, and chose a second view 9.
    /// A primary's own accepted Newview now counts as a report (fix 49).
    #[test]
    fn a_takeover_counts_what_its_own_member_accepted() {
        assert_ok_under_heavy_loss(655);
    }

    /// Harshest shape, seed 281 (with fix 49; `not converged`, and the
    /// messages still held at the end, `own-delivery` and `silent-loss`):
    /// d0 founded a group alone and d1 and d3 joined it, while d2's view
    /// of four still listed d0 and d3; with d4 dropped (and back under a
    /// new id), d2 could gather no majority and waited out `view_period +
    /// partition_grace` before merging, too late to converge. A listed
    /// daemon heard as a member of another group now counts as gone, as
    /// one back under a new id does (fix 50): d0's presence and d4's new
    /// id make two of four, and d2 leaves at once.
    #[test]
    fn a_member_leaves_a_view_whose_majority_joined_another_group() {
        assert_ok_under_heavy_loss(281);
    }

    /// Harshest shape, seeds 209 and 59 (`not converged`): with the faults
    /// over but 5% loss on every fragment still on, a live daemon's
    /// acknowledgement of a periodic view change and its one retry were
    /// both lost, and the primary dropped it 0.2 s before the run ended.
    /// The primary, which heard the daemon during the change, now asks it
    /// once more and waits one more `ack_wait` (fix 51,
    /// `ask_heard_again`).
    #[test]
    fn a_live_daemon_whose_acks_were_lost_is_asked_again() {
        for seed in [59, 209] {
            assert_ok_under_heavy_loss(seed);
        }
    }

    /// Harshest shape, seed 895 (`not converged`): the settled daemons of a
    /// view crashed before sending the three joiners among them their
    /// tables, and the daemons restarted meanwhile joined too; each joiner
    /// learned that every other daemon waits as well only at a view, and
    /// the one after the last snapshot was the periodic view 20 s later.
    /// A joiner now knows it when that snapshot is ordered (fix 52).
    #[test]
    fn joiners_start_over_once_the_last_fellow_joiner_is_known_to_wait() {
        assert_ok_under_heavy_loss(895);
    }

    /// Not fixed: with a repair answer's end sent apart in the short-view
    /// shape (unfragmented; fix 41 as first landed turned it on for every
    /// daemon), these seeds fail `safe` (974: d2's client delivered a safe
    /// message in a regular view at view 5 that listed d4, which had been
    /// cut off since view 3 and never installed views 4 or 5). The
    /// timing, not the setting, draws them: the class fix 40's notes leave
    /// open (seed 148 under loss). A fix (43) was tried and reverted
    /// (`docs/reliability.md`).
    #[test]
    #[ignore]
    fn safe_in_a_view_listing_a_daemon_that_never_installs_it() {
        for seed in [974, 1243, 2270] {
            let mut cfg = short_views(seed);
            cfg.repair_done_apart = true;
            assert_run_ok(cfg);
        }
    }

    /// Fix 44 (seed 1283 in the same shape): d2, the committee's primary,
    /// sequenced a batch of d0's and crashed; d1 took over, put view 10's
    /// Newview at that gseq and sequenced the batch again after it, and
    /// crashed too; d0, which had missed d1's replicas after the Newview,
    /// took over with d2's stale records still in its store after it. It
    /// counted the local ids in them as sequenced and answered d0's own
    /// Gseq Req for the batch as a duplicate it had no record of: one
    /// `fifo` message never reached the order (`own-delivery`). A takeover
    /// now cuts its store at the first record after the latest Newview
    /// written in an older epoch than the Newview's. The timing that drew
    /// it came from fix 43, since reverted: on the code as it stands this
    /// seed passes with or without fix 44, so it guards the shape, and the
    /// committee's unit test (`first_stale_after_newview`) the rule.
    #[test]
    fn a_takeover_drops_an_older_primarys_records_after_the_newview() {
        let mut cfg = short_views(1283);
        cfg.repair_done_apart = true;
        assert_run_ok(cfg);
    }

    #[test]
    fn a_quiet_cluster_is_clean_and_converges() {
        let mut cfg = SwarmConfig::from_seed(1);
        cfg.faults = FaultKinds::NONE;
        cfg.daemons = 3;
        let o = run(cfg);
        assert!(o.converged, "{:?}", o.liveness);
        assert!(o.report.summary.deliveries > 0, "{}", o.report);
        assert!(o.report.is_clean(), "{}", o.report);
    }

    /// The first failure the daemon-engine work set out to fix: a daemon
    /// stopped long enough to be evicted while its client keeps writing.
    /// What the client wrote must be delivered after the rejoin (or the
    /// client told). Scripted, so it needs no lucky seed.
    #[test]
    fn what_a_client_writes_while_its_daemon_sleeps_past_eviction_is_delivered() {
        let mut cfg = SwarmConfig::from_seed(4242);
        cfg.daemons = 3;
        cfg.clients_per_daemon = 1;
        cfg.fault_phase = Duration::from_secs(15);
        cfg.faults = FaultKinds::NONE;
        cfg.script = vec![(
            Duration::from_secs(6),
            Scripted::Sleep(2, Duration::from_secs(6)),
        )];
        let o = run(cfg);
        eprintln!("{}", describe(&o));
        assert!(o.report.summary.sends > 100, "{}", describe(&o));
        assert!(o.ok(), "{}", describe(&o));
    }

    #[test]
    fn the_green_seeds_stay_clean_under_every_fault_kind() {
        let outcomes: Vec<Outcome> = GREEN
            .iter()
            .map(|seed| run(SwarmConfig::from_seed(*seed)))
            .collect();
        let drawn: String = outcomes
            .iter()
            .flat_map(|o| o.faults_drawn.clone())
            .collect();
        for kind in ["Crash", "Sleep", "Partition", "Network", "Slow", "Stop"] {
            assert!(drawn.contains(kind), "no {kind} among the green seeds");
        }
        for o in &outcomes {
            assert!(o.ok(), "{}", describe(o));
        }
    }

    // Seeds the swarm found failing that are not fixed yet, one per class
    // (docs/reliability.md), ignored; each asserts the guarantee, so it
    // fails today (`cargo test -p shoal-sim swarm -- --ignored`); and
    // seeds that failed and are fixed, not ignored.

    fn assert_ok(seed: u64) {
        let o = run(SwarmConfig::from_seed(seed));
        assert!(o.ok(), "{}", describe(&o));
    }

    /// A run shaped like the long schedule across hosts: 5 daemons, the
    /// daemons' periodic view change every 2 s (`--daemons 5
    /// --view-period-ms 2000`).
    fn short_views(seed: u64) -> SwarmConfig {
        let mut cfg = SwarmConfig::from_seed(seed);
        cfg.daemons = 5;
        cfg.view_period = Some(Duration::from_secs(2));
        cfg
    }

    fn assert_ok_with_short_views(seed: u64) {
        assert_run_ok(short_views(seed));
    }

    /// A daemon (d0) joined and left the view before the table a settled
    /// member sent it was ordered; every daemon still counted it settled
    /// when the table came, and so, with the lowest slot, the designated
    /// sender of later joiners' tables: the two daemons that joined next
    /// waited for ever and their clients delivered nothing (fix 36).
    #[test]
    fn a_table_for_a_daemon_that_left_does_not_make_it_the_designated_sender() {
        assert_ok_with_short_views(234);
    }

    /// A daemon cut off while its clients were in the transitional view of
    /// a deferred removal (fix 35) ended that view with the regular view of
    /// the next id, which the others showed after delivering more held
    /// batches in it (`virtual-synchrony`); and its removal of the gone
    /// daemons' clients, never applied, put its later view ids out of step
    /// with the others' (`view-membership`). Now it walks the deferred
    /// removals in their place among the held batches and ends such a view
    /// under an id of its own.
    #[test]
    fn a_daemon_cut_off_during_a_deferred_removal_keeps_its_view_ids_in_step() {
        assert_ok_with_short_views(497);
    }

    /// The same, for a client whose leave was among the held batches: it
    /// was shown no regular view before its daemon's own transitional one
    /// (`transitional`: a transitional view right after another).
    #[test]
    fn a_client_that_left_during_a_deferred_removal_gets_a_regular_view_before_its_own_transitional_one(
    ) {
        assert_ok_with_short_views(640);
    }

    /// A view that added daemons released every held `safe` batch at
    /// once, in regular views, although a stale incarnation listed in it
    /// (d4's, which never installed the view) never said it held them.
    /// Now such a view keeps them held (fix 37).
    #[test]
    fn a_view_that_adds_daemons_releases_safe_batches_only_once_every_daemon_holds_them() {
        assert_ok_with_short_views(548);
    }

    /// The same at a periodic view while the joiners waited for their
    /// tables (fix 37's first version judged a joiner that had crashed
    /// before its snapshot, with no clients, among the daemons kept: every
    /// delivery waited, and the daemons without tables churned past the
    /// deadline).
    #[test]
    fn a_joiner_without_clients_does_not_hold_back_safe_batches() {
        assert_ok(396);
    }

    /// A client on a daemon back from an eviction was listed in `g2` twice,
    /// under the daemon's stale incarnation (kept until the view that
    /// dropped it) and its new one; it left `g2` during the release of
    /// held batches at that view, and the view that said so still listed
    /// it (names are per client), so it never heard it had left; the
    /// checker then held another member to a `safe` message delivered to
    /// it through `g0`. A leave (and a disconnect) now takes the client's
    /// entries under earlier incarnations of its daemon too (fix 38).
    #[test]
    fn a_client_that_leaves_while_listed_under_a_stale_incarnation_hears_it_left() {
        assert_ok_with_short_views(1220);
    }

    /// A causal message of a client that had just joined `g2` was never
    /// delivered, not to its sender either (`own-delivery`). d1, cut off
    /// at 10.1 s, founded a group of its own at 13.9 s with one cut-off
    /// batch left over (no client had been shown a view of its groups, so
    /// nothing took it); dropped again at 16.4 s, it took itself for still
    /// cut off and skipped the group changes held behind an unstable `safe`
    /// batch, c3x82's re-join of g2 among them, so its message to g2 after
    /// that join went to nobody (fix 39: a founder back from a cut takes
    /// its cut-off batches whether or not a client was shown a view).
    #[test]
    fn a_message_after_a_join_on_a_returning_daemon_reaches_its_sender() {
        assert_ok_with_short_views(51);
    }

    // Seeds past 200 that fail (the 10,000-seed run, docs/reliability.md,
    // "Still failing"), pinned until fixed.

    /// A client joins `g1` and sends a `safe` message to it; its daemon,
    /// cut off by a partition, still held both batches behind an unstable
    /// `safe` one. The others applied the join and delivered the message in
    /// a regular view listing the client; the cut-off daemon handed its
    /// clients only the held messages of groups they had been shown, so the
    /// sender neither saw that view nor got its own message. Now the joiner
    /// is shown that view at the cut, then its own transitional view.
    #[test]
    fn a_join_held_at_a_cut_off_is_shown_to_its_client() {
        assert_ok(279);
    }

    /// Also a join held behind an unstable `safe` batch at a cut-off (the
    /// `safe` class past seed 200: 4069, 5419 and 9148 had this cause).
    #[test]
    fn a_message_after_a_held_join_reaches_the_joiner_in_its_transitional_view() {
        assert_ok(4069);
    }

    /// A daemon joined while the others held batches behind an unstable
    /// `safe` one; its table's point fell while they applied those at the
    /// view that dropped a crashed daemon, in transitional views. The
    /// joiner applied the rest of the old view's batches as they came, in
    /// the regular view: one view id, two sets of messages before its
    /// transitional view (`virtual-synchrony`, seeds 4727 and 5836). The
    /// table now says so and the joiner applies them at that view too.
    #[test]
    fn a_table_made_during_a_release_at_a_view_has_its_joiner_release_alike() {
        assert_ok(4727);
        assert_ok(5836);
    }

    /// A primary installed a view admitting two restarted daemons and
    /// left; the two members of the old view of four that stayed lacked
    /// its last records and could never be a majority of it. The backup
    /// that took over now asks the joiners, one of which installed the
    /// view, and completes it (not converged before).
    #[test]
    fn a_takeover_completes_a_newview_that_joiners_installed() {
        assert_ok(1888);
    }

    /// A primary alone with a crashed member of a view of two: the group
    /// formed meanwhile by the restarted daemons merged into it, and
    /// everything stood still for 25 s. Such a primary now leaves its
    /// group once its view change has been under way for the partition
    /// grace (not converged, own-delivery and silent-loss before), counted
    /// in asks made awake: counted in time, a primary that slept through
    /// the grace left on waking, before hearing that its group had moved
    /// on, and its new client's joins were lost (3911).
    #[test]
    fn a_primary_without_its_majority_leaves_its_group_after_the_grace() {
        assert_ok(4166);
        assert_ok(5316);
        assert_ok(3911);
    }

    /// A daemon rejoined and its designated table sender (the lowest slot)
    /// slept and was dropped before sending it; another member sent the
    /// table as of the view without it, so the joiner never applied what
    /// the old view delivered after its snapshot, its own client's `safe`
    /// messages among them, which the others delivered in a transitional
    /// view listing that client (seeds 8281 and 5833).
    #[test]
    fn a_table_sent_again_is_as_of_the_joiners_snapshot() {
        assert_ok(8281);
    }

    /// One partition of one daemon under loss and duplication: an `agreed`
    /// message of its client was delivered nowhere, not even to the
    /// sender. Its batch was in flight at the cut; it now goes to the
    /// daemon's clients in their transitional views.
    #[test]
    fn a_message_in_flight_at_a_cut_reaches_its_sender_or_is_reported() {
        assert_ok(537);
    }

    /// A client left `g1`, joined it again and sent to it while its daemon
    /// slept; the leave was ordered, the join and the message were in
    /// flight when the daemon was cut off. At the cut-off the message
    /// reached the others' transitional views but not its sender, who had
    /// sent it as a member for all it had been shown; it now goes again
    /// after the rejoin, behind the join.
    #[test]
    fn a_message_sent_behind_a_join_in_flight_at_a_cut_reaches_its_sender() {
        assert_ok(1339);
    }

    /// Crash, sleep, partitions and a stop under loss and duplication: a
    /// client delivers its own `safe` message 20 after its 33, and another
    /// sender's 64 after its 72 (FIFO and causal order broken at one
    /// daemon). d2, restarted, took in a repair answer another group's
    /// committee member sent to its slot's previous process (datagrams go
    /// by slot); seeds 3350 and 4490 (fifo, causal) are the same class
    /// (3350 traced: 42 foreign records took a restarted founder's gseqs,
    /// its own were dropped as duplicates and delivered out of order at the
    /// next view). A member now ignores repair answers from outside its
    /// view that it did not ask for (`vsync`, `foreign_answer`).
    #[test]
    fn fifo_and_causal_order_hold_across_cuts_under_loss() {
        assert_ok(1545);
        assert_ok(3350);
        assert_ok(4490);
    }

    // Seeds that failed and are fixed, pinned as regressions.

    /// Two daemons, one crashes: the survivor could not install a view
    /// without a majority and the restarted one never got in. Fixed by
    /// leaving a group that installs no view for too long (every component
    /// goes on, `membership::Config::partition_grace`) and by view ids that
    /// a restarted daemon never repeats (`Settings::epoch_floor`).
    #[test]
    fn two_daemons_one_crashed_converge_again() {
        assert_ok(8);
    }

    /// A daemon that founded a group anew restarted the total order's
    /// sequence numbers, and view ids came from them: one id named two
    /// memberships. View ids now come from an epoch raised at every join.
    #[test]
    fn view_ids_are_never_reused() {
        assert_ok(18);
    }

    /// A rejoining daemon announced views built from part of the members'
    /// snapshots; it now waits for one member's whole table.
    #[test]
    fn a_rejoining_daemon_announces_the_views_the_others_do() {
        assert_ok(5);
    }

    /// A client of a cut-off daemon sent a message to a group and then left
    /// it: the rejoining daemon's snapshot had it out of the group already,
    /// so the message, ordered after, never reached its sender. A leave
    /// still queued now keeps the client in the snapshot's group.
    #[test]
    fn a_client_gets_its_own_message_sent_before_a_leave_while_cut_off() {
        assert_ok(68);
    }

    /// A daemon's own GOODBYE (a graceful stop) took its clients out of
    /// every group without a view telling them: one went on taking itself
    /// for a member of a view whose `safe` message it got through another
    /// group. Each such client now hears the view without itself, as a
    /// leaver does.
    #[test]
    fn a_stopping_daemons_clients_hear_that_they_left_their_groups() {
        assert_ok(1);
    }

    /// A view change dropped a daemon that had not said it held a `safe`
    /// message; the others delivered it in the old regular view, whose
    /// member on the dropped daemon never did. It now goes in a
    /// transitional view of the members that move on (EVS), and each
    /// daemon counts its own RECEIVED only once ordered, so that all hold
    /// the same batches at the change.
    #[test]
    fn a_safe_message_held_at_a_view_change_goes_in_a_transitional_view() {
        assert_ok(30);
        assert_ok(85);
    }

    /// Transitional views given at a view change (taking the id of the
    /// regular view they follow) and a cut-off daemon's (counted on its
    /// own) named one id with two lists; the cut-off daemon's now count in
    /// the upper half.
    #[test]
    fn transitional_views_of_two_components_never_share_an_id() {
        assert_ok(188);
    }

    /// A joining daemon's snapshot, held by vsync's primary across the view
    /// change that dropped that daemon, was sequenced in the new view: its
    /// clients went into the table at every other daemon, and a `safe`
    /// message was delivered in a view naming a client whose daemon was
    /// gone. The primary no longer sequences a held request from a member
    /// the new view dropped.
    #[test]
    fn nothing_from_a_dropped_daemon_is_ordered_in_the_view_without_it() {
        assert_ok(187);
    }

    /// A restarted daemon took the id its predecessor had rejoined under
    /// (the swarm counted process incarnations 1, 2, 3): the order stalled
    /// until the periodic view change and a safe message was lost. The
    /// first incarnation now comes from the clock, as in the real daemon.
    #[test]
    fn a_restarted_daemon_never_reuses_an_id() {
        assert_ok(15);
    }

    /// A daemon asleep past its eviction: what it had of the old order and
    /// had not delivered (held behind a safe message, or its own messages
    /// sequenced but not come back) was dropped, so its clients never got
    /// their own messages; and a client that left a group while cut off
    /// was never told, so its views claimed it stayed with members whose
    /// messages it missed. Both now go through the clients' transitional
    /// views.
    #[test]
    fn a_daemon_cut_off_hands_its_clients_what_the_old_order_held() {
        assert_ok(16);
    }

    /// A joiner's table sent again at a view change (its first sender
    /// gone) was as of the view's point but without the view's effects,
    /// which the joiner does not replay: it kept the gone daemons' clients
    /// and counted one change fewer, so one view id named two member
    /// lists. The table now goes after the view's effects.
    #[test]
    fn a_table_sent_again_at_a_view_change_carries_the_view() {
        assert_ok(109);
    }

    /// A message sent in pieces whose first pieces were ordered before a
    /// joining daemon's table point: the joiner dropped the later pieces
    /// (it had not seen the start), while the others delivered it, to
    /// members that the joiner's clients shared views with. The table now
    /// carries the messages in pieces as of its point.
    #[test]
    fn a_joiner_completes_messages_begun_in_pieces_before_it() {
        assert_ok(67);
    }

    fn assert_ok_qsm(seed: u64) {
        let mut cfg = SwarmConfig::from_seed(seed);
        cfg.qsm = true;
        let o = run(cfg);
        assert!(o.ok(), "{}", describe(&o));
    }

    /// With `[qsm]` on, a sender's own region messages waited in one queue
    /// behind a peer's region message that depended on a later point of
    /// the total order, and its daemon skipped its own CUT: the sender's
    /// next ordered (causal) message was delivered first at its own daemon
    /// (fifo). Waiting is now per source and a daemon waits at its own CUT.
    #[test]
    fn qsm_a_senders_ordered_message_does_not_overtake_its_region_ones() {
        assert_ok_qsm(2);
    }

    /// The same class (fifo across the region and the total order) in
    /// another shape of faults.
    #[test]
    fn qsm_fifo_holds_across_the_two_paths_under_faults() {
        assert_ok_qsm(13);
    }

    /// With `[qsm]` on, a daemon behind in the total order (waiting at a
    /// CUT for a region message it had lost) reached a change point after
    /// its peers had finished the flush and dropped the region instance:
    /// its flush timed out and the message was lost without notice
    /// (silent-loss). It passes since change points are only batches that
    /// may change the table now (far fewer flushes); flushed instances
    /// lingering for such a member do not fix it alone (with the old change
    /// points and the linger the seed still loses the message; why was not
    /// traced).
    #[test]
    fn qsm_a_daemon_behind_at_a_change_point_loses_nothing_silently() {
        assert_ok_qsm(96);
    }

    /// With `[qsm]` on, the region leader (visited first by its own token)
    /// missed the last region message of a sender that the other members
    /// got, and traffic stopped at a change point: the token's count of
    /// what exists came back to the leader only at the round's finish,
    /// where it did not learn it, so it never knew the message existed
    /// (the sender does not resend what others hold). Its flush timed out
    /// after 10 s and its clients missed a fifo message the others
    /// delivered before the next view (virtual-synchrony; seed 91 is the
    /// same at a CUT). The leader now learns the count at the finish.
    #[test]
    fn qsm_the_region_leader_recovers_a_tail_only_later_members_got() {
        assert_ok_qsm(186);
    }

    /// The same cause as seed 186, at a CUT and then a flush.
    #[test]
    fn qsm_the_region_leader_recovers_a_tail_at_a_cut() {
        assert_ok_qsm(91);
    }

    /// With `[qsm]` on: a client joined a group, left it and joined it again,
    /// all in batches its daemon held behind an unstable `safe` one when it
    /// was cut off. A first version of showing held joins at the cut showed
    /// it both joins' views and gave it two transitional views in a row.
    #[test]
    fn qsm_a_client_joining_twice_in_held_batches_gets_one_transitional_view() {
        assert_ok_qsm(146);
    }

    /// Like seed 279 with `[qsm]` on: a join held at a cut-off (seeds 183
    /// and 188 had the same cause and passed only by timing before).
    #[test]
    fn qsm_a_join_held_at_a_cut_off_is_shown_to_its_client() {
        assert_ok_qsm(183);
    }

    /// With `[qsm]` on: a daemon rejoined while the others held a `safe`
    /// batch whose RECEIVED a crashed committee member owed, its snapshot
    /// held behind it, and views of the same daemons no longer released
    /// held batches; the joiner, once it had its table, delivered what
    /// followed the table's point at once, the others only after the next
    /// view's transitional views (virtual-synchrony). A view of the same
    /// daemons still releases them while a daemon that joined has not had
    /// its table.
    #[test]
    fn qsm_a_joiner_and_the_daemons_holding_its_snapshot_agree_at_the_next_view() {
        assert_ok_qsm(62);
    }

    /// A daemon that stopped and restarted founded a group of its own and
    /// never merged with the others.
    #[test]
    fn groups_formed_apart_merge() {
        assert_ok(21);
    }

    /// Three daemons; d1 crashes while in a view with d2 (d2 becomes the
    /// primary and keeps asking the dead d1 for its view change), restarts
    /// and forms a group with d0. d2's direct PREFRESHVIEW to d1's old id
    /// reached d1's new incarnation (datagrams go by slot), which promised
    /// it a higher (view, epoch) and so refused its own primary's view
    /// change for ever: d2 never got in, and d0 and d1, installing no view,
    /// took their group for lost 25 s later. A member now ignores proposals
    /// from outside its view.
    #[test]
    fn a_member_ignores_another_groups_proposals() {
        assert_ok(9475);
    }

    /// d1 left its group and rejoined under a new incarnation while the
    /// primary still held a request of its earlier one; the primary's
    /// Gseq Ack for it, routed by slot, reached the new incarnation, whose
    /// own multicast had the same local id (ids restarted at 0): it took
    /// that gseq for its message and disseminated it there, and the
    /// committee sequenced the message again when its own request came
    /// (`duplicate`, then FIFO, causal, total order). Local ids now start
    /// at the member's id in the high half. (Seed 3608 had the same cause
    /// and now fails `safe` only, not traced.)
    #[test]
    fn a_sequence_ack_for_an_earlier_incarnation_is_not_taken() {
        assert_ok(5773);
    }

    /// d0, asleep, admitted d1 on a JOIN d1 had sent before it founded a
    /// group of its own; d1 filed the welcome in its own group's order at
    /// that gseq and installed the other group's view there while, still
    /// its own group's primary, it gave the same gseq to a client's `safe`
    /// message, which no daemon delivered (`own-delivery`, `silent-loss`).
    /// A member now ignores views from outside its view.
    #[test]
    fn a_member_ignores_another_groups_welcome() {
        assert_ok(7518);
    }

    /// Three daemons: d0, the primary, stops while d1 sleeps and d2, which
    /// took over across a cut, decides view 4 as {d0, d2} from its round's
    /// acknowledgements. Nobody accepts it (d2's own member side and d0
    /// promised d0's higher epoch), d0 goes, d1 wakes; d2 outranks and
    /// asks again, and d1's acceptance installed {d0, d2}: d1 dropped, d2
    /// alone with a dead member, waiting `view_period + partition_grace`.
    /// A decided Newview nobody accepted is now decided again at the new
    /// epoch (`vsync::viewchange`, `set_aside_unchosen`).
    #[test]
    fn a_view_decided_before_a_new_epoch_does_not_keep_a_dead_member() {
        assert_ok(3125);
    }

    /// Two daemons; the primary stops gracefully. The Newview that lets it
    /// go, naming the other as successor, was withheld once its daemon
    /// turned inert, so the successor waited out `view_period +
    /// partition_grace` for a majority of two (`Membership`, the leaving
    /// daemon now sends what vsync still holds).
    #[test]
    fn of_two_daemons_a_stopping_primary_hands_over_at_once() {
        assert_ok(4607);
        assert_ok(7910);
    }

    fn assert_ok_qsm_hybrid(seed: u64) {
        let mut cfg = SwarmConfig::from_seed(seed);
        cfg.qsm = true;
        cfg.qsm_hybrid = true;
        let o = run(cfg);
        assert!(o.ok(), "{}", describe(&o));
    }

    /// With `--qsm --qsm-hybrid` (failed at the hybrid mode's first build,
    /// 835bbd2; passes at later builds by timing alone): the region leader
    /// sent one message on an instance, one member missed it and a member
    /// later on the token's route got it. The leader, as sender, started
    /// its own record at 0 every round, so the earlier member never learned
    /// the message existed and waited for it at a CUT, then at the flush,
    /// until both timed out (virtual-synchrony). The sender now carries
    /// what others reported seeing, and a daemon waiting at a CUT or a
    /// flush pulls what it waits for from the source (`qsm/tests.rs`).
    #[test]
    fn qsm_hybrid_a_lone_message_of_the_leader_reaches_every_member() {
        assert_ok_qsm_hybrid(54);
    }

    /// With `--qsm --qsm-hybrid` (failed at 835bbd2; passes at later builds
    /// by timing alone): a daemon waited at a CUT for a live sender's
    /// message in a hybrid instance while the token could not get past a
    /// member cut off by a partition, and the view dropping that member
    /// was behind the CUT in the order. 10 s of stalled order at that
    /// daemon (and of `safe` stability everywhere), then a 10 s flush, and
    /// a `safe` violation after them (how the sessions came to it was not
    /// traced). The daemon now pulls what a CUT waits for from the sender.
    #[test]
    fn qsm_hybrid_a_cut_is_recovered_from_its_sender_while_the_token_is_stuck() {
        assert_ok_qsm_hybrid(199);
    }

    /// With `--qsm --qsm-hybrid` (failed at f4ed3f4 and before, 478
    /// violations of five kinds; the cause is in vsync, the hybrid group's
    /// timing only reaches it): the committee's primary, cut off during a
    /// view change, completed the Newview with one backup and sequenced
    /// after it; the other backup, cut off after it had the Newview's
    /// replica, took over, completed the same Newview once the cut healed
    /// (the others reported it installed) and sequenced after it too, alone
    /// in its committee, giving the same gseqs to other messages and
    /// committing them. Members delivered a mix of the two logs, 45
    /// messages twice. A primary that adopts a Newview naming another
    /// primary now sequences and commits nothing after it until its own
    /// next view is chosen by a majority (`vsync/tests.rs`,
    /// `a_takeover_completing_a_view_installed_elsewhere_does_not_sequence_beside_its_primary`).
    #[test]
    fn qsm_hybrid_two_primaries_do_not_sequence_after_one_newview() {
        assert_ok_qsm_hybrid(131);
    }

    /// With QSM, under loss: the Newview that lets a stopping primary go
    /// reached one backup by pbcast and not its named successor, and the
    /// group was left with no committee (found once the leaving daemon's
    /// last datagrams were sent; the primary now also unicasts it).
    #[test]
    fn qsm_a_stopping_primarys_successor_learns_the_view_that_names_it() {
        assert_ok_qsm(184);
    }
}
