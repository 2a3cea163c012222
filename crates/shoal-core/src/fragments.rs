//! Engine datagrams larger than the path's datagram size, carried in
//! fragments (`shoal_wire::fragment`) and put together again before an
//! engine sees them.
//!
//! Why: every protocol cost of the daemons is paid per datagram the engines
//! build (a vsync record, its replication and acknowledgement, a pbcast
//! message, a batch of client messages). On a 1,500-byte Ethernet path a
//! datagram holds one 1 KB client message, so each message paid all of it
//! alone; with engine datagrams of several path datagrams, a batch of many
//! messages pays it once, and the wire still carries only datagrams that fit
//! the path (no IP fragmentation, which some networks drop).
//!
//! A fragmented datagram is delivered whole or not at all: a lost fragment
//! loses the datagram, as a lost datagram was lost before, and the engines
//! above repair it as they repair any loss. The [`Splitter`] gives every
//! fragment but the last the full path size, so that a runtime may send
//! them as one segmented send (UDP GSO).
//!
//! Sans-IO: the runtime hands in `now`; partial datagrams are dropped after
//! [`ReassemblyConfig::timeout`] and, oldest first, beyond
//! [`ReassemblyConfig::max_bytes`], checked on each fragment received (no
//! timer needed: memory grows only when fragments arrive).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shoal_wire::fragment::{self, Fragment};

use crate::engine::NodeId;
use crate::time::Instant;

/// Limits of the reassembly of fragmented datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReassemblyConfig {
    /// A datagram whose fragments have not all arrived this long after the
    /// first is dropped (default 500 ms: on a LAN its fragments are sent
    /// back to back, so a gap that long means one was lost, and the
    /// engines' repair sends the contents again in new datagrams).
    #[serde(with = "crate::serde_ms", rename = "timeout_ms")]
    pub timeout: Duration,
    /// Bytes of partial datagrams held at most, from all senders together
    /// (default 8 MiB); past it the oldest partial datagram is dropped.
    pub max_bytes: usize,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        ReassemblyConfig {
            timeout: Duration::from_millis(500),
            max_bytes: 8 << 20,
        }
    }
}

/// Cuts a node's outgoing datagrams to the path's size.
#[derive(Debug, Clone)]
pub struct Splitter {
    sender: u32,
    next_id: u32,
    /// Largest fragment, header included.
    max: usize,
}

impl Splitter {
    /// Fragments of at most `max` bytes (header included) from `sender`,
    /// numbered from `first_id` (a runtime starts from a value a restarted
    /// node is unlikely to reuse soon, e.g. from its clock). `max` is raised
    /// to at least one byte of chunk.
    pub fn new(sender: NodeId, first_id: u32, max: usize) -> Splitter {
        Splitter {
            sender: sender.0,
            next_id: first_id,
            max: max.max(fragment::FRAGMENT_HEADER_LEN + 1),
        }
    }

    /// Largest fragment, header included.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether `len` bytes go as fragments.
    pub fn splits(&self, len: usize) -> bool {
        len > self.max
    }

    /// Appends `datagram`'s fragments to `out`, back to back, every one
    /// but the last [`Splitter::max`] bytes long. Returns how many; none
    /// when it is too large to fragment ([`fragment::FRAGMENTED_MAX`]).
    pub fn split(&mut self, datagram: &[u8], out: &mut Vec<u8>) -> usize {
        self.split_as(NodeId(self.sender), datagram, out)
    }

    /// [`Splitter::split`], the fragments claiming `sender`: the node's id
    /// when it sent `datagram`, which the receiver takes as the sender of
    /// the whole datagram. A daemon's id changes at each rejoin (a new
    /// incarnation) while its runtime runs on; fragments that kept the id
    /// it started with were joined at the receiver as the old incarnation's,
    /// and every large datagram of the new one was refused there.
    pub fn split_as(&mut self, sender: NodeId, datagram: &[u8], out: &mut Vec<u8>) -> usize {
        let id = self.next_id;
        let count = fragment::split(sender.0, id, datagram, self.max, out);
        if count > 0 {
            self.next_id = id.wrapping_add(1);
        }
        count
    }
}

