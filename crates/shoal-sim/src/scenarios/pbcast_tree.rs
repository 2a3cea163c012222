//! `pbcast-tree`: a balanced tree where every node is a member and the
//! sender is the root (P001 §C, "simulations of simple network topologies":
//! 100 messages/s of 210 bytes, 1.5 Mbit/s links, 0.1% loss per link).

use std::time::Instant as WallInstant;

use shoal_core::pbcast::Pbcast;
use shoal_core::Instant;

use super::{drain_ns, ns, paper_pbcast};
use crate::report::{Report, Wall};
use crate::{LinkSpec, Sim, Topology};

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub depth: u32,
    pub branching: usize,
    pub loss: f64,
    /// Messages per second.
    pub rate: f64,
    /// Seconds of sending.
    pub duration: f64,
    pub size: u32,
    /// Link bandwidth in bit/s (P001: 1.5 Mbit/s).
    pub bandwidth_bps: f64,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            depth: 4,
            branching: 3,
            loss: 0.001,
            rate: 100.0,
            duration: 100.0,
            size: 210,
            bandwidth_bps: 1.5e6,
            seed: 1,
        }
    }
}

pub fn run(o: &Options) -> Report {
    let started = WallInstant::now();
    let spec = LinkSpec {
        bandwidth_bps: o.bandwidth_bps,
        ..LinkSpec::paper(o.loss)
    };
    let topology = Topology::tree(o.depth, o.branching, spec);
    let hosts: Vec<usize> = (0..topology.nodes).collect();
    let config = paper_pbcast();
    let drain = drain_ns(&config);
    let seed = o.seed;
    let mut sim = Sim::new(&topology, &hosts, seed, |me, members| {
        let seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(me.0);
        Pbcast::new(me, members, config.clone(), seed, Instant::ZERO).expect("valid config")
    });
    let messages = (o.rate * o.duration).round() as u64;
    let gap = ns(1.0 / o.rate);
    sim.schedule_stream(0, ns(0.5), gap, messages, o.size);
    let end = ns(0.5) + gap * messages + drain;
    sim.run_until(end);
    let head = vec![
        ("scenario".into(), "pbcast-tree".into()),
        ("protocol".into(), "pbcast".into()),
        ("group_size".into(), topology.nodes.to_string()),
        ("seed".into(), o.seed.to_string()),
        ("loss".into(), o.loss.to_string()),
    ];
    let mut report = Report::collect(&sim, head, messages, end);
    report.wall = Wall {
        seconds: started.elapsed().as_secs_f64(),
        events: sim.events,
    };
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_tree_delivers_everything() {
        let report = run(&Options {
            depth: 3,
            branching: 3,
            loss: 0.01,
            duration: 5.0,
            ..Options::default()
        });
        assert!(
            report.complete,
            "{:?} {:?}",
            report.summary, report.violations
        );
    }
}
