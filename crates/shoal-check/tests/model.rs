//! Histories from a tiny ideal model: clients join, leave and crash, and
//! every event takes effect everywhere at once in one global sequence (so
//! every delivery is in one total order, views are agreed, nothing is lost).
//! Clients may also be cut off into components of their own and merged back
//! (extended virtual synchrony: each side installs a transitional view, then
//! its regular one; a message in flight at a cut is delivered in the
//! transitional view on its sender's side only). The checker must find
//! nothing in these histories, in any interleaving of the clients' streams;
//! and one mutation (two deliveries swapped, one dropped, one duplicated)
//! must be caught.

use std::collections::BTreeSet;

use proptest::prelude::*;
use shoal_check::{check, Kind, Record, Service};

const GROUPS: [&str; 2] = ["g", "h"];

#[derive(Debug, Clone)]
enum Op {
    Join(usize, usize),
    Leave(usize, usize),
    Crash(usize),
    /// Sender, service, destination groups as a bit mask (1..=3).
    Send(usize, Service, u8),
    /// Cut this client off into a component of its own; with a service, a
    /// message of another member of its old component is in flight.
    Cut(usize, Option<Service>),
    /// Every component merges into one.
    Merge,
}

fn op(clients: usize) -> impl Strategy<Value = Op> {
    let c = 0..clients;
    let g = 0..GROUPS.len();
    let service = proptest::sample::select(Service::ALL.to_vec());
    prop_oneof![
        3 => (c.clone(), g.clone()).prop_map(|(c, g)| Op::Join(c, g)),
        1 => (c.clone(), g).prop_map(|(c, g)| Op::Leave(c, g)),
        1 => c.clone().prop_map(Op::Crash),
        8 => (c.clone(), service.clone(), 1u8..=3).prop_map(|(c, s, m)| Op::Send(c, s, m)),
        1 => (c, proptest::option::of(service)).prop_map(|(c, s)| Op::Cut(c, s)),
        1 => Just(Op::Merge),
    ]
}

/// One delivery, and what decides whether dropping it must be caught.
struct Delivery {
    client: usize,
    /// Index in the client's stream.
    pos: usize,
    sender: usize,
    seq: u64,
    service: Service,
    /// Destination groups.
    dests: Vec<usize>,
    /// The sender was a member of a destination group at the send.
    sender_member: bool,
}

struct Model {
    names: Vec<String>,
    streams: Vec<Vec<Record>>,
    /// Per group: its members, in every component.
    members: Vec<BTreeSet<usize>>,
    /// Per group: the last view id given out (regular or transitional, in
    /// any component: ids are unique per group).
    view_id: Vec<u64>,
    /// Per client: its component.
    comp: Vec<usize>,
    next_comp: usize,
    alive: Vec<bool>,
    seq: Vec<u64>,
    deliveries: Vec<Delivery>,
}

impl Model {
    fn new(n: usize) -> Model {
        Model {
            names: (0..n).map(|i| format!("#c{i}#d{}", i % 2)).collect(),
            streams: vec![Vec::new(); n],
            members: vec![BTreeSet::new(); GROUPS.len()],
            view_id: vec![0; GROUPS.len()],
            comp: vec![0; n],
            next_comp: 1,
            alive: vec![true; n],
            seq: vec![0; n],
            deliveries: Vec::new(),
        }
    }

    /// The members of `g` in component `k`.
    fn side(&self, g: usize, k: usize) -> Vec<usize> {
        self.members[g]
            .iter()
            .copied()
            .filter(|&m| self.comp[m] == k)
            .collect()
    }

