//! `p000-fig13-waves` (P000 §6.3, Fig 13; notes E0-7): the two "waves" of
//! lazy virtual synchrony. A 0.6 s trace, in a group of 32, of how far
//! delivery has got at the leader (Msgs@Leader), and at a healthy and a
//! perturbed member in their pbcast stream (Msgs@Vsync: what pbcast handed
//! up) and their virtual-synchrony stream (Msgs@App: delivered in gseq
//! order), with a Newview. P000: a healthy member lags the leader where
//! pbcast left holes and catches up lazily through the repair sub-protocol
//! (a gap opened at 0.15 s closed by 0.5 s); a perturbed member lags more
//! and, staying perturbed, is eventually dropped; it does not affect the
//! healthy member.
//!
//! Setup: the P000 switch and hosts at 50 µs per datagram, k = 1, 20 s view period, one
//! sender at 100 multicasts/s of 1 KB (Figs 12 and 14's load). Holes need
//! loss, which P000's testbed had and does not quantify: every link here
//! drops 1% of packets. The perturbed member sleeps through each 100 ms slot
//! with probability 0.8 from just after it acknowledged the first view
//! change (so it is still in the view the trace shows) to the end. Each
//! run is also made without the perturbation, to compare the healthy member.
//!
//! The engines are sampled every millisecond: the leader's and members'
//! next gseq (Msgs@Leader, Msgs@App) and their pbcast delivery count
//! (Msgs@Vsync; a count, so a hole lowers it until pbcast repairs it, where
//! the paper plots the latest message). The trace shows the window from
//! 0.1 s before the leader's first periodic Newview.

use std::fmt::Write as _;

use shoal_core::vsync::{self, Vsync};
use shoal_core::{Instant, NodeId};
use shoal_plot::Series;

use super::figure::Plot;
use super::p000::{cost, head, perturb, real_hosts, Window, HOST_NS};
use super::{member_seed, ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};
use crate::{LinkSpec, Sim, Topology};

pub const NAME: &str = "p000-fig13-waves";

const RATE: f64 = 100.0;
const SIZE: u32 = 1_000;
/// Per link, so about 2% per unicast across the switch.
const LOSS: f64 = 0.01;
/// At 0.5 the member lags but keeps up through repair and is not dropped
/// (as in `p000-fig12-perturbed`); 0.8 is where it stays behind.
const PERTURB_P: f64 = 0.8;
const SAMPLE_S: f64 = 0.001;
const WINDOW_S: f64 = 0.6;
/// The window opens this long before the leader's first periodic Newview.
const BEFORE_NEWVIEW_S: f64 = 0.1;

const LEADER: usize = 0;
const SENDER: usize = 1;
const HEALTHY: usize = 2;

/// One traced member at one sample.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Its next gseq (what it has delivered to the application).
    gseq: u64,
    /// Multicasts pbcast has delivered to it.
    pbcast: u64,
    /// Its view id.
    view: u64,
}

/// How long after the leader a member delivered each message.
#[derive(Debug, Clone, Copy)]
struct Lag {
    mean_ms: f64,
    max_ms: f64,
}

/// What one run measured.
struct Outcome {
    report: Report,
    /// Sample times (s) and, per traced host (leader, healthy, perturbed),
    /// its point at each.
    times: Vec<f64>,
    trace: [Vec<Point>; 3],
    /// Time of the leader's first Newview (view 1), s.
    newview_s: f64,
    healthy_lag: Lag,
    perturbed_lag: Lag,
    perturbed_dropped_s: Option<f64>,
}

/// Per message, how long after the leader `member` delivered it, over the
/// messages both delivered.
fn lag(times: &[f64], leader: &[Point], member: &[Point]) -> Lag {
    let (mut i, mut j) = (0, 0);
    let first = leader.first().map_or(0, |p| p.gseq);
    let last = member.last().map_or(0, |p| p.gseq);
    let (mut sum, mut max, mut count) = (0.0, 0.0f64, 0u64);
    for g in first..last {
        while i < leader.len() && leader[i].gseq <= g {
            i += 1;
        }
        while j < member.len() && member[j].gseq <= g {
            j += 1;
        }
        if i == leader.len() || j == member.len() {
            break;
        }
        let lag = (times[j] - times[i]).max(0.0) * 1000.0;
        sum += lag;
        max = max.max(lag);
        count += 1;
    }
    Lag {
        mean_ms: sum / count.max(1) as f64,
        max_ms: max,
    }
}

