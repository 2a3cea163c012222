//! A tiny virtual-time network for engine unit tests: members 0..n, a fixed
//! one-way delay, seeded independent loss and an optional drop filter. No
//! simulator, no tokio; the simulator crate covers topologies and links.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_wire::SeqRange;

use crate::engine::{Destination, Engine, NodeId, SendError, Transmit};
use crate::pbcast::Event;
use crate::time::Instant;

/// What the network drives: every engine, and sans-IO components such as
/// the failure detector that have no `multicast`.
pub trait Node {
    type Ev;
    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]);
    fn handle_timeout(&mut self, now: Instant);
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit>;
    fn poll_event(&mut self) -> Option<Self::Ev>;
    fn poll_timeout(&self) -> Option<Instant>;
}

impl<E: Engine> Node for E {
    type Ev = E::Event;
    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        Engine::handle_datagram(self, now, from, datagram)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Engine::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        Engine::poll_transmit(self, now)
    }
    fn poll_event(&mut self) -> Option<E::Event> {
        Engine::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Engine::poll_timeout(self)
    }
}

pub const MS: u64 = 1_000_000;

/// Returns false to drop a datagram (from, to, bytes).
pub type Filter = Box<dyn Fn(usize, usize, &[u8]) -> bool>;
/// (arrival ns, insertion order, to, from, datagram)
type InFlight = Reverse<(u64, u64, usize, usize, Bytes)>;

pub struct Net<E: Node> {
    pub engines: Vec<E>,
    pub events: Vec<Vec<E::Ev>>,
    queue: BinaryHeap<InFlight>,
    sequence: u64,
    now: u64,
    /// One-way delay of every datagram, in ns.
    pub delay: u64,
    pub loss: f64,
    rng: Xoshiro256PlusPlus,
    pub filter: Option<Filter>,
    /// Called on every engine after every step.
    pub check: Option<fn(&E)>,
}

impl<E: Node> Net<E> {
    /// Members `0..n`, engine `i` built by `build(i, &members)`.
    pub fn new(n: usize, seed: u64, build: impl Fn(NodeId, &[NodeId]) -> E) -> Net<E> {
        let members: Vec<NodeId> = (0..n as u32).map(NodeId).collect();
        Net {
            engines: members.iter().map(|m| build(*m, &members)).collect(),
            events: (0..n).map(|_| Vec::new()).collect(),
            queue: BinaryHeap::new(),
            sequence: 0,
            now: 0,
            delay: MS,
            loss: 0.0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            filter: None,
            check: None,
        }
    }

    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    fn send(&mut self, from: usize, to: usize, bytes: Bytes) {
        if self.rng.random::<f64>() < self.loss {
            return;
        }
        if self.filter.as_ref().is_some_and(|f| !f(from, to, &bytes)) {
            return;
        }
        self.sequence += 1;
        let at = self.now + self.delay;
        self.queue
            .push(Reverse((at, self.sequence, to, from, bytes)));
    }

    fn drain(&mut self, i: usize) {
        let now = self.now();
        while let Some(t) = self.engines[i].poll_transmit(now) {
            match t.destination {
                Destination::Node(to) => self.send(i, to.0 as usize, t.payload),
                Destination::Multicast => {
                    for to in 0..self.engines.len() {
                        if to != i {
                            self.send(i, to, t.payload.clone());
                        }
                    }
                }
            }
        }
        while let Some(ev) = self.engines[i].poll_event() {
            self.events[i].push(ev);
        }
    }

    /// Calls `f` on engine `i` (for inputs other than datagrams and timers),
    /// then sends what it produced.
    pub fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut E, Instant) -> R) -> R {
        let now = self.now();
        let r = f(&mut self.engines[i], now);
        self.drain(i);
        r
    }

    /// Runs datagrams and timers up to and including `until_ms`.
    pub fn run_until(&mut self, until_ms: u64) {
        let until = until_ms * MS;
        while let Some(next) = self.next_step_at().filter(|t| *t <= until) {
            self.now = next;
            self.step();
        }
        self.now = self.now.max(until);
    }

    fn next_timer(&self) -> Option<(u64, usize)> {
        (0..self.engines.len())
            .filter_map(|i| self.engines[i].poll_timeout().map(|t| (t.as_nanos(), i)))
            .min()
    }

    fn next_step_at(&self) -> Option<u64> {
        let packet = self.queue.peek().map(|Reverse(p)| p.0);
        let timer = self.next_timer().map(|t| t.0);
        packet.into_iter().chain(timer).min()
    }

    fn step(&mut self) {
        let now = self.now();
        if self.queue.peek().is_some_and(|Reverse(p)| p.0 == self.now) {
            let Reverse((_, _, to, from, bytes)) = self.queue.pop().expect("peeked");
            self.engines[to].handle_datagram(now, NodeId(from as u32), &bytes);
            self.drain(to);
        } else if let Some((_, i)) = self.next_timer() {
            self.engines[i].handle_timeout(now);
            self.drain(i);
        }
        if let Some(check) = self.check {
            self.engines.iter().for_each(check);
        }
    }
}

impl<E: Engine<Event = Event>> Net<E> {
    pub fn multicast(&mut self, from: usize, payload: &[u8]) -> Result<u64, SendError> {
        let now = self.now();
        let seq = self.engines[from].multicast(now, Bytes::copy_from_slice(payload))?;
        self.drain(from);
        Ok(seq)
    }

    pub fn delivered_seqs(&self, member: usize, source: u32) -> Vec<u64> {
        self.events[member]
            .iter()
            .filter_map(|e| match e {
                Event::Deliver { source: s, seq, .. } if s.0 == source => Some(*seq),
                _ => None,
            })
            .collect()
    }

    pub fn lost(&self, member: usize) -> Vec<SeqRange> {
        self.events[member]
            .iter()
            .filter_map(|e| match e {
                Event::Lost { range, .. } => Some(*range),
                _ => None,
            })
            .collect()
    }
}
