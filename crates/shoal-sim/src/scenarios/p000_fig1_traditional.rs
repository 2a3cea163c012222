//! `p000-fig1-traditional` (P000 §2.1, Fig 1; notes E0-1): the traditional
//! virtual-synchrony stack under perturbation. One sender offers 200
//! messages/s of 7 KB; one member sleeps for each 100 ms interval with
//! probability p; the figure is the throughput an unperturbed member sees,
//! for n = 32, 64 and 96. P000 saw it collapse, and sooner (at smaller p)
//! for larger groups.
//!
//! Model (P000 ran Horus-class code on an SP-2; none of these are given):
//! a 100 Mbit/s switch (50 µs links), a per-host CPU cost per datagram
//! handled or sent plus 5 ns per byte, a 256-datagram socket buffer; the
//! engine's defaults (window 64, 1 s failure timeout, so the sleeper slows
//! the group rather than leaving it). Two host speeds are run: 50 µs per
//! datagram ("fast": the all-to-all acknowledgements of 96 members use
//! under a fifth of a CPU) and 300 µs ("slow": CPU-bound at 96 members, as
//! a late-1990s host running Horus-class code would be).

use shoal_core::traditional::{self, Traditional};
use shoal_core::Instant;
use shoal_plot::Series;

use super::figure::Plot;
use super::p000::{head, perturb, real_hosts, switch, HOSTS};
use super::{ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};
use crate::Sim;

pub const NAME: &str = "p000-fig1-traditional";

const OFFERED: f64 = 200.0;
const SIZE: u32 = 7_000;
const BIN_S: f64 = 0.1;

/// One run; returns (report, throughput at an unperturbed member).
fn one(n: usize, p: f64, cpu_ns: u64, seconds: f64, seed: u64) -> (Report, f64) {
    let started = std::time::Instant::now();
    let (topology, hosts) = switch(n);
    let config = traditional::Config {
        max_datagram_size: 65_507,
        ..traditional::Config::default()
    };
    let mut sim = Sim::new(&topology, &hosts, seed, |me, members| {
        Traditional::new(me, members, config.clone(), Instant::ZERO).expect("valid config")
    });
    real_hosts(&mut sim, cpu_ns);
    sim.record_throughput(ns(BIN_S));
    let start = 0.5;
    let messages = (OFFERED * seconds) as u64;
    sim.schedule_stream(0, ns(start), ns(1.0 / OFFERED), messages, SIZE);
    perturb(&mut sim, n - 1, p, (start, seconds), seed);
    let end = ns(start + seconds);
    sim.run_until(end);
    let link_bytes = sim.link_bytes();
    sim.run_until(end + ns(2.0));
    // Throughput at member 1 over the sending period after a 1 s warm-up.
    let (_, m) = sim.hosts().nth(1).expect("n >= 2");
    let throughput = m.delivery_rate(ns(start + 1.0), end);
    let mut head = head(NAME, "traditional", n, seed);
    head.push(("perturb_p".into(), p.to_string()));
    head.push(("cpu_us_per_datagram".into(), (cpu_ns / 1000).to_string()));
    let mut report = Report::collect(&sim, head, 0, end, (seconds, &link_bytes), 0);
    // Completeness is not this figure's question: offered messages the
    // window refused were never sent.
    report
        .summary
        .retain(|(k, _)| !matches!(k.as_str(), "messages" | "delivered_min" | "complete"));
    report.put("throughput", format!("{throughput:.2}"));
    report.put("offered", OFFERED);
    report.wall = Wall::since(started, sim.events);
    (report, throughput)
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[32, 64, 96], &[32, 96]);
    let ps: &[f64] = scale.pick(&[0.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8], &[0.0, 0.1, 0.3, 0.6]);
    let seconds = scale.pick(10.0, 5.0);
    let mut configs = Vec::new();
    for (_, cpu) in HOSTS {
        for &n in sizes {
            for &p in ps {
                for seed in scale.seeds() {
                    configs.push((cpu, n, p, seed));
                }
            }
        }
    }
    let jobs: Vec<Box<dyn FnOnce() -> (Report, f64) + Send>> = configs
        .iter()
        .map(|&(cpu, n, p, seed)| {
            Box::new(move || one(n, p, cpu, seconds, seed))
                as Box<dyn FnOnce() -> (Report, f64) + Send>
        })
        .collect();
    let results = run_parallel(jobs);
    let mut series = Vec::new();
    for ((host, cpu), &n) in HOSTS.iter().flat_map(|h| sizes.iter().map(move |n| (h, n))) {
        let mut points = Vec::new();
        let mut bars = Vec::new();
        for &p in ps {
            let t: Vec<f64> = configs
                .iter()
                .zip(&results)
                .filter(|((cc, cn, cp, _), _)| cc == cpu && *cn == n && *cp == p)
                .map(|(_, (_, t))| *t)
                .collect();
            let mean = t.iter().sum::<f64>() / t.len() as f64;
            points.push((p, mean));
            bars.push((
                p,
                t.iter().copied().fold(f64::INFINITY, f64::min),
                t.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ));
        }
        let line: Vec<String> = points
            .iter()
            .map(|(p, t)| format!("p={p}: {t:.0}"))
            .collect();
        figure.notes.push(format!(
            "{host} hosts, n={n:<3} throughput {}",
            line.join("  ")
        ));
        series.push(Series::new(format!("n = {n}, {host} hosts"), points).with_bars(bars));
    }
    for (report, _) in &results {
        figure.rows.push(report.summary.clone());
        figure.wall.seconds += report.wall.seconds;
        figure.wall.events += report.wall.events;
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "traditional stack: throughput at an unperturbed member",
        "probability a member sleeps in each 100 ms",
        "messages/s",
        series,
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P000 Fig 1's shape: unperturbed, the group carries the offered load;
    /// a member that sleeps often drags everyone's throughput down; and on
    /// CPU-bound hosts the larger group falls sooner.
    #[test]
    fn throughput_falls_with_perturbation_and_sooner_for_larger_groups() {
        let t = |n, p, cpu| one(n, p, cpu, 4.0, 1).1;
        let fast = HOSTS[0].1;
        let slow = HOSTS[1].1;
        let calm = t(32, 0.0, fast);
        assert!(calm > 0.95 * OFFERED, "unperturbed: {calm}");
        let perturbed = t(32, 0.6, fast);
        assert!(perturbed < 0.8 * calm, "p = 0.6: {perturbed}");
        let (small, large) = (t(32, 0.3, slow), t(96, 0.3, slow));
        assert!(large < small, "the knee moves with n: {small} vs {large}");
    }
}
