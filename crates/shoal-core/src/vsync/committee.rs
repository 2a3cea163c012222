//! The leader committee's agreement protocol: primary-backup with an
//! epoch-stamped takeover (docs/vsync.md). P000 §5.2 leaves the
//! intra-committee protocol open ("total ordering within the
//! leader-committee"); this is Shoal's choice.
//!
//! - The primary (`list[0]`) assigns gseqs and replicates every record (data
//!   and Newview) to every backup. A backup acknowledges the contiguous
//!   prefix it holds *written in the current epoch*. A record is *committed*
//!   (exposed: Gseq ack sent, Newview pbcast, served as a repair) once every
//!   backup acknowledged it and everything before it.
//! - Backup `i` takes over after `i × committee_timeout` without hearing from
//!   the primary: epoch + i, the members ahead of it dropped, its store cut
//!   at its first hole, and a view change at once. Every committed record is
//!   on every backup, so it is in the new primary's store, unchanged.
//! - A backup silent for `committee_timeout` is dropped from the committee
//!   (epoch + the committee's length, so that a dropped backup that was never
//!   told cannot outrank it) and replaced at the next view (which starts at
//!   once).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use shoal_wire::vsync::{self as wire, Heartbeat, Message, NewView};

use super::{nodes, Config, Record, Store, Vsync};
use crate::engine::NodeId;
use crate::time::Instant;

/// A record in a committee member's store, with the epoch that wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub record: Record,
    pub epoch: u64,
    /// Commits once every backup of `epoch` holds it (`Message::Replicate`);
    /// meaningful on a backup only.
    pub open: bool,
}

pub(super) struct Committee {
    pub epoch: u64,
    /// Takeover order; `list[0]` is the primary.
    pub list: Vec<NodeId>,
    pub store: Store,
    /// Records below `base` were collected.
    pub base: u64,
    /// Records below `committed` are final.
    pub committed: u64,
    /// The highest committed frontier a primary announced to this member
    /// (heartbeats). A backup whose store ends below it lacks committed
    /// records and must not take over (see `on_committee_timers`).
    pub announced: u64,
    /// Per sender, one past the highest local id among collected records.
    pub floor: BTreeMap<NodeId, u64>,
    pub role: Role,
}

pub(super) enum Role {
    Primary(Box<Primary>),
    Backup(Backup),
}

pub(super) struct Backup {
    /// Contiguous prefix held in the current epoch.
    pub confirmed: u64,
    pub heard: Instant,
    pub ack_due: bool,
    /// The other backups' `confirmed`, from their PeerAcks in the current
    /// epoch (`Config::committee_delivery`).
    pub peers: BTreeMap<NodeId, u64>,
}

pub(super) struct Replica {
    pub acked: u64,
    pub sent: u64,
    pub heard: Instant,
}

pub(super) struct Primary {
    pub next_gseq: u64,
    pub backups: BTreeMap<NodeId, Replica>,
    pub next_local: BTreeMap<NodeId, u64>,
    /// Gseq Reqs waiting: out of order, or during a view change.
    pub held: BTreeMap<(NodeId, u64), Bytes>,
    pub assigned: BTreeMap<(NodeId, u64), u64>,
    /// The latest view assigned a gseq (committed or not), and its gseq.
    pub cview: NewView,
    pub cview_gseq: u64,
    pub vc: Option<super::viewchange::ViewChange>,
    /// Set when this primary dropped silent backups: nothing at or above it
    /// commits until a view change is acknowledged by a majority of the view
    /// at the epoch taken after the drop. The dropped backups may be alive
    /// across a network cut and take over; records they do not hold must
    /// not be exposed until a majority has promised this primary's epoch,
    /// which outranks theirs (docs/vsync.md, "Network cuts").
    pub fence: Option<u64>,
    pub joins: BTreeSet<NodeId>,
    pub leaves: BTreeSet<NodeId>,
    pub next_view_at: Instant,
    pub change_at: Option<Instant>,
    /// Reasons gathered for the next view change.
    pub pending_reasons: u8,
    pub next_heartbeat: Instant,
    pub heartbeat_every: std::time::Duration,
    /// The latest committed Newview (sent to joiners as their welcome).
    pub welcome: Option<(u64, NewView)>,
    /// This primary asked to leave with no backup to succeed it: the next
    /// view takes a backup in (a committee of at least two), and the leave
    /// goes ahead once that backup holds every committed record.
    pub grow_for_leave: bool,
    /// Members' delivery frontiers (`Message::Progress`), for collecting
    /// between view changes.
    pub progress: BTreeMap<NodeId, u64>,
    /// This primary took over or dropped backups since its last Newview
    /// committed: a rival proposer may exist, so its Newviews are chosen by
    /// a majority (viewchange.rs) even in a committee of one.
    pub contested: bool,
    /// A takeover's store ended with a Newview not known to be committed:
    /// it was set aside, and is proposed again only if a majority reports
    /// it (Paxos' phase 1); otherwise the takeover decides its own.
    pub candidate: Option<Candidate>,
}

/// A Newview set aside at a takeover, with the epoch that wrote it here.
pub(super) struct Candidate {
    pub gseq: u64,
    pub newview: NewView,
    pub epoch: u64,
    /// This primary's own decision, set aside at a new epoch
    /// (`set_aside_unchosen`): its store holds the log before it, and these
    /// joins and leaves go into another Newview if one is decided instead.
    pub taken: Option<super::viewchange::Taken>,
}

