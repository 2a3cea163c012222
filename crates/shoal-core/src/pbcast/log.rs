//! One source's messages as a member holds them: the pbcast *message buffer*
//! (P001 §B) plus what FIFO delivery and gap repair need.
//!
//! Slots are indexed by sequence number from `base`. Below `base` everything
//! was delivered (or declared lost) and collected. A slot is `Missing` from
//! the moment a later sequence number shows the gap, `Held` while the message
//! is buffered, and `Collected` once garbage collection dropped its payload or
//! the gap was declared lost.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use shoal_wire::SeqRange;

use crate::ranges::RangeBuilder;
use crate::time::Instant;

/// Where [`Log::solicit`] puts what it asks for: first asks, and repeats
/// apart from them when `again` is given (else with them).
pub struct Asks<'a> {
    /// The member asked (an index into the member list).
    pub of: usize,
    pub first: &'a mut RangeBuilder,
    pub again: Option<&'a mut RangeBuilder>,
}

#[derive(Debug)]
pub(super) struct Missing {
    /// When this member learned the message exists.
    pub since: Instant,
    /// When it was last solicited, and of whom.
    pub solicited_at: Option<Instant>,
    pub solicited_of: usize,
    /// Solicited more than once: its repair, when it comes, answers an
    /// unknown one of the asks, so it says nothing of the round trip
    /// (Karn's rule).
    pub asked_again: bool,
    /// Digests seen since `since` whose sender did not hold the message.
    pub evidence: u32,
    /// The last two digests that invited its push: (when, to whom), the
    /// latest first. A push comes from a digest's receiver, so it times
    /// the round trip from the digest it answers, unless both went to the
    /// same member (as Karn's rule); where a push takes longer than a
    /// round, the next digest has left before it arrives.
    pub invites: [Option<(Instant, usize)>; 2],
}

#[derive(Debug)]
pub(super) struct Held {
    pub payload: Bytes,
    pub received: Instant,
    pub delivered: bool,
    pub recovered: bool,
}

/// A slot is 48 bytes: a missing message's bookkeeping (88 bytes) is boxed,
/// as few slots are missing at once while every held message takes one, and
/// at 10^4 members writing each new message's slot is a cache miss per
/// member (half as many lines touched with the smaller slot).
#[derive(Debug)]
pub(super) enum Slot {
    Missing(Box<Missing>),
    Held(Held),
    Collected,
}

/// Outcome of offering a message to the log.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Inserted {
    /// New here. `answered_after`: the time since this member's only
    /// solicitation of it, when it came as a retransmission from the member
    /// asked (a sample of the repair round trip). A repair from anyone else
    /// (a push, or another member's answer after this ask was lost) times
    /// something else. `pushed_after`: likewise the time since the only
    /// digest that invited its push, when it came from that digest's
    /// receiver and this member never solicited it there.
    New {
        answered_after: Option<Duration>,
        pushed_after: Option<Duration>,
    },
    Duplicate,
}

/// A message ready for the application.
pub(super) struct Ready {
    pub seq: u64,
    pub payload: Bytes,
    pub recovered: bool,
}

#[derive(Debug)]
pub(super) struct SourceLog {
    /// False for a member that joined while this source was already sending:
    /// the log starts at the first message it receives, not at 0.
    anchored: bool,
    base: u64,
    slots: VecDeque<Slot>,
    /// First sequence number not yet delivered, skipped or collected.
    cursor: u64,
    held: usize,
    missing: usize,
    /// New messages since the last flow-control status sent to the source.
    pub unreported: u32,
    /// Whether the engine's busy and gappy sets hold this source now (the
    /// engine keeps them; the sets are then touched only on a change).
    pub in_busy: bool,
    pub in_gappy: bool,
}

impl Default for SourceLog {
    fn default() -> Self {
        SourceLog::empty(true)
    }
}

impl SourceLog {
    /// An empty log: `anchored`, it starts at sequence number 0; otherwise
    /// wherever the first received message is.
    pub const fn empty(anchored: bool) -> SourceLog {
        SourceLog {
            anchored,
            base: 0,
            slots: VecDeque::new(),
            cursor: 0,
            held: 0,
            missing: 0,
            unreported: 0,
            in_busy: false,
            in_gappy: false,
        }
    }

