//! `p001-fig2-sparse-10x`: P001 Fig 2 (a sparse group in a large tree)
//! pushed past the paper's sizes: up to 10^4 members placed at random in
//! an 88,573-node tree (depth 10, branching 3), against the paper's 20-100
//! members in about 1000 nodes. Same links (1.5 Mbit/s, 5 ms, 50-packet
//! queues, 0.1% loss per link) and traffic (100 messages/s of 210 B from one
//! member), for SRM, adaptive SRM, pbcast, pbcast-IPMC, pbcast-grb and
//! hierarchical pbcast.
//!
//! The full scale sends for 10 s, not the paper's 100 s: at 10^4 members a
//! multicast reaches most of the 88,573 nodes, so each message is ~10^5
//! events, and 10 s is already ~10^8 per run. The quick scale (in
//! `shoal sim all --quick`) keeps the shape at a size that runs in seconds:
//! 100 and 300 members in a 3,280-node tree (depth 7), 1 s of sending, one
//! seed. Hierarchical gossip holds the tree once and a weight per distance
//! in each member (`GossipTree`), so it runs at every size.

use super::p001::{overhead_notes, overhead_plots, pick_distinct, Setup, Sweep};
use super::{Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

pub const NAME: &str = "p001-fig2-sparse-10x";

pub const PROTOCOLS: [Protocol; 6] = [
    Protocol::Srm,
    Protocol::SrmAdaptive,
    Protocol::Pbcast,
    Protocol::PbcastIpmc,
    Protocol::PbcastGrb,
    Protocol::PbcastHier,
];

/// Tree depth (branching 3): full 10 (88,573 nodes), quick 7 (3,280).
fn depth(scale: Scale) -> u32 {
    scale.pick(10, 7)
}

pub fn run(scale: Scale) -> Figure {
    let sizes: &[usize] = scale.pick(&[1_000, 2_500, 5_000, 10_000], &[100, 300]);
    let flat = &PROTOCOLS[..PROTOCOLS.len() - 1];
    sweep(scale, sizes, flat, true)
}

/// The figure for `sizes`, running the flat protocols `flat` and, if
/// `hier`, hierarchical pbcast.
fn sweep(scale: Scale, sizes: &[usize], flat: &[Protocol], hier: bool) -> Figure {
    let mut figure = Figure::new(NAME);
    let loss = 0.001;
    let seconds = scale.pick(10.0, 1.0);
    let scale = Scale {
        seeds: scale.pick(scale.seeds, 1),
        ..scale
    };
    let depth = depth(scale);
    let setup = |n: usize, seed: u64| {
        let topology = Topology::tree(depth, 3, LinkSpec::paper(loss));
        // The same placement for every protocol of one (size, seed).
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ (n as u64) << 32);
        let hosts = pick_distinct(&mut rng, topology.nodes, n);
        Setup {
            hosts,
            ..Setup::everyone(topology)
        }
    };
    Sweep::p001(NAME, flat, sizes, scale, loss, seconds).run(&mut figure, &setup);
    let hier_sizes: Vec<usize> = sizes.iter().copied().filter(|_| hier).collect();
    Sweep::p001(
        NAME,
        &[Protocol::PbcastHier],
        &hier_sizes,
        scale,
        loss,
        seconds,
    )
    .run(&mut figure, &|n, seed| {
        setup(n, seed).with_hop_hierarchy(3.0)
    });
    let nodes = Topology::tree(depth, 3, LinkSpec::paper(loss)).nodes;
    overhead_plots(
        &mut figure,
        &format!("sparse group in a {nodes}-node tree (10x P001 Fig 2)"),
    );
    overhead_notes(&mut figure, &PROTOCOLS, *sizes.last().expect("sizes"));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the quick scale's smaller size (100 members in the 3,280-node
    /// tree) SRM and pbcast complete, and pbcast's recovery overhead stays
    /// well below SRM's. (The whole quick figure, with SRM at 300 members,
    /// is 33 M events: `shoal sim all --quick` runs it, not the tests.)
    #[test]
    fn pbcast_stays_below_srm_at_the_quick_scale() {
        let protocols = [Protocol::Srm, Protocol::Pbcast];
        let f = sweep(Scale::quick(1), &[100], &protocols, false);
        assert!(f.complete(), "{:?}", f.incomplete);
        let overhead = |p: &str, n| f.mean("requests_per_s", p, n) + f.mean("repairs_per_s", p, n);
        assert!(overhead("pbcast", 100) * 10.0 < overhead("srm", 100));
    }
}
