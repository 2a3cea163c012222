//! `p001-fig1-tree` (P001 §C, Fig 1 top and middle; notes E1-1, E1-2):
//! dense trees of 20-80 nodes, depth 4, every node a member, the sender at
//! the root, 100 messages/s of 210 B, 1.5 Mbit/s links, 0.1% loss per link.
//! Requests and repairs received per member per second, and the sender's
//! link utilisation, for SRM, adaptive SRM, pbcast and pbcast-IPMC.

use super::p001::{overhead_notes, overhead_plots, Setup, Sweep};
use super::{Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};

pub const NAME: &str = "p001-fig1-tree";

pub const PROTOCOLS: [Protocol; 4] = [
    Protocol::Srm,
    Protocol::SrmAdaptive,
    Protocol::Pbcast,
    Protocol::PbcastIpmc,
];

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[20, 30, 40, 50, 60, 70, 80], &[20, 50, 80]);
    let loss = 0.001;
    let seconds = scale.pick(100.0, 20.0);
    Sweep::p001(NAME, &PROTOCOLS, sizes, scale, loss, seconds).run(&mut figure, &|n, _seed| {
        Setup::everyone(Topology::tree_of(n, 4, LinkSpec::paper(loss)))
    });
    overhead_plots(&mut figure, "dense tree, depth 4, 0.1% loss");
    overhead_notes(&mut figure, &PROTOCOLS, *sizes.last().expect("sizes"));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P001's shape on quick runs: SRM's overhead grows with group size
    /// while pbcast's stays nearly flat, and at 80 members pbcast's recovery
    /// overhead is well below SRM's. Every protocol delivers everything.
    #[test]
    fn srm_grows_with_the_group_and_pbcast_stays_flat() {
        let f = run(Scale::quick(1));
        assert!(f.complete(), "{:?}", f.incomplete);
        let overhead = |p: Protocol, n| {
            f.mean("requests_per_s", p.name(), n) + f.mean("repairs_per_s", p.name(), n)
        };
        for p in [Protocol::Srm, Protocol::SrmAdaptive] {
            assert!(
                overhead(p, 80) > 1.5 * overhead(p, 20),
                "{} grows: {} -> {}",
                p.name(),
                overhead(p, 20),
                overhead(p, 80)
            );
        }
        let pb = (
            overhead(Protocol::Pbcast, 20),
            overhead(Protocol::Pbcast, 80),
        );
        assert!(pb.1 < 2.0 * pb.0.max(0.05), "pbcast nearly flat: {pb:?}");
        assert!(
            overhead(Protocol::Pbcast, 80) * 3.0 < overhead(Protocol::Srm, 80),
            "pbcast well below SRM at 80"
        );
    }
}