    /// One past the highest sequence number known to exist.
    pub fn end(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Lowest sequence number still tracked.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Every message below this was delivered or declared lost.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    pub fn held(&self) -> usize {
        self.held
    }

    /// Nothing buffered, nothing missing: no work for a round.
    pub fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn has_missing(&self) -> bool {
        self.missing > 0
    }

    fn slot(&self, seq: u64) -> Option<&Slot> {
        let index = seq.checked_sub(self.base)?;
        self.slots.get(usize::try_from(index).ok()?)
    }

    fn slot_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        let index = seq.checked_sub(self.base)?;
        self.slots.get_mut(usize::try_from(index).ok()?)
    }

    pub fn payload(&self, seq: u64) -> Option<&Bytes> {
        match self.slot(seq) {
            Some(Slot::Held(held)) => Some(&held.payload),
            _ => None,
        }
    }

    pub fn holds(&self, seq: u64) -> bool {
        self.payload(seq).is_some()
    }

    /// Records that messages up to `last` exist, opening `Missing` slots.
    /// `limit` bounds how far a single packet may extend the log.
    pub fn learn_up_to(&mut self, last: u64, now: Instant, limit: u64) {
        if !self.anchored {
            return;
        }
        let last = last.min(self.end().saturating_add(limit));
        while self.end() <= last {
            self.slots.push_back(Slot::Missing(Box::new(Missing {
                since: now,
                solicited_at: None,
                solicited_of: 0,
                asked_again: false,
                evidence: 0,
                invites: [None; 2],
            })));
            self.missing += 1;
        }
    }

    /// Offers a message: from the first phase (`repaired_by` None) or a
    /// retransmission from that member. `limit` as in
    /// [`SourceLog::learn_up_to`]; a message further ahead than that is
    /// dropped as a duplicate would be.
    pub fn insert(
        &mut self,
        seq: u64,
        payload: Bytes,
        now: Instant,
        repaired_by: Option<usize>,
        limit: u64,
    ) -> Inserted {
        if !self.anchored {
            self.anchored = true;
            self.base = seq;
            self.cursor = seq;
        }
        if seq < self.base || seq > self.end().saturating_add(limit) {
            return Inserted::Duplicate;
        }
        if seq == self.end() {
            // The next message in order (the common case): as a gap opened
            // and filled at once, with no ask or invite to time.
            self.slots.push_back(Slot::Held(Held {
                payload,
                received: now,
                delivered: false,
                recovered: repaired_by.is_some(),
            }));
            self.held += 1;
            self.unreported = self.unreported.saturating_add(1);
            return Inserted::New {
                answered_after: None,
                pushed_after: None,
            };
        }
        self.learn_up_to(seq, now, limit);
        let Some(slot) = self.slot_mut(seq) else {
            return Inserted::Duplicate;
        };
        let Slot::Missing(missing) = slot else {
            return Inserted::Duplicate;
        };
        let answered_after = match (missing.solicited_at, repaired_by) {
            (Some(at), Some(by)) if by == missing.solicited_of && !missing.asked_again => {
                Some(now.saturating_duration_since(at))
            }
            _ => None,
        };
        let pushed_after = repaired_by.and_then(|by| {
            let solicited_there = missing.solicited_at.is_some() && missing.solicited_of == by;
            let mut from_by = missing.invites.iter().flatten().filter(|(_, to)| *to == by);
            match (from_by.next(), from_by.next()) {
                (Some((at, _)), None) if !solicited_there => {
                    Some(now.saturating_duration_since(*at))
                }
                _ => None,
            }
        });
        let recovered = repaired_by.is_some();
        *slot = Slot::Held(Held {
            payload,
            received: now,
            delivered: false,
            recovered,
        });
        self.missing -= 1;
        self.held += 1;
        self.unreported = self.unreported.saturating_add(1);
        Inserted::New {
            answered_after,
            pushed_after,
        }
    }

