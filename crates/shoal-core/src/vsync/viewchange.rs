//! View changes, driven by the committee's primary (P000 §5.2, Fig 8):
//! Prefreshview by pbcast, AckPrefreshview for `ack_wait`, a decision, and a
//! Newview that takes the next gseq and is replicated like data before it is
//! pbcast. Gseq Reqs are held from the Prefreshview until the Newview
//! commits. Members that did not acknowledge are dropped; joiners get the
//! Newview as their welcome. Collection: the store keeps nothing below the
//! lowest progress the acknowledging members reported, nor below the
//! Newview (the checkpoint).
//!
//! Newviews chosen by a majority (docs/vsync.md). Whenever more than one
//! committee member could be proposing (a committee of two or more, or a
//! primary that took over or dropped backups), the Prefreshview round is
//! Paxos' phase 1: a member's AckPrefreshview is a promise and reports the
//! Newview it accepted, or installed, for that view. If one is reported the
//! primary may only propose that same Newview (which it can when its store
//! holds it and the log before it) and otherwise abandons the change. The
//! Newview it decides is then sent to the members who acknowledged
//! (`Message::Accept`, phase 2), and it commits only once a majority of the
//! old view accepted it. Two primaries on two sides of a cut can then no
//! longer both install a view V+1: whichever majority comes second learns
//! of the first Newview, or refuses the second proposer's.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use shoal_wire::vsync::{self as wire, Carried, Entry, Message, NewView, Report};

use super::committee::{Candidate, Role};
use super::{nodes, Record, Vsync};
use crate::engine::NodeId;
use crate::time::Instant;

pub(super) struct ViewChange {
    pub view: u64,
    /// Times this primary asked again for want of a majority
    /// (`retry_without_quorum`; [`super::Vsync::view_change_unanswered`]).
    pub unanswered: u32,
    pub deadline: Instant,
    /// Who acknowledged, and the next gseq each had to deliver.
    pub acks: BTreeMap<NodeId, u64>,
    pub reasons: u8,
    pub decided: bool,
    /// The members of the view this change starts from (the quorum's base).
    pub old: Vec<u32>,
    /// Newviews the acknowledging members reported (accepted or installed).
    pub reports: BTreeMap<NodeId, Report>,
    /// Phase 2 under way: the decided Newview waits for a majority of `old`
    /// to accept it (`accepts`); `deadline` is when the Accepts go again.
    pub accepting: bool,
    pub accepts: BTreeSet<NodeId>,
    /// A member promised this epoch to a rival proposer; this primary
    /// outranks it when `deadline` comes (`on_outranked`).
    pub outranked: Option<u64>,
    /// What `decide_view` replaced, so that a decided Newview nobody is
    /// known to have accepted can be set aside at a new epoch
    /// (`set_aside_unchosen`).
    pub prior: Option<Prior>,
    /// This primary's decided Newview was set aside at a new epoch: it
    /// is finishing the view as if it were still decided
    /// (`Committee::finishing_view`).
    pub set_aside: bool,
    /// Members of `old` heard from (any datagram) since the change began
    /// without having acknowledged yet (`Config::ask_heard_again`).
    pub heard: BTreeSet<NodeId>,
    /// The heard, silent members were asked once more (`ask_heard_again`).
    pub asked_again: bool,
}

/// The primary's state before `decide_view` took its decision.
pub(super) struct Prior {
    pub cview: NewView,
    pub cview_gseq: u64,
    pub taken: Taken,
}

/// The joins and leaves a decided Newview took in; given back if another
/// Newview is decided instead (`Candidate::taken`).
pub(super) struct Taken {
    pub joins: BTreeSet<NodeId>,
    pub leaves: BTreeSet<NodeId>,
    pub grow_for_leave: bool,
}

/// What a majority's reports allow the primary to propose.
enum Verdict {
    /// Nobody reported a Newview for this view: any value.
    Free,
    /// The value reported with the highest epoch, which this primary holds
    /// (its own decided Newview, or a takeover's candidate).
    Same,
    /// Another proposer's Newview, which this primary cannot complete.
    Abandon,
}

impl Vsync {
    /// Asks for a view change soon (at once for committee changes).
    pub(super) fn request_view_change(&mut self, now: Instant, reasons: u8) {
        let delay = self.config.change_delay;
        let Some(p) = self.primary_mut() else {
            return;
        };
        if let Some(vc) = p.vc.as_mut().filter(|vc| !vc.decided) {
            vc.reasons |= reasons;
            return;
        }
        p.pending_reasons |= reasons;
        let at = if reasons & wire::REASON_COMMITTEE != 0 {
            now
        } else {
            now + delay
        };
        p.change_at = Some(p.change_at.map_or(at, |t| t.min(at)));
    }

