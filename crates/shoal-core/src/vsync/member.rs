//! The member side of vsync over pbcast (P000 §5.2, Fig 9): delivery in gseq
//! order, the repair sub-protocol, views and AckPrefreshview.
//!
//! Repair timeout rule (the paper gives only the bounds, 10 ms to 1 s): an
//! EWMA (weight 1/8) of the gap between arrivals of new entries, times
//! `repair_gap_factor`, clamped to `[repair_timeout_min, repair_timeout_max]`;
//! each unanswered request doubles it, up to the maximum. With nothing
//! missing, a member solicits once per `idle_solicit_interval` (§6.4).
//! Repair pauses for `ack_wait` after a Prefreshview (§5.2: "the repair
//! sub-protocol [is] blocked during view changes").

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use shoal_wire::vsync::{self as wire, Message, NewView};

use super::{
    contains, nodes, CurrentView, Event, Record, RemovedReason, Status, View, ViewReason, Vsync,
};
use crate::engine::NodeId;
use crate::pbcast::Pbcast;
use crate::time::Instant;

pub(super) struct MemberState {
    /// Next gseq to deliver.
    pub next: u64,
    /// Entries that arrived ahead of `next`.
    pub pending: BTreeMap<u64, Record>,
    /// Mean gap between new entries (EWMA).
    gap: Duration,
    last_arrival: Instant,
    /// When the last repair request left, or progress was last made.
    repair_last: Instant,
    repair_attempt: u32,
    /// The repair timeout is stretched by this many percent (100 to 199),
    /// drawn anew at each request and each progress: members that lost the
    /// same message (a relay's whole subtree) must not ask the committee in
    /// the same instant (the randomised request timers of SRM, P001 §B).
    repair_jitter: u32,
    repair_target: usize,
    /// Who answered this member's latest repair request with entries that
    /// advanced its delivery: asked first next time, as long as it keeps
    /// doing so. Taking committee members in turn regardless wasted every
    /// other request on one that had left (a backup removed while this
    /// member lagged behind in a stale view), and each such request costs a
    /// repair timeout of up to a second: a member that had slept through
    /// seconds of traffic never caught up (chaos seed 382 with
    /// `committee_delivery`). An answer that brings nothing does not count:
    /// sticking to any member that answers kept members on a stale
    /// primary's side after a cut (`a_cut_during_a_view_change_converges_for_every_seed`).
    answered_by: Option<NodeId>,
    /// `next` when the latest repair request left.
    next_at_request: u64,
    /// Repair requests sent since the last answer. After
    /// `STALE_AFTER_UNANSWERED` this member's committee may be gone (its
    /// view is stale): it asks any member of its view, who passes the
    /// request on to its own primary (`Message::RepairFor`).
    unanswered: u32,
    /// A request went to a member outside the committee because this
    /// member's view may be stale (`unanswered`): the answer may come from
    /// a primary it does not know, outside its view. Until then, repair
    /// answers from outside the view are another group's
    /// (`Vsync::foreign_answer`). Cleared by the next answer.
    pub(super) asked_outside: bool,
    repair_paused_until: Instant,
    /// The highest committed frontier a repair answer reported. Below it,
    /// a member that makes no progress for a repair timeout asks again;
    /// at or above it, it only solicits once per idle interval.
    pub committed_known: u64,
    /// The last request was an idle probe (it asked for the frontier only).
    probed: bool,
    ack: Option<AckPlan>,
    /// The highest (view, epoch) this member acknowledged a Prefreshview for.
    /// It never acknowledges a lower one again, even once that ack's plan is
    /// spent (see `on_prefreshview`).
    pub(super) promised: (u64, u64),
    /// The Newview this member accepted (`Message::Accept`, Paxos' phase 2)
    /// for a view it has not installed yet, with the Accept's epoch. It is
    /// reported in the AckPrefreshview of a later proposer for that view.
    pub(super) accepted: Option<wire::Report>,
    /// The Newview this member installed last, and its gseq: reported to a
    /// proposer that asks for a view this member already has.
    installed: Option<(u64, NewView)>,
    /// The frontier last reported to the primary (`Message::Progress`), and
    /// when the next report may leave.
    progress_reported: u64,
    progress_at: Instant,
}

/// An AckPrefreshview to send.
struct AckPlan {
    view: u64,
    epoch: u64,
    primary: NodeId,
    at: Instant,
    retries_left: u32,
}

/// Unanswered repair requests after which a member suspects its view's
/// committee is gone and asks other members instead (see `unanswered`).
const STALE_AFTER_UNANSWERED: u32 = 4;