impl Committee {
    /// A founding member's committee; the group's records start at `base`
    /// (its first global sequence number, [`super::Vsync::new_at`]).
    pub fn founding(
        position: usize,
        initial: NewView,
        config: &Config,
        now: Instant,
        base: u64,
    ) -> Committee {
        let list = nodes(&initial.committee);
        let role = if position == 0 {
            let mut p = Primary::new(initial, base, config, now);
            p.next_gseq = base;
            p.reset_backups(&list, base, now);
            Role::Primary(Box::new(p))
        } else {
            Role::Backup(Backup {
                confirmed: base,
                heard: now,
                ack_due: false,
                peers: BTreeMap::new(),
            })
        };
        Committee {
            epoch: 0,
            list,
            store: Store::new(),
            base,
            committed: base,
            announced: base,
            floor: BTreeMap::new(),
            role,
        }
    }

    pub fn primary(&self) -> NodeId {
        self.list[0]
    }

    pub fn is_primary(&self) -> bool {
        matches!(self.role, Role::Primary(_))
    }

    pub fn deadline(&self) -> Option<Instant> {
        match &self.role {
            Role::Primary(p) => {
                let vc =
                    p.vc.as_ref()
                        .filter(|v| !v.decided || p.fence.is_some() || v.outranked.is_some())
                        .map(|v| v.deadline);
                let periodic = p.vc.is_none().then_some(p.next_view_at);
                let change = p.change_at.filter(|_| p.vc.is_none());
                [Some(p.next_heartbeat), vc, periodic, change]
                    .into_iter()
                    .flatten()
                    .min()
            }
            Role::Backup(_) => None,
        }
    }

    /// The view whose decided Newview this primary has not committed yet.
    /// Such a primary does not yield to a higher epoch (a backup's ack, a
    /// rival's heartbeat): members may have accepted its Newview, and a
    /// rival that sees so in its phase 1 abandons (viewchange.rs), so if
    /// this one yielded too, nobody would finish the view (cut seeds 674,
    /// k = 3, and 670, k = 2). It outranks the rival after a backoff.
    pub(super) fn finishing_view(&self) -> Option<u64> {
        self.view_change()
            .filter(|vc| vc.decided || vc.set_aside)
            .map(|vc| vc.view)
    }

    /// The view change this member runs as primary, if any.
    pub(super) fn view_change(&self) -> Option<&super::viewchange::ViewChange> {
        match &self.role {
            Role::Primary(p) => p.vc.as_ref(),
            Role::Backup(_) => None,
        }
    }

    /// When this backup takes over if the primary stays silent.
    fn takeover_at(&self, me: NodeId, timeout: std::time::Duration) -> Option<Instant> {
        let Role::Backup(b) = &self.role else {
            return None;
        };
        let position = self.list.iter().position(|c| *c == me)?.max(1);
        Some(b.heard + timeout * position as u32)
    }

    pub fn check_invariants(&self) {
        assert!(self.committed >= self.base || self.store.is_empty() || self.committed == 0);
        if let Some(first) = self.store.keys().next() {
            assert!(*first >= self.base, "store below base");
        }
        if let Role::Primary(p) = &self.role {
            assert!(self.committed <= p.next_gseq, "committed beyond assigned");
            for r in p.backups.values() {
                assert!(r.acked <= p.next_gseq, "ack beyond assigned");
            }
        }
    }

    /// One past the contiguous prefix of the store from the collection base:
    /// a takeover keeps the store up to here.
    pub(super) fn store_end(&self) -> u64 {
        let mut end = self.base;
        while self.store.contains_key(&end) {
            end += 1;
        }
        end
    }

    /// Whether every record from the committed frontier up to `gseq`
    /// (inclusive) was written here by the proposer that chose `epoch`:
    /// then this store holds that proposer's log up to its Newview at
    /// `gseq`, and may complete that Newview.
    pub(super) fn holds_log_of(&self, gseq: u64, epoch: u64) -> bool {
        (self.committed..gseq).all(|g| {
            self.store
                .get(&g)
                .is_some_and(|s| proposer(s.epoch) == proposer(epoch))
        })
    }

    /// Collects records below `base`, remembering each sender's floor.
    pub(super) fn collect(&mut self, base: u64) {
        if base <= self.base {
            return;
        }
        let kept = self.store.split_off(&base);
        for stored in std::mem::replace(&mut self.store, kept).into_values() {
            if let Record::Data {
                sender, local_id, ..
            } = stored.record
            {
                let floor = self.floor.entry(sender).or_insert(0);
                *floor = (*floor).max(local_id + 1);
            }
        }
        self.base = base;
        if let Role::Primary(p) = &mut self.role {
            p.assigned.retain(|_, g| *g >= base);
        }
    }
}

impl Primary {
    fn new(cview: NewView, cview_gseq: u64, config: &Config, now: Instant) -> Primary {
        Primary {
            next_gseq: 0,
            backups: BTreeMap::new(),
            next_local: BTreeMap::new(),
            held: BTreeMap::new(),
            assigned: BTreeMap::new(),
            cview,
            cview_gseq,
            vc: None,
            fence: None,
            joins: BTreeSet::new(),
            leaves: BTreeSet::new(),
            next_view_at: now + config.view_period,
            change_at: None,
            pending_reasons: 0,
            next_heartbeat: now,
            heartbeat_every: config.committee_heartbeat,
            welcome: None,
            grow_for_leave: false,
            progress: BTreeMap::new(),
            contested: false,
            candidate: None,
        }
    }