    pub(super) fn on_view_timers(&mut self, now: Instant) {
        let Some(p) = self.primary_mut() else {
            return;
        };
        let fenced = p.fence.is_some();
        match &p.vc {
            Some(vc) if (!vc.decided || fenced || vc.outranked.is_some()) && vc.deadline <= now => {
                if let Some(rival) = vc.outranked {
                    self.outrank(now, rival);
                } else if vc.accepting {
                    self.send_accepts(now);
                } else if self.has_quorum() {
                    if !self.ask_heard_again(now) {
                        self.on_quorum(now);
                    }
                } else {
                    self.retry_without_quorum(now);
                }
            }
            None if p.next_view_at <= now || p.change_at.is_some_and(|t| t <= now) => {
                let periodic = if p.next_view_at <= now {
                    wire::REASON_PERIODIC
                } else {
                    0
                };
                let reasons = std::mem::take(&mut p.pending_reasons) | periodic;
                self.start_view_change(now, reasons);
            }
            _ => {}
        }
    }

    /// A primary's phase 1 for the next view. Its own acknowledgement is a
    /// promise like any member's; it counts unless it promised more.
    fn start_view_change(&mut self, now: Instant, reasons: u8) {
        let (me, wait) = (self.me, self.config.ack_wait);
        let Some((view, epoch)) = self
            .primary_mut()
            .map(|p| p.cview.view + 1)
            .zip(self.epoch())
        else {
            return;
        };
        let acks = self.own_ack(view, epoch);
        let reports = self.own_report(view, &acks);
        let Some(p) = self.primary_mut() else {
            return;
        };
        p.change_at = None;
        p.vc = Some(ViewChange {
            view,
            unanswered: 0,
            deadline: now + wait,
            acks,
            reasons,
            decided: false,
            old: p.cview.members.clone(),
            reports,
            accepting: false,
            accepts: BTreeSet::new(),
            outranked: None,
            prior: None,
            set_aside: false,
            heard: BTreeSet::new(),
            asked_again: false,
        });
        let prefresh = Carried::Prefreshview {
            view,
            epoch,
            primary: me.0,
        };
        self.pbcast_carried(now, &prefresh);
    }

    /// A view change may only proceed with acknowledgements from a strict
    /// majority of the current view (the primary's own included): the
    /// group has one primary component. Without it, a backup that falsely
    /// suspected a live primary (it slept, or lost its heartbeats) could
    /// take over and form a view of its own beside the real one, and the
    /// two would assign the same gseqs to different messages (chaos seed
    /// 1498). P000 does not discuss partitions; this is Isis's primary
    /// partition rule.
    fn has_quorum(&mut self) -> bool {
        let Some(p) = self.primary_mut() else {
            return false;
        };
        let Some(vc) = p.vc.as_ref() else {
            return false;
        };
        let old = &vc.old;
        let acked = old
            .iter()
            .filter(|m| vc.acks.contains_key(&NodeId(**m)))
            .count();
        2 * acked > old.len()
    }

    /// No majority acknowledged: ask again, for as long as it takes. A
    /// primary cut off from a majority decides nothing meanwhile, and holds
    /// Gseq Reqs, so it sequences nothing either; once the cut heals it
    /// gathers its majority, or it hears of a higher epoch (a takeover on
    /// the majority side) and steps down then (`committee.rs`). It used to
    /// give up the role after three ack waits when k > 1. With k = 1 that
    /// left the group with no sequencer for good (found by
    /// `guarantees_hold_across_network_cuts`); with k = 3 it did too when
    /// every committee member of a view formed during a cut gave up before
    /// the cut healed (`a_cut_during_a_view_change_converges_for_every_seed`:
    /// 55 of 60 seeds never converged).
    fn retry_without_quorum(&mut self, now: Instant) {
        let wait = self.config.ack_wait;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let epoch = c.epoch;
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let Some(vc) = p.vc.as_mut() else {
            return;
        };
        vc.deadline = now + wait;
        vc.unanswered += 1;
        let view = vc.view;
        // Also to each member that has not answered, directly: one that
        // moved on without this primary (it was cut off with a minority
        // while the rest changed view) no longer takes its pbcast, and its
        // answer, the view it installed, is what ends this proposal
        // (`on_ack_prefreshview`; cut seed 2445, k = 3).
        // And to the members of a takeover's candidate Newview that were
        // not in the old view (daemons it admitted): one that installed it
        // proves it was chosen, where the old view's survivors may be no
        // majority (its primary left after installing it, a member had
        // crashed; swarm seed 1888).
        let admitted = p
            .candidate
            .as_ref()
            .map(|c| c.newview.members.clone())
            .unwrap_or_default();
        let silent: Vec<NodeId> = nodes(&vc.old)
            .into_iter()
            .chain(
                nodes(&admitted)
                    .into_iter()
                    .filter(|m| !vc.old.contains(&m.0)),
            )
            .filter(|m| *m != self.me && !vc.acks.contains_key(m))
            .collect();
        let prefresh = Carried::Prefreshview {
            view,
            epoch,
            primary: self.me.0,
        };
        self.pbcast_carried(now, &prefresh);
        self.ask_directly(view, epoch, silent);
    }

