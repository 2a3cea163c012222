//! `p001-fig3-histograms` (P001 §C, Fig 3; notes E1-5, E1-6).
//!
//! Top: dense trees (every node a member, sender at the root) at 1% loss
//! per link, 100 messages/s of 210 B, pbcast-grb against SRM: the latency
//! distribution over all receivers for each tree size. (The caption says
//! "interarrival", the text "latencies"; we plot latency.) pbcast-grb's
//! should not change with n; SRM's high-latency share should grow.
//!
//! Bottom: a 500-node tree with 300 members placed at random, 1% loss:
//! pbcast unordered, pbcast FIFO and SRM. P001 gives this tree's link
//! speed nowhere. Ours are 10 Mbit/s (the non-root links of Fig 8): with
//! Fig 1's 1.5 Mbit/s, repairing by unicast the ~6% of the first phase
//! that 300 members miss needs more than the root links carry, so no
//! unicast-repair protocol could deliver what P001 reports pbcast
//! delivering (the arithmetic is in `docs/reproduction.md`).
//! `shoal sim --large-tree-bps 1.5e6` runs that other reading.

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::pbcast::Delivery;
use shoal_plot::Series;

use super::figure::{histograms_csv, latency_fractions, merged, Plot, PlotKind};
use super::p001::{fraction_at_least, head, pick_distinct, Finished, Run, Setup};
use super::{run_parallel, Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};

pub const NAME: &str = "p001-fig3-histograms";

const LOSS: f64 = 0.01;

/// One histogram of the figure: its runs' protocol and tree.
#[derive(Debug, Clone)]
struct Line {
    label: String,
    protocol: Protocol,
    delivery: Delivery,
    /// Nodes of the tree.
    nodes: usize,
    /// Members among them (all of them in the dense trees).
    members: usize,
}

