//! What the P001 scenarios share: pbcast as the paper simulates it, one
//! run of a protocol on a topology ([`Run`]), a sweep over protocols,
//! group sizes and seeds ([`Sweep`]), the overhead plots of Figs 1, 2 and
//! 8, and small helpers several figures use.

use std::time::Duration;
use std::time::Instant as WallInstant;

use rand::Rng;
use shoal_core::pbcast::{Config, Delivery};
use shoal_wire::KIND_COUNT;

use super::{
    debug, member_seed, ns, run_parallel, AnyEngine, Figure, Hierarchy, Inputs, Protocol, Scale,
};
use crate::report::{Report, Wall};
use crate::{LinkSpec, Sim, Topology};

/// pbcast as the papers simulate it: IP multicast first phase, fixed-rate
/// sender (no flow control), Ethernet-sized datagrams. The probes of
/// [`Inputs`] (`Inputs::pbcast`) apply on top.
pub fn paper_pbcast() -> Config {
    Config {
        ip_multicast: true,
        send_window: None,
        max_datagram_size: 1472,
        ..Config::default()
    }
}

/// Simulated time after the last message for repair to finish: past the
/// point where a gap is declared lost (`lost_after_rounds`), with margin.
pub(crate) fn drain_ns(config: &Config) -> u64 {
    let rounds = u64::from(config.lost_after_rounds.get()) + 10;
    config.gossip_interval.as_nanos() as u64 * rounds
}

/// A member asleep for a while.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sleep {
    /// Index into the run's hosts.
    pub member: usize,
    /// Simulated second it falls asleep.
    pub start_s: f64,
    /// Seconds it sleeps.
    pub length_s: f64,
}

/// P001 Fig 5's noise: every `period_s` seconds of sending, the sender's
/// next `count` data multicasts reach one random member by unicast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    pub period_s: f64,
    pub count: u32,
}