    /// Sends the Prefreshview for (view, epoch) to each of `members`
    /// point to point, past pbcast.
    fn ask_directly(&mut self, view: u64, epoch: u64, members: Vec<NodeId>) {
        let direct = Message::Prefreshview { view, epoch };
        for m in members {
            self.send(m, &direct);
        }
    }

    /// Notes that `from` was heard while a view change gathers
    /// acknowledgements (`Config::ask_heard_again`).
    pub(super) fn note_heard(&mut self, from: NodeId) {
        if !self.config.ask_heard_again {
            return;
        }
        let Some(vc) = self.primary_mut().and_then(|p| p.vc.as_mut()) else {
            return;
        };
        if !vc.decided && !vc.acks.contains_key(&from) && vc.old.contains(&from.0) {
            vc.heard.insert(from);
        }
    }

    /// The deadline came with a majority: members that did not acknowledge
    /// but were heard from meanwhile are alive and lost their acks (an ack
    /// and its retry, both lost: swarm seed 209). Asks them once more,
    /// directly, and waits one more `ack_wait`; true if it did. Once per
    /// view change, so that a member that hears nothing (a one-way cut)
    /// delays the view by one `ack_wait` at most.
    fn ask_heard_again(&mut self, now: Instant) -> bool {
        if !self.config.ask_heard_again {
            return false;
        }
        let wait = self.config.ack_wait;
        let Some((view, epoch)) = self.change_under_way() else {
            return false;
        };
        let Some(p) = self.primary_mut() else {
            return false;
        };
        let leaves = &p.leaves;
        let Some(vc) = p.vc.as_mut().filter(|vc| !vc.asked_again && !vc.decided) else {
            return false;
        };
        let silent: Vec<NodeId> = vc
            .heard
            .iter()
            .copied()
            .filter(|m| !vc.acks.contains_key(m) && !leaves.contains(m))
            .collect();
        if silent.is_empty() {
            return false;
        }
        vc.asked_again = true;
        vc.deadline = now + wait;
        self.stats.view_acks_asked_again += silent.len() as u64;
        self.ask_directly(view, epoch, silent);
        true
    }

    /// The (view, epoch) of this primary's view change under way.
    fn change_under_way(&mut self) -> Option<(u64, u64)> {
        self.primary_mut()
            .and_then(|p| p.vc.as_ref())
            .map(|vc| vc.view)
            .zip(self.epoch())
    }

    fn epoch(&self) -> Option<u64> {
        self.committee.as_ref().map(|c| c.epoch)
    }

    /// This primary's member side promises (view, epoch), as an acceptor,
    /// unless it promised a higher pair to another proposer.
    fn promise_own(&mut self, view: u64, epoch: u64) -> Option<()> {
        if (view, epoch) < self.member.promised {
            return None;
        }
        self.member.promised = (view, epoch);
        Some(())
    }

    /// A phase 1's acknowledgements to start from: this primary's own, if
    /// it may promise (`promise_own`), with its delivery frontier.
    fn own_ack(&mut self, view: u64, epoch: u64) -> BTreeMap<NodeId, u64> {
        let (me, next) = (self.me, self.member.next);
        self.promise_own(view, epoch)
            .map(|()| (me, next))
            .into_iter()
            .collect()
    }

    /// The Newview for `view` this primary's member side accepted, as any
    /// acknowledging member reports it: its own acknowledgement counts
    /// towards the majority, so its report must count for the value too.
    /// Left out, a backup that took over after accepting the old primary's
    /// Newview (chosen by it, the old primary and a third member) heard
    /// from a majority that reported nothing else and chose a second
    /// Newview for the same view (swarm seed 655, harshest shape).
    fn own_report(&self, view: u64, acks: &BTreeMap<NodeId, u64>) -> BTreeMap<NodeId, Report> {
        let accepted = self.member.accepted.as_ref();
        accepted
            .filter(|r| r.newview.view == view && acks.contains_key(&self.me))
            .map(|r| (self.me, r.clone()))
            .into_iter()
            .collect()
    }

