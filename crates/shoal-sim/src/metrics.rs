//! What the simulator records per host, and the delivery checker that runs
//! as events happen: every message exactly once, and, for engines that
//! promise it, in FIFO order per source (a `Lost` range counts as
//! delivered-as-lost at its place in the order).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use hdrhistogram::Histogram;
use shoal_core::pbcast::Event;
use shoal_core::{traditional, vsync};
use shoal_wire::{decode_header, HEADER_LEN, KIND_COUNT};

/// What the metrics need from an engine's event: a delivery or a loss.
pub enum Observed<'a> {
    Deliver {
        source: u32,
        seq: u64,
        payload: &'a [u8],
        recovered: bool,
    },
    Lost {
        source: u32,
        first: u64,
        last: u64,
    },
    /// Anything else (views): not recorded.
    Other,
}

/// Events the simulator can record.
pub trait SimEvent: std::fmt::Debug {
    fn observed(&self) -> Observed<'_>;
}

impl SimEvent for Event {
    fn observed(&self) -> Observed<'_> {
        match self {
            Event::Deliver {
                source,
                seq,
                payload,
                recovered,
            } => Observed::Deliver {
                source: source.0,
                seq: *seq,
                payload,
                recovered: *recovered,
            },
            Event::Lost { source, range } => Observed::Lost {
                source: source.0,
                first: range.first,
                last: range.last,
            },
        }
    }
}

impl SimEvent for traditional::Event {
    fn observed(&self) -> Observed<'_> {
        match self {
            traditional::Event::Deliver {
                source,
                seq,
                payload,
            } => Observed::Deliver {
                source: source.0,
                seq: *seq,
                payload,
                recovered: false,
            },
            traditional::Event::View { .. } => Observed::Other,
        }
    }
}

impl SimEvent for vsync::Event {
    /// Vsync delivers in gseq order, which keeps each sender's local ids in
    /// order: the FIFO checker applies per sender. A member's local ids
    /// start at [`vsync::first_local_id`]; counted from 0 here.
    fn observed(&self) -> Observed<'_> {
        match self {
            vsync::Event::Deliver {
                sender,
                local_id,
                payload,
                ..
            } => Observed::Deliver {
                source: sender.0,
                seq: local_id.wrapping_sub(vsync::first_local_id(*sender)),
                payload,
                recovered: false,
            },
            // (The P000 scenarios send nothing unsequenced.)
            vsync::Event::View(_)
            | vsync::Event::Removed { .. }
            | vsync::Event::Unsequenced { .. } => Observed::Other,
        }
    }
}

/// A broken delivery guarantee, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub host: usize,
    pub source: u32,
    pub what: String,
}

/// Counters and latencies of one host.
///
/// Laid out in declaration order (`repr(C)`), the counters every datagram
/// and delivery updates first, together: at 10^4 simulated members no
/// host's record is in cache when its next datagram comes, and each line
/// of it touched is a miss. The order decides nothing else.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct HostMetrics {
    pub packets_received: [u64; KIND_COUNT],
    pub delivered: u64,
    pub recovered: u64,
    /// Sources are members `0..sources`; events of others are not checked.
    sources: u32,
    /// When set, deliveries are also counted per bin of this many ns.
    pub throughput_bin_ns: Option<u64>,
    /// Per source delivered from: the next sequence number FIFO order
    /// expects (0 for a source not in it).
    expected: Expected,
    /// `None`: FIFO order is checked. `Some`: unordered delivery, checked
    /// for exactly-once with a bit per (source, sequence number), for the
    /// sources delivered from.
    seen: Option<BTreeMap<u32, Vec<u64>>>,
    /// Delivery latency of others' messages, in microseconds.
    pub latency_us: Latency,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    pub packets_sent: [u64; KIND_COUNT],
    pub originated: u64,
    pub lost: u64,
    pub dropped_asleep: u64,
    /// Datagrams dropped on arrival by `Sim::set_receive_loss`.
    pub dropped_receive_loss: u64,
    /// Received datagrams dropped because the CPU's backlog was full.
    pub dropped_backlog: u64,
    /// (source, first, last, time ns) of every `Lost` event.
    pub lost_ranges: Vec<(u32, u64, u64, u64)>,
    /// Deliveries per bin (see `throughput_bin_ns`).
    pub deliveries_per_bin: Vec<u32>,
}

