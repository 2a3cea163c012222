//! Totem's membership protocol for the ring: gather (joins until
//! consensus), commit (the commit token's two rotations), recovery (old
//! rings' messages resent on the new ring) and installation (the old
//! ring's transitional configuration, then the new regular one). See the
//! module summary in `mod.rs`.

use std::collections::{BTreeSet, VecDeque};

use shoal_wire::ring::{
    Commit, CommitEntry, Join, Recovered, RingId, RingPacket, Token, NO_MEMBER, TOKEN_INSTALLED,
};

use super::log::{Log, Mode, Outgoing};
use super::{sorted, Event, Phase, Ring, Timer};
use crate::NodeId;

/// A gathering member's sets.
#[derive(Debug, Default)]
pub(super) struct Gather {
    procs: BTreeSet<NodeId>,
    fails: BTreeSet<NodeId>,
    /// Members whose join carried exactly this member's sets.
    consensus: BTreeSet<NodeId>,
}

impl Gather {
    fn members(&self) -> Vec<NodeId> {
        sorted(&self.procs.difference(&self.fails).copied().collect())
    }
}

/// A ring being formed (commit) or recovering.
#[derive(Debug)]
pub(super) struct Forming {
    pub log: Log,
    /// This member's old ring's members that are in the new ring.
    trans: Vec<NodeId>,
    /// The highest message any of them holds of the old ring.
    old_high: u64,
    /// Old-ring messages this member still has to resend.
    retrans: VecDeque<Outgoing>,
    /// The representative started the new ring's token.
    token_started: bool,
}

impl Forming {
    /// The representative's test before ordering anything new: since its
    /// last pass nothing was sent, no member has old messages left to
    /// send, and every member holds every message (aru at the top, then
    /// and now).
    pub fn ready_to_install(&self, t: &Token) -> bool {
        let log = &self.log;
        log.visits() > 0
            && t.seq == log.passed_seq
            && t.aru == t.seq
            && log.passed_aru == log.passed_seq
            && t.retrans_id == NO_MEMBER
            && log.passed_retrans_none
            && t.rtr.is_empty()
            && self.retrans.is_empty()
    }
}

impl Ring {
    /// Timers and counters after a ring is installed.
    pub(super) fn after_install(&mut self) {
        for timer in [Timer::Join, Timer::Consensus, Timer::TokenLoss] {
            self.clear_timer(timer);
        }
        self.idle_visits = 0;
        self.last_seq = 0;
        self.cancel_sent = false;
        self.stuck_visits = 0;
        self.received_aru = 0;
        if self.cur.members.len() > 1 {
            self.failed_to_receive = false;
        }
        if self.cur.is_rep() {
            self.set_timer(Timer::Merge, self.config.merge_timeout);
        } else {
            self.clear_timer(Timer::Merge);
        }
        if self.cur.members.len() > 1 {
            self.set_timer(Timer::TokenLoss, self.config.token_timeout);
        }
    }

    /// Leaves whatever the ring was doing and gathers, with the members
    /// known so far and `extra`.
    pub(super) fn enter_gather(&mut self, extra: impl IntoIterator<Item = NodeId>) {
        let mut procs: BTreeSet<NodeId> = match &self.phase {
            Phase::Operational => self.cur.members.iter().copied().collect(),
            Phase::Gather(g) => g.procs.clone(),
            Phase::Commit(f) | Phase::Recovery(f) => {
                self.abandoned_upto = self.abandoned_upto.max(f.log.id.seq);
                f.log.members.iter().copied().collect()
            }
        };
        procs.extend(extra);
        procs.insert(self.me);
        self.phase = Phase::Gather(Gather {
            procs,
            ..Gather::default()
        });
        self.drop_token_duties();
        self.set_timer(Timer::Consensus, self.config.consensus_timeout);
        self.stats.gathers += 1;
        self.send_join();
    }