    /// Marks `seq` delivered out of order and returns it (unordered delivery).
    pub fn take_unordered(&mut self, seq: u64) -> Option<Ready> {
        let Some(Slot::Held(held)) = self.slot_mut(seq) else {
            return None;
        };
        if held.delivered {
            return None;
        }
        held.delivered = true;
        let ready = Ready {
            seq,
            payload: held.payload.clone(),
            recovered: held.recovered,
        };
        self.advance_cursor_over_done();
        Some(ready)
    }

    /// The next message in FIFO order, if it is here.
    pub fn take_next_fifo(&mut self) -> Option<Ready> {
        self.advance_cursor_over_done();
        let seq = self.cursor;
        let Some(Slot::Held(held)) = self.slot_mut(seq) else {
            return None;
        };
        held.delivered = true;
        let ready = Ready {
            seq,
            payload: held.payload.clone(),
            recovered: held.recovered,
        };
        self.cursor += 1;
        Some(ready)
    }

    /// Moves the cursor over delivered and collected slots.
    fn advance_cursor_over_done(&mut self) {
        self.cursor = self.cursor.max(self.base);
        while let Some(slot) = self.slot(self.cursor) {
            match slot {
                Slot::Held(held) if held.delivered => self.cursor += 1,
                Slot::Collected => self.cursor += 1,
                _ => break,
            }
        }
    }

    /// Drops payloads delivered at least `gc_period` ago, oldest first, and
    /// forgets collected slots at the front. Stops at the first slot that
    /// must stay, so a late repair keeps its younger neighbours a little
    /// longer; this keeps a round's work proportional to what is collected.
    ///
    /// The message just before a gap stays too, as an anchor: a digest
    /// advertises held messages only, and a gossiper reads everything below
    /// the first advertised one as collected (`young_missing_at_peer`).
    /// Without the anchor, once this member's own collection reached its
    /// oldest gap the gap vanished from its digests and nobody would push
    /// the message; pull alone then waited on a holder's digest to arrive
    /// before every copy was collected. Traced in P001 Fig 7 (flat
    /// pbcast): messages were declared lost by one member while the other
    /// 79 held them, its gap hidden from its partners for the last second
    /// (`docs/reproduction.md`, Fig 7).
    pub fn collect_garbage(&mut self, now: Instant, gc_period: Duration) {
        while let Some(front) = self.slots.front_mut() {
            match front {
                Slot::Held(held) if held.delivered && held.received + gc_period <= now => {
                    if matches!(self.slots.get(1), Some(Slot::Missing(_))) {
                        break;
                    }
                    self.held -= 1;
                }
                Slot::Collected => {}
                _ => break,
            }
            self.slots.pop_front();
            self.base += 1;
        }
        self.cursor = self.cursor.max(self.base);
    }

    /// The runs of missing messages at the ends of the log, which a digest
    /// of held ranges cannot show: at the end (above the highest message
    /// held or collected) and at the start (nothing before them held). A
    /// log that is all missing is one run.
    pub fn missing_edges(&self) -> Vec<SeqRange> {
        let missing = |slot: &&Slot| matches!(slot, Slot::Missing(_));
        let len = self.slots.len() as u64;
        let front = self.slots.iter().take_while(missing).count() as u64;
        let mut edges = Vec::new();
        if front > 0 {
            edges.extend(SeqRange::new(self.base, self.base + front - 1));
        }
        if front < len {
            let back = self.slots.iter().rev().take_while(missing).count() as u64;
            let end = self.end();
            edges.extend(SeqRange::new(end - back, end - 1).filter(|_| back > 0));
        }
        edges
    }

    /// Ranges of held messages, oldest first.
    pub fn held_ranges(&self) -> Vec<SeqRange> {
        if self.held == self.slots.len() {
            // All held, the usual state: one range, without reading a slot.
            return SeqRange::new(self.base, self.end().wrapping_sub(1))
                .filter(|_| self.held > 0)
                .into_iter()
                .collect();
        }
        let mut builder = RangeBuilder::default();
        for (seq, slot) in (self.base..).zip(&self.slots) {
            if matches!(slot, Slot::Held(_)) {
                builder.push(seq);
            }
        }
        builder.finish()
    }

