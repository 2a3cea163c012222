//! `p001-fig7-two-cluster` (P001 §E, Figs 6 top and 7; notes E1-9): 80
//! members in two LANs of 40 (the split is not stated; we assume equal)
//! joined by one link. 1% loss inside the clusters, 50% on the link between
//! them. The sender is in one cluster; latency is measured at the receivers
//! in the other. pbcast without FIFO, pbcast-grb with FIFO, SRM and adaptive
//! SRM, as in the paper.
//!
//! P001 gives no link speeds or delays for this network, but §E compares
//! SRM's worst delays here with "75ms source-to-destination network
//! latencies". The figure runs two readings: LANs joined by a 0.1 ms link
//! (`*-lan-*`, the sender 0.3 ms from the far cluster), and the same with
//! the link between the clusters 75 ms long (`*-path75-*`). SRM's timers
//! are multiples of the measured distance, pbcast's rounds are not, so the
//! path's length decides how far SRM's tail reaches in seconds.

use shoal_core::pbcast::Delivery;

use super::figure::{histograms_csv, incomplete_line, latency_fractions, merged, Plot, PlotKind};
use super::p001::{fraction_at_least, head, lan, Run};
use super::{run_parallel, Figure, Protocol, Scale};
use crate::{LinkSpec, Topology};

pub const NAME: &str = "p001-fig7-two-cluster";

/// One line of the figure: a protocol and its delivery order.
#[derive(Debug, Clone, Copy)]
struct Line {
    protocol: Protocol,
    delivery: Delivery,
    label: &'static str,
}

const LINES: [Line; 4] = [
    Line {
        protocol: Protocol::Pbcast,
        delivery: Delivery::Unordered,
        label: "pbcast",
    },
    Line {
        protocol: Protocol::PbcastGrb,
        delivery: Delivery::Fifo,
        label: "pbcast-grb (fifo)",
    },
    Line {
        protocol: Protocol::Srm,
        delivery: Delivery::Unordered,
        label: "srm",
    },
    Line {
        protocol: Protocol::SrmAdaptive,
        delivery: Delivery::Unordered,
        label: "srm-adaptive",
    },
];

/// Latency bins: 100 ms up to the last bin at 5 s (P001 Fig 7).
const BIN_MS: f64 = 100.0;
const LAST_MS: f64 = 5000.0;

/// One reading of the link between the clusters.
#[derive(Debug, Clone, Copy)]
pub struct Bridge {
    /// The reading's tag in file names and the `reading` column.
    pub tag: &'static str,
    /// The link's one-way delay.
    pub delay_ns: u64,
}

/// The readings: the LANs' 0.1 ms link, and P001's 75 ms path.
pub const BRIDGES: [Bridge; 2] = [
    Bridge {
        tag: "lan",
        delay_ns: 100_000,
    },
    Bridge {
        tag: "path75",
        delay_ns: 75_000_000,
    },
];

/// Both readings; `summary.csv` tells them apart by `reading`.
pub fn run(scale: Scale) -> Figure {
    let mut figure = Figure::new(NAME);
    for bridge in BRIDGES {
        let heading = format!(
            "link between the clusters {} ms long:",
            bridge.delay_ns as f64 / 1e6
        );
        let part = run_with(scale, bridge);
        figure.absorb(part, "reading", bridge.tag, &heading);
    }
    figure
}

