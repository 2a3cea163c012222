//! `qsm-receivers` ([A] §1 Fig 2, [B] §6.1 Fig 14 and §6.3 Figs 27-34;
//! notes E1, F2, F9): throughput against the number of receivers, one group
//! of one region, 1 KB messages, 1 and 2 senders, with one receiver losing
//! its input for 10 ms every second ([B] §6.3's "loss" scenario, "1% bursty
//! loss"). [A]: 8,000 messages/s with one sender and 9,500 with two, "almost
//! perfectly" flat from 2 to 110 nodes; [B] §6.3: flat under the loss
//! scenario up to about 160 nodes, then a sharp drop. The goal:
//! flat to 400 receivers.
//!
//! Two senders each send at most 5,000 messages/s (`send_rate_max`): the
//! receivers' 100 Mbit/s links carry at most about 11,700 1-KB datagrams/s,
//! and [A]'s adaptive rate controller, which found its 9,500/s, is not
//! described. One sender is limited by its CPU only (`qsm_sim`).

use std::num::NonZeroU32;

use shoal_plot::Series;

use super::figure::Plot;
use super::qsm_sim::{head, run, Outcome, Perturb, Setup};
use super::{run_parallel, Figure, Scale};

pub const NAME: &str = "qsm-receivers";

/// Per-sender cap with two senders.
pub const TWO_SENDER_RATE: u32 = 5_000;

pub fn setup(receivers: usize, senders: usize, seconds: f64, seed: u64) -> Setup {
    let mut s = Setup::new(receivers, seed);
    s.senders = senders;
    s.seconds = seconds;
    s.perturb = Perturb::Sleep {
        every: 1.0,
        length: 0.010,
    };
    if senders > 1 {
        s.config.send_rate_max = NonZeroU32::new(TWO_SENDER_RATE);
        s.offered = f64::from(TWO_SENDER_RATE) * 1.2;
    }
    s
}

pub fn run_fig(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let sizes: &[usize] = scale.pick(&[2, 5, 10, 20, 50, 100, 160, 250, 400], &[2, 10, 50]);
    let seconds = scale.pick(10.0, 4.0);
    let mut setups = Vec::new();
    for senders in [1, 2] {
        for &n in sizes {
            for seed in scale.seeds().take(1) {
                setups.push(setup(n, senders, seconds, seed));
            }
        }
    }
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = setups
        .iter()
        .map(|s| {
            let s = s.clone();
            Box::new(move || run(&s, head(NAME, &s))) as Job
        })
        .collect();
    let outcomes = run_parallel(jobs);
    let mut series = Vec::new();
    let mut pending = Vec::new();
    let mut rtt = Vec::new();
    for senders in [1, 2] {
        let mut points = Vec::new();
        let mut p_points = Vec::new();
        let mut r_points = Vec::new();
        for &n in sizes {
            let mine: Vec<&Outcome> = setups
                .iter()
                .zip(&outcomes)
                .filter(|(s, _)| s.senders == senders && s.receivers == n)
                .map(|(_, o)| o)
                .collect();
            let mean = |f: &dyn Fn(&Outcome) -> f64| {
                mine.iter().map(|o| f(o)).sum::<f64>() / mine.len().max(1) as f64
            };
            let total = mean(&|o| o.throughput);
            let slowest = mean(&|o| o.throughput_min);
            points.push((n as f64, total));
            p_points.push((n as f64, mean(&|o| o.pending_max as f64)));
            r_points.push((n as f64, mean(&|o| o.token_rtt_max_ms)));
            figure.notes.push(format!(
                "{senders} sender(s), {n:>3} receivers: {total:>7.0} msgs/s per receiver (slowest {slowest:.0}), pending max {:.0}, token rtt max {:.0} ms",
                mean(&|o| o.pending_max as f64),
                mean(&|o| o.token_rtt_max_ms),
            ));
        }
        let label = format!("{senders} sender{}", if senders > 1 { "s" } else { "" });
        series.push(Series::new(label.clone(), points));
        pending.push(Series::new(label.clone(), p_points));
        rtt.push(Series::new(label, r_points));
    }
    for o in &outcomes {
        figure.add_run(&o.report);
    }
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "QSM: throughput vs receivers (1 group, 1 KB, one receiver loses 10 ms of input each second)",
        "receivers",
        "messages/s delivered per receiver",
        series,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-pending.svg"),
        "QSM: most messages pending at the sender",
        "receivers",
        "pending messages",
        pending,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-token-rtt.svg"),
        "QSM: longest token round trip",
        "receivers",
        "ms",
        rtt,
    ));
    figure
}
