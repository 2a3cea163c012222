//! Named experiments, one per file (`shoal sim <name>`).

pub mod figure;
pub mod p000;
pub mod p000_fig10_scale;
pub mod p000_fig11_large;
pub mod p000_fig12_perturbed;
pub mod p000_fig13_waves;
pub mod p000_fig14_load;
pub mod p000_fig1_traditional;
pub mod p000_fig6_analysis;
pub mod p000_table2_committee;
pub mod p001_fig1_star;
pub mod p001_fig1_tree;
pub mod p001_fig2_sparse;
pub mod p001_fig2_sparse_10x;
pub mod p001_fig3_histograms;
pub mod p001_fig4_chain;
pub mod p001_fig5_lan;
pub mod p001_fig7_two_cluster;
pub mod p001_fig8_bottleneck;
pub mod p001_fig9_hierarchical;
pub mod pbcast_star;
pub mod pbcast_tree;
pub mod protocol;
pub mod qsm_cover_sets;
pub mod qsm_crash;
pub mod qsm_groups;
pub mod qsm_perturbed;
pub mod qsm_rate;
pub mod qsm_receivers;
pub mod qsm_replication;
pub mod qsm_sim;
pub mod qsm_token_rate;
pub mod spread_fig10_size;
pub mod spread_fig11_load;
pub mod spread_fig6_chain;
pub mod spread_fig8_chain;
pub mod spread_sim;
pub mod spread_table1_overlay;
pub mod spread_table2_link;
pub mod spread_table3_link_loss;
pub mod spread_table4_tree_loss;

use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant as WallInstant;

use shoal_core::pbcast::{Config, Delivery};
use shoal_wire::KIND_COUNT;

use crate::report::{Report, Wall};
use crate::{Sim, Topology};
pub use figure::{Figure, Scale};
pub use protocol::{AnyEngine, Hierarchy, Protocol};

/// Single-run scenarios with their own options.
pub const NAMES: [&str; 2] = ["pbcast-star", "pbcast-tree"];

/// A paper figure: runs at a scale and returns its files.
pub type FigureFn = fn(Scale) -> Figure;

/// The paper figures, in the order `shoal sim all` runs them.
pub const FIGURES: &[(&str, FigureFn)] = &[
    (p001_fig1_tree::NAME, p001_fig1_tree::run),
    (p001_fig1_star::NAME, p001_fig1_star::run),
    (p001_fig2_sparse::NAME, p001_fig2_sparse::run),
    (p001_fig2_sparse_10x::NAME, p001_fig2_sparse_10x::run),
    (p001_fig3_histograms::NAME, p001_fig3_histograms::run),
    (p001_fig4_chain::NAME, p001_fig4_chain::run),
    (p001_fig5_lan::NAME, p001_fig5_lan::run),
    (p001_fig7_two_cluster::NAME, p001_fig7_two_cluster::run),
    (p001_fig8_bottleneck::NAME, p001_fig8_bottleneck::run),
    (p001_fig9_hierarchical::NAME, p001_fig9_hierarchical::run),
    (p000_fig6_analysis::NAME, p000_fig6_analysis::run),
    (p000_fig1_traditional::NAME, p000_fig1_traditional::run),
    (p000_fig12_perturbed::NAME, p000_fig12_perturbed::run),
    (p000_table2_committee::NAME, p000_table2_committee::run),
    (p000_fig14_load::NAME, p000_fig14_load::run),
    (p000_fig10_scale::NAME, p000_fig10_scale::run),
    (p000_fig11_large::NAME, p000_fig11_large::run),
    (p000_fig13_waves::NAME, p000_fig13_waves::run),
    (spread_table1_overlay::NAME, spread_table1_overlay::run),
    (spread_table2_link::NAME, spread_table2_link::run),
    (spread_fig6_chain::NAME, spread_fig6_chain::run),
    (spread_fig8_chain::NAME, spread_fig8_chain::run),
    (spread_fig10_size::NAME, spread_fig10_size::run),
    (spread_fig11_load::NAME, spread_fig11_load::run),
    (spread_table3_link_loss::NAME, spread_table3_link_loss::run),
    (spread_table4_tree_loss::NAME, spread_table4_tree_loss::run),
    (qsm_cover_sets::NAME, qsm_cover_sets::run),
    (qsm_receivers::NAME, qsm_receivers::run_fig),
    (qsm_groups::NAME, qsm_groups::run),
    (qsm_perturbed::NAME, qsm_perturbed::run),
    (qsm_crash::NAME, qsm_crash::run),
    (qsm_token_rate::NAME, qsm_token_rate::run),
    (qsm_replication::NAME, qsm_replication::run),
    (qsm_rate::NAME, qsm_rate::run),
];

