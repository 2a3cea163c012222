//! `p001-fig4-chain` (P001 §D, Fig 4; notes E1-7): 20 nodes in a line, the
//! sender at one end; only the sender's outgoing link loses packets (1%);
//! every link has 5 ms of delay; 100 messages/s; pbcast-grb. The latency
//! distribution should have the same shape at every distance, shifted by
//! the path's delay. We shift by each member's minimum latency: 5 ms of
//! propagation per hop plus the serialisation (about 1.2 ms per hop for a
//! 222-byte datagram at 1.5 Mbit/s), which P001 does not mention.

use shoal_core::pbcast::Delivery;

use super::figure::{histograms_csv, latency_fractions, merged, Plot, PlotKind};
use super::p001::{head, Finished, Run};
use super::{run_parallel, Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};

pub const NAME: &str = "p001-fig4-chain";

/// Members whose histograms are drawn (hops from the sender).
pub const DISTANCES: [usize; 4] = [1, 5, 10, 19];

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let n = 20;
    let seconds = scale.pick(100.0, 20.0);
    let mut topology = Topology::chain(n, LinkSpec::paper(0.0));
    topology.links[0].2.loss = 0.01;
    let hosts: Vec<usize> = (0..n).collect();
    let jobs: Vec<Box<dyn FnOnce() -> Finished + Send + '_>> = scale
        .seeds()
        .map(|seed| {
            let (topology, hosts) = (&topology, &hosts);
            Box::new(move || {
                Run {
                    protocol: Protocol::PbcastGrb,
                    delivery: Delivery::Fifo,
                    messages: (100.0 * seconds) as u64,
                    head: head(NAME, Protocol::PbcastGrb, n, seed, 0.01),
                    inputs: scale.inputs,
                    ..Run::new(topology, hosts, seed)
                }
                .run()
            }) as Box<dyn FnOnce() -> Finished + Send + '_>
        })
        .collect();
    let runs = run_parallel(jobs);
    for r in &runs {
        figure.add_run(&r.report);
        let row = figure.rows.last_mut().expect("just added");
        for d in DISTANCES {
            let p50 = r.latency_us[d].value_at_quantile(0.5) as f64 / 1e3;
            let shift = r.latency_us[d].min() as f64 / 1e3;
            row.push((
                format!("p50_minus_path_ms_{d}"),
                format!("{:.3}", p50 - shift),
            ));
        }
    }
    let mut raw = Vec::new();
    let mut shifted = Vec::new();
    for d in DISTANCES {
        let h = merged(runs.iter().map(|r| &r.latency_us[d]));
        let label = format!("{d} hops");
        let points = latency_fractions(&h, 5.0, 400.0);
        // Remove the path's delay (P001: "shifted by the path"), taken as
        // the fastest delivery at this distance.
        let shift = h.min() as f64 / 1e3;
        shifted.push(shoal_plot::Series::new(
            label.clone(),
            points.iter().map(|&(x, y)| (x - shift, y)).collect(),
        ));
        figure.notes.push(format!(
            "{label:>8}: p50 {:>6.1} ms  p99 {:>6.1} ms  p50 minus the {shift:.1} ms path delay {:>6.1} ms",
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
            h.value_at_quantile(0.5) as f64 / 1e3 - shift,
        ));
        raw.push(shoal_plot::Series::new(label, points));
    }
    figure
        .files
        .push(("latency.csv".into(), histograms_csv(&raw)));
    figure.plots.push(Plot {
        file: format!("{NAME}.svg"),
        title: "chain of 20, 1% loss on the sender's link: latency by distance".into(),
        x_label: "latency (ms)".into(),
        y_label: "fraction of messages".into(),
        log_y: true,
        kind: PlotKind::Histogram,
        series: raw,
    });
    figure.plots.push(Plot {
        file: format!("{NAME}-shifted.svg"),
        title: "the same, minus each distance's path delay".into(),
        x_label: "latency minus path delay (ms)".into(),
        y_label: "fraction of messages".into(),
        log_y: true,
        kind: PlotKind::Histogram,
        series: shifted,
    });
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After removing 5 ms per hop the distributions line up: the median
    /// (first-phase) latency and the share of repaired (slow) messages are
    /// about the same at every distance.
    #[test]
    fn distributions_line_up_after_the_path_delay() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        assert!(f.complete(), "{:?}", f.incomplete);
        let medians: Vec<f64> = DISTANCES
            .iter()
            .map(|d| f.values(&format!("p50_minus_path_ms_{d}"), &[])[0])
            .collect();
        let spread = medians.iter().copied().fold(f64::MIN, f64::max)
            - medians.iter().copied().fold(f64::MAX, f64::min);
        assert!(spread < 5.0, "shifted medians {medians:?}");
    }
}