    /// A majority of the old view acknowledged. Without a possible rival
    /// proposer (a committee of one that neither took over nor dropped a
    /// backup) the Newview commits like any record; otherwise it is chosen
    /// by Paxos' phase 2 first (module docs).
    fn on_quorum(&mut self, now: Instant) {
        let by_majority = self.newviews_by_majority();
        let Some(p) = self.primary_mut() else {
            return;
        };
        let decided = p.vc.as_ref().is_some_and(|vc| vc.decided);
        if !by_majority {
            p.fence = None;
            if decided {
                self.try_commit(now);
            } else {
                self.decide_view(now);
            }
            return;
        }
        match self.verdict() {
            Verdict::Abandon => self.abandon_view_change(),
            Verdict::Same if !decided => {
                self.adopt_candidate(now);
                self.send_accepts(now);
            }
            Verdict::Same | Verdict::Free => {
                if !decided {
                    // The Newview must not commit before a majority accepted it.
                    if let Some(p) = self.primary_mut() {
                        p.fence = Some(p.fence.unwrap_or(u64::MAX).min(p.next_gseq));
                        // A Newview of its own set aside and reported by
                        // nobody: the joins and leaves it took in go into
                        // the one decided now.
                        if let Some(taken) = p.candidate.take_if(|c| c.taken.is_some()) {
                            let taken = taken.taken.expect("filtered");
                            p.joins.extend(taken.joins);
                            p.leaves.extend(taken.leaves);
                            p.grow_for_leave |= taken.grow_for_leave;
                        }
                    }
                    self.decide_view(now);
                }
                self.send_accepts(now);
            }
        }
    }

    /// Whether this primary's Newviews must be accepted by a majority.
    pub(super) fn newviews_by_majority(&self) -> bool {
        self.committee.as_ref().is_some_and(|c| match &c.role {
            Role::Primary(p) => p.contested || c.list.len() > 1,
            Role::Backup(_) => false,
        })
    }

    /// Paxos' rule for the value: the Newview reported with the highest
    /// epoch, if any, is the only one this primary may propose.
    fn verdict(&self) -> Verdict {
        let Some(c) = self.committee.as_ref() else {
            return Verdict::Abandon;
        };
        let Role::Primary(p) = &c.role else {
            return Verdict::Abandon;
        };
        let Some(vc) = p.vc.as_ref() else {
            return Verdict::Abandon;
        };
        let Some(highest) = vc.reports.values().max_by_key(|r| r.epoch) else {
            return Verdict::Free;
        };
        let held = if vc.decided {
            highest.gseq == p.cview_gseq && highest.newview == p.cview
        } else {
            p.candidate.as_ref().is_some_and(|cand| {
                cand.gseq == highest.gseq
                    && cand.newview == highest.newview
                    && (cand.taken.is_some() || c.holds_log_of(cand.gseq, cand.epoch))
            })
        };
        if held {
            Verdict::Same
        } else {
            Verdict::Abandon
        }
    }

    /// Another proposer's Newview may have been chosen for this view, and
    /// this primary does not hold it: it must not choose another, so it
    /// leaves the committee (deciding nothing cannot break agreement). The
    /// other proposer, or a member of its committee that holds its log,
    /// completes the view; this member installs it, or learns it was
    /// removed, as any member does.
    fn abandon_view_change(&mut self) {
        self.committee = None;
        self.stats.newviews_abandoned += 1;
    }

    /// A takeover's candidate (the Newview its store ended with, not known
    /// to be committed) is the value a majority reported: it becomes this
    /// primary's decided Newview again, at the same gseq.
    fn adopt_candidate(&mut self, now: Instant) {
        let Some(p) = self.primary_mut() else {
            return;
        };
        let Some(cand) = p.candidate.take() else {
            return;
        };
        if let Some(vc) = p.vc.as_mut() {
            vc.decided = true;
        }
        debug_assert_eq!(p.next_gseq, cand.gseq);
        self.assign(now, Record::Newview(cand.newview));
    }