/// The figure called `name`.
pub fn figure(name: &str) -> Option<FigureFn> {
    FIGURES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// pbcast as the papers simulate it: IP multicast first phase, fixed-rate
/// sender (no flow control), Ethernet-sized datagrams.
///
/// `SHOAL_SIM_SOLICIT_RETRY_MAX_MS` lets the solicitation retry stretch to
/// the measured repair round trip up to that many milliseconds (off by
/// default; `docs/pbcast.md`), and `SHOAL_SIM_PUSH_HOLD_MAX_MS` sets
/// `push_hold_max` (0: every digest invites every gap, as before
/// 2026-11-25).
pub fn paper_pbcast() -> Config {
    let defaults = Config::default();
    let retry_max = probe_setting(
        "SHOAL_SIM_SOLICIT_RETRY_MAX_MS",
        "milliseconds, at least the 20 ms floor",
        |ms| ms >= defaults.solicit_retry.as_secs_f64() * 1e3,
    )
    .map_or(defaults.solicit_retry_max, |ms| {
        Duration::from_secs_f64(ms / 1e3)
    });
    let push_hold_max = probe_setting(
        "SHOAL_SIM_PUSH_HOLD_MAX_MS",
        "milliseconds, 0 or more",
        |ms| ms >= 0.0,
    )
    .map_or(defaults.push_hold_max, |ms| {
        Duration::from_secs_f64(ms / 1e3)
    });
    Config {
        ip_multicast: true,
        send_window: None,
        max_datagram_size: 1472,
        solicit_retry_max: retry_max,
        push_hold_max,
        ..defaults
    }
}

/// A number a scenario reads from the environment variable `name` to probe
/// a setting the paper leaves open; `None` when unset. A value that is not
/// `what` (`valid` says) stops the run: a probe must not quietly measure
/// the default.
pub(crate) fn probe_setting(name: &str, what: &str, valid: impl Fn(f64) -> bool) -> Option<f64> {
    let value = std::env::var(name).ok()?;
    match value.parse::<f64>() {
        Ok(x) if valid(x) => Some(x),
        _ => panic!("{name} must be {what}, got {value:?}"),
    }
}

/// The seed of member `me`'s engine in a run seeded `run_seed`: every
/// scenario and diagnostic derives it the same way, so a diagnostic that
/// rebuilds a figure's run replays it exactly.
pub(crate) fn member_seed(run_seed: u64, me: shoal_core::NodeId) -> u64 {
    run_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(me.0)
}

/// A diagnostic's simulation of pbcast with `config` on `hosts`: each engine
/// seeded as a figure seeds it (so the diagnostic replays the figure's run),
/// unordered delivery checked where `config` asks for it.
#[cfg(test)]
pub(crate) fn pbcast_sim(
    topology: &Topology,
    hosts: &[usize],
    seed: u64,
    config: &Config,
) -> Sim<shoal_core::pbcast::Pbcast> {
    use shoal_core::pbcast::Pbcast;
    let mut sim = Sim::new(topology, hosts, seed, |me, members| {
        let start = shoal_core::Instant::ZERO;
        Pbcast::new(me, members, config.clone(), member_seed(seed, me), start).expect("valid")
    });
    if config.delivery == Delivery::Unordered {
        sim.check_unordered();
    }
    sim
}

/// A diagnostic's setting from the environment variable `name`, or
/// `default` when unset; a value that does not parse stops the run.
#[cfg(test)]
pub(crate) fn trace_setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: cannot parse {value:?}"))
    })
}

/// Seconds to nanoseconds.
pub(crate) fn ns(seconds: f64) -> u64 {
    (seconds * 1e9) as u64
}

