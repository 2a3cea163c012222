//! `spread-sites`: Spread's service end to end across the paper's six
//! sites (P-Spread §2, §4), in the sites harness
//! (`shoal_core::sites::harness`): every daemon a real `SiteDaemon` (the
//! Ring on its site's LAN, Hop links between gateways), clients sending
//! every service to one group, then faults. Not a paper figure: the paper
//! measures links only; this is the end-to-end goal.
//!
//! Setup (assumed; the paper gives none of it): 2 or 3 daemons per site
//! (Mae East, Rutgers, CNDS 3; UCSB, OSU, Hopkins 2), one client each, all
//! in group `g`; every client sends a 200-byte message every 100 ms, the
//! service rotating through unreliable, reliable, fifo, causal, agreed,
//! safe. WAN: a full mesh, one-way delay half of `spread-table1-overlay`'s
//! round-trip matrix, 1.5 Mbit/s per direction (10 between CNDS and
//! Hopkins), link weights the round trip (so sources use shortest-path
//! trees), independent loss per datagram (0 and 1%); Hop's bucket at 95%
//! of the link. LAN: 100 µs per datagram, no loss.
//!
//! Phases (full scale; quick halves every time): steady traffic 0.5-10 s
//! (the latency figures come from its sends); at 10 s the sites split
//! {Mae East, OSU, Rutgers} | {UCSB, CNDS, Hopkins}; at 15 s they merge;
//! at 20 s Rutgers' gateway crashes; traffic stops at 25 s; the run ends at
//! 30 s. The whole history goes to `shoal_check`.
//!
//! Latency: from a client's send to a delivery at a client of another
//! site, against that pair's one-way "ping": the sum, over the overlay
//! path, of propagation plus serialisation of a 300-byte datagram (what a
//! 200-byte message is on the wire), with no CPU cost.

use std::collections::BTreeMap;
use std::time::Duration;

use shoal_core::overlay::{Membership, Routes, SiteId, Topology};
use shoal_core::sites::harness::{check_service, full_mesh, Rec, WanLink, World, WorldConfig};
use shoal_core::sites::Service;
use shoal_core::{Instant, NodeId};
use shoal_plot::Series;

use super::figure::Plot;
use super::spread_sim::{row, SITES};
use super::spread_table1_overlay::RTT_MS;
use super::{Figure, Scale};

pub const NAME: &str = "spread-sites";

/// Daemons per site (Mae East, UCSB, OSU, Rutgers, CNDS, Hopkins).
pub const DAEMONS: [u32; 6] = [3, 2, 2, 3, 3, 2];
/// Background loss per WAN datagram.
pub const LOSS: [f64; 2] = [0.0, 0.01];
const PAYLOAD: usize = 200;
const WIRE_BYTES: f64 = 300.0;
const SEND_EVERY_MS: u64 = 100;

fn link_bps(a: usize, b: usize) -> u64 {
    if (a.min(b), a.max(b)) == (4, 5) {
        10_000_000
    } else {
        1_500_000
    }
}

fn world(loss: f64, seed: u64) -> (World, Routes, Topology) {
    let (topo, wan) = full_mesh(
        &DAEMONS,
        |i| SITES[i].to_string(),
        |a, b| {
            let rtt = RTT_MS[a][b];
            let weight = (rtt * 10.0).round().max(1.0) as u32;
            let link = WanLink {
                delay: Duration::from_secs_f64(rtt / 2.0 / 1000.0),
                bandwidth_bps: link_bps(a, b),
                loss,
            };
            (weight, link)
        },
    );
    let live = topo
        .sites
        .iter()
        .flat_map(|s| s.daemons.iter().copied())
        .collect();
    let routes = Routes::compute(
        &topo,
        &Membership {
            live,
            failed_links: Default::default(),
        },
    );
    let mut config = WorldConfig {
        seed,
        ..WorldConfig::default()
    };
    // Every link gets 95% of 1.5 Mbit/s: the bucket counts Hop's bytes,
    // the wire adds headers (as `spread_sim` does).
    config.daemon.hop.rate_bps = 1_425_000;
    (World::new(topo.clone(), wan, config), routes, topo)
}

