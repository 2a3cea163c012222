//! The simulator's pending-event queue: a calendar queue that pops events in
//! exactly the order of a binary heap keyed by (time, insertion order), at a
//! fraction of its cost when the queue holds hundreds of thousands of
//! events.
//!
//! Time is cut into buckets of `2^WIDTH_SHIFT` ns. The bucket being drained
//! is kept sorted (latest first, so the earliest pops from the end); the
//! next `BUCKETS - 1` buckets are unsorted vectors in a ring, appended to in
//! insertion order and sorted once when their turn comes; events further
//! ahead wait in a binary heap and move into the ring as it reaches them. A
//! bitmap of the ring's non-empty buckets lets a sparse queue skip empty
//! time quickly. Pushes and pops touch a few contiguous vectors instead of
//! sifting through a heap spread over the whole pending set (the heap and
//! its event slab were 12% of a 3,280-member run's profile, mostly cache
//! misses).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A bucket spans 2^16 ns (65.5 µs): at 10^4 members a bucket holds a few
/// hundred events, so sorting it is cheap and the ring covers link delays
/// and gossip rounds.
const WIDTH_SHIFT: u32 = 16;
/// Buckets in the ring: with the width, 268 ms of time ahead.
const BUCKETS: usize = 4096;
/// Entries of room an empty bucket keeps for reuse.
const BUCKET_KEPT: usize = 32;
/// Drained vectors larger than that kept for buckets that outgrow their
/// own room.
const SPARES_MAX: usize = 8;

struct Entry<T> {
    time: u64,
    order: u64,
    item: T,
}

/// Far-future entries, ordered by (time, order) alone.
struct Far<T>(Entry<T>);

impl<T> PartialEq for Far<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.0.time, self.0.order) == (other.0.time, other.0.order)
    }
}
impl<T> Eq for Far<T> {}
impl<T> PartialOrd for Far<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Far<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.time, self.0.order).cmp(&(other.0.time, other.0.order))
    }
}

/// A priority queue of items by time, first in first out among equal
/// times. Times pushed may lie before the last one popped (the caller's
/// business); they pop next.
pub struct Calendar<T> {
    /// Absolute number of the bucket being drained: every entry of a bucket
    /// up to it is in `current`.
    cursor: u64,
    /// Sorted by (time, order), latest first.
    current: Vec<Entry<T>>,
    /// Buckets `cursor + 1 .. cursor + BUCKETS`, at index `bucket % BUCKETS`,
    /// each in insertion order.
    ring: Vec<Vec<Entry<T>>>,
    /// Bit `i` set when `ring[i]` is not empty.
    occupied: Vec<u64>,
    in_ring: usize,
    far: BinaryHeap<Reverse<Far<T>>>,
    order: u64,
    len: usize,
    /// Empty vectors of more than [`BUCKET_KEPT`] entries' room, from
    /// drained buckets: a bucket that fills its own room moves into one
    /// instead of growing by reallocation (at 10^4 members a bucket holds
    /// thousands of entries, and growing each one from 32 through every
    /// power of two was 8% of a run: copies, `realloc` and new pages).
    /// Only a bucket that needs the room gets one, so the ring does not
    /// end up holding large vectors in every bucket.
    spares: Vec<Vec<Entry<T>>>,
}

impl<T> Default for Calendar<T> {
    fn default() -> Self {
        Calendar {
            cursor: 0,
            current: Vec::new(),
            ring: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: vec![0; BUCKETS / 64],
            in_ring: 0,
            far: BinaryHeap::new(),
            order: 0,
            len: 0,
            spares: Vec::new(),
        }
    }
}