/// Simulated time after the last message for repair to finish: past the
/// point where a gap is declared lost (`lost_after_rounds`), with margin.
pub(crate) fn drain_ns(config: &Config) -> u64 {
    let rounds = u64::from(config.lost_after_rounds.get()) + 10;
    config.gossip_interval.as_nanos() as u64 * rounds
}

/// One run: members on `hosts` running `protocol`, member `sender` sends
/// `messages` of `size` bytes at `rate` per second from 0.5 s, optional
/// (member, start s, length s) sleep, then a drain long enough for repair
/// to finish.
pub(crate) struct Run<'a> {
    pub topology: &'a Topology,
    pub hosts: &'a [usize],
    pub protocol: Protocol,
    pub delivery: Delivery,
    pub sender: usize,
    pub messages: u64,
    pub rate: f64,
    pub size: u32,
    pub sleep: Option<(usize, f64, f64)>,
    pub seed: u64,
    pub hierarchy: Option<Hierarchy>,
    /// Directed links (from node, to node) whose packets are counted by kind.
    pub watch: Vec<(usize, usize)>,
    /// Every `.0` seconds of sending, the sender's next `.1` data multicasts
    /// reach one random member by unicast (P001 Fig 5's noise).
    pub noise: Option<(f64, u32)>,
    /// Count deliveries per bin of this many seconds (`Finished::bins`).
    pub throughput_bin: Option<f64>,
    /// Loss at the members instead of (or besides) the links
    /// (`Sim::set_receive_loss`).
    pub receive_loss: f64,
    /// Leading summary columns (scenario, protocol, group size, ...).
    pub head: Vec<(String, String)>,
}

/// A finished run: the report, plus what figures need beyond it.
pub(crate) struct Finished {
    pub report: Report,
    /// Per member: the latency histogram (µs) of messages it received.
    pub latency_us: Vec<crate::metrics::Latency>,
    /// Per watched link: packets per kind offered to it while the sender
    /// was sending (the drain left out, as for link utilisation), so that
    /// a count divided by `send_seconds` is a rate.
    pub link_kinds: Vec<[u64; KIND_COUNT]>,
    /// Simulated seconds of sending.
    pub send_seconds: f64,
    /// Per member: deliveries per `Run::throughput_bin` (empty if unset).
    pub bins: Vec<Vec<u32>>,
}

