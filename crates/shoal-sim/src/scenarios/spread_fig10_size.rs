//! `spread-fig10-size` (P-Spread §4.3, Fig 10): echo round trips along the
//! chain from Mae East to Hopkins for messages of 256 B to 16 KiB (the
//! paper gives no sizes), each sent after the previous echo returned, so
//! this is no throughput test. Hop fragments a message into datagrams;
//! the TCP model carries it in its stream (Nagle and delayed ACKs on, as
//! the socket defaults). Paper: Hop grows only by what the size explains,
//! TCP jumps above 1024 B. The `ideal_ms` column is what the size alone
//! explains: the summed per-link ping of the first datagram (up to 1444
//! bytes of message) plus, each way, the rest of the message at the
//! slowest link (`spread_sim::ideal_rtt_ns`); `excess_ms` is the average
//! round trip minus that. TCP runs with and without Nagle's algorithm.

use shoal_plot::Series;

use super::figure::Plot;
use super::spread_sim::{
    chain_edges, echo_run, ideal_rtt_ns, link_kinds_with_nodelay, row, Echo, Wan, HOPKINS,
    MAE_EAST, SITES,
};
use super::{Figure, Scale};

pub const NAME: &str = "spread-fig10-size";

pub const SIZES: [usize; 8] = [256, 512, 1024, 1500, 2048, 4096, 8192, 16384];
const LOSSES: [f64; 2] = [0.0, 0.01];
/// Message bytes in one full Hop datagram: 1472 less Hop's 15 and the
/// overlay's 25 bytes of headers, rounded down to what the ideal assumes.
const MTU_PAYLOAD: usize = 1432;

pub fn run(scale: Scale) -> Figure {
    let started = std::time::Instant::now();
    let mut figure = Figure::new(NAME);
    let count = scale.pick(500, 200);
    let path = [MAE_EAST, 1, 2, 3, 4, HOPKINS];
    let mut series = Vec::new();
    let mut excess_series = Vec::new();
    let idle = Wan::direct(&SITES, &chain_edges(), 0.0);
    let ideal = |size: usize| ideal_rtt_ns(&idle, &path, size, MTU_PAYLOAD) as f64 / 1e6;
    series.push(Series::new(
        "ideal (ping + size at the slowest link)",
        SIZES.iter().map(|&s| (s as f64, ideal(s))).collect(),
    ));
    for kind in link_kinds_with_nodelay() {
        for loss in LOSSES {
            let wan = Wan::direct(&SITES, &chain_edges(), loss);
            let mut points = Vec::new();
            let mut excess = Vec::new();
            for size in SIZES {
                let ping = ideal(size);
                let mut avgs = Vec::new();
                for seed in scale.seeds() {
                    let echo = Echo::new(MAE_EAST, HOPKINS, size, count);
                    let (s, out) = echo_run(&wan, &kind, echo, None, seed);
                    figure.wall.events += out.events;
                    avgs.push(s.avg);
                    figure.rows.push(row(&[
                        ("protocol", kind.name().into()),
                        ("loss", loss.to_string()),
                        ("size", size.to_string()),
                        ("seed", seed.to_string()),
                        ("echoes", s.count.to_string()),
                        ("ideal_ms", format!("{ping:.3}")),
                        ("min_ms", format!("{:.3}", s.min)),
                        ("avg_ms", format!("{:.3}", s.avg)),
                        ("max_ms", format!("{:.3}", s.max)),
                        ("excess_ms", format!("{:.3}", s.avg - ping)),
                    ]));
                    if s.count as u64 != count {
                        figure.incomplete.push(format!(
                            "{} loss {loss} size {size} seed {seed}: {} echoes",
                            kind.name(),
                            s.count
                        ));
                    }
                }
                let avg = avgs.iter().sum::<f64>() / avgs.len() as f64;
                points.push((size as f64, avg));
                excess.push((size as f64, avg - ping));
            }
            let label = format!("{} {}% loss", kind.name(), loss * 100.0);
            figure.notes.push(format!(
                "{label:>12}: RTT minus ping by size {}",
                excess
                    .iter()
                    .map(|(s, e)| format!("{s}:{e:.1}ms"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            series.push(Series::new(label.clone(), points));
            excess_series.push(Series::new(label, excess));
        }
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "chain Mae East to Hopkins: echo RTT by message size",
        "message size (bytes)",
        "round trip (ms)",
        series,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-excess.svg"),
        "the same, minus what the size explains",
        "message size (bytes)",
        "RTT minus ping (ms)",
        excess_series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without loss, Hop's excess over the ideal grows by less than a
    /// tenth of what the size itself adds from 256 B to 16 KiB (its bucket
    /// runs at 95% of the link and each datagram carries 40 bytes of Hop
    /// and overlay headers), while TCP's jumps for messages just over a
    /// segment (Nagle holding the short tail behind a delayed ACK) and TCP
    /// without Nagle's does not jump as far.
    #[test]
    fn tcp_jumps_above_a_segment_and_hop_does_not() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let get = |col: &str, p: &str, size: usize| {
            let size = size.to_string();
            let v = f.values(col, &[("protocol", p), ("loss", "0"), ("size", &size)]);
            assert_eq!(v.len(), 1, "{col} {p} {size}: {:?}", f.rows.first());
            v[0]
        };
        let hop_growth = get("excess_ms", "hop", 16384) - get("excess_ms", "hop", 256);
        let size_growth = get("ideal_ms", "hop", 16384) - get("ideal_ms", "hop", 256);
        assert!(
            hop_growth < 0.1 * size_growth,
            "{hop_growth} of {size_growth}"
        );
        assert!(get("excess_ms", "tcp", 2048) > get("excess_ms", "tcp", 1024) + 10.0);
        assert!(get("excess_ms", "tcp-nodelay", 2048) < get("excess_ms", "tcp", 2048));
    }
}