impl MemberState {
    pub fn new(now: Instant) -> MemberState {
        MemberState {
            next: 0,
            pending: BTreeMap::new(),
            gap: Duration::from_secs(1),
            last_arrival: now,
            repair_last: now,
            repair_attempt: 0,
            repair_jitter: 100,
            promised: (0, 0),
            accepted: None,
            installed: None,
            repair_target: 0,
            answered_by: None,
            next_at_request: 0,
            unanswered: 0,
            asked_outside: false,
            repair_paused_until: now,
            committed_known: 0,
            probed: false,
            ack: None,
            progress_reported: 0,
            progress_at: now,
        }
    }

    /// Delivery starts at `gseq`.
    pub fn expect_from(&mut self, gseq: u64, now: Instant) {
        self.next = gseq;
        self.pending.clear();
        self.repair_last = now;
        self.repair_attempt = 0;
    }

    fn note_arrival(&mut self, now: Instant) {
        let gap = now - self.last_arrival;
        self.gap = (self.gap * 7 + gap) / 8;
        self.last_arrival = now;
    }
}

impl Vsync {
    /// An entry of the history arrived (pbcast, repair, own store).
    pub(super) fn on_entry(&mut self, now: Instant, gseq: u64, record: Record) {
        if self.status != Status::Member {
            return;
        }
        let m = &mut self.member;
        if gseq < m.next || m.pending.contains_key(&gseq) {
            self.stats.duplicates += 1;
            return;
        }
        if gseq - m.next >= self.config.pending_max {
            return;
        }
        m.note_arrival(now);
        m.pending.insert(gseq, record);
        self.deliver_ready(now);
    }

    fn deliver_ready(&mut self, now: Instant) {
        let mut progressed = false;
        while self.status == Status::Member {
            let next = self.member.next;
            let Some(record) = self.member.pending.remove(&next) else {
                break;
            };
            self.member.next += 1;
            progressed = true;
            self.deliver(now, next, record);
        }
        if progressed {
            self.member.repair_last = now;
            self.member.repair_attempt = 0;
            self.member.repair_jitter = self.repair_rng.random_range(100..200);
        }
    }

    fn deliver(&mut self, now: Instant, gseq: u64, record: Record) {
        match record {
            Record::Data {
                sender,
                local_id,
                payload,
            } => {
                if sender == self.me {
                    self.sender.awaiting.remove(&local_id);
                    self.sender.sequenced.remove(&local_id);
                }
                self.stats.delivered += 1;
                self.events.push_back(Event::Deliver {
                    sender,
                    local_id,
                    gseq,
                    payload,
                });
            }
            Record::Newview(view) => self.install_view(now, gseq, view),
        }
    }

    fn install_view(&mut self, now: Instant, gseq: u64, v: NewView) {
        // Own messages sequenced two views ago and never delivered are
        // forgotten (the daemon engine asked about them at the last view).
        if let Some((previous, _)) = &self.member.installed {
            let previous = *previous;
            self.sender.sequenced.retain(|_, g| *g > previous);
        }
        let members = nodes(&v.members);
        if !contains(&members, self.me) {
            let reason = if v.left.contains(&self.me.0) {
                RemovedReason::Left
            } else {
                RemovedReason::Dropped
            };
            self.on_removed(v.view, reason);
            return;
        }
        let first = self.pbcast.is_none();
        if let Err(e) = self.attach_pbcast(now, &members) {
            debug_assert!(false, "pbcast refused a checked view: {e}");
        }
        let old = std::mem::take(&mut self.view.members);
        let event = view_event(&old, &v, gseq, first);
        self.view = CurrentView {
            id: v.view,
            members,
            committee: nodes(&v.committee),
        };
        self.member.ack = self.member.ack.take().filter(|a| a.view > v.view);
        self.member.accepted = self
            .member
            .accepted
            .take()
            .filter(|a| a.newview.view > v.view);
        self.member.installed = Some((gseq, v.clone()));
        self.stats.views_installed += 1;
        let backup_left_out = self
            .committee
            .as_ref()
            .is_some_and(|c| !c.is_primary() && !v.committee.contains(&self.me.0));
        // A primary still proposing this view (or an earlier one) when
        // another proposer's Newview for it arrives lost that round: its own
        // proposal is obsolete, and it leaves the committee; the new
        // primary's heartbeats re-admit it if its committee lists it.
        //
        // Unless the Newview is its own decided one: a primary that took
        // over may hold the old primary's records, that Newview among them,
        // in its member's buffer, and committing the first of them delivers
        // it before the committee exposes it (seed 1888).
        let own_decided = self.committee.as_ref().is_some_and(|c| match &c.role {
            super::committee::Role::Primary(p) => {
                p.cview_gseq == gseq && p.cview == v && p.vc.as_ref().is_some_and(|vc| vc.decided)
            }
            super::committee::Role::Backup(_) => false,
        });
        let proposal_obsolete = !own_decided
            && self
                .committee
                .as_ref()
                .and_then(|c| c.view_change())
                .is_some_and(|vc| vc.view <= v.view);
        if proposal_obsolete {
            self.stats.newviews_abandoned += 1;
        }
        if backup_left_out || proposal_obsolete {
            self.committee = None;
        }
        self.events.push_back(Event::View(event));
        if self.succeeds_leaving_primary(&v) {
            self.take_over(now);
        }
    }

