//! `spread-fig11-load` (P-Spread §4.3, Fig 11): echo round trips of 1024 B
//! between Mae East and Hopkins along the chain while a flood from Mae East
//! to Hopkins runs at 0 to 400 Kbit/s, at each background loss. Link
//! capacities are assumed (1.5 Mbit/s; the paper gives none). Paper: Hop
//! almost constant; TCP rises and reaches about 1.5 s between 300 and 400
//! Kbit/s. TCP runs with and without Nagle's algorithm (the paper does not
//! say which Spread used).

use shoal_plot::Series;

use super::figure::Plot;
use super::spread_sim::{
    chain_edges, echo_run, link_kinds_with_nodelay, row, Echo, Flood, Wan, BACKGROUND_LOSS,
    HOPKINS, MAE_EAST, SITES,
};
use super::{Figure, Scale};

pub const NAME: &str = "spread-fig11-load";

pub const LOADS_KBPS: [f64; 5] = [0.0, 100.0, 200.0, 300.0, 400.0];

pub fn run(scale: Scale) -> Figure {
    let started = std::time::Instant::now();
    let mut figure = Figure::new(NAME);
    let count = scale.pick(500, 200);
    let mut series = Vec::new();
    for kind in link_kinds_with_nodelay() {
        for loss in BACKGROUND_LOSS {
            let wan = Wan::direct(&SITES, &chain_edges(), loss);
            let mut points = Vec::new();
            for load in LOADS_KBPS {
                let flood = Flood {
                    from: MAE_EAST,
                    to: HOPKINS,
                    size: 1024,
                    rate_bps: load * 1e3,
                };
                let mut avgs = Vec::new();
                for seed in scale.seeds() {
                    let echo = Echo::new(MAE_EAST, HOPKINS, 1024, count);
                    let (s, out) = echo_run(&wan, &kind, echo, Some(flood), seed);
                    figure.wall.events += out.events;
                    avgs.push(s.avg);
                    figure.rows.push(row(&[
                        ("protocol", kind.name().into()),
                        ("loss", loss.to_string()),
                        ("load_kbps", load.to_string()),
                        ("seed", seed.to_string()),
                        ("echoes", s.count.to_string()),
                        ("min_ms", format!("{:.3}", s.min)),
                        ("avg_ms", format!("{:.3}", s.avg)),
                        ("p99_ms", format!("{:.3}", s.p99)),
                        ("max_ms", format!("{:.3}", s.max)),
                        ("flood_delivered", out.flood_delivered.to_string()),
                    ]));
                    if s.count as u64 != count {
                        figure.incomplete.push(format!(
                            "{} loss {loss} load {load} seed {seed}: {} echoes",
                            kind.name(),
                            s.count
                        ));
                    }
                }
                points.push((load, avgs.iter().sum::<f64>() / avgs.len() as f64));
            }
            let label = format!("{} {}% loss", kind.name(), loss * 100.0);
            figure.notes.push(format!(
                "{label:>16}: avg RTT by load {}",
                points
                    .iter()
                    .map(|(l, r)| format!("{l}:{r:.1}ms"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            series.push(Series::new(label, points));
        }
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "chain Mae East-Hopkins: 1024 B echo RTT under a flood",
        "flood (Kbit/s)",
        "average round trip (ms)",
        series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At 1% loss Hop's RTT under the heaviest flood stays near its idle
    /// value while TCP's grows by more than Hop's.
    #[test]
    fn load_costs_tcp_more_than_hop() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at = |p: &str, load: &str| {
            f.values(
                "avg_ms",
                &[("protocol", p), ("loss", "0.01"), ("load_kbps", load)],
            )[0]
        };
        let hop_growth = at("hop", "400") / at("hop", "0");
        let tcp_growth = at("tcp", "400") / at("tcp", "0");
        assert!(hop_growth < 1.2, "hop {hop_growth}");
        assert!(tcp_growth > hop_growth, "tcp {tcp_growth} hop {hop_growth}");
    }
}