/// Counters of a [`Reassembler`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    pub fragments: u64,
    pub datagrams: u64,
    /// Fragments that did not decode, or claimed another sender than the
    /// one they came from, or another length than their datagram's.
    pub malformed: u64,
    /// Fragments received again (ignored).
    pub duplicates: u64,
    /// Partial datagrams dropped for their age.
    pub timed_out: u64,
    /// Partial datagrams dropped for the memory bound.
    pub evicted: u64,
}

struct Partial {
    started: Instant,
    buf: Vec<u8>,
    /// Bytes of distinct chunks received.
    got: usize,
    /// Offsets received, ascending (a datagram has a few dozen at most).
    offsets: Vec<u32>,
}

/// Puts fragmented datagrams together again.
pub struct Reassembler {
    config: ReassemblyConfig,
    partial: BTreeMap<(NodeId, u32), Partial>,
    /// Partial datagrams by age (entries whose datagram completed or went
    /// are skipped when they come up).
    ages: VecDeque<(Instant, NodeId, u32)>,
    bytes: usize,
    last_now: Instant,
    stats: ReassemblyStats,
}

impl Reassembler {
    pub fn new(config: ReassemblyConfig) -> Reassembler {
        Reassembler {
            config,
            partial: BTreeMap::new(),
            ages: VecDeque::new(),
            bytes: 0,
            last_now: Instant::ZERO,
            stats: ReassemblyStats::default(),
        }
    }

    pub fn stats(&self) -> &ReassemblyStats {
        &self.stats
    }

    /// Bytes held in partial datagrams.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Partial datagrams held.
    pub fn partial(&self) -> usize {
        self.partial.len()
    }

    /// A fragment (`shoal_wire::fragment::is_fragment`) from `from`:
    /// returns the whole datagram when this was its last missing fragment.
    pub fn handle_fragment(&mut self, now: Instant, from: NodeId, bytes: &[u8]) -> Option<Bytes> {
        let now = self.advance(now);
        self.stats.fragments += 1;
        self.expire(now);
        let f = match fragment::decode_fragment(bytes) {
            Ok(f) if f.sender == from.0 => f,
            _ => {
                self.stats.malformed += 1;
                return None;
            }
        };
        if f.offset == 0 && f.chunk.len() == f.total as usize {
            self.stats.datagrams += 1;
            return Some(Bytes::copy_from_slice(f.chunk));
        }
        let key = (from, f.id);
        if !self.partial.contains_key(&key) {
            self.start(now, key, f.total as usize);
        }
        let complete = self.add(key, &f)?;
        if !complete {
            self.make_room();
            return None;
        }
        let done = self.partial.remove(&key).expect("just added to");
        self.bytes -= done.buf.len();
        self.stats.datagrams += 1;
        Some(Bytes::from(done.buf))
    }

