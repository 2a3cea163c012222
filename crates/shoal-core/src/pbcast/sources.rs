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
#[derive(Debug)]
pub(super) struct Logs {
    map: BTreeMap<usize, SourceLog>,
    absent_anchored: bool,
}

static EMPTY_ANCHORED: SourceLog = SourceLog::empty(true);
static EMPTY_UNANCHORED: SourceLog = SourceLog::empty(false);

impl Logs {
    /// No logs yet; sources without one are `anchored` (see [`Logs`]).
    pub fn new(anchored: bool) -> Logs {
        Logs {
            map: BTreeMap::new(),
            absent_anchored: anchored,
        }
    }

    /// Whether a source without an entry is anchored at 0.
    pub fn absent_anchored(&self) -> bool {
        self.absent_anchored
    }

    /// `source`'s log, empty if this member never heard of the source.
    pub fn get(&self, source: usize) -> &SourceLog {
        self.map.get(&source).unwrap_or(if self.absent_anchored {
            &EMPTY_ANCHORED
        } else {
            &EMPTY_UNANCHORED
        })
    }

    /// `source`'s log, created empty if it has none yet.
    pub fn entry(&mut self, source: usize) -> &mut SourceLog {
        let anchored = self.absent_anchored;
        self.map
            .entry(source)
            .or_insert_with(|| SourceLog::empty(anchored))
    }

    /// `source`'s log, if it has one.
    pub fn get_mut(&mut self, source: usize) -> Option<&mut SourceLog> {
        self.map.get_mut(&source)
    }

    /// The logs that exist, ascending by source.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut SourceLog)> {
        self.map.iter_mut().map(|(&source, log)| (source, log))
    }

    /// Gives `source` a log of its own (replacing any).
    pub fn insert(&mut self, source: usize, log: SourceLog) {
        self.map.insert(source, log);
    }

    /// The logs that exist, ascending by source.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &SourceLog)> {
        self.map.iter().map(|(&source, log)| (source, log))
    }

    /// Moves every log to the index `remap` gives its source, dropping those
    /// it maps to `None`.
    pub fn remap(&mut self, remap: impl Fn(usize) -> Option<usize>) {
        self.map = std::mem::take(&mut self.map)
            .into_iter()
            .filter_map(|(source, log)| remap(source).map(|to| (to, log)))
            .collect();
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
