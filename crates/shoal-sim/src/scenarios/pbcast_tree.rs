//! `pbcast-tree`: a balanced tree where every node is a member and the
//! sender is the root (P001 §C, "simulations of simple network topologies":
//! 100 messages/s of 210 bytes, 1.5 Mbit/s links, 0.1% loss per link).
//!
//! `protocol` picks the pbcast variant; the hierarchical ones gossip with
//! weights `1/k^d` by hop distance in the tree, `k` its branching factor
//! (P001 §D), held per distance class so that they run at 10^5 members.

use super::p001::{head, hop_hierarchy, Run};
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
    /// A pbcast variant (SRM is not offered here).
    pub protocol: Protocol,
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
            protocol: Protocol::Pbcast,
        }
    }
}

pub fn run(o: &Options) -> Report {
    assert!(!o.protocol.is_srm(), "pbcast-tree runs the pbcast variants");
    let spec = LinkSpec {
        bandwidth_bps: o.bandwidth_bps,
        ..LinkSpec::paper(o.loss)
    };
    let topology = Topology::tree(o.depth, o.branching, spec);
    let hosts: Vec<usize> = (0..topology.nodes).collect();
    let hierarchy = o
        .protocol
        .is_hierarchical()
        .then(|| hop_hierarchy(&topology, &hosts, o.branching as f64));
    Run {
        protocol: o.protocol,
        hierarchy,
        messages: (o.rate * o.duration).round() as u64,
        rate: o.rate,
        size: o.size,
        sleep: None,
        head: head("pbcast-tree", o.protocol, topology.nodes, o.seed, o.loss),
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

    /// Hierarchical gossip delivers everything too, and sends less gossip
    /// across the root's links than uniform gossip in the same tree.
    #[test]
    fn hierarchical_gossip_delivers_and_crosses_the_root_less() {
        let options = |protocol| Options {
            depth: 4,
            branching: 3,
            loss: 0.01,
            duration: 3.0,
            bandwidth_bps: 100e6,
            protocol,
            ..Options::default()
        };
        let flat = run(&options(Protocol::Pbcast));
        let hier = run(&options(Protocol::PbcastHier));
        assert!(hier.complete, "{:?} {:?}", hier.summary, hier.violations);
        let field = |r: &Report, name: &str| -> f64 {
            r.summary
                .iter()
                .find(|(k, _)| k == name)
                .unwrap_or_else(|| panic!("no {name} in {:?}", r.summary))
                .1
                .parse()
                .unwrap()
        };
        let (f, h) = (
            field(&flat, "sender_link_busiest_way"),
            field(&hier, "sender_link_busiest_way"),
        );
        assert!(h < f, "root link busiest way: hierarchical {h}, flat {f}");
    }
}
