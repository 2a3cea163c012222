//! View changes, driven by the committee's primary (P000 §5.2, Fig 8):
//! Prefreshview by pbcast, AckPrefreshview for `ack_wait`, a decision, and a
//! Newview that takes the next gseq and is replicated like data before it is
//! pbcast. Gseq Reqs are held from the Prefreshview until the Newview
//! commits. Members that did not acknowledge are dropped; joiners get the
//! Newview as their welcome. Collection: the store keeps nothing below the
//! lowest progress the acknowledging members reported, nor below the
//! Newview (the checkpoint).

use std::collections::{BTreeMap, BTreeSet};

use shoal_wire::vsync::{self as wire, Carried, Entry, Message, NewView};

use super::committee::Role;
use super::{nodes, Record, Vsync};
use crate::engine::NodeId;
use crate::time::Instant;

pub(super) struct ViewChange {
    pub view: u64,
    pub deadline: Instant,
    /// Who acknowledged, and the next gseq each had to deliver.
    pub acks: BTreeMap<NodeId, u64>,
    pub reasons: u8,
    pub decided: bool,
    /// The members of the view this change starts from (the quorum's base).
    pub old: Vec<u32>,
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
            Some(vc) if (!vc.decided || fenced) && vc.deadline <= now => {
                let decided = vc.decided;
                if self.has_quorum() {
                    if let Some(p) = self.primary_mut() {
                        p.fence = None;
                    }
                    if decided {
                        self.try_commit(now);
                    } else {
                        self.decide_view(now);
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

    fn start_view_change(&mut self, now: Instant, reasons: u8) {
        let (me, next, wait) = (self.me, self.member.next, self.config.ack_wait);
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let epoch = c.epoch;
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let view = p.cview.view + 1;
        p.change_at = None;
        p.vc = Some(ViewChange {
            view,
            deadline: now + wait,
            acks: BTreeMap::from([(me, next)]),
            reasons,
            decided: false,
            old: p.cview.members.clone(),
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
        let prefresh = Carried::Prefreshview {
            view: vc.view,
            epoch,
            primary: self.me.0,
        };
        self.pbcast_carried(now, &prefresh);
    }

    pub(super) fn on_ack_prefreshview(
        &mut self,
        _now: Instant,
        from: NodeId,
        view: u64,
        epoch: u64,
        next: u64,
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
        if let Some(vc) = p.vc.as_mut().filter(|vc| open(vc)) {
            vc.acks.insert(from, next);
        }
    }

    /// After dropping backups (a new epoch), a view change under way asks
    /// again at the new epoch: acknowledgements of the old one do not count
    /// towards lifting the fence (`Primary::fence`).
    pub(super) fn restart_view_change(&mut self, now: Instant) {
        let (me, next, wait) = (self.me, self.member.next, self.config.ack_wait);
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
        vc.acks = BTreeMap::from([(me, next)]);
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
        for joiner in nodes(&v.members) {
            if !super::contains(&self.view.members, joiner) {
                self.send(joiner, &welcome);
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
        p.next_view_at = now + period;
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
        let members = nodes(&v.members);
        let base = members
            .iter()
            .filter_map(|m| vc.acks.get(m))
            .copied()
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
        if v.members.contains(&me.0) {
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
