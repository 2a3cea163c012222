//! `qsm-cover-sets` ([B] §2, Figs 2-3; notes F1): nodes (250 to 2,000) each
//! join 10% of a set of groups (1,000 to 10,000) drawn with a Zipf
//! popularity of alpha 1.5, without repeats; Shoal's cover-set algorithm
//! (`shoal_core::qsm::cover`) splits the groups into cover sets. Recorded:
//! the regions a node is in (one per cover set it touches, [B] Fig 2: 4 to
//! 14 on average) and the share of a node's traffic that its two busiest
//! regions carry ([B] Fig 3: "almost all" at 2,000 nodes and 10,000 groups).
//!
//! [B] gives no traffic model for this figure beyond "traffic is also
//! Zipf-like"; here a group's traffic is its popularity weight
//! (1/rank^1.5), so the most joined groups are the busiest. Pure
//! computation: no network is simulated. Also recorded: the sends a message
//! costs (the regions its group spans), averaged over messages.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::qsm::cover::{cover_sets, node_concentration, sends_per_message, CoverConfig};
use shoal_plot::Series;

use super::figure::Plot;
use super::{run_parallel, Figure, Scale};
use crate::report::Wall;

pub const NAME: &str = "qsm-cover-sets";

const ALPHA: f64 = 1.5;
const JOIN_FRACTION: f64 = 0.10;

/// One configuration's results.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub tail_share: f64,
    pub nodes: usize,
    pub groups: usize,
    pub seed: u64,
    pub cover_sets: usize,
    pub regions: usize,
    pub regions_per_node_mean: f64,
    pub regions_per_node_max: usize,
    pub top2_share_mean: f64,
    pub top2_share_p10: f64,
    /// Share of all traffic (summed over nodes) in the 5 busiest cover sets.
    pub top5_sets_share: f64,
    /// Sends per message (regions its group spans), weighted by traffic.
    pub sends_per_message: f64,
    /// Per node, its top-2 share (for the distribution plot).
    pub shares: Vec<f64>,
    pub wall: Wall,
}

/// `members[g]`: the nodes of group g, with every node joining
/// `JOIN_FRACTION` of the groups by Zipf weight without repeats
/// (Efraimidis-Spirakis weighted sampling: the k largest u^(1/w)).
pub fn zipf_membership(nodes: usize, groups: usize, seed: u64) -> (Vec<Vec<u32>>, Vec<f64>) {
    let weight: Vec<f64> = (0..groups).map(|g| (g as f64 + 1.0).powf(-ALPHA)).collect();
    let joins = ((groups as f64 * JOIN_FRACTION).round() as usize).max(1);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xC0FE);
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); groups];
    let mut keys: Vec<(f64, u32)> = Vec::with_capacity(groups);
    for n in 0..nodes as u32 {
        keys.clear();
        for (g, w) in weight.iter().enumerate() {
            let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            keys.push((u.ln() / w, g as u32));
        }
        keys.select_nth_unstable_by(joins - 1, |a, b| b.0.total_cmp(&a.0));
        for &(_, g) in &keys[..joins] {
            members[g as usize].push(n);
        }
    }
    (members, weight)
}