    /// Phase 2: the decided Newview to the members that acknowledged (again,
    /// to those that have not accepted yet, each `ack_wait`).
    fn send_accepts(&mut self, now: Instant) {
        let (me, wait) = (self.me, self.config.ack_wait);
        let Some(epoch) = self.epoch() else {
            return;
        };
        let Some(p) = self.primary_mut() else {
            return;
        };
        let (gseq, newview) = (p.cview_gseq, p.cview.clone());
        let Some(vc) = p.vc.as_mut() else {
            return;
        };
        // First to the members that acknowledged (known to be there); when
        // asking again, to every member of the old view: an acknowledger
        // may have crashed since, and any member that promised nothing
        // higher may accept.
        let resend = std::mem::replace(&mut vc.accepting, true);
        vc.deadline = now + wait;
        let pool: Vec<NodeId> = if resend {
            nodes(&vc.old)
        } else {
            vc.acks.keys().copied().collect()
        };
        let to: Vec<NodeId> = pool
            .into_iter()
            .filter(|m| *m != me && !vc.accepts.contains(m))
            .collect();
        let own = self.promise_own(newview.view, epoch).is_some();
        if own {
            self.member.accepted = Some(Report {
                epoch,
                gseq,
                newview: newview.clone(),
            });
            if let Some(vc) = self.primary_mut().and_then(|p| p.vc.as_mut()) {
                vc.accepts.insert(me);
            }
        }
        let accept = Message::Accept {
            epoch,
            gseq,
            newview,
        };
        for m in to {
            self.send(m, &accept);
        }
        self.check_accepted(now);
    }

    pub(super) fn on_accepted(&mut self, now: Instant, from: NodeId, view: u64, epoch: u64) {
        if self.epoch() != Some(epoch) {
            return;
        }
        let Some(vc) = self.primary_mut().and_then(|p| p.vc.as_mut()) else {
            return;
        };
        if vc.view == view && vc.accepting {
            vc.accepts.insert(from);
            self.check_accepted(now);
        }
    }

    /// A member promised a higher epoch for this view than this primary's
    /// (a rival proposer's, across a cut): after a backoff, this primary
    /// outranks it (`outrank`).
    pub(super) fn on_outranked(&mut self, now: Instant, view: u64, epoch: u64) {
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let Some(vc) = p.vc.as_mut().filter(|vc| vc.view == view) else {
            return;
        };
        if epoch <= c.epoch.max(vc.outranked.unwrap_or(0)) {
            return;
        }
        // Not at once: two live primaries that outrank each other at once
        // never finish a phase (Paxos' duelling proposers). A random wait
        // of one to three ack waits lets one of them finish.
        let wait = self.config.ack_wait;
        let backoff = wait + wait.mul_f64(self.rng.random_range(0.0..2.0));
        // The first rival epoch sets the wait; higher ones heard meanwhile
        // (a rival's heartbeats) only raise the epoch to outrank, or the
        // wait would never end.
        if vc.outranked.is_none() {
            vc.deadline = vc.deadline.max(now + backoff);
        }
        vc.outranked = Some(epoch);
    }

    /// The backoff after `on_outranked` is over: an epoch above the rival's,
    /// and phase 1 again. The backups re-acknowledge at the new epoch, as
    /// after a drop.
    fn outrank(&mut self, now: Instant, rival: u64) {
        let me = self.me;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        c.epoch = super::committee::next_epoch(rival.max(c.epoch), 1, me);
        p.contested = true;
        let (list, base) = (c.list.clone(), c.base);
        p.reset_backups(&list, base, now);
        // Phase 1 first: it may set the decided Newview aside, which must
        // not be replicated at the new epoch (`set_aside_unchosen`).
        self.restart_view_change(now);
        self.send_heartbeats();
    }

    /// A majority of the old view accepted: the Newview is chosen, and
    /// commits as soon as the backups hold it.
    fn check_accepted(&mut self, now: Instant) {
        let Some(p) = self.primary_mut() else {
            return;
        };
        let Some(vc) = p.vc.as_mut().filter(|vc| vc.accepting) else {
            return;
        };
        let accepted = vc
            .old
            .iter()
            .filter(|m| vc.accepts.contains(&NodeId(**m)))
            .count();
        if 2 * accepted > vc.old.len() {
            vc.accepting = false;
            p.fence = None;
            self.try_commit(now);
        }
    }

    pub(super) fn on_ack_prefreshview(
        &mut self,
        now: Instant,
        from: NodeId,
        (view, epoch, next): (u64, u64, u64),
        report: Option<Report>,
    ) {
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        // Only acknowledgements of this primary's current epoch count: an
        // older one is a promise that a dropped backup's takeover outranks.
        if epoch != c.epoch {
            return;
        }
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let open = |vc: &ViewChange| vc.view == view && (!vc.decided || p.fence.is_some());
        let Some(vc) = p.vc.as_mut().filter(|vc| open(vc)) else {
            return;
        };
        vc.acks.insert(from, next);
        let Some(report) = report.filter(|r| r.newview.view >= view) else {
            return;
        };
        let installed = report.epoch == wire::INSTALLED;
        vc.reports.insert(from, report);
        // A view installed elsewhere was chosen: if it is not this
        // primary's to complete, waiting for a majority only delays the
        // inevitable (and may never end: members that promised a later
        // view do not answer this proposer's Prefreshviews).
        match self.verdict() {
            Verdict::Abandon if installed => self.abandon_view_change(),
            Verdict::Same if installed => self.complete_installed_candidate(now),
            _ => {}
        }
    }