    /// A new epoch: every backup re-acknowledges from `base`.
    pub fn reset_backups(&mut self, list: &[NodeId], base: u64, now: Instant) {
        self.backups = list[1..]
            .iter()
            .map(|b| {
                let replica = Replica {
                    acked: base,
                    sent: base,
                    heard: now,
                };
                (*b, replica)
            })
            .collect();
        self.next_heartbeat = now;
    }
}

impl Vsync {
    pub(super) fn primary_mut(&mut self) -> Option<&mut Primary> {
        match &mut self.committee.as_mut()?.role {
            Role::Primary(p) => Some(p),
            Role::Backup(_) => None,
        }
    }

    /// Assigns the next gseq to `record` and starts replicating it.
    pub(super) fn assign(&mut self, now: Instant, record: Record) -> Option<u64> {
        let c = self.committee.as_mut()?;
        let epoch = c.epoch;
        let Role::Primary(p) = &mut c.role else {
            return None;
        };
        let gseq = p.next_gseq;
        p.next_gseq += 1;
        match &record {
            Record::Data {
                sender, local_id, ..
            } => {
                p.assigned.insert((*sender, *local_id), gseq);
                p.next_local.insert(*sender, local_id + 1);
            }
            Record::Newview(v) => {
                p.cview = v.clone();
                p.cview_gseq = gseq;
                p.progress
                    .retain(|m, _| v.members.binary_search(&m.0).is_ok());
            }
        }
        c.store.insert(
            gseq,
            Stored {
                record,
                epoch,
                open: false,
            },
        );
        self.pump_replication();
        self.try_commit(now);
        Some(gseq)
    }

    /// Sends each backup the records it has not been sent, within the window.
    fn pump_replication(&mut self) {
        let window = u64::from(self.config.replicate_window.get());
        let peer_commit = self.config.committee_delivery;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        // Entries at or above the fence must wait for the primary's word;
        // the fence only ever falls to `next_gseq` within an epoch, so an
        // entry sent open stays below it (docs/vsync.md, "Delivery from the
        // committee's stores").
        let fence = p.fence.unwrap_or(u64::MAX);
        let mut batches = Vec::new();
        for (node, r) in p.backups.iter_mut() {
            let end = p.next_gseq.min(r.acked + window);
            let start = r.sent.max(c.base);
            if start < end {
                batches.push((*node, start, end));
                r.sent = end;
            }
        }
        let epoch = c.epoch;
        for (node, start, end) in batches {
            let Some(c) = self.committee.as_ref() else {
                return;
            };
            let encoded = bodies(c.store.range(start..end).map(|(g, s)| Message::Replicate {
                epoch,
                gseq: *g,
                open: peer_commit && *g < fence && matches!(s.record, Record::Data { .. }),
                entry: s.record.to_wire(),
            }));
            self.send_bodies(node, encoded);
        }
    }

    /// Advances `committed` to what every backup holds, exposing records.
    pub(super) fn try_commit(&mut self, now: Instant) {
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &c.role else {
            return;
        };
        let stable = p
            .backups
            .values()
            .map(|r| r.acked)
            .fold(p.next_gseq, u64::min)
            .min(p.fence.unwrap_or(u64::MAX));
        let from = c.committed.max(c.base);
        if stable <= c.committed {
            return;
        }
        c.committed = stable;
        for gseq in from..stable {
            self.expose(now, gseq);
        }
    }

    /// A committed record takes effect: Gseq ack, or Newview by pbcast.
    fn expose(&mut self, now: Instant, gseq: u64) {
        let Some(record) = self
            .committee
            .as_ref()
            .and_then(|c| c.store.get(&gseq))
            .map(|s| s.record.clone())
        else {
            return;
        };
        match &record {
            Record::Data {
                sender, local_id, ..
            } => {
                let view = self.primary_mut().map_or(0, |p| p.cview.view);
                if *sender == self.me {
                    self.on_gseq_ack(now, *local_id, gseq, view);
                } else {
                    let ack = Message::GseqAck {
                        local_id: *local_id,
                        gseq,
                        view,
                    };
                    self.send(*sender, &ack);
                }
            }
            Record::Newview(v) => self.expose_newview(now, gseq, v),
        }
        self.on_entry(now, gseq, record);
    }

    /// Records of this member's store that became committed reach its own
    /// member side (backups; the primary does it in `expose`).
    fn feed_member(&mut self, now: Instant) {
        let Some(c) = self.committee.as_ref() else {
            return;
        };
        let start = self.member.next.min(c.committed);
        let records: Vec<(u64, Record)> = c
            .store
            .range(start..c.committed)
            .map(|(g, s)| (*g, s.record.clone()))
            .collect();
        for (gseq, record) in records {
            self.on_entry(now, gseq, record);
        }
    }

    // ---- inputs -------------------------------------------------------------

