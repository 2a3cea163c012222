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
//!
//! Each size's searches are independent of the others', so the figure can
//! run a size at a time ([`SWEPT`], `shoal sim p000-fig10-scale --sizes
//! 1000`); its plots and notes come from the rows alone.

use shoal_core::vsync;
use shoal_plot::Series;

use super::figure::Plot;
use super::p000::{head, vsync_group};
use super::swept::{Row, Swept};
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
    /// Members the leader's final view no longer has.
    removed: u64,
}

/// A first phase: the protocol's name in the files, and pbcast's
/// `relay_fanout` (0: the sender sends every member a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FirstPhase {
    pub(crate) name: &'static str,
    pub(crate) relay_fanout: u32,
}

/// The first phases compared.
pub(crate) const FIRST_PHASES: [FirstPhase; 2] = [
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
    report.put("carried", carries(rate, delivered_rate, removed));
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        delivered_rate,
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

/// The group carried `rate`: nobody dropped, 95% of it delivered (the
/// `carried` column of the run's row).
fn carried(rate: f64, outcome: &Outcome) -> bool {
    carries(rate, outcome.delivered_rate, outcome.removed)
}

fn carries(rate: f64, delivered_rate: f64, removed: u64) -> bool {
    removed == 0 && delivered_rate >= 0.95 * rate
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

/// The group sizes: the paper's range (8-105) and on to 1000.
const SIZES_FULL: [usize; 8] = [8, 16, 32, 64, 105, 250, 500, 1000];
const SIZES_QUICK: [usize; 3] = [8, 32, 105];

/// The figure's sizes in the order it runs them: largest first, so that
/// the longest searches start first.
fn run_order(scale: &Scale) -> Vec<usize> {
    let sizes: &[usize] = scale.pick(&SIZES_FULL, &SIZES_QUICK);
    sizes.iter().rev().copied().collect()
}

/// `shoal sim p000-fig10-scale --sizes ...` runs chosen sizes and merges
/// them into the figure in `--out`.
pub const SWEPT: Swept = Swept {
    name: NAME,
    sizes: run_order,
    from_rows,
};

pub fn run(scale: Scale) -> Figure {
    let seconds = scale.pick(45.0, 25.0);
    let (rows, wall) = searches(scale, &run_order(&scale), &FIRST_PHASES, seconds);
    let mut figure = from_rows(&scale, rows);
    figure.wall = wall;
    figure
}

fn from_rows(_: &Scale, rows: Vec<Row>) -> Figure {
    build(NAME, &FIRST_PHASES, "", rows)
}

/// The rows of every search of the sizes of `sizes` that `scale` chose,
/// for each first phase of `phases`, `seconds` per rate: sizes in the order
/// of `sizes`, each size's phases in order, each search's rates in the
/// order tried.
pub(crate) fn searches(
    scale: Scale,
    sizes: &[usize],
    phases: &[FirstPhase],
    seconds: f64,
) -> (Vec<Row>, Wall) {
    let mut searches = Vec::new();
    for n in scale.sizes.pick(sizes) {
        for &phase in phases {
            searches.push((n, scale.seed, phase));
        }
    }
    type Job = Box<dyn FnOnce() -> Vec<(f64, Outcome)> + Send>;
    let jobs: Vec<Job> = searches
        .iter()
        .map(|&(n, seed, phase)| Box::new(move || search(n, seconds, seed, phase)) as Job)
        .collect();
    let mut rows = Vec::new();
    let mut wall = Wall::default();
    for runs in run_parallel(jobs) {
        for (_, outcome) in runs {
            rows.push(outcome.report.summary);
            wall.seconds += outcome.report.wall.seconds;
            wall.events += outcome.report.wall.events;
        }
    }
    (rows, wall)
}

type Points = Vec<(f64, f64)>;

/// The figure `name` from its rows, for the first phases `phases`: per
/// phase and size the highest rate carried and the longest pause, plotted
/// against size, and a note line per phase and size. Everything comes
/// from the rows, so a figure merged from runs of a few sizes at a time is
/// the figure run whole. `title` is appended to the plots' titles.
pub(crate) fn build(name: &str, phases: &[FirstPhase], title: &str, rows: Vec<Row>) -> Figure {
    let mut figure = Figure::new(name);
    figure.rows = rows;
    let mut stable_series = Vec::new();
    let mut pause_series = Vec::new();
    for &phase in phases {
        let (stable_points, pause_points) = summarise(&mut figure, phase);
        stable_series.push(Series::new(phase.name, stable_points));
        pause_series.push(Series::new(phase.name, pause_points));
    }
    figure.plots.push(Plot::lines(
        format!("{name}-throughput.svg"),
        format!("vsync over pbcast, 64 B multicasts: highest stable rate found{title}"),
        "group size",
        "messages/s",
        stable_series,
    ));
    figure.plots.push(Plot::lines(
        format!("{name}-pause.svg"),
        format!("longest delivery pause (view changes){title}"),
        "group size",
        "ms",
        pause_series,
    ));
    figure
}

/// One run as the figure reads it back from its row.
struct RunRow {
    n: usize,
    rate: f64,
    carried: bool,
    delivered: String,
    pause_ms: f64,
}

impl RunRow {
    fn of(row: &Row) -> Option<RunRow> {
        let get = |k: &str| row.iter().find(|(c, _)| c == k).map(|(_, v)| v.as_str());
        Some(RunRow {
            n: get("group_size")?.parse().ok()?,
            rate: get("offered")?.parse().ok()?,
            carried: get("carried")? == "true",
            delivered: get("delivered_rate")?.to_string(),
            pause_ms: get("longest_pause_ms")?.parse().ok()?,
        })
    }
}

/// One first phase's highest stable rate and longest pause per size held
/// in the figure's rows (ascending), and a note line per size.
fn summarise(figure: &mut Figure, phase: FirstPhase) -> (Points, Points) {
    let runs: Vec<RunRow> = figure
        .rows
        .iter()
        .filter(|row| row.iter().any(|(k, v)| k == "protocol" && v == phase.name))
        .filter_map(RunRow::of)
        .collect();
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.n).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut stable_points = Vec::new();
    let mut pause_points = Vec::new();
    for n in sizes {
        let mine: Vec<&RunRow> = runs.iter().filter(|r| r.n == n).collect();
        let stable = mine
            .iter()
            .filter(|r| r.carried)
            .map(|r| r.rate)
            .fold(0.0, f64::max);
        let pause = mine.iter().map(|r| r.pause_ms).fold(0.0, f64::max);
        let line: Vec<String> = mine
            .iter()
            .map(|r| format!("{:.0}/s→{}", r.rate, r.delivered))
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

    /// Fig 10 run a size at a time and merged (`--sizes`) writes the same
    /// files as Fig 10 run whole, but `run.csv`: the same rows in the same
    /// order, the same params.csv and byte-identical plots. (Small groups
    /// and 2 s per rate, so the test is quick; the figure's own sizes are
    /// the same code.)
    #[test]
    fn a_figure_run_a_size_at_a_time_is_the_figure_run_whole() {
        const SMALL: Swept = Swept {
            name: NAME,
            sizes: |_| vec![6, 4],
            from_rows: |_, rows| build(NAME, &[FLAT, TREE], "", rows),
        };
        let seconds = 2.0;
        let scale = Scale::quick(1);
        let params = |scale: &Scale| {
            let mut p = vec![("scenario".to_string(), NAME.to_string())];
            p.extend(scale.params());
            p
        };
        let (rows, wall) = searches(scale, &[6, 4], &[FLAT, TREE], seconds);
        let mut whole = build(NAME, &[FLAT, TREE], "", rows);
        whole.wall = wall;
        whole.params = params(&scale);
        let base = std::env::temp_dir().join(format!("shoal-fig10-parts-{}", std::process::id()));
        let (whole_dir, parts_dir) = (base.join("whole"), base.join("parts"));
        let _ = std::fs::remove_dir_all(&base);
        whole.write(&whole_dir).expect("writes");
        for n in [4, 6] {
            let part_scale = Scale {
                sizes: crate::scenarios::Sizes::only(&[n]).expect("one size"),
                ..scale
            };
            let (rows, wall) = searches(part_scale, &[6, 4], &[FLAT, TREE], seconds);
            let mut part = build(NAME, &[FLAT, TREE], "", rows);
            part.wall = wall;
            let merged = SMALL
                .merge(&part_scale, &parts_dir, part, params(&part_scale))
                .expect("merges");
            merged.write(&parts_dir).expect("writes");
        }
        let mut compared = 0;
        for entry in std::fs::read_dir(&whole_dir).expect("written") {
            let name = entry.expect("entry").file_name();
            if name == "run.csv" {
                continue;
            }
            let whole = std::fs::read(whole_dir.join(&name)).expect("whole");
            let parts = std::fs::read(parts_dir.join(&name)).expect("parts");
            assert!(whole == parts, "{name:?} differs");
            compared += 1;
        }
        assert_eq!(compared, 4, "summary, params and two plots");
        let _ = std::fs::remove_dir_all(&base);
    }
}
