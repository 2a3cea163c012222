//! `spread-table1-overlay` (P-Spread §4.2, Table 1): 1 KB reliable messages
//! from each of four senders (Mae East, CNDS, Rutgers, UCSB) to the other
//! five sites, over two overlays built by weights on the same six sites: a
//! fanout network (every pair joined, equal weights: every source sends
//! straight to every site) and the Fig 1 shared tree (only the five tree
//! edges configured). Hop's bucket on each link gets the link's share of
//! the site's uplink (split evenly among the site's configured links), as
//! an operator would set it. Paper (TCP
//! links, slowest receiver, Kbit/s): fanout 487/667/185/329, tree
//! 560/561/568/579: the tree wins except for CNDS, whose "extremely high
//! throughput connectivity" favours fanout.
//!
//! What decides this is each site's access capacity, shared by all its
//! overlay links; the paper gives none. Assumed: CNDS 10 Mbit/s (the
//! paper's fat pipe), Hopkins 10 (same campus), Mae East 4 (near a
//! backbone peering point), OSU 2, Rutgers and UCSB 1 (constrained), each
//! way; pairwise round trips from geography (`RTT_MS`, Mae East-UCSB 104
//! from Table 2). Run with TCP links as the paper did, and Hop links.

use shoal_plot::Series;

use super::figure::Plot;
use super::spread_sim::{
    link_kinds, row, Costs, SpreadSim, Stream, Wan, Workload, CNDS, HOPKINS, MAE_EAST, OSU,
    RUTGERS, SITES, UCSB,
};
use super::{Figure, Scale};

pub const NAME: &str = "spread-table1-overlay";

/// Access capacity per site (Mae East, UCSB, OSU, Rutgers, CNDS, Hopkins).
pub const ACCESS_BPS: [f64; 6] = [4e6, 1e6, 2e6, 1e6, 10e6, 10e6];

/// Assumed round trips between the sites, ms.
pub const RTT_MS: [[f64; 6]; 6] = [
    // ME    UCSB   OSU   Rutg  CNDS  Hopk
    [0.0, 104.0, 20.0, 8.0, 4.0, 4.5],
    [104.0, 0.0, 60.0, 90.0, 100.0, 100.0],
    [20.0, 60.0, 0.0, 25.0, 22.0, 22.0],
    [8.0, 90.0, 25.0, 0.0, 8.0, 8.5],
    [4.0, 100.0, 22.0, 8.0, 0.0, 0.5],
    [4.5, 100.0, 22.0, 8.5, 0.5, 0.0],
];

/// The Fig 1 tree's edges (as `spread_sim::tree_edges`).
fn in_tree(a: usize, b: usize) -> bool {
    let (a, b) = (a.min(b), a.max(b));
    matches!(
        (a, b),
        (MAE_EAST, CNDS) | (CNDS, HOPKINS) | (MAE_EAST, RUTGERS) | (MAE_EAST, OSU) | (UCSB, OSU)
    )
}

pub const SENDERS: [usize; 4] = [MAE_EAST, CNDS, RUTGERS, UCSB];

pub fn run(scale: Scale) -> Figure {
    let started = std::time::Instant::now();
    let mut figure = Figure::new(NAME);
    let count = scale.pick(10_000, 2000);
    let mut series = Vec::new();
    for kind in link_kinds() {
        for (overlay, tree) in [("fanout", false), ("tree", true)] {
            let wan = Wan::access(&SITES, &ACCESS_BPS, &RTT_MS, 0.0, |a, b| {
                (!tree || in_tree(a, b)).then_some(1)
            });
            let mut points = Vec::new();
            for (i, &sender) in SENDERS.iter().enumerate() {
                let mut kbps = Vec::new();
                for seed in scale.seeds() {
                    let stream = Stream {
                        from: sender,
                        size: 1024,
                        count,
                    };
                    let work = Workload {
                        stream: Some(stream),
                        ..Workload::default()
                    };
                    let sim =
                        SpreadSim::new(wan.clone(), kind.clone(), Costs::default(), work, seed);
                    let out = sim.run(std::time::Duration::from_secs(3600));
                    figure.wall.events += out.events;
                    let receivers: Vec<usize> = (0..SITES.len()).filter(|&r| r != sender).collect();
                    let slowest = receivers
                        .iter()
                        .map(|&r| {
                            let secs = (out.stream_last_ns[r] - out.stream_start_ns) as f64 / 1e9;
                            out.stream_delivered[r] as f64 * 8.192 / secs.max(1e-9)
                        })
                        .fold(f64::INFINITY, f64::min);
                    let delivered = receivers
                        .iter()
                        .map(|&r| out.stream_delivered[r])
                        .min()
                        .unwrap_or(0);
                    if delivered < count {
                        figure.incomplete.push(format!(
                            "{} {overlay} from {} seed {seed}: {delivered} of {count}",
                            kind.name(),
                            SITES[sender]
                        ));
                    }
                    kbps.push(slowest);
                    figure.rows.push(row(&[
                        ("protocol", kind.name().into()),
                        ("overlay", overlay.into()),
                        ("sender", SITES[sender].into()),
                        ("seed", seed.to_string()),
                        ("messages", count.to_string()),
                        ("slowest_kbps", format!("{slowest:.2}")),
                        ("retransmissions", out.retransmissions.to_string()),
                    ]));
                }
                let mean = kbps.iter().sum::<f64>() / kbps.len() as f64;
                points.push((i as f64, mean));
                figure.notes.push(format!(
                    "{:>3} {overlay:>6} from {:>8}: {mean:>8.1} Kbit/s (slowest receiver)",
                    kind.name(),
                    SITES[sender]
                ));
            }
            series.push(Series::new(format!("{} {overlay}", kind.name()), points));
        }
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "slowest receiver's throughput; senders 0 Mae East, 1 CNDS, 2 Rutgers, 3 UCSB",
        "sender",
        "Kbit/s",
        series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With TCP links, the tree beats fanout for the constrained senders
    /// (Rutgers, UCSB), whose one uplink fanout divides five ways.
    #[test]
    fn the_tree_wins_for_constrained_senders() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at = |overlay: &str, sender: &str| {
            f.values(
                "slowest_kbps",
                &[
                    ("protocol", "tcp"),
                    ("overlay", overlay),
                    ("sender", sender),
                ],
            )[0]
        };
        for sender in ["Rutgers", "UCSB"] {
            assert!(at("tree", sender) > 1.5 * at("fanout", sender), "{sender}");
        }
    }
}