    /// A Gseq Req for `sender`'s message `local_id`; `oldest` is the
    /// sender's lowest local id not yet acknowledged.
    pub(super) fn on_gseq_req(
        &mut self,
        now: Instant,
        from: NodeId,
        sender: NodeId,
        (local_id, oldest): (u64, u64),
        payload: &[u8],
    ) {
        self.stats.gseq_reqs_received += 1;
        let me = self.me;
        let window = self.config.gseq_window.get() as usize;
        let Some(p) = self.primary_mut() else {
            // Not the primary: forward to the one we know (P000 Fig 7).
            if let Some(primary) = self.committee.as_ref().map(Committee::primary) {
                if primary != from && primary != me {
                    let req = Message::GseqReq {
                        sender: sender.0,
                        local_id,
                        oldest,
                        payload,
                    };
                    self.send(primary, &req);
                }
            }
            return;
        };
        if from != sender && from != me && !p.cview.members.contains(&from.0) {
            return;
        }
        if !p.cview.members.contains(&sender.0) {
            return;
        }
        // Every local id below `oldest` was sequenced. A primary that took
        // over from a store which never held the sender's last records (it
        // entered the committee after they were collected) learns here
        // where the sender stands, instead of waiting for an id that will
        // never come again.
        let next = p.next_local.entry(sender).or_insert(0);
        *next = (*next).max(oldest.min(local_id));
        let next = *next;
        if local_id < next {
            self.answer_duplicate(sender, local_id);
            return;
        }
        let cap = 4 * window * p.cview.members.len().max(1);
        if p.held.len() < cap {
            p.held
                .insert((sender, local_id), Bytes::copy_from_slice(payload));
        }
        self.assign_held(now);
    }

    /// A repeated Gseq Req: ack again if its record is committed.
    fn answer_duplicate(&mut self, sender: NodeId, local_id: u64) {
        let Some(c) = self.committee.as_ref() else {
            return;
        };
        let Role::Primary(p) = &c.role else {
            return;
        };
        let Some(&gseq) = p.assigned.get(&(sender, local_id)) else {
            return;
        };
        if gseq < c.committed && sender != self.me {
            let view = p.cview.view;
            let ack = Message::GseqAck {
                local_id,
                gseq,
                view,
            };
            self.send(sender, &ack);
        }
    }

    /// Assigns held Gseq Reqs that are next in their sender's order, unless a
    /// view change holds them (P000 §5.2).
    pub(super) fn assign_held(&mut self, now: Instant) {
        loop {
            let Some(p) = self.primary_mut() else {
                return;
            };
            if p.vc.is_some() {
                return;
            }
            let next_local = &p.next_local;
            // A request held across a view change from a member the new
            // view dropped is not sequenced: its message would be delivered
            // in a view its sender is not in (the sender, dropped, sends
            // again what was never sequenced once it is back).
            let members = &p.cview.members;
            p.held.retain(|(s, l), _| {
                members.contains(&s.0) && *l >= next_local.get(s).copied().unwrap_or(0)
            });
            let ready = p
                .held
                .keys()
                .copied()
                .find(|(s, l)| *l == p.next_local.get(s).copied().unwrap_or(0));
            let Some(key) = ready else {
                return;
            };
            let payload = p.held.remove(&key).unwrap_or_default();
            let record = Record::Data {
                sender: key.0,
                local_id: key.1,
                payload,
            };
            self.assign(now, record);
        }
    }

    pub(super) fn on_repair_req(&mut self, from: NodeId, next: u64, upto: u64) {
        self.stats.repair_requests_received += 1;
        if self.committee.is_some() {
            self.answer_repair(from, next, upto);
        } else {
            self.pass_repair_on(from, next, upto);
        }
    }

    /// A repair request passed on by a member for `requester`: answered by
    /// a committee member, never passed on again.
    pub(super) fn on_repair_for(&mut self, requester: NodeId, next: u64, upto: u64) {
        self.stats.repair_requests_received += 1;
        if self.committee.is_some() && requester != self.me {
            self.answer_repair(requester, next, upto);
        }
    }

    /// A member outside the committee got a repair request: its sender's
    /// view is stale (its committee left or was dropped, so it asks whoever
    /// it can). The current primary answers it, with `Removed` if it is no
    /// longer a member (docs/vsync.md, cut seed 121).
    fn pass_repair_on(&mut self, requester: NodeId, next: u64, upto: u64) {
        if self.status != super::Status::Member {
            return;
        }
        let Some(primary) = self.view.committee.first().copied() else {
            return;
        };
        if primary != requester && primary != self.me {
            let message = Message::RepairFor {
                requester: requester.0,
                next,
                upto,
            };
            self.send(primary, &message);
        }
    }

    /// Committed entries `next..=upto` (at most a batch) to `to`, then the
    /// committed frontier; `Removed` to a non-member whose gap was collected.
    fn answer_repair(&mut self, from: NodeId, next: u64, upto: u64) {
        let Some(c) = self.committee.as_ref() else {
            return;
        };
        let members = match &c.role {
            Role::Primary(p) => nodes(&p.cview.members),
            Role::Backup(_) => self.view.members.clone(),
        };
        let view = self.view.id;
        if next < c.base && !super::contains(&members, from) {
            self.send(from, &Message::Removed { view });
            return;
        }
        // `upto` is the last entry the member knows it lacks (the end of its
        // gap), or a batch ahead when it knows of none. Sending more would
        // re-send what pbcast is still delivering: under load, with many
        // members, that was most of the leader's traffic (P000 Fig 10 at
        // n >= 250, docs/reproduction.md).
        let batch = u64::from(self.config.repair_batch_max.get());
        let end = c
            .committed
            .min(next.saturating_add(batch))
            .min(upto.saturating_add(1));
        let start = next.max(c.base);
        let mut encoded =
            bodies(
                c.store
                    .range(start..end.max(start))
                    .map(|(g, s)| Message::Entry {
                        gseq: *g,
                        entry: s.record.to_wire(),
                    }),
            );
        self.stats.repairs_sent += encoded.len() as u64;
        let done = bodies(std::iter::once(Message::RepairDone {
            committed: c.committed,
            view,
        }));
        if self.config.repair_done_apart {
            self.send_bodies(from, encoded);
            self.send_bodies(from, done);
        } else {
            encoded.extend(done);
            self.send_bodies(from, encoded);
        }
    }

