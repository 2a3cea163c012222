//! `qsm-token-rate` ([B] §6.1 Fig 21; notes F6): tokens per second from 1 to
//! 5. [B]: from 1 to 5 tokens/s unACKed data falls by 30% and throughput
//! rises by under 1%; above 1.25/s nothing is gained.

use std::time::Duration;

use super::qsm_sim::{sweep, Point, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-token-rate";

pub fn run(scale: Scale) -> Figure {
    let receivers = scale.pick(110, 20);
    let rates: &[f64] = scale.pick(&[1.0, 1.25, 2.0, 3.0, 4.0, 5.0], &[1.0, 5.0]);
    let points = rates
        .iter()
        .map(|&rate| {
            let mut setup = Setup {
                seconds: scale.pick(10.0, 4.0),
                ..Setup::new(receivers, scale.seed)
            };
            setup.config.token_interval = Duration::from_secs_f64(1.0 / rate);
            Point {
                series: format!("{receivers} receivers"),
                x: rate,
                setup,
            }
        })
        .collect();
    let (figure, _) = sweep(
        NAME,
        "token rate",
        "tokens per second",
        points,
        &[("tokens_per_s", |p| format!("{}", p.x))],
    );
    figure
}