    /// This backup is first in the committee of a view that its primary
    /// left by request: it takes over now rather than after a silence.
    fn succeeds_leaving_primary(&self, v: &NewView) -> bool {
        let Some(c) = self.committee.as_ref() else {
            return false;
        };
        !c.is_primary()
            && v.committee.first() == Some(&self.me.0)
            && c.list.first().is_some_and(|p| v.left.contains(&p.0))
    }

    fn attach_pbcast(
        &mut self,
        now: Instant,
        members: &[NodeId],
    ) -> Result<(), super::ConfigError> {
        match self.pbcast.as_mut() {
            Some(pb) => pb.set_members(now, members)?,
            None => {
                let config = self.config.pbcast.clone();
                let seed = self.seed ^ 0x7062_6361_7374;
                self.pbcast = Some(Pbcast::new_joining(self.me, members, config, seed, now)?);
            }
        }
        Ok(())
    }

    /// A repair, or (while joining) the welcome: the Newview that admits us.
    pub(super) fn on_repair_entry(&mut self, now: Instant, gseq: u64, entry: wire::Entry<'_>) {
        if self.status == Status::Joining {
            let wire::Entry::Newview(v) = &entry else {
                return;
            };
            if !v.members.contains(&self.me.0) {
                return;
            }
            self.status = Status::Member;
            self.member.expect_from(gseq, now);
        }
        self.on_entry(
            now,
            gseq,
            Record::from_wire(entry, bytes::Bytes::copy_from_slice),
        );
    }

    /// The end of a repair answer: ask again at once if more is committed.
    pub(super) fn on_repair_done(&mut self, now: Instant, from: NodeId, committed: u64) {
        let timeout = self.repair_timeout();
        let m = &mut self.member;
        m.unanswered = 0;
        m.asked_outside = false;
        m.answered_by = (m.next > m.next_at_request).then_some(from);
        m.committed_known = m.committed_known.max(committed);
        // A gap left after the answer (it was cut at `repair_batch_max`), or
        // an idle probe (a second without progress, so nothing is in flight)
        // that found committed entries this member lacks, a lost tail: ask
        // for them at once. Committed entries beyond what this member holds
        // after a gap request are usually still on their way by pbcast: they
        // get a repair timeout to arrive (a request for them now would make
        // every repair fetch the whole in-flight window again).
        let lost_tail = m.probed && m.pending.is_empty();
        if (!m.pending.is_empty() || lost_tail) && committed > m.next {
            m.repair_last = now.saturating_sub(timeout * 4);
            m.repair_attempt = 0;
        }
    }

    pub(super) fn on_prefreshview(&mut self, now: Instant, view: u64, epoch: u64, primary: NodeId) {
        if primary == self.me || self.status != Status::Member {
            return;
        }
        if view <= self.view.id {
            self.report_installed(view, epoch, primary);
            return;
        }
        if self
            .member
            .ack
            .as_ref()
            .is_some_and(|a| (a.view, a.epoch) >= (view, epoch))
        {
            return;
        }
        // An acknowledgement is a promise, as a Paxos promise: a member that
        // acknowledged (view, epoch) never acknowledges a lower pair, even
        // after the plan of that ack is spent (its retries sent). Before, it
        // forgot: a member that had acknowledged the primary's Prefreshview
        // for V+1 (the epoch the primary took when it dropped a silent
        // backup) but had not yet delivered its Newview also acknowledged the
        // dropped backup's own takeover Prefreshview for V+1 at a lower
        // epoch, and both gathered a majority of V
        // (`a_dropped_backup_cannot_win_acks_for_a_view_the_primary_proposed`).
        // The same pair again (a primary asking once more) is answered.
        if (view, epoch) < self.member.promised {
            self.tell_outranked(view, primary);
            return;
        }
        self.member.promised = (view, epoch);
        let max = self.config.ack_defer_max.as_nanos() as u64;
        let defer = Duration::from_nanos(self.rng.random_range(0..=max));
        self.member.ack = Some(AckPlan {
            view,
            epoch,
            primary,
            at: now + defer,
            retries_left: self.config.ack_retries,
        });
        // Every member paused at about the same moment: resuming at once,
        // their idle probes (due after a second without progress) would
        // reach the committee together, hundreds at n = 500, and overflow
        // its socket buffer while it collects acks. Spread them as the acks
        // are spread.
        let spread = Duration::from_nanos(self.repair_rng.random_range(0..=max));
        self.member.repair_paused_until = now + self.config.ack_wait + spread;
    }