    // ---- replication ------------------------------------------------------

    pub(super) fn on_replicate(
        &mut self,
        now: Instant,
        from: NodeId,
        epoch: u64,
        (gseq, open): (u64, bool),
        entry: wire::Entry<'_>,
    ) {
        let window = 2 * u64::from(self.config.replicate_window.get());
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        if epoch < c.epoch {
            let stale = Message::ReplicaAck {
                epoch: c.epoch,
                next: 0,
            };
            self.send(from, &stale);
            return;
        }
        let Role::Backup(b) = &mut c.role else {
            return;
        };
        if epoch > c.epoch || from != c.list[0] || gseq < c.base || gseq >= b.confirmed + window {
            return;
        }
        b.heard = now;
        c.store.insert(
            gseq,
            Stored {
                record: Record::from_wire(entry, Bytes::copy_from_slice),
                epoch,
                open,
            },
        );
        while c.store.get(&b.confirmed).is_some_and(|s| s.epoch == epoch) {
            b.confirmed += 1;
        }
        b.ack_due = true;
    }

    /// One ReplicaAck per datagram received (and, with
    /// `committee_delivery`, the same as a PeerAck to each other backup).
    pub(super) fn flush_replica_ack(&mut self, now: Instant) {
        let me = self.me;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Backup(b) = &mut c.role else {
            return;
        };
        if !std::mem::take(&mut b.ack_due) {
            return;
        }
        let (epoch, next) = (c.epoch, b.confirmed);
        let to = c.list[0];
        let peers: Vec<NodeId> = if self.config.committee_delivery {
            c.list[1..].iter().copied().filter(|n| *n != me).collect()
        } else {
            Vec::new()
        };
        self.send(to, &Message::ReplicaAck { epoch, next });
        if self.config.committee_delivery {
            for peer in peers {
                self.send(peer, &Message::PeerAck { epoch, next });
            }
            self.commit_from_peers(now);
        }
    }

    /// Another backup's PeerAck: what it holds in `epoch`.
    pub(super) fn on_peer_ack(&mut self, now: Instant, from: NodeId, epoch: u64, next: u64) {
        let me = self.me;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Backup(b) = &mut c.role else {
            return;
        };
        // Only a backup of this very epoch counts: the list (and so which
        // backups must hold an entry) changes only with the epoch.
        if epoch != c.epoch || from == me || !c.list[1..].contains(&from) {
            return;
        }
        let held = b.peers.entry(from).or_insert(0);
        *held = (*held).max(next);
        self.commit_from_peers(now);
    }

    /// A backup commits the open entries every backup of its epoch holds:
    /// the primary's own rule (`try_commit`), applied to the same acks, so
    /// a backup never commits an entry its primary would not. It delivers
    /// them from its store at once.
    fn commit_from_peers(&mut self, now: Instant) {
        let me = self.me;
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Backup(b) = &c.role else {
            return;
        };
        let stable = c.list[1..]
            .iter()
            .filter(|n| **n != me)
            .map(|n| b.peers.get(n).copied().unwrap_or(0))
            .fold(b.confirmed, u64::min);
        let mut end = c.committed.max(c.base);
        while end < stable
            && c.store
                .get(&end)
                .is_some_and(|s| s.open && s.epoch == c.epoch)
        {
            end += 1;
        }
        if end > c.committed {
            c.committed = end;
            self.feed_member(now);
        }
    }

    pub(super) fn on_heartbeat(&mut self, now: Instant, from: NodeId, hb: Heartbeat) {
        let epoch = self.committee.as_ref().map(|c| c.epoch);
        if epoch.is_some_and(|e| hb.epoch < e) {
            let stale = Message::ReplicaAck {
                epoch: epoch.unwrap_or(0),
                next: 0,
            };
            self.send(from, &stale);
            return;
        }
        if hb.committee.first() != Some(&from.0) {
            return;
        }
        // A primary outside this member's view was removed by a view this
        // member installed: a stale primary (across a cut) whose epoch grew
        // while it dropped the backups it could not reach. Following it
        // would take this member out of the real committee.
        if self.status == super::Status::Member && !super::contains(&self.view.members, from) {
            return;
        }
        // Nor does a primary still at an earlier view than this member
        // installed (a stale proposer whose epoch rose while it tried to
        // outrank): following it would take this member out of the
        // committee of the view it has (cut seed 1282, k = 2).
        if self.status == super::Status::Member && hb.view < self.view.id {
            return;
        }
        let finishing = self.committee.as_ref().and_then(Committee::finishing_view);
        if let Some(view) = finishing.filter(|_| epoch.is_some_and(|e| hb.epoch > e)) {
            self.on_outranked(now, view, hb.epoch);
            return;
        }
        if !hb.committee.contains(&self.me.0) {
            if epoch.is_none_or(|e| hb.epoch > e) {
                self.committee = None;
            }
            return;
        }
        if epoch != Some(hb.epoch) {
            self.adopt_epoch(now, &hb);
        }
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Backup(b) = &mut c.role else {
            return;
        };
        b.heard = now;
        b.ack_due = true;
        c.announced = c.announced.max(hb.committed);
        // Below the primary's base every record is committed and delivered
        // by every member of the view, so a backup needs none of it, even
        // records it never received. Waiting for those instead (the primary
        // collected them and will not resend them) stalled commits forever
        // after a backup missed replicas around a view change (chaos seed
        // 262).
        c.collect(hb.base);
        c.committed = c.committed.max(c.base);
        if let Role::Backup(b) = &mut c.role {
            b.confirmed = b.confirmed.max(c.base);
            while c
                .store
                .get(&b.confirmed)
                .is_some_and(|s| s.epoch == hb.epoch)
            {
                b.confirmed += 1;
            }
            c.committed = c.committed.max(hb.committed.min(b.confirmed));
        }
        self.feed_member(now);
    }

