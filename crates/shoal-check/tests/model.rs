//! Histories from a tiny ideal model: clients join, leave and crash, and
//! every event takes effect everywhere at once in one global sequence (so
//! every delivery is in one total order, views are agreed, nothing is lost).
//! The checker must find nothing in them, in any interleaving of the
//! clients' streams; and one mutation (two deliveries swapped, one dropped,
//! one duplicated) must be caught.

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
}

fn op(clients: usize) -> impl Strategy<Value = Op> {
    let c = 0..clients;
    let g = 0..GROUPS.len();
    prop_oneof![
        3 => (c.clone(), g.clone()).prop_map(|(c, g)| Op::Join(c, g)),
        1 => (c.clone(), g).prop_map(|(c, g)| Op::Leave(c, g)),
        1 => c.clone().prop_map(Op::Crash),
        8 => (c, proptest::sample::select(Service::ALL.to_vec()), 1u8..=3)
            .prop_map(|(c, s, m)| Op::Send(c, s, m)),
    ]
}

/// A delivery that a correct checker must miss if it is dropped: reliable or
/// stronger, its sender never ends, and the receiver is the sender (a member
/// at the send) or was with the sender in a destination group from the send
/// to the end.
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
    members: Vec<BTreeSet<usize>>,
    view_id: Vec<u64>,
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
            alive: vec![true; n],
            seq: vec![0; n],
            deliveries: Vec::new(),
        }
    }

    fn install(&mut self, g: usize, also: Option<usize>) {
        self.view_id[g] += 1;
        let members: Vec<&str> = self.members[g]
            .iter()
            .map(|&m| self.names[m].as_str())
            .collect();
        let mut to: Vec<usize> = self.members[g].iter().copied().collect();
        to.extend(also);
        for c in to {
            let r = Record::view(&self.names[c], GROUPS[g], self.view_id[g], &members);
            self.streams[c].push(r);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Join(c, g) if self.alive[c] && !self.members[g].contains(&c) => {
                self.members[g].insert(c);
                self.install(g, None);
            }
            Op::Leave(c, g) if self.alive[c] && self.members[g].contains(&c) => {
                self.members[g].remove(&c);
                // The leaver is told (Spread's self-leave).
                self.install(g, Some(c));
            }
            Op::Crash(c) if self.alive[c] => {
                self.alive[c] = false;
                self.streams[c].push(Record::ended(&self.names[c], "crashed"));
                for g in 0..GROUPS.len() {
                    if self.members[g].remove(&c) {
                        self.install(g, None);
                    }
                }
            }
            Op::Send(c, service, mask) if self.alive[c] => self.send(c, service, mask),
            _ => {}
        }
    }

    fn send(&mut self, c: usize, service: Service, mask: u8) {
        self.seq[c] += 1;
        let seq = self.seq[c];
        let dests: Vec<usize> = (0..GROUPS.len()).filter(|g| mask & (1 << g) != 0).collect();
        let names: Vec<&str> = dests.iter().map(|&g| GROUPS[g]).collect();
        let sender = self.names[c].clone();
        self.streams[c].push(Record::send(&sender, seq, service, &names));
        let mut receivers = BTreeSet::new();
        for &g in &dests {
            receivers.extend(self.members[g].iter().copied());
        }
        let sender_member = dests.iter().any(|&g| self.members[g].contains(&c));
        for r in receivers {
            let rec = Record::deliver(&self.names[r], &sender, seq, service, &names);
            self.deliveries.push(Delivery {
                client: r,
                pos: self.streams[r].len(),
                sender: c,
                seq,
                service,
                dests: dests.clone(),
                sender_member,
            });
            self.streams[r].push(rec);
        }
    }

    /// Whether dropping this delivery must be caught (see `Delivery`).
    /// `churned[c][g]`: c joined or left g after the first send.
    fn loss_detectable(&self, d: &Delivery, ended: &[bool], churned: &[Vec<bool>]) -> bool {
        if d.service < Service::Reliable || ended[d.sender] || ended[d.client] {
            return false;
        }
        if d.client == d.sender {
            return d.sender_member;
        }
        // Receiver and sender members of a destination group at the end,
        // and neither joined nor left it since the first send: together in
        // it from the send to the end.
        d.dests.iter().any(|&g| {
            self.members[g].contains(&d.client)
                && self.members[g].contains(&d.sender)
                && !churned[d.client][g]
                && !churned[d.sender][g]
        })
    }
}

/// Runs the model; also returns, per client and group, whether it joined or
/// left that group after the first send (conservative: then losses that
/// involve it are not asserted detectable).
fn run(n: usize, ops: &[Op]) -> (Model, Vec<Vec<bool>>) {
    let mut m = Model::new(n);
    let mut churned = vec![vec![false; GROUPS.len()]; n];
    let mut sent = false;
    for op in ops {
        match *op {
            Op::Join(c, g) | Op::Leave(c, g) if sent => churned[c][g] = true,
            Op::Send(..) => sent = true,
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
