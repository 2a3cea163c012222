//! `qsm-perturbed` ([B] §6.3 Figs 27-34, [A] §4 Figs 16, 19; notes F9,
//! E9, E13): one receiver disturbed while one sender sends at full speed.
//! "sleep": the receiver is suspended 0.5 s every 5 s; "loss": it loses its
//! input 10 ms every 1 s (1% bursty loss); "burst": 1 s every 10 s ([A]
//! Fig 16); "freeze": one undetected 10 s suspension ([A] Fig 19). [B]:
//! with sleep, throughput declines from about 80 nodes; with loss it is flat
//! to about 160 nodes and then drops; pending grows 6-8× and the token's
//! round trip doubles. [A] Fig 16: burst loss costs 10-15% of throughput
//! (25% at 110 nodes); Fig 19: the freeze fills the 100,000-message window
//! and the sender pauses.

use super::qsm_sim::{sweep, Perturb, Point, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-perturbed";

pub fn run(scale: Scale) -> Figure {
    let sizes: &[usize] = scale.pick(&[20, 50, 110, 200], &[20]);
    let seconds = scale.pick(20.0, 10.0);
    let modes = [
        ("none", Perturb::None),
        (
            "sleep 0.5 s every 5 s",
            Perturb::Sleep {
                every: 5.0,
                length: 0.5,
            },
        ),
        (
            "loss 10 ms every 1 s",
            Perturb::Sleep {
                every: 1.0,
                length: 0.01,
            },
        ),
        (
            "burst 1 s every 10 s",
            Perturb::Sleep {
                every: 10.0,
                length: 1.0,
            },
        ),
        (
            "freeze 10 s once",
            Perturb::Freeze {
                at: 3.0,
                length: 10.0,
            },
        ),
    ];
    let mut points = Vec::new();
    for (label, perturb) in modes {
        for &n in sizes {
            // The frozen member has 10 s of data to recover at
            // `recovery_rate` (2,000/s): about 40 s.
            let drain = if matches!(perturb, Perturb::Freeze { .. }) {
                60.0
            } else {
                6.0
            };
            points.push(Point {
                series: label.into(),
                x: n as f64,
                setup: Setup {
                    seconds,
                    perturb,
                    drain,
                    ..Setup::new(n, scale.seed)
                },
            });
        }
    }
    let (figure, _) = sweep(NAME, "one perturbed receiver", "receivers", points, &[]);
    figure
}
