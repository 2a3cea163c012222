//! What the QSM scenarios share: the testbed ([A] §3 and [B] §6: one
//! switched 100 Mbit/s LAN of identical hosts), the per-host CPU model
//! calibrated to [A]'s sender, perturbations, and one run of a region with
//! its measurements.
//!
//! **Calibration** (the notes' proposal, `docs/qsm.md`): [A] §1's sender
//! saturates at about 8,000 1-KB messages/s, and [B] §6.3 reports receivers
//! at 50-60% CPU. A host spends [`SEND_NS`] + 5 ns/byte of CPU per datagram
//! it sends (≈ 120 µs for a 1 KB message: ≈ 8,300/s at most) and
//! [`RECEIVE_NS`] + 5 ns/byte per datagram it receives (≈ 45 µs: 36% busy at
//! 8,000/s); 4,000 received datagrams may wait for the CPU ([A] §2.1's 4 MB
//! socket buffer of 1 KB messages). Senders are blocking applications that
//! offer more than the host can send, so throughput is what the system
//! sustains. The model has no garbage collector: [B]'s memory-to-CPU
//! feedback loop is not simulated, and the figures say so.

use shoal_core::qsm::{self, GroupId, Qsm, RegionId, RegionView};
use shoal_core::{Instant, NodeId};

use shoal_plot::Series;

use super::figure::Plot;
use super::p000::switch;
use super::{member_seed, ns, run_parallel, Figure};
use crate::metrics::{Observed, SimEvent};
use crate::report::{Report, Wall};
use crate::{ProcessingCost, Sim};

/// CPU per datagram sent, ns (plus 5 ns per byte).
pub const SEND_NS: u64 = 115_000;
/// CPU per datagram received, ns (plus 5 ns per byte).
pub const RECEIVE_NS: u64 = 40_000;
/// Received datagrams waiting for the CPU, at most.
pub const BACKLOG: usize = 4_000;
/// Message size ([A], [B]: 1,000-byte arrays).
pub const SIZE: u32 = 1_000;

impl SimEvent for qsm::Event {
    fn observed(&self) -> Observed<'_> {
        let qsm::Event::Deliver {
            source,
            seq,
            payload,
            recovered,
            ..
        } = self;
        Observed::Deliver {
            source: source.0,
            seq: *seq,
            payload,
            recovered: *recovered,
        }
    }
}

/// A disturbance of one receiver (the last host).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Perturb {
    None,
    /// Every `every` seconds the host is suspended for `length` seconds:
    /// it drops what arrives and runs no timers ([B] §6.3's "sleep": 0.5 s
    /// every 5 s; its "loss": input dropped 10 ms every 1 s, modelled the
    /// same way; [A] §4's bursty loss: 1 s every 10 s).
    Sleep {
        every: f64,
        length: f64,
    },
    /// Suspended once, for `length` seconds from `at` s after the start,
    /// and never suspected ([A] §4 Fig 19: an undetected 10 s freeze).
    Freeze {
        at: f64,
        length: f64,
    },
    /// Crashes `at` s after the start; `detect` s later the membership
    /// service installs a region view without it ([A] §4 Fig 18: a 10 s
    /// failure detector).
    Crash {
        at: f64,
        detect: f64,
    },
}