impl Line {
    fn dense(&self) -> bool {
        self.members == self.nodes
    }
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let seconds = scale.pick(100.0, 10.0);
    let dense: &[usize] = scale.pick(&[20, 40, 80], &[20, 80]);
    let mut top: Vec<Line> = Vec::new();
    for &n in dense {
        for (protocol, delivery) in [
            (Protocol::PbcastGrb, Delivery::Fifo),
            (Protocol::Srm, Delivery::Unordered),
        ] {
            let label = format!("{} n={n}", protocol.name());
            top.push(Line {
                label,
                protocol,
                delivery,
                nodes: n,
                members: n,
            });
        }
    }
    let (tree_nodes, members) = scale.pick((500, 300), (500, 100));
    let large = |label: &str, protocol, delivery| Line {
        label: label.into(),
        protocol,
        delivery,
        nodes: tree_nodes,
        members,
    };
    let bottom = vec![
        large("pbcast unordered", Protocol::Pbcast, Delivery::Unordered),
        large("pbcast fifo", Protocol::Pbcast, Delivery::Fifo),
        large("srm", Protocol::Srm, Delivery::Unordered),
        // Not in P001's figure: flat gossip congests this tree's root links
        // in our model (docs/reproduction.md); hierarchical gossip is the
        // paper's own cure (§D).
        large(
            "pbcast-hier unordered",
            Protocol::PbcastHier,
            Delivery::Unordered,
        ),
    ];
    let large_tree_bps = scale.inputs.large_tree_bps;
    let all: Vec<&Line> = top.iter().chain(&bottom).collect();
    let mut jobs: Vec<Box<dyn FnOnce() -> Finished + Send + '_>> = Vec::new();
    for &line in &all {
        for seed in scale.seeds() {
            jobs.push(Box::new(move || {
                // Dense trees as in Fig 1 (depth 4); the large tree as in
                // Fig 2 (branching 3, here 6 levels deep).
                let mut link = LinkSpec::paper(LOSS);
                let topology = if line.dense() {
                    Topology::tree_of(line.nodes, 4, link)
                } else {
                    link.bandwidth_bps = large_tree_bps;
                    Topology::tree_breadth_first(line.nodes, 3, link)
                };
                let hosts = if line.dense() {
                    (0..line.nodes).collect()
                } else {
                    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
                    pick_distinct(&mut rng, line.nodes, line.members)
                };
                let hierarchy = line.protocol.is_hierarchical().then(|| {
                    let setup = Setup {
                        hosts: hosts.clone(),
                        ..Setup::everyone(topology.clone())
                    };
                    setup.with_hop_hierarchy(3.0).hierarchy.expect("built")
                });
                Run {
                    protocol: line.protocol,
                    delivery: line.delivery,
                    hierarchy,
                    messages: (100.0 * seconds) as u64,
                    head: head(NAME, line.protocol, line.members, seed, LOSS),
                    inputs: scale.inputs,
                    ..Run::new(&topology, &hosts, seed)
                }
                .run()
            }));
        }
    }
    let runs = run_parallel(jobs);
    let seeds = scale.seeds as usize;
    let mut series: Vec<Series> = Vec::new();
    for (i, line) in all.iter().enumerate() {
        let mine = &runs[i * seeds..(i + 1) * seeds];
        for r in mine {
            figure.add_run(&r.report);
            let row = figure.rows.last_mut().expect("just added");
            let delivery = format!("{:?}", line.delivery).to_lowercase();
            row.push(("delivery".into(), delivery));
            let part = if line.dense() { "top" } else { "bottom" };
            row.push(("figure_part".into(), part.into()));
            let bps = if line.dense() { 1.5e6 } else { large_tree_bps };
            row.push(("link_bps".into(), format!("{bps}")));
            let h = merged(&r.latency_us);
            row.push((
                "over_200ms".into(),
                format!("{:.5}", fraction_at_least(&h, 200.0)),
            ));
        }
        let h = merged(mine.iter().flat_map(|r| &r.latency_us));
        figure.notes.push(format!(
            "{:<18} p50 {:>6.1} ms  p90 {:>6.1} ms  p99 {:>6.1} ms  max {:>7.1} ms  over 200 ms {:.2}%",
            line.label,
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.9) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
            h.max() as f64 / 1e3,
            100.0 * fraction_at_least(&h, 200.0),
        ));
        series.push(Series::new(
            line.label.clone(),
            latency_fractions(&h, 20.0, 1000.0),
        ));
    }
    let bottom_series = series.split_off(top.len());
    figure
        .files
        .push(("latency-dense.csv".into(), histograms_csv(&series)));
    figure
        .files
        .push(("latency-large.csv".into(), histograms_csv(&bottom_series)));
    let plot = |file: String, title: String, series| Plot {
        file,
        title,
        x_label: "latency (ms; last bin: 1 s or more)".into(),
        y_label: "fraction of messages".into(),
        log_y: true,
        kind: PlotKind::Histogram,
        series,
    };
    figure.plots.push(plot(
        format!("{NAME}-dense.svg"),
        "dense trees, 1% loss: pbcast-grb and SRM".into(),
        series,
    ));
    figure.plots.push(plot(
        format!("{NAME}-large.svg"),
        format!("{tree_nodes}-node tree, {members} members, 1% loss"),
        bottom_series,
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the dense trees every protocol delivers everything, SRM's
    /// high-latency share grows with n and its tail outlasts pbcast-grb's;
    /// on the large tree every protocol delivers everything, 90% of
    /// unordered pbcast's deliveries come at about the network's latency
    /// (P001: "90% at the minimum latency"), and FIFO's distribution is
    /// wider. (P001's SRM tail, longer than pbcast's here, is not
    /// reproduced: docs/reproduction.md.)
    #[test]
    fn srm_tail_grows_with_n_and_pbcast_stays_put() {
        let f = run(Scale {
            seeds: 1,
            ..Scale::quick(1)
        });
        let top_incomplete = f
            .incomplete
            .iter()
            .filter(|r| r.contains("group_size=20 ") || r.contains("group_size=80 "));
        assert_eq!(top_incomplete.count(), 0, "{:?}", f.incomplete);
        assert!(f.incomplete.is_empty(), "{:?}", f.incomplete);
        let get = |c: &str, p: &str, n: &str| f.values(c, &[("protocol", p), ("group_size", n)])[0];
        assert!(
            get("over_200ms", "srm", "80") > get("over_200ms", "srm", "20"),
            "SRM tail grows"
        );
        assert!(get("latency_max_ms", "srm", "80") > get("latency_max_ms", "pbcast-grb", "80"));
        let bottom = |c: &str, delivery: &str| {
            let only = [
                ("protocol", "pbcast"),
                ("delivery", delivery),
                ("figure_part", "bottom"),
            ];
            f.values(c, &only)[0]
        };
        let (p50, p90) = (
            bottom("latency_p50_ms", "unordered"),
            bottom("latency_p90_ms", "unordered"),
        );
        assert!(
            p90 < 1.25 * p50,
            "unordered pbcast: p50 {p50} ms, p90 {p90} ms"
        );
        assert!(
            bottom("latency_p50_ms", "fifo") > 2.0 * p50,
            "FIFO is wider"
        );
    }
}
