//! `qsm-replication` ([B] §6.2 Figs 25-26; notes F8): 1 sender, 192
//! receivers, replication factor r (members per partition, each caching its
//! partition's share) from 5 to 96. [B]: receiver memory grows linearly
//! with r, the token's round trip super-linearly (3× when half the nodes
//! cache), throughput falls sharply, then oscillates.

use std::num::NonZeroU32;

use super::qsm_sim::{sweep, Point, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-replication";

pub fn run(scale: Scale) -> Figure {
    let receivers = scale.pick(192, 40);
    let factors: &[u32] = scale.pick(&[5, 12, 24, 48, 96], &[5, 20]);
    let points = factors
        .iter()
        .map(|&r| {
            let mut setup = Setup {
                seconds: scale.pick(10.0, 4.0),
                ..Setup::new(receivers, scale.seed)
            };
            setup.config.replication = NonZeroU32::new(r).expect("non-zero");
            Point {
                series: format!("{receivers} receivers"),
                x: f64::from(r),
                setup,
            }
        })
        .collect();
    let (figure, _) = sweep(
        NAME,
        "replication factor",
        "members caching each message (r)",
        points,
        &[("replication", |p| format!("{}", p.x))],
    );
    figure
}
