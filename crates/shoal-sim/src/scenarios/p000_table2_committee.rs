//! `p000-table2-committee` (P000 §6.5, Table 2; notes E0-9): committee size
//! k = 1 to 4. One sender, 100 multicasts/s of 64 B; the group is the
//! committee plus the sender. P000 reports the latency from Gseq Req to its
//! receipt at the sender (mean 1.39, 1.68, 2.16, 3.31 ms for k = 1..4) and a
//! throughput of about 98 multicasts/s for every k.
//!
//! We report the delivery latency at the committee members (multicast to
//! delivery, which contains the Gseq round trip and the replication to k-1
//! backups, plus pbcast's dissemination) and the throughput at a committee
//! member, on the P000 switch with hosts at 50 µs per datagram.

use std::num::NonZeroU32;

use shoal_core::vsync;

use super::figure::merged;
use super::p000::{head, vsync_group};
use super::{ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};

pub const NAME: &str = "p000-table2-committee";

const RATE: f64 = 100.0;
const BIN_S: f64 = 0.1;

fn one(k: u32, seconds: f64, seed: u64) -> Report {
    let started = std::time::Instant::now();
    let n = k as usize + 1;
    let config = vsync::Config {
        committee_size: NonZeroU32::new(k).expect("k >= 1"),
        ..vsync::Config::default()
    };
    let mut sim = vsync_group(n, &config, seed, BIN_S);
    // The sender is the member outside the committee (the highest id).
    let sender = n - 1;
    let start = 0.5;
    let messages = (RATE * seconds) as u64;
    sim.schedule_stream(sender, ns(start), ns(1.0 / RATE), messages, 64);
    let end = ns(start + seconds);
    sim.run_until(end);
    let link_bytes = sim.link_bytes();
    sim.run_until(end + ns(3.0));
    let (_, leader) = sim.hosts().next().expect("k >= 1");
    let throughput = leader.delivery_rate(ns(start + 1.0), end);
    let committee_latency = merged(sim.hosts().take(k as usize).map(|(_, m)| &m.latency_us));
    let mut head = head(NAME, "vsync-pbcast", n, seed);
    head.push(("committee_size".into(), k.to_string()));
    let mut report = Report::collect(&sim, head, messages, end, (seconds, &link_bytes), sender);
    let ms = |us: f64| format!("{:.3}", us / 1000.0);
    let p50 = committee_latency.value_at_quantile(0.5) as f64;
    report.put("committee_latency_p50_ms", ms(p50));
    report.put("committee_latency_mean_ms", ms(committee_latency.mean()));
    report.put(
        "committee_latency_max_ms",
        ms(committee_latency.max() as f64),
    );
    report.put("throughput", format!("{throughput:.2}"));
    report.wall = Wall::since(started, sim.events);
    report
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let seconds = scale.pick(60.0, 10.0);
    let mut configs = Vec::new();
    for k in 1..=4u32 {
        for seed in scale.seeds() {
            configs.push((k, seed));
        }
    }
    type Job = Box<dyn FnOnce() -> Report + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(k, seed)| Box::new(move || one(k, seconds, seed)) as Job)
        .collect();
    let reports = run_parallel(jobs);
    for r in &reports {
        figure.add_run(r);
    }
    for k in 1..=4u32 {
        let get = |c: &str| {
            let v = figure.values(c, &[("committee_size", &k.to_string())]);
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let max = figure
            .values(
                "committee_latency_max_ms",
                &[("committee_size", &k.to_string())],
            )
            .into_iter()
            .fold(0.0, f64::max);
        figure.notes.push(format!(
            "k={k}: latency p50 {:.2} ms, mean {:.2} ms, max {max:.2} ms; throughput {:.2}/s",
            get("committee_latency_p50_ms"),
            get("committee_latency_mean_ms"),
            get("throughput"),
        ));
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 2's shape: a larger committee costs latency (every backup must
    /// hold a record before it commits), not throughput.
    #[test]
    fn latency_grows_with_k_and_throughput_does_not_fall() {
        let reports: Vec<Report> = (1..=4).map(|k| one(k, 4.0, 1)).collect();
        let value = |r: &Report, c: &str| -> f64 {
            r.summary
                .iter()
                .find(|(k, _)| k == c)
                .map(|(_, v)| v.parse().unwrap())
                .unwrap()
        };
        for r in &reports {
            assert!(r.complete, "{:?}", r.violations);
            assert!(value(r, "throughput") > 0.95 * RATE);
        }
        let latency: Vec<f64> = reports
            .iter()
            .map(|r| value(r, "committee_latency_mean_ms"))
            .collect();
        assert!(
            latency[3] > latency[0],
            "k = 4 slower than k = 1: {latency:?}"
        );
    }
}
