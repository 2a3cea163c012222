//! `p000-fig10-scale` (P000 §6.1, Fig 10; notes E0-4): virtual synchrony
//! over pbcast as the group grows. For each size, the highest offered rate
//! the group carries stably (every member stays in the view, and a member
//! that is neither sender nor leader delivers at least 95% of the offered
//! rate), found by a search ([`search`]: doubling from 50/s until a rate
//! is not carried, then one step of √2 between the last carried and the
//! first not), and how long a view change pauses delivery. P000: stable to
//! about 70 members, a slow decline to 105, view-change time rising about
//! linearly with n. We go on to 1000.
//!
//! Setup: one sender of 64-byte messages, each its own multicast with no
//! packing (P000: "Each message is sent as a separate multicast and there
//! is no packing"; `max_datagram_size` fits one message and not two), the
//! paper's 20 s view period and 1 s ack wait, on the P000 switch with hosts
//! at 50 µs per datagram. The pause is the longest run of empty 10 ms
//! delivery bins at that member.
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

/// P000 §6.1's message size.
pub const SIZE: u32 = 64;

/// The search's first rate, and the largest it tries.
const FIRST_RATE: f64 = 50.0;
const RATE_MAX: f64 = 12_800.0;

/// One run at one offered rate.
struct Outcome {
    report: Report,
    /// Deliveries per second at the observer (neither sender nor leader).
    delivered_rate: f64,
    /// The observer's longest stretch without a delivery, in ms.
    longest_pause_ms: f64,
    /// Members the leader's final view no longer has.
    removed: u64,
}

/// A first phase: the protocol's name in the files, and pbcast's
/// `relay_fanout` (0: the sender sends every member a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FirstPhase {
    name: &'static str,
    relay_fanout: u32,
}

/// The first phases compared.
const FIRST_PHASES: [FirstPhase; 2] = [
    FirstPhase {
        name: "vsync-pbcast-flat",
        relay_fanout: 0,
    },
    FirstPhase {
        name: "vsync-pbcast-tree16",
        relay_fanout: 16,
    },
];

fn one(n: usize, rate: f64, seconds: f64, seed: u64, phase: FirstPhase) -> Outcome {
    let started = std::time::Instant::now();
    let config = config(phase.relay_fanout);
    let mut sim = vsync_group(n, &config, seed, BIN_S);
    let (start, sender, observer) = (0.5, 1, 2);
    let messages = (rate * seconds) as u64;
    sim.schedule_stream(sender, ns(start), ns(1.0 / rate), messages, SIZE);
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
    let mut head = head(NAME, phase.name, n, seed);
    head.push(("offered".into(), format!("{rate:.0}")));
    head.push(("message_bytes".into(), SIZE.to_string()));
    head.push((
        "max_datagram_size".into(),
        config.pbcast.max_datagram_size.to_string(),
    ));
    let mut report = Report::collect(&sim, head, messages, end, (seconds, &link_bytes), sender);
    report.put("delivered_rate", format!("{delivered_rate:.2}"));
    report.put("longest_pause_ms", format!("{longest_pause:.0}"));
    report.put("members_out", removed);
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        delivered_rate,
        longest_pause_ms: longest_pause,
        removed,
    }
}

/// Settings for a first phase: the default vsync stack with datagrams
/// that hold one 64-byte message and not two.
fn config(relay_fanout: u32) -> vsync::Config {
    let mut config = vsync::Config::default();
    config.pbcast.relay_fanout = relay_fanout;
    // The bytes a datagram spends around a vsync payload.
    let overhead = config.pbcast.max_datagram_size - config.max_payload();
    config.pbcast.max_datagram_size = SIZE as usize + overhead;
    config
}

/// The group carried `rate`: nobody dropped, 95% of it delivered.
fn carried(rate: f64, outcome: &Outcome) -> bool {
    outcome.removed == 0 && outcome.delivered_rate >= 0.95 * rate
}