    /// A member reported that it installed the Newview this primary's
    /// takeover set aside as its candidate: that Newview was chosen (a
    /// member installs only a committed Newview). It is this primary's to
    /// complete, at once, without a majority of the old view: the old
    /// view's survivors may be no majority of it (seed 1888: its primary
    /// installed a view admitting two daemons and left; a member had
    /// crashed; the two that stayed could never outnumber the two gone).
    fn complete_installed_candidate(&mut self, now: Instant) {
        let Some(p) = self.primary_mut() else {
            return;
        };
        if p.candidate.is_none() || p.vc.as_ref().is_none_or(|vc| vc.decided) {
            return;
        }
        self.adopt_candidate(now);
        let Some(p) = self.primary_mut() else {
            return;
        };
        if let Some(vc) = p.vc.as_mut() {
            vc.accepting = false;
        }
        p.fence = None;
        self.try_commit(now);
    }

    /// A new epoch (backups dropped, or a rival outranked) starts phase 1
    /// again. If this primary's decided Newview is in phase 2 and not
    /// accepted by a majority, and its own member side accepted nothing for
    /// that view, it is set aside as the candidate, as a takeover sets aside
    /// the Newview its store ends with: the new phase 1 decides (Paxos,
    /// docs/vsync.md "Newviews chosen by a majority"). If a member reports
    /// it, it is proposed again, unchanged; if nobody of the new majority
    /// accepted it, it cannot have been chosen, and the view is decided
    /// afresh from this round's acknowledgements. Before, the old decision
    /// went on to phase 2 with the members of the round that made it: in a
    /// view of three, a Newview decided while one member slept named the
    /// other, which crashed before accepting; once the sleeper woke and
    /// accepted, the view of two installed named the dead member and
    /// dropped the live one, and with a majority of two needing both it
    /// installed nothing more (swarm seed 3125).
    fn set_aside_unchosen(&mut self) {
        let own_accepted = self.member.accepted.as_ref().map(|a| a.newview.view);
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let committed = c.committed;
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let Some(vc) = p.vc.as_mut() else {
            return;
        };
        let unchosen = vc.decided && vc.accepting && own_accepted != Some(vc.view);
        let gseq = p.cview_gseq;
        let stored = c.store.get(&gseq).map(|s| (&s.record, s.epoch));
        let Some((Record::Newview(newview), epoch)) = stored else {
            return;
        };
        if !unchosen
            || vc.prior.is_none()
            || newview.view != vc.view
            || p.next_gseq != gseq + 1
            || committed > gseq
        {
            return;
        }
        let (newview, prior) = (newview.clone(), vc.prior.take().expect("checked"));
        c.store.remove(&gseq);
        p.next_gseq = gseq;
        p.cview = prior.cview;
        p.cview_gseq = prior.cview_gseq;
        p.candidate = Some(Candidate {
            gseq,
            newview,
            epoch,
            taken: Some(prior.taken),
        });
        vc.decided = false;
        vc.set_aside = true;
    }

    /// After dropping backups (a new epoch), a view change under way asks
    /// again at the new epoch: acknowledgements of the old one do not count
    /// towards lifting the fence (`Primary::fence`).
    pub(super) fn restart_view_change(&mut self, now: Instant) {
        self.set_aside_unchosen();
        let (me, wait) = (self.me, self.config.ack_wait);
        let Some((view, epoch)) = self.change_under_way() else {
            return;
        };
        let acks = self.own_ack(view, epoch);
        let reports = self.own_report(view, &acks);
        let Some(vc) = self.primary_mut().and_then(|p| p.vc.as_mut()) else {
            return;
        };
        vc.acks = acks;
        vc.reports = reports;
        vc.accepts.clear();
        vc.accepting = false;
        vc.outranked = None;
        vc.deadline = now + wait;
        let prefresh = Carried::Prefreshview {
            view: vc.view,
            epoch,
            primary: me.0,
        };
        self.pbcast_carried(now, &prefresh);
    }

