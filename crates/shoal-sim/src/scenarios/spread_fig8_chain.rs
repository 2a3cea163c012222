//! `spread-fig8-chain` (P-Spread §4.3, Figs 8-9): the same chain, echoes
//! from Hopkins. Paper: ping jumps at the long links past OSU, TCP more
//! so; Hop's overhead in percent is highest on the short campus hops
//! (where IPC and processing dominate) and falls as the path grows.
//! `fig8.svg` is the RTT, `fig9.svg` the overhead over ping.

use super::spread_sim::{chain_figure, CNDS, HOPKINS, MAE_EAST, OSU, RUTGERS, UCSB};
use super::{Figure, Scale};

pub const NAME: &str = "spread-fig8-chain";

pub fn run(scale: Scale) -> Figure {
    let order = [HOPKINS, CNDS, RUTGERS, OSU, UCSB, MAE_EAST];
    chain_figure(NAME, &order, scale, "fig8", "fig9")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hop's relative overhead falls as the path lengthens: it is larger
    /// one link away (0.5 ms of ping) than five links away.
    #[test]
    fn hop_overhead_falls_with_distance() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at = |links: &str| {
            f.values(
                "overhead_pct",
                &[("protocol", "hop"), ("loss", "0"), ("links", links)],
            )[0]
        };
        assert!(at("1") > at("5"));
    }
}