/// One reading of the link between the clusters, plots named
/// `{NAME}-{tag}.svg`.
pub fn run_with(scale: Scale, bridge: Bridge) -> Figure {
    let mut figure = Figure::new(&format!("{NAME}-{}", bridge.tag));
    let per_cluster = 40;
    let seconds = scale.pick(60.0, 10.0);
    let link = LinkSpec {
        delay_ns: bridge.delay_ns,
        ..lan(0.5)
    };
    let topology = Topology::two_clusters(per_cluster, per_cluster, lan(0.01), link);
    let hosts: Vec<usize> = (2..topology.nodes).collect();
    let far: Vec<usize> = (per_cluster..2 * per_cluster).collect();
    let mut jobs: Vec<Box<dyn FnOnce() -> _ + Send + '_>> = Vec::new();
    for Line {
        protocol, delivery, ..
    } in LINES
    {
        for seed in scale.seeds() {
            let (topology, hosts) = (&topology, &hosts);
            jobs.push(Box::new(move || {
                Run {
                    protocol,
                    delivery,
                    messages: (100.0 * seconds) as u64,
                    head: head(NAME, protocol, 2 * per_cluster, seed, 0.5),
                    inputs: scale.inputs,
                    ..Run::new(topology, hosts, seed)
                }
                .run()
            }));
        }
    }
    let runs = run_parallel(jobs);
    let mut series = Vec::new();
    for (i, line) in LINES.iter().enumerate() {
        let (delivery, label) = (line.delivery, line.label);
        let seeds = scale.seeds as usize;
        let mine = &runs[i * seeds..(i + 1) * seeds];
        let mut far_latency = Vec::new();
        for r in mine {
            let mut row = r.report.summary.clone();
            row.push(("delivery".into(), format!("{delivery:?}").to_lowercase()));
            let h = merged(far.iter().map(|&m| &r.latency_us[m]));
            row.push(("far_max_ms".into(), format!("{:.1}", h.max() as f64 / 1e3)));
            let over = |ms| format!("{:.5}", fraction_at_least(&h, ms));
            row.push(("far_over_1s".into(), over(1000.0)));
            row.push(("far_over_5s".into(), over(5000.0)));
            figure.rows.push(row);
            figure.wall.seconds += r.report.wall.seconds;
            figure.wall.events += r.report.wall.events;
            if !r.report.complete {
                figure.incomplete.push(incomplete_line(&r.report));
            }
            far_latency.push(h);
        }
        let all = merged(far_latency.iter());
        figure.notes.push(format!(
            "{label:<18} far cluster: max {:>7.0} ms, {:.2}% over 1 s, {:.2}% at 5 s or more",
            all.max() as f64 / 1e3,
            100.0 * fraction_at_least(&all, 1000.0),
            100.0 * fraction_at_least(&all, 5000.0),
        ));
        series.push(shoal_plot::Series::new(
            label,
            latency_fractions(&all, BIN_MS, LAST_MS),
        ));
    }
    figure
        .files
        .push(("latency.csv".into(), histograms_csv(&series)));
    let title = format!(
        "two clusters, 50% loss on a {} ms link between them: latency in the far cluster",
        bridge.delay_ns as f64 / 1e6
    );
    figure.plots.push(Plot {
        file: format!("{}.svg", figure.name),
        title,
        x_label: "latency (ms; last bin: 5 s or more)".into(),
        y_label: "fraction of messages".into(),
        log_y: true,
        kind: PlotKind::Histogram,
        series,
    });
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pbcast delivers everything in the far cluster within 1 s; SRM has a
    /// tail beyond 1 s (P001 §E).
    #[test]
    fn pbcast_stays_under_a_second_and_srm_has_a_tail() {
        let f = run_with(Scale::quick(1), BRIDGES[0]);
        assert!(f.complete(), "{:?}", f.incomplete);
        let worst = |column: &str, p: &str| {
            let v = f.values(column, &[("protocol", p)]);
            v.into_iter().fold(0.0, f64::max)
        };
        // The paper: pbcast all within 1 s. Ours has a rare tail just past
        // it (see docs/reproduction.md), so the test asserts "almost all",
        // and that the tail ends soon after.
        let pbcast_over = worst("far_over_1s", "pbcast");
        assert!(pbcast_over < 0.001, "pbcast over 1 s: {pbcast_over}");
        let grb_over = worst("far_over_1s", "pbcast-grb");
        assert!(grb_over < 0.001, "pbcast-grb over 1 s: {grb_over}");
        for p in ["pbcast", "pbcast-grb"] {
            let max = worst("far_max_ms", p);
            assert!(max < 2500.0, "{p}: max {max} ms");
        }
        for srm in ["srm", "srm-adaptive"] {
            assert!(worst("far_over_1s", srm) > 10.0 * pbcast_over.max(1e-4));
            assert!(worst("far_max_ms", srm) > 2000.0, "{srm} has a long tail");
        }
    }

    /// Diagnostic (ignored): runs flat pbcast (unordered; with `TRACE_GRB=1`
    /// pbcast-grb, FIFO; `TRACE_HOLD_MS` sets `push_hold_max`) on the full
    /// two-cluster network for seed `TRACE_SEED`, finds the messages some
    /// member declared lost or never delivered, and reruns the
    /// (deterministic) simulation to print, every round, how many members
    /// of each cluster held each of them. Shows how a message ran out of
    /// copies.
    #[test]
    #[ignore]
    fn lost_message_trace() {
        use super::super::p001::drain_ns;
        use super::super::{ns, pbcast_sim, trace_setting as setting};
        use crate::Sim;
        use shoal_core::pbcast::Pbcast;
        use shoal_core::NodeId;
        use shoal_wire::{Kind, KIND_COUNT};
        let seed: u64 = setting("TRACE_SEED", 1);
        let seconds: u64 = setting("TRACE_SECS", 60);
        let per_cluster = 40;
        let topology = Topology::two_clusters(per_cluster, per_cluster, lan(0.01), lan(0.5));
        let hosts: Vec<usize> = (2..topology.nodes).collect();
        // The figure's plain pbcast (unordered), or with TRACE_GRB=1 its
        // pbcast-grb (FIFO).
        let config = if setting("TRACE_GRB", 0) == 1 {
            Protocol::PbcastGrb.pbcast_config(Delivery::Fifo)
        } else {
            Protocol::Pbcast.pbcast_config(Delivery::Unordered)
        };
        let mut config = config.expect("pbcast");
        let default_hold = config.push_hold_max.as_millis() as u64;
        let hold = std::time::Duration::from_millis(setting("TRACE_HOLD_MS", default_hold));
        config.push_hold_max = hold;
        let build = || {
            let mut sim = pbcast_sim(&topology, &hosts, seed, &config);
            sim.schedule_stream(0, ns(0.5), 10_000_000, 100 * seconds, 210);
            sim
        };
        let end = ns(0.5 + seconds as f64) + drain_ns(&config);
        let mut sim = build();
        sim.run_until(end);
        // (source, seq) of every message some member lost, and those members.
        let (mut lost, mut losers) = (Vec::new(), Vec::new());
        for (member, (_, m)) in sim.hosts().enumerate() {
            for &(source, first, last, at) in &m.lost_ranges {
                let at = at as f64 / 1e9;
                eprintln!(
                    "member {member} declared {first}..={last} of {source} lost at {at:.2} s"
                );
                losers.push(member);
                lost.extend((first..=last).map(|seq| (NodeId(source), seq)));
            }
            // A message never heard of is neither delivered nor declared lost.
            for seq in m.undelivered(0, 100 * seconds) {
                if !lost.contains(&(NodeId(0), seq)) {
                    eprintln!("member {member} never delivered {seq} of 0");
                    losers.push(member);
                    lost.push((NodeId(0), seq));
                }
            }
        }
        lost.sort();
        lost.dedup();
        losers.dedup();
        // Replay, printing per round who holds each of them and what the
        // members that lost them received and sent.
        let counts = |sim: &Sim<Pbcast>, i: usize| {
            let (_, m) = sim.hosts().nth(i).expect("member");
            (m.packets_received, m.packets_sent)
        };
        let delta = |now: [u64; KIND_COUNT], before: [u64; KIND_COUNT], kind: Kind| {
            now[kind.index()] - before[kind.index()]
        };
        let mut sim = build();
        let mut before: Vec<_> = losers.iter().map(|&i| counts(&sim, i)).collect();
        for step in 1..=end.div_ceil(100_000_000) {
            sim.run_until(step * 100_000_000);
            let after: Vec<_> = losers.iter().map(|&i| counts(&sim, i)).collect();
            let t = step as f64 / 10.0;
            for &(source, seq) in &lost {
                let sent_at = 0.5 + seq as f64 / 100.0;
                if t < sent_at - 0.1 || t > sent_at + 4.0 {
                    continue;
                }
                for (&i, (now, then)) in losers.iter().zip(after.iter().zip(&before)) {
                    let (received, sent) =
                        (|k| delta(now.0, then.0, k), |k| delta(now.1, then.1, k));
                    eprintln!(
                        "        member {i}: received data {} gossip {} solicit {} retransmit {}; sent gossip {} solicit {} retransmit {}",
                        received(Kind::Data),
                        received(Kind::Gossip),
                        received(Kind::Solicit),
                        received(Kind::Retransmit) + received(Kind::Push),
                        sent(Kind::Gossip),
                        sent(Kind::Solicit),
                        sent(Kind::Retransmit) + sent(Kind::Push),
                    );
                }
                let holders: Vec<usize> = sim
                    .hosts()
                    .enumerate()
                    .filter(|(_, (e, _))| e.holds(source, seq))
                    .map(|(i, _)| i)
                    .collect();
                let near = holders.iter().filter(|&&i| i < per_cluster).count();
                let far = holders.len() - near;
                eprintln!(
                    "{t:>5.1} s  message {seq} (sent {sent_at:.2} s): held by {near} near, {far} far  {holders:?}"
                );
            }
            before = after;
        }
    }
}