impl<'a> Run<'a> {
    /// A run with the common defaults: P001's 100 msgs/s of 210 B from member
    /// 0, plain pbcast, FIFO delivery.
    pub fn new(topology: &'a Topology, hosts: &'a [usize], seed: u64) -> Run<'a> {
        Run {
            topology,
            hosts,
            protocol: Protocol::Pbcast,
            delivery: Delivery::Fifo,
            sender: 0,
            messages: 1000,
            rate: 100.0,
            size: 210,
            sleep: None,
            seed,
            hierarchy: None,
            watch: Vec::new(),
            noise: None,
            throughput_bin: None,
            receive_loss: 0.0,
            head: Vec::new(),
        }
    }

    pub fn run(self) -> Finished {
        let started = WallInstant::now();
        let drain = match self.protocol.pbcast_config(self.delivery) {
            Some(config) => drain_ns(&config),
            // SRM never gives up and backs off exponentially (adaptive SRM
            // by 3× per try): a long drain, lengthened below while a
            // request is still outstanding.
            None => SRM_DRAIN_NS,
        };
        let (seed, protocol, delivery) = (self.seed, self.protocol, self.delivery);
        let hierarchy = self.hierarchy.as_ref();
        let mut sim = Sim::with_members(self.topology, self.hosts, seed, |me, members| {
            AnyEngine::build(
                protocol,
                delivery,
                me,
                members,
                member_seed(seed, me),
                hierarchy,
            )
        });
        if protocol.is_srm() || delivery == Delivery::Unordered {
            sim.check_unordered();
        }
        for &(from, to) in &self.watch {
            sim.watch_link(from, to);
        }
        if let Some(bin) = self.throughput_bin {
            sim.record_throughput(ns(bin));
        }
        if self.receive_loss > 0.0 {
            sim.set_receive_loss(self.receive_loss);
        }
        let gap = ns(1.0 / self.rate);
        sim.schedule_stream(self.sender, ns(0.5), gap, self.messages, self.size);
        if let Some((period, count)) = self.noise {
            let mut at = ns(0.5) + ns(period);
            while at < ns(0.5) + gap * self.messages {
                sim.divert_multicasts(self.sender, at, count);
                at += ns(period);
            }
        }
        if let Some((member, start, length)) = self.sleep {
            sim.sleep(member, ns(start), ns(start + length));
        }
        let send_end = ns(0.5) + gap * self.messages;
        let mut end = send_end + drain;
        sim.run_until(send_end);
        // Link load is measured over the sending period only: the drain
        // would otherwise dilute it, or (when repair backlogs outlast the
        // sending) inflate it past the link's capacity.
        let link_bytes = sim.link_bytes();
        let link_kinds = self
            .watch
            .iter()
            .map(|&(from, to)| {
                sim.network()
                    .links
                    .iter()
                    .find(|l| l.from == from && l.to == to)
                    .and_then(|l| l.kinds.as_deref().copied())
                    .unwrap_or([0; KIND_COUNT])
            })
            .collect();
        sim.run_until(end);
        // SRM is reliable: a member keeps asking, at its backed-off
        // interval, until the repair comes. A message still missing after
        // the drain is late, not lost, so the run goes on (in steps) until
        // every member has every message or `SRM_DRAIN_MAX_NS` has passed.
        // pbcast runs end at their drain: by then a gap has been declared
        // lost (`Event::Lost`), which is pbcast's answer.
        while protocol.is_srm()
            && end < send_end + SRM_DRAIN_MAX_NS
            && !everyone_has_all(&sim, self.messages)
        {
            end += SRM_DRAIN_NS / 6;
            sim.run_until(end);
        }
        if std::env::var_os("SHOAL_SIM_DEBUG").is_some() {
            for (i, (_, m)) in sim.hosts().enumerate() {
                if !m.lost_ranges.is_empty() {
                    eprintln!(
                        "member {i} lost {:?}",
                        &m.lost_ranges[..m.lost_ranges.len().min(5)]
                    );
                }
                eprintln!(
                    "member {i} sent {:?} received {:?}",
                    m.packets_sent, m.packets_received
                );
            }
        }
        let send_seconds = self.messages as f64 / self.rate;
        let mut report = Report::collect(
            &sim,
            self.head,
            self.messages,
            end,
            (send_seconds, &link_bytes),
            self.sender,
        );
        // The settings a probe may have changed, so a file says how it was
        // made (`paper_pbcast` reads them from the environment).
        if let Some(config) = protocol.pbcast_config(delivery) {
            let ms = |d: Duration| format!("{}", d.as_millis());
            report.put("solicit_retry_max_ms", ms(config.solicit_retry_max));
            report.put("push_hold_max_ms", ms(config.push_hold_max));
        }
        report.put(
            "sender_link_busiest_way",
            format!(
                "{:.4}",
                busiest_way(&sim, self.sender, send_seconds, &link_bytes)
            ),
        );
        report.wall = Wall::since(started, sim.events);
        let latency_us = sim.hosts().map(|(_, m)| m.latency_us.clone()).collect();
        let bins = sim
            .hosts()
            .map(|(_, m)| m.deliveries_per_bin.clone())
            .collect();
        Finished {
            report,
            latency_us,
            link_kinds,
            send_seconds,
            bins,
        }
    }
}

/// The busiest one-way direction of the sender's links over the sending
/// period, as a fraction of that direction's capacity (0 to 1; 1 is a
/// saturated direction; bytes count when they enter the queue, so a full
/// queue at the end of sending reads a little above 1). `sender_link_util`, P001's measure, adds both
/// directions over one direction's capacity, so it runs from 0 to 2 and
/// does not say by itself whether a direction is full.
fn busiest_way<E: shoal_core::Engine<Event: crate::metrics::SimEvent>>(
    sim: &Sim<E>,
    sender: usize,
    send_seconds: f64,
    link_bytes: &[u64],
) -> f64 {
    let node = sim.host_node(sender);
    let network = sim.network();
    let mut busiest: f64 = 0.0;
    for (i, link) in network.links.iter().enumerate() {
        if link.from != node && link.to != node {
            continue;
        }
        let capacity = link.spec.bandwidth_bps * send_seconds;
        busiest = busiest.max(link_bytes[i] as f64 * 8.0 / capacity.max(1e-9));
    }
    busiest
}

