//! `p001-fig2-sparse` (P001 §C, Fig 2; notes E1-4): a 1093-node tree (depth
//! 6, branching 3; the paper says "about 1000 nodes"), 20-100 members placed
//! at random, 0.1% loss per link, 100 messages/s of 210 B from one member.

use super::p001::{overhead_notes, overhead_plots, pick_distinct, Setup, Sweep};
use super::{Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

pub const NAME: &str = "p001-fig2-sparse";

pub const PROTOCOLS: [Protocol; 4] = super::p001_fig1_tree::PROTOCOLS;

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[20, 40, 60, 80, 100], &[20, 60, 100]);
    let loss = 0.001;
    let seconds = scale.pick(100.0, 10.0);
    Sweep::p001(NAME, &PROTOCOLS, sizes, scale, loss, seconds).run(&mut figure, &|n, seed| {
        let topology = Topology::tree(6, 3, LinkSpec::paper(loss));
        // The same placement for every protocol of one (size, seed).
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ (n as u64) << 32);
        let hosts = pick_distinct(&mut rng, topology.nodes, n);
        Setup {
            hosts,
            ..Setup::everyone(topology)
        }
    });
    overhead_plots(&mut figure, "sparse group in a 1093-node tree");
    overhead_notes(&mut figure, &PROTOCOLS, *sizes.last().expect("sizes"));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sparse group shows the dense tree's shape, more strongly.
    #[test]
    fn srm_overhead_grows_and_pbcast_stays_below() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        assert!(f.complete(), "{:?}", f.incomplete);
        let overhead = |p: &str, n| f.mean("requests_per_s", p, n) + f.mean("repairs_per_s", p, n);
        assert!(overhead("srm", 100) > overhead("srm", 20));
        assert!(overhead("pbcast", 100) * 3.0 < overhead("srm", 100));
    }
}