    /// The ack wait is over: decide the next view and sequence its Newview.
    fn decide_view(&mut self, now: Instant) {
        let (me, k) = (self.me, self.config.committee_size.get() as usize);
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let (epoch, list) = (c.epoch, c.list.clone());
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let Some(vc) = p.vc.as_mut() else {
            return;
        };
        vc.decided = true;
        vc.set_aside = false;
        let grow_for_leave = p.grow_for_leave;
        // A committee of one whose primary asked to leave takes a backup in.
        let k = if p.grow_for_leave { k.max(2) } else { k };
        let old = nodes(&p.cview.members);
        let joins = std::mem::take(&mut p.joins);
        let leaves: BTreeSet<NodeId> = std::mem::take(&mut p.leaves)
            .into_iter()
            .filter(|l| old.contains(l))
            .collect();
        let mut members: BTreeSet<NodeId> = old
            .iter()
            .copied()
            .filter(|m| vc.acks.contains_key(m) || list.contains(m))
            .filter(|m| !leaves.contains(m))
            .collect();
        if !leaves.contains(&me) {
            members.insert(me);
        }
        members.extend(joins.iter().copied().filter(|j| !old.contains(j)));
        let committee = choose_committee(&list, &members, &joins, k);
        if committee.len() >= 2 {
            p.grow_for_leave = false;
        }
        let mut reasons = vc.reasons;
        if old
            .iter()
            .any(|m| !members.contains(m) && !leaves.contains(m))
        {
            reasons |= wire::REASON_FAILURE;
        }
        if !leaves.is_empty() {
            reasons |= wire::REASON_LEAVE;
        }
        if members.iter().any(|m| !old.contains(m)) {
            reasons |= wire::REASON_JOIN;
        }
        if committee != list {
            reasons |= wire::REASON_COMMITTEE;
        }
        let newview = NewView {
            view: vc.view,
            epoch,
            members: members.iter().map(|m| m.0).collect(),
            committee: committee.iter().map(|m| m.0).collect(),
            left: leaves.iter().map(|m| m.0).collect(),
            reasons,
        };
        vc.prior = Some(Prior {
            cview: p.cview.clone(),
            cview_gseq: p.cview_gseq,
            taken: Taken {
                joins,
                leaves,
                grow_for_leave,
            },
        });
        self.assign(now, Record::Newview(newview));
    }

    /// A committed Newview: pbcast it, welcome joiners, end the view change,
    /// collect, and switch to the new committee.
    pub(super) fn expose_newview(&mut self, now: Instant, gseq: u64, v: &NewView) {
        let carried = Carried::Sequenced {
            gseq,
            entry: Entry::Newview(v.clone()),
        };
        self.pbcast_carried(now, &carried);
        let welcome = Message::Entry {
            gseq,
            entry: Entry::Newview(v.clone()),
        };
        // A primary that lets itself go sends it to every member too: it
        // goes quiet now, and a member that missed the pbcast (its successor
        // above all) would otherwise learn the view from no committee member
        // that had installed it (swarm seed 184 with QSM: the successor
        // missed it, the other backup installed it, and the group was left
        // with no committee).
        let leaving = v.left.contains(&self.me.0);
        for member in nodes(&v.members) {
            if leaving || !super::contains(&self.view.members, member) {
                self.send(member, &welcome);
            }
        }
        let (me, period, delay) = (self.me, self.config.view_period, self.config.change_delay);
        let k = self.config.committee_size.get() as usize;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        p.welcome = Some((gseq, v.clone()));
        let Some(vc) = p.vc.take_if(|vc| vc.view <= v.view) else {
            return;
        };
        p.contested = false;
        p.candidate = None;
        p.next_view_at = now + period;
        // A Newview adopted from another proposer names that proposer
        // first: this primary changes the view again at once to take the
        // role it holds. Until a majority chose that change it sequences
        // nothing after the Newview, and commits nothing: the proposer it
        // names may be alive (the Newview installed at members it reached)
        // and sequencing after it in an epoch of its own, which this
        // takeover's may outrank by chance (a backup's takeover and the
        // primary's next view can reach the same epoch count). Both
        // sequenced the same gseqs after the Newview, each committed its
        // own, and members delivered a mix of the two logs, some messages
        // twice (swarm seed 131 with `--qsm --qsm-hybrid`). The next view's
        // Newview, chosen by a majority, leaves one of the two logs.
        let adopted = v.committee.first() != Some(&me.0) && v.members.contains(&me.0);
        if adopted {
            p.pending_reasons |= wire::REASON_COMMITTEE;
            p.change_at = Some(now);
            p.contested = true;
            p.fence = Some(p.fence.map_or(gseq + 1, |f| f.min(gseq + 1)));
        }
        if !p.joins.is_empty() || !p.leaves.is_empty() {
            p.change_at = Some(now + delay);
        }
        // Joiners of this view could not enter the committee (they held no
        // state); now they can. Fill the committee at once rather than at
        // the next periodic view: until then the group survives fewer
        // committee failures than k - 1.
        if v.committee.len() < k && v.members.len() > v.committee.len() {
            p.pending_reasons |= wire::REASON_COMMITTEE;
            p.change_at = Some(now + delay);
        }
        // Members of the old view whose progress this round did not report
        // (a committee member kept without an ack, or an ack of an earlier
        // round: the acks restart with each epoch, the Newview does not)
        // hold collection back; joiners start at the Newview.
        let members = nodes(&v.members);
        let base = members
            .iter()
            .filter(|m| vc.old.contains(&m.0))
            .map(|m| vc.acks.get(m).copied().unwrap_or(0))
            .fold(gseq, u64::min);
        c.collect(base.min(c.committed));
        let list = nodes(&v.committee);
        if list != c.list && list.first() == Some(&me) {
            c.list = list;
            c.epoch = super::committee::next_epoch(c.epoch, 1, me);
            let (list, base) = (c.list.clone(), c.base);
            if let Role::Primary(p) = &mut c.role {
                p.reset_backups(&list, base, now);
            }
            self.send_heartbeats();
        }
        // A primary that let itself go sequences nothing more: its
        // successor assigns the held requests when senders retry.
        if v.members.contains(&me.0) && !adopted {
            self.assign_held(now);
        }
    }

