//! A daemon joining (or restarting into) a running site: the site's state
//! handed over through its ring's total order. `docs/spread.md`, "A
//! daemon joining a running site", has the design; in short:
//!
//! Every daemon of a site holds the same *site state* (the site stream,
//! its Lamport clock, the groups, the elements kept for resending, the
//! site's members and gateway), because each applies the ring's delivery
//! order the same way. A daemon that starts holds none. Each time its
//! ring installs a new configuration (P0, the same point of the order at
//! every member), every member freezes its state, keeps the ring's
//! deliveries aside, and multicasts a *hello*: the state it holds, named
//! by a *lineage* (a hash of the rings it went through), or none. Once
//! every member's hello is delivered (a second point of the order, the
//! same everywhere) the round is decided:
//! - no member holds a state: the site is founded, every member starts
//!   from the empty state;
//! - otherwise the first hello delivered that holds one names the
//!   *source*: members of its lineage keep their state, the source
//!   multicasts its state as it stood at P0 (in parts, ring messages),
//!   and every other member takes that state when its last part is
//!   delivered (a member that held another lineage, a site that split and
//!   merged, first drops its clients: their history is not the source's).
//!
//! A member then applies the round's decision (departed daemons' clients
//! leave their groups; the gateway stays while it is in the ring and
//! holds the source's state, else the lowest daemon that does takes over)
//! and every delivery it kept aside since P0, in order, and goes live. So
//! a joining daemon ends with exactly the state the others hold, and
//! delivers from the new ring on: its clients join after it is in, and
//! are given every message ordered after their join, as Spread's daemons
//! give theirs from the configuration they join.
//!
//! A ring that ends before its round is decided: a member holding a
//! state applies what it kept aside (the members that go on together
//! delivered the same messages, Extended Virtual Synchrony) under a new
//! lineage; a member without one drops it. Clients' requests wait while a
//! round is open.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use super::codec::{Reader, Writer};
use super::{
    ring, Body, Conf, Element, Event, Malformed, Pending, RingMsg, SiteDaemon, SiteId, Stream,
};
use crate::ring::RingId;
use crate::NodeId;

type R<T> = Result<T, Malformed>;

/// Whether a daemon holds its site's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// None yet: started, or gave its own up for the source's.
    Fresh,
    /// It does; `lineage` names the history it went through.
    Synced { lineage: u64 },
}

impl Standing {
    pub fn lineage(self) -> Option<u64> {
        match self {
            Standing::Fresh => None,
            Standing::Synced { lineage } => Some(lineage),
        }
    }
}

/// One ring's state round, open from the ring's installation until this
/// member is live in it.
#[derive(Debug)]
pub(super) struct Round {
    ring: RingId,
    members: Vec<NodeId>,
    /// Hellos delivered, in order: (member, lineage).
    hellos: Vec<(NodeId, Option<u64>)>,
    /// Decided: the source and its lineage (`None`: founded).
    source: Option<Option<(NodeId, u64)>>,
    /// Deliveries kept aside since the ring's installation.
    kept: Vec<(NodeId, Bytes)>,
    /// Parts of the source's state delivered so far.
    parts: Vec<Bytes>,
}

/// A 64-bit mix (SplitMix64's finaliser): lineages are hashes of rings.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn mix_ring(a: u64, ring: RingId) -> u64 {
    mix(mix(a, ring.seq), u64::from(ring.rep))
}

impl SiteDaemon {
    /// The ring installed a configuration: close the previous round,
    /// open one for it and say hello.
    pub(super) fn start_round(&mut self, ring: RingId, members: Vec<NodeId>) {
        self.end_round(ring);
        let hello = RingMsg::Hello {
            ring,
            lineage: self.standing.lineage(),
        };
        self.round = Some(Round {
            ring,
            members,
            hellos: Vec::new(),
            source: None,
            kept: Vec::new(),
            parts: Vec::new(),
        });
        // What the last round had not sent yet was for its ring only.
        self.round_out.clear();
        self.send_round_msg(hello);
    }

