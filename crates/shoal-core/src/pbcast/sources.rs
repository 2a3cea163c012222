//! Per-member state kept only for the members it concerns: the message log of
//! each source this member has heard of, and the flow-control progress of
//! each member that reported some. In a group of n members of which a few
//! send, a member holds a few logs, not n (P001's groups of thousands, with
//! one sender, would otherwise cost every member n empty logs, and a group
//! n² of them).

use std::collections::BTreeMap;
use std::time::Duration;

use super::log::SourceLog;
use crate::time::Instant;

/// The logs of the sources this member has heard of, by source index. A
/// source without an entry has an empty log: anchored at sequence number 0
/// for a member of the group from the start, unanchored (starting at the
/// first message received) for one that joined while others were sending.
///
/// The first [`INLINE`] logs made are held inline, the others in a map:
/// every member makes its own log first, and in most groups one member or
/// a few send, whose log is read for every message and every digest; in
/// the map it would cost a separate node's cache lines each time (at 10^4
/// members no member's state is in cache when its next datagram comes,
/// and each such line is a miss). Which logs are inline decides nothing:
/// lookups and the ascending iteration are those of one map.
#[derive(Debug)]
pub(super) struct Logs {
    /// Logs whose sources have no entry in `map`, in any order.
    inline: [Option<(usize, SourceLog)>; INLINE],
    map: BTreeMap<usize, SourceLog>,
    absent_anchored: bool,
}

/// Logs held inline: this member's own and one other source's.
const INLINE: usize = 2;

static EMPTY_ANCHORED: SourceLog = SourceLog::empty(true);
static EMPTY_UNANCHORED: SourceLog = SourceLog::empty(false);

impl Logs {
    /// No logs yet; sources without one are `anchored` (see [`Logs`]).
    pub fn new(anchored: bool) -> Logs {
        Logs {
            inline: [None, None],
            map: BTreeMap::new(),
            absent_anchored: anchored,
        }
    }

    /// Whether a source without an entry is anchored at 0.
    pub fn absent_anchored(&self) -> bool {
        self.absent_anchored
    }

    /// The inline slot holding `source`'s log.
    fn slot_of(&self, source: usize) -> Option<usize> {
        self.inline
            .iter()
            .position(|e| e.as_ref().is_some_and(|(s, _)| *s == source))
    }

    /// `source`'s log, empty if this member never heard of the source.
    pub fn get(&self, source: usize) -> &SourceLog {
        if let Some(i) = self.slot_of(source) {
            return &self.inline[i].as_ref().expect("found").1;
        }
        self.map.get(&source).unwrap_or(if self.absent_anchored {
            &EMPTY_ANCHORED
        } else {
            &EMPTY_UNANCHORED
        })
    }

    /// `source`'s log, created empty if it has none yet.
    pub fn entry(&mut self, source: usize) -> &mut SourceLog {
        let anchored = self.absent_anchored;
        if let Some(i) = self.slot_of(source) {
            return &mut self.inline[i].as_mut().expect("found").1;
        }
        if !self.map.contains_key(&source) {
            if let Some(free) = self.inline.iter().position(Option::is_none) {
                return &mut self.inline[free]
                    .insert((source, SourceLog::empty(anchored)))
                    .1;
            }
        }
        self.map
            .entry(source)
            .or_insert_with(|| SourceLog::empty(anchored))
    }

    /// `source`'s log, if it has one.
    pub fn get_mut(&mut self, source: usize) -> Option<&mut SourceLog> {
        match self.slot_of(source) {
            Some(i) => self.inline[i].as_mut().map(|(_, log)| log),
            None => self.map.get_mut(&source),
        }
    }

    /// The logs that exist, ascending by source.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut SourceLog)> {
        let [a, b] = &mut self.inline;
        let a = a.as_mut().map(|(source, log)| (*source, log));
        let b = b.as_mut().map(|(source, log)| (*source, log));
        Ascending::new(
            [a, b],
            self.map.iter_mut().map(|(&source, log)| (source, log)),
        )
    }

    /// Gives `source` a log of its own (replacing any).
    pub fn insert(&mut self, source: usize, log: SourceLog) {
        if let Some(i) = self.slot_of(source) {
            self.inline[i] = Some((source, log));
            return;
        }
        if !self.map.contains_key(&source) {
            if let Some(free) = self.inline.iter().position(Option::is_none) {
                self.inline[free] = Some((source, log));
                return;
            }
        }
        self.map.insert(source, log);
    }

    /// The logs that exist, ascending by source.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &SourceLog)> {
        let [a, b] = &self.inline;
        let a = a.as_ref().map(|(source, log)| (*source, log));
        let b = b.as_ref().map(|(source, log)| (*source, log));
        Ascending::new([a, b], self.map.iter().map(|(&source, log)| (source, log)))
    }

    /// Moves every log to the index `remap` gives its source, dropping those
    /// it maps to `None`.
    pub fn remap(&mut self, remap: impl Fn(usize) -> Option<usize>) {
        for slot in &mut self.inline {
            *slot = slot
                .take()
                .and_then(|(source, log)| remap(source).map(|to| (to, log)));
        }
        self.map = std::mem::take(&mut self.map)
            .into_iter()
            .filter_map(|(source, log)| remap(source).map(|to| (to, log)))
            .collect();
        debug_assert!(
            self.inline
                .iter()
                .flatten()
                .all(|(source, _)| !self.map.contains_key(source)),
            "remap sends two sources to one"
        );
    }
}

