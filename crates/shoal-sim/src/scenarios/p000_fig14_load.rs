//! `p000-fig14-load` (P000 §6.4, Figs 14-15; notes E0-8): the committee
//! leader's vsync load. With an active sender at 100 multicasts/s the leader
//! handles about 199.4 vsync messages/s (a Gseq Req and its own delivery
//! work per message, each about 100/s); idle, each member sends one repair
//! solicitation per second, so the leader receives about n per second.
//!
//! We count the vsync packets the leader (member 0, k = 1) receives per
//! second while a sender sends 100 messages/s and then while nobody sends,
//! for n = 32 and 64, on the P000 switch with hosts at 50 µs per datagram.

use shoal_core::vsync::{self, Vsync};
use shoal_wire::Kind;

use super::p000::{head, vsync_group};
use super::{ns, run_parallel, Figure, Scale};
use crate::report::{Report, Wall};
use crate::Sim;

pub const NAME: &str = "p000-fig14-load";

const RATE: f64 = 100.0;

/// (report, leader vsync packets/s active, idle).
fn one(n: usize, active_s: f64, idle_s: f64, seed: u64) -> (Report, f64, f64) {
    let started = std::time::Instant::now();
    let mut sim = vsync_group(n, &vsync::Config::default(), seed, 0.1);
    let (start, sender) = (0.5, 1);
    let messages = (RATE * active_s) as u64;
    sim.schedule_stream(sender, ns(start), ns(1.0 / RATE), messages, 1_000);
    let leader = |sim: &Sim<Vsync>| {
        let (_, m) = sim.hosts().next().expect("n >= 1");
        (m.packets_received[Kind::Vsync.index()], m.delivered)
    };
    // Measure inside each phase, a second in from its start.
    let active = (start + 1.0, start + active_s);
    let idle = (start + active_s + 2.0, start + active_s + idle_s);
    let mut count = [(0u64, 0u64); 4];
    let mut link_bytes = Vec::new();
    for (i, t) in [active.0, active.1, idle.0, idle.1].into_iter().enumerate() {
        sim.run_until(ns(t));
        count[i] = leader(&sim);
        if i == 1 {
            // The sending ends here: link load is over the active phase.
            link_bytes = sim.link_bytes();
        }
    }
    let active_rate = (count[1].0 - count[0].0) as f64 / (active.1 - active.0);
    let deliveries_rate = (count[1].1 - count[0].1) as f64 / (active.1 - active.0);
    let idle_rate = (count[3].0 - count[2].0) as f64 / (idle.1 - idle.0);
    let head = head(NAME, "vsync-pbcast", n, seed);
    let end = ns(idle.1);
    let mut report = Report::collect(&sim, head, messages, end, (active_s, &link_bytes), sender);
    report.put("leader_vsync_per_s_active", format!("{active_rate:.1}"));
    report.put("leader_vsync_per_s_idle", format!("{idle_rate:.1}"));
    report.put(
        "leader_deliveries_per_s_active",
        format!("{deliveries_rate:.1}"),
    );
    report.wall = Wall::since(started, sim.events);
    (report, active_rate, idle_rate)
}

pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    let (active_s, idle_s) = scale.pick((20.0, 15.0), (6.0, 6.0));
    let mut configs = Vec::new();
    for n in [32usize, 64] {
        for seed in scale.seeds() {
            configs.push((n, seed));
        }
    }
    type Job = Box<dyn FnOnce() -> (Report, f64, f64) + Send>;
    let jobs: Vec<Job> = configs
        .iter()
        .map(|&(n, seed)| Box::new(move || one(n, active_s, idle_s, seed)) as Job)
        .collect();
    let results = run_parallel(jobs);
    for (r, _, _) in &results {
        figure.add_run(r);
    }
    for n in [32usize, 64] {
        let mine: Vec<&(Report, f64, f64)> = configs
            .iter()
            .zip(&results)
            .filter(|((cn, _), _)| *cn == n)
            .map(|(_, r)| r)
            .collect();
        let mean = |f: fn(&(Report, f64, f64)) -> f64| {
            mine.iter().map(|r| f(r)).sum::<f64>() / mine.len() as f64
        };
        let deliveries = figure.values(
            "leader_deliveries_per_s_active",
            &[("group_size", &n.to_string())],
        );
        let deliveries = deliveries.iter().sum::<f64>() / deliveries.len().max(1) as f64;
        figure.notes.push(format!(
            "n={n}: active ({RATE} multicasts/s): leader receives {:.1} vsync msgs/s and delivers {deliveries:.1}/s; idle: {:.1} vsync msgs/s",
            mean(|r| r.1),
            mean(|r| r.2)
        ));
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P000 §6.4's shape: an active sender's load on the leader is of the
    /// order of the send rate; idle, it is of the order of n.
    #[test]
    fn leader_load_follows_the_send_rate_then_the_group_size() {
        let (_, active, idle) = one(32, 4.0, 6.0, 1);
        assert!(active >= 0.9 * RATE, "active: {active}/s");
        let per_member = idle / 31.0;
        assert!(
            (0.5..2.0).contains(&per_member),
            "idle: {idle}/s for 31 others"
        );
        let (_, _, idle64) = one(64, 2.0, 6.0, 1);
        assert!(
            idle64 > 1.5 * idle,
            "idle load grows with n: {idle} -> {idle64}"
        );
    }
}