    /// A round's message (a hello, a snapshot's part), in order, whenever
    /// the ring's queue has room: one refused and lost would leave the
    /// round undecided, or a starting daemon without its state, until the
    /// next ring (found with large messages filling the queue while a
    /// restarted gateway joined its ring).
    fn send_round_msg(&mut self, msg: RingMsg) {
        self.round_out.push_back(msg);
        self.flush_round_out();
    }

    /// Sends the round's waiting messages the ring's queue takes.
    pub(super) fn flush_round_out(&mut self) {
        while let Some(msg) = self.round_out.front() {
            if self.ring.queued() >= self.config.ring.send_queue_max {
                return;
            }
            let msg = msg.clone();
            if !self.ring_send(msg, ring::Service::Agreed) {
                return;
            }
            self.round_out.pop_front();
        }
    }

    /// A round still open when the next ring is installed.
    fn end_round(&mut self, next: RingId) {
        let Some(round) = self.round.take() else {
            return;
        };
        match self.standing {
            Standing::Synced { lineage } => {
                // Undecided: the members going on together into `next`
                // delivered the same messages; apply them under a lineage
                // of their own.
                self.standing = Standing::Synced {
                    lineage: mix_ring(mix_ring(lineage, round.ring), next),
                };
                self.apply_kept(round.kept);
            }
            Standing::Fresh => self.stats.rounds_abandoned += 1,
        }
    }