    /// Missing messages within `range` not solicited in the last `retry`;
    /// marks them solicited, sorted as [`Asks`] says. At most `max`
    /// sequence numbers in all.
    pub fn solicit(
        &mut self,
        range: SeqRange,
        now: Instant,
        retry: Duration,
        max: usize,
        mut out: Asks<'_>,
        taken: &mut usize,
    ) {
        let first = range.first.max(self.base);
        let mut seq = first;
        while seq <= range.last && *taken < max {
            let Some(Slot::Missing(missing)) = self.slot_mut(seq) else {
                if seq >= self.end() {
                    break;
                }
                seq += 1;
                continue;
            };
            if missing.solicited_at.is_none_or(|at| at + retry <= now) {
                let builder = match out.again.as_deref_mut() {
                    Some(again) if missing.solicited_at.is_some() => again,
                    _ => &mut *out.first,
                };
                missing.asked_again |= missing.solicited_at.is_some();
                missing.solicited_at = Some(now);
                missing.solicited_of = out.of;
                builder.push(seq);
                *taken += 1;
            }
            seq += 1;
        }
    }

    /// A digest is about to leave for member `to`: every missing message is
    /// a gap in it, so a partner holding it young pushes it. Marks as
    /// invited now, of `to`, those not invited within `hold`; returns the
    /// others (ascending), whose earlier push may still be on its way: the
    /// digest lists them as awaited so that they are not pushed again yet.
    pub fn invite(&mut self, now: Instant, hold: Duration, to: usize) -> Vec<SeqRange> {
        let mut awaited = RangeBuilder::default();
        if self.missing == 0 {
            return Vec::new();
        }
        for (seq, slot) in (self.base..).zip(self.slots.iter_mut()) {
            let Slot::Missing(missing) = slot else {
                continue;
            };
            match missing.invites[0] {
                Some((at, _)) if at + hold > now => awaited.push(seq),
                latest => missing.invites = [Some((now, to)), latest],
            }
        }
        awaited.finish()
    }

    /// Counts one digest as evidence against every missing message that
    /// lies below everything it advertises (`advertised` ascending and
    /// disjoint) and everything its gossiper says it lacks (`lacking`): the
    /// gossiper has moved its window past the message, so it held it and
    /// collected it, or gave up on it. A message merely absent from a digest
    /// is no evidence: the gossiper may lack it too and be about to receive
    /// it (measured: counting those declared a message lost at 1 in 10^6
    /// deliveries while members still held it, P001 Fig 7's two-cluster
    /// run).
    pub fn note_digest(&mut self, advertised: &[SeqRange], lacking: &[SeqRange]) {
        if self.missing == 0 {
            return;
        }
        let starts = advertised.first().into_iter().chain(lacking);
        let window_start = starts.map(|r| r.first).min().unwrap_or(u64::MAX);
        for (seq, slot) in (self.base..).zip(self.slots.iter_mut()) {
            if seq >= window_start {
                break;
            }
            if let Slot::Missing(missing) = slot {
                missing.evidence = missing.evidence.saturating_add(1);
            }
        }
    }

    /// Declares lost every missing message known for `wait` with at least
    /// `evidence_min` digests showing it collected; returns them as ranges.
    pub fn declare_lost(
        &mut self,
        now: Instant,
        wait: Duration,
        evidence_min: u32,
    ) -> Vec<SeqRange> {
        self.declare_lost_from(self.base, now, wait, evidence_min, false)
    }

    /// As [`SourceLog::declare_lost`], but only the run of lost messages at
    /// the FIFO cursor, so a `Lost` event takes its place in FIFO order.
    pub fn declare_lost_at_cursor(
        &mut self,
        now: Instant,
        wait: Duration,
        evidence_min: u32,
    ) -> Option<SeqRange> {
        self.advance_cursor_over_done();
        let cursor = self.cursor;
        self.declare_lost_from(cursor, now, wait, evidence_min, true)
            .first()
            .copied()
    }