    fn advance(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    fn start(&mut self, now: Instant, key: (NodeId, u32), total: usize) {
        self.partial.insert(
            key,
            Partial {
                started: now,
                buf: vec![0; total],
                got: 0,
                offsets: Vec::new(),
            },
        );
        self.bytes += total;
        self.ages.push_back((now, key.0, key.1));
    }

    /// Copies the chunk in; returns whether the datagram is complete, or
    /// `None` when the fragment was refused.
    fn add(&mut self, key: (NodeId, u32), f: &Fragment<'_>) -> Option<bool> {
        let p = self.partial.get_mut(&key).expect("started");
        if p.buf.len() != f.total as usize {
            self.stats.malformed += 1;
            return None;
        }
        let Err(at) = p.offsets.binary_search(&f.offset) else {
            self.stats.duplicates += 1;
            return Some(false);
        };
        p.offsets.insert(at, f.offset);
        let start = f.offset as usize;
        p.buf[start..start + f.chunk.len()].copy_from_slice(f.chunk);
        p.got += f.chunk.len();
        Some(p.got >= p.buf.len())
    }

    /// Drops partial datagrams older than the timeout.
    fn expire(&mut self, now: Instant) {
        while let Some(&(started, node, id)) = self.ages.front() {
            if now < started + self.config.timeout {
                return;
            }
            self.ages.pop_front();
            if self.drop_partial(started, (node, id)) {
                self.stats.timed_out += 1;
            }
        }
    }

    /// Drops the oldest partial datagrams while past the memory bound.
    fn make_room(&mut self) {
        while self.bytes > self.config.max_bytes {
            let Some((started, node, id)) = self.ages.pop_front() else {
                return;
            };
            if self.drop_partial(started, (node, id)) {
                self.stats.evicted += 1;
            }
        }
    }

    /// Drops the partial datagram `key` if it is the one started at
    /// `started` (not a later datagram that reused the id).
    fn drop_partial(&mut self, started: Instant, key: (NodeId, u32)) -> bool {
        match self.partial.get(&key) {
            Some(p) if p.started == started => {
                let p = self.partial.remove(&key).expect("present");
                self.bytes -= p.buf.len();
                true
            }
            _ => false,
        }
    }

    /// Checks the byte count and the age queue; panics when broken.
    pub fn check_invariants(&self) {
        let bytes: usize = self.partial.values().map(|p| p.buf.len()).sum();
        assert_eq!(bytes, self.bytes, "held bytes");
        for p in self.partial.values() {
            assert!(p.got < p.buf.len(), "a complete datagram is held");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use rand_xoshiro::Xoshiro256PlusPlus;

    fn datagram(len: usize, salt: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 253) as u8 ^ salt).collect()
    }

    fn split(splitter: &mut Splitter, datagram: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let count = splitter.split(datagram, &mut out);
        let pieces: Vec<Vec<u8>> = out.chunks(splitter.max()).map(<[u8]>::to_vec).collect();
        assert_eq!(pieces.len(), count);
        pieces
    }

    const A: NodeId = NodeId(1);
    const T0: Instant = Instant::ZERO;

    #[test]
    fn fragments_in_any_order_with_duplicates_give_the_datagram_once() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut splitter = Splitter::new(A, 0, 1_472);
        let mut r = Reassembler::new(ReassemblyConfig::default());
        for round in 0..50u8 {
            let d = datagram(2_000 + 1_237 * round as usize, round);
            let mut frags = split(&mut splitter, &d);
            let again = frags[0].clone();
            frags.push(again);
            frags.shuffle(&mut rng);
            let mut whole = Vec::new();
            for f in &frags {
                whole.extend(r.handle_fragment(T0, A, f));
                r.check_invariants();
            }
            assert_eq!(whole.len(), 1, "round {round}: delivered once");
            assert_eq!(whole[0].as_ref(), &d[..]);
        }
        assert!(r.stats().duplicates >= 1);
        // A duplicate that came after its datagram completed waits as a
        // partial datagram of its own until the timeout clears it.
        let later = T0 + ReassemblyConfig::default().timeout;
        let d = datagram(5_000, 1);
        let got = split(&mut splitter, &d)
            .iter()
            .filter_map(|f| r.handle_fragment(later, A, f))
            .count();
        assert_eq!(got, 1);
        assert_eq!(r.held_bytes(), 0, "nothing left over");
    }

    #[test]
    fn interleaved_datagrams_of_two_senders_each_come_out_whole() {
        let b = NodeId(2);
        let mut sa = Splitter::new(A, 5, 1_000);
        let mut sb = Splitter::new(b, 5, 1_000);
        let (da, db) = (datagram(7_000, 1), datagram(9_000, 2));
        let (fa, fb) = (split(&mut sa, &da), split(&mut sb, &db));
        let mut r = Reassembler::new(ReassemblyConfig::default());
        let mut out = Vec::new();
        for i in 0..fa.len().max(fb.len()) {
            if let Some(f) = fa.get(i) {
                out.extend(r.handle_fragment(T0, A, f).map(|d| (A, d)));
            }
            if let Some(f) = fb.get(i) {
                out.extend(r.handle_fragment(T0, b, f).map(|d| (b, d)));
            }
        }
        assert_eq!(out.len(), 2);
        for (from, d) in out {
            let want = if from == A { &da } else { &db };
            assert_eq!(d.as_ref(), &want[..]);
        }
    }