    pub(super) fn send_join(&mut self) {
        let Phase::Gather(g) = &self.phase else {
            return;
        };
        let join = Join {
            sender: self.me.0,
            ring_seq: self.ring_seq_max,
            procs: g.procs.iter().map(|n| n.0).collect(),
            fails: g.fails.iter().map(|n| n.0).collect(),
        };
        self.multicast_packet(&RingPacket::Join(join));
        self.set_timer(Timer::Join, self.config.join_timeout);
    }

    pub(super) fn on_join(&mut self, j: Join) {
        let sender = NodeId(j.sender);
        if sender == self.me {
            return;
        }
        self.ring_seq_max = self.ring_seq_max.max(j.ring_seq);
        // A join from a member of the ring this member is in (or forming)
        // sent before that ring was formed is stale; one that knows no
        // ring at all (sequence 0, `Ring::start`) is that member started
        // again, and is heard: its old self's ring cannot go on.
        let stale = j.ring_seq != 0
            && match &self.phase {
                Phase::Operational => {
                    self.cur.members.contains(&sender) && j.ring_seq < self.cur.id.seq
                }
                Phase::Commit(f) | Phase::Recovery(f) => {
                    f.log.members.contains(&sender) && j.ring_seq < f.log.id.seq
                }
                Phase::Gather(_) => false,
            };
        // A member that gave up on this one forms its ring without it; the
        // rings merge later (merge detect), with fresh joins. Leaving a
        // working ring for it would only be failed again.
        let failed_me = j.fails.contains(&self.me.0);
        if stale || failed_me && !matches!(self.phase, Phase::Gather(_)) {
            return;
        }
        if !matches!(self.phase, Phase::Gather(_)) {
            self.enter_gather([sender]);
        }
        self.gather_join(sender, &j);
        self.check_consensus();
    }

    fn gather_join(&mut self, sender: NodeId, j: &Join) {
        let me = self.me;
        let in_my_ring = self.cur.members.contains(&sender);
        let Phase::Gather(g) = &mut self.phase else {
            return;
        };
        if g.fails.contains(&sender) {
            return;
        }
        let procs: BTreeSet<NodeId> = j.procs.iter().map(|&n| NodeId(n)).collect();
        let fails: BTreeSet<NodeId> = j.fails.iter().map(|&n| NodeId(n)).collect();
        let mut changed = false;
        if fails.contains(&me) {
            // It gave up on me: give up on it, or each waits for the other.
            changed |= g.fails.insert(sender);
        }
        for &p in &procs {
            changed |= g.procs.insert(p);
        }
        // Its failures count only if it was in my ring (Corosync's rule):
        // a member of another ring may have failed members I can hear.
        if in_my_ring {
            for &f in fails.iter().filter(|&&f| f != me) {
                changed |= g.fails.insert(f);
            }
        }
        if changed {
            g.consensus.clear();
        }
        if !g.fails.contains(&sender) && procs == g.procs && fails == g.fails {
            g.consensus.insert(sender);
        }
        if changed {
            // New sets need a new agreement: give it a full consensus
            // timeout (Corosync re-enters gather), or a member whose
            // timer fires just after would fail everyone.
            self.set_timer(Timer::Consensus, self.config.consensus_timeout);
            self.send_join();
        }
    }

    pub(super) fn on_merge_detect(&mut self, sender: NodeId, ring_id: RingId) {
        if self.is_operational() && ring_id != self.cur.id && !self.cur.members.contains(&sender) {
            self.enter_gather([sender]);
        }
    }

    pub(super) fn on_consensus_timeout(&mut self) {
        let me = self.me;
        let Phase::Gather(g) = &mut self.phase else {
            return;
        };
        let silent: Vec<NodeId> = g
            .members()
            .into_iter()
            .filter(|m| *m != me && !g.consensus.contains(m))
            .collect();
        // Everyone agreed but no commit token came: ask again; a dead
        // representative stays silent and is failed next time.
        g.fails.extend(silent);
        g.consensus.clear();
        self.set_timer(Timer::Consensus, self.config.consensus_timeout);
        self.send_join();
        self.check_consensus();
    }