impl<T> Calendar<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, time: u64, item: T) {
        self.order += 1;
        self.len += 1;
        let entry = Entry {
            time,
            order: self.order,
            item,
        };
        let bucket = time >> WIDTH_SHIFT;
        if bucket <= self.cursor {
            // The newest order: after every entry of the same time.
            let key = (time, entry.order);
            let at = self.current.partition_point(|e| (e.time, e.order) > key);
            self.current.insert(at, entry);
        } else if bucket - self.cursor < BUCKETS as u64 {
            self.put_in_ring(bucket, entry);
        } else {
            self.far.push(Reverse(Far(entry)));
        }
    }

    fn put_in_ring(&mut self, bucket: u64, entry: Entry<T>) {
        let i = (bucket % BUCKETS as u64) as usize;
        let full = &mut self.ring[i];
        if full.len() == full.capacity() && full.capacity() >= BUCKET_KEPT {
            if let Some(mut spare) = self.spares.pop() {
                if spare.capacity() > full.len() {
                    spare.append(full);
                    std::mem::swap(full, &mut spare);
                } else {
                    self.spares.push(spare);
                }
            }
        }
        self.ring[i].push(entry);
        self.occupied[i / 64] |= 1 << (i % 64);
        self.in_ring += 1;
    }

    /// The earliest time queued.
    pub fn next_time(&mut self) -> Option<u64> {
        if self.current.is_empty() && !self.advance() {
            return None;
        }
        self.current.last().map(|e| e.time)
    }

    /// The earliest item and its time.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        if self.current.is_empty() && !self.advance() {
            return None;
        }
        let entry = self.current.pop()?;
        self.len -= 1;
        Some((entry.time, entry.item))
    }

    /// Moves the cursor to the next bucket holding entries and sorts it into
    /// `current` (empty before). Returns false when nothing is queued.
    fn advance(&mut self) -> bool {
        loop {
            let next = match self.next_occupied() {
                Some(bucket) => bucket,
                None => match self.far.peek() {
                    Some(Reverse(far)) => far.0.time >> WIDTH_SHIFT,
                    None => return false,
                },
            };
            self.cursor = next;
            // The ring now reaches further: far entries it covers join it,
            // in (time, order) order, so each bucket stays in insertion order.
            while let Some(Reverse(far)) = self.far.peek() {
                let bucket = far.0.time >> WIDTH_SHIFT;
                if bucket - self.cursor >= BUCKETS as u64 {
                    break;
                }
                let Reverse(Far(entry)) = self.far.pop().expect("peeked");
                if bucket == self.cursor {
                    self.current.push(entry);
                } else {
                    self.put_in_ring(bucket, entry);
                }
            }
            let i = (self.cursor % BUCKETS as u64) as usize;
            if self.occupied[i / 64] & (1 << (i % 64)) != 0 {
                self.occupied[i / 64] &= !(1 << (i % 64));
                self.in_ring -= self.ring[i].len();
                // `current` is empty or holds far entries of this bucket,
                // which are older than any pushed into the ring since.
                if self.current.is_empty() {
                    std::mem::swap(&mut self.current, &mut self.ring[i]);
                    // A bucket keeps a small vector, not the largest burst
                    // it ever held: 4,096 buckets that each once held the
                    // 6,561 leaves' arrivals of one multicast would hold
                    // gigabytes.
                    if self.ring[i].capacity() > BUCKET_KEPT {
                        let drained = std::mem::take(&mut self.ring[i]);
                        if self.spares.len() < SPARES_MAX {
                            self.spares.push(drained);
                        }
                    }
                } else {
                    self.current.append(&mut self.ring[i]);
                }
            }
            if !self.current.is_empty() {
                // Entries are in insertion order, so a stable sort by time
                // alone gives (time, order); reversed, the earliest pops
                // first. Runs already in time order (arrivals of one
                // multicast, many sharing a time) are found in one pass,
                // where sorting by the pair compared and moved every entry
                // about log n times (10% of a 1,093-member run's
                // instructions).
                self.current.sort_by_key(|e| e.time);
                self.current.reverse();
                return true;
            }
        }
    }

    /// The first non-empty ring bucket after the cursor, as an absolute
    /// bucket number.
    fn next_occupied(&self) -> Option<u64> {
        if self.in_ring == 0 {
            return None;
        }
        let start = ((self.cursor + 1) % BUCKETS as u64) as usize;
        let words = self.occupied.len();
        // Scan the bitmap from `start`, wrapping once.
        let mut i = start;
        for step in 0..=words {
            let word = i / 64;
            let mut bits = self.occupied[word];
            if step == 0 {
                bits &= !0u64 << (i % 64);
            }
            if bits != 0 {
                let found = word * 64 + bits.trailing_zeros() as usize;
                let ahead = (found + BUCKETS - start) % BUCKETS;
                return Some(self.cursor + 1 + ahead as u64);
            }
            i = ((word + 1) % words) * 64;
        }
        unreachable!("in_ring > 0 but no bucket occupied")
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;

    /// Pops exactly what a binary heap of (time, insertion order) pops,
    /// for pushes near, far and at the current time, interleaved with pops
    /// and peeks, and pushes before the last time popped.
    #[test]
    fn pops_in_the_order_of_a_heap_of_time_and_insertion_order() {
        for seed in 0..40 {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut calendar = Calendar::default();
            let mut heap = BinaryHeap::new();
            let (mut order, mut now) = (0u64, 0u64);
            let spans = [1u64, 1 << 10, 1 << 16, 1 << 20, 1 << 28, 1 << 34];
            for step in 0..20_000 {
                let burst = rng.random_range(0..4);
                for _ in 0..burst {
                    let span = spans[rng.random_range(0..spans.len())];
                    let mut time = now + rng.random_range(0..span);
                    if rng.random_range(0..50) == 0 {
                        time = now.saturating_sub(rng.random_range(0..1 << 20));
                    }
                    order += 1;
                    calendar.push(time, order);
                    heap.push(Reverse((time, order)));
                }
                if step % 7 == 0 {
                    let peek = heap.peek().map(|Reverse((t, _))| *t);
                    assert_eq!(calendar.next_time(), peek, "seed {seed}");
                }
                for _ in 0..rng.random_range(0..4) {
                    let expected = heap.pop().map(|Reverse((t, o))| (t, o));
                    assert_eq!(calendar.pop(), expected, "seed {seed} step {step}");
                    if let Some((t, _)) = expected {
                        now = now.max(t);
                    }
                }
                assert_eq!(calendar.len(), heap.len());
            }
            while let Some(Reverse(expected)) = heap.pop() {
                assert_eq!(calendar.pop(), Some(expected));
            }
            assert!(calendar.is_empty());
            assert_eq!(calendar.pop(), None);
        }
    }

    #[test]
    fn equal_times_pop_first_in_first_out() {
        let mut calendar = Calendar::default();
        for i in 0..100u64 {
            calendar.push(5 << 30, i);
            calendar.push(7, 1000 + i);
        }
        let popped: Vec<u64> = std::iter::from_fn(|| calendar.pop().map(|(_, i)| i)).collect();
        let expected: Vec<u64> = (1000..1100).chain(0..100).collect();
        assert_eq!(popped, expected);
    }
}