fn group(n: usize, config: &vsync::Config, seed: u64) -> Sim<Vsync> {
    let spec = LinkSpec {
        bandwidth_bps: 100e6,
        delay_ns: 50_000,
        loss: LOSS,
        queue_packets: 256,
    };
    let hosts: Vec<usize> = (1..=n).collect();
    let mut sim = Sim::new(&Topology::star(n, spec), &hosts, seed, |me, members| {
        Vsync::new(
            me,
            members,
            config.clone(),
            member_seed(seed, me),
            Instant::ZERO,
        )
        .expect("valid config")
    });
    real_hosts(&mut sim, cost(HOST_NS));
    sim
}

fn one(n: usize, view_period_s: f64, p: f64, seed: u64) -> Outcome {
    let started = std::time::Instant::now();
    let config = vsync::Config {
        view_period: std::time::Duration::from_secs_f64(view_period_s),
        ..vsync::Config::default()
    };
    let mut sim = group(n, &config, seed);
    let perturbed = n - 1;
    let start = 0.5;
    // Two view changes (each period runs from the end of the last one's
    // 1 s ack wait): the perturbed member is dropped at the second.
    let end = start + 2.0 * (view_period_s + 1.0) + 1.5;
    let messages = (RATE * (end - start)) as u64;
    sim.schedule_stream(SENDER, ns(start), ns(1.0 / RATE), messages, SIZE);
    // Past the first Prefreshview's deferred ack and its retry.
    let perturb_from = view_period_s + 0.7;
    perturb(
        &mut sim,
        perturbed,
        p,
        Window {
            start_s: perturb_from,
            seconds: end - perturb_from,
        },
        seed,
    );
    let traced = [LEADER, HEALTHY, perturbed];
    let mut times = Vec::new();
    let mut trace: [Vec<Point>; 3] = Default::default();
    let mut newview_s = f64::NAN;
    let mut perturbed_dropped_s = None;
    let steps = ((end - start) / SAMPLE_S).round() as u64;
    for step in 0..=steps {
        let t = start + step as f64 * SAMPLE_S;
        sim.run_until(ns(t));
        times.push(t);
        let engines: Vec<&Vsync> = sim.hosts().map(|(e, _)| e).collect();
        for (k, &h) in traced.iter().enumerate() {
            let e = engines[h];
            let pbcast = e.pbcast_stats().map_or(0, |s| s.delivered);
            // A removed member keeps its last pbcast count.
            let pbcast = trace[k].last().map_or(pbcast, |p| p.pbcast.max(pbcast));
            trace[k].push(Point {
                gseq: e.next_gseq(),
                pbcast,
                view: e.view_id(),
            });
        }
        let leader = engines[LEADER];
        if newview_s.is_nan() && leader.view_id() >= 1 {
            newview_s = t;
        }
        if perturbed_dropped_s.is_none() && !leader.members().contains(&NodeId(perturbed as u32)) {
            perturbed_dropped_s = Some(t);
        }
    }
    let link_bytes = sim.link_bytes();
    // Compare only what the members delivered while in the group.
    let healthy_lag = lag(&times, &trace[0], &trace[1]);
    let perturbed_lag = lag(&times, &trace[0], &trace[2]);
    let mut head = head(NAME, "vsync-pbcast", n, seed);
    head.push(("loss".into(), LOSS.to_string()));
    head.push(("perturb_p".into(), p.to_string()));
    let mut report = Report::collect(
        &sim,
        head,
        messages,
        ns(end),
        (end - start, &link_bytes),
        SENDER,
    );
    report
        .summary
        .retain(|(k, _)| !matches!(k.as_str(), "messages" | "delivered_min" | "complete"));
    report.put("newview_s", format!("{newview_s:.3}"));
    report.put("healthy_lag_mean_ms", format!("{:.2}", healthy_lag.mean_ms));
    report.put("healthy_lag_max_ms", format!("{:.0}", healthy_lag.max_ms));
    report.put(
        "perturbed_lag_mean_ms",
        format!("{:.2}", perturbed_lag.mean_ms),
    );
    report.put(
        "perturbed_lag_max_ms",
        format!("{:.0}", perturbed_lag.max_ms),
    );
    report.put(
        "perturbed_dropped_s",
        perturbed_dropped_s.map_or(String::new(), |t| format!("{t:.3}")),
    );
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        times,
        trace,
        newview_s,
        healthy_lag,
        perturbed_lag,
        perturbed_dropped_s,
    }
}

