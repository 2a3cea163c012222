//! What the P000 scenarios share: the testbed model (hosts on one switch,
//! each with a CPU cost per datagram), the perturbation process, and a vsync
//! group on that testbed. P000 ran on an SP-2 and gives none of these
//! figures; `docs/reproduction.md` explains the choices.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::vsync::{self, Vsync};
use shoal_core::{Engine, Instant};

use super::{member_seed, ns};
use crate::metrics::SimEvent;
use crate::{LinkSpec, ProcessingCost, Sim, Topology};

/// The P000 hosts' CPU cost per datagram, in ns (with `cost`'s 5 ns per
/// byte, a 7 KB datagram takes 85 µs).
pub const HOST_NS: u64 = 50_000;

/// A host's CPU cost: `per_datagram_ns` plus 5 ns per byte handled or sent,
/// with a 256-datagram socket buffer.
pub fn cost(per_datagram_ns: u64) -> ProcessingCost {
    ProcessingCost {
        per_datagram_ns,
        per_byte_ns: 5.0,
        backlog_max: 256,
    }
}

/// Makes `sim`'s hosts P000's real machines: `cost` of CPU per datagram
/// (usually [`cost`]), and sockets that hold a sender while its interface is
/// busy rather than drop its datagrams (`Sim::set_blocking_sends`).
pub fn real_hosts<E: Engine<Event: SimEvent>>(sim: &mut Sim<E>, cost: ProcessingCost) {
    sim.set_processing_cost(cost);
    sim.set_blocking_sends(true);
}

/// `n` hosts (nodes 1..=n) on one 100 Mbit/s switch with 50 µs links.
pub fn switch(n: usize) -> (Topology, Vec<usize>) {
    let spec = LinkSpec {
        bandwidth_bps: 100e6,
        delay_ns: 50_000,
        loss: 0.0,
        queue_packets: 256,
    };
    (Topology::star(n, spec), (1..=n).collect())
}

/// A vsync-over-pbcast group of `n` on the switch, with `HOST_NS` hosts and
/// deliveries counted in bins of `bin_s` seconds.
pub fn vsync_group(n: usize, config: &vsync::Config, seed: u64, bin_s: f64) -> Sim<Vsync> {
    let (topology, hosts) = switch(n);
    let mut sim = Sim::new(&topology, &hosts, seed, |me, members| {
        Vsync::new(
            me,
            members,
            config.clone(),
            member_seed(seed, me),
            Instant::ZERO,
        )
        .expect("valid config")
    });
    real_hosts(&mut sim, cost(HOST_NS));
    sim.record_throughput(ns(bin_s));
    sim
}

/// A stretch of simulated time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub start_s: f64,
    pub seconds: f64,
}

/// P000's perturbation: during `window`, `host` sleeps through each 100 ms
/// slot with probability `p`.
pub fn perturb<E: Engine<Event: SimEvent>>(
    sim: &mut Sim<E>,
    host: usize,
    p: f64,
    window: Window,
    seed: u64,
) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xF1_u64);
    for slot in 0..(window.seconds / 0.1) as u64 {
        if rng.random::<f64>() < p {
            let from = ns(window.start_s) + slot * ns(0.1);
            sim.sleep(host, from, from + ns(0.1));
        }
    }
}

/// The first summary columns of a P000 run.
pub fn head(scenario: &str, protocol: &str, n: usize, seed: u64) -> Vec<(String, String)> {
    vec![
        ("scenario".into(), scenario.into()),
        ("protocol".into(), protocol.into()),
        ("group_size".into(), n.to_string()),
        ("seed".into(), seed.to_string()),
    ]
}