    #[test]
    fn a_lost_fragment_loses_its_datagram_after_the_timeout_and_frees_it() {
        let config = ReassemblyConfig::default();
        let mut splitter = Splitter::new(A, 0, 1_472);
        let mut r = Reassembler::new(config);
        let frags = split(&mut splitter, &datagram(20_000, 0));
        for f in &frags[1..] {
            assert!(r.handle_fragment(T0, A, f).is_none());
        }
        assert_eq!(r.partial(), 1);
        assert_eq!(r.held_bytes(), 20_000);
        // The next datagram's fragments, before and after the timeout.
        let next = split(&mut splitter, &datagram(3_000, 9));
        let just_before = T0 + (config.timeout - Duration::from_nanos(1));
        assert!(r.handle_fragment(just_before, A, &next[0]).is_none());
        assert_eq!(r.partial(), 2);
        let after = T0 + config.timeout;
        let whole = next[1..]
            .iter()
            .filter_map(|f| r.handle_fragment(after, A, f))
            .next();
        assert_eq!(whole.unwrap().as_ref(), &datagram(3_000, 9)[..]);
        assert_eq!(r.partial(), 0, "the old partial datagram timed out");
        assert_eq!(r.stats().timed_out, 1);
        // The missing fragment arriving late starts a partial datagram that
        // never completes: it is not delivered.
        assert!(r.handle_fragment(after, A, &frags[0]).is_none());
        r.check_invariants();
    }

    #[test]
    fn memory_is_bounded_by_dropping_the_oldest_partial_datagram() {
        let config = ReassemblyConfig {
            max_bytes: 100_000,
            ..ReassemblyConfig::default()
        };
        let mut splitter = Splitter::new(A, 0, 1_472);
        let mut r = Reassembler::new(config);
        // Twenty 60 KB datagrams with their last fragment missing.
        for i in 0..20u8 {
            let frags = split(&mut splitter, &datagram(60_000, i));
            for f in &frags[..frags.len() - 1] {
                assert!(r.handle_fragment(T0, A, f).is_none());
            }
            assert!(r.held_bytes() <= config.max_bytes);
            r.check_invariants();
        }
        assert_eq!(r.stats().evicted, 19);
        // A complete datagram still gets through.
        let d = datagram(60_000, 99);
        let got: Vec<Bytes> = split(&mut splitter, &d)
            .iter()
            .filter_map(|f| r.handle_fragment(T0, A, f))
            .collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref(), &d[..]);
    }

    #[test]
    fn a_fragment_claiming_another_sender_or_length_is_refused() {
        let mut splitter = Splitter::new(A, 0, 500);
        let mut r = Reassembler::new(ReassemblyConfig::default());
        let frags = split(&mut splitter, &datagram(2_000, 0));
        assert!(r.handle_fragment(T0, NodeId(9), &frags[0]).is_none());
        assert_eq!(r.stats().malformed, 1);
        assert!(r.handle_fragment(T0, A, &frags[0]).is_none());
        let mut other = Vec::new();
        Fragment {
            sender: A.0,
            id: 0,
            offset: 480,
            total: 3_000,
            chunk: &[1; 10],
        }
        .encode(&mut other);
        assert!(r.handle_fragment(T0, A, &other).is_none());
        assert_eq!(r.stats().malformed, 2);
        assert!(r.handle_fragment(T0, A, b"SF garbage").is_none());
        assert_eq!(r.stats().malformed, 3);
        r.check_invariants();
    }

    #[test]
    fn the_splitter_leaves_small_datagrams_alone_and_numbers_the_rest() {
        let mut s = Splitter::new(A, u32::MAX, 1_472);
        assert!(!s.splits(1_472));
        assert!(s.splits(1_473));
        let first = split(&mut s, &datagram(3_000, 0));
        let second = split(&mut s, &datagram(3_000, 0));
        let id = |f: &[u8]| fragment::decode_fragment(f).unwrap().id;
        assert_eq!((id(&first[0]), id(&second[0])), (u32::MAX, 0), "ids wrap");
        assert!(first.iter().all(|f| f.len() <= 1_472));
    }
}
