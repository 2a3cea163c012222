//! `spread-table2-link` (P-Spread §4.3, Table 2): round trips of 1024-byte
//! messages between Mae East and UCSB over one overlay link, against ping,
//! with Hop and with TCP as the link protocol, at background loss 0, 0.5,
//! 1 and 2% per direction. Paper (one run, loss unreported): ping avg
//! 104.1 ms, Hop 108.493 (+4.2%), TCP 136.277 (+30.9%), TCP max 311.6 ms.

use shoal_plot::Series;

use super::figure::Plot;
use super::spread_sim::{
    echo_run, link_kinds, row, Echo, Edge, Wan, BACKGROUND_LOSS, MAE_EAST, SITES, UCSB, WAN_BPS,
};
use super::{Figure, Scale};

pub const NAME: &str = "spread-table2-link";

pub fn run(scale: Scale) -> Figure {
    let started = std::time::Instant::now();
    let mut figure = Figure::new(NAME);
    let count = scale.pick(5000, 1000);
    let edges = [Edge {
        a: MAE_EAST,
        b: UCSB,
        rtt_ms: 104.0,
        bandwidth_bps: WAN_BPS,
    }];
    let mut series: Vec<Series> = Vec::new();
    for kind in link_kinds() {
        let mut points = Vec::new();
        for loss in BACKGROUND_LOSS {
            let wan = Wan::direct(&SITES, &edges, loss);
            let ping = wan.ping_ns(&[MAE_EAST, UCSB], 1024 + 28) as f64 / 1e6;
            let mut overheads = Vec::new();
            for seed in scale.seeds() {
                let (s, out) = echo_run(
                    &wan,
                    &kind,
                    Echo::new(MAE_EAST, UCSB, 1024, count),
                    None,
                    seed,
                );
                let overhead = (s.avg - ping) / ping * 100.0;
                overheads.push(overhead);
                figure.wall.events += out.events;
                figure.rows.push(row(&[
                    ("protocol", kind.name().into()),
                    ("loss", loss.to_string()),
                    ("seed", seed.to_string()),
                    ("echoes", s.count.to_string()),
                    ("ping_ms", format!("{ping:.3}")),
                    ("min_ms", format!("{:.3}", s.min)),
                    ("avg_ms", format!("{:.3}", s.avg)),
                    ("max_ms", format!("{:.3}", s.max)),
                    ("p99_ms", format!("{:.3}", s.p99)),
                    ("overhead_pct", format!("{overhead:.2}")),
                    ("retransmissions", out.retransmissions.to_string()),
                ]));
                if s.count as u64 != count {
                    figure.incomplete.push(format!(
                        "{} loss {loss} seed {seed}: {} echoes",
                        kind.name(),
                        s.count
                    ));
                }
            }
            let mean = overheads.iter().sum::<f64>() / overheads.len() as f64;
            points.push((loss * 100.0, mean));
            figure.notes.push(format!(
                "{:>3} loss {:>4.1}%: avg overhead over ping {mean:>6.1}%",
                kind.name(),
                loss * 100.0
            ));
        }
        series.push(Series::new(kind.name(), points));
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "Mae East-UCSB, 1024 B echoes: overhead over ping",
        "background loss per direction (%)",
        "average RTT over ping (%)",
        series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's shape: Hop's average stays near ping at every loss; TCP's
    /// overhead under loss is well above Hop's.
    #[test]
    fn hop_stays_near_ping_and_tcp_does_not() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        eprintln!("{}", f.notes.join("\n"));
        assert!(f.complete(), "{:?}", f.incomplete);
        let at =
            |p: &str, loss: &str| f.values("overhead_pct", &[("protocol", p), ("loss", loss)])[0];
        assert!(at("hop", "0") < 5.0);
        assert!(at("hop", "0.02") < at("tcp", "0.02"));
    }
}
