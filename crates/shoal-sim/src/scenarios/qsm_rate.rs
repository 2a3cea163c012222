//! `qsm-rate` ([A] §2.2 Figs 9-10, [B] §6.4 Figs 35-38; notes E4, F10,
//! F5): one sender at a fixed rate (`send_rate_max`) from 1,000 to 8,000
//! messages/s. Recorded: latency (send to delivery), the sender's pending
//! messages (memory against pending: [B] Fig 19 saw memory grow about 3×
//! faster than pending, from the garbage-collected heap) and a receiver's
//! memory. [A]: latency falls as the rate rises (pipelining), then rises
//! near the CPU limit; cleanup latency about 0.5 s + the token's round trip.
//! [B]: sender memory linear in rate, receiver memory flat.

use std::num::NonZeroU32;

use super::qsm_sim::{sweep, Point, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-rate";

pub fn run(scale: Scale) -> Figure {
    let receivers = scale.pick(110, 20);
    let rates: &[u32] = scale.pick(&[1_000, 2_000, 4_000, 6_000, 7_000, 8_000], &[1_000, 8_000]);
    let points = rates
        .iter()
        .map(|&rate| {
            let mut setup = Setup {
                seconds: scale.pick(10.0, 4.0),
                offered: f64::from(rate) * 1.05,
                ..Setup::new(receivers, scale.seed)
            };
            setup.config.send_rate_max = NonZeroU32::new(rate);
            Point {
                series: format!("{receivers} receivers"),
                x: f64::from(rate),
                setup,
            }
        })
        .collect();
    let (mut figure, outcomes) = sweep(
        NAME,
        "sending rate",
        "messages/s offered",
        points,
        &[("rate", |p| format!("{}", p.x))],
    );
    let latency = |column: &str| -> Vec<(f64, f64)> {
        rates
            .iter()
            .zip(&outcomes)
            .filter_map(|(r, o)| {
                let v = o.report.summary.iter().find(|(k, _)| k == column)?;
                Some((f64::from(*r), v.1.parse().ok()?))
            })
            .collect()
    };
    figure.plots.push(super::figure::Plot::lines(
        format!("{NAME}-latency.svg"),
        "QSM: send-to-delivery latency against rate",
        "messages/s",
        "ms",
        vec![
            shoal_plot::Series::new("p50", latency("latency_p50_ms")),
            shoal_plot::Series::new("p99", latency("latency_p99_ms")),
        ],
    ));
    figure
}