    /// A new view of `g` listing `members`, installed at each of `to`.
    fn push_view(&mut self, g: usize, to: &[usize], members: &[usize], transitional: bool) {
        self.view_id[g] += 1;
        let names: Vec<&str> = members.iter().map(|&m| self.names[m].as_str()).collect();
        for &c in to {
            let mut r = Record::view(&self.names[c], GROUPS[g], self.view_id[g], &names);
            if transitional {
                r = r.transitional();
            }
            self.streams[c].push(r);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Join(c, g) if self.alive[c] && !self.members[g].contains(&c) => {
                self.members[g].insert(c);
                let s = self.side(g, self.comp[c]);
                self.push_view(g, &s, &s, false);
            }
            Op::Leave(c, g) if self.alive[c] && self.members[g].contains(&c) => {
                self.members[g].remove(&c);
                // The leaver is told (Spread's self-leave).
                let s = self.side(g, self.comp[c]);
                let mut to = s.clone();
                to.push(c);
                self.push_view(g, &to, &s, false);
            }
            Op::Crash(c) if self.alive[c] => {
                self.alive[c] = false;
                self.streams[c].push(Record::ended(&self.names[c], "crashed"));
                for g in 0..GROUPS.len() {
                    if self.members[g].remove(&c) {
                        let s = self.side(g, self.comp[c]);
                        self.push_view(g, &s, &s, false);
                    }
                }
            }
            Op::Send(c, service, mask) if self.alive[c] => {
                let dests: Vec<usize> =
                    (0..GROUPS.len()).filter(|g| mask & (1 << g) != 0).collect();
                let seq = self.send_record(c, service, &dests);
                self.deliver(c, seq, service, &dests, false);
            }
            Op::Cut(c, inflight) if self.alive[c] => self.cut(c, inflight),
            Op::Merge => self.merge(),
            _ => {}
        }
    }

    fn send_record(&mut self, c: usize, service: Service, dests: &[usize]) -> u64 {
        self.seq[c] += 1;
        let names: Vec<&str> = dests.iter().map(|&g| GROUPS[g]).collect();
        let sender = self.names[c].clone();
        self.streams[c].push(Record::send(&sender, self.seq[c], service, &names));
        self.seq[c]
    }

    /// Delivers to the members of `dests` in the sender's component; in a
    /// transitional view, safe deliveries are marked so.
    fn deliver(&mut self, c: usize, seq: u64, service: Service, dests: &[usize], in_t: bool) {
        let names: Vec<&str> = dests.iter().map(|&g| GROUPS[g]).collect();
        let sender = self.names[c].clone();
        let mut receivers = BTreeSet::new();
        for &g in dests {
            receivers.extend(self.side(g, self.comp[c]));
        }
        let sender_member = receivers.contains(&c);
        for r in receivers {
            let mut rec = Record::deliver(&self.names[r], &sender, seq, service, &names);
            if in_t && service == Service::Safe {
                rec = rec.transitional();
            }
            self.deliveries.push(Delivery {
                client: r,
                pos: self.streams[r].len(),
                sender: c,
                seq,
                service,
                dests: dests.to_vec(),
                sender_member,
            });
            self.streams[r].push(rec);
        }
    }

    fn cut(&mut self, c: usize, inflight: Option<Service>) {
        let k = self.comp[c];
        let Some(sender) =
            (0..self.names.len()).find(|&o| o != c && self.alive[o] && self.comp[o] == k)
        else {
            return;
        };
        let groups: Vec<usize> = (0..GROUPS.len())
            .filter(|&g| self.members[g].contains(&c))
            .collect();
        // The message in flight goes to the groups the cut changes that its
        // sender is in, sent before the views change.
        let dests: Vec<usize> = groups
            .iter()
            .copied()
            .filter(|&g| self.members[g].contains(&sender))
            .collect();
        let inflight = inflight.filter(|_| !dests.is_empty());
        let seq = inflight.map(|service| self.send_record(sender, service, &dests));
        let stay: Vec<Vec<usize>> = groups
            .iter()
            .map(|&g| self.side(g, k).into_iter().filter(|&m| m != c).collect())
            .collect();
        for (&g, s) in groups.iter().zip(&stay) {
            self.push_view(g, s, s, true);
            self.push_view(g, &[c], &[c], true);
        }
        self.comp[c] = self.next_comp;
        self.next_comp += 1;
        if let (Some(service), Some(seq)) = (inflight, seq) {
            self.deliver(sender, seq, service, &dests, true);
        }
        for (&g, s) in groups.iter().zip(&stay) {
            self.push_view(g, s, s, false);
            self.push_view(g, &[c], &[c], false);
        }
    }

