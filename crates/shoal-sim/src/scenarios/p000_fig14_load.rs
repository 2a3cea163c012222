//! `p000-fig14-load` (P000 §6.4, Figs 14-15; notes E0-8): the messages
//! the vsync layer receives per second at the sender (Fig 14) and at a
//! group member (Fig 15), over P000's 400 s: the sender multicasts
//! 100 messages/s from t = 240 to 260 s and from 540 to 580 s, and between
//! the bursts the group grows from 32 members to 64. The paper's only
//! number is the leader's: 199.4 vsync messages/s with an active sender
//! (a Gseq Req and a delivery per message, each about 100/s); idle, each
//! member sends one repair solicitation a second, so the leader receives
//! about n a second. We measure the leader too.
//!
//! "Received at the Vsync layer" is counted as the vsync packets a member
//! receives (Gseq Reqs and replies, repair solicitations and answers, view
//! changes) plus the multicasts pbcast hands up to it (its deliveries),
//! per 1 s bin. Setup: vsync over pbcast with k = 1 on the P000 switch,
//! hosts at 50 µs per datagram; member 0 leads, member 1 sends, member 2
//! is the member of Fig 15 (in the group throughout). Members 32-63 ask
//! to join through the leader at `Timeline::join_s`, each asleep (silent,
//! dropping everything) until then.

use shoal_core::vsync::{self, Vsync};
use shoal_core::{Instant, NodeId};
use shoal_plot::Series;
use shoal_wire::Kind;

use super::figure::Plot;
use super::p000::{cost, head, real_hosts, switch, HOST_NS};
use super::{member_seed, ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};
use crate::Sim;

pub const NAME: &str = "p000-fig14-load";

const RATE: f64 = 100.0;

/// The group before and after the joins.
const FIRST: usize = 32;
const GROWN: usize = 64;

/// The hosts whose load is plotted, by role.
const LEADER: usize = 0;
const SENDER: usize = 1;
const MEMBER: usize = 2;

/// When things happen, in simulated seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeline {
    /// The first burst, [start, end).
    pub burst1: (f64, f64),
    /// Members 32-63 ask to join.
    pub join_s: f64,
    /// The second burst.
    pub burst2: (f64, f64),
    /// The plot's window, [start, end) (P000's "400 s interval").
    pub window: (f64, f64),
}

impl Timeline {
    /// P000's: bursts at 240-260 s and 540-580 s, the joins halfway
    /// between, plotted from 200 to 600 s.
    pub const PAPER: Timeline = Timeline {
        burst1: (240.0, 260.0),
        join_s: 400.0,
        burst2: (540.0, 580.0),
        window: (200.0, 600.0),
    };

    /// The same shape in a quarter of the time (bursts of 5 and 10 s).
    pub const QUICK: Timeline = Timeline {
        burst1: (60.0, 65.0),
        join_s: 100.0,
        burst2: (135.0, 145.0),
        window: (50.0, 150.0),
    };
}

/// Vsync-layer messages received by one host per 1 s bin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Vsync packets received.
    pub vsync: Vec<u64>,
    /// Multicasts delivered (handed up by pbcast).
    pub deliveries: Vec<u64>,
}

impl Load {
    /// Vsync packets plus deliveries in each bin.
    pub fn total(&self) -> Vec<u64> {
        self.vsync
            .iter()
            .zip(&self.deliveries)
            .map(|(v, d)| v + d)
            .collect()
    }

    /// Mean per second of `column` over the bins of [from, to) (seconds
    /// after the window's start).
    fn mean(column: &[u64], from: f64, to: f64) -> f64 {
        let (a, b) = (from as usize, (to as usize).min(column.len()));
        column[a..b].iter().sum::<u64>() as f64 / (b - a).max(1) as f64
    }
}

/// One run: each subject's load over the window, and the group's size.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub report: Report,
    pub leader: Load,
    pub sender: Load,
    pub member: Load,
    /// Members in the leader's view, per bin.
    pub group: Vec<usize>,
}

