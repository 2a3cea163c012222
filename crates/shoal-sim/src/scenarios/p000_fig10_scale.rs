//! `p000-fig10-scale` (P000 §6.1, Fig 10; notes E0-4): virtual synchrony
//! over pbcast as the group grows. For each size, the highest of a ladder of
//! offered rates that the group carries stably (every member stays in the
//! view, and a member that is neither sender nor leader delivers at least 95%
//! of the offered rate), and how long a view change pauses delivery. P000:
//! stable to about 70 members, a slow decline to 105, view-change time
//! rising about linearly with n. The issue asks to go on to 1000.
//!
//! Setup: one sender, 1 KB messages, the paper's 20 s view period and 1 s
//! ack wait, on the P000 switch with hosts at 50 µs per datagram.
//! The pause is the longest run of empty 10 ms delivery bins at that member.
//!
//! Two first phases (no IP multicast, as on P000's testbed): the flat
//! unicast fan-out (`relay_fanout = 0`: the sender sends every member a
//! copy) and the relay tree (`relay_fanout = 16`, the default; P000 §3
//! footnote ‖).

use shoal_core::vsync;
use shoal_plot::Series;

use super::figure::Plot;
use super::p000::{head, vsync_group};
use super::{ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};

pub const NAME: &str = "p000-fig10-scale";

const BIN_S: f64 = 0.01;

/// (report, delivered rate at the observer, longest pause in ms, removed).
type Outcome = (Report, f64, f64, u64);

/// The first phases compared: (protocol name, `relay_fanout`).
const FIRST_PHASES: [(&str, u32); 2] = [("vsync-pbcast-flat", 0), ("vsync-pbcast-tree16", 16)];

fn one(n: usize, rate: f64, seconds: f64, seed: u64, (protocol, fanout): (&str, u32)) -> Outcome {
    let started = std::time::Instant::now();
    let mut config = vsync::Config::default();
    config.pbcast.relay_fanout = fanout;
    let mut sim = vsync_group(n, &config, seed, BIN_S);
    let (start, sender, observer) = (0.5, 1, 2);
    let messages = (rate * seconds) as u64;
    sim.schedule_stream(sender, ns(start), ns(1.0 / rate), messages, 1_000);
    let end = ns(start + seconds);
    sim.run_until(end);
    let link_bytes = sim.link_bytes();
    sim.run_until(end + ns(3.0));
    let (_, m) = sim.hosts().nth(observer).expect("n >= 3");
    let delivered_rate = m.delivery_rate(ns(start + 1.0), end);
    let longest_pause = m
        .bins_between(ns(start + 1.0), end)
        .split(|c| *c > 0)
        .map(|run| run.len())
        .max()
        .unwrap_or(0) as f64
        * BIN_S
        * 1000.0;
    // Members the leader's final view no longer has.
    let (leader, _) = sim.hosts().next().expect("n >= 1");
    let removed = n.saturating_sub(leader.members().len()) as u64;
    let mut head = head(NAME, protocol, n, seed);
    head.push(("offered".into(), rate.to_string()));
    let mut report = Report::collect(&sim, head, messages, end, (seconds, &link_bytes), sender);
    report.put("delivered_rate", format!("{delivered_rate:.2}"));
    report.put("longest_pause_ms", format!("{longest_pause:.0}"));
    report.put("members_out", removed);
    report.wall = Wall::since(started, sim.events);
    (report, delivered_rate, longest_pause, removed)
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[8, 16, 32, 64, 105, 250, 500, 1000], &[8, 32, 105]);
    let rates: &[f64] = scale.pick(&[50.0, 100.0, 200.0, 400.0], &[100.0, 400.0]);
    let seconds = scale.pick(45.0, 25.0);
    let mut configs = Vec::new();
    for &n in sizes.iter().rev() {
        for phase in FIRST_PHASES {
            for &rate in rates {
                configs.push((n, rate, scale.seed, phase));
            }
        }
    }
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(n, rate, seed, phase)| Box::new(move || one(n, rate, seconds, seed, phase)) as Job)
        .collect();
    let results = run_parallel(jobs);
    let mut stable_series = Vec::new();
    let mut pause_series = Vec::new();
    for phase in FIRST_PHASES {
        let (stable_points, pause_points) =
            summarise(&mut figure, sizes, &configs, &results, phase);
        stable_series.push(Series::new(phase.0, stable_points));
        pause_series.push(Series::new(phase.0, pause_points));
    }
    for (r, ..) in &results {
        figure.add_run(r);
    }
    figure.incomplete.clear();
    figure.plots.push(Plot::lines(
        format!("{NAME}-throughput.svg"),
        "vsync over pbcast: highest stable rate of the ladder",
        "group size",
        "messages/s",
        stable_series,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-pause.svg"),
        "longest delivery pause (view changes)",
        "group size",
        "ms",
        pause_series,
    ));
    figure
}

