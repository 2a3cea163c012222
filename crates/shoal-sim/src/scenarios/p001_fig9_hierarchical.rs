//! `p001-fig9-hierarchical` (P001 §F, Fig 9; notes E1-11): two LANs joined
//! by a router, 100 messages/s, gossip every 100 ms. Plain gossip sends
//! about half its messages across the router, a load linear in n;
//! hierarchical weights (1/k^d) cut it to a constant; the fast variant
//! (shorter rounds) wins back latency for a little more router load.
//!
//! The paper's testbed is 26 machines as clusters of 15 and 11; we sweep n
//! with the same 15:11 split. The hierarchy has two levels, own cluster
//! (d = 0) and other cluster (d = 1), and k is the size of the gossiper's
//! cluster, the branching factor of that level: the far cluster then gets
//! about one k-th of a member's gossip whatever n is.
//!
//! P001: "No noise was injected", and the figure counts "additional
//! overhead associated with retransmission requests and repairs" all the
//! same, from the real LAN's own losses. The figure runs the paper's
//! setting (no loss; files `*-no-loss-*`) and, since without loss
//! nothing is repaired and the variants' latencies cannot differ, a
//! second reading with 1% loss on the LAN links (`*-lan-loss-*`).

use shoal_core::pbcast::Delivery;
use shoal_wire::Kind;

use super::p001::{head, hop_hierarchy, lan, Finished, Run};
use super::{run_parallel, Figure, Hierarchy, Protocol, Scale};
use crate::Topology;

pub const NAME: &str = "p001-fig9-hierarchical";

pub const PROTOCOLS: [Protocol; 3] = [
    Protocol::Pbcast,
    Protocol::PbcastHier,
    Protocol::PbcastHierFast,
];

/// Cluster sizes for a group of `n` in the paper's 15:11 proportion.
fn split(n: usize) -> (usize, usize) {
    let a = (n * 15).div_ceil(26);
    (a, n - a)
}

/// The two-level hierarchy over the two LANs (a tree: switch A, its
/// hosts, and switch B below it with its hosts): a member is 2 hops from
/// its own cluster's members and 3 from the other's, so with one base for
/// everyone, the mean cluster size, the other cluster weighs `1/base` of
/// its own per member, the levels 0 and 1 of the module's note.
fn hierarchy(topology: &Topology, hosts: &[usize]) -> Hierarchy {
    let base = hosts.len() as f64 / 2.0;
    hop_hierarchy(topology, hosts, base)
}

/// The LAN links' loss of each reading: the paper's none, and 1%.
pub const LOSSES: [(&str, f64); 2] = [("no-loss", 0.0), ("lan-loss", 0.01)];

/// Both readings; `summary.csv` tells them apart by `loss` and `reading`.
pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    for (tag, loss) in LOSSES {
        let heading = format!("{}% loss on the LAN links:", loss * 100.0);
        figure.absorb(run_at(scale, tag, loss), "reading", tag, &heading);
    }
    figure
}

/// One reading: `loss` on every LAN link (the link between the switches
/// is lossless), plots named `{NAME}-{tag}-*.svg`.
pub fn run_at(scale: Scale, tag: &str, loss: f64) -> Figure {
    let mut figure = Figure::new(&format!("{NAME}-{tag}"));
    let sizes: &[usize] = scale.pick(&[16, 26, 40, 60, 80], &[16, 26, 52]);
    let seconds = scale.pick(60.0, 10.0);
    let mut configs = Vec::new();
    for &n in sizes {
        for p in PROTOCOLS {
            for seed in scale.seeds() {
                configs.push((n, p, seed));
            }
        }
    }
    let jobs: Vec<Box<dyn FnOnce() -> Finished + Send>> = configs
        .iter()
        .map(|&(n, protocol, seed)| {
            Box::new(move || {
                let (a, b) = split(n);
                let topology = Topology::two_clusters(a, b, lan(loss), lan(0.0));
                let hosts: Vec<usize> = (2..topology.nodes).collect();
                Run {
                    protocol,
                    delivery: Delivery::Fifo,
                    messages: (100.0 * seconds) as u64,
                    hierarchy: Some(hierarchy(&topology, &hosts)),
                    watch: vec![(0, 1), (1, 0)],
                    head: head(NAME, protocol, n, seed, loss),
                    inputs: scale.inputs,
                    ..Run::new(&topology, &hosts, seed)
                }
                .run()
            }) as Box<dyn FnOnce() -> Finished + Send>
        })
        .collect();
    let runs = run_parallel(jobs);
    for r in &runs {
        figure.add_run(&r.report);
        let row = figure.rows.last_mut().expect("just added");
        // Protocol messages (everything but the data's first phase)
        // crossing the router, both ways, while sending, per second of
        // sending.
        let crossing: u64 = r
            .link_kinds
            .iter()
            .map(|k| k.iter().sum::<u64>() - k[Kind::Data.index()])
            .sum();
        let gossip: u64 = r.link_kinds.iter().map(|k| k[Kind::Gossip.index()]).sum();
        let per_s = |c: u64| format!("{:.2}", c as f64 / r.send_seconds);
        row.push(("router_protocol_msgs_per_s".into(), per_s(crossing)));
        row.push(("router_gossip_per_s".into(), per_s(gossip)));
    }
    let (name, percent) = (figure.name.clone(), loss * 100.0);
    figure.plot_by_group_size(
        &format!("{name}-router.svg"),
        &format!("protocol messages crossing the router, {percent}% LAN loss"),
        "router_protocol_msgs_per_s",
        "messages/s while sending",
    );
    figure.plot_by_group_size(
        &format!("{name}-latency.svg"),
        &format!("99th percentile latency, {percent}% LAN loss"),
        "latency_p99_ms",
        "ms",
    );
    for &n in sizes {
        for p in PROTOCOLS {
            let router = figure.mean("router_protocol_msgs_per_s", p.name(), n);
            let p99 = figure.mean("latency_p99_ms", p.name(), n);
            figure.notes.push(format!(
                "n={n:<3} {:<17} across the router {router:>7.1} msgs/s   latency p99 {p99:>6.1} ms",
                p.name()
            ));
        }
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In the paper's setting (no loss), plain gossip's router load grows
    /// with n; hierarchical gossip's stays about flat and well below it.
    #[test]
    fn hierarchical_router_load_is_flat_and_plain_grows() {
        let scale = Scale {
            seeds: 1,
            ..Scale::quick(1)
        };
        let f = run_at(scale, "no-loss", 0.0);
        assert!(f.complete(), "{:?}", f.incomplete);
        let load = |p: Protocol, n| f.mean("router_protocol_msgs_per_s", p.name(), n);
        let (plain16, plain52) = (load(Protocol::Pbcast, 16), load(Protocol::Pbcast, 52));
        let (hier16, hier52) = (
            load(Protocol::PbcastHier, 16),
            load(Protocol::PbcastHier, 52),
        );
        assert!(
            plain52 > 2.5 * plain16,
            "plain grows: {plain16} -> {plain52}"
        );
        assert!(
            hier52 < 1.6 * hier16,
            "hierarchical flat: {hier16} -> {hier52}"
        );
        assert!(hier52 * 3.0 < plain52);
    }
}
