//! `p001-fig1-star` (P001 §C, Fig 1 bottom; notes E1-3): one router, the
//! sender and the receivers on the rim, every receiver equidistant, which
//! defeats SRM's distance-based suppression. Same traffic as the tree.

use super::p001::{overhead_notes, overhead_plots, Setup, Sweep};
use super::{Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};

pub const NAME: &str = "p001-fig1-star";

pub const PROTOCOLS: [Protocol; 4] = super::p001_fig1_tree::PROTOCOLS;

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[20, 30, 40, 50, 60, 70, 80], &[20, 50, 80]);
    let loss = 0.001;
    let seconds = scale.pick(100.0, 20.0);
    Sweep::p001(NAME, &PROTOCOLS, sizes, scale, loss, seconds).run(&mut figure, &|n, _seed| {
        let topology = Topology::star(n, LinkSpec::paper(loss));
        let hosts = (1..=n).collect();
        Setup {
            hosts,
            ..Setup::everyone(topology)
        }
    });
    overhead_plots(&mut figure, "star, 0.1% loss");
    let largest = *sizes.last().expect("sizes");
    overhead_notes(&mut figure, &PROTOCOLS, largest);
    for p in [Protocol::Srm, Protocol::SrmAdaptive] {
        let ratio = figure.mean("repairs_per_s", p.name(), largest)
            / figure.mean("requests_per_s", p.name(), largest).max(1e-9);
        figure.notes.push(format!(
            "n={largest} {}: {ratio:.2} repairs per request",
            p.name()
        ));
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In the star SRM sends several repairs per request (P000 §2.4: 3-5):
    /// equidistant holders defeat repair suppression. (At 80 members SRM's
    /// repairs saturate the links and requests multiply too; see
    /// docs/reproduction.md.)
    #[test]
    fn srm_sends_several_repairs_per_request_in_the_star() {
        let f = run(Scale::quick(1));
        assert!(f.complete(), "{:?}", f.incomplete);
        for n in [20, 50] {
            let srm = |c| f.mean(c, "srm", n);
            assert!(
                srm("repairs_per_s") > 2.0 * srm("requests_per_s"),
                "n={n}: repairs {} requests {}",
                srm("repairs_per_s"),
                srm("requests_per_s")
            );
        }
    }
}