/// SRM's drain after the last message: past the longest backed-off
/// request interval of fixed SRM on the papers' topologies.
const SRM_DRAIN_NS: u64 = 60_000_000_000;

/// SRM's drain at most, when requests are still outstanding after
/// `SRM_DRAIN_NS` (adaptive SRM backs off 3× per try, to 3^5 = 243 times its
/// first interval).
const SRM_DRAIN_MAX_NS: u64 = 600_000_000_000;

/// Every member delivered every message the senders got accepted (the
/// test `Report::collect` applies for `complete`, without the loss and
/// violation checks, which cannot change by running longer).
fn everyone_has_all<E: shoal_core::Engine<Event: crate::metrics::SimEvent>>(
    sim: &Sim<E>,
    messages: u64,
) -> bool {
    let owed = crate::report::owed(sim, messages);
    sim.hosts().all(|(_, m)| m.delivered >= owed)
}

/// Runs independent jobs on every core (`SHOAL_SIM_THREADS` overrides),
/// returning results in job order, so output never depends on scheduling.
pub(crate) fn run_parallel<T: Send>(jobs: Vec<Box<dyn FnOnce() -> T + Send + '_>>) -> Vec<T> {
    let threads = std::env::var("SHOAL_SIM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                // Take from the front so long early jobs start first.
                let job = {
                    let mut q = queue.lock().expect("queue");
                    if q.is_empty() {
                        break;
                    }
                    q.remove(0)
                };
                let (i, job) = job;
                let result = job();
                results.lock().expect("results").push((i, result));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Where one run's members sit and what it watches.
pub(crate) struct Setup {
    pub topology: Topology,
    pub hosts: Vec<usize>,
    /// Index into `hosts` of the sender.
    pub sender: usize,
    pub hierarchy: Option<Hierarchy>,
    pub watch: Vec<(usize, usize)>,
    /// See [`Run::receive_loss`].
    pub receive_loss: f64,
}

impl Setup {
    /// Hierarchical gossip over the topology: member j's level from member
    /// i is the hop count between their nodes, weights `base`^-hops (P001
    /// §B: 1/k^d over a tree derived from the topology).
    pub fn with_hop_hierarchy(mut self, base: f64) -> Setup {
        let network = crate::network::Network::new(&self.topology, &self.hosts);
        let levels = self
            .hosts
            .iter()
            .map(|&from| {
                let hops = network.hops_from(from);
                self.hosts.iter().map(|&to| hops[to]).collect()
            })
            .collect();
        self.hierarchy = Some(Hierarchy { levels, base });
        self
    }

    /// Every node hosts a member; the sender is node 0.
    pub fn everyone(topology: Topology) -> Setup {
        let hosts = (0..topology.nodes).collect();
        Setup {
            topology,
            hosts,
            sender: 0,
            hierarchy: None,
            watch: Vec::new(),
            receive_loss: 0.0,
        }
    }
}

/// A sweep over protocols × group sizes × seeds with one traffic pattern.
pub(crate) struct Sweep<'a> {
    pub scenario: &'a str,
    pub protocols: &'a [Protocol],
    pub sizes: &'a [usize],
    pub scale: Scale,
    pub loss: f64,
    pub messages: u64,
    pub rate: f64,
    pub size: u32,
    pub delivery: Delivery,
}

/// One finished run of a sweep.
pub(crate) struct SweepRun {
    pub protocol: Protocol,
    pub group_size: usize,
    pub seed: u64,
    pub finished: Finished,
}

impl<'a> Sweep<'a> {
    /// P001's traffic: 100 messages/s of 210 B for `seconds`, FIFO delivery.
    pub fn p001(
        scenario: &'a str,
        protocols: &'a [Protocol],
        sizes: &'a [usize],
        scale: Scale,
        loss: f64,
        seconds: f64,
    ) -> Sweep<'a> {
        Sweep {
            scenario,
            protocols,
            sizes,
            scale,
            loss,
            messages: (100.0 * seconds) as u64,
            rate: 100.0,
            size: 210,
            delivery: Delivery::Fifo,
        }
    }

    /// Runs every configuration (in parallel), adding rows to `figure`.
    pub fn run(
        &self,
        figure: &mut Figure,
        setup: &(dyn Fn(usize, u64) -> Setup + Sync),
    ) -> Vec<SweepRun> {
        let mut configs = Vec::new();
        for &n in self.sizes.iter().rev() {
            for &protocol in self.protocols {
                for seed in self.scale.seeds() {
                    configs.push((protocol, n, seed));
                }
            }
        }
        let jobs: Vec<Box<dyn FnOnce() -> SweepRun + Send + '_>> = configs
            .into_iter()
            .map(|(protocol, n, seed)| {
                Box::new(move || {
                    let s = setup(n, seed);
                    let finished = Run {
                        protocol,
                        delivery: self.delivery,
                        sender: s.sender,
                        messages: self.messages,
                        rate: self.rate,
                        size: self.size,
                        hierarchy: s.hierarchy.clone(),
                        watch: s.watch.clone(),
                        receive_loss: s.receive_loss,
                        head: head(self.scenario, protocol, n, seed, self.loss),
                        ..Run::new(&s.topology, &s.hosts, seed)
                    }
                    .run();
                    SweepRun {
                        protocol,
                        group_size: n,
                        seed,
                        finished,
                    }
                }) as Box<dyn FnOnce() -> SweepRun + Send + '_>
            })
            .collect();
        let mut runs = run_parallel(jobs);
        runs.sort_by_key(|r| (r.group_size, r.protocol, r.seed));
        for r in &runs {
            figure.add_run(&r.finished.report);
        }
        runs
    }
}