/// The search for one size and first phase: from 50/s, double while the
/// group carries the rate (up to `RATE_MAX`); then try the geometric
/// midpoint (×√2) of the last carried and the first not carried. Every
/// run made, in order. The highest carried rate is within a factor √2 of
/// the limit (below it, if carrying is monotone in the rate).
fn search(n: usize, seconds: f64, seed: u64, phase: FirstPhase) -> Vec<(f64, Outcome)> {
    let mut runs = Vec::new();
    let mut rate = FIRST_RATE;
    loop {
        let outcome = one(n, rate, seconds, seed, phase);
        let ok = carried(rate, &outcome);
        runs.push((rate, outcome));
        if !ok || rate * 2.0 > RATE_MAX {
            break;
        }
        rate *= 2.0;
    }
    let (last_rate, last) = runs.last().expect("one run at least");
    if runs.len() > 1 && !carried(*last_rate, last) {
        let mid = (last_rate / std::f64::consts::SQRT_2).round();
        let outcome = one(n, mid, seconds, seed, phase);
        runs.push((mid, outcome));
    }
    runs
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[8, 16, 32, 64, 105, 250, 500, 1000], &[8, 32, 105]);
    let seconds = scale.pick(45.0, 25.0);
    let mut searches = Vec::new();
    for &n in sizes.iter().rev() {
        for phase in FIRST_PHASES {
            searches.push((n, scale.seed, phase));
        }
    }
    type Job = Box<dyn FnOnce() -> Vec<(f64, Outcome)> + Send>;
    let jobs: Vec<Job> = searches
        .iter()
        .map(|&(n, seed, phase)| Box::new(move || search(n, seconds, seed, phase)) as Job)
        .collect();
    let mut configs = Vec::new();
    let mut results = Vec::new();
    for (&(n, seed, phase), runs) in searches.iter().zip(run_parallel(jobs)) {
        for (rate, outcome) in runs {
            configs.push((n, rate, seed, phase));
            results.push(outcome);
        }
    }
    let mut stable_series = Vec::new();
    let mut pause_series = Vec::new();
    for phase in FIRST_PHASES {
        let (stable_points, pause_points) =
            summarise(&mut figure, sizes, &configs, &results, phase);
        stable_series.push(Series::new(phase.name, stable_points));
        pause_series.push(Series::new(phase.name, pause_points));
    }
    for outcome in &results {
        figure.add_run(&outcome.report);
    }
    figure.incomplete.clear();
    figure.plots.push(Plot::lines(
        format!("{NAME}-throughput.svg"),
        "vsync over pbcast, 64 B multicasts: highest stable rate found",
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
    configs: &[(usize, f64, u64, FirstPhase)],
    results: &[Outcome],
    phase: FirstPhase,
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
            .filter(|(rate, r)| carried(*rate, r))
            .map(|(rate, _)| *rate)
            .fold(0.0, f64::max);
        let pause = mine
            .iter()
            .map(|(_, r)| r.longest_pause_ms)
            .fold(0.0, f64::max);
        let line: Vec<String> = mine
            .iter()
            .map(|(rate, r)| format!("{rate:.0}/s→{:.0}", r.delivered_rate))
            .collect();
        figure.notes.push(format!(
            "{:<20} n={n:<5} highest stable {stable:>4.0}/s; longest pause {pause:>5.0} ms; offered→delivered {}",
            phase.name,
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

    const FLAT: FirstPhase = FIRST_PHASES[0];
    const TREE: FirstPhase = FIRST_PHASES[1];

    /// A small group carries a modest rate stably; with the flat fan-out a
    /// larger group delivers less than a small one at a high rate (the
    /// decline of Fig 10).
    #[test]
    fn small_groups_are_stable_and_flat_throughput_declines_with_n() {
        let small = one(8, 100.0, 6.0, 1, FLAT);
        let (small_modest, out) = (small.delivered_rate, small.removed);
        assert!(small_modest >= 95.0 && out == 0, "{small_modest} {out}");
        let small_fast = one(8, 400.0, 4.0, 1, FLAT).delivered_rate;
        let large_fast = one(64, 400.0, 4.0, 1, FLAT).delivered_rate;
        assert!(large_fast < small_fast, "{small_fast} vs {large_fast}");
    }

    /// The search doubles while the group carries the rate, stops at the
    /// first it does not, and then tries the rate a factor √2 below that.
    #[test]
    fn the_search_brackets_the_limit() {
        let runs = search(8, 4.0, 1, FLAT);
        let rates: Vec<f64> = runs.iter().map(|(r, _)| *r).collect();
        let failed = runs
            .iter()
            .position(|(rate, o)| !carried(*rate, o))
            .expect("a group of 8 on 50 µs hosts cannot carry 12,800/s");
        assert!(failed >= 1, "50/s is carried: {rates:?}");
        for w in rates[..=failed].windows(2) {
            assert_eq!(w[1], 2.0 * w[0], "{rates:?}");
        }
        assert_eq!(runs.len(), failed + 2, "{rates:?}");
        let mid = rates[failed + 1];
        assert!(rates[failed - 1] < mid && mid < rates[failed], "{rates:?}");
    }

    /// The relay tree removes the sender's O(n) fan-out: at n = 200 and
    /// 200/s through a periodic view change it keeps every member and
    /// carries the offered rate where the flat fan-out cannot.
    #[test]
    fn the_relay_tree_carries_a_rate_the_flat_fan_out_cannot() {
        let tree_run = one(200, 200.0, 22.0, 1, TREE);
        let (tree, tree_out) = (tree_run.delivered_rate, tree_run.removed);
        let flat = one(200, 200.0, 22.0, 1, FLAT).delivered_rate;
        assert!(
            tree >= 0.9 * 200.0 && tree_out == 0,
            "tree {tree} out {tree_out}"
        );
        assert!(flat < 0.9 * tree, "flat {flat} vs tree {tree}");
    }
}
