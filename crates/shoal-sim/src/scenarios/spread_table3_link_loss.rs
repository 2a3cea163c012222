//! `spread-table3-link-loss` (P-Spread §4.3, Table 3): 1 KB reliable
//! messages from Mae East to UCSB over one overlay link with 0, 5, 10 and
//! 20% added loss; the throughput as a share of the loss-free run. Paper
//! (Hop only): 1378.8 Kbit/s, then 92.0, 80.8 and 72.2%. Goal: at least 80%
//! at 20% loss. TCP links are run too (the paper did not).

use super::spread_sim::{loss_table, Edge, MAE_EAST, UCSB, WAN_BPS};
use super::{Figure, Scale};

pub const NAME: &str = "spread-table3-link-loss";

pub fn run(scale: Scale) -> Figure {
    let edges = [Edge {
        a: MAE_EAST,
        b: UCSB,
        rtt_ms: 104.0,
        bandwidth_bps: WAN_BPS,
    }];
    loss_table(
        NAME,
        &edges,
        MAE_EAST,
        scale,
        "Mae East-UCSB throughput under added loss",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hop's throughput falls with loss but keeps most of the link, and
    /// more of it than TCP at every added loss.
    #[test]
    fn hop_degrades_gracefully_and_better_than_tcp() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at = |p: &str, loss: &str| {
            f.values(
                "pct_of_lossless",
                &[
                    ("protocol", p),
                    ("added_loss", loss),
                    ("loss_model", "per-direction"),
                ],
            )[0]
        };
        assert!(at("hop", "0.05") > at("hop", "0.2"));
        assert!(at("hop", "0.2") > 50.0);
        for loss in ["0.05", "0.1", "0.2"] {
            assert!(at("hop", loss) > at("tcp", loss), "{loss}");
        }
    }
}
