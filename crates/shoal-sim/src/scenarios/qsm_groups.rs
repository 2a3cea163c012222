//! `qsm-groups` ([A] §1 Fig 3, [B] §6.5 Figs 39-45; notes E2, F11):
//! throughput against the number of groups, all mapped to one region (every
//! group has the same members); one sender sends message k to group k mod g.
//! [A]: QSM loses 4% at 6,000 groups, from the sender's per-group memory;
//! JGroups halves from 2 to 256. The goal: 10,000 groups cost at
//! most 1% (on real daemons; this is the simulation), at most 512 B per
//! group. The simulator charges no CPU per group: the engine's per-group
//! cost is a binary search in a table of `bytes_per_group` bytes per group,
//! which the summary reports.

use super::qsm_sim::{sweep, Point, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-groups";

pub fn run(scale: Scale) -> Figure {
    let receivers = scale.pick(110, 20);
    let counts: &[u32] = scale.pick(
        &[1, 10, 100, 1_000, 3_000, 6_000, 10_000],
        &[1, 100, 10_000],
    );
    let seconds = scale.pick(10.0, 4.0);
    let points = counts
        .iter()
        .map(|&g| Point {
            series: format!("1 sender, {receivers} receivers"),
            x: f64::from(g),
            setup: Setup {
                groups: g,
                seconds,
                ..Setup::new(receivers, scale.seed)
            },
        })
        .collect();
    let (mut figure, outcomes) = sweep(
        NAME,
        "throughput vs groups in one region",
        "groups",
        points,
        &[],
    );
    if let (Some(first), Some(last)) = (outcomes.first(), outcomes.last()) {
        figure.notes.push(format!(
            "{} -> {} groups: throughput {:.0} -> {:.0} msgs/s ({:+.2}%), {} bytes of state per group",
            counts[0],
            counts[counts.len() - 1],
            first.throughput,
            last.throughput,
            100.0 * (last.throughput / first.throughput - 1.0),
            last.bytes_per_group
        ));
    }
    figure
}
