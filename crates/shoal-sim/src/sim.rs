//! The discrete-event loop: one queue of (time, insertion order, event)
//! (a calendar queue, [`crate::queue`]), never ticked, driving the real
//! engines over the simulated [`Network`].
//! Each host has at most one live wake-up; a later one replaces it through a
//! generation counter. Seeded and deterministic: the same topology, engines
//! and seed give the same run, event for event.

use std::collections::VecDeque;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::engine::{MemberList, SendError};
use shoal_core::{Destination, Engine, Instant, NodeId};

use crate::metrics::{HostMetrics, Violation};
use crate::network::{Network, Offer, Topology};
use crate::queue::Calendar;

#[derive(Debug)]
enum Ev {
    /// A packet reaches `node` over a link.
    Arrive { node: u32, packet: Packet },
    /// A host's timer.
    Wake { host: u32, generation: u64 },
    /// The application on `host` multicasts a message of `size` bytes, or
    /// with a `batch` ([`Sim::sends`]) that many in a row.
    Send { host: u32, size: u32, batch: u32 },
    /// `host`'s next `count` first-phase data multicasts go by unicast to
    /// one member instead (P001 Fig 5's noise).
    Divert { host: u32, count: u32 },
    /// `host`'s CPU is free: it takes the next datagram from its backlog.
    Process { host: u32 },
    /// `host`'s CPU is free: its application retries its held multicasts.
    Retry { host: u32 },
}

/// What a host's CPU spends per datagram it receives or sends, and how many
/// received datagrams may wait for it (the socket buffer). The default costs
/// nothing: hosts are infinitely fast, as in P001's ns-2 runs. P000's
/// experiments are CPU-bound, which this models (DESIGN.md, the simulator).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProcessingCost {
    pub per_datagram_ns: u64,
    pub per_byte_ns: f64,
    /// Received datagrams waiting for the CPU, at most; more are dropped.
    pub backlog_max: usize,
}

impl ProcessingCost {
    fn of(&self, len: usize) -> u64 {
        self.per_datagram_ns + (self.per_byte_ns * len as f64) as u64
    }
}

/// How far behind its CPU a host may be and still take an application's
/// multicast (`set_blocking_sends`).
const BLOCKED_SEND_MAX_NS: u64 = 1_000_000_000;

/// An `Ev::Send` of one message, with no entry in [`Sim::sends`].
const ONE_SEND: u32 = u32::MAX;

/// The `Ev::Send` pushed last, while no other event has been pushed since:
/// a multicast that waits for the same CPU time joins its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenSend {
    host: u32,
    size: u32,
    time: u64,
    batch: u32,
}

/// One copy of a datagram on its way: in the queue, on a link or in a
/// host's backlog. It holds one reference to its bytes in
/// [`Sim::datagrams`], taken with [`Datagrams::share`] and given back with
/// [`Datagrams::release`] when the copy is delivered, dropped or forwarded
/// as another copy.
#[derive(Debug)]
struct Packet {
    from_host: u32,
    /// Destination node, or `None` for multicast from `from_node`.
    to_node: Option<u32>,
    from_node: u32,
    /// The datagram's length in bytes (links and CPU costs read it without
    /// touching the bytes).
    len: u32,
    /// Index into [`Sim::datagrams`].
    datagram: u32,
}

/// The bytes of the datagrams in flight, each with a count of the packets
/// that carry it. A multicast datagram is one entry however many links and
/// members it reaches: a copy per hop is an index and a plain counter,
/// where a `Bytes` per copy cost an atomic increment and decrement of the
/// datagram's shared count at every hop (and made each queue entry 24
/// bytes larger). Slots are reused; which slot a datagram gets decides
/// nothing.
#[derive(Default)]
struct Datagrams {
    slots: Vec<Datagram>,
    free: Vec<u32>,
}

struct Datagram {
    bytes: Bytes,
    refs: u32,
}

impl Datagrams {
    /// `bytes` as a new datagram with one packet carrying it.
    fn admit(&mut self, bytes: Bytes) -> u32 {
        let datagram = Datagram { bytes, refs: 1 };
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = datagram;
                i
            }
            None => {
                self.slots.push(datagram);
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 datagrams in flight")
            }
        }
    }

    /// Another copy of `packet`, carrying the same datagram.
    fn share(&mut self, packet: &Packet) -> Packet {
        self.slots[packet.datagram as usize].refs += 1;
        Packet { ..*packet }
    }

    /// `packet` is gone: its datagram's bytes are freed with its last copy.
    fn release(&mut self, packet: Packet) {
        let slot = &mut self.slots[packet.datagram as usize];
        slot.refs -= 1;
        if slot.refs == 0 {
            slot.bytes = Bytes::new();
            self.free.push(packet.datagram);
        }
    }

    fn bytes(&self, packet: &Packet) -> &Bytes {
        &self.slots[packet.datagram as usize].bytes
    }
}

