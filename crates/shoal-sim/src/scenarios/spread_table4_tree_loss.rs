//! `spread-table4-tree-loss` (P-Spread §4.3, Table 4): 1 KB reliable
//! messages from Mae East, the root of the Fig 1 multicast tree (six sites,
//! five links; edges assumed, see `spread_sim::tree_edges`), with 0, 5, 10
//! and 20% added loss on every link; the slowest receiver's throughput as a
//! share of the loss-free run. Paper (Hop only): 2202.8 Kbit/s, then 94.9,
//! 82.1 and 63.0%. Goal: at least 75% at 20% loss. TCP links are run too.

use super::spread_sim::{loss_table, tree_edges, MAE_EAST};
use super::{Figure, Scale};

pub const NAME: &str = "spread-table4-tree-loss";

pub fn run(scale: Scale) -> Figure {
    loss_table(
        NAME,
        &tree_edges(),
        MAE_EAST,
        scale,
        "Fig 1 tree from Mae East: slowest receiver's throughput under loss on every link",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loss on every link costs Hop about what it costs on one link (local
    /// recovery: losses on different links do not add up), and TCP more.
    #[test]
    fn hop_tree_degrades_like_one_link() {
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
        assert!(at("hop", "0.2") > 50.0);
        for loss in ["0.05", "0.1", "0.2"] {
            assert!(at("hop", loss) > at("tcp", loss), "{loss}");
        }
    }
}