/// The inline logs merged into the map's ascending order.
struct Ascending<L, I: Iterator<Item = (usize, L)>> {
    /// The inline logs, ascending; taken from the front.
    inline: [Option<(usize, L)>; INLINE],
    rest: std::iter::Peekable<I>,
}

impl<L, I: Iterator<Item = (usize, L)>> Ascending<L, I> {
    fn new(inline: [Option<(usize, L)>; INLINE], rest: I) -> Self {
        let [a, b] = inline;
        let inline = match (a, b) {
            (Some(a), Some(b)) if b.0 < a.0 => [Some(b), Some(a)],
            (None, b) => [b, None],
            (a, b) => [a, b],
        };
        Ascending {
            inline,
            rest: rest.peekable(),
        }
    }
}

impl<L, I: Iterator<Item = (usize, L)>> Iterator for Ascending<L, I> {
    type Item = (usize, L);

    fn next(&mut self) -> Option<(usize, L)> {
        let take_inline = match (&self.inline[0], self.rest.peek()) {
            (Some((first, _)), Some((next, _))) => first < next,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_inline {
            let first = self.inline[0].take();
            self.inline.swap(0, 1);
            first
        } else {
            self.rest.next()
        }
    }
}

/// Flow-control progress heard from one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    pub next: u64,
    pub heard: Instant,
}

/// The progress of every other member: an entry for each that reported (or
/// joined in a view change); the rest count as `unheard` (progress 0, heard
/// when this member was created).
#[derive(Debug)]
pub(super) struct Progresses {
    map: BTreeMap<usize, Progress>,
    unheard: Progress,
}

impl Progresses {
    pub fn new(now: Instant) -> Progresses {
        Progresses {
            map: BTreeMap::new(),
            unheard: Progress {
                next: 0,
                heard: now,
            },
        }
    }

    pub fn entry(&mut self, member: usize) -> &mut Progress {
        let unheard = self.unheard;
        self.map.entry(member).or_insert(unheard)
    }

    pub fn insert(&mut self, member: usize, progress: Progress) {
        self.map.insert(member, progress);
    }

    /// The lowest progress among the `others` other members heard from
    /// within `silence` before `now`, or `None` if none was.
    pub fn slowest_recent(&self, others: usize, now: Instant, silence: Duration) -> Option<u64> {
        let recent = |p: &Progress| p.heard + silence > now;
        let heard = self
            .map
            .values()
            .filter(|p| recent(p))
            .map(|p| p.next)
            .min();
        let unheard =
            (others > self.map.len() && recent(&self.unheard)).then_some(self.unheard.next);
        heard.into_iter().chain(unheard).min()
    }

    /// As [`Logs::remap`].
    pub fn remap(&mut self, remap: impl Fn(usize) -> Option<usize>) {
        self.map = std::mem::take(&mut self.map)
            .into_iter()
            .filter_map(|(member, p)| remap(member).map(|to| (to, p)))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;

    /// `Logs` answers as one ascending map would: lookups, creation,
    /// replacement, iteration order and remapping, whichever log is held
    /// inline. A log is told apart by its `unreported` count.
    #[test]
    fn logs_behave_as_one_map() {
        for seed in 0..50 {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut logs = Logs::new(true);
            let mut model: BTreeMap<usize, u32> = BTreeMap::new();
            for step in 0..400u32 {
                let source = rng.random_range(0..12);
                match rng.random_range(0..6) {
                    0 | 1 => {
                        logs.entry(source).unreported += step;
                        *model.entry(source).or_insert(0) += step;
                    }
                    2 => {
                        let mut log = SourceLog::empty(false);
                        log.unreported = step;
                        logs.insert(source, log);
                        model.insert(source, step);
                    }
                    3 => {
                        let got = logs.get_mut(source).map(|l| {
                            l.unreported += 1;
                            l.unreported
                        });
                        let want = model.get_mut(&source).map(|u| {
                            *u += 1;
                            *u
                        });
                        assert_eq!(got, want, "seed {seed} step {step}");
                    }
                    4 => {
                        // Drop one source, shift those above it down.
                        logs.remap(|s| match s.cmp(&source) {
                            std::cmp::Ordering::Less => Some(s),
                            std::cmp::Ordering::Equal => None,
                            std::cmp::Ordering::Greater => Some(s - 1),
                        });
                        model = std::mem::take(&mut model)
                            .into_iter()
                            .filter(|&(s, _)| s != source)
                            .map(|(s, u)| (if s > source { s - 1 } else { s }, u))
                            .collect();
                    }
                    _ => {
                        for (s, log) in logs.iter_mut() {
                            log.unreported += s as u32;
                        }
                        for (s, u) in model.iter_mut() {
                            *u += *s as u32;
                        }
                    }
                }
                let got: Vec<(usize, u32)> = logs.iter().map(|(s, l)| (s, l.unreported)).collect();
                let want: Vec<(usize, u32)> = model.iter().map(|(&s, &u)| (s, u)).collect();
                assert_eq!(got, want, "seed {seed} step {step}");
                for s in 0..12 {
                    let want = model.get(&s).copied().unwrap_or(0);
                    assert_eq!(logs.get(s).unreported, want, "seed {seed} step {step}");
                }
            }
        }
    }
}