    pub(super) fn on_join(&mut self, now: Instant, from: NodeId, joiner: NodeId) {
        let me = self.me;
        let Some(p) = self.primary_mut() else {
            self.forward_to_primary(from, &Message::Join { joiner: joiner.0 });
            return;
        };
        if p.cview.members.contains(&joiner.0) {
            let welcome = p
                .welcome
                .clone()
                .filter(|(_, v)| v.members.contains(&joiner.0));
            if let Some((gseq, v)) = welcome {
                let entry = Message::Entry {
                    gseq,
                    entry: Entry::Newview(v),
                };
                self.send(joiner, &entry);
            }
            return;
        }
        if joiner != me {
            p.joins.insert(joiner);
            self.request_view_change(now, wire::REASON_JOIN);
        }
    }

    pub(super) fn on_leave(&mut self, now: Instant, from: NodeId, member: NodeId) {
        let me = self.me;
        // The primary itself may leave when a backup can succeed it: the
        // Newview that lets it go names that backup first, and the backup,
        // which holds every committed record, takes over as soon as it
        // installs that view (`install_view`). With no backup (k = 1) the
        // primary first takes one in (`grow_for_leave`); the leaver's retry
        // (`join_retry`) then finds a successor. Committing the Newview that
        // makes it a backup, and every record after, waits for its
        // acknowledgement, so it holds them all when it takes over.
        let has_successor = self.committee.as_ref().is_some_and(|c| c.list.len() >= 2);
        let Some(p) = self.primary_mut() else {
            self.forward_to_primary(from, &Message::Leave { member: member.0 });
            return;
        };
        if !p.cview.members.contains(&member.0) {
            return;
        }
        if member == me && !has_successor {
            if !p.grow_for_leave {
                p.grow_for_leave = true;
                self.request_view_change(now, wire::REASON_COMMITTEE);
            }
            return;
        }
        p.leaves.insert(member);
        self.request_view_change(now, wire::REASON_LEAVE);
    }

    fn forward_to_primary(&mut self, from: NodeId, message: &Message<'_>) {
        let primary = self
            .committee
            .as_ref()
            .map(|c| c.primary())
            .or_else(|| self.view.committee.first().copied());
        if let Some(primary) = primary.filter(|p| *p != from && *p != self.me) {
            self.send(primary, message);
        }
    }
}

/// The next committee: the current one minus those leaving the group, then
/// the lowest-id established members (not joiners, who hold no state yet).
fn choose_committee(
    list: &[NodeId],
    members: &BTreeSet<NodeId>,
    joins: &BTreeSet<NodeId>,
    k: usize,
) -> Vec<NodeId> {
    let mut committee: Vec<NodeId> = list
        .iter()
        .copied()
        .filter(|m| members.contains(m))
        .collect();
    for m in members {
        if committee.len() >= k {
            break;
        }
        if !committee.contains(m) && !joins.contains(m) {
            committee.push(*m);
        }
    }
    committee
}