/// Laid out in declaration order (`repr(C)`) and on whole cache lines,
/// what every datagram and timer reads first at the start, the metrics'
/// hot counters right after it (see [`HostMetrics`]): at 10^4 members no
/// host's record is in cache when its next event comes.
#[repr(C, align(64))]
struct Host<E> {
    engine: E,
    armed: Option<u64>,
    generation: u64,
    node: usize,
    /// Sleep intervals [from, until), sorted and disjoint.
    asleep: Vec<(u64, u64)>,
    /// The sizes of multicasts the application is blocked on, oldest first
    /// (`set_blocking_application`).
    held: VecDeque<u32>,
    metrics: HostMetrics,
    /// (data datagrams still to divert, the member they go to).
    divert: Option<(u32, u32)>,
    /// The CPU is busy until then (with a processing cost).
    busy_until: u64,
    /// Received datagrams waiting for the CPU, oldest first.
    backlog: VecDeque<Packet>,
    /// A `Retry` is queued for then.
    retry_at: Option<u64>,
}

/// A simulation of engines of type `E` on a network.
pub struct Sim<E> {
    network: Network,
    hosts: Vec<Host<E>>,
    /// Node index to host index.
    host_at: Vec<Option<u32>>,
    queue: Calendar<Ev>,
    now: u64,
    rng: Xoshiro256PlusPlus,
    cost: Option<ProcessingCost>,
    /// See [`Sim::set_send_processing_cost`].
    send_cost: Option<ProcessingCost>,
    /// See [`Sim::set_blocking_sends`].
    blocking_sends: bool,
    /// See [`Sim::set_blocking_application`].
    blocking_application: bool,
    /// See [`Sim::set_receive_loss`].
    receive_loss: f64,
    pub events: u64,
    pub violations: Vec<Violation>,
    /// The bytes of every packet in flight.
    datagrams: Datagrams,
    /// Reused for the links a multicast leaves on.
    scratch_links: Vec<u32>,
    /// Messages per batched `Ev::Send`, by batch (a slot is reused once its
    /// event pops). A blocking sender's application waits for its CPU
    /// (`set_blocking_sends`); while it is behind, each multicast it means
    /// to send waits as one event, and each of those events, when its time
    /// comes and the CPU has gone on to the next copy, is put back at the
    /// new time. Multicasts that wait back to back for the same time are
    /// one event with a count: the same sends at the same times in the same
    /// order, without each waiting multicast popping again every time the
    /// CPU moves on (a sender a second behind at 3,200/s held thousands of
    /// them, each popped thousands of times a second).
    sends: Vec<u32>,
    /// Free slots of `sends`.
    sends_free: Vec<u32>,
    /// See [`OpenSend`].
    open_send: Option<OpenSend>,
    /// Off only in tests: every waiting multicast is its own event.
    batch_sends: bool,
}

impl<E: Engine<Event: crate::metrics::SimEvent>> Sim<E> {
    /// Hosts `0..nodes.len()` sit on `nodes[i]`; `build(i, members)` makes
    /// host i's engine, member ids being host indices.
    pub fn new(
        topology: &Topology,
        nodes: &[usize],
        seed: u64,
        build: impl Fn(NodeId, &[NodeId]) -> E,
    ) -> Sim<E> {
        Sim::with_members(topology, nodes, seed, |me, members| build(me, members))
    }