    /// A ring delivery while a round is open.
    pub(super) fn round_delivery(&mut self, sender: NodeId, payload: Bytes) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        match RingMsg::decode(&payload) {
            Ok(RingMsg::Hello { ring, lineage }) => {
                let fresh = ring == round.ring
                    && round.source.is_none()
                    && round.members.contains(&sender)
                    && !round.hellos.iter().any(|(n, _)| *n == sender);
                if fresh {
                    round.hellos.push((sender, lineage));
                    if round.hellos.len() == round.members.len() {
                        self.decide();
                    }
                }
            }
            Ok(RingMsg::Snapshot {
                ring,
                index,
                count,
                bytes,
            }) => {
                let from_source = matches!(round.source, Some(Some((s, _))) if s == sender);
                if ring == round.ring
                    && from_source
                    && self.standing == Standing::Fresh
                    && index as usize == round.parts.len()
                {
                    round.parts.push(bytes);
                    if round.parts.len() == count as usize {
                        self.adopt();
                    }
                }
            }
            _ => round.kept.push((sender, payload)),
        }
    }

    /// Every member's hello is in: found the site, keep this state, or
    /// wait for the source's.
    fn decide(&mut self) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        let source = round.hellos.iter().find_map(|(n, l)| l.map(|l| (*n, l)));
        round.source = Some(source);
        let ring = round.ring;
        match source {
            None => {
                self.stats.foundings += 1;
                self.standing = Standing::Synced {
                    lineage: mix_ring(0, ring),
                };
                self.finish_round();
            }
            Some((from, lineage)) => {
                let needed = round.hellos.iter().any(|(_, l)| *l != Some(lineage));
                if from == self.me && needed {
                    self.send_snapshot(ring);
                }
                if self.standing == (Standing::Synced { lineage }) {
                    self.standing = Standing::Synced {
                        lineage: mix_ring(lineage, ring),
                    };
                    self.finish_round();
                } else if self.standing != Standing::Fresh {
                    self.give_up_state();
                }
            }
        }
    }

    /// The source's state, as it stood at the ring's installation, in
    /// parts that fit a ring message.
    fn send_snapshot(&mut self, ring: RingId) {
        let bytes = Bytes::from(self.encode_state());
        // Each part goes whole in one ring message (a round does not put
        // `RingMsg::Part`s together).
        let part = super::ring_single_max(&self.config)
            .saturating_sub(32)
            .max(64);
        let count = bytes.len().div_ceil(part).max(1) as u32;
        self.stats.snapshots_sent += 1;
        for index in 0..count {
            let from = index as usize * part;
            let to = (from + part).min(bytes.len());
            let msg = RingMsg::Snapshot {
                ring,
                index,
                count,
                bytes: bytes.slice(from..to),
            };
            self.send_round_msg(msg);
        }
    }

    /// The last part of the source's state is in: take it, then go on as
    /// the source's members did.
    fn adopt(&mut self) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        let Some(Some((_, lineage))) = round.source else {
            return;
        };
        let ring = round.ring;
        let bytes: Vec<u8> = round.parts.concat();
        if self.decode_state(&bytes).is_err() {
            // A source's state always decodes; this one is dropped and
            // the daemon stays out until the next ring.
            self.stats.bad_datagrams += 1;
            return;
        }
        self.stats.snapshots_taken += 1;
        self.standing = Standing::Synced {
            lineage: mix_ring(lineage, ring),
        };
        self.finish_round();
    }

    /// A daemon that held another lineage than the source's: its clients'
    /// history is not the site's any more; they are dropped.
    fn give_up_state(&mut self) {
        self.stats.states_given_up += 1;
        for client in std::mem::take(&mut self.local) {
            self.events.push_back(Event::Dropped { client });
        }
        self.queue.clear();
        self.in_ring = 0;
        self.mine_unstable.clear();
        self.gateway = false;
        self.links.clear();
        self.membership = None;
        self.standing = Standing::Fresh;
        self.reset_state();
    }

    /// The round's decision, then what was kept aside: this member is live.
    fn finish_round(&mut self) {
        let Some(round) = self.round.take() else {
            return;
        };
        let eligible: Vec<NodeId> = match round.source {
            Some(Some((_, lineage))) => round
                .hellos
                .iter()
                .filter(|(_, l)| *l == Some(lineage))
                .map(|(n, _)| *n)
                .collect(),
            _ => round.members.clone(),
        };
        self.site_view(&round.members, &eligible);
        self.apply_kept(round.kept);
    }

    fn apply_kept(&mut self, kept: Vec<(NodeId, Bytes)>) {
        for (sender, payload) in kept {
            self.apply(sender, &payload);
            self.progress();
        }
    }

    /// The site's daemons are `members` now: the departed ones' clients
    /// leave their groups, and the gateway stays if it is among
    /// `eligible` (the members that held the site's state), else the
    /// lowest of them takes over. The same at every member, at the same
    /// point of the order.
    fn site_view(&mut self, members: &[NodeId], eligible: &[NodeId]) {
        let gone: Vec<NodeId> = self
            .site_members
            .iter()
            .filter(|n| !members.contains(n))
            .copied()
            .collect();
        self.site_members = members.to_vec();
        // A departed sender's message in parts ends here, the same at
        // every member (they delivered the same of its parts).
        self.ring_parts.keep_senders(members);
        let gateway = match self.site_gateway {
            Some(g) if eligible.contains(&g) => g,
            _ => eligible.iter().min().copied().unwrap_or(self.me),
        };
        self.site_gateway = Some(gateway);
        let was = self.gateway;
        self.gateway = gateway == self.me;
        if self.gateway && !was {
            self.become_gateway();
        } else if was && !self.gateway {
            self.links.clear();
            self.membership = None;
        }
        for node in gone {
            self.ingest_own(gateway, Body::Gone { node });
        }
    }

    // ---- the state's bytes ----------------------------------------------

    fn encode_state(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.clock);
        put_conf(&mut w, &self.conf);
        match &self.prev {
            Some(c) => {
                w.u8(1);
                put_conf(&mut w, c);
            }
            None => {
                w.u8(0);
            }
        }
        w.u32(self.future.len() as u32);
        for (epoch, es) in &self.future {
            w.u32(*epoch);
            put_elements(&mut w, es.iter());
        }
        put_pending(&mut w, self.pending.as_ref());
        w.u8(u8::from(self.own_closed))
            .u8(u8::from(self.data_since_marker));
        w.u32(self.held_own.len() as u32);
        for (n, b) in &self.held_own {
            w.u32(n.0);
            b.encode(&mut w);
        }
        w.u32(self.store.len() as u32);
        for ((e, s, q), b) in &self.store {
            w.u32(*e).u16(s.0).u64(*q).bytes(b);
        }
        w.u32(self.groups.len() as u32);
        for (g, m) in &self.groups {
            w.str(g).u32(m.len() as u32);
            for c in m {
                w.str(c);
            }
        }
        w.u32(self.client_daemon.len() as u32);
        for (c, d) in &self.client_daemon {
            w.str(c).u32(d.0);
        }
        w.u32(self.view_counter.len() as u32);
        for (g, n) in &self.view_counter {
            w.str(g).u64(*n);
        }
        w.u32(self.site_members.len() as u32);
        for n in &self.site_members {
            w.u32(n.0);
        }
        match self.site_gateway {
            Some(g) => w.u8(1).u32(g.0),
            None => w.u8(0),
        };
        self.ring_parts.encode(&mut w);
        put_pending(&mut w, self.deferred.as_ref());
        w.0
    }

    /// Takes the state in `bytes`, all or nothing.
    fn decode_state(&mut self, bytes: &[u8]) -> R<()> {
        let mut r = Reader::new(bytes);
        let clock = r.u64()?;
        let conf = get_conf(&mut r)?;
        if conf.index(self.site).is_none() {
            return Err(Malformed);
        }
        let prev = match r.u8()? {
            0 => None,
            1 => Some(get_conf(&mut r)?),
            _ => return Err(Malformed),
        };
        let mut future = BTreeMap::new();
        for _ in 0..r.count32(8)? {
            let epoch = r.u32()?;
            future.insert(epoch, get_elements(&mut r)?);
        }
        let pending = get_pending(&mut r)?;
        let own_closed = get_bool(&mut r)?;
        let data_since_marker = get_bool(&mut r)?;
        let mut held_own = Vec::new();
        for _ in 0..r.count32(5)? {
            held_own.push((NodeId(r.u32()?), Body::decode(&mut r)?));
        }
        let mut store = BTreeMap::new();
        for _ in 0..r.count32(18)? {
            let key = (r.u32()?, SiteId(r.u16()?), r.u64()?);
            store.insert(key, Bytes::copy_from_slice(r.bytes()?));
        }
        let mut groups = BTreeMap::new();
        for _ in 0..r.count32(8)? {
            let g = r.str()?;
            let mut m = BTreeSet::new();
            for _ in 0..r.count32(4)? {
                m.insert(r.str()?);
            }
            groups.insert(g, m);
        }
        let mut client_daemon = BTreeMap::new();
        for _ in 0..r.count32(8)? {
            client_daemon.insert(r.str()?, NodeId(r.u32()?));
        }
        let mut view_counter = BTreeMap::new();
        for _ in 0..r.count32(12)? {
            view_counter.insert(r.str()?, r.u64()?);
        }
        let mut site_members = Vec::new();
        for _ in 0..r.count32(4)? {
            site_members.push(NodeId(r.u32()?));
        }
        let site_gateway = match r.u8()? {
            0 => None,
            1 => Some(NodeId(r.u32()?)),
            _ => return Err(Malformed),
        };
        let ring_parts = super::parts::RingParts::decode(&mut r)?;
        let deferred = get_pending(&mut r)?;
        r.end()?;
        self.clock = clock;
        self.conf = conf;
        self.prev = prev;
        self.future = future;
        self.pending = pending;
        self.own_closed = own_closed;
        self.data_since_marker = data_since_marker;
        self.held_own = held_own;
        self.store = store;
        self.groups = groups;
        self.client_daemon = client_daemon;
        self.view_counter = view_counter;
        self.site_members = site_members;
        self.site_gateway = site_gateway;
        #[cfg(test)]
        {
            self.parts_adopted += ring_parts.len();
        }
        self.ring_parts = ring_parts;
        self.deferred = deferred;
        Ok(())
    }
}