impl HostMetrics {
    pub fn new(sources: usize) -> HostMetrics {
        HostMetrics {
            packets_sent: [0; KIND_COUNT],
            packets_received: [0; KIND_COUNT],
            datagrams_sent: 0,
            bytes_sent: 0,
            originated: 0,
            delivered: 0,
            recovered: 0,
            lost: 0,
            dropped_asleep: 0,
            dropped_receive_loss: 0,
            dropped_backlog: 0,
            lost_ranges: Vec::new(),
            latency_us: Latency::default(),
            throughput_bin_ns: None,
            deliveries_per_bin: Vec::new(),
            sources: u32::try_from(sources).expect("fewer than 2^32 members"),
            expected: Expected::default(),
            seen: None,
        }
    }

    /// Deliveries in each throughput bin from `from_ns` up to `to_ns`
    /// (needs `throughput_bin_ns`).
    pub fn bins_between(&self, from_ns: u64, to_ns: u64) -> Vec<u32> {
        let Some(bin) = self.throughput_bin_ns.filter(|b| *b > 0) else {
            return Vec::new();
        };
        let (first, last) = ((from_ns / bin) as usize, (to_ns / bin) as usize);
        (first..last)
            .map(|b| self.deliveries_per_bin.get(b).copied().unwrap_or(0))
            .collect()
    }

    /// Deliveries per second from `from_ns` up to `to_ns`, from the bins.
    pub fn delivery_rate(&self, from_ns: u64, to_ns: u64) -> f64 {
        let bins = self.bins_between(from_ns, to_ns);
        let bin_s = self.throughput_bin_ns.unwrap_or(0) as f64 / 1e9;
        let delivered: u32 = bins.iter().sum();
        f64::from(delivered) / (bins.len() as f64 * bin_s).max(1e-9)
    }

    /// FIFO order expects `source`'s deliveries here to start at `seq` (a
    /// member that joins later starts where its first view does).
    pub fn expect_from(&mut self, source: u32, seq: u64) {
        *self.expected.entry(source) = seq;
    }

    /// Checks exactly-once delivery only, not order (SRM, unordered pbcast).
    pub fn unordered(mut self) -> HostMetrics {
        self.seen = Some(BTreeMap::new());
        self
    }

    pub fn count_sent(&mut self, datagram: &[u8]) {
        self.datagrams_sent += 1;
        self.bytes_sent += datagram.len() as u64;
        count_kinds(datagram, &mut self.packets_sent);
    }

    pub fn count_received(&mut self, datagram: &[u8]) {
        count_kinds(datagram, &mut self.packets_received);
    }

    /// Records an event and checks it; returns the violation it shows, if any.
    pub fn on_event(
        &mut self,
        host: usize,
        now_ns: u64,
        event: &impl SimEvent,
    ) -> Option<Violation> {
        let (source, first, last) = match event.observed() {
            Observed::Other => return None,
            Observed::Deliver {
                source,
                seq,
                payload,
                recovered,
            } => {
                self.delivered += 1;
                self.recovered += u64::from(recovered);
                if let Some(bin_ns) = self.throughput_bin_ns {
                    let bin = (now_ns / bin_ns) as usize;
                    if self.deliveries_per_bin.len() <= bin {
                        self.deliveries_per_bin.resize(bin + 1, 0);
                    }
                    self.deliveries_per_bin[bin] += 1;
                }
                if source as usize != host {
                    self.record_latency(now_ns, payload);
                }
                (source, seq, seq)
            }
            Observed::Lost {
                source,
                first,
                last,
            } => {
                self.lost += last - first + 1;
                self.lost_ranges.push((source, first, last, now_ns));
                (source, first, last)
            }
        };
        if source >= self.sources {
            return None;
        }
        if let Some(seen) = &mut self.seen {
            let bits = seen.entry(source).or_default();
            return mark_once(bits, first, last).map(|seq| Violation {
                host,
                source,
                what: format!("{seq} delivered twice ({event:?})"),
            });
        }
        let expected = self.expected.entry(source);
        let violation = (first != *expected).then(|| Violation {
            host,
            source,
            what: format!("got {first}..={last}, expected {expected} next ({event:?})"),
        });
        *expected = (*expected).max(last + 1);
        violation
    }

    /// Sequence numbers below `count` of `source` neither delivered nor
    /// declared lost here; empty unless `Sim::check_unordered` was on.
    pub fn undelivered(&self, source: u32, count: u64) -> Vec<u64> {
        let Some(seen) = self.seen.as_ref().filter(|_| source < self.sources) else {
            return Vec::new();
        };
        let bits = seen.get(&source).map_or(&[][..], |b| &b[..]);
        let marked = |seq: u64| {
            bits.get((seq / 64) as usize)
                .is_some_and(|word| word & (1 << (seq % 64)) != 0)
        };
        (0..count).filter(|&seq| !marked(seq)).collect()
    }