/// One-way ping from site `a` to site `b` along the overlay path, ms.
fn ping_ms(routes: &Routes, a: usize, b: usize) -> f64 {
    let mut at = SiteId(a as u16);
    let mut total = 0.0;
    while at.0 as usize != b {
        let Some(next) = routes.next_hop(at, SiteId(b as u16)) else {
            return f64::NAN;
        };
        let (x, y) = (at.0 as usize, next.0 as usize);
        total += RTT_MS[x][y] / 2.0 + WIRE_BYTES * 8.0 / link_bps(x, y) as f64 * 1000.0;
        at = next;
    }
    total
}

/// What one run measured.
struct RunResult {
    /// Per service: (latency ms, ping ms, agreed bound ms) of each
    /// cross-site delivery of a steady-phase send.
    latencies: BTreeMap<Service, Vec<(f64, f64, f64)>>,
    report: shoal_check::Report,
    transitional_views: usize,
    events: u64,
    wan_bytes: u64,
    stats: shoal_core::sites::Stats,
    undelivered_after_merge: usize,
}

fn ms(n: f64) -> Instant {
    Instant::ZERO + Duration::from_secs_f64(n / 1000.0)
}

fn run_one(loss: f64, seed: u64, time_scale: f64) -> RunResult {
    let (mut w, routes, topo) = world(loss, seed);
    let t = |x: f64| x * time_scale;
    let daemons: Vec<NodeId> = topo
        .sites
        .iter()
        .flat_map(|s| s.daemons.iter().copied())
        .collect();
    let mut clients: Vec<(String, NodeId)> = Vec::new();
    for d in &daemons {
        let name = w.connect(*d, 0);
        w.join(&name, "g");
        clients.push((name, *d));
    }
    let group = vec!["g".to_string()];
    let split = [
        vec![SiteId(0), SiteId(2), SiteId(3)],
        vec![SiteId(1), SiteId(4), SiteId(5)],
    ];
    let crashed = topo.sites[3].daemons[0];
    let (mut partitioned, mut merged, mut crash_done) = (false, false, false);
    let mut tick = 0u64;
    let end_traffic = t(25_000.0);
    loop {
        let now_ms = 500.0 + (tick as f64) * 10.0;
        if now_ms >= end_traffic {
            break;
        }
        w.run_until(ms(now_ms));
        if !partitioned && now_ms >= t(10_000.0) {
            w.partition(&split);
            partitioned = true;
        }
        if !merged && now_ms >= t(15_000.0) {
            w.partition(&[(0..6).map(SiteId).collect()]);
            merged = true;
        }
        if !crash_done && now_ms >= t(20_000.0) {
            w.crash(crashed);
            crash_done = true;
        }
        let slot = tick % (SEND_EVERY_MS / 10);
        for (i, (c, d)) in clients.iter().enumerate() {
            if (i as u64) % (SEND_EVERY_MS / 10) != slot || (crash_done && *d == crashed) {
                continue;
            }
            let round = tick / (SEND_EVERY_MS / 10);
            let service = Service::ALL[(round as usize + i) % Service::ALL.len()];
            w.send(c, service, &group, PAYLOAD);
        }
        tick += 1;
    }
    w.run_until(ms(t(30_000.0)));
    measure(
        &w,
        &routes,
        &topo,
        t(10_000.0),
        t(15_000.0) + 2000.0,
        crashed,
    )
}

