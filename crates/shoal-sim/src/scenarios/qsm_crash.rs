//! `qsm-crash` ([A] §4 Fig 18, [B] Fig 48; notes E11, F14): a receiver
//! crashes 5 s into a full-speed stream; a 10 s failure detector then has
//! the membership service install a region view without it. While it is
//! down its partition's messages cannot become stable, so ACKs stop and
//! messages pile up at the sender. [A]: completions flat for about 10 s,
//! then back to full speed and every old message ACKed "within a few
//! seconds". The issue's goal: full speed and every old message ACKed within
//! the detection time plus 2 s. Recorded: the sender's pending messages and
//! a receiver's deliveries per second, over time.

use shoal_plot::Series;

use super::figure::Plot;
use super::qsm_sim::{head, run as run_one, Perturb, Setup};
use super::{Figure, Scale};

pub const NAME: &str = "qsm-crash";

const CRASH_AT: f64 = 5.0;
const DETECT: f64 = 10.0;

pub fn run(scale: Scale) -> Figure {
    let receivers = scale.pick(110, 20);
    let setup = Setup {
        seconds: 25.0,
        perturb: Perturb::Crash {
            at: CRASH_AT,
            detect: DETECT,
        },
        ..Setup::new(receivers, scale.seed)
    };
    let outcome = run_one(&setup, head(NAME, &setup));
    let mut figure = Figure::new(NAME);
    figure.add_run(&outcome.report);
    // The crashed member never gets the rest: not a failure of the run.
    figure.incomplete.clear();
    let detected = 0.5 + CRASH_AT + DETECT;
    let before: Vec<f64> = outcome
        .pending_trace
        .iter()
        .filter(|(t, _)| *t > 2.5 && *t < 0.5 + CRASH_AT)
        .map(|p| p.1)
        .collect();
    let normal = before.iter().copied().fold(0.0, f64::max);
    let recovered_at = outcome
        .pending_trace
        .iter()
        .find(|(t, p)| *t > detected && *p <= normal)
        .map(|p| p.0);
    let mut csv = String::from("time_s,sender_pending\n");
    for (t, p) in &outcome.pending_trace {
        csv.push_str(&format!("{t:.1},{p}\n"));
    }
    figure.files.push(("pending.csv".into(), csv));
    let mut csv = String::from("second,deliveries_at_receiver\n");
    for (i, d) in outcome.per_second.iter().enumerate() {
        csv.push_str(&format!("{i},{d}\n"));
    }
    figure.files.push(("throughput.csv".into(), csv));
    figure.notes.push(format!(
        "{receivers} receivers: crash at {:.1} s, view change at {detected:.1} s; sender pending back to its pre-crash peak ({normal:.0}) at {}",
        0.5 + CRASH_AT,
        recovered_at.map_or("never (within the run)".into(), |t| format!(
            "{t:.1} s ({:.1} s after the view change)",
            t - detected
        ))
    ));
    if let Some(row) = figure.rows.last_mut() {
        row.push((
            "caught_up_after_view_change_s".into(),
            recovered_at.map_or("never".into(), |t| format!("{:.1}", t - detected)),
        ));
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}-pending.svg"),
        format!(
            "QSM: crash at {:.1} s, detected after {DETECT} s: sender's pending messages",
            0.5 + CRASH_AT
        ),
        "time (s)",
        "pending messages",
        vec![Series::new("sender", outcome.pending_trace.clone())],
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-throughput.svg"),
        "QSM: deliveries per second at a live receiver",
        "time (s)",
        "messages/s",
        vec![Series::new(
            "receiver",
            outcome
                .per_second
                .iter()
                .enumerate()
                .map(|(i, d)| (i as f64, *d))
                .collect(),
        )],
    ));
    figure
}