    fn check_consensus(&mut self) {
        let Phase::Gather(g) = &self.phase else {
            return;
        };
        let members = g.members();
        if !members
            .iter()
            .all(|m| *m == self.me || g.consensus.contains(m))
        {
            return;
        }
        let id = self.next_ring_id();
        if members == [self.me] {
            self.form_solo(id);
        } else if members[0] == self.me {
            let entries = members
                .iter()
                .map(|m| CommitEntry {
                    member: m.0,
                    filled: false,
                    old_ring_id: RingId::default(),
                    old_aru: 0,
                    old_high: 0,
                })
                .collect();
            self.on_commit(Commit {
                ring_id: id,
                entries,
            });
        }
    }

    pub(super) fn on_commit(&mut self, c: Commit) {
        let full = c.entries.iter().all(|e| e.filled);
        match &mut self.phase {
            Phase::Gather(_) => self.commit_first(c),
            Phase::Commit(f) if c.ring_id == f.log.id && full => {
                self.enter_recovery(&c);
                self.pass_commit(c);
            }
            Phase::Recovery(f) if c.ring_id == f.log.id && full && f.log.is_rep() => {
                if f.token_started {
                    return;
                }
                f.token_started = true;
                self.passed = None;
                self.clear_timer(Timer::TokenRetransmit);
                let t = self.first_token(c.ring_id, 0);
                self.on_token(t);
            }
            _ => {}
        }
    }

    /// The commit token's first visit: record this member's old ring.
    fn commit_first(&mut self, mut c: Commit) {
        let Phase::Gather(g) = &self.phase else {
            return;
        };
        let members = g.members();
        let listed: Vec<NodeId> = c.entries.iter().map(|e| NodeId(e.member)).collect();
        if listed != members
            || c.ring_id.seq <= self.cur.id.seq.max(self.abandoned_upto)
            || c.ring_id.rep != members[0].0
        {
            return;
        }
        let Some(mine) = c.entries.iter_mut().find(|e| e.member == self.me.0) else {
            return;
        };
        if mine.filled {
            return;
        }
        *mine = CommitEntry {
            member: self.me.0,
            filled: true,
            old_ring_id: self.cur.id,
            old_aru: self.cur.my_aru,
            old_high: self.cur.high,
        };
        self.ring_seq_max = self.ring_seq_max.max(c.ring_id.seq);
        self.phase = Phase::Commit(Box::new(Forming {
            log: Log::new(c.ring_id, members, self.me),
            trans: Vec::new(),
            old_high: 0,
            retrans: VecDeque::new(),
            token_started: false,
        }));
        for timer in [Timer::Join, Timer::Consensus] {
            self.clear_timer(timer);
        }
        self.pass_commit(c);
    }

    fn pass_commit(&mut self, c: Commit) {
        let (Phase::Commit(f) | Phase::Recovery(f)) = &self.phase else {
            return;
        };
        let to = f.log.successor();
        let ring = c.ring_id;
        self.pass(to, &RingPacket::Commit(c), ring, u64::MAX);
        self.set_timer(Timer::TokenLoss, self.config.token_timeout);
    }

    /// The commit token's second visit: every member's old ring is known;
    /// queue the old messages the other survivors of mine may lack.
    fn enter_recovery(&mut self, c: &Commit) {
        let Phase::Commit(f) = std::mem::replace(&mut self.phase, Phase::Operational) else {
            return;
        };
        let mut f = f;
        self.passed = None;
        let mine: Vec<&CommitEntry> = c
            .entries
            .iter()
            .filter(|e| e.old_ring_id == self.cur.id)
            .collect();
        f.trans = mine.iter().map(|e| NodeId(e.member)).collect();
        let low = mine.iter().map(|e| e.old_aru).min().unwrap_or(0);
        f.old_high = mine.iter().map(|e| e.old_high).max().unwrap_or(0);
        if f.trans.len() > 1 && f.old_high > low {
            for (&seq, m) in self.cur.held.range(low + 1..=f.old_high) {
                if m.recovered.is_some() {
                    continue;
                }
                f.retrans.push_back(Outgoing {
                    service: m.service,
                    payload: m.payload.clone(),
                    recovered: Some(Recovered {
                        ring_id: self.cur.id,
                        seq,
                        sender: m.sender.0,
                        safe: m.service == super::Service::Safe,
                    }),
                });
            }
        }
        self.stats.recovery_messages += f.retrans.len() as u64;
        self.phase = Phase::Recovery(f);
    }

