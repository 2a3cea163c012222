//! `spread-fig6-chain` (P-Spread §4.3, Figs 6-7): the 5-link chain Mae
//! East-UCSB-OSU-Rutgers-CNDS-Hopkins, 1024-byte echoes from Mae East to
//! each other site in turn, Hop and TCP links, background loss 0, 0.5, 1
//! and 2%. Paper: Hop within 5-18% of the summed pings at every hop, TCP
//! 38-66%. `fig6.svg` is the RTT, `fig7.svg` the overhead over ping.

use super::spread_sim::{chain_figure, CNDS, HOPKINS, MAE_EAST, OSU, RUTGERS, UCSB};
use super::{Figure, Scale};

pub const NAME: &str = "spread-fig6-chain";

pub fn run(scale: Scale) -> Figure {
    let order = [MAE_EAST, UCSB, OSU, RUTGERS, CNDS, HOPKINS];
    chain_figure(NAME, &order, scale, "fig6", "fig7")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without loss both protocols sit near ping; under 2% loss TCP pays
    /// clearly more than Hop summed over the five receivers, and more at
    /// each receiver three or more links away.
    #[test]
    fn tcp_pays_more_than_hop_for_loss() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at = |p: &str, loss: &str, links: usize| {
            let l = links.to_string();
            f.values(
                "overhead_pct",
                &[("protocol", p), ("loss", loss), ("links", &l)],
            )[0]
        };
        let total = |p: &str| (1..=5).map(|k| at(p, "0.02", k)).sum::<f64>();
        assert!(total("tcp") > 1.5 * total("hop"));
        for links in 1..=5 {
            assert!(at("hop", "0", links) < 10.0, "hop at {links} links");
        }
        for links in 3..=5 {
            assert!(
                at("tcp", "0.02", links) > at("hop", "0.02", links),
                "{links} links"
            );
        }
    }
}