pub fn one(nodes: usize, groups: usize, seed: u64, tail_share: f64) -> Outcome {
    let started = std::time::Instant::now();
    let (members, traffic) = zipf_membership(nodes, groups, seed);
    let config = CoverConfig {
        tail_traffic_share: tail_share,
        ..CoverConfig::default()
    };
    let sets = cover_sets(nodes, &members, &traffic, &config);
    let per_node = node_concentration(&sets, &members, &traffic, nodes);
    let mut shares: Vec<f64> = per_node.iter().map(|p| p.1).collect();
    let mut by_set: Vec<f64> = sets
        .iter()
        .map(|s| {
            s.groups
                .iter()
                .map(|&g| traffic[g as usize] * members[g as usize].len() as f64)
                .sum()
        })
        .collect();
    by_set.sort_by(|a, b| b.total_cmp(a));
    let total: f64 = by_set.iter().sum();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let regions_per_node: Vec<f64> = per_node.iter().map(|p| p.0 as f64).collect();
    let top2_share_mean = mean(&shares);
    shares.sort_by(f64::total_cmp);
    Outcome {
        tail_share,
        nodes,
        groups,
        seed,
        cover_sets: sets.len(),
        regions: sets.iter().map(|s| s.region_sizes.len()).sum(),
        regions_per_node_mean: mean(&regions_per_node),
        regions_per_node_max: per_node.iter().map(|p| p.0).max().unwrap_or(0),
        top2_share_mean,
        top2_share_p10: shares[shares.len() / 10],
        top5_sets_share: by_set.iter().take(5).sum::<f64>() / total.max(1e-300),
        sends_per_message: sends_per_message(&sets, &traffic),
        shares,
        wall: Wall {
            seconds: started.elapsed().as_secs_f64(),
            events: 0,
        },
    }
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let node_counts: &[usize] = scale.pick(&[250, 500, 1000, 2000], &[250, 500]);
    let group_counts: &[usize] = scale.pick(&[1000, 2000, 5000, 10000], &[1000, 2000]);
    // One seed per configuration: the membership is large enough that
    // seeds barely differ (a `--seeds` above 1 still adds them).
    let seeds: Vec<u64> = scale.seeds().take(scale.pick(1, 1)).collect();
    // With and without the tail set (`CoverConfig::tail_traffic_share`).
    let tails = [0.0, CoverConfig::default().tail_traffic_share];
    let mut configs = Vec::new();
    for &tail in &tails {
        for &n in node_counts {
            for &g in group_counts {
                for &s in &seeds {
                    configs.push((n, g, s, tail));
                }
            }
        }
    }
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(n, g, s, tail)| Box::new(move || one(n, g, s, tail)) as Job)
        .collect();
    let outcomes = run_parallel(jobs);
    let mut regions_series = Vec::new();
    let mut share_series = Vec::new();
    for &tail in &tails {
        for &n in node_counts {
            let mine: Vec<&Outcome> = outcomes
                .iter()
                .filter(|o| o.nodes == n && o.tail_share == tail)
                .collect();
            let label = format!("{n} nodes, tail set {:.0}%", tail * 100.0);
            regions_series.push(Series::new(
                label.clone(),
                mine.iter()
                    .map(|o| (o.groups as f64, o.regions_per_node_mean))
                    .collect(),
            ));
            share_series.push(Series::new(
                label,
                mine.iter()
                    .map(|o| (o.groups as f64, 100.0 * o.top2_share_mean))
                    .collect(),
            ));
        }
    }
    for o in &outcomes {
        figure.rows.push(vec![
            ("scenario".into(), NAME.into()),
            ("tail_traffic_share".into(), o.tail_share.to_string()),
            ("nodes".into(), o.nodes.to_string()),
            ("groups".into(), o.groups.to_string()),
            ("seed".into(), o.seed.to_string()),
            ("cover_sets".into(), o.cover_sets.to_string()),
            ("regions".into(), o.regions.to_string()),
            (
                "regions_per_node_mean".into(),
                format!("{:.2}", o.regions_per_node_mean),
            ),
            (
                "regions_per_node_max".into(),
                o.regions_per_node_max.to_string(),
            ),
            (
                "top2_share_mean".into(),
                format!("{:.4}", o.top2_share_mean),
            ),
            ("top2_share_p10".into(), format!("{:.4}", o.top2_share_p10)),
            (
                "top5_cover_sets_traffic_share".into(),
                format!("{:.4}", o.top5_sets_share),
            ),
            (
                "sends_per_message".into(),
                format!("{:.3}", o.sends_per_message),
            ),
        ]);
        figure.wall.seconds += o.wall.seconds;
        figure.notes.push(format!(
            "tail {:>4.2} {:>5} nodes {:>6} groups: {:>4} cover sets, {:>5.2} regions/node (max {}), top-2 share {:.1}% (p10 {:.1}%), top-5 sets {:.1}% of traffic, {:.2} sends/message",
            o.tail_share,
            o.nodes,
            o.groups,
            o.cover_sets,
            o.regions_per_node_mean,
            o.regions_per_node_max,
            100.0 * o.top2_share_mean,
            100.0 * o.top2_share_p10,
            100.0 * o.top5_sets_share,
            o.sends_per_message
        ));
    }
    // [B] Fig 3: the distribution at the largest configuration.
    let default_tail = tails[1];
    if let Some(big) = outcomes
        .iter()
        .filter(|o| o.tail_share == default_tail)
        .max_by_key(|o| (o.nodes, o.groups))
    {
        let mut csv = String::from("top2_share_percent_at_least,fraction_of_nodes\n");
        let mut points = Vec::new();
        for pct in (0..=100).step_by(5) {
            let at_least = big
                .shares
                .iter()
                .filter(|&&s| s * 100.0 >= pct as f64 - 1e-9)
                .count() as f64
                / big.shares.len() as f64;
            csv.push_str(&format!("{pct},{at_least:.4}\n"));
            points.push((pct as f64, at_least));
        }
        figure.files.push(("top2-distribution.csv".into(), csv));
        figure.plots.push(Plot::lines(
            format!("{NAME}-top2.svg"),
            format!(
                "{} nodes, {} groups: nodes whose two busiest regions carry at least x% of their traffic",
                big.nodes, big.groups
            ),
            "share of the node's traffic in its top two regions (%)",
            "fraction of nodes",
            vec![Series::new("nodes", points)],
        ));
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}-regions.svg"),
        "regions per node (one per cover set it is in), Zipf alpha 1.5, 10% joined",
        "groups",
        "regions per node (mean)",
        regions_series,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-share.svg"),
        "share of a node's traffic in its two busiest regions",
        "groups",
        "mean share (%)",
        share_series,
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_membership_joins_ten_percent_and_favours_low_ranks() {
        let (members, _) = zipf_membership(100, 200, 1);
        let joins: usize = members.iter().map(Vec::len).sum();
        assert_eq!(joins, 100 * 20);
        assert!(members[0].len() > 90, "rank 1: {}", members[0].len());
        assert!(members[199].len() < members[0].len() / 3);
    }

    #[test]
    fn traffic_concentrates_in_few_regions() {
        let o = one(250, 1000, 1, 0.05);
        assert!(o.regions_per_node_mean >= 1.0);
        assert!(o.top2_share_mean > 0.5, "{o:?}");
    }
}