    /// Joins, or moves to, the committee epoch a primary announces.
    fn adopt_epoch(&mut self, now: Instant, hb: &Heartbeat) {
        let c = self.committee.get_or_insert_with(|| Committee {
            epoch: hb.epoch,
            list: Vec::new(),
            store: Store::new(),
            base: hb.base,
            committed: hb.base,
            announced: hb.committed,
            floor: BTreeMap::new(),
            role: Role::Backup(Backup {
                confirmed: hb.base,
                heard: now,
                ack_due: true,
                peers: BTreeMap::new(),
            }),
        });
        c.epoch = hb.epoch;
        c.list = nodes(&hb.committee);
        if c.base < hb.base {
            c.collect(hb.base);
        }
        let mut confirmed = c.base;
        while c.store.get(&confirmed).is_some_and(|s| s.epoch == hb.epoch) {
            confirmed += 1;
        }
        c.role = Role::Backup(Backup {
            confirmed,
            heard: now,
            ack_due: true,
            peers: BTreeMap::new(),
        });
    }

    pub(super) fn on_replica_ack(&mut self, now: Instant, from: NodeId, epoch: u64, next: u64) {
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        if epoch > c.epoch {
            // A primary finishing a Newview stays (`finishing_view`).
            if let Some(view) = c.finishing_view() {
                self.on_outranked(now, view, epoch);
                return;
            }
            // A newer primary exists: step down; its heartbeat re-admits us
            // (with a fresh store) if its committee still lists us.
            self.committee = None;
            self.stats.stepped_down += 1;
            return;
        }
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        let Some(r) = p.backups.get_mut(&from) else {
            if epoch < c.epoch {
                // A backup this primary dropped still acknowledges an old
                // epoch: it never got the drop notice. Send it again (a
                // heartbeat without it ends its committee role). With the
                // notice sent only once, one lost datagram left a backup that
                // had slept through its drop believing it was still one; it
                // took over a timeout later and formed a second primary
                // component (chaos seed 152).
                let notice = Message::Heartbeat(Heartbeat {
                    epoch: c.epoch,
                    committee: c.list.iter().map(|n| n.0).collect(),
                    base: c.base,
                    committed: c.committed,
                    view: p.cview.view,
                });
                self.send(from, &notice);
            }
            return;
        };
        r.heard = now;
        if epoch == c.epoch {
            let next = next.min(p.next_gseq);
            if next < r.acked {
                // The backup holds less than it once acknowledged: it was
                // dropped and re-admitted with an empty store (chaos seed
                // 262), or this ack was merely reordered behind a later
                // one. Either way `acked` falls, so the next heartbeat
                // replicates again from what it holds; the next in-order
                // ack raises it back. Resending the window at once, here,
                // made every reordered ack cost a window, whose datagrams
                // each drew an ack, some reordered again: under loss and
                // reordering a primary sent hundreds of thousands of
                // datagrams within a millisecond (swarm, fragments at 5%
                // loss).
                r.acked = next;
            }
            r.acked = r.acked.max(next);
            r.sent = r.sent.max(r.acked);
            self.try_commit(now);
            self.pump_replication();
        }
    }

    /// A member's delivery frontier (`Message::Progress`): the primary
    /// collects every committed record that each member of its latest view
    /// has delivered (backups follow the base of its heartbeats). A member
    /// that never reports (asleep, or its reports lost) holds collection
    /// back until a view change drops it, as at the view checkpoint of P000
    /// §5.2, which remains the rule when `progress_interval` is 0.
    pub(super) fn on_progress(&mut self, from: NodeId, next: u64) {
        let (me, own) = (self.me, self.member.next);
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        if p.cview.members.binary_search(&from.0).is_err() {
            return;
        }
        let reported = p.progress.entry(from).or_insert(0);
        *reported = (*reported).max(next);
        let lowest = p.cview.members.iter().try_fold(u64::MAX, |low, m| {
            let next = if *m == me.0 {
                Some(own)
            } else {
                p.progress.get(&NodeId(*m)).copied()
            };
            next.map(|n| low.min(n))
        });
        if let Some(lowest) = lowest {
            let base = lowest.min(c.committed);
            c.collect(base);
        }
    }

    // ---- timers -------------------------------------------------------------

    pub(super) fn on_committee_timers(&mut self, now: Instant) {
        let timeout = self.config.committee_timeout;
        let Some(c) = self.committee.as_ref() else {
            return;
        };
        if let Some(at) = c.takeover_at(self.me, timeout).filter(|t| *t <= now) {
            if now > at + timeout / 2 {
                // The timer fired late: this member itself was asleep and
                // cannot blame the primary for the silence. Listen again.
                if let Some(Committee {
                    role: Role::Backup(b),
                    ..
                }) = self.committee.as_mut()
                {
                    b.heard = now;
                }
            } else if c.store_end().max(self.member.next) < c.announced {
                // This backup lacks records the primary already committed
                // (it was re-admitted with an empty store and the resend is
                // not done), and its own member side has not delivered
                // them either (if it has, `take_over` starts after them).
                // Its takeover would cut its store below them and give
                // their gseqs to other messages. It waits instead,
                // blocking rather than splitting; a later backup, which holds
                // every committed record, takes over after its own timeout.
                self.stats.takeovers_refused += 1;
                if let Some(Committee {
                    role: Role::Backup(b),
                    ..
                }) = self.committee.as_mut()
                {
                    b.heard = now;
                }
            } else {
                self.take_over(now);
            }
        }
        if !self.is_primary() {
            return;
        }
        if self.primary_mut().is_some_and(|p| p.next_heartbeat <= now) {
            self.on_heartbeat_timer(now);
        }
        self.on_view_timers(now);
    }