impl Perturb {
    pub fn label(&self) -> String {
        match self {
            Perturb::None => "none".into(),
            Perturb::Sleep { every, length } => format!("{}ms-every-{}s", length * 1e3, every),
            Perturb::Freeze { length, .. } => format!("freeze-{length}s"),
            Perturb::Crash { detect, .. } => format!("crash-detected-after-{detect}s"),
        }
    }
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Setup {
    pub receivers: usize,
    pub senders: usize,
    pub groups: u32,
    /// Seconds of sending.
    pub seconds: f64,
    /// Messages per second each sender's application offers (a little more
    /// than the host can send: the application blocks, and what it could
    /// not send by the end goes during the drain).
    pub offered: f64,
    pub config: qsm::Config,
    pub perturb: Perturb,
    pub seed: u64,
    /// Seconds simulated after the sending period, for recovery to finish.
    pub drain: f64,
}

impl Setup {
    pub fn new(receivers: usize, seed: u64) -> Setup {
        Setup {
            receivers,
            senders: 1,
            groups: 1,
            seconds: 10.0,
            offered: 8_500.0,
            config: qsm::Config::default(),
            perturb: Perturb::None,
            seed,
            drain: 6.0,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub report: Report,
    /// Deliveries per second at a receiver (mean over receivers), over the
    /// sending period after its first 2 s.
    pub throughput: f64,
    /// The same at the slowest receiver.
    pub throughput_min: f64,
    /// Most messages pending at a sender (sampled every 100 ms).
    pub pending_max: usize,
    /// Most payload bytes held by one receiver (sampled every 100 ms).
    pub receiver_bytes_max: usize,
    /// Largest token round trip seen at the region leader (sampled).
    pub token_rtt_max_ms: f64,
    /// Largest token, bytes.
    pub token_bytes_max: usize,
    /// Bytes of per-group state at the sender (`Qsm::bytes_per_group`).
    pub bytes_per_group: usize,
    /// Per second of the run: deliveries at the first receiver.
    pub per_second: Vec<f64>,
    /// Per 100 ms sample: (time s, pending at sender 0).
    pub pending_trace: Vec<(f64, f64)>,
}

const START: f64 = 0.5;
const BIN: f64 = 0.1;

/// Runs `setup`; `head` starts the summary row.
pub fn run(setup: &Setup, head: Vec<(String, String)>) -> Outcome {
    let started = std::time::Instant::now();
    let n = setup.senders + setup.receivers;
    let (topology, hosts) = switch(n);
    let view = RegionView {
        id: RegionId(1),
        view: 1,
        members: (0..n as u32).map(NodeId).collect(),
        groups: (0..setup.groups).map(GroupId).collect(),
    };
    let (seed, config) = (setup.seed, setup.config.clone());
    let mut sim = Sim::new(&topology, &hosts, seed, |me, _| {
        Qsm::new(
            me,
            &view,
            config.clone(),
            member_seed(seed, me),
            Instant::ZERO,
        )
        .expect("valid")
    });
    let cost = |per_datagram_ns| ProcessingCost {
        per_datagram_ns,
        per_byte_ns: 5.0,
        backlog_max: BACKLOG,
    };
    sim.set_processing_cost(cost(RECEIVE_NS));
    sim.set_send_processing_cost(cost(SEND_NS));
    sim.set_blocking_sends(true);
    sim.set_blocking_application(true);
    sim.record_throughput(ns(BIN));
    let per_sender = (setup.offered * setup.seconds) as u64;
    for s in 0..setup.senders {
        // Senders start a little apart so their first bursts do not collide.
        let start = ns(START) + s as u64 * 1_000_000;
        sim.schedule_stream(s, start, ns(1.0 / setup.offered), per_sender, SIZE);
    }
    let end = START + setup.seconds;
    let mut install_at = None;
    match setup.perturb {
        Perturb::None => {}
        Perturb::Sleep { every, length } => {
            // The first disturbance 2 s in (or sooner for short periods).
            let mut at = START + every.min(2.0);
            while at < end {
                sim.sleep(n - 1, ns(at), ns(at + length));
                at += every;
            }
        }
        Perturb::Freeze { at, length } => sim.sleep(n - 1, ns(START + at), ns(START + at + length)),
        Perturb::Crash { at, detect } => {
            sim.sleep(n - 1, ns(START + at), u64::MAX / 2);
            install_at = Some(START + at + detect);
        }
    }
    let (mut pending_max, mut receiver_bytes_max, mut rtt_max) = (0, 0, 0.0f64);
    let mut pending_trace = Vec::new();
    let mut t = 0.0;
    let mut link_bytes = Vec::new();
    while t < end + setup.drain {
        t += BIN;
        sim.run_until(ns(t));
        if install_at.is_some_and(|at| t >= at - 1e-9) {
            install_at = None;
            let survivors = RegionView {
                view: 2,
                members: (0..n as u32 - 1).map(NodeId).collect(),
                ..view.clone()
            };
            for h in 0..n - 1 {
                sim.with_engine(h, |e, now| e.handle_view(now, &survivors));
            }
        }
        if (t - end).abs() < BIN / 2.0 {
            link_bytes = sim.link_bytes();
        }
        let mut hosts_iter = sim.hosts();
        let (sender, _) = hosts_iter.next().expect("a sender");
        let pending = sender.memory().pending;
        pending_max = pending_max.max(pending);
        pending_trace.push((t, pending as f64));
        for (e, _) in sim.hosts().skip(setup.senders) {
            receiver_bytes_max = receiver_bytes_max.max(e.memory().payload_bytes);
        }
        let leader = sim.hosts().next().expect("leader").0;
        rtt_max = rtt_max.max(leader.stats.token_rtt.as_secs_f64() * 1e3);
    }
    if link_bytes.is_empty() {
        link_bytes = sim.link_bytes();
    }
    let messages = per_sender * setup.senders as u64;
    let mut report = Report::collect(
        &sim,
        head,
        messages,
        ns(end + setup.drain),
        (setup.seconds, &link_bytes),
        0,
    );
    let rates: Vec<f64> = sim
        .hosts()
        .skip(setup.senders)
        .map(|(_, m)| m.delivery_rate(ns(START + 2.0), ns(end)))
        .collect();
    let throughput = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    let throughput_min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let token_bytes_max = sim
        .hosts()
        .map(|(e, _)| e.stats.token_bytes_max)
        .max()
        .unwrap_or(0);
    let bytes_per_group = sim.hosts().next().map_or(0, |(e, _)| e.bytes_per_group());
    let first = sim.hosts().nth(setup.senders).expect("a receiver").1;
    let per_second = first
        .bins_between(0, ns(end + setup.drain))
        .chunks((1.0 / BIN) as usize)
        .map(|c| c.iter().map(|&x| f64::from(x)).sum())
        .collect();
    let repairs: u64 = sim.hosts().map(|(e, _)| e.stats.repairs_sent).sum();
    let naks: u64 = sim.hosts().map(|(e, _)| e.stats.naks_sent).sum();
    let dropped_backlog: u64 = sim.hosts().map(|(_, m)| m.dropped_backlog).sum();
    report.put("throughput", format!("{throughput:.1}"));
    report.put("throughput_min", format!("{throughput_min:.1}"));
    report.put("pending_max", pending_max);
    report.put("receiver_bytes_max", receiver_bytes_max);
    report.put("token_rtt_max_ms", format!("{rtt_max:.1}"));
    report.put("token_bytes_max", token_bytes_max);
    report.put("repairs", repairs);
    report.put("naks", naks);
    report.put("dropped_backlog", dropped_backlog);
    report.put("bytes_per_group", bytes_per_group);
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        throughput,
        throughput_min,
        pending_max,
        receiver_bytes_max,
        token_rtt_max_ms: rtt_max,
        token_bytes_max,
        bytes_per_group,
        per_second,
        pending_trace,
    }
}

/// An extra summary column of a sweep: its name and its value per point.
pub type Column = (&'static str, fn(&Point) -> String);

/// A sweep's chart: file suffix, y label, value per outcome.
type Chart<'a> = (&'a str, &'a str, &'a dyn Fn(&Outcome) -> f64);

/// One point of a sweep: its series, its x, its run.
pub struct Point {
    pub series: String,
    pub x: f64,
    pub setup: Setup,
}

/// Runs every point (in parallel) and draws throughput, sender pending
/// and receiver memory against x, one line per series. `extra` adds a
/// column to each row from its outcome.
pub fn sweep(
    name: &str,
    what: &str,
    x_label: &str,
    points: Vec<Point>,
    extra: &[Column],
) -> (Figure, Vec<Outcome>) {
    let mut figure = Figure::new(name);
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = points
        .iter()
        .map(|p| {
            let mut h = head(name, &p.setup);
            for (column, f) in extra {
                h.push(((*column).into(), f(p)));
            }
            let s = p.setup.clone();
            Box::new(move || run(&s, h)) as Job
        })
        .collect();
    let outcomes = run_parallel(jobs);
    let mut labels: Vec<String> = Vec::new();
    for p in &points {
        if !labels.contains(&p.series) {
            labels.push(p.series.clone());
        }
    }
    let line = |f: &dyn Fn(&Outcome) -> f64| -> Vec<Series> {
        labels
            .iter()
            .map(|l| {
                let pts = points
                    .iter()
                    .zip(&outcomes)
                    .filter(|(p, _)| &p.series == l)
                    .map(|(p, o)| (p.x, f(o)))
                    .collect();
                Series::new(l.clone(), pts)
            })
            .collect()
    };
    let charts: [Chart; 4] = [
        ("", "messages/s delivered per receiver", &|o| o.throughput),
        ("-pending", "most messages pending at the sender", &|o| {
            o.pending_max as f64
        }),
        ("-memory", "most payload KB held by a receiver", &|o| {
            o.receiver_bytes_max as f64 / 1e3
        }),
        ("-token-rtt", "longest token round trip (ms)", &|o| {
            o.token_rtt_max_ms
        }),
    ];
    for (suffix, y, f) in charts {
        figure.plots.push(Plot::lines(
            format!("{name}{suffix}.svg"),
            format!("QSM: {what}"),
            x_label,
            y,
            line(f),
        ));
    }
    for (p, o) in points.iter().zip(&outcomes) {
        figure.add_run(&o.report);
        figure.notes.push(format!(
            "{:<28} x={:<8} {:>7.0} msgs/s (slowest {:>6.0}), pending max {:>6}, receiver max {:>6} KB, token rtt max {:>5.0} ms{}",
            p.series,
            p.x,
            o.throughput,
            o.throughput_min,
            o.pending_max,
            o.receiver_bytes_max / 1000,
            o.token_rtt_max_ms,
            if o.report.complete { "" } else { "  INCOMPLETE" }
        ));
    }
    (figure, outcomes)
}

/// The first summary columns of a QSM run.
pub fn head(scenario: &str, setup: &Setup) -> Vec<(String, String)> {
    vec![
        ("scenario".into(), scenario.into()),
        ("protocol".into(), "qsm".into()),
        (
            "group_size".into(),
            (setup.senders + setup.receivers).to_string(),
        ),
        ("seed".into(), setup.seed.to_string()),
        ("receivers".into(), setup.receivers.to_string()),
        ("senders".into(), setup.senders.to_string()),
        ("groups".into(), setup.groups.to_string()),
        ("perturb".into(), setup.perturb.label()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibration: one sender to a few receivers runs near [A]'s 8,000
    /// messages/s, and every receiver gets every message.
    #[test]
    fn one_sender_runs_near_eight_thousand_per_second() {
        let setup = Setup {
            seconds: 4.0,
            ..Setup::new(8, 1)
        };
        let o = run(&setup, head("test", &setup));
        assert!(o.report.complete, "{:?}", o.report.summary);
        assert!(
            (7_000.0..9_000.0).contains(&o.throughput),
            "{}",
            o.throughput
        );
    }

    /// The crash goal at a small scale: while the crashed member is
    /// in the view nothing is ACKed; within 2 s of the view without it,
    /// everything old is.
    #[test]
    fn after_a_crash_everything_old_is_acked_soon_after_the_view_change() {
        let setup = Setup {
            seconds: 8.0,
            perturb: Perturb::Crash {
                at: 2.0,
                detect: 3.0,
            },
            ..Setup::new(10, 1)
        };
        let o = run(&setup, head("test", &setup));
        let pending_at = |t: f64| {
            o.pending_trace
                .iter()
                .find(|(at, _)| *at >= t - 1e-9)
                .map(|p| p.1)
                .unwrap()
        };
        let view_change = START + 2.0 + 3.0;
        assert!(
            pending_at(view_change - 0.1) > 20_000.0,
            "{:?}",
            o.pending_trace
        );
        assert!(
            pending_at(view_change + 2.0) < 9_000.0,
            "{:?}",
            o.pending_trace
        );
        // A live receiver runs at full speed throughout.
        let live = &o.per_second[1..8];
        assert!(live.iter().all(|&d| d > 8_000.0), "{live:?}");
    }
}
