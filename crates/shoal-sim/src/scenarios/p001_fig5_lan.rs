//! `p001-fig5-lan` (P001 §D, Fig 5; notes E1-8): Spinglass on a LAN, 35
//! members on 10 Mbit Ethernet, 100 messages/s of 1 KB, 100 ms rounds, GC
//! after about 1 s. Noise: periodically 10 consecutive multicasts are
//! turned into unicasts to one random member, so 33 members miss them at
//! once. Throughput at one receiver, per 100 ms: plain pbcast dips during
//! the repair bursts; with multicast retransmission it stays steady.
//!
//! The paper does not give the noise period; we use one burst every 2 s.
//! The Ethernet is a switch with 10 Mbit/s, 0.1 ms links and no loss.

use shoal_core::pbcast::Delivery;
use shoal_plot::Series;

use super::figure::Plot;
use super::p001::{head, lan, Finished, Noise, Run};
use super::{run_parallel, Figure, Protocol, Scale};
use crate::Topology;

pub const NAME: &str = "p001-fig5-lan";

pub const PROTOCOLS: [Protocol; 3] = [Protocol::Pbcast, Protocol::PbcastIpmc, Protocol::PbcastGrb];

/// Seconds per throughput sample.
const BIN_S: f64 = 0.1;

/// The receiver whose throughput is plotted.
const RECEIVER: usize = 1;

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let n = 35;
    let seconds = scale.pick(60.0, 20.0);
    let topology = Topology::star(n, lan(0.0));
    let hosts: Vec<usize> = (1..=n).collect();
    let mut configs = Vec::new();
    for p in PROTOCOLS {
        for seed in scale.seeds() {
            configs.push((p, seed));
        }
    }
    let jobs: Vec<Box<dyn FnOnce() -> Finished + Send + '_>> = configs
        .iter()
        .map(|&(protocol, seed)| {
            let (topology, hosts) = (&topology, &hosts);
            Box::new(move || {
                Run {
                    protocol,
                    delivery: Delivery::Fifo,
                    messages: (100.0 * seconds) as u64,
                    size: 1024,
                    noise: Some(Noise {
                        period_s: 2.0,
                        count: 10,
                    }),
                    throughput_bin: Some(BIN_S),
                    head: head(NAME, protocol, n, seed, 0.0),
                    inputs: scale.inputs,
                    ..Run::new(topology, hosts, seed)
                }
                .run()
            }) as Box<dyn FnOnce() -> Finished + Send + '_>
        })
        .collect();
    let runs = run_parallel(jobs);
    let mut series = Vec::new();
    for (r, &(protocol, seed)) in runs.iter().zip(&configs) {
        figure.add_run(&r.report);
        // Samples while the sender sends (0.5 s in, a second of margin).
        let bins = &r.bins[RECEIVER];
        let first = ((0.5 + 1.0) / BIN_S) as usize;
        let last = ((0.5 + r.send_seconds) / BIN_S) as usize;
        let rates: Vec<f64> = (first..last)
            .map(|b| f64::from(bins.get(b).copied().unwrap_or(0)) / BIN_S)
            .collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len().max(1) as f64;
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let row = figure.rows.last_mut().expect("just added");
        row.push(("receiver_rate_mean".into(), format!("{mean:.2}")));
        row.push(("receiver_rate_stddev".into(), format!("{:.2}", var.sqrt())));
        row.push(("receiver_rate_min".into(), format!("{min:.1}")));
        if seed == scale.seed {
            let window = (first..(first + (10.0 / BIN_S) as usize).min(last))
                .map(|b| {
                    let t = b as f64 * BIN_S - 0.5;
                    (t, f64::from(bins.get(b).copied().unwrap_or(0)) / BIN_S)
                })
                .collect();
            series.push(Series::new(protocol.name(), window));
        }
    }
    for p in PROTOCOLS {
        let sd = figure.values("receiver_rate_stddev", &[("protocol", p.name())]);
        let min = figure.values("receiver_rate_min", &[("protocol", p.name())]);
        figure.notes.push(format!(
            "{:<12} receiver rate per 100 ms: stddev {:>6.1} msgs/s, lowest sample {:>6.1} msgs/s",
            p.name(),
            sd.iter().sum::<f64>() / sd.len().max(1) as f64,
            min.iter().copied().fold(f64::INFINITY, f64::min),
        ));
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "35 members, 10 multicasts turned to unicasts every 2 s: one receiver",
        "time (s)",
        "messages/s delivered (100 ms samples)",
        series,
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multicast retransmission makes the receiver's rate steadier.
    #[test]
    fn multicast_retransmission_steadies_throughput() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        assert!(f.complete(), "{:?}", f.incomplete);
        let sd = |p: Protocol| f.values("receiver_rate_stddev", &[("protocol", p.name())])[0];
        assert!(
            sd(Protocol::PbcastGrb) < 0.8 * sd(Protocol::Pbcast),
            "grb {} plain {}",
            sd(Protocol::PbcastGrb),
            sd(Protocol::Pbcast)
        );
    }
}