    fn record_latency(&mut self, now_ns: u64, payload: &[u8]) {
        let Some(stamp) = payload.first_chunk::<8>() else {
            return;
        };
        let sent = u64::from_be_bytes(*stamp);
        let us = now_ns.saturating_sub(sent) / 1_000;
        self.latency_us.saturating_record(us.max(1));
    }
}

/// Latencies recorded as an hdrhistogram of 1 µs to an hour at two
/// significant digits records them, but holding only the buckets in use: a
/// member's latencies fill a few dozen of the histogram's 3,328 buckets, and
/// a simulation of 10^5 members cannot hold 26 KB of counts for each. Every
/// figure read from it (quantiles, min, max, and a histogram built from it)
/// equals the one the full histogram gives.
///
/// The bucket last recorded into is counted in place (`last`) until a value
/// falls in another: most of a member's deliveries land in the bucket of
/// the one before, and the list of buckets, a separate allocation per
/// member, was a cache miss on every delivery at 10^4 members.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// (lowest value of a bucket in use, count), ascending; without `last`.
    buckets: Vec<(u32, u32)>,
    /// (lowest value, count) of the bucket last recorded into, not yet in
    /// `buckets`; count 0 when none.
    last: (u32, u32),
    total: u64,
}

impl PartialEq for Latency {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total && self.merged() == other.merged()
    }
}
impl Eq for Latency {}

/// Values above this are recorded as this.
const LATENCY_MAX_US: u64 = 3_600_000_000;

/// A histogram with the bounds of every latency histogram here: its
/// bucket arithmetic (the counts are never used).
fn latency_layout() -> &'static Histogram<u8> {
    static LAYOUT: OnceLock<Histogram<u8>> = OnceLock::new();
    LAYOUT.get_or_init(|| Histogram::new_with_bounds(1, LATENCY_MAX_US, 2).expect("valid bounds"))
}

/// An empty histogram with the bounds of a [`Latency`].
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 2).expect("valid bounds")
}

impl Latency {
    /// Records `us`, clamped to the histogram's range (an hour).
    pub fn saturating_record(&mut self, us: u64) {
        let lowest = latency_layout().lowest_equivalent(us.min(LATENCY_MAX_US));
        let lowest = u32::try_from(lowest).expect("an hour in µs fits in 32 bits");
        self.total += 1;
        if self.last.1 > 0 && self.last.0 == lowest && self.last.1 < u32::MAX {
            self.last.1 += 1;
            return;
        }
        self.settle();
        self.last = (lowest, 1);
    }

    /// Moves `last` into `buckets`.
    fn settle(&mut self) {
        let (lowest, count) = std::mem::take(&mut self.last);
        if count == 0 {
            return;
        }
        match self.buckets.binary_search_by_key(&lowest, |b| b.0) {
            Ok(i) => self.buckets[i].1 += count,
            Err(i) => self.buckets.insert(i, (lowest, count)),
        }
    }