fn get_bool(r: &mut Reader<'_>) -> R<bool> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Malformed),
    }
}

fn put_pending(w: &mut Writer, p: Option<&Pending>) {
    match p {
        Some(p) => {
            w.u8(1).u32(p.epoch);
            put_sites(w, &p.sites);
            put_sites(w, &p.staying);
            w.u8(u8::from(p.decided));
            match &p.state {
                Some(e) => {
                    w.u8(1).bytes(&e.encode());
                }
                None => {
                    w.u8(0);
                }
            }
        }
        None => {
            w.u8(0);
        }
    }
}

fn get_pending(r: &mut Reader<'_>) -> R<Option<Pending>> {
    Ok(match r.u8()? {
        0 => None,
        1 => Some(Pending {
            epoch: r.u32()?,
            sites: get_sites(r)?,
            staying: get_sites(r)?,
            decided: match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(Malformed),
            },
            state: match r.u8()? {
                0 => None,
                1 => Some(Element::decode(r.bytes()?)?),
                _ => return Err(Malformed),
            },
        }),
        _ => return Err(Malformed),
    })
}

fn put_sites(w: &mut Writer, sites: &[SiteId]) {
    w.u32(sites.len() as u32);
    for s in sites {
        w.u16(s.0);
    }
}

/// Sites in ascending order, without repeats (a configuration's).
fn get_sites(r: &mut Reader<'_>) -> R<Vec<SiteId>> {
    let n = r.count32(2)?;
    let sites = (0..n).map(|_| r.u16().map(SiteId)).collect::<R<Vec<_>>>()?;
    if sites.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Malformed);
    }
    Ok(sites)
}