/// The three overhead plots of P001 Figs 1 and 2.
pub(crate) fn overhead_plots(figure: &mut Figure, what: &str) {
    let name = figure.name.clone();
    figure.plot_by_group_size(
        &format!("{name}-requests.svg"),
        &format!("{what}: requests received per member"),
        "requests_per_s",
        "requests/s per member",
    );
    figure.plot_by_group_size(
        &format!("{name}-repairs.svg"),
        &format!("{what}: repairs received per member"),
        "repairs_per_s",
        "repairs/s per member",
    );
    figure.plot_by_group_size(
        &format!("{name}-link.svg"),
        &format!("{what}: sender's link, bytes in + out (P001's measure)"),
        "sender_link_util",
        "bytes in + out / one way's capacity (max 2)",
    );
    figure.plot_by_group_size(
        &format!("{name}-link-busiest-way.svg"),
        &format!("{what}: sender's link, busiest direction"),
        "sender_link_busiest_way",
        "fraction of that direction's capacity",
    );
}

/// Headline notes: per protocol, the overhead at the largest size.
pub(crate) fn overhead_notes(figure: &mut Figure, protocols: &[Protocol], largest: usize) {
    for p in protocols {
        let line = format!(
            "n={largest} {:<14} requests/s {:>7.2}  repairs/s {:>7.2}  sender link in+out {:>5.1}%  busiest way {:>5.1}%",
            p.name(),
            figure.mean("requests_per_s", p.name(), largest),
            figure.mean("repairs_per_s", p.name(), largest),
            100.0 * figure.mean("sender_link_util", p.name(), largest),
            100.0 * figure.mean("sender_link_busiest_way", p.name(), largest),
        );
        figure.notes.push(line);
    }
}

/// The first summary columns every scenario writes.
pub(crate) fn head(
    scenario: &str,
    protocol: Protocol,
    group_size: usize,
    seed: u64,
    loss: f64,
) -> Vec<(String, String)> {
    vec![
        ("scenario".into(), scenario.into()),
        ("protocol".into(), protocol.name().into()),
        ("group_size".into(), group_size.to_string()),
        ("seed".into(), seed.to_string()),
        ("loss".into(), loss.to_string()),
    ]
}