fn measure(
    w: &World,
    routes: &Routes,
    topo: &Topology,
    steady_end: f64,
    settled: f64,
    crashed: NodeId,
) -> RunResult {
    let site_of_client = |c: &str| -> usize {
        let d: u32 = c
            .rsplit("#d")
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        topo.site_of(NodeId(d)).map_or(0, |s| s.0 as usize)
    };
    let mut sent: BTreeMap<(String, u64), (Instant, Service)> = BTreeMap::new();
    let mut got: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut latencies: BTreeMap<Service, Vec<(f64, f64, f64)>> = BTreeMap::new();
    let mut transitional_views = 0;
    for r in w.history() {
        match r {
            Rec::Send {
                at,
                client,
                seq,
                service,
                ..
            } => {
                sent.insert((client.clone(), *seq), (*at, *service));
            }
            Rec::Deliver {
                at,
                client,
                sender,
                seq,
                ..
            } => {
                *got.entry((sender.clone(), *seq)).or_default() += 1;
                let Some((sent_at, service)) = sent.get(&(sender.clone(), *seq)) else {
                    continue;
                };
                let (a, b) = (site_of_client(sender), site_of_client(client));
                let sent_ms = sent_at.as_nanos() as f64 / 1e6;
                if a == b || sent_ms >= steady_end {
                    continue;
                }
                let latency = (at.as_nanos() - sent_at.as_nanos()) as f64 / 1e6;
                let bound = (0..6)
                    .map(|u| ping_ms(routes, a, u) + ping_ms(routes, u, b))
                    .fold(0.0, f64::max);
                latencies.entry(*service).or_default().push((
                    latency,
                    ping_ms(routes, a, b),
                    bound,
                ));
            }
            Rec::View { transitional, .. } => transitional_views += usize::from(*transitional),
            Rec::Ended { .. } => {}
        }
    }
    // Sent once the merge settled, reliable or stronger, by a live
    // client: owed to every live client.
    let live = w
        .history()
        .iter()
        .filter(|r| matches!(r, Rec::View { .. }))
        .filter_map(|r| match r {
            Rec::View { client, .. } => Some(client.clone()),
            _ => None,
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|c| !c.ends_with(&format!("#d{}", crashed.0)))
        .count();
    let undelivered_after_merge = sent
        .iter()
        .filter(|(_, (at, s))| *s >= Service::Reliable && at.as_nanos() as f64 / 1e6 >= settled)
        .filter(|(k, _)| got.get(k).copied().unwrap_or(0) < live)
        .count();
    let mut stats = shoal_core::sites::Stats::default();
    for d in 0..DAEMONS.iter().sum::<u32>() {
        if let Some(dm) = w.daemon(NodeId(d)) {
            let s = dm.stats();
            stats.resent += s.resent;
            stats.truncated += s.truncated;
            stats.configurations = stats.configurations.max(s.configurations);
            stats.gateway_takeovers += s.gateway_takeovers;
            stats.markers += s.markers;
        }
    }
    RunResult {
        latencies,
        report: w.check(),
        transitional_views,
        events: w.stats().events,
        wan_bytes: w.stats().wan_bytes,
        stats,
        undelivered_after_merge,
    }
}

fn service_name(s: Service) -> &'static str {
    check_service(s).name()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run(scale: Scale) -> Figure {
    let started = std::time::Instant::now();
    let mut figure = Figure::new(NAME);
    let time_scale = scale.pick(1.0, 0.5);
    let mut series = Vec::new();
    let mut ping_points = Vec::new();
    for loss in LOSS {
        let mut per_service: BTreeMap<Service, Vec<(f64, f64, f64)>> = BTreeMap::new();
        for seed in scale.seeds() {
            let r = run_one(loss, seed, time_scale);
            figure.wall.events += r.events;
            let violations: u64 = r.report.violations.values().map(|(n, _)| *n).sum();
            let kinds: Vec<String> = r
                .report
                .violations
                .iter()
                .map(|(k, (n, _))| format!("{k}:{n}"))
                .collect();
            figure.rows.push(row(&[
                ("table", "run".into()),
                ("loss", loss.to_string()),
                ("seed", seed.to_string()),
                ("sends", r.report.summary.sends.to_string()),
                ("deliveries", r.report.summary.deliveries.to_string()),
                ("views", r.report.summary.views.to_string()),
                ("transitional_views", r.transitional_views.to_string()),
                ("violations", violations.to_string()),
                ("violation_kinds", kinds.join(" ")),
                (
                    "undelivered_after_merge",
                    r.undelivered_after_merge.to_string(),
                ),
                ("resent", r.stats.resent.to_string()),
                ("truncated", r.stats.truncated.to_string()),
                ("gateway_takeovers", r.stats.gateway_takeovers.to_string()),
                ("markers", r.stats.markers.to_string()),
                ("wan_bytes", r.wan_bytes.to_string()),
            ]));
            if violations > 0 || r.undelivered_after_merge > 0 {
                figure.incomplete.push(format!(
                    "loss {loss} seed {seed}: {violations} violations ({}), {} messages not delivered to every live client after the merge",
                    kinds.join(" "),
                    r.undelivered_after_merge
                ));
            }
            for (s, v) in r.latencies {
                per_service.entry(s).or_default().extend(v);
            }
        }
        let mut points = Vec::new();
        for (i, s) in Service::ALL.iter().enumerate() {
            let v = per_service.remove(s).unwrap_or_default();
            let mut lat: Vec<f64> = v.iter().map(|x| x.0).collect();
            lat.sort_by(f64::total_cmp);
            let n = v.len().max(1) as f64;
            let mean = lat.iter().sum::<f64>() / n;
            let ping = v.iter().map(|x| x.1).sum::<f64>() / n;
            let bound = v.iter().map(|x| x.2).sum::<f64>() / n;
            figure.rows.push(row(&[
                ("table", "latency".into()),
                ("loss", loss.to_string()),
                ("service", service_name(*s).into()),
                ("deliveries", v.len().to_string()),
                ("mean_ms", format!("{mean:.2}")),
                ("p50_ms", format!("{:.2}", percentile(&lat, 0.5))),
                ("p99_ms", format!("{:.2}", percentile(&lat, 0.99))),
                ("ping_ms", format!("{ping:.2}")),
                ("over_ping_ms", format!("{:.2}", mean - ping)),
                ("ratio_to_ping", format!("{:.2}", mean / ping)),
                ("agreed_floor_ms", format!("{bound:.2}")),
            ]));
            figure.notes.push(format!(
                "loss {:>3.1}% {:<10} mean {mean:>7.1} ms  p99 {:>7.1}  ping {ping:>6.1}  x{:.2}  (hear-from-all floor {bound:.1})",
                loss * 100.0,
                service_name(*s),
                percentile(&lat, 0.99),
                mean / ping
            ));
            points.push(((i + 1) as f64, mean));
            if loss == 0.0 {
                ping_points.push(((i + 1) as f64, ping));
            }
        }
        series.push(Series::new(format!("{}% loss", loss * 100.0), points));
    }
    series.push(Series::new("one-way ping", ping_points));
    figure.plots.push(Plot::lines(
        format!("{NAME}.svg"),
        "six sites: latency per service (1 unreliable .. 6 safe), cross-site deliveries",
        "service (1 unrel, 2 rel, 3 fifo, 4 causal, 5 agreed, 6 safe)",
        "mean latency (ms)",
        series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One quick run: the checker finds nothing, every message after the
    /// merge reaches every live client, unreliable messages arrive near
    /// ping and the ordered services later.
    #[test]
    fn six_sites_under_partition_merge_and_gateway_crash() {
        let r = run_one(0.01, 1, 0.5);
        assert!(r.report.is_clean(), "{}", r.report);
        assert_eq!(r.undelivered_after_merge, 0);
        assert!(r.transitional_views > 0);
        // Five first gateways still up, and the one that took over at Rutgers.
        assert_eq!(r.stats.gateway_takeovers, 6, "the crash moved a gateway");
        let mean = |s: Service| {
            let v = &r.latencies[&s];
            v.iter().map(|x| x.0).sum::<f64>() / v.len() as f64
        };
        let ping = {
            let v = &r.latencies[&Service::Unreliable];
            v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64
        };
        assert!(mean(Service::Unreliable) < ping * 1.5 + 2.0);
        for s in [Service::Agreed, Service::Safe] {
            assert!(mean(s) > ping, "{s:?} waits to hear from every site");
        }
    }
}

#[cfg(test)]
mod figure_files {
    use super::*;

    /// Writes the figure's files into `docs/figures/spread-sites` at full
    /// length with two seeds (what `docs/reproduction.md` reports):
    /// `cargo test -p shoal-sim write_spread_sites_figure --
    /// --ignored --nocapture` (the same as `shoal sim spread-sites
    /// --seeds 2`).
    #[test]
    #[ignore]
    fn write_spread_sites_figure() {
        let scale = Scale {
            seeds: 2,
            ..Scale::full(1)
        };
        let mut f = run(scale);
        f.params = scale.params();
        eprintln!("{}", f.notes.join("\n"));
        eprintln!("incomplete: {:?}", f.incomplete);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/figures/spread-sites");
        f.write(&dir).unwrap();
    }
}
