//! Named experiments, one per file (`shoal sim <name>`).

pub mod pbcast_star;
pub mod pbcast_tree;

use std::time::Instant as WallInstant;

use shoal_core::pbcast::{Config, Pbcast};
use shoal_core::Instant;

use crate::report::{Report, Wall};
use crate::{Sim, Topology};

/// Names `shoal sim` accepts.
pub const NAMES: [&str; 2] = ["pbcast-star", "pbcast-tree"];

/// pbcast as the papers simulate it: IP multicast first phase, fixed-rate
/// sender (no flow control), Ethernet-sized datagrams.
pub fn paper_pbcast() -> Config {
    Config {
        ip_multicast: true,
        send_window: None,
        max_datagram_size: 1472,
        ..Config::default()
    }
}

/// Seconds to nanoseconds.
pub(crate) fn ns(seconds: f64) -> u64 {
    (seconds * 1e9) as u64
}

/// Simulated time after the last message for repair to finish: past the
/// point where a gap is declared lost (`lost_after_rounds`), with margin.
pub(crate) fn drain_ns(config: &Config) -> u64 {
    let rounds = u64::from(config.lost_after_rounds.get()) + 10;
    config.gossip_interval.as_nanos() as u64 * rounds
}

/// One pbcast run: members on `hosts`, member 0 sends `messages` of `size`
/// bytes at `rate` per second from 0.5 s, optional (member, start s,
/// length s) sleep, then a drain long enough for repair to finish.
pub(crate) struct PbcastRun<'a> {
    pub topology: &'a Topology,
    pub hosts: &'a [usize],
    pub messages: u64,
    pub rate: f64,
    pub size: u32,
    pub sleep: Option<(usize, f64, f64)>,
    pub seed: u64,
    /// Leading summary columns (scenario, protocol, group size, ...).
    pub head: Vec<(String, String)>,
}

impl PbcastRun<'_> {
    pub fn run(self) -> Report {
        let started = WallInstant::now();
        let config = paper_pbcast();
        let drain = drain_ns(&config);
        let seed = self.seed;
        let mut sim = Sim::new(self.topology, self.hosts, seed, |me, members| {
            let seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(me.0);
            Pbcast::new(me, members, config.clone(), seed, Instant::ZERO).expect("valid config")
        });
        let gap = ns(1.0 / self.rate);
        sim.schedule_stream(0, ns(0.5), gap, self.messages, self.size);
        if let Some((member, start, length)) = self.sleep {
            sim.sleep(member, ns(start), ns(start + length));
        }
        let end = ns(0.5) + gap * self.messages + drain;
        sim.run_until(end);
        if std::env::var_os("SHOAL_SIM_DEBUG").is_some() {
            for (i, (_, m)) in sim.hosts().enumerate() {
                if !m.lost_ranges.is_empty() {
                    eprintln!("member {i} lost {:?}", m.lost_ranges);
                }
            }
        }
        let mut report = Report::collect(&sim, self.head, self.messages, end);
        report.wall = Wall {
            seconds: started.elapsed().as_secs_f64(),
            events: sim.events,
        };
        report
    }
}

/// The first summary columns every scenario writes.
pub(crate) fn head(
    scenario: &str,
    group_size: usize,
    seed: u64,
    loss: f64,
) -> Vec<(String, String)> {
    vec![
        ("scenario".into(), scenario.into()),
        ("protocol".into(), "pbcast".into()),
        ("group_size".into(), group_size.to_string()),
        ("seed".into(), seed.to_string()),
        ("loss".into(), loss.to_string()),
    ]
}