fn put_elements<'a>(w: &mut Writer, es: impl ExactSizeIterator<Item = &'a Element>) {
    w.u32(es.len() as u32);
    for e in es {
        w.bytes(&e.encode());
    }
}

fn get_elements(r: &mut Reader<'_>) -> R<Vec<Element>> {
    (0..r.count32(4)?)
        .map(|_| Element::decode(r.bytes()?))
        .collect()
}

fn put_conf(w: &mut Writer, c: &Conf) {
    w.u32(c.epoch);
    put_sites(w, &c.sites);
    w.u8(u8::from(c.installed));
    for s in &c.streams {
        w.u64(s.next).u64(s.last_ts);
        put_elements(w, s.early.values());
        put_elements(w, s.ordered.iter());
        w.u64s(&s.announced);
        match &s.flush {
            Some((e, sites, holds)) => {
                w.u8(1).u32(*e);
                put_sites(w, sites);
                w.u64s(holds);
            }
            None => {
                w.u8(0);
            }
        }
        match &s.state {
            Some(members) => {
                w.u8(1).u32(members.len() as u32);
                for (g, c, d) in members {
                    w.str(g).str(c).u32(d.0);
                }
            }
            None => {
                w.u8(0);
            }
        }
    }
}

fn get_conf(r: &mut Reader<'_>) -> R<Conf> {
    let epoch = r.u32()?;
    let sites = get_sites(r)?;
    let installed = get_bool(r)?;
    let mut streams = Vec::with_capacity(sites.len().min(r.remaining()));
    for _ in 0..sites.len() {
        let next = r.u64()?;
        if next == 0 {
            return Err(Malformed);
        }
        let last_ts = r.u64()?;
        let early = get_elements(r)?.into_iter().map(|e| (e.seq, e)).collect();
        let ordered: VecDeque<Element> = get_elements(r)?.into();
        let announced = r.u64s()?;
        if announced.len() != sites.len() {
            return Err(Malformed);
        }
        let flush = match r.u8()? {
            0 => None,
            1 => Some((r.u32()?, get_sites(r)?, r.u64s()?)),
            _ => return Err(Malformed),
        };
        let state = match r.u8()? {
            0 => None,
            1 => {
                let n = r.count32(12)?;
                Some(
                    (0..n)
                        .map(|_| Ok((r.str()?, r.str()?, NodeId(r.u32()?))))
                        .collect::<R<Vec<_>>>()?,
                )
            }
            _ => return Err(Malformed),
        };
        streams.push(Stream {
            next,
            early,
            last_ts,
            ordered,
            announced,
            flush,
            state,
        });
    }
    Ok(Conf {
        epoch,
        sites,
        streams,
        installed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineages_differ_by_ring() {
        let a = RingId { seq: 2, rep: 0 };
        let b = RingId { seq: 2, rep: 1 };
        assert_ne!(mix_ring(0, a), mix_ring(0, b));
        assert_ne!(mix_ring(mix_ring(0, a), b), mix_ring(mix_ring(0, b), a));
    }
}
