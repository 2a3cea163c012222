//! A virtual-time network for vsync and traditional-stack tests: members
//! that start late (joins), crash, or sleep (a sleeping member's datagrams
//! wait in its socket buffer and its timers fire when it wakes, P000 §2.1's
//! perturbation). Seeded loss and a jittered delay. No tokio, no clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::engine::{Destination, Engine, NodeId, SendError};
use crate::time::Instant;

pub const MS: u64 = 1_000_000;

/// (arrival ns, order, to, from, datagram)
type InFlight = Reverse<(u64, u64, usize, usize, Bytes)>;

pub struct Sim<E: Engine> {
    pub nodes: Vec<Option<E>>,
    pub crashed: Vec<bool>,
    asleep_until: Vec<u64>,
    queue: BinaryHeap<InFlight>,
    order: u64,
    now: u64,
    /// One-way delay, plus up to `jitter`, in ns.
    pub delay: u64,
    pub jitter: u64,
    pub loss: f64,
    rng: Xoshiro256PlusPlus,
    /// Events with the time (ns) they were polled.
    pub events: Vec<Vec<(u64, E::Event)>>,
    pub check: Option<fn(&E)>,
    /// Drops a datagram when it returns true: `(now ns, from, to, bytes)`.
    /// For tests that lose one chosen message (a replayed failure).
    pub drop_if: Option<DropFilter>,
}

pub type DropFilter = Box<dyn FnMut(u64, usize, usize, &[u8]) -> bool>;

impl<E: Engine> Sim<E> {
    /// Room for `n` members; none started.
    pub fn new(n: usize, seed: u64) -> Sim<E> {
        Sim {
            nodes: (0..n).map(|_| None).collect(),
            crashed: vec![false; n],
            asleep_until: vec![0; n],
            queue: BinaryHeap::new(),
            order: 0,
            now: 0,
            delay: MS,
            jitter: 0,
            loss: 0.0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            events: (0..n).map(|_| Vec::new()).collect(),
            check: None,
            drop_if: None,
        }
    }

    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    pub fn now_ms(&self) -> u64 {
        self.now / MS
    }

    pub fn start(&mut self, i: usize, engine: E) {
        self.nodes[i] = Some(engine);
        self.drain(i);
    }

    pub fn node(&mut self, i: usize) -> &mut E {
        self.nodes[i].as_mut().expect("node started")
    }

    pub fn alive(&self, i: usize) -> bool {
        self.nodes[i].is_some() && !self.crashed[i]
    }

    pub fn crash(&mut self, i: usize) {
        self.crashed[i] = true;
    }

    /// Member `i` does nothing until `until_ms`.
    pub fn sleep(&mut self, i: usize, until_ms: u64) {
        self.asleep_until[i] = self.asleep_until[i].max(until_ms * MS);
    }

    pub fn asleep(&self, i: usize) -> bool {
        self.asleep_until[i] > self.now
    }

    /// Calls `multicast` on member `i` now (if it is up) and sends its output.
    pub fn multicast(&mut self, i: usize, payload: &[u8]) -> Result<u64, SendError> {
        if !self.alive(i) || self.asleep(i) {
            return Err(SendError::WindowFull);
        }
        let now = self.now();
        let result = self.node(i).multicast(now, Bytes::copy_from_slice(payload));
        self.drain(i);
        result
    }

    /// Runs `f` on member `i` now and sends its output.
    pub fn with(&mut self, i: usize, f: impl FnOnce(&mut E, Instant)) {
        let now = self.now();
        f(self.node(i), now);
        self.drain(i);
    }

    fn send(&mut self, from: usize, to: usize, bytes: Bytes) {
        if to >= self.nodes.len() || self.rng.random::<f64>() < self.loss {
            return;
        }
        if let Some(drop_if) = self.drop_if.as_mut() {
            if drop_if(self.now, from, to, &bytes) {
                return;
            }
        }
        let jitter = if self.jitter > 0 {
            self.rng.random_range(0..self.jitter)
        } else {
            0
        };
        self.order += 1;
        let at = self.now + self.delay + jitter;
        self.queue.push(Reverse((at, self.order, to, from, bytes)));
    }

    fn drain(&mut self, i: usize) {
        let now = self.now();
        let Some(node) = self.nodes[i].as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(t) = node.poll_transmit(now) {
            out.push(t);
        }
        let mut events = Vec::new();
        while let Some(ev) = node.poll_event() {
            events.push((self.now, ev));
        }
        self.events[i].extend(events);
        for t in out {
            match t.destination {
                Destination::Node(to) => self.send(i, to.0 as usize, t.payload),
                Destination::Multicast => {
                    for to in (0..self.nodes.len()).filter(|to| *to != i) {
                        self.send(i, to, t.payload.clone());
                    }
                }
            }
        }
    }

    fn next_timer(&self) -> Option<(u64, usize)> {
        (0..self.nodes.len())
            .filter(|i| self.alive(*i))
            .filter_map(|i| {
                let t = self.nodes[i].as_ref()?.poll_timeout()?.as_nanos();
                Some((t.max(self.asleep_until[i]), i))
            })
            .min()
    }

    /// Runs datagrams and timers up to and including `until_ms`.
    pub fn run_until(&mut self, until_ms: u64) {
        let until = until_ms * MS;
        loop {
            let packet = self.queue.peek().map(|Reverse(p)| p.0);
            let timer = self.next_timer();
            let next = packet.into_iter().chain(timer.map(|t| t.0)).min();
            let Some(next) = next.filter(|t| *t <= until) else {
                break;
            };
            self.now = self.now.max(next);
            if packet == Some(next) {
                self.deliver_one();
            } else if let Some((_, i)) = timer {
                let now = self.now();
                self.node(i).handle_timeout(now);
                self.drain(i);
                self.run_check(i);
            }
        }
        self.now = self.now.max(until);
    }

    fn deliver_one(&mut self) {
        let Some(Reverse((at, order, to, from, bytes))) = self.queue.pop() else {
            return;
        };
        if !self.alive(to) {
            return;
        }
        if self.asleep_until[to] > at {
            let wake = self.asleep_until[to];
            self.queue.push(Reverse((wake, order, to, from, bytes)));
            return;
        }
        let now = self.now();
        self.node(to)
            .handle_datagram(now, NodeId(from as u32), &bytes);
        self.drain(to);
        self.run_check(to);
    }

    fn run_check(&self, i: usize) {
        if let (Some(check), Some(node)) = (self.check, self.nodes[i].as_ref()) {
            check(node);
        }
    }
}