/// One run: members on `hosts` running `protocol`, member `sender` sends
/// `messages` of `size` bytes at `rate` per second from 0.5 s, an optional
/// [`Sleep`], then a drain long enough for repair to finish.
pub(crate) struct Run<'a> {
    pub topology: &'a Topology,
    pub hosts: &'a [usize],
    pub protocol: Protocol,
    pub delivery: Delivery,
    pub sender: usize,
    pub messages: u64,
    pub rate: f64,
    pub size: u32,
    pub sleep: Option<Sleep>,
    pub seed: u64,
    pub hierarchy: Option<Hierarchy>,
    /// Directed links (from node, to node) whose packets are counted by kind.
    pub watch: Vec<(usize, usize)>,
    pub noise: Option<Noise>,
    /// Count deliveries per bin of this many seconds (`Finished::bins`).
    pub throughput_bin: Option<f64>,
    /// Loss at the members instead of (or besides) the links
    /// (`Sim::set_receive_loss`).
    pub receive_loss: f64,
    /// Leading summary columns (scenario, protocol, group size, ...).
    pub head: Vec<(String, String)>,
    /// The probes applied to pbcast's settings (`Inputs::pbcast`).
    pub inputs: Inputs,
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
            inputs: Inputs::default(),
        }
    }

    /// pbcast's settings in this run (None for SRM).
    fn pbcast_config(&self) -> Option<Config> {
        let config = self.protocol.pbcast_config(self.delivery)?;
        Some(self.inputs.pbcast(config))
    }

    pub fn run(self) -> Finished {
        let started = WallInstant::now();
        let drain = match self.pbcast_config() {
            Some(config) => drain_ns(&config),
            // SRM never gives up and backs off exponentially (adaptive SRM
            // by 3× per try): a long drain, lengthened below while a
            // request is still outstanding.
            None => SRM_DRAIN_NS,
        };
        let (seed, protocol, delivery) = (self.seed, self.protocol, self.delivery);
        let pbcast_config = self.pbcast_config();
        let hierarchy = self.hierarchy.as_ref();
        let inputs = &self.inputs;
        let mut sim = Sim::with_members(self.topology, self.hosts, seed, |me, members| {
            AnyEngine::build(
                protocol,
                delivery,
                me,
                members,
                member_seed(seed, me),
                hierarchy,
                inputs,
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
        if let Some(noise) = self.noise {
            let mut at = ns(0.5) + ns(noise.period_s);
            while at < ns(0.5) + gap * self.messages {
                sim.divert_multicasts(self.sender, at, noise.count);
                at += ns(noise.period_s);
            }
        }
        if let Some(s) = self.sleep {
            sim.sleep(s.member, ns(s.start_s), ns(s.start_s + s.length_s));
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
                let network = sim.network();
                network
                    .links
                    .iter()
                    .position(|l| l.from == from && l.to == to)
                    .and_then(|link| network.kinds(link).copied())
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
        if debug() {
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
        // The settings a probe may have changed (`Inputs`), so a file says
        // how it was made.
        if let Some(config) = pbcast_config {
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
    /// Hierarchical gossip over the topology, which must be a tree: member
    /// j's weight from member i is `base`^-hops, hops the path length
    /// between their nodes (P001 §B: 1/k^d over a tree derived from the
    /// topology). The tree is held once (O(nodes)), each engine keeps a
    /// weight per distance.
    pub fn with_hop_hierarchy(mut self, base: f64) -> Setup {
        self.hierarchy = Some(hop_hierarchy(&self.topology, &self.hosts, base));
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

/// Hierarchical gossip over a tree topology, member i on node `hosts[i]`
/// (member i is `NodeId(i)`, as `Sim::with_members` numbers them), rooted
/// at node 0: weights `base`^-hops.
pub(crate) fn hop_hierarchy(topology: &Topology, hosts: &[usize], base: f64) -> Hierarchy {
    let parents = topology
        .tree_parents(0)
        .expect("hierarchical gossip over the hop count needs a tree topology");
    let members: Vec<(shoal_core::NodeId, usize)> = hosts
        .iter()
        .enumerate()
        .map(|(i, &node)| (shoal_core::NodeId(i as u32), node))
        .collect();
    let tree = shoal_core::pbcast::GossipTree::new(&parents, &members).expect("a valid tree");
    Hierarchy {
        tree: std::sync::Arc::new(tree),
        base,
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
                        inputs: self.scale.inputs,
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

/// The LANs of P001 Figs 5, 7 and 9 and the link between Fig 7's
/// clusters: 10 Mbit/s, 0.1 ms to the switch (P001 gives no figures). A
/// 1.5 Mbit/s bridge saturates: with half the data lost on it, every far
/// member's unicast repairs cross it (about 3.5 Mbit/s at 100 msgs/s),
/// which the paper's figure does not show.
pub fn lan(loss: f64) -> LinkSpec {
    LinkSpec {
        bandwidth_bps: 10e6,
        delay_ns: 100_000,
        loss,
        queue_packets: 50,
    }
}

/// Fraction of recorded values at or above `ms`.
pub(crate) fn fraction_at_least(h: &hdrhistogram::Histogram<u64>, ms: f64) -> f64 {
    let at = (ms * 1000.0) as u64;
    let count: u64 = h
        .iter_recorded()
        .filter(|v| v.value_iterated_to() >= at)
        .map(|v| v.count_at_value())
        .sum();
    count as f64 / h.len().max(1) as f64
}

/// `k` distinct values of 0..n in random order (a partial Fisher-Yates).
pub(crate) fn pick_distinct(rng: &mut impl Rng, n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    for i in 0..k.min(n) {
        let j = rng.random_range(i..n);
        all.swap(i, j);
    }
    all.truncate(k);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_xoshiro::Xoshiro256PlusPlus;
    use shoal_core::pbcast::TreeTargets;
    use shoal_core::NodeId;

    /// The shared tree gives each member the same weights as the per-pair
    /// hop counts the hierarchy held before (`Network::hops_from`): for
    /// every member, the number of members at each hop distance agrees,
    /// in dense trees, a sparse group in a ternary tree and the two
    /// clusters of Fig 9.
    #[test]
    fn the_hop_hierarchy_counts_members_by_network_hops() {
        let spec = LinkSpec::paper(0.0);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let sparse = Topology::tree(5, 3, spec);
        let cases: Vec<(Topology, Vec<usize>)> = vec![
            (Topology::tree_of(60, 4, spec), (0..60).collect()),
            (Topology::tree_breadth_first(40, 3, spec), (0..40).collect()),
            (sparse.clone(), pick_distinct(&mut rng, sparse.nodes, 50)),
            (Topology::two_clusters(8, 5, spec, spec), (2..15).collect()),
        ];
        for (topology, hosts) in cases {
            let hierarchy = hop_hierarchy(&topology, &hosts, 3.0);
            let network = crate::network::Network::new(&topology, &hosts);
            for (i, &from) in hosts.iter().enumerate() {
                let hops = network.hops_from(from);
                let mut expected: Vec<u64> = Vec::new();
                for (j, &to) in hosts.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    let d = hops[to] as usize;
                    if expected.len() <= d {
                        expected.resize(d + 1, 0);
                    }
                    expected[d] += 1;
                }
                let targets =
                    TreeTargets::new(hierarchy.tree.clone(), NodeId(i as u32), 3.0).unwrap();
                assert_eq!(targets.class_sizes(), &expected[..], "member {i}");
            }
        }
    }

    #[test]
    fn only_trees_have_tree_parents() {
        let spec = LinkSpec::paper(0.0);
        let parents = Topology::tree(2, 2, spec).tree_parents(0).unwrap();
        assert_eq!(
            parents,
            vec![None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(2)]
        );
        let mut ring = Topology::chain(4, spec);
        ring.links.push((3, 0, spec));
        assert_eq!(ring.tree_parents(0), None);
        let cut = Topology {
            nodes: 4,
            links: vec![(0, 1, spec), (1, 0, spec), (2, 3, spec)],
        };
        assert_eq!(cut.tree_parents(0), None);
    }
}