    /// Every bucket in use, ascending, `last` included (counts as u64).
    fn merged(&self) -> Vec<(u32, u64)> {
        let mut all: Vec<(u32, u64)> = self
            .buckets
            .iter()
            .map(|&(lowest, count)| (lowest, u64::from(count)))
            .collect();
        let (lowest, count) = self.last;
        if count > 0 {
            match all.binary_search_by_key(&lowest, |b| b.0) {
                Ok(i) => all[i].1 += u64::from(count),
                Err(i) => all.insert(i, (lowest, u64::from(count))),
            }
        }
        all
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// As `Histogram::value_at_quantile`.
    pub fn value_at_quantile(&self, quantile: f64) -> u64 {
        let quantile = quantile.min(1.0);
        let target = ((quantile * self.total as f64).ceil() as u64).max(1);
        let mut sum = 0;
        for (lowest, count) in self.merged() {
            sum += count;
            if sum >= target {
                let layout = latency_layout();
                return if quantile == 0.0 {
                    u64::from(lowest)
                } else {
                    layout.highest_equivalent(u64::from(lowest))
                };
            }
        }
        0
    }

    /// As `Histogram::min`: the lowest value's bucket start, 0 if empty.
    pub fn min(&self) -> u64 {
        self.merged().first().map_or(0, |b| u64::from(b.0))
    }

    /// As `Histogram::max`: the highest value's bucket end, 0 if empty.
    pub fn max(&self) -> u64 {
        self.merged()
            .last()
            .map_or(0, |b| latency_layout().highest_equivalent(u64::from(b.0)))
    }

    /// The full histogram.
    pub fn histogram(&self) -> Histogram<u64> {
        let mut h = latency_histogram();
        self.add_to(&mut h);
        h
    }
}

/// Latencies that can be merged into a histogram of the bounds of
/// [`latency_histogram`]: a histogram, or a member's [`Latency`].
pub trait AddTo {
    fn add_to(&self, histogram: &mut Histogram<u64>);
}

impl AddTo for Histogram<u64> {
    fn add_to(&self, histogram: &mut Histogram<u64>) {
        let _ = histogram.add(self);
    }
}

impl AddTo for Latency {
    fn add_to(&self, histogram: &mut Histogram<u64>) {
        for (lowest, count) in self.merged() {
            let _ = histogram.record_n(u64::from(lowest), count);
        }
    }
}

/// The next sequence number expected per source: the first source
/// delivered from in place (in most runs the only one: a member's state is
/// then one cache line, not a line plus a map node), the others in a map.
#[derive(Debug, Clone, Default)]
struct Expected {
    first: Option<(u32, u64)>,
    rest: BTreeMap<u32, u64>,
}

impl Expected {
    fn entry(&mut self, source: u32) -> &mut u64 {
        match self.first {
            Some((s, _)) if s != source => self.rest.entry(source).or_insert(0),
            _ => &mut self.first.get_or_insert((source, 0)).1,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}

/// Sets the bits first..=last; returns a sequence number already set.
fn mark_once(bits: &mut Vec<u64>, first: u64, last: u64) -> Option<u64> {
    let mut twice = None;
    for seq in first..=last {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        if bits[word] & (1 << bit) != 0 {
            twice.get_or_insert(seq);
        }
        bits[word] |= 1 << bit;
    }
    twice
}

/// Counts packets per kind in a datagram, reading headers only.
pub(crate) fn count_kinds(mut datagram: &[u8], counts: &mut [u64; KIND_COUNT]) {
    while let Ok(header) = decode_header(datagram) {
        counts[header.kind.index()] += 1;
        let Some(rest) = datagram.get(HEADER_LEN + header.body_len..) else {
            return;
        };
        datagram = rest;
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;

    /// Every figure read from a `Latency` is the one a full histogram of
    /// the same values gives.
    #[test]
    fn a_sparse_latency_reads_as_the_full_histogram() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        for spread in [10u64, 1_000, 100_000, 10_000_000, 5_000_000_000] {
            let mut sparse = Latency::default();
            let mut full = latency_histogram();
            assert_eq!(sparse.value_at_quantile(0.5), full.value_at_quantile(0.5));
            assert_eq!((sparse.min(), sparse.max()), (full.min(), full.max()));
            for _ in 0..5_000 {
                let us = rng.random_range(1..=spread);
                sparse.saturating_record(us);
                full.saturating_record(us.min(LATENCY_MAX_US));
            }
            for q in [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(
                    sparse.value_at_quantile(q),
                    full.value_at_quantile(q),
                    "q {q}"
                );
            }
            assert_eq!((sparse.min(), sparse.max()), (full.min(), full.max()));
            assert_eq!(sparse.len(), full.len());
            let rebuilt = sparse.histogram();
            assert_eq!(rebuilt.mean(), full.mean());
            assert_eq!((rebuilt.min(), rebuilt.max()), (full.min(), full.max()));
            let mut merged = latency_histogram();
            sparse.add_to(&mut merged);
            full.add_to(&mut merged);
            assert_eq!(merged.len(), 2 * full.len());
            assert_eq!(merged.value_at_quantile(0.9), full.value_at_quantile(0.9));
        }
    }

    /// Only the sources a member delivers from take room; a source past the
    /// group is not checked, as before.
    #[test]
    fn the_delivery_checker_keeps_sources_delivered_from() {
        let mut m = HostMetrics::new(1_000_000);
        let deliver = |seq| Event::Deliver {
            source: shoal_core::NodeId(999_999),
            seq,
            payload: bytes::Bytes::new(),
            recovered: false,
        };
        assert_eq!(m.on_event(0, 0, &deliver(0)), None);
        assert!(m.on_event(0, 0, &deliver(2)).is_some());
        assert_eq!(m.expected.len(), 1);
        let mut u = HostMetrics::new(4).unordered();
        assert_eq!(u.on_event(0, 0, &deliver(0)), None);
        assert_eq!(u.undelivered(2, 2), vec![0, 1]);
        assert_eq!(u.undelivered(9, 2), Vec::<u64>::new());
    }
}