    fn merge(&mut self) {
        for g in 0..GROUPS.len() {
            let sides: BTreeSet<usize> = self.members[g].iter().map(|&m| self.comp[m]).collect();
            if sides.len() < 2 {
                continue;
            }
            for k in sides {
                let s = self.side(g, k);
                self.push_view(g, &s, &s, true);
            }
            let all: Vec<usize> = self.members[g].iter().copied().collect();
            self.push_view(g, &all, &all, false);
        }
        for k in self.comp.iter_mut() {
            *k = 0;
        }
    }

    /// Whether dropping `d` must be caught: reliable or stronger, its sender
    /// never ends, and the receiver is the sender (a member at the send) or
    /// was with the sender in a destination group from the send to the end.
    /// `churned[c][g]`: c joined or left g, or was cut off or merged, after
    /// the first send.
    fn loss_detectable(&self, d: &Delivery, ended: &[bool], churned: &[Vec<bool>]) -> bool {
        if d.service < Service::Reliable || ended[d.sender] || ended[d.client] {
            return false;
        }
        if d.client == d.sender {
            return d.sender_member;
        }
        d.dests.iter().any(|&g| {
            self.members[g].contains(&d.client)
                && self.members[g].contains(&d.sender)
                && !churned[d.client][g]
                && !churned[d.sender][g]
        })
    }
}

/// Runs the model; also returns, per client and group, whether it joined or
/// left that group, or any component changed, after the first send
/// (conservative: then losses that involve it are not asserted detectable).
fn run(n: usize, ops: &[Op]) -> (Model, Vec<Vec<bool>>) {
    let mut m = Model::new(n);
    let mut churned = vec![vec![false; GROUPS.len()]; n];
    let mut sent = false;
    for op in ops {
        match *op {
            Op::Join(c, g) | Op::Leave(c, g) if sent => churned[c][g] = true,
            Op::Cut(..) | Op::Merge if sent => {
                churned = vec![vec![true; GROUPS.len()]; n];
            }
            Op::Send(..) | Op::Cut(_, Some(_)) => sent = true,
            _ => {}
        }
        m.apply(op);
    }
    (m, churned)
}

/// Merges the clients' streams in an order drawn from `picks`.
fn interleave(streams: &[Vec<Record>], picks: &[usize]) -> Vec<Record> {
    let mut cursor = vec![0; streams.len()];
    let mut out = Vec::new();
    let mut k = 0;
    loop {
        let open: Vec<usize> = (0..streams.len())
            .filter(|&c| cursor[c] < streams[c].len())
            .collect();
        if open.is_empty() {
            return out;
        }
        let c = open[picks.get(k).copied().unwrap_or(0) % open.len()];
        k += 1;
        out.push(streams[c][cursor[c]].clone());
        cursor[c] += 1;
    }
}

