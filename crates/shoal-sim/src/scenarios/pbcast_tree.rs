//! `pbcast-tree`: a balanced tree where every node is a member and the
//! sender is the root (P001 §C, "simulations of simple network topologies":
//! 100 messages/s of 210 bytes, 1.5 Mbit/s links, 0.1% loss per link).

use super::p001::{head, Run};
use super::Protocol;
use crate::report::Report;
use crate::{LinkSpec, Topology};

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
    let spec = LinkSpec {
        bandwidth_bps: o.bandwidth_bps,
        ..LinkSpec::paper(o.loss)
    };
    let topology = Topology::tree(o.depth, o.branching, spec);
    let hosts: Vec<usize> = (0..topology.nodes).collect();
    Run {
        messages: (o.rate * o.duration).round() as u64,
        rate: o.rate,
        size: o.size,
        sleep: None,
        head: head(
            "pbcast-tree",
            Protocol::Pbcast,
            topology.nodes,
            o.seed,
            o.loss,
        ),
        ..Run::new(&topology, &hosts, o.seed)
    }
    .run()
    .report
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
