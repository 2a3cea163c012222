//! `p000-fig12-perturbed` (P000 §6.2, Fig 12; notes E0-6): virtual synchrony
//! over pbcast with one perturbed member. n = 66; one member sleeps through
//! each 100 ms interval with probability p; throughput at the perturbed
//! member and at an unperturbed one. P000: the unperturbed members keep
//! their throughput (within a few percent) for every p, and the perturbed
//! member is dropped at the next view change. Compare `p000-fig1-traditional`
//! (same sleep process), where one sleeper drags everyone.
//!
//! The sender offers 100 messages/s of 1 KB (P000 §6's stack sustains
//! about 100/s, Table 2); the view period is the paper's 20 s; hosts are
//! the hosts of `p000-fig1-traditional`'s IP-multicast model (50 µs per
//! datagram).

use shoal_core::vsync;
use shoal_plot::Series;

use super::figure::Plot;
use super::p000::{head, perturb, vsync_group, Window};
use super::{ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};

pub const NAME: &str = "p000-fig12-perturbed";

const OFFERED: f64 = 100.0;
const SIZE: u32 = 1_000;
const BIN_S: f64 = 0.1;

/// One run at one sleep probability.
struct Outcome {
    report: Report,
    /// Deliveries per second at an unperturbed member.
    calm: f64,
    /// Deliveries per second at the perturbed member.
    sleeper: f64,
}

fn one(n: usize, p: f64, seconds: f64, seed: u64) -> Outcome {
    let started = std::time::Instant::now();
    let mut sim = vsync_group(n, &vsync::Config::default(), seed, BIN_S);
    // The sender is member 1: member 0 leads the committee (P000 §6 runs
    // the leader on its own node, unperturbed).
    let sender = 1;
    let start = 0.5;
    let messages = (OFFERED * seconds) as u64;
    sim.schedule_stream(sender, ns(start), ns(1.0 / OFFERED), messages, SIZE);
    let perturbed = n - 1;
    let window = Window {
        start_s: start,
        seconds,
    };
    perturb(&mut sim, perturbed, p, window, seed);
    let end = ns(start + seconds);
    sim.run_until(end);
    let link_bytes = sim.link_bytes();
    sim.run_until(end + ns(3.0));
    let rate = |host: usize| {
        let (_, m) = sim.hosts().nth(host).expect("host");
        m.delivery_rate(ns(start + 1.0), end)
    };
    let (calm, sleeper) = (rate(2), rate(perturbed));
    let mut head = head(NAME, "vsync-pbcast", n, seed);
    head.push(("perturb_p".into(), p.to_string()));
    let mut report = Report::collect(&sim, head, messages, end, (seconds, &link_bytes), sender);
    report
        .summary
        .retain(|(k, _)| !matches!(k.as_str(), "messages" | "delivered_min" | "complete"));
    report.put("throughput_unperturbed", format!("{calm:.2}"));
    report.put("throughput_perturbed", format!("{sleeper:.2}"));
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        calm,
        sleeper,
    }
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let n = 66;
    let ps: &[f64] = scale.pick(&[0.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8], &[0.0, 0.3, 0.6]);
    let seconds = scale.pick(60.0, 10.0);
    let mut configs = Vec::new();
    for &p in ps {
        for seed in scale.seeds() {
            configs.push((p, seed));
        }
    }
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(p, seed)| Box::new(move || one(n, p, seconds, seed)) as Job)
        .collect();
    let results = run_parallel(jobs);
    let mut calm_points = Vec::new();
    let mut sleeper_points = Vec::new();
    for &p in ps {
        let mine: Vec<&Outcome> = configs
            .iter()
            .zip(&results)
            .filter(|((cp, _), _)| *cp == p)
            .map(|(_, r)| r)
            .collect();
        let mean = |f: &dyn Fn(&Outcome) -> f64| {
            mine.iter().map(|r| f(r)).sum::<f64>() / mine.len() as f64
        };
        let (calm, sleeper) = (mean(&|r| r.calm), mean(&|r| r.sleeper));
        figure.notes.push(format!(
            "p={p:<4} unperturbed {calm:>6.1} msgs/s   perturbed {sleeper:>6.1} msgs/s"
        ));
        calm_points.push((p, calm));
        sleeper_points.push((p, sleeper));
    }
    for outcome in &results {
        figure.add_run(&outcome.report);
    }
    figure.incomplete.clear();
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        format!("vsync over pbcast, n = {n}: throughput with one perturbed member"),
        "probability the member sleeps in each 100 ms",
        "messages/s",
        vec![
            Series::new("unperturbed member", calm_points),
            Series::new("perturbed member", sleeper_points),
        ],
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P000's claim for the non-traditional stack: a perturbed member does
    /// not slow the others down.
    #[test]
    fn unperturbed_members_keep_their_throughput() {
        let calm = one(24, 0.0, 6.0, 1).calm;
        let perturbed_calm = one(24, 0.6, 6.0, 1).calm;
        assert!(calm > 0.95 * OFFERED, "unperturbed group: {calm}");
        assert!(
            perturbed_calm > 0.95 * calm,
            "with a sleeper: {perturbed_calm} vs {calm}"
        );
    }

    /// With the relay tree (the default) member 2 relays the sender's
    /// messages to members 18-33. Asleep with p = 0.6 it does not slow its
    /// children: they get what it did not pass on by repair.
    #[test]
    fn a_sleeping_relay_does_not_slow_its_children() {
        let child_rate = |p: f64| {
            let n = 66;
            let mut sim = vsync_group(n, &vsync::Config::default(), 1, BIN_S);
            let (start, seconds) = (0.5, 12.0);
            let messages = (OFFERED * seconds) as u64;
            sim.schedule_stream(1, ns(start), ns(1.0 / OFFERED), messages, SIZE);
            let window = Window {
                start_s: start,
                seconds,
            };
            perturb(&mut sim, 2, p, window, 1);
            let end = ns(start + seconds);
            sim.run_until(end + ns(3.0));
            let (_, child) = sim.hosts().nth(20).expect("n = 66");
            child.delivery_rate(ns(start + 1.0), end)
        };
        let (calm, perturbed) = (child_rate(0.0), child_rate(0.6));
        assert!(
            perturbed >= 0.95 * calm,
            "child of a sleeping relay: {perturbed} vs {calm}"
        );
    }
}