    /// As [`Sim::new`], handing every engine the same shared member list,
    /// for engines that can keep it instead of a copy (a group of n members
    /// would otherwise hold n² ids).
    pub fn with_members(
        topology: &Topology,
        nodes: &[usize],
        seed: u64,
        build: impl Fn(NodeId, &MemberList) -> E,
    ) -> Sim<E> {
        let count = u32::try_from(nodes.len()).expect("fewer than 2^32 hosts");
        let members = MemberList::dense(count);
        let mut host_at = vec![None; topology.nodes];
        let hosts = nodes
            .iter()
            .enumerate()
            .map(|(i, &node)| {
                host_at[node] = Some(i as u32);
                Host {
                    node,
                    engine: build(members[i], &members),
                    generation: 0,
                    armed: None,
                    asleep: Vec::new(),
                    divert: None,
                    busy_until: 0,
                    backlog: VecDeque::new(),
                    held: VecDeque::new(),
                    retry_at: None,
                    metrics: HostMetrics::new(nodes.len()),
                }
            })
            .collect();
        let mut sim = Sim {
            network: Network::new(topology, nodes),
            hosts,
            host_at,
            queue: Calendar::default(),
            now: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x005E_ED0F_5111),
            cost: None,
            send_cost: None,
            blocking_sends: false,
            blocking_application: false,
            receive_loss: 0.0,
            events: 0,
            violations: Vec::new(),
            datagrams: Datagrams::default(),
            scratch_links: Vec::new(),
            sends: Vec::new(),
            sends_free: Vec::new(),
            open_send: None,
            batch_sends: true,
        };
        for h in 0..sim.hosts.len() {
            sim.arm(h);
        }
        sim
    }

    /// Check exactly-once delivery but not FIFO order (unordered engines).
    pub fn check_unordered(&mut self) {
        for h in &mut self.hosts {
            h.metrics = std::mem::replace(&mut h.metrics, HostMetrics::new(0)).unordered();
        }
    }

    /// Counts packets per kind on the link from node `from` to node `to`
    /// (both directions if `both`), e.g. the router link of P001 Fig 9.
    pub fn watch_link(&mut self, from: usize, to: usize) {
        self.network.watch(from, to);
    }

    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// The node host `host` sits on.
    pub fn host_node(&self, host: usize) -> usize {
        self.hosts[host].node
    }

    /// Bytes each directed link has carried so far (a snapshot for
    /// utilisation over the sending period, `Report::collect`).
    pub fn link_bytes(&self) -> Vec<u64> {
        self.network.links.iter().map(|l| l.bytes).collect()
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn hosts(&self) -> impl Iterator<Item = (&E, &HostMetrics)> {
        self.hosts.iter().map(|h| (&h.engine, &h.metrics))
    }

    fn push(&mut self, time: u64, ev: Ev) {
        self.open_send = None;
        self.queue.push(time, ev);
    }

    /// `count` multicasts of `size` bytes from `host` wait for `time`: they
    /// join the last event pushed when it is the same wait (the events
    /// would have been adjacent in the queue's order), or become one new
    /// event.
    fn push_sends(&mut self, time: u64, host: u32, size: u32, count: u32) {
        if let Some(open) = self.open_send {
            if (open.host, open.size, open.time) == (host, size, time) && self.batch_sends {
                self.sends[open.batch as usize] += count;
                return;
            }
        }
        let batch = match self.sends_free.pop() {
            Some(b) => {
                self.sends[b as usize] = count;
                b
            }
            None => {
                self.sends.push(count);
                (self.sends.len() - 1) as u32
            }
        };
        self.push(time, Ev::Send { host, size, batch });
        let open = OpenSend {
            host,
            size,
            time,
            batch,
        };
        self.open_send = Some(open);
    }

    /// The messages of a popped `Ev::Send`; its batch slot is free again.
    fn take_sends(&mut self, batch: u32) -> u32 {
        if batch == ONE_SEND {
            return 1;
        }
        if self.open_send.is_some_and(|open| open.batch == batch) {
            self.open_send = None;
        }
        self.sends_free.push(batch);
        self.sends[batch as usize]
    }

    /// Schedules `count` multicasts of `size` bytes from `host`, one every
    /// `gap_ns`, starting at `start_ns`.
    pub fn schedule_stream(
        &mut self,
        host: usize,
        start_ns: u64,
        gap_ns: u64,
        count: u64,
        size: u32,
    ) {
        for i in 0..count {
            self.push(
                start_ns + i * gap_ns,
                Ev::Send {
                    host: host as u32,
                    size,
                    batch: ONE_SEND,
                },
            );
        }
    }

    /// `host`'s FIFO check expects `source`'s deliveries to start at `seq`
    /// (for a host that joins the group later).
    pub fn expect_from(&mut self, host: usize, source: u32, seq: u64) {
        self.hosts[host].metrics.expect_from(source, seq);
    }

    /// `host` drops everything and runs no timers in [from, until). Several
    /// sleeps may be given; overlapping or adjacent ones merge.
    pub fn sleep(&mut self, host: usize, from_ns: u64, until_ns: u64) {
        let intervals = &mut self.hosts[host].asleep;
        intervals.push((from_ns, until_ns));
        intervals.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
        for &(from, until) in intervals.iter() {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        *intervals = merged;
        let generation = self.hosts[host].generation;
        self.push(
            until_ns,
            Ev::Wake {
                host: host as u32,
                generation,
            },
        );
    }

    fn is_asleep(&self, host: usize) -> bool {
        let intervals = &self.hosts[host].asleep;
        let i = intervals.partition_point(|&(from, _)| from <= self.now);
        i > 0 && self.now < intervals[i - 1].1
    }

    /// Runs every event up to and including `until_ns`.
    pub fn run_until(&mut self, until_ns: u64) {
        while self.queue.next_time().is_some_and(|t| t <= until_ns) {
            let (time, ev) = self.queue.pop().expect("peeked");
            self.now = time;
            self.events += 1;
            match ev {
                Ev::Arrive { node, packet } => self.on_arrive(node as usize, packet),
                Ev::Wake { host, generation } => self.on_wake(host as usize, generation),
                Ev::Send { host, size, batch } => {
                    let count = self.take_sends(batch);
                    self.on_send(host as usize, size, count);
                }
                Ev::Divert { host, count } => self.on_divert(host as usize, count),
                Ev::Process { host } => self.on_cpu_free(host as usize),
                Ev::Retry { host } => {
                    self.hosts[host as usize].retry_at = None;
                    self.send_held(host as usize);
                }
            }
        }
        self.now = self.now.max(until_ns);
    }

    /// From `at_ns`, `host`'s next `count` data multicasts reach only one
    /// member, chosen at random then, by unicast (P001 Fig 5: "10
    /// consecutive multicasts converted to unicasts to one random member").
    pub fn divert_multicasts(&mut self, host: usize, at_ns: u64, count: u32) {
        let host = host as u32;
        self.push(at_ns, Ev::Divert { host, count });
    }

    /// Charges every host `cost` of CPU per datagram received and sent.
    pub fn set_processing_cost(&mut self, cost: ProcessingCost) {
        self.cost = Some(cost);
    }

    /// Charges every host `cost` per datagram it sends instead of the
    /// [`Sim::set_processing_cost`] one (which still applies to received
    /// datagrams and must be set too): sending can cost a host more than
    /// receiving (QSM's sender allocates and serialises, [A] §3).
    pub fn set_send_processing_cost(&mut self, cost: ProcessingCost) {
        self.send_cost = Some(cost);
    }

    /// With `on`, hosts send as real machines with blocking sockets do: a
    /// datagram enters the network when the host's CPU has spent its send
    /// cost on it (not all of a burst at once), and when the first link's
    /// queue is full the host waits for room, its CPU held (received
    /// datagrams wait in its backlog meanwhile), instead of the datagram
    /// being dropped there. The application's multicasts wait for the CPU
    /// too. Routers and later links still drop at their
    /// queues. P000 measured real hosts (its scenarios set this); P001's
    /// ns-2 agents drop at their own link's queue like any router (its
    /// scenarios leave it off, the default).
    pub fn set_blocking_sends(&mut self, on: bool) {
        self.blocking_sends = on;
    }

    /// With `on`, an application whose multicast the engine refuses for flow
    /// control (`SendError::WindowFull`) blocks on it, as a sender in a
    /// blocking `send` loop does: the message and every later one it means
    /// to send wait, in order, and go as soon as the engine takes them and
    /// the CPU is free. A sender paced at a fixed rate therefore catches up
    /// after a stall as fast as its host allows, and throughput falls only
    /// when it cannot. Off (the default), a refused multicast is lost.
    pub fn set_blocking_application(&mut self, on: bool) {
        self.blocking_application = on;
    }

    /// Every datagram reaching a member is dropped there with probability
    /// `p`, independently of every other member and datagram: loss at the
    /// receivers rather than on the links, so that a drop is one member's
    /// and never a whole subtree's (one reading of P001 §D's "data loss
    /// rate was set to 1.0% for the entire network"). Forwarding through
    /// the member's node is unaffected. 0, the default, draws nothing from
    /// the simulation's random stream.
    pub fn set_receive_loss(&mut self, p: f64) {
        assert!((0.0..1.0).contains(&p), "receive loss {p} not in [0, 1)");
        self.receive_loss = p;
    }

    /// Hands host `host`'s engine to `f` at the current simulated time (an
    /// input other than datagrams and timers, e.g. a membership service's
    /// new view), then drains it as after any input.
    pub fn with_engine(&mut self, host: usize, f: impl FnOnce(&mut E, Instant)) {
        f(&mut self.hosts[host].engine, Instant::from_nanos(self.now));
        self.after_input(host);
    }

    /// Multicasts the application on `host` is blocked on.
    pub fn held_sends(&self, host: usize) -> usize {
        self.hosts[host].held.len()
    }

    /// Records each host's deliveries per `bin_ns` of simulated time.
    pub fn record_throughput(&mut self, bin_ns: u64) {
        for h in &mut self.hosts {
            h.metrics.throughput_bin_ns = Some(bin_ns);
        }
    }

    fn on_divert(&mut self, host: usize, count: u32) {
        let others = self.hosts.len() as u32 - 1;
        if others == 0 {
            return;
        }
        let pick = self.rng.random_range(0..others);
        let to = if pick >= host as u32 { pick + 1 } else { pick };
        self.hosts[host].divert = Some((count, to));
    }

    /// The destination of a datagram `host` sends, after any diversion.
    fn divert(&mut self, host: usize, destination: Destination, payload: &[u8]) -> Destination {
        let Some((left, to)) = self.hosts[host].divert else {
            return destination;
        };
        let is_data =
            shoal_wire::decode_header(payload).is_ok_and(|h| h.kind == shoal_wire::Kind::Data);
        if destination != Destination::Multicast || !is_data {
            return destination;
        }
        self.hosts[host].divert = (left > 1).then_some((left - 1, to));
        Destination::Node(NodeId(to))
    }

    /// The application on `host` multicasts `count` messages of `size`
    /// bytes, one after the other, as `count` adjacent events would.
    fn on_send(&mut self, host: usize, size: u32, count: u32) {
        if self.is_asleep(host) {
            return;
        }
        for left in (1..=count).rev() {
            if self.blocking_application {
                self.hosts[host].held.push_back(size);
                self.send_held(host);
                continue;
            }
            if self.blocking_sends && self.hosts[host].busy_until > self.now {
                // The application shares the host's CPU, which is still
                // sending (or blocked on a full interface queue): its
                // multicasts wait, as a blocking send would. A host more
                // than a second behind refuses them instead, as a full send
                // queue would. Nothing changes between one waiting
                // multicast and the next, so the rest of them go together.
                let free = self.hosts[host].busy_until;
                if free - self.now <= BLOCKED_SEND_MAX_NS {
                    if self.batch_sends {
                        self.push_sends(free, host as u32, size, left);
                    } else {
                        for _ in 0..left {
                            self.push_sends(free, host as u32, size, 1);
                        }
                    }
                }
                return;
            }
            let now = Instant::from_nanos(self.now);
            let payload = self.stamped_payload(size);
            if self.hosts[host].engine.multicast(now, payload).is_ok() {
                self.hosts[host].metrics.originated += 1;
            }
            self.after_input(host);
        }
    }

    /// An application payload of `size` bytes (at least 8) that starts with
    /// its send time, from which receivers' metrics take the latency.
    fn stamped_payload(&self, size: u32) -> Bytes {
        let mut payload = vec![0u8; (size as usize).max(8)];
        payload[..8].copy_from_slice(&self.now.to_be_bytes());
        Bytes::from(payload)
    }

    /// The blocked application's multicasts, oldest first, while the engine
    /// takes them and the CPU is free (`set_blocking_application`).
    fn send_held(&mut self, host: usize) {
        while let Some(&size) = self.hosts[host].held.front() {
            if self.is_asleep(host) {
                return; // Waking runs `after_input`, which comes back here.
            }
            if !self.hosts[host].backlog.is_empty() {
                // Received datagrams first, as an event loop polls its
                // socket between sends; processing them comes back here.
                return;
            }
            let free = self.hosts[host].busy_until;
            if self.blocking_sends && free > self.now {
                let h = &mut self.hosts[host];
                if h.retry_at.is_none_or(|at| at > free) {
                    h.retry_at = Some(free);
                    self.push(free, Ev::Retry { host: host as u32 });
                }
                return;
            }
            let now = Instant::from_nanos(self.now);
            let payload = self.stamped_payload(size);
            match self.hosts[host].engine.multicast(now, payload) {
                Err(SendError::WindowFull) => return, // An input will open it.
                Err(_) => {}
                Ok(_) => self.hosts[host].metrics.originated += 1,
            }
            self.hosts[host].held.pop_front();
            self.drain(host);
        }
    }

    fn on_wake(&mut self, host: usize, generation: u64) {
        if self.is_asleep(host) {
            return;
        }
        let h = &mut self.hosts[host];
        let woke_from_sleep = h.asleep.iter().any(|&(_, until)| until == self.now);
        if generation != h.generation && !woke_from_sleep {
            return;
        }
        h.armed = None;
        h.engine.handle_timeout(Instant::from_nanos(self.now));
        self.after_input(host);
    }

    fn on_arrive(&mut self, node: usize, packet: Packet) {
        let here = self.host_at[node].map(|h| h as usize);
        match packet.to_node {
            Some(dst) if dst as usize == node => {
                self.deliver(here, &packet);
                self.datagrams.release(packet);
            }
            Some(dst) => self.forward_unicast(node, dst as usize, packet),
            None => {
                if node != packet.from_node as usize {
                    self.deliver(here, &packet);
                }
                self.forward_multicast(node, packet);
            }
        }
    }

    fn deliver(&mut self, host: Option<usize>, packet: &Packet) {
        let Some(host) = host else { return };
        if self.is_asleep(host) {
            self.hosts[host].metrics.dropped_asleep += 1;
            return;
        }
        if self.receive_loss > 0.0 && self.rng.random::<f64>() < self.receive_loss {
            self.hosts[host].metrics.dropped_receive_loss += 1;
            return;
        }
        let Some(cost) = self.cost else {
            self.process(host, packet);
            return;
        };
        // The CPU takes datagrams in arrival order; the engine sees each one
        // once the CPU has spent its cost on it.
        let h = &mut self.hosts[host];
        if h.backlog.len() >= cost.backlog_max {
            h.metrics.dropped_backlog += 1;
            return;
        }
        h.backlog.push_back(self.datagrams.share(packet));
        if h.backlog.len() == 1 {
            let at = h.busy_until.max(self.now) + cost.of(packet.len as usize);
            self.push(at, Ev::Process { host: host as u32 });
        }
    }

    /// The CPU finished the oldest waiting datagram: the engine handles it.
    fn on_cpu_free(&mut self, host: usize) {
        let Some(packet) = self.hosts[host].backlog.pop_front() else {
            return;
        };
        let h = &mut self.hosts[host];
        h.busy_until = h.busy_until.max(self.now);
        if self.is_asleep(host) {
            self.hosts[host].metrics.dropped_asleep += 1;
        } else {
            self.process(host, &packet);
        }
        self.datagrams.release(packet);
        let cost = self.cost.expect("only scheduled with a cost");
        let h = &self.hosts[host];
        if let Some(next) = h.backlog.front() {
            let at = h.busy_until.max(self.now) + cost.of(next.len as usize);
            self.push(at, Ev::Process { host: host as u32 });
        }
    }

    fn process(&mut self, host: usize, packet: &Packet) {
        let bytes = self.datagrams.bytes(packet);
        self.hosts[host].metrics.count_received(bytes);
        let now = Instant::from_nanos(self.now);
        let from = NodeId(packet.from_host);
        self.hosts[host]
            .engine
            .handle_datagram_bytes(now, from, bytes);
        self.after_input(host);
    }

    /// Drains the engine after an input, then lets a blocked application
    /// try again.
    fn after_input(&mut self, host: usize) {
        self.drain(host);
        if !self.hosts[host].held.is_empty() {
            self.send_held(host);
        }
    }

    /// Datagrams into the network, events into the metrics and checker, and
    /// the next wake-up.
    fn drain(&mut self, host: usize) {
        let now = Instant::from_nanos(self.now);
        while let Some(t) = self.hosts[host].engine.poll_transmit(now) {
            self.hosts[host].metrics.count_sent(&t.payload);
            let mut send_at = self.now;
            if let Some(cost) = self.cost.and(self.send_cost).or(self.cost) {
                let h = &mut self.hosts[host];
                h.busy_until = h.busy_until.max(self.now) + cost.of(t.payload.len());
                if self.blocking_sends {
                    send_at = h.busy_until;
                }
            }
            let from_node = self.hosts[host].node as u32;
            let destination = self.divert(host, t.destination, &t.payload);
            let to_node = match destination {
                Destination::Node(member) => match self.hosts.get(member.0 as usize) {
                    Some(dst) => Some(dst.node as u32),
                    None => continue,
                },
                Destination::Multicast => None,
            };
            let len = u32::try_from(t.payload.len()).expect("a datagram under 4 GiB");
            let packet = Packet {
                from_host: host as u32,
                to_node,
                from_node,
                len,
                datagram: self.datagrams.admit(t.payload),
            };
            let taken = self.inject(packet, send_at);
            let h = &mut self.hosts[host];
            h.busy_until = h.busy_until.max(taken);
        }
        while let Some(event) = self.hosts[host].engine.poll_event() {
            let now_ns = self.now;
            if let Some(v) = self.hosts[host].metrics.on_event(host, now_ns, &event) {
                self.violations.push(v);
            }
        }
        self.arm(host);
    }

    fn arm(&mut self, host: usize) {
        let Some(at) = self.hosts[host].engine.poll_timeout() else {
            return;
        };
        let at = at.as_nanos().max(self.now);
        if self.hosts[host].armed == Some(at) {
            return;
        }
        let h = &mut self.hosts[host];
        h.generation += 1;
        h.armed = Some(at);
        let generation = h.generation;
        self.push(
            at,
            Ev::Wake {
                host: host as u32,
                generation,
            },
        );
    }

    /// A host's own datagram enters the network at `at`: now, or with
    /// `set_blocking_sends` when its CPU finished sending it. Returns when
    /// its interface took it (later than `at` only when a blocking send
    /// waited for room).
    fn inject(&mut self, packet: Packet, at: u64) -> u64 {
        let node = packet.from_node as usize;
        match packet.to_node {
            Some(dst) if dst as usize == node => {
                self.push(at, Ev::Arrive { node: dst, packet });
                at
            }
            Some(dst) => match self.network.route(node, dst as usize) {
                Some(link) => self.send_first_hop(link, packet, at),
                None => {
                    self.datagrams.release(packet);
                    at
                }
            },
            None => {
                let mut links = std::mem::take(&mut self.scratch_links);
                self.network.multicast_links_into(node, node, &mut links);
                let mut taken = at;
                for &link in &links {
                    let copy = self.datagrams.share(&packet);
                    let sent = self.send_first_hop(link as usize, copy, at);
                    taken = taken.max(sent);
                }
                self.datagrams.release(packet);
                self.scratch_links = links;
                taken
            }
        }
    }

    /// The first hop of a host's own datagram. A blocking sender waits for
    /// room in the link's queue, as a blocking socket holds the process, and
    /// its datagram is never dropped there; otherwise the queue drops it
    /// when full (ns-2's agents). Returns when the link took it.
    fn send_first_hop(&mut self, link: usize, packet: Packet, at: u64) -> u64 {
        let blocking = self.blocking_sends;
        let when = if blocking {
            self.network.links[link].room_at(at)
        } else {
            at
        };
        self.send_on_at(link, packet, when, !blocking);
        when
    }

    fn forward_unicast(&mut self, at: usize, dst: usize, packet: Packet) {
        match self.network.route(at, dst) {
            Some(link) => self.send_on(link, packet),
            None => self.datagrams.release(packet),
        }
    }

    fn forward_multicast(&mut self, at: usize, packet: Packet) {
        let mut links = std::mem::take(&mut self.scratch_links);
        self.network
            .multicast_links_into(packet.from_node as usize, at, &mut links);
        match links.split_last() {
            Some((&last, rest)) => {
                for &link in rest {
                    let copy = self.datagrams.share(&packet);
                    self.send_on(link as usize, copy);
                }
                self.send_on(last as usize, packet);
            }
            None => self.datagrams.release(packet),
        }
        self.scratch_links = links;
    }

    fn send_on(&mut self, link: usize, packet: Packet) {
        self.send_on_at(link, packet, self.now, true);
    }

    /// Offers `packet` to `link` at `at` (not before now); `bounded` false
    /// when the sender waited for room ([`Link::room_at`]).
    fn send_on_at(&mut self, link: usize, packet: Packet, at: u64, bounded: bool) {
        let roll: f64 = self.rng.random();
        let datagram = self.datagrams.bytes(&packet);
        self.network.count_kinds(link, datagram);
        let l = &mut self.network.links[link];
        let to = l.to as u32;
        match l.offer_with(at, packet.len as usize, roll, bounded) {
            Offer::Arrives(arrival) => self.push(arrival, Ev::Arrive { node: to, packet }),
            Offer::Lost => self.datagrams.release(packet),
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_core::pbcast::{Config, Pbcast};

    use super::*;
    use crate::LinkSpec;

    /// Two members on a lossless chain; member 0 sends `count` messages at
    /// `rate` per second. Returns member 1's metrics.
    fn run(cost: Option<ProcessingCost>, count: u64, rate: u64) -> HostMetrics {
        let spec = LinkSpec {
            bandwidth_bps: 1e9,
            ..LinkSpec::paper(0.0)
        };
        let topology = Topology::chain(2, spec);
        let config = Config {
            ip_multicast: true,
            send_window: None,
            ..Config::default()
        };
        let mut sim = Sim::new(&topology, &[0, 1], 1, |me, members| {
            Pbcast::new(me, members, config.clone(), 1, Instant::ZERO).unwrap()
        });
        if let Some(cost) = cost {
            sim.set_processing_cost(cost);
        }
        sim.schedule_stream(0, 0, 1_000_000_000 / rate, count, 100);
        sim.run_until(5_000_000_000);
        sim.hosts[1].metrics.clone()
    }

    #[test]
    fn a_processing_cost_delays_and_a_full_backlog_drops() {
        let free = run(None, 200, 1000);
        assert_eq!((free.delivered, free.dropped_backlog), (200, 0));
        let p50_free = free.latency_us.value_at_quantile(0.5);

        // 300 µs per datagram keeps up with 1000/s: slower, nothing dropped.
        let busy = ProcessingCost {
            per_datagram_ns: 300_000,
            per_byte_ns: 0.0,
            backlog_max: 64,
        };
        let slow = run(Some(busy), 200, 1000);
        assert_eq!((slow.delivered, slow.dropped_backlog), (200, 0));
        let p50_slow = slow.latency_us.value_at_quantile(0.5);
        // The histogram keeps two significant digits (±50 µs here).
        assert!(p50_slow >= p50_free + 250, "{p50_free} µs -> {p50_slow} µs");

        // 5 ms per datagram cannot keep up with 1000/s: the backlog fills.
        let overloaded = ProcessingCost {
            per_datagram_ns: 5_000_000,
            per_byte_ns: 0.0,
            backlog_max: 8,
        };
        let dropped = run(Some(overloaded), 200, 1000).dropped_backlog;
        assert!(dropped > 100, "dropped {dropped}");
    }

    /// Three members, a sender buffer of 4 and a member asleep for 300 ms
    /// while the sender offers 100 messages, one per millisecond. Returns
    /// (originated, fewest delivered by a member, held mid-sleep, held at
    /// the end).
    fn window_stall(blocking_application: bool) -> (u64, u64, usize, usize) {
        use shoal_core::traditional::{self, Traditional};
        let topology = Topology::star(3, LinkSpec::paper(0.0));
        let config = traditional::Config {
            window: std::num::NonZeroU32::new(4).unwrap(),
            ..traditional::Config::default()
        };
        let mut sim = Sim::new(&topology, &[1, 2, 3], 1, |me, members| {
            Traditional::new(me, members, config.clone(), Instant::ZERO).unwrap()
        });
        sim.set_blocking_application(blocking_application);
        sim.schedule_stream(0, 10_000_000, 1_000_000, 100, 100);
        sim.sleep(2, 20_000_000, 320_000_000);
        sim.run_until(200_000_000);
        let held_mid_sleep = sim.held_sends(0);
        sim.run_until(5_000_000_000);
        let originated = sim.hosts[0].metrics.originated;
        let fewest = sim.hosts.iter().map(|h| h.metrics.delivered).min().unwrap();
        assert!(sim.violations.is_empty(), "{:?}", sim.violations);
        (originated, fewest, held_mid_sleep, sim.held_sends(0))
    }

    #[test]
    fn a_blocked_application_sends_everything_once_the_window_opens() {
        // Lost: multicasts refused while the sleeper held the window.
        let (originated, fewest, held, _) = window_stall(false);
        assert!(originated < 50, "originated {originated}");
        assert_eq!((fewest, held), (originated, 0));
        // Blocked: they wait in order, then all go, and all arrive.
        let (originated, fewest, held, held_at_end) = window_stall(true);
        assert!(held > 50, "held mid-sleep {held}");
        assert_eq!((originated, fewest, held_at_end), (100, 100, 0));
    }

    /// A star of 41 members around a router; member 0 fans each message out
    /// by unicast (40 copies) onto its 10-packet link queue. Returns the
    /// drops at the sender's own link and the fewest messages a member
    /// delivered within 10 s.
    fn fan_out(blocking: bool) -> (u64, u64) {
        let spec = LinkSpec {
            bandwidth_bps: 10e6,
            delay_ns: 100_000,
            loss: 0.0,
            queue_packets: 10,
        };
        let topology = Topology::star(41, spec);
        let hosts: Vec<usize> = (1..=41).collect();
        let config = Config {
            ip_multicast: false,
            relay_fanout: 0,
            send_window: None,
            ..Config::default()
        };
        let mut sim = Sim::new(&topology, &hosts, 1, |me, members| {
            Pbcast::new(me, members, config.clone(), 1, Instant::ZERO).unwrap()
        });
        sim.set_processing_cost(ProcessingCost {
            per_datagram_ns: 10_000,
            per_byte_ns: 0.0,
            backlog_max: 1_000,
        });
        sim.set_blocking_sends(blocking);
        sim.schedule_stream(0, 0, 100_000_000, 20, 1_000);
        sim.run_until(10_000_000_000);
        let sender = sim.host_node(0);
        let own: u64 = sim
            .network()
            .links
            .iter()
            .filter(|l| l.from == sender)
            .map(|l| l.dropped_queue)
            .sum();
        let fewest = sim.hosts().map(|(_, m)| m.delivered).min().unwrap();
        (own, fewest)
    }

    /// A blocking sender of 12 unicast copies per message (about 1,650
    /// messages/s of CPU) offered 3,000/s for 3 s, on lossy links: it falls
    /// a second behind and refuses some. Returns every host's metrics and
    /// every link's bytes and drops, the violations, and the events.
    fn overloaded_sender(batch_sends: bool) -> (Vec<String>, Vec<(u64, u64)>, usize, u64) {
        let spec = LinkSpec {
            bandwidth_bps: 100e6,
            delay_ns: 50_000,
            loss: 0.001,
            queue_packets: 256,
        };
        let topology = Topology::star(13, spec);
        let hosts: Vec<usize> = (1..=13).collect();
        let config = Config {
            ip_multicast: false,
            relay_fanout: 0,
            send_window: None,
            ..Config::default()
        };
        let mut sim = Sim::new(&topology, &hosts, 7, |me, members| {
            Pbcast::new(me, members, config.clone(), 1, Instant::ZERO).unwrap()
        });
        sim.batch_sends = batch_sends;
        sim.set_processing_cost(ProcessingCost {
            per_datagram_ns: 50_000,
            per_byte_ns: 5.0,
            backlog_max: 256,
        });
        sim.set_blocking_sends(true);
        sim.schedule_stream(0, 0, 1_000_000_000 / 3_000, 9_000, 64);
        sim.run_until(5_000_000_000);
        let metrics = sim.hosts().map(|(_, m)| format!("{m:?}")).collect();
        let links = sim
            .network()
            .links
            .iter()
            .map(|l| (l.bytes, l.dropped_queue))
            .collect();
        (metrics, links, sim.violations.len(), sim.events)
    }

    #[test]
    fn waiting_multicasts_batched_give_the_same_run_in_fewer_events() {
        let (one_each, links_one_each, violations_one_each, events_one_each) =
            overloaded_sender(false);
        let (batched, links_batched, violations_batched, events_batched) = overloaded_sender(true);
        // The sender fell more than a second behind: some were refused.
        let originated = one_each[0]
            .split("originated: ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .and_then(|s| s.parse::<u64>().ok())
            .expect("originated in the metrics");
        assert!((4_000..9_000).contains(&originated), "{originated}");
        assert_eq!(one_each, batched);
        assert_eq!(links_one_each, links_batched);
        assert_eq!(violations_one_each, violations_batched);
        assert!(
            events_batched * 3 < events_one_each,
            "{events_batched} events batched, {events_one_each} one each"
        );
    }

    #[test]
    fn a_blocking_sender_waits_for_its_link_where_a_dropping_one_loses_copies() {
        // Without blocking, most of each burst of 40 copies is dropped at the
        // sender's own 10-packet queue (gossip repairs it later).
        let (own, _) = fan_out(false);
        assert!(own > 400, "{own} drops at the sender's link");
        // With blocking, the sender waits for room: none is dropped there,
        // and every member gets all 20 messages. (The router's links to the
        // members drop some gossip bursts in both runs: they are not the
        // sender's own.)
        let (own, fewest) = fan_out(true);
        assert_eq!(own, 0);
        assert_eq!(fewest, 20);
    }
}