/// The trace's window: sample indices from 0.1 s before the Newview.
fn window(o: &Outcome) -> std::ops::Range<usize> {
    let from = o
        .times
        .partition_point(|t| *t < o.newview_s - BEFORE_NEWVIEW_S);
    let to = o.times.partition_point(|t| *t < o.times[from] + WINDOW_S);
    from..to
}

/// `trace.csv`: the window, messages counted from the leader's position at
/// its start; pbcast counts are aligned to the member's gseq there.
fn trace_csv(o: &Outcome) -> (String, Vec<Series>, Vec<Series>) {
    let w = window(o);
    let t0 = o.times[w.start];
    let base = o.trace[0][w.start].gseq as f64;
    let at = |k: usize, i: usize| {
        let p = o.trace[k][i];
        let p0 = o.trace[k][w.start];
        let app = p.gseq as f64 - base;
        let pbcast = p.pbcast as f64 - p0.pbcast as f64 + (p0.gseq as f64 - base);
        (app, pbcast, p.view)
    };
    let mut csv = String::from(
        "time_s,leader_app,healthy_vsync,healthy_app,healthy_view,perturbed_vsync,perturbed_app,perturbed_view\n",
    );
    let mut lines: [Vec<(f64, f64)>; 5] = Default::default();
    let mut newview: [Option<(f64, f64)>; 3] = [None; 3];
    for i in w.clone() {
        let t = o.times[i] - t0;
        let (l, ..) = at(0, i);
        let (ha, hv, hview) = at(1, i);
        let (pa, pv, pview) = at(2, i);
        let _ = writeln!(csv, "{t:.3},{l},{hv},{ha},{hview},{pv},{pa},{pview}");
        // Plot points only where a line moves (and at the ends), as steps:
        // the old value up to the sample before the move.
        let values = [l, hv, ha, pv, pa];
        for (line, v) in lines.iter_mut().zip(values) {
            match line.last().copied() {
                Some((last_t, last_v)) if last_v != v => {
                    let before = t - SAMPLE_S;
                    if before > last_t + SAMPLE_S / 2.0 {
                        line.push((before, last_v));
                    }
                    line.push((t, v));
                }
                Some(_) if i + 1 < w.end => {}
                _ => line.push((t, v)),
            }
        }
        for (k, app, view) in [(0, l, at(0, i).2), (1, ha, hview), (2, pa, pview)] {
            if newview[k].is_none() && view >= 1 {
                newview[k] = Some((t, app));
            }
        }
    }
    let marker = |label: &str, p: Option<(f64, f64)>| {
        p.map(|(t, y)| Series::new(label, vec![(t, y)]).with_bars(vec![(t, y - 8.0, y + 8.0)]))
    };
    let [l, hv, ha, pv, pa] = lines;
    let mut healthy = vec![
        Series::new("Msgs@Leader", l.clone()),
        Series::new("Msgs@Vsync (pbcast)", hv),
        Series::new("Msgs@App (vsync)", ha),
    ];
    healthy.extend(marker("Newview@Leader", newview[0]));
    healthy.extend(marker("Newview@App", newview[1]));
    let mut perturbed = vec![
        Series::new("Msgs@Leader", l),
        Series::new("Msgs@Vsync (pbcast)", pv),
        Series::new("Msgs@App (vsync)", pa),
    ];
    perturbed.extend(marker("Newview@Leader", newview[0]));
    perturbed.extend(marker("Newview@App", newview[2]));
    (csv, healthy, perturbed)
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let n = scale.pick(32, 16);
    // Quick: shorter view period, so both view changes fit a short run.
    let view_period_s = scale.pick(20.0, 4.0);
    let mut configs = Vec::new();
    for p in [0.0, PERTURB_P] {
        for seed in scale.seeds() {
            configs.push((p, seed));
        }
    }
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(p, seed)| Box::new(move || one(n, view_period_s, p, seed)) as Job)
        .collect();
    let results = run_parallel(jobs);
    for o in &results {
        figure.add_run(&o.report);
    }
    figure.incomplete.clear();
    for p in [0.0, PERTURB_P] {
        let mine: Vec<&Outcome> = configs
            .iter()
            .zip(&results)
            .filter(|((cp, _), _)| *cp == p)
            .map(|(_, o)| o)
            .collect();
        let mean = |f: &dyn Fn(&Outcome) -> f64| {
            mine.iter().map(|o| f(o)).sum::<f64>() / mine.len() as f64
        };
        let max = |f: &dyn Fn(&Outcome) -> f64| mine.iter().map(|o| f(o)).fold(0.0, f64::max);
        let dropped: Vec<String> = mine
            .iter()
            .map(|o| {
                o.perturbed_dropped_s
                    .map_or("-".into(), |t| format!("{t:.1}"))
            })
            .collect();
        figure.notes.push(format!(
            "p={p}: healthy lag mean {:.1} ms max {:.0} ms; perturbed lag mean {:.1} ms max {:.0} ms; perturbed dropped at {} s",
            mean(&|o| o.healthy_lag.mean_ms),
            max(&|o| o.healthy_lag.max_ms),
            mean(&|o| o.perturbed_lag.mean_ms),
            max(&|o| o.perturbed_lag.max_ms),
            dropped.join(" "),
        ));
    }
    // The trace: the first seed's perturbed run.
    let traced = configs
        .iter()
        .position(|(p, _)| *p == PERTURB_P)
        .expect("a perturbed run");
    let (csv, healthy, perturbed) = trace_csv(&results[traced]);
    figure.files.push(("trace.csv".into(), csv));
    let title = |who: &str| {
        format!(
            "vsync over pbcast, n = {n}: delivery waves at a {who} member, 0.6 s around a Newview"
        )
    };
    figure.plots.push(Plot::lines(
        format!("{NAME}-healthy.svg"),
        title("healthy"),
        "time (s)",
        "messages since the window opened",
        healthy,
    ));
    figure.plots.push(Plot::lines(
        format!("{NAME}-perturbed.svg"),
        title("perturbed"),
        "time (s)",
        "messages since the window opened",
        perturbed,
    ));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P000 §6.3's shape: the healthy member catches up with the leader;
    /// the perturbed member lags further and is dropped at a later view
    /// change; the perturbation does not slow the healthy member.
    #[test]
    fn healthy_member_catches_up_and_perturbed_one_lags_then_drops() {
        let calm = one(12, 3.0, 0.0, 1);
        let stormy = one(12, 3.0, PERTURB_P, 1);
        assert!(
            calm.perturbed_dropped_s.is_none(),
            "nobody drops unperturbed"
        );
        let dropped = stormy
            .perturbed_dropped_s
            .expect("perturbed member dropped");
        assert!(
            dropped > stormy.newview_s,
            "dropped after the first view change"
        );
        assert!(
            stormy.perturbed_lag.mean_ms > stormy.healthy_lag.mean_ms,
            "perturbed {:?} vs healthy {:?}",
            stormy.perturbed_lag,
            stormy.healthy_lag
        );
        // The healthy member ends level with the leader, but for what is in
        // flight at that instant (the stream is still sending: 5 messages
        // are 50 ms at 100/s).
        let (l, h) = (&stormy.trace[0], &stormy.trace[1]);
        let (l_end, h_end) = (
            l.last().expect("traced").gseq,
            h.last().expect("traced").gseq,
        );
        assert!(
            h_end + 5 >= l_end,
            "healthy member at {h_end}, leader at {l_end}"
        );
        // A perturbed member does not slow the healthy one.
        assert!(
            stormy.healthy_lag.mean_ms <= 2.0 * calm.healthy_lag.mean_ms + 1.0,
            "healthy lag {:?} with a sleeper vs {:?}",
            stormy.healthy_lag,
            calm.healthy_lag
        );
    }
}