/// The phases the summary averages, as (name, from, to) in seconds after
/// the window's start, leaving a second at each phase's edge.
fn phases(t: &Timeline) -> [(&'static str, f64, f64); 4] {
    let at = |s: f64| s - t.window.0;
    [
        ("idle32", at(t.window.0) + 1.0, at(t.burst1.0) - 1.0),
        ("burst32", at(t.burst1.0) + 1.0, at(t.burst1.1) - 1.0),
        (
            "idle64",
            at((t.join_s + t.burst2.0) / 2.0),
            at(t.burst2.0) - 1.0,
        ),
        ("burst64", at(t.burst2.0) + 1.0, at(t.burst2.1) - 1.0),
    ]
}

/// The group: 32 members with the leader, 32 more that join at
/// `join_s` (asleep until then).
fn group(t: &Timeline, seed: u64) -> Sim<Vsync> {
    let config = vsync::Config::default();
    let (topology, hosts) = switch(GROWN);
    let mut sim = Sim::new(&topology, &hosts, seed, |me, members| {
        let seed = member_seed(seed, me);
        let engine = if (me.0 as usize) < FIRST {
            Vsync::new(me, &members[..FIRST], config.clone(), seed, Instant::ZERO)
        } else {
            Vsync::joining(
                me,
                &[NodeId(LEADER as u32)],
                config.clone(),
                seed,
                Instant::ZERO,
            )
        };
        engine.expect("valid config")
    });
    real_hosts(&mut sim, cost(HOST_NS));
    for joiner in FIRST..GROWN {
        sim.sleep(joiner, 0, ns(t.join_s));
    }
    sim
}

/// (vsync packets received, deliveries) at `host` so far.
fn counts(sim: &Sim<Vsync>, host: usize) -> (u64, u64) {
    let (_, m) = sim.hosts().nth(host).expect("host exists");
    (m.packets_received[Kind::Vsync.index()], m.delivered)
}

/// Multicasts the sender got accepted so far.
fn originated(sim: &Sim<Vsync>) -> u64 {
    let (_, m) = sim.hosts().nth(SENDER).expect("the sender");
    m.originated
}

fn one(t: Timeline, seed: u64) -> Outcome {
    let started = std::time::Instant::now();
    let mut sim = group(&t, seed);
    let gap = ns(1.0 / RATE);
    let mut messages = 0;
    for (from, to) in [t.burst1, t.burst2] {
        let count = ((to - from) * RATE) as u64;
        sim.schedule_stream(SENDER, ns(from), gap, count, 64);
        messages += count;
    }
    sim.run_until(ns(t.window.0));
    let subjects = [LEADER, SENDER, MEMBER];
    let mut last = subjects.map(|h| counts(&sim, h));
    let mut loads: [Load; 3] = Default::default();
    let mut group = Vec::new();
    let bins = (t.window.1 - t.window.0) as u64;
    let mut before_join = None;
    for bin in 1..=bins {
        let end = ns(t.window.0) + bin * ns(1.0);
        if before_join.is_none() && end >= ns(t.join_s) {
            // The joiners get what the sender has sent after they joined:
            // its local ids from the number it had sent by then (the
            // engine refuses a multicast during a view change, and a
            // refused one takes no id).
            sim.run_until(ns(t.join_s));
            let sent = originated(&sim);
            for joiner in FIRST..GROWN {
                sim.expect_from(joiner, SENDER as u32, sent);
            }
            before_join = Some(sent);
        }
        sim.run_until(end);
        for (i, &h) in subjects.iter().enumerate() {
            let now = counts(&sim, h);
            loads[i].vsync.push(now.0 - last[i].0);
            loads[i].deliveries.push(now.1 - last[i].1);
            last[i] = now;
        }
        let (leader, _) = sim.hosts().next().expect("the leader");
        group.push(leader.members().len());
    }
    let [leader, sender, member] = loads;
    let mut report = Report::collect(
        &sim,
        head(NAME, "vsync-pbcast", GROWN, seed),
        messages,
        ns(t.window.1),
        (t.burst1.1 - t.burst1.0, &sim.link_bytes()),
        SENDER,
    );
    for (name, from, to) in phases(&t) {
        for (who, load) in [
            ("leader", &leader),
            ("sender", &sender),
            ("member", &member),
        ] {
            let vsync = Load::mean(&load.vsync, from, to);
            let deliveries = Load::mean(&load.deliveries, from, to);
            report.put(&format!("{who}_vsync_per_s_{name}"), format!("{vsync:.1}"));
            report.put(
                &format!("{who}_deliveries_per_s_{name}"),
                format!("{deliveries:.1}"),
            );
        }
    }
    report.put("group_at_end", group.last().copied().unwrap_or(0));
    // Who must have delivered what: the first 32 every multicast the
    // sender got accepted, the joiners those accepted after they joined.
    let sent = originated(&sim);
    let after_join = sent - before_join.expect("the window covers the joins");
    let short: Vec<usize> = sim
        .hosts()
        .enumerate()
        .filter(|(i, (_, m))| m.delivered < if *i < FIRST { sent } else { after_join })
        .map(|(i, _)| i)
        .collect();
    report.put("members_short", short.len());
    // `Report::collect` asked every member for every multicast; the
    // joiners owe only those after their join.
    report.complete = short.is_empty() && report.violations.is_empty();
    for (column, value) in &mut report.summary {
        if column == "complete" {
            *value = report.complete.to_string();
        }
    }
    report.wall = Wall::since(started, sim.events);
    Outcome {
        report,
        leader,
        sender,
        member,
        group,
    }
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let t = scale.pick(Timeline::PAPER, Timeline::QUICK);
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    let jobs: Vec<Job> = scale
        .seeds()
        .map(|seed| Box::new(move || one(t, seed)) as Job)
        .collect();
    let outcomes = run_parallel(jobs);
    for o in &outcomes {
        figure.add_run(&o.report);
    }
    notes(&mut figure, &t);
    let first = &outcomes[0];
    figure
        .files
        .push(("load.csv".into(), load_csv(&t, first, scale.seed)));
    let plot = |file: &str, title: &str, load: &Load| {
        let points = |column: &[u64]| -> Vec<(f64, f64)> {
            column
                .iter()
                .enumerate()
                .map(|(i, c)| (t.window.0 + i as f64, *c as f64))
                .collect()
        };
        Plot::lines(
            format!("{NAME}-{file}.svg"),
            title,
            "time (s)",
            "messages received at the vsync layer per second",
            vec![
                Series::new("all", points(&load.total())),
                Series::new("vsync packets", points(&load.vsync)),
            ],
        )
    };
    let seed = scale.seed;
    figure.plots.push(plot(
        "sender",
        &format!("Fig 14: at the sender (seed {seed}; group 32, then 64)"),
        &first.sender,
    ));
    figure.plots.push(plot(
        "member",
        &format!("Fig 15: at a group member (seed {seed}; group 32, then 64)"),
        &first.member,
    ));
    figure.plots.push(plot(
        "leader",
        &format!("the leader (seed {seed}; group 32, then 64)"),
        &first.leader,
    ));
    figure
}

/// Per phase and subject, the mean over seeds of vsync packets and
/// deliveries per second.
fn notes(figure: &mut Figure, t: &Timeline) {
    for (name, ..) in phases(t) {
        let mut line = format!("{name:<8}");
        for who in ["sender", "member", "leader"] {
            let mean = |what: &str| {
                let v = figure.values(&format!("{who}_{what}_per_s_{name}"), &[]);
                v.iter().sum::<f64>() / v.len().max(1) as f64
            };
            line.push_str(&format!(
                "  {who}: {:>5.1} vsync + {:>5.1} deliveries/s",
                mean("vsync"),
                mean("deliveries")
            ));
        }
        figure.notes.push(line);
    }
}

/// One run's loads, a row per second: `t_s`, the group's size, and each
/// subject's vsync packets and deliveries.
fn load_csv(t: &Timeline, o: &Outcome, seed: u64) -> String {
    let mut out = format!(
        "# seed {seed}\nt_s,group,sender_vsync,sender_deliveries,member_vsync,member_deliveries,leader_vsync,leader_deliveries\n"
    );
    for i in 0..o.group.len() {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{}\n",
            t.window.0 + i as f64 + 1.0,
            o.group[i],
            o.sender.vsync[i],
            o.sender.deliveries[i],
            o.member.vsync[i],
            o.member.deliveries[i],
            o.leader.vsync[i],
            o.leader.deliveries[i],
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short timeline: bursts of 3 s, the joins 24 s before the second.
    const SHORT: Timeline = Timeline {
        burst1: (10.0, 13.0),
        join_s: 16.0,
        burst2: (40.0, 43.0),
        window: (2.0, 45.0),
    };

    /// P000 §6.4's shape at its own subjects: at the sender and at a
    /// member the load follows the send rate during a burst and is light
    /// when idle, before and after the group grows; the leader's idle load
    /// is of the order of n and grows with it; the joiners get in.
    #[test]
    fn load_follows_the_send_rate_and_is_light_when_idle() {
        let o = one(SHORT, 1);
        let violations = &o.report.violations;
        assert!(
            o.report.complete,
            "{:?}",
            &violations[..3.min(violations.len())]
        );
        assert_eq!(o.group.last(), Some(&GROWN), "the group grew to 64");
        let [idle32, burst32, idle64, burst64] = phases(&SHORT);
        for (who, load) in [("sender", &o.sender), ("member", &o.member)] {
            let total = load.total();
            for (name, from, to) in [burst32, burst64] {
                let busy = Load::mean(&total, from, to);
                assert!(busy >= 0.9 * RATE, "{who} {name}: {busy}/s");
            }
            for (name, from, to) in [idle32, idle64] {
                let idle = Load::mean(&total, from, to);
                assert!(idle < 0.1 * RATE, "{who} {name}: {idle}/s");
            }
        }
        let leader_idle = |(_, from, to): (&str, f64, f64)| Load::mean(&o.leader.vsync, from, to);
        let (before, after) = (leader_idle(idle32), leader_idle(idle64));
        let per_member = before / (FIRST - 1) as f64;
        assert!((0.5..2.0).contains(&per_member), "idle: {before}/s for 31");
        assert!(
            after > 1.5 * before,
            "idle load grows with n: {before} -> {after}"
        );
    }
}