    fn on_heartbeat_timer(&mut self, now: Instant) {
        let (timeout, me) = (self.config.committee_timeout, self.me);
        let k = self.config.committee_size.get() as usize;
        let mut dropped = Vec::new();
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        p.next_heartbeat = now + p.heartbeat_every;
        let silent: Vec<NodeId> = p
            .backups
            .iter()
            .filter(|(_, r)| r.heard + timeout <= now)
            .map(|(n, _)| *n)
            .collect();
        if !silent.is_empty() {
            // What every dropped backup holds may still commit; nothing
            // beyond it until a majority promised the new epoch.
            let held = p
                .backups
                .iter()
                .filter(|(n, _)| silent.contains(n))
                .map(|(_, r)| r.acked)
                .fold(p.next_gseq, u64::min)
                .max(c.committed);
            p.fence = Some(p.fence.map_or(held, |f| f.min(held)));
            // The epoch jumps by the committee's length, not by one: a
            // dropped backup that was never told takes over at its stale
            // epoch plus its position (less than the length), so every
            // Prefreshview this primary sends from now on outranks that
            // backup's. A member that acknowledged ours refuses its (view,
            // epoch), and the two cannot both gather a majority of the old
            // view for the same next view.
            let bump = c.list.len().max(k) as u64;
            c.list.retain(|m| !silent.contains(m));
            // Tell the dropped ones too (they may only be asleep): a
            // heartbeat without them ends their committee role.
            dropped.extend(silent.iter().copied());
            c.epoch = next_epoch(c.epoch, bump, me);
            p.contested = true;
            let (list, base) = (c.list.clone(), c.base);
            p.reset_backups(&list, base, now);
            p.next_heartbeat = now + p.heartbeat_every;
            self.request_view_change(now, wire::REASON_COMMITTEE);
            self.restart_view_change(now);
        }
        self.send_heartbeats_to(&dropped);
        // With the silent backups gone, what the rest hold may already be
        // stable; with none left, nothing else would ever commit a pending
        // record (a decided Newview stalled every later view: chaos seeds
        // 232 and 262).
        if !dropped.is_empty() {
            self.try_commit(now);
        }
    }

    pub(super) fn send_heartbeats(&mut self) {
        self.send_heartbeats_to(&[]);
    }

    /// Heartbeats to the backups and to `extra` members.
    fn send_heartbeats_to(&mut self, extra: &[NodeId]) {
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let Role::Primary(p) = &mut c.role else {
            return;
        };
        for r in p.backups.values_mut() {
            r.sent = r.acked;
        }
        let hb = Message::Heartbeat(Heartbeat {
            epoch: c.epoch,
            committee: c.list.iter().map(|n| n.0).collect(),
            base: c.base,
            committed: c.committed,
            view: p.cview.view,
        });
        let mut backups: Vec<NodeId> = p.backups.keys().copied().collect();
        backups.extend_from_slice(extra);
        for b in backups {
            self.send(b, &hb);
        }
        self.pump_replication();
    }