type Points = Vec<(f64, f64)>;

/// One first phase's highest stable rate and longest pause per size, and a
/// note line per size.
fn summarise(
    figure: &mut Figure,
    sizes: &[usize],
    configs: &[(usize, f64, u64, (&str, u32))],
    results: &[Outcome],
    phase: (&str, u32),
) -> (Points, Points) {
    let mut stable_points = Vec::new();
    let mut pause_points = Vec::new();
    for &n in sizes {
        let mine: Vec<(f64, &Outcome)> = configs
            .iter()
            .zip(results)
            .filter(|((cn, _, _, p), _)| *cn == n && *p == phase)
            .map(|((_, rate, _, _), r)| (*rate, r))
            .collect();
        let stable = mine
            .iter()
            .filter(|(rate, r)| r.3 == 0 && r.1 >= 0.95 * rate)
            .map(|(rate, _)| *rate)
            .fold(0.0, f64::max);
        let pause = mine.iter().map(|(_, r)| r.2).fold(0.0, f64::max);
        let line: Vec<String> = mine
            .iter()
            .map(|(rate, r)| format!("{rate:.0}/s→{:.0}", r.1))
            .collect();
        figure.notes.push(format!(
            "{:<20} n={n:<5} highest stable {stable:>4.0}/s; longest pause {pause:>5.0} ms; offered→delivered {}",
            phase.0,
            line.join(" ")
        ));
        stable_points.push((n as f64, stable));
        pause_points.push((n as f64, pause));
    }
    (stable_points, pause_points)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAT: (&str, u32) = FIRST_PHASES[0];
    const TREE: (&str, u32) = FIRST_PHASES[1];

    /// A small group carries a modest rate stably; with the flat fan-out a
    /// larger group delivers less than a small one at a high rate (the
    /// decline of Fig 10).
    #[test]
    fn small_groups_are_stable_and_flat_throughput_declines_with_n() {
        let (_, small_modest, _, out) = one(8, 100.0, 6.0, 1, FLAT);
        assert!(small_modest >= 95.0 && out == 0, "{small_modest} {out}");
        let (_, small_fast, _, _) = one(8, 400.0, 4.0, 1, FLAT);
        let (_, large_fast, _, _) = one(64, 400.0, 4.0, 1, FLAT);
        assert!(large_fast < small_fast, "{small_fast} vs {large_fast}");
    }

    /// The relay tree removes the sender's O(n) fan-out: at n = 200 and
    /// 200/s through a periodic view change it keeps every member and
    /// carries the offered rate where the flat fan-out cannot.
    #[test]
    fn the_relay_tree_carries_a_rate_the_flat_fan_out_cannot() {
        let (_, tree, _, tree_out) = one(200, 200.0, 22.0, 1, TREE);
        let (_, flat, _, _) = one(200, 200.0, 22.0, 1, FLAT);
        assert!(
            tree >= 0.9 * 200.0 && tree_out == 0,
            "tree {tree} out {tree_out}"
        );
        assert!(flat < 0.9 * tree, "flat {flat} vs tree {tree}");
    }
}
