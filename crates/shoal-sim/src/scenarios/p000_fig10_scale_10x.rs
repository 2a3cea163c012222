//! `p000-fig10-scale-10x`: P000 Fig 10 (vsync over pbcast, the highest
//! stable rate against group size) pushed 10x past `p000-fig10-scale`'s
//! largest size: 2,000, 5,000 and 10,000 members, against the paper's 8-105
//! and the figure's 1,000. Same testbed, messages, view period, search and
//! 45 s per rate as the figure ([`super::p000_fig10_scale`]).
//!
//! Only the relay tree (`relay_fanout = 16`) runs: the flat fan-out's
//! sender spends about 51 µs per copy, so from about 400 members it cannot
//! send even the search's first rate, 50/s, to everyone (the figure shows
//! it at 500 and 1000), and past that its search is one overloaded run.
//!
//! A size's search is hours of CPU at 10^4 members, so the figure is run a
//! size at a time (`shoal sim p000-fig10-scale-10x --sizes 2000`, merged
//! into `--out`, [`SWEPT`]). The quick scale (in `shoal sim all --quick`)
//! runs 250 members for 25 s per rate.

use super::p000_fig10_scale::{build, searches, FIRST_PHASES};
use super::swept::{Row, Swept};
use super::{Figure, Scale};

pub const NAME: &str = "p000-fig10-scale-10x";

const SIZES_FULL: [usize; 3] = [2_000, 5_000, 10_000];
const SIZES_QUICK: [usize; 1] = [250];

/// The relay tree only (see the module's note).
const PHASES: [super::p000_fig10_scale::FirstPhase; 1] = [FIRST_PHASES[1]];

/// Largest first, as the figure runs them.
fn run_order(scale: &Scale) -> Vec<usize> {
    let sizes: &[usize] = scale.pick(&SIZES_FULL, &SIZES_QUICK);
    sizes.iter().rev().copied().collect()
}

/// `shoal sim p000-fig10-scale-10x --sizes ...` runs chosen sizes and
/// merges them into the figure in `--out`.
pub const SWEPT: Swept = Swept {
    name: NAME,
    sizes: run_order,
    from_rows,
};

pub fn run(scale: Scale) -> Figure {
    let seconds = scale.pick(45.0, 25.0);
    let (rows, wall) = searches(scale, &run_order(&scale), &PHASES, seconds);
    let mut figure = from_rows(&scale, rows);
    figure.wall = wall;
    figure
}

fn from_rows(_: &Scale, rows: Vec<Row>) -> Figure {
    build(NAME, &PHASES, " (10x)", rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::Sizes;

    /// Ten times the figure's largest size, largest first; `--sizes` takes
    /// only these, so a 10x part never merges into the figure's own files.
    #[test]
    fn sizes_are_ten_times_the_figures_and_only_they_are_taken() {
        assert_eq!(run_order(&Scale::full(1)), [10_000, 5_000, 2_000]);
        assert_eq!(PHASES[0].relay_fanout, 16);
        let of_the_figure = Scale {
            sizes: Sizes::only(&[1000]).expect("one size"),
            ..Scale::full(1)
        };
        assert!(SWEPT.check(&of_the_figure).is_err());
        let ours = Scale {
            sizes: Sizes::only(&[2000]).expect("one size"),
            ..Scale::full(1)
        };
        assert!(SWEPT.check(&ours).is_ok());
    }
}