    /// This backup becomes the primary (the ones ahead of it are silent).
    pub(super) fn take_over(&mut self, now: Instant) {
        let me = self.me;
        let config = self.config.clone();
        let view = self.view.clone();
        let Some(c) = self.committee.as_mut() else {
            return;
        };
        let position = c.list.iter().position(|m| *m == me).unwrap_or(1).max(1);
        c.epoch = next_epoch(c.epoch, position as u64, me);
        c.list.drain(..position.min(c.list.len()));
        if c.list.first() != Some(&me) {
            c.list.insert(0, me);
        }
        // What this member delivered was committed, whether or not a
        // heartbeat said so yet. If its store lacks some of it (the
        // replicas never came), this primary must not give those gseqs
        // again: it starts from its member's frontier, as if it had
        // collected them (cut seed 674, k = 3: the only backup left
        // otherwise cut its store there and reused a delivered gseq).
        let delivered = self.member.next;
        if c.store_end() < delivered {
            c.collect(delivered);
        }
        let mut end = c.store_end();
        c.store.split_off(&end);
        if let Some(stale) = first_stale_after_newview(&c.store) {
            c.store.split_off(&stale);
            end = stale;
        }
        c.committed = c.committed.max(delivered).min(end);
        // A Newview at the end of the store that is not known to be
        // committed may or may not have been chosen: set it aside, and let
        // the majority's reports decide (viewchange.rs, `verdict`).
        let candidate = match latest_view(&c.store) {
            Some((newview, gseq)) if gseq >= c.committed => {
                let epoch = c.store.get(&gseq).map_or(0, |s| s.epoch);
                let proposers = [proposer(epoch), proposer(newview.epoch)];
                let followed = c
                    .store
                    .get(&(gseq + 1))
                    .is_some_and(|s| proposers.contains(&proposer(s.epoch)));
                if followed {
                    // Its proposer (or a primary that took its log over)
                    // sequenced records after it, which a primary does only
                    // once the Newview committed.
                    c.committed = c.committed.max(gseq + 1);
                    None
                } else {
                    // Records after it from another proposer are a stale
                    // primary's, which nobody committed (each needed the
                    // ack of this Newview's proposer, who lacked them).
                    c.store.split_off(&gseq);
                    end = gseq;
                    Some(Candidate {
                        gseq,
                        newview,
                        epoch,
                        taken: None,
                    })
                }
            }
            _ => None,
        };
        let (cview, cview_gseq) = latest_view(&c.store).unwrap_or_else(|| {
            let v = NewView {
                view: view.id,
                epoch: c.epoch,
                members: view.members.iter().map(|n| n.0).collect(),
                committee: view.committee.iter().map(|n| n.0).collect(),
                left: Vec::new(),
                reasons: 0,
            };
            (v, 0)
        });
        // The latest committed Newview is the welcome for joiners it admitted
        // whose welcome the old primary never sent: without one such a
        // joiner, counted in the view, could never acknowledge, and with the
        // old primary gone a view of four lost its majority (committee-only
        // seed 504).
        let welcome = (cview_gseq < c.committed && c.store.contains_key(&cview_gseq))
            .then(|| (cview_gseq, cview.clone()));
        let mut p = Primary::new(cview, cview_gseq, &config, now);
        p.welcome = welcome;
        p.next_gseq = end;
        p.next_local = c.floor.clone();
        for (g, s) in &c.store {
            if let Record::Data {
                sender, local_id, ..
            } = &s.record
            {
                p.assigned.insert((*sender, *local_id), *g);
                let n = p.next_local.entry(*sender).or_insert(0);
                *n = (*n).max(local_id + 1);
            }
        }
        p.reset_backups(&c.list, c.base, now);
        // Nothing beyond what is known committed commits until this
        // primary's first Newview is chosen by a majority: a live primary
        // across a cut may be sequencing the same gseqs.
        p.fence = Some(c.committed);
        p.contested = true;
        p.candidate = candidate;
        c.role = Role::Primary(Box::new(p));
        self.stats.takeovers += 1;
        self.request_view_change(now, wire::REASON_COMMITTEE);
        self.send_heartbeats();
        self.try_commit(now);
    }
}

/// Epoch numbers carry the primary that chose them in their low 20 bits, so
/// two members taking over concurrently never pick the same epoch (a
/// backup would otherwise take one primary's acks for another's records).
pub(super) fn next_epoch(epoch: u64, bump: u64, me: NodeId) -> u64 {
    (((epoch >> 20) + bump) << 20) | proposer(u64::from(me.0))
}

/// The primary that chose `epoch` (its low 20 bits, `next_epoch`).
fn proposer(epoch: u64) -> u64 {
    epoch & 0xF_FFFF
}

/// The first gseq after the store's latest Newview that holds a record
/// written in an epoch older than that Newview's: an earlier primary's,
/// which a later one overwrote at the Newview's gseq and after. None was
/// committed (a record after the Newview commits only under a primary
/// that followed it, in its epoch or a later one), and a takeover that
/// kept it (swarm seed 1283 with short views: a backup that missed the
/// next primary's replicas kept the crashed one's records after the
/// Newview) counted the local ids in it as sequenced and answered their
/// senders' Gseq Reqs as duplicates it had no record of: a message that
/// never reached the order, its sender retrying forever.
fn first_stale_after_newview(store: &Store) -> Option<u64> {
    let (_, at) = latest_view(store)?;
    let epoch = store[&at].epoch;
    store
        .range(at + 1..)
        .find(|(_, s)| s.epoch < epoch)
        .map(|(g, _)| *g)
}

fn latest_view(store: &Store) -> Option<(NewView, u64)> {
    store.iter().rev().find_map(|(g, s)| match &s.record {
        Record::Newview(v) => Some((v.clone(), *g)),
        Record::Data { .. } => None,
    })
}

/// Encodes messages into vsync bodies (so the store's borrow ends before sending).
fn bodies<'a>(messages: impl Iterator<Item = Message<'a>>) -> Vec<Vec<u8>> {
    messages.filter_map(|m| m.to_vec().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(local_id: u64, epoch: u64) -> Stored {
        let record = Record::Data {
            sender: NodeId(1),
            local_id,
            payload: Bytes::new(),
        };
        Stored {
            record,
            epoch,
            open: false,
        }
    }

    fn newview(epoch: u64) -> Stored {
        let record = Record::Newview(NewView {
            view: 10,
            epoch,
            members: vec![1, 2],
            committee: vec![1],
            left: Vec::new(),
            reasons: 0,
        });
        Stored {
            record,
            epoch,
            open: false,
        }
    }

    /// Swarm seed 1283's store at the takeover: a Newview written in epoch
    /// 7, then records of the primary of epoch 5 that the next primary
    /// overwrote everywhere but here.
    #[test]
    fn an_older_epochs_records_after_the_latest_newview_are_stale() {
        let mut store = Store::new();
        store.insert(40, data(1, 5));
        store.insert(41, newview(7));
        store.insert(42, data(2, 7));
        store.insert(43, data(3, 9));
        assert_eq!(first_stale_after_newview(&store), None);
        store.insert(44, data(4, 5));
        store.insert(45, data(5, 9));
        assert_eq!(first_stale_after_newview(&store), Some(44));
        // Before the latest Newview, an older epoch's record is the log
        // that Newview followed.
        store.insert(46, newview(9));
        assert_eq!(first_stale_after_newview(&store), None);
    }
}