    fn declare_lost_from(
        &mut self,
        first: u64,
        now: Instant,
        wait: Duration,
        evidence_min: u32,
        contiguous: bool,
    ) -> Vec<SeqRange> {
        let mut lost = RangeBuilder::default();
        if self.missing == 0 {
            return Vec::new();
        }
        let skip = usize::try_from(first.saturating_sub(self.base)).unwrap_or(usize::MAX);
        for (seq, slot) in (first..).zip(self.slots.iter_mut().skip(skip)) {
            let eligible = matches!(slot, Slot::Missing(m)
                if m.since + wait <= now && m.evidence >= evidence_min);
            if eligible {
                *slot = Slot::Collected;
                self.missing -= 1;
                lost.push(seq);
            } else if contiguous {
                break;
            }
        }
        lost.finish()
    }

    /// Young held messages (held for less than `age_max`) that a gossiper
    /// lacks: in the gaps between the ranges it advertised (`advertised`
    /// sorted) and in the runs it says it lacks beyond them (`lacking`),
    /// except those it says it awaits (`awaited` sorted: a push of them it
    /// invited recently may be on its way). Newest first when `max` cuts
    /// the list; returned in ascending order.
    /// Below its lowest advertised message the gossiper has collected (or
    /// given up on) messages, unless it says it lacks them; pushing those
    /// is waste, and under congestion (late receivers holding messages
    /// "young" that others already collected) it fed a retransmission
    /// storm. Above its highest it may simply not have heard of them yet,
    /// unless it says it lacks them or the source has been `quiet` here (no
    /// newer message for that long): at the end of a burst no later message
    /// shows a member that it missed the last ones, and a member that never
    /// heard of them cannot say it lacks them; in a running stream the next
    /// message soon shows the gap, and pushing what may still be in flight
    /// would only buy duplicates.
    ///
    /// Walks the gaps, not this member's buffer: the work is the candidates
    /// only, and age is checked per message, because a repaired message is
    /// young among older neighbours (an earlier walk from the newest slot
    /// down stopped at the first old one and so never pushed a late repair:
    /// in P001 Fig 7 a member missed a message while its gossip partners
    /// held it, young, a few slots below messages older than a second).
    #[allow(clippy::too_many_arguments)]
    pub fn young_missing_at_peer(
        &self,
        advertised: &[SeqRange],
        lacking: &[SeqRange],
        awaited: &[SeqRange],
        now: Instant,
        age_max: Duration,
        quiet: Duration,
        max: usize,
    ) -> Vec<u64> {
        // [low, high) of each gap.
        let mut gaps: Vec<(u64, u64)> = advertised
            .windows(2)
            .map(|pair| (pair[0].last.saturating_add(1), pair[1].first))
            .collect();
        let span = advertised.first().zip(advertised.last());
        for range in lacking {
            let (first, end) = (range.first, range.last.saturating_add(1));
            match span {
                None => gaps.push((first, end)),
                // Only beyond the digest: its own gaps are listed already.
                Some((bottom, top)) => {
                    gaps.push((first, end.min(bottom.first)));
                    gaps.push((first.max(top.last.saturating_add(1)), end));
                }
            }
        }
        if let Some((_, top)) = span.filter(|_| self.quiet_since(now, quiet)) {
            gaps.push((top.last.saturating_add(1), self.end()));
        }
        gaps.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        'gaps: for (low, high) in gaps {
            let (low, high) = (low.max(self.base), high.min(self.end()));
            for seq in (low..high).rev() {
                if out.len() >= max {
                    break 'gaps;
                }
                if let Some(Slot::Held(held)) = self.slot(seq) {
                    if held.received + age_max > now && !crate::ranges::contains(awaited, seq) {
                        out.push(seq);
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The newest message known here is held and arrived at least `quiet`
    /// ago: the source has stopped sending, for now.
    fn quiet_since(&self, now: Instant, quiet: Duration) -> bool {
        matches!(self.slots.back(), Some(Slot::Held(held)) if held.received + quiet <= now)
    }

    /// Sanity checks for tests and the simulator.
    pub fn check_invariants(&self) {
        let held = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Held(_)))
            .count();
        let missing = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Missing(_)))
            .count();
        assert_eq!(held, self.held, "held count");
        assert_eq!(missing, self.missing, "missing count");
        assert!(self.cursor >= self.base, "cursor below base");
        assert!(self.cursor <= self.end(), "cursor beyond end");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ms(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    /// Messages 0 and 2 held, 1 missing since t = 0.
    /// What `log` pushes at `now_ms` to a gossiper that advertised
    /// `advertised` and lacks `lacking`: messages young for a second, a
    /// source quiet after a round (100 ms).
    fn pushed(
        log: &SourceLog,
        advertised: &[SeqRange],
        lacking: &[SeqRange],
        now_ms: u64,
    ) -> Vec<u64> {
        let (age_max, quiet) = (Duration::from_secs(1), Duration::from_millis(100));
        log.young_missing_at_peer(advertised, lacking, &[], ms(now_ms), age_max, quiet, 100)
    }

    fn log_with_gap_at_one() -> SourceLog {
        let mut log = SourceLog::default();
        for seq in [0, 2] {
            log.insert(seq, Bytes::from_static(b"x"), ms(0), None, 64);
        }
        assert!(log.has_missing());
        log
    }

    #[test]
    fn a_digest_that_also_lacks_a_message_is_no_evidence_it_was_collected() {
        let mut log = log_with_gap_at_one();
        let also_missing = [SeqRange::single(0), SeqRange::single(2)];
        for _ in 0..10 {
            log.note_digest(&also_missing, &[]);
        }
        let lost = log.declare_lost(ms(10_000), Duration::from_secs(2), 3);
        assert!(lost.is_empty(), "declared {lost:?} lost");
    }

    #[test]
    fn digests_whose_window_moved_past_a_message_are_evidence() {
        let mut log = log_with_gap_at_one();
        let moved_on = [SeqRange::new(2, 9).unwrap()];
        for _ in 0..3 {
            log.note_digest(&moved_on, &[]);
        }
        let lost = log.declare_lost(ms(10_000), Duration::from_secs(2), 3);
        assert_eq!(lost, vec![SeqRange::single(1)]);
    }

    #[test]
    fn pushes_stop_below_the_gossipers_window() {
        let mut log = SourceLog::default();
        for seq in 0..10 {
            log.insert(seq, Bytes::from_static(b"x"), ms(0), None, 64);
        }
        // The gossiper holds 5..=9 except 7: it collected 0..=4.
        let advertised = [SeqRange::new(5, 6).unwrap(), SeqRange::new(8, 9).unwrap()];
        assert_eq!(pushed(&log, &advertised, &[], 10), vec![7]);
    }

    #[test]
    fn collection_keeps_the_message_before_a_gap_so_digests_show_it() {
        let mut log = log_with_gap_at_one();
        log.take_unordered(0).expect("0 is ready");
        log.take_unordered(2).expect("2 is ready");
        log.collect_garbage(ms(5_000), Duration::from_secs(1));
        // 0 is due for collection but anchors the gap at 1.
        assert_eq!(
            log.held_ranges(),
            vec![SeqRange::single(0), SeqRange::single(2)]
        );
        // Once the gap is filled, collection moves on.
        log.insert(1, Bytes::from_static(b"x"), ms(5_000), None, 64);
        log.take_unordered(1).expect("1 is ready");
        log.collect_garbage(ms(5_000), Duration::from_secs(1));
        assert_eq!(log.held_ranges(), vec![SeqRange::new(1, 2).unwrap()]);
    }

    #[test]
    fn a_late_repair_is_pushed_though_its_neighbours_are_old() {
        let mut log = SourceLog::default();
        for seq in (0..10).filter(|&seq| seq != 3) {
            log.insert(seq, Bytes::from_static(b"x"), ms(0), None, 64);
        }
        log.insert(3, Bytes::from_static(b"x"), ms(1_500), None, 64);
        // At 2 s everything but the repaired 3 is older than a second.
        let advertised = [SeqRange::new(0, 2).unwrap(), SeqRange::new(4, 9).unwrap()];
        assert_eq!(pushed(&log, &advertised, &[], 2_000), vec![3]);
    }

    #[test]
    fn a_gap_invited_within_the_hold_is_awaited_and_not_pushed() {
        let mut gossiper = log_with_gap_at_one();
        gossiper.learn_up_to(4, ms(0), 64);
        let hold = Duration::from_millis(150);
        // The first digest invites every gap; the next, a round later,
        // awaits them; once the hold has passed, it invites them again.
        assert_eq!(gossiper.invite(ms(100), hold, 1), vec![]);
        let awaited = vec![SeqRange::single(1), SeqRange::new(3, 4).unwrap()];
        assert_eq!(gossiper.invite(ms(200), hold, 1), awaited);
        assert_eq!(gossiper.invite(ms(250), hold, 1), vec![]);
        // A gap opened since is invited at once, while the others wait.
        gossiper.learn_up_to(5, ms(300), 64);
        let awaited_then = vec![SeqRange::single(1), SeqRange::new(3, 4).unwrap()];
        assert_eq!(gossiper.invite(ms(300), hold, 1), awaited_then);
        assert_eq!(gossiper.invite(ms(420), hold, 1), vec![SeqRange::single(5)]);
        // No hold: every digest invites every gap.
        assert_eq!(gossiper.invite(ms(421), Duration::ZERO, 1), vec![]);

        // A partner holding them all pushes only what is not awaited.
        let mut partner = SourceLog::default();
        for seq in 0..6 {
            partner.insert(seq, Bytes::from_static(b"x"), ms(0), None, 64);
        }
        let advertised = [SeqRange::single(0), SeqRange::single(2)];
        let lacking = [SeqRange::new(3, 5).unwrap()];
        let push = |awaited: &[SeqRange]| {
            let (age_max, quiet) = (Duration::from_secs(1), Duration::from_millis(100));
            partner.young_missing_at_peer(
                &advertised,
                &lacking,
                awaited,
                ms(10),
                age_max,
                quiet,
                100,
            )
        };
        assert_eq!(push(&[]), vec![1, 3, 4, 5]);
        assert_eq!(push(&awaited), vec![5]);
    }

    #[test]
    fn what_a_gossiper_lacks_beyond_its_digest_is_pushed_only_when_it_says_so() {
        let mut log = SourceLog::default();
        for seq in 0..10 {
            log.insert(seq, Bytes::from_static(b"x"), ms(0), None, 64);
        }
        let advertised = [SeqRange::new(2, 7).unwrap()];
        let young = |lacking: &[SeqRange]| pushed(&log, &advertised, lacking, 10);
        // It may have collected 0 and 1, and not have heard of 8 and 9.
        assert_eq!(young(&[]), Vec::<u64>::new());
        let edges = [SeqRange::single(0), SeqRange::new(8, 9).unwrap()];
        assert_eq!(young(&edges), vec![0, 8, 9]);
        // A lacking range over the digest's span adds only what lies beyond.
        assert_eq!(young(&[SeqRange::new(5, 8).unwrap()]), vec![8]);
        // Once the source has been quiet for a round, what lies above the
        // gossiper's top is pushed unasked: no later message will show it.
        assert_eq!(pushed(&log, &advertised, &[], 150), vec![8, 9]);
        // The gossiper's side: the runs it lacks at the ends of its log.
        let mut gossiper = log_with_gap_at_one();
        assert_eq!(gossiper.missing_edges(), vec![], "1 shows in the digest");
        gossiper.learn_up_to(5, ms(0), 64);
        assert_eq!(gossiper.missing_edges(), vec![SeqRange::new(3, 5).unwrap()]);
        let mut first_missed = SourceLog::default();
        first_missed.insert(2, Bytes::from_static(b"x"), ms(0), None, 64);
        assert_eq!(
            first_missed.missing_edges(),
            vec![SeqRange::new(0, 1).unwrap()]
        );
        first_missed.learn_up_to(3, ms(0), 64);
        assert_eq!(
            first_missed.missing_edges(),
            vec![SeqRange::new(0, 1).unwrap(), SeqRange::single(3)]
        );
        // A gossiper that lacks a message says nothing of its collection.
        let mut me = log_with_gap_at_one();
        for _ in 0..3 {
            me.note_digest(&[], &[SeqRange::single(1)]);
        }
        assert!(me
            .declare_lost(ms(10_000), Duration::from_secs(2), 3)
            .is_empty());
    }

    /// Asks member 7 for message 1 at each time in `asks` (ms), then lets
    /// a retransmission from member `by` arrive at `answered` ms.
    fn answered_after(asks: &[u64], by: usize, answered: u64) -> Option<Duration> {
        let mut log = log_with_gap_at_one();
        for &at in asks {
            let (mut first, mut again) = (RangeBuilder::default(), RangeBuilder::default());
            let out = Asks {
                of: 7,
                first: &mut first,
                again: Some(&mut again),
            };
            log.solicit(SeqRange::single(1), ms(at), Duration::ZERO, 10, out, &mut 0);
        }
        match log.insert(1, Bytes::from_static(b"x"), ms(answered), Some(by), 64) {
            Inserted::New { answered_after, .. } => answered_after,
            Inserted::Duplicate => panic!("message 1 was missing"),
        }
    }

    #[test]
    fn only_the_answer_to_a_single_ask_measures_the_round_trip() {
        assert_eq!(
            answered_after(&[100], 7, 180),
            Some(Duration::from_millis(80))
        );
        // Which of two asks did it answer? Karn's rule: neither is a sample.
        assert_eq!(answered_after(&[100, 150], 7, 180), None);
        // Someone else's repair (a push, or the ask was lost): not a sample.
        assert_eq!(answered_after(&[100], 3, 180), None);
        assert_eq!(answered_after(&[], 7, 180), None);
    }

    /// Invites pushes of message 1 by digests to `(member, ms)` in order
    /// (each after the last invite's 50 ms hold), solicits it of member 7 at
    /// `asked` ms if given, then lets a push from member `by` arrive at
    /// `pushed` ms.
    fn pushed_after(
        invites: &[(usize, u64)],
        asked: Option<u64>,
        by: usize,
        pushed: u64,
    ) -> Option<Duration> {
        let mut log = log_with_gap_at_one();
        for &(to, at) in invites {
            log.invite(ms(at), Duration::from_millis(50), to);
        }
        if let Some(at) = asked {
            let mut first = RangeBuilder::default();
            let out = Asks {
                of: 7,
                first: &mut first,
                again: None,
            };
            log.solicit(SeqRange::single(1), ms(at), Duration::ZERO, 10, out, &mut 0);
        }
        match log.insert(1, Bytes::from_static(b"x"), ms(pushed), Some(by), 64) {
            Inserted::New { pushed_after, .. } => pushed_after,
            Inserted::Duplicate => panic!("message 1 was missing"),
        }
    }

    #[test]
    fn a_push_times_the_digest_that_drew_it() {
        let ms80 = Some(Duration::from_millis(80));
        assert_eq!(pushed_after(&[(4, 100)], None, 4, 180), ms80);
        // The next digest left before the push came back: the push is from
        // the first digest's receiver, so it still times that digest.
        let ms180 = Some(Duration::from_millis(180));
        assert_eq!(pushed_after(&[(4, 100), (5, 200)], None, 4, 280), ms180);
        assert_eq!(pushed_after(&[(4, 100), (5, 200)], None, 5, 280), ms80);
        // Two digests to the same member: which drew it? Neither.
        assert_eq!(pushed_after(&[(4, 100), (4, 200)], None, 4, 280), None);
        // Solicited of the same member too: perhaps an answer.
        assert_eq!(pushed_after(&[(7, 100)], Some(120), 7, 180), None);
        // From a member never invited: not a sample.
        assert_eq!(pushed_after(&[(4, 100)], None, 3, 180), None);
    }
}