    /// A proposer asks for a view this member already installed (it is
    /// stale: cut off, or asleep, when the view was chosen). The answer
    /// tells it which Newview was chosen, so that it cannot choose another
    /// (docs/vsync.md, "Newviews chosen by a majority").
    fn report_installed(&mut self, view: u64, epoch: u64, primary: NodeId) {
        let Some((gseq, newview)) = self.member.installed.clone() else {
            return;
        };
        let report = wire::Report {
            epoch: wire::INSTALLED,
            gseq,
            newview,
        };
        let message = Message::AckPrefreshview {
            view,
            epoch,
            next: self.member.next,
            report: Some(report),
        };
        self.stats.acks_prefreshview_sent += 1;
        self.send(primary, &message);
    }

    /// Paxos' phase 2 at a member: accept the Newview unless this member
    /// promised a higher (view, epoch) or already installed that view.
    pub(super) fn on_accept(&mut self, from: NodeId, epoch: u64, gseq: u64, newview: NewView) {
        let view = newview.view;
        if from == self.me || self.status != Status::Member {
            return;
        }
        if view <= self.view.id {
            // Installed already: that Newview was chosen. A proposer
            // completing the same one (a backup that took over without
            // having seen it delivered) counts this member as accepting.
            if self.member.installed.as_ref() == Some(&(gseq, newview)) {
                self.send(from, &Message::Accepted { view, epoch });
            }
            return;
        }
        if (view, epoch) < self.member.promised {
            self.tell_outranked(view, from);
            return;
        }
        self.member.promised = (view, epoch);
        self.member.accepted = Some(wire::Report {
            epoch,
            gseq,
            newview,
        });
        self.send(from, &Message::Accepted { view, epoch });
    }

    /// A proposer for `view` asked below this member's promise for that
    /// view: tell it the epoch to outrank. The proposer that got the promise
    /// may have abandoned the view change (viewchange.rs), and without this
    /// answer the other would ask at its old epoch for ever.
    fn tell_outranked(&mut self, view: u64, proposer: NodeId) {
        let (promised_view, epoch) = self.member.promised;
        if promised_view == view {
            self.send(proposer, &Message::Outranked { view, epoch });
        }
    }

    /// The current repair timeout (see the module docs).
    fn repair_timeout(&self) -> Duration {
        let c = &self.config;
        let base = (self.member.gap * c.repair_gap_factor.get())
            .clamp(c.repair_timeout_min, c.repair_timeout_max);
        let backoff = 1u32 << self.member.repair_attempt.min(10);
        (base * backoff * self.member.repair_jitter / 100).min(c.repair_timeout_max)
    }

    fn repair_due(&self) -> Option<Instant> {
        if self.status != Status::Member {
            return None;
        }
        let m = &self.member;
        let wait = if m.pending.is_empty() && m.next >= m.committed_known {
            self.config.idle_solicit_interval
        } else {
            self.repair_timeout()
        };
        Some((m.repair_last + wait).max(m.repair_paused_until))
    }

    pub(super) fn member_deadline(&self) -> Option<Instant> {
        let ack = self.member.ack.as_ref().map(|a| a.at);
        let progress = self.progress_due();
        self.repair_due()
            .into_iter()
            .chain(ack)
            .chain(progress)
            .min()
    }

    /// When this member should next report its delivery frontier: only
    /// while it advances, and only to a primary other than itself.
    fn progress_due(&self) -> Option<Instant> {
        let m = &self.member;
        let reporting = !self.config.progress_interval.is_zero()
            && self.status == Status::Member
            && m.next > m.progress_reported
            && self.view.committee.first().is_some_and(|p| *p != self.me);
        reporting.then_some(m.progress_at)
    }

    fn send_progress(&mut self, now: Instant) {
        let Some(primary) = self.view.committee.first().copied() else {
            return;
        };
        let m = &mut self.member;
        m.progress_reported = m.next;
        m.progress_at = now + self.config.progress_interval;
        let message = Message::Progress { next: m.next };
        self.send(primary, &message);
    }

