//! The checker: buffers each client's records, then judges them all at
//! `finish` in passes that are each linear in the history (times the number
//! of clients for the causal vector clocks, and the members of a view for the
//! safe and silent-loss checks).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::record::{Record, Service};
use crate::report::{Kind, Report};

/// Index of a name (a client's private-group name).
type C = u32;
/// Index of a group name.
type G = u32;
/// Index of a message (sender, seq).
type M = u32;
/// Index of a view (group, view id, transitional).
type V = u32;

/// Judges one history. Records of different clients may be added in any
/// interleaving; the records of one client must be added in the order that
/// client did or saw them. The report does not depend on the interleaving.
#[derive(Debug, Default)]
pub struct Checker {
    streams: BTreeMap<String, Vec<Record>>,
    records: u64,
}

impl Checker {
    /// An empty history.
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Adds one record, after every earlier record of the same client.
    pub fn add(&mut self, record: Record) {
        self.records += 1;
        match self.streams.get_mut(record.client()) {
            Some(s) => s.push(record),
            None => {
                self.streams
                    .insert(record.client().to_string(), vec![record]);
            }
        }
    }

    /// Adds records in order.
    pub fn extend(&mut self, records: impl IntoIterator<Item = Record>) {
        for r in records {
            self.add(r);
        }
    }

    /// Judges the history.
    pub fn finish(self) -> Report {
        let streams: Vec<(&str, &[Record])> = self
            .streams
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let mut a = Analysis::new(streams, self.records);
        a.intern_sends();
        a.build_events();
        a.walk_clients();
        a.check_causal();
        a.check_total_order();
        a.check_safe();
        a.check_loss();
        a.report.summary.unrecorded_members = a.unrecorded_members();
        a.report
    }
}

struct ViewInfo {
    group: G,
    id: u64,
    transitional: bool,
    /// Sorted, no repeats.
    members: Vec<C>,
}

impl ViewInfo {
    fn has(&self, c: C) -> bool {
        self.members.binary_search(&c).is_ok()
    }
}

struct SendInfo {
    /// Position of the `Send` in its sender's stream.
    pos: usize,
    service: Service,
    /// Sorted, no repeats.
    groups: Vec<G>,
}

struct MsgInfo {
    sender: C,
    seq: u64,
    send: Option<SendInfo>,
    /// Clients that delivered it (first deliveries), sorted after the walk.
    receivers: Vec<C>,
}

enum Ev {
    Send {
        msg: M,
    },
    Deliver {
        msg: M,
        /// The first delivery at this client of a message sent with this
        /// service and these groups: the only deliveries ordering and
        /// agreement checks look at.
        ok: bool,
        transitional: bool,
        groups: Vec<G>,
    },
    View {
        view: V,
    },
    Other,
}

struct Analysis<'a> {
    streams: Vec<(&'a str, &'a [Record])>,
    names: Vec<String>,
    name_ix: HashMap<String, C>,
    groups: Vec<String>,
    group_ix: HashMap<String, G>,
    msgs: Vec<MsgInfo>,
    msg_ix: HashMap<(C, u64), M>,
    views: Vec<ViewInfo>,
    /// (group, view id, transitional) -> every member list seen for it: a
    /// list that disagrees with the first is reported and kept as a view of
    /// its own, so that it is judged with the clients that saw it.
    view_ix: HashMap<(G, u64, bool), Vec<V>>,
    evs: Vec<Vec<Ev>>,
    ended: Vec<bool>,
    /// Per recorded client: its `NotDelivered` ranges, sorted and merged.
    not_delivered: Vec<Vec<(u64, u64)>>,
    /// Per (client, group): the views of the group it installed, in order.
    history: HashMap<(C, G), Vec<V>>,
    /// (client, view) -> its first position in `history`.
    view_pos: HashMap<(C, V), usize>,
    /// Consecutive agreed/safe deliveries at one client: (before, after, client).
    edges: Vec<(M, M, C)>,
    /// Safe deliveries: (msg, the view delivered in, receiver, position).
    safe_seen: Vec<(M, V, C, usize)>,
    /// Reliable-or-stronger sends by a member: (msg, the sender's view of a
    /// destination group at the send).
    send_views: Vec<(M, V)>,
    /// (receiver, view, sender) -> `stays_with`.
    stays_memo: HashMap<(C, V, C), bool>,
    report: Report,
}