    /// A token visit during recovery: resend old messages, no new ones.
    pub(super) fn recovery_visit(&mut self, mut t: Token) {
        let Phase::Recovery(f) = &mut self.phase else {
            return;
        };
        f.log.visit(
            &self.config,
            self.me,
            &mut t,
            &mut f.retrans,
            &mut self.out,
            &mut self.stats,
        );
        if !f.retrans.is_empty() {
            t.retrans_id = self.me.0;
        } else if t.retrans_id == self.me.0 {
            t.retrans_id = NO_MEMBER;
        }
        f.log.passed_retrans_none = t.retrans_id == NO_MEMBER;
        let successor = f.log.successor();
        self.pass_token(t, successor);
    }

    /// Ends the old ring (its messages, the transitional configuration,
    /// the rest) and installs the recovered one.
    pub(super) fn install(&mut self) {
        let Phase::Recovery(f) = std::mem::replace(&mut self.phase, Phase::Operational) else {
            return;
        };
        let f = *f;
        self.cur.deliver(Mode::Regular, &mut self.events);
        self.events.push_back(Event::Transitional {
            ring_id: self.cur.id,
            members: f.trans,
        });
        self.cur.high = self.cur.high.max(f.old_high);
        self.stats.holes += self.cur.deliver(Mode::Transitional, &mut self.events);
        self.cur = f.log;
        self.events.push_back(Event::Regular {
            ring_id: self.cur.id,
            members: self.cur.members.clone(),
        });
        self.cur.deliver(Mode::Regular, &mut self.events);
        self.stats.rings_installed += 1;
        self.after_install();
    }

    /// This member held the ring's aru down for `fail_to_recv_const`
    /// rotations: it cannot get the messages it lacks (its multicast
    /// receive is broken, or it drops under load), and while it stays, no
    /// member delivers a safe message or forgets one. It leaves at once
    /// for a ring of its own, delivering its old ring's messages as a
    /// member of a transitional configuration of itself alone (those it
    /// never got are holes). The others lose the token, gather, and fail
    /// it if it cannot hear their joins; if it can, it merges back at once
    /// (Corosync does the same). It sends no merge detect until it is in a
    /// ring with others again; theirs bring it back once it hears them.
    pub(super) fn leave_failing_to_receive(&mut self) {
        self.stats.failed_to_receive += 1;
        self.failed_to_receive = true;
        self.drop_token_duties();
        let id = self.next_ring_id();
        self.form_solo(id);
    }

    /// Forgets the token this member held, passed or kept for itself, and
    /// the timers that served the installed ring, as it leaves that ring.
    fn drop_token_duties(&mut self) {
        self.solo = None;
        self.passed = None;
        self.held = None;
        self.idle_visits = 0;
        for timer in [
            Timer::TokenRetransmit,
            Timer::TokenLoss,
            Timer::Merge,
            Timer::TokenHold,
        ] {
            self.clear_timer(timer);
        }
    }

    /// A ring id led by this member, above every ring seen or abandoned.
    fn next_ring_id(&self) -> RingId {
        RingId {
            seq: self
                .ring_seq_max
                .max(self.cur.id.seq)
                .max(self.abandoned_upto)
                + 1,
            rep: self.me.0,
        }
    }

    /// Consensus on this member alone: a ring of one, installed at once.
    fn form_solo(&mut self, id: RingId) {
        self.ring_seq_max = self.ring_seq_max.max(id.seq);
        self.phase = Phase::Recovery(Box::new(Forming {
            log: Log::new(id, vec![self.me], self.me),
            trans: vec![self.me],
            old_high: self.cur.high,
            retrans: VecDeque::new(),
            token_started: true,
        }));
        self.install();
        let t = self.first_token(id, TOKEN_INSTALLED);
        self.on_token(t);
    }
}