    pub(super) fn on_member_timers(&mut self, now: Instant) {
        if self.member.ack.as_ref().is_some_and(|a| a.at <= now) {
            self.send_ack_prefreshview(now);
        }
        if self.repair_due().is_some_and(|t| t <= now) {
            self.send_repair_request(now);
        }
        if self.progress_due().is_some_and(|t| t <= now) {
            self.send_progress(now);
        }
    }

    fn send_ack_prefreshview(&mut self, now: Instant) {
        let Some(ack) = self.member.ack.as_mut() else {
            return;
        };
        let report = self
            .member
            .accepted
            .clone()
            .filter(|a| a.newview.view == ack.view);
        let message = Message::AckPrefreshview {
            view: ack.view,
            epoch: ack.epoch,
            next: self.member.next,
            report,
        };
        let to = ack.primary;
        if ack.retries_left == 0 {
            self.member.ack = None;
        } else {
            ack.retries_left -= 1;
            ack.at = now + self.config.ack_retry_after;
        }
        self.stats.acks_prefreshview_sent += 1;
        self.send(to, &message);
    }

    fn send_repair_request(&mut self, now: Instant) {
        let m = &mut self.member;
        m.repair_last = now;
        m.repair_attempt = m.repair_attempt.saturating_add(1);
        m.repair_jitter = self.repair_rng.random_range(100..200);
        let batch = u64::from(self.config.repair_batch_max.get());
        // `upto`: the end of the gap this member knows of; a batch when an
        // earlier answer reported committed entries that have not come since;
        // otherwise (the idle probe of P000 §6.4) nothing but the committed
        // frontier, so that a probe does not fetch what pbcast is still
        // delivering.
        let upto = match m.pending.keys().next() {
            Some(first) => first.saturating_sub(1),
            None if m.next < m.committed_known => m.next + batch - 1,
            None => m.next.saturating_sub(1),
        };
        m.probed = m.pending.is_empty() && m.next >= m.committed_known;
        m.next_at_request = m.next;
        let message = Message::RepairReq { next: m.next, upto };
        let stale = m.unanswered >= STALE_AFTER_UNANSWERED;
        let answered = m.unanswered == 0;
        m.unanswered = m.unanswered.saturating_add(1);
        let Some(target) = self.repair_target(stale, answered) else {
            return;
        };
        self.member.asked_outside |= stale;
        self.stats.repair_requests_sent += 1;
        self.send(target, &message);
    }

    /// The member whose answer to the previous request advanced this
    /// member's delivery, if that request was answered (`answered`) and it is
    /// still in the pool; otherwise committee members in turn, not this
    /// member, or, when this member's view may be stale (`anyone`), any
    /// member of it in turn.
    fn repair_target(&mut self, anyone: bool, answered: bool) -> Option<NodeId> {
        let me = self.me;
        let pool = if anyone {
            &self.view.members
        } else {
            &self.view.committee
        };
        if let Some(last) = self
            .member
            .answered_by
            .filter(|n| answered && pool.contains(n))
        {
            return Some(last);
        }
        let others: Vec<NodeId> = pool.iter().copied().filter(|m| *m != me).collect();
        if others.is_empty() {
            return None;
        }
        self.member.repair_target = self.member.repair_target.wrapping_add(1);
        Some(others[self.member.repair_target % others.len()])
    }
}

/// The application's view event for Newview `v` at `gseq`.
fn view_event(old: &[NodeId], v: &NewView, gseq: u64, first: bool) -> View {
    let members = nodes(&v.members);
    let joined: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|m| !contains(old, *m))
        .collect();
    let left = nodes(&v.left);
    let failed: Vec<NodeId> = old
        .iter()
        .copied()
        .filter(|m| !contains(&members, *m) && !contains(&left, *m))
        .collect();
    let reason = [
        (wire::REASON_FAILURE, ViewReason::Failure),
        (wire::REASON_LEAVE, ViewReason::Leave),
        (wire::REASON_JOIN, ViewReason::Join),
        (wire::REASON_COMMITTEE, ViewReason::Committee),
    ]
    .into_iter()
    .find(|(bit, _)| v.reasons & bit != 0)
    .map_or(ViewReason::Periodic, |(_, r)| r);
    View {
        id: v.view,
        members,
        committee: nodes(&v.committee),
        gseq,
        joined: if first { Vec::new() } else { joined },
        left,
        failed,
        reason,
        first,
    }
}