fn history() -> impl Strategy<Value = (usize, Vec<Op>, Vec<usize>)> {
    (2usize..=4).prop_flat_map(|n| {
        (
            Just(n),
            prop::collection::vec(op(n), 0..60),
            prop::collection::vec(0usize..1000, 0..400),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn ideal_histories_are_clean((n, ops, picks) in history()) {
        let (m, _) = run(n, &ops);
        let report = check(interleave(&m.streams, &picks));
        prop_assert!(report.is_clean(), "{report}");
    }

    #[test]
    fn a_duplicate_is_caught((n, ops, picks) in history(), which in 0usize..1000) {
        let (mut m, _) = run(n, &ops);
        prop_assume!(!m.deliveries.is_empty());
        let d = &m.deliveries[which % m.deliveries.len()];
        let rec = m.streams[d.client][d.pos].clone();
        m.streams[d.client].insert(d.pos + 1, rec);
        let report = check(interleave(&m.streams, &picks));
        prop_assert_eq!(report.count(Kind::Duplicate), 1, "{}", report);
    }

    #[test]
    fn a_swap_of_ordered_deliveries_is_caught((n, ops, picks) in history(), which in 0usize..1000) {
        let (mut m, _) = run(n, &ops);
        // Two agreed-or-stronger deliveries at one client that another
        // client also delivered both of, or two fifo-or-stronger ones of one
        // sender.
        let mut pairs = Vec::new();
        for (i, a) in m.deliveries.iter().enumerate() {
            for b in &m.deliveries[i + 1..] {
                if a.client != b.client {
                    continue;
                }
                let agreed = a.service >= Service::Agreed && b.service >= Service::Agreed
                    && m.deliveries.iter().any(|x| x.client != a.client && x.sender == a.sender && x.seq == a.seq
                        && m.deliveries.iter().any(|y| y.client == x.client && y.sender == b.sender && y.seq == b.seq));
                let fifo = a.sender == b.sender && a.service >= Service::Fifo && b.service >= Service::Fifo;
                if agreed || fifo {
                    pairs.push((a.client, a.pos, b.pos));
                }
            }
        }
        prop_assume!(!pairs.is_empty());
        let (c, i, j) = pairs[which % pairs.len()];
        m.streams[c].swap(i, j);
        let report = check(interleave(&m.streams, &picks));
        prop_assert!(!report.is_clean(), "swap at client {} of [{}] and [{}] not caught", c, i, j);
        let kinds = report.kinds();
        prop_assert!(
            kinds.iter().any(|k| matches!(k, Kind::TotalOrder | Kind::Fifo | Kind::Causal)),
            "{}", report
        );
    }

    #[test]
    fn a_dropped_delivery_is_caught((n, ops, picks) in history(), which in 0usize..1000) {
        let (mut m, churned) = run(n, &ops);
        let ended: Vec<bool> = m.alive.iter().map(|a| !a).collect();
        let candidates: Vec<usize> = (0..m.deliveries.len())
            .filter(|&i| m.loss_detectable(&m.deliveries[i], &ended, &churned))
            .collect();
        prop_assume!(!candidates.is_empty());
        let d = &m.deliveries[candidates[which % candidates.len()]];
        let (c, pos) = (d.client, d.pos);
        m.streams[c].remove(pos);
        let report = check(interleave(&m.streams, &picks));
        prop_assert!(
            report.count(Kind::SilentLoss) + report.count(Kind::OwnDelivery) >= 1,
            "{}", report
        );
    }
}

/// A fixed run through a cut with a safe message in flight and a merge:
/// clean, and it does contain transitional views and a delivery marked
/// transitional.
#[test]
fn a_cut_and_a_merge_are_clean() {
    use Op::*;
    let ops = [
        Join(0, 0),
        Join(1, 0),
        Join(2, 0),
        Join(2, 1),
        Join(1, 1),
        Send(0, Service::Agreed, 1),
        Cut(2, Some(Service::Safe)),
        Send(2, Service::Safe, 3),
        Send(1, Service::Fifo, 3),
        Merge,
        Send(2, Service::Causal, 3),
    ];
    let (m, _) = run(3, &ops);
    let all: Vec<Record> = m.streams.concat();
    let t_views = all
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::View {
                    transitional: true,
                    ..
                }
            )
        })
        .count();
    let t_deliveries = all
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::Deliver {
                    transitional: true,
                    ..
                }
            )
        })
        .count();
    assert!(
        t_views >= 6 && t_deliveries == 2,
        "{t_views} {t_deliveries}"
    );
    let report = check(all);
    assert!(report.is_clean(), "{report}");
}