impl<'a> Analysis<'a> {
    fn new(streams: Vec<(&'a str, &'a [Record])>, records: u64) -> Analysis<'a> {
        let n = streams.len();
        let mut a = Analysis {
            streams,
            names: Vec::new(),
            name_ix: HashMap::new(),
            groups: Vec::new(),
            group_ix: HashMap::new(),
            msgs: Vec::new(),
            msg_ix: HashMap::new(),
            views: Vec::new(),
            view_ix: HashMap::new(),
            evs: Vec::with_capacity(n),
            ended: vec![false; n],
            not_delivered: vec![Vec::new(); n],
            history: HashMap::new(),
            view_pos: HashMap::new(),
            edges: Vec::new(),
            safe_seen: Vec::new(),
            send_views: Vec::new(),
            stays_memo: HashMap::new(),
            report: Report::default(),
        };
        a.report.summary.records = records;
        a.report.summary.clients = n as u64;
        for i in 0..n {
            let name = a.streams[i].0;
            a.name(name);
        }
        a
    }

    fn recorded(&self) -> usize {
        self.streams.len()
    }

    fn name(&mut self, s: &str) -> C {
        if let Some(&c) = self.name_ix.get(s) {
            return c;
        }
        let c = self.names.len() as C;
        self.names.push(s.to_string());
        self.name_ix.insert(s.to_string(), c);
        c
    }

    fn group(&mut self, s: &str) -> G {
        if let Some(&g) = self.group_ix.get(s) {
            return g;
        }
        let g = self.groups.len() as G;
        self.groups.push(s.to_string());
        self.group_ix.insert(s.to_string(), g);
        g
    }

    fn group_set(&mut self, groups: &[String]) -> Vec<G> {
        let mut v: Vec<G> = groups.iter().map(|g| self.group(g)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn msg(&mut self, sender: &str, seq: u64) -> M {
        let s = self.name(sender);
        if let Some(&m) = self.msg_ix.get(&(s, seq)) {
            return m;
        }
        let m = self.msgs.len() as M;
        self.msgs.push(MsgInfo {
            sender: s,
            seq,
            send: None,
            receivers: Vec::new(),
        });
        self.msg_ix.insert((s, seq), m);
        m
    }

    /// "client[position] (at N ns)": where a record is, for examples.
    fn at(&self, c: C, pos: usize) -> String {
        let (name, recs) = self.streams[c as usize];
        match recs.get(pos).and_then(Record::at_ns) {
            Some(ns) => format!("{name}[{pos}] (at {ns} ns)"),
            None => format!("{name}[{pos}]"),
        }
    }

    fn m(&self, m: M) -> String {
        let info = &self.msgs[m as usize];
        let sender = &self.names[info.sender as usize];
        match &info.send {
            Some(s) => format!("{sender}/{} ({})", info.seq, s.service.name()),
            None => format!("{sender}/{}", info.seq),
        }
    }

    fn v(&self, v: V) -> String {
        let view = &self.views[v as usize];
        let t = if view.transitional {
            " transitional"
        } else {
            ""
        };
        format!(
            "{}#{}{t} {:?}",
            self.groups[view.group as usize],
            view.id,
            self.names_of(&view.members)
        )
    }

    fn names_of(&self, cs: &[C]) -> Vec<&str> {
        cs.iter()
            .map(|&c| self.names[c as usize].as_str())
            .collect()
    }

    fn msgs_str(&self, ms: &[M]) -> String {
        let shown: Vec<String> = ms.iter().take(5).map(|&m| self.m(m)).collect();
        if ms.len() > 5 {
            format!("[{}, ... {} in all]", shown.join(", "), ms.len())
        } else {
            format!("[{}]", shown.join(", "))
        }
    }

    fn sent_service(&self, m: M) -> Option<Service> {
        self.msgs[m as usize].send.as_ref().map(|s| s.service)
    }

    fn delivered(&self, c: C, m: M) -> bool {
        self.msgs[m as usize].receivers.binary_search(&c).is_ok()
    }

    fn covered(&self, m: M) -> bool {
        let info = &self.msgs[m as usize];
        let Some(ranges) = self.not_delivered.get(info.sender as usize) else {
            return false;
        };
        let i = ranges.partition_point(|&(first, _)| first <= info.seq);
        i > 0 && ranges[i - 1].1 >= info.seq
    }

    /// Pass 0: every `Send`, so that deliveries can be matched whatever the
    /// order of clients.
    fn intern_sends(&mut self) {
        for c in 0..self.recorded() {
            let (name, recs) = self.streams[c];
            let mut last_seq = 0;
            for (pos, rec) in recs.iter().enumerate() {
                let Record::Send {
                    msg,
                    service,
                    groups,
                    ..
                } = rec
                else {
                    continue;
                };
                if msg.sender != name {
                    let at = self.at(c as C, pos);
                    self.report.flag(Kind::Malformed, || {
                        format!("{at}: Send of {msg} by another client")
                    });
                    continue;
                }
                if msg.seq == 0 || msg.seq <= last_seq {
                    let at = self.at(c as C, pos);
                    self.report.flag(Kind::Malformed, || {
                        format!("{at}: Send of {msg} after seq {last_seq} (seqs start at 1 and increase)")
                    });
                    continue;
                }
                last_seq = msg.seq;
                let m = self.msg(name, msg.seq);
                let groups = self.group_set(groups);
                self.msgs[m as usize].send = Some(SendInfo {
                    pos,
                    service: *service,
                    groups,
                });
                self.report.summary.sends += 1;
            }
        }
    }

    /// Pass 1: records to events; not-sent deliveries, view lists that
    /// disagree, malformed records.
    fn build_events(&mut self) {
        for c in 0..self.recorded() {
            let (_, recs) = self.streams[c];
            let mut evs = Vec::with_capacity(recs.len());
            let mut end_pos = None;
            for (pos, rec) in recs.iter().enumerate() {
                if let Some(e) = end_pos {
                    let at = self.at(c as C, pos);
                    self.report.flag(Kind::Malformed, || {
                        format!("{at}: a record after the client ended at [{e}]: {rec:?}")
                    });
                }
                let ev = self.event(c as C, pos, rec);
                if let Record::Ended { .. } = rec {
                    end_pos.get_or_insert(pos);
                    self.ended[c] = true;
                }
                evs.push(ev);
            }
            let nd = &mut self.not_delivered[c];
            nd.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(nd.len());
            for &(f, l) in nd.iter() {
                match merged.last_mut() {
                    Some(last) if f <= last.1.saturating_add(1) => last.1 = last.1.max(l),
                    _ => merged.push((f, l)),
                }
            }
            *nd = merged;
            self.evs.push(evs);
        }
        self.report.summary.ended = self.ended.iter().filter(|&&e| e).count() as u64;
    }

    fn event(&mut self, c: C, pos: usize, rec: &Record) -> Ev {
        match rec {
            Record::Send { msg, .. } => {
                let name = self.streams[c as usize].0;
                match self.msg_ix.get(&(c, msg.seq)) {
                    Some(&m)
                        if msg.sender == name
                            && self.msgs[m as usize].send.as_ref().map(|s| s.pos) == Some(pos) =>
                    {
                        Ev::Send { msg: m }
                    }
                    _ => Ev::Other,
                }
            }
            Record::Deliver { .. } => self.deliver_event(c, pos, rec),
            Record::View { .. } => self.view_event(c, pos, rec),
            Record::NotDelivered { first, last, .. } => {
                self.report.summary.not_delivered += 1;
                if *first == 0 || first > last {
                    let at = self.at(c, pos);
                    self.report.flag(Kind::Malformed, || {
                        format!("{at}: NotDelivered of the range {first}..={last}")
                    });
                } else {
                    self.not_delivered[c as usize].push((*first, *last));
                }
                Ev::Other
            }
            Record::Ended { .. } => Ev::Other,
        }
    }

    /// A delivery; `not-sent` unless it matches its `Send`.
    fn deliver_event(&mut self, c: C, pos: usize, rec: &Record) -> Ev {
        let Record::Deliver {
            msg,
            service,
            groups: rec_groups,
            transitional,
            ..
        } = rec
        else {
            unreachable!("called on deliveries")
        };
        self.report.summary.deliveries += 1;
        let m = self.msg(&msg.sender, msg.seq);
        let groups = self.group_set(rec_groups);
        let ok = match &self.msgs[m as usize].send {
            None => {
                let at = self.at(c, pos);
                self.report.flag(Kind::NotSent, || {
                    format!("{at}: delivered {msg}, which was never sent")
                });
                false
            }
            Some(s) if s.service != *service || s.groups != groups => {
                let at = self.at(c, pos);
                let sent_to: Vec<&str> = s
                    .groups
                    .iter()
                    .map(|&g| self.groups[g as usize].as_str())
                    .collect();
                let sent = format!("{} to {sent_to:?}", s.service.name());
                let got = format!("{} to {rec_groups:?}", service.name());
                self.report.flag(Kind::NotSent, || {
                    format!("{at}: delivered {msg} as {got}, but it was sent {sent}")
                });
                false
            }
            Some(_) => true,
        };
        Ev::Deliver {
            msg: m,
            ok,
            transitional: *transitional,
            groups,
        }
    }

    /// A view; `view-membership` when its id was seen with other members.
    fn view_event(&mut self, c: C, pos: usize, rec: &Record) -> Ev {
        let Record::View {
            group,
            view_id,
            members,
            transitional,
            ..
        } = rec
        else {
            unreachable!("called on views")
        };
        self.report.summary.views += 1;
        let g = self.group(group);
        let mut ms: Vec<C> = members.iter().map(|s| self.name(s)).collect();
        ms.sort_unstable();
        ms.dedup();
        let key = (g, *view_id, *transitional);
        let known = self.view_ix.get(&key).cloned().unwrap_or_default();
        if let Some(&first) = known.first() {
            if self.views[first as usize].members != ms {
                let at = self.at(c, pos);
                let first = self.v(first);
                let here = format!("{:?}", self.names_of(&ms));
                self.report.flag(Kind::ViewMembership, || {
                    format!("{at}: view {first} has members {here} here")
                });
            }
        }
        let found = known
            .iter()
            .find(|&&v| self.views[v as usize].members == ms);
        let v = match found {
            Some(&v) => v,
            None => {
                let v = self.views.len() as V;
                self.views.push(ViewInfo {
                    group: g,
                    id: *view_id,
                    transitional: *transitional,
                    members: ms,
                });
                self.view_ix.entry(key).or_default().push(v);
                v
            }
        };
        Ev::View { view: v }
    }

    /// Pass 2: each client's stream alone: duplicates, membership at
    /// delivery, FIFO, view order, transitional rules, and virtual synchrony
    /// (sets delivered between consecutive views compared across clients);
    /// gathers what the cross-client passes need.
    fn walk_clients(&mut self) {
        // (view, next view) -> (first client, its sorted set between them).
        let mut segments: HashMap<(V, V), (C, Vec<M>)> = HashMap::new();
        for c in 0..self.recorded() {
            let evs = std::mem::take(&mut self.evs[c]);
            let mut w = Walk::default();
            for (pos, ev) in evs.iter().enumerate() {
                match ev {
                    Ev::Send { msg } => self.on_send(c as C, *msg, &w),
                    Ev::Deliver {
                        msg,
                        ok,
                        transitional,
                        groups,
                    } => {
                        if !w.delivered.insert(*msg) {
                            let at = self.at(c as C, pos);
                            let m = self.m(*msg);
                            self.report
                                .flag(Kind::Duplicate, || format!("{at}: delivered {m} again"));
                            continue;
                        }
                        self.msgs[*msg as usize].receivers.push(c as C);
                        self.on_deliver(c as C, pos, *msg, *ok, *transitional, groups, &mut w);
                    }
                    Ev::View { view } => {
                        self.on_view(c as C, pos, *view, &mut w, &mut segments);
                    }
                    Ev::Other => {}
                }
            }
            self.evs[c] = evs;
            // Mark later deliveries of the same message as not ok for the
            // cross-client passes.
            let mut seen = HashSet::new();
            for ev in &mut self.evs[c] {
                if let Ev::Deliver { msg, ok, .. } = ev {
                    if !seen.insert(*msg) {
                        *ok = false;
                    }
                }
            }
        }
        for info in &mut self.msgs {
            info.receivers.sort_unstable();
        }
    }

    fn on_send(&mut self, c: C, m: M, w: &Walk) {
        let send = self.msgs[m as usize]
            .send
            .as_ref()
            .expect("Ev::Send is sent");
        if send.service < Service::Reliable {
            return;
        }
        for g in &send.groups {
            if let Some(&v) = w.current.get(g) {
                if self.views[v as usize].has(c) {
                    self.send_views.push((m, v));
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_deliver(
        &mut self,
        c: C,
        pos: usize,
        m: M,
        ok: bool,
        transitional: bool,
        groups: &[G],
        w: &mut Walk,
    ) {
        let mut member_of: Vec<(G, V)> = Vec::new();
        let mut in_transitional = false;
        for g in groups {
            if let Some(&v) = w.current.get(g) {
                let view = &self.views[v as usize];
                if view.has(c) {
                    member_of.push((*g, v));
                    in_transitional |= view.transitional;
                }
            }
        }
        // A client is always a member of its own private group.
        let own = self.group_ix.get(self.streams[c as usize].0);
        let to_me = own.is_some_and(|g| groups.contains(g));
        if member_of.is_empty() && !to_me {
            let at = self.at(c, pos);
            let ms = self.m(m);
            self.report.flag(Kind::NotMember, || {
                format!("{at}: delivered {ms} while a member of none of its groups")
            });
        }
        if transitional && !in_transitional {
            let at = self.at(c, pos);
            let ms = self.m(m);
            self.report.flag(Kind::Transitional, || {
                format!("{at}: delivered {ms} marked transitional outside a transitional view")
            });
        }
        if !ok {
            return;
        }
        let service = self.sent_service(m).expect("ok deliveries were sent");
        let (sender, seq) = (self.msgs[m as usize].sender, self.msgs[m as usize].seq);
        if service >= Service::Fifo {
            match w.fifo.get(&sender) {
                Some(&(last, last_m, last_pos)) if last > seq => {
                    let at = self.at(c, pos);
                    let (ms, lm) = (self.m(m), self.m(last_m));
                    self.report.flag(Kind::Fifo, || {
                        format!("{at}: delivered {ms} after {lm} (delivered at [{last_pos}]), against their send order")
                    });
                }
                _ => {
                    w.fifo.insert(sender, (seq, m, pos));
                }
            }
        }
        if service >= Service::Agreed {
            if let Some(prev) = w.prev_agreed.replace(m) {
                self.edges.push((prev, m, c));
            }
        }
        if service >= Service::Reliable {
            for &(g, _) in &member_of {
                w.segment.entry(g).or_default().push(m);
            }
        }
        if service == Service::Safe {
            // Safe binds the members of the configuration it is delivered
            // in: the regular view, or (EVS) the transitional one. A
            // delivery marked transitional in a regular view was reported
            // above and binds nobody.
            for &(_, v) in &member_of {
                if self.views[v as usize].transitional || !transitional {
                    self.safe_seen.push((m, v, c, pos));
                }
            }
        }
    }

    fn on_view(
        &mut self,
        c: C,
        pos: usize,
        v: V,
        w: &mut Walk,
        segments: &mut HashMap<(V, V), (C, Vec<M>)>,
    ) {
        let (g, id, transitional) = {
            let view = &self.views[v as usize];
            (view.group, view.id, view.transitional)
        };
        if let Some(&(last_id, last_t)) = w.last_key.get(&g) {
            if (id, transitional) <= (last_id, last_t) {
                let at = self.at(c, pos);
                let vs = self.v(v);
                self.report.flag(Kind::ViewOrder, || {
                    format!(
                        "{at}: installed {vs} after view id {last_id}{}",
                        if last_t { " transitional" } else { "" }
                    )
                });
            }
        }
        w.last_key.insert(g, (id, transitional));
        let prev = w.current.get(&g).copied();
        self.check_transitional(c, pos, prev, v);
        if let Some(p) = prev {
            if self.views[p as usize].has(c) {
                let mut set = w.segment.remove(&g).unwrap_or_default();
                set.sort_unstable();
                match segments.get(&(p, v)) {
                    None => {
                        segments.insert((p, v), (c, set));
                    }
                    Some((first, first_set)) if *first_set != set => {
                        let only_first: Vec<M> = first_set
                            .iter()
                            .filter(|m| set.binary_search(m).is_err())
                            .copied()
                            .collect();
                        let only_here: Vec<M> = set
                            .iter()
                            .filter(|m| first_set.binary_search(m).is_err())
                            .copied()
                            .collect();
                        let at = self.at(c, pos);
                        let (pv, vv) = (self.v(p), self.v(v));
                        let first_name = &self.names[*first as usize];
                        let (a, b) = (self.msgs_str(&only_first), self.msgs_str(&only_here));
                        self.report.flag(Kind::VirtualSynchrony, || {
                            format!(
                                "{at}: between {pv} and {vv}, {first_name} delivered {a} that this client did not, and this client {b} that {first_name} did not"
                            )
                        });
                    }
                    Some(_) => {}
                }
            }
        }
        w.segment.remove(&g);
        w.current.insert(g, v);
        let hist = self.history.entry((c, g)).or_default();
        self.view_pos.entry((c, v)).or_insert(hist.len());
        hist.push(v);
    }

    fn check_transitional(&mut self, c: C, pos: usize, prev: Option<V>, v: V) {
        let view = &self.views[v as usize];
        let subset = |a: &[C], b: &ViewInfo| a.iter().all(|&x| b.has(x));
        let problem = match prev.map(|p| &self.views[p as usize]) {
            None if view.transitional => Some("a transitional view with no regular view before it"),
            Some(p) if view.transitional && p.transitional => {
                Some("a transitional view right after another")
            }
            Some(p) if view.transitional && !subset(&view.members, p) => {
                Some("a transitional view with members not in the regular view before it")
            }
            // A view without the client itself says it left the group (it
            // moves into no next configuration), which it may do right
            // after a transitional view.
            Some(p)
                if !view.transitional
                    && p.transitional
                    && view.has(c)
                    && !subset(&p.members, view) =>
            {
                Some("a regular view lacking members of the transitional view before it")
            }
            _ => None,
        };
        if let Some(problem) = problem {
            let at = self.at(c, pos);
            let vs = self.v(v);
            let ps = prev.map(|p| self.v(p)).unwrap_or_default();
            self.report.flag(Kind::Transitional, || {
                format!("{at}: {problem}: {vs} after {ps:?}")
            });
        }
    }

    /// Pass 3: causal order by vector clocks over causal-or-stronger
    /// messages. A client's clock advances through its stream; a delivery
    /// waits until the message's send has been reached in its sender's
    /// stream, so streams are walked as a worklist.
    fn check_causal(&mut self) {
        let n = self.names.len();
        let nrec = self.recorded();
        let mut stamp: Vec<Option<Box<[u32]>>> = vec![None; self.msgs.len()];
        let mut cs = CausalState {
            clock: vec![vec![0; n]; nrec],
            seen: vec![vec![0; n]; nrec],
            seen_by: vec![vec![0; n]; nrec],
            cursor: vec![0; nrec],
            blocked_on: vec![None; nrec],
            waiting: HashMap::new(),
        };
        let mut queue: VecDeque<usize> = (0..nrec).collect();
        loop {
            while let Some(c) = queue.pop_front() {
                self.causal_run(c, &mut cs, &mut stamp, &mut queue);
            }
            // Every client done, or a set waiting on each other: a delivery
            // that causally precedes its own send. Skip the first one.
            let Some(c) = (0..nrec).find(|&c| cs.blocked_on[c].is_some()) else {
                break;
            };
            let m = cs.blocked_on[c].take().expect("found blocked");
            let at = self.at(c as C, cs.cursor[c]);
            let ms = self.m(m);
            self.report.flag(Kind::Causal, || {
                format!("{at}: delivered {ms}, whose send causally follows this delivery (a cycle)")
            });
            cs.cursor[c] += 1;
            queue.push_back(c);
        }
    }

    fn causal_run(
        &mut self,
        c: usize,
        cs: &mut CausalState,
        stamp: &mut [Option<Box<[u32]>>],
        queue: &mut VecDeque<usize>,
    ) {
        if cs.blocked_on[c].is_some() {
            // Woken: the message it waits on may now be stamped.
            let m = cs.blocked_on[c].expect("checked");
            if stamp[m as usize].is_none() {
                return;
            }
            cs.blocked_on[c] = None;
        }
        while cs.cursor[c] < self.evs[c].len() {
            let pos = cs.cursor[c];
            match &self.evs[c][pos] {
                Ev::Send { msg } if self.sent_service(*msg) >= Some(Service::Causal) => {
                    let clock = &mut cs.clock[c];
                    clock[c] += 1;
                    stamp[*msg as usize] = Some(clock.clone().into_boxed_slice());
                    if let Some(ws) = cs.waiting.remove(msg) {
                        queue.extend(ws);
                    }
                }
                Ev::Deliver { msg, ok: true, .. }
                    if self.sent_service(*msg) >= Some(Service::Causal) =>
                {
                    let Some(vc) = stamp[*msg as usize].as_deref() else {
                        cs.blocked_on[c] = Some(*msg);
                        cs.waiting.entry(*msg).or_default().push(c);
                        return;
                    };
                    let s = self.msgs[*msg as usize].sender as usize;
                    if cs.seen[c][s] >= vc[s] {
                        let after = cs.seen_by[c][s];
                        let at = self.at(c as C, pos);
                        let (ms, am) = (self.m(*msg), self.m(after));
                        self.report.flag(Kind::Causal, || {
                            format!("{at}: delivered {ms} after {am}, which causally follows it")
                        });
                    }
                    for (i, &x) in vc.iter().enumerate() {
                        if x > cs.seen[c][i] {
                            cs.seen[c][i] = x;
                            cs.seen_by[c][i] = *msg;
                        }
                        if x > cs.clock[c][i] {
                            cs.clock[c][i] = x;
                        }
                    }
                }
                _ => {}
            }
            cs.cursor[c] += 1;
        }
    }

    /// Pass 4: one total order of agreed and safe messages: the union of
    /// each receiver's delivery sequence must be acyclic. Each strongly
    /// connected component of more than one message is one violation.
    fn check_total_order(&mut self) {
        let nm = self.msgs.len();
        let mut start = vec![0usize; nm + 1];
        for &(a, _, _) in &self.edges {
            start[a as usize + 1] += 1;
        }
        for i in 0..nm {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut adj = vec![(0 as M, 0 as C); self.edges.len()];
        for &(a, b, c) in &self.edges {
            adj[fill[a as usize]] = (b, c);
            fill[a as usize] += 1;
        }
        let comps = tarjan(nm, &start, &adj);
        for comp in comps {
            let e = if self.report.count(Kind::TotalOrder) == 0 {
                self.cycle_example(&comp, &start, &adj)
            } else {
                String::new()
            };
            let n = comp.len();
            self.report.flag(Kind::TotalOrder, || {
                format!("{n} messages in no one order: {e}")
            });
        }
    }

    /// A shortest cycle through the component's first message, with the
    /// client that gives each step.
    fn cycle_example(&self, comp: &[M], start: &[usize], adj: &[(M, C)]) -> String {
        let inside: HashSet<M> = comp.iter().copied().collect();
        let root = comp[0];
        let mut parent: HashMap<M, (M, C)> = HashMap::new();
        let mut queue = VecDeque::from([root]);
        let mut last = None;
        'bfs: while let Some(x) = queue.pop_front() {
            for &(y, c) in &adj[start[x as usize]..start[x as usize + 1]] {
                if !inside.contains(&y) {
                    continue;
                }
                if y == root {
                    last = Some((x, c));
                    break 'bfs;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(y) {
                    e.insert((x, c));
                    queue.push_back(y);
                }
            }
        }
        let Some((mut x, c)) = last else {
            return "(no cycle found)".to_string();
        };
        let mut steps = vec![(x, c, root)];
        while x != root {
            let (p, pc) = parent[&x];
            steps.push((p, pc, x));
            x = p;
        }
        steps.reverse();
        steps
            .iter()
            .map(|&(a, c, b)| {
                format!(
                    "{} delivered {} right before {}",
                    self.names[c as usize],
                    self.m(a),
                    self.m(b)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Pass 5: a safe message delivered in a view (regular, or transitional
    /// under EVS) reaches every member of that view that installs the
    /// group's next view or never ends.
    fn check_safe(&mut self) {
        let mut done: HashSet<(M, V)> = HashSet::new();
        let safe_seen = std::mem::take(&mut self.safe_seen);
        for &(m, v, c, pos) in &safe_seen {
            if !done.insert((m, v)) {
                continue;
            }
            let group = self.views[v as usize].group;
            for i in 0..self.views[v as usize].members.len() {
                let p = self.views[v as usize].members[i];
                if p as usize >= self.recorded() || self.delivered(p, m) {
                    continue;
                }
                let moves_on = self.view_pos.get(&(p, v)).is_some_and(|&i| {
                    self.history
                        .get(&(p, group))
                        .is_some_and(|h| i + 1 < h.len())
                });
                if moves_on || !self.ended[p as usize] {
                    let at = self.at(c, pos);
                    let (ms, vs) = (self.m(m), self.v(v));
                    let pn = &self.names[p as usize];
                    let why = if moves_on {
                        "installs the next view"
                    } else {
                        "never ends"
                    };
                    self.report.flag(Kind::Safe, || {
                        format!(
                            "{at}: delivered {ms} in {vs}; member {pn} {why} but never delivers it"
                        )
                    });
                }
            }
        }
    }

    /// Pass 6: own delivery and no silent loss, for reliable-or-stronger
    /// messages whose sender never ended and was not told `NotDelivered`.
    fn check_loss(&mut self) {
        let send_views = std::mem::take(&mut self.send_views);
        let mut i = 0;
        while i < send_views.len() {
            let m = send_views[i].0;
            let mut j = i;
            while j < send_views.len() && send_views[j].0 == m {
                j += 1;
            }
            let sender = self.msgs[m as usize].sender;
            if !self.ended[sender as usize] && !self.covered(m) {
                self.check_loss_of(m, &send_views[i..j]);
            }
            i = j;
        }
    }

    fn check_loss_of(&mut self, m: M, views: &[(M, V)]) {
        let sender = self.msgs[m as usize].sender;
        if !self.delivered(sender, m) {
            let (sn, ms) = (&self.names[sender as usize], self.m(m));
            let vs = self.v(views[0].1);
            self.report.flag(Kind::OwnDelivery, || {
                format!("{sn} sent {ms} as a member of {vs}, never ended, and never delivered it")
            });
        }
        let mut reported: Vec<C> = Vec::new();
        for &(_, v) in views {
            for i in 0..self.views[v as usize].members.len() {
                let r = self.views[v as usize].members[i];
                if r == sender
                    || r as usize >= self.recorded()
                    || self.ended[r as usize]
                    || self.delivered(r, m)
                    || reported.contains(&r)
                    || !self.stays_with(r, v, sender)
                {
                    continue;
                }
                reported.push(r);
                let (sn, rn, ms, vs) = (
                    &self.names[sender as usize],
                    &self.names[r as usize],
                    self.m(m),
                    self.v(v),
                );
                self.report.flag(Kind::SilentLoss, || {
                    format!("{sn} sent {ms} in {vs} and never ended; {rn} installed that view and every view of the group after it lists both, and it never delivered it")
                });
            }
        }
    }

    /// `r` installed `v`, and every view of its group that `r` installs
    /// from `v` on lists both `r` and `sender`: they were never apart.
    fn stays_with(&mut self, r: C, v: V, sender: C) -> bool {
        if let Some(&b) = self.stays_memo.get(&(r, v, sender)) {
            return b;
        }
        let group = self.views[v as usize].group;
        let b = match (self.view_pos.get(&(r, v)), self.history.get(&(r, group))) {
            (Some(&at), Some(hist)) => hist[at..].iter().all(|&w| {
                let w = &self.views[w as usize];
                w.has(r) && w.has(sender)
            }),
            _ => false,
        };
        self.stays_memo.insert((r, v, sender), b);
        b
    }

    fn unrecorded_members(&self) -> u64 {
        let mut names: Vec<C> = self
            .views
            .iter()
            .flat_map(|v| v.members.iter().copied())
            .filter(|&c| c as usize >= self.recorded())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.len() as u64
    }
}

/// One client's walk through its own stream.
#[derive(Default)]
struct Walk {
    current: HashMap<G, V>,
    last_key: HashMap<G, (u64, bool)>,
    segment: HashMap<G, Vec<M>>,
    delivered: HashSet<M>,
    /// sender -> (highest seq delivered, that message, its position).
    fifo: HashMap<C, (u64, M, usize)>,
    prev_agreed: Option<M>,
}

struct CausalState {
    /// Per recorded client: its vector clock.
    clock: Vec<Vec<u32>>,
    /// Per recorded client: the componentwise maximum of the stamps of the
    /// messages it delivered, and which message gave each component.
    seen: Vec<Vec<u32>>,
    seen_by: Vec<Vec<M>>,
    cursor: Vec<usize>,
    blocked_on: Vec<Option<M>>,
    waiting: HashMap<M, Vec<usize>>,
}

/// Strongly connected components of more than one node (Tarjan, iterative),
/// in order of discovery from the lowest node index.
fn tarjan(n: usize, start: &[usize], adj: &[(M, C)]) -> Vec<Vec<M>> {
    const UNSEEN: u32 = u32::MAX;
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<M> = Vec::new();
    let mut next = 0u32;
    let mut out = Vec::new();
    for root in 0..n {
        if index[root] != UNSEEN || start[root] == start[root + 1] {
            continue;
        }
        let mut call: Vec<(usize, usize)> = vec![(root, start[root])];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root as M);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut e)) = call.last_mut() {
            if *e < start[v + 1] {
                let w = adj[*e].0 as usize;
                *e += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w as M);
                    on_stack[w] = true;
                    call.push((w, start[w]));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            call.pop();
            if let Some(&(u, _)) = call.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = stack.pop().expect("v is on the stack");
                    on_stack[w as usize] = false;
                    comp.push(w);
                    if w as usize == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort_unstable();
                    out.push(comp);
                }
            }
        }
    }
    out
}
