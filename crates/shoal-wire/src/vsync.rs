//! Bodies of [`crate::Packet::Vsync`] packets (virtual synchrony over pbcast,
//! P000 §5.2, Figs 7 and 8), and the vsync records that travel *inside*
//! pbcast payloads ([`Carried`]).
//!
//! A vsync body starts with a one-byte tag, then the fields listed on each
//! [`Message`] variant, big-endian. Decoding is strict: unknown tags, short
//! bodies, counts larger than the bytes present, unsorted or duplicated
//! member lists, an empty committee or a committee member outside the view,
//! and bytes left over are all refused with a [`VsyncError`]; nothing is
//! allocated from a count before it is checked against the bytes present.

use thiserror::Error;

use crate::EncodeError;

/// Why a vsync body (or a carried record) was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VsyncError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("unknown vsync tag {0}")]
    UnknownTag(u8),
    #[error("unknown entry tag {0}")]
    UnknownEntry(u8),
    #[error("{what} count {count} does not fit in the {available} bytes left")]
    CountTooLarge {
        what: &'static str,
        count: usize,
        available: usize,
    },
    #[error("{0} unexpected bytes after the body")]
    TrailingBytes(usize),
    #[error("member list not strictly ascending")]
    Unsorted,
    #[error("empty committee")]
    EmptyCommittee,
    #[error("committee member {0} is not in the view")]
    CommitteeOutsideView(u32),
    #[error("committee member {0} listed twice")]
    DuplicateCommittee(u32),
}

/// A view decided by the committee (P000 §5.2: "Newview ... specifies any
/// changes to the group membership, and is assigned the next available
/// global sequence number").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewView {
    pub view: u64,
    /// Committee epoch that decided it.
    pub epoch: u64,
    /// Strictly ascending.
    pub members: Vec<u32>,
    /// In takeover order: `committee[0]` is the primary. Non-empty, distinct,
    /// each a member.
    pub committee: Vec<u32>,
    /// Members removed because they asked to leave (the others removed
    /// failed to acknowledge). Strictly ascending.
    pub left: Vec<u32>,
    /// Why the view changed: bit flags, see `REASON_*`.
    pub reasons: u8,
}

pub const REASON_PERIODIC: u8 = 1;
pub const REASON_JOIN: u8 = 2;
pub const REASON_LEAVE: u8 = 4;
pub const REASON_FAILURE: u8 = 8;
pub const REASON_COMMITTEE: u8 = 16;

/// One record of the totally ordered history: a message or a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry<'a> {
    /// Tag 1: `sender u32, local_id u64`, payload (rest).
    Data {
        sender: u32,
        local_id: u64,
        payload: &'a [u8],
    },
    /// Tag 2: `view u64, epoch u64, reasons u8`, then three `count u16`
    /// lists of `u32`: members, committee, left.
    Newview(NewView),
}

/// What a vsync layer puts in a pbcast payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carried<'a> {
    /// Tag 1: `gseq u64`, entry.
    Sequenced { gseq: u64, entry: Entry<'a> },
    /// Tag 2: `view u64, epoch u64, primary u32`: the committee asks for
    /// AckPrefreshview for view `view` (P000 Fig 8).
    Prefreshview { view: u64, epoch: u64, primary: u32 },
    /// Tag 3: the rest of the payload is a message delivered by pbcast alone,
    /// outside the total order (the services below virtual synchrony:
    /// unreliable and probabilistic).
    Unsequenced { payload: &'a [u8] },
}

/// What a member reports, in its AckPrefreshview, about the view the
/// Prefreshview asks for: the Newview it accepted (`Message::Accept`) for
/// that view, or, with `epoch == INSTALLED`, the Newview it installed (that
/// view or a later one). Paxos' phase-1 answer (docs/vsync.md, "Newviews
/// chosen by a majority").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The epoch of the Accept, or [`INSTALLED`].
    pub epoch: u64,
    /// The gseq the Newview takes.
    pub gseq: u64,
    pub newview: NewView,
}

/// [`Report::epoch`] of a Newview the member installed: it outranks every
/// epoch (an installed view was chosen).
pub const INSTALLED: u64 = u64::MAX;

/// The primary's heartbeat to its backups (committee replication, Shoal's
/// primary-backup choice; docs/vsync.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub epoch: u64,
    /// Takeover order; `committee[0]` is the sender (the primary).
    pub committee: Vec<u32>,
    /// Entries below `base` were collected.
    pub base: u64,
    /// Entries below `committed` are stable on every backup and may be
    /// served and delivered.
    pub committed: u64,
    /// The latest view the primary assigned a gseq to: a member that
    /// installed a later view ignores this primary (it is behind).
    pub view: u64,
}

/// A decoded vsync control body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// Tag 1: `sender u32, local_id u64, oldest u64`, payload. A request for
    /// a global sequence number, carrying the message (forwarded unchanged by
    /// backups). `oldest` is the sender's lowest local id not yet
    /// acknowledged: every lower one was sequenced, which tells a primary
    /// that never held those records where the sender stands.
    GseqReq {
        sender: u32,
        local_id: u64,
        oldest: u64,
        payload: &'a [u8],
    },
    /// Tag 2: `local_id u64, gseq u64, view u64`.
    GseqAck { local_id: u64, gseq: u64, view: u64 },
    /// Tag 3: `next u64, upto u64`: send me the committed entries from
    /// `next` to `upto` inclusive (at most a batch), then the committed
    /// frontier. `upto < next` asks for the frontier only.
    RepairReq { next: u64, upto: u64 },
    /// Tag 4: `gseq u64`, entry: a repair, or a joiner's welcome.
    Entry { gseq: u64, entry: Entry<'a> },
    /// Tag 5: `committed u64, view u64`: end of a repair answer.
    RepairDone { committed: u64, view: u64 },
    /// Tag 6: `view u64`: you are not in view `view` and the history you
    /// lack is collected.
    Removed { view: u64 },
    /// Tag 7: `view u64, epoch u64, next u64`, then, if bytes follow, a
    /// report: `epoch u64, gseq u64` and a Newview entry.
    AckPrefreshview {
        view: u64,
        epoch: u64,
        next: u64,
        report: Option<Report>,
    },
    /// Tag 8: `joiner u32`.
    Join { joiner: u32 },
    /// Tag 9: `member u32`.
    Leave { member: u32 },
    /// Tag 10 (`open` false) or 19 (`open` true): `epoch u64, gseq u64`,
    /// entry: primary to backup. An open entry commits as soon as every
    /// backup of `epoch` holds it, so a backup that learns so from the
    /// others' PeerAcks may deliver it; a closed one (a Newview, or an entry
    /// at or above the primary's fence) commits only when the primary says
    /// so.
    Replicate {
        epoch: u64,
        gseq: u64,
        open: bool,
        entry: Entry<'a>,
    },
    /// Tag 11: `epoch u64, base u64, committed u64, view u64`, `count u16` ×
    /// `u32`.
    Heartbeat(Heartbeat),
    /// Tag 12: `epoch u64, next u64`: the backup holds every entry below
    /// `next` written in `epoch`.
    ReplicaAck { epoch: u64, next: u64 },
    /// Tag 13: `requester u32, next u64, upto u64`: a RepairReq that a member
    /// outside the committee passes on to its primary for `requester`, whose
    /// view (and so whose idea of the committee) may be stale. The answer
    /// goes to `requester`.
    RepairFor {
        requester: u32,
        next: u64,
        upto: u64,
    },
    /// Tag 14: `next u64`: member to primary, "I delivered every entry below
    /// `next`". The primary collects what every member of its view has
    /// delivered without waiting for the next view change.
    Progress { next: u64 },
    /// Tag 15: `epoch u64, gseq u64`, a Newview entry: primary to the
    /// members that acknowledged its Prefreshview, "accept this Newview at
    /// this epoch" (Paxos' phase 2).
    Accept {
        epoch: u64,
        gseq: u64,
        newview: NewView,
    },
    /// Tag 16: `view u64, epoch u64`: the member accepted the Newview for
    /// `view` at `epoch`.
    Accepted { view: u64, epoch: u64 },
    /// Tag 17: `view u64, epoch u64`: member to a proposer whose
    /// Prefreshview or Accept it refused: it promised `epoch` for `view`,
    /// which outranks the proposer's.
    Outranked { view: u64, epoch: u64 },
    /// Tag 18: `view u64, epoch u64`: a Prefreshview sent directly to a
    /// member that has not acknowledged the pbcast one (a primary without
    /// a majority asks each member it lacks; one that moved on without it
    /// answers with the view it installed).
    Prefreshview { view: u64, epoch: u64 },
    /// Tag 20: `epoch u64, next u64`: backup to the other backups, the
    /// ReplicaAck it sent its primary (it holds every entry below `next`
    /// written in `epoch`). With every backup's, a backup knows which open
    /// entries are committed without waiting for the primary.
    PeerAck { epoch: u64, next: u64 },
}

// ---- encoding -------------------------------------------------------------

fn put_u32s(list: &[u32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let count = u16::try_from(list.len()).map_err(|_| EncodeError::TooMany {
        what: "members",
        max: u16::MAX as usize,
    })?;
    out.extend_from_slice(&count.to_be_bytes());
    for m in list {
        out.extend_from_slice(&m.to_be_bytes());
    }
    Ok(())
}

impl Entry<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            Entry::Data {
                sender,
                local_id,
                payload,
            } => {
                out.push(1);
                out.extend_from_slice(&sender.to_be_bytes());
                out.extend_from_slice(&local_id.to_be_bytes());
                out.extend_from_slice(payload);
            }
            Entry::Newview(v) => {
                out.push(2);
                out.extend_from_slice(&v.view.to_be_bytes());
                out.extend_from_slice(&v.epoch.to_be_bytes());
                out.push(v.reasons);
                put_u32s(&v.members, out)?;
                put_u32s(&v.committee, out)?;
                put_u32s(&v.left, out)?;
            }
        }
        Ok(())
    }

    /// Bytes when encoded.
    pub fn encoded_len(&self) -> usize {
        match self {
            Entry::Data { payload, .. } => 13 + payload.len(),
            Entry::Newview(v) => 18 + 6 + 4 * (v.members.len() + v.committee.len() + v.left.len()),
        }
    }
}

impl Carried<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            Carried::Sequenced { gseq, entry } => {
                out.push(1);
                out.extend_from_slice(&gseq.to_be_bytes());
                entry.encode(out)?;
            }
            Carried::Prefreshview {
                view,
                epoch,
                primary,
            } => {
                out.push(2);
                out.extend_from_slice(&view.to_be_bytes());
                out.extend_from_slice(&epoch.to_be_bytes());
                out.extend_from_slice(&primary.to_be_bytes());
            }
            Carried::Unsequenced { payload } => {
                out.push(3);
                out.extend_from_slice(payload);
            }
        }
        Ok(())
    }

    pub fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

impl Message<'_> {
    /// Appends the body (not the packet header) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let u64s = |out: &mut Vec<u8>, tag: u8, xs: &[u64]| {
            out.push(tag);
            for x in xs {
                out.extend_from_slice(&x.to_be_bytes());
            }
        };
        match self {
            Message::GseqReq {
                sender,
                local_id,
                oldest,
                payload,
            } => {
                out.push(1);
                out.extend_from_slice(&sender.to_be_bytes());
                out.extend_from_slice(&local_id.to_be_bytes());
                out.extend_from_slice(&oldest.to_be_bytes());
                out.extend_from_slice(payload);
            }
            Message::GseqAck {
                local_id,
                gseq,
                view,
            } => u64s(out, 2, &[*local_id, *gseq, *view]),
            Message::RepairReq { next, upto } => u64s(out, 3, &[*next, *upto]),
            Message::Entry { gseq, entry } => {
                u64s(out, 4, &[*gseq]);
                entry.encode(out)?;
            }
            Message::RepairDone { committed, view } => u64s(out, 5, &[*committed, *view]),
            Message::Removed { view } => u64s(out, 6, &[*view]),
            Message::AckPrefreshview {
                view,
                epoch,
                next,
                report,
            } => {
                u64s(out, 7, &[*view, *epoch, *next]);
                if let Some(r) = report {
                    out.extend_from_slice(&r.epoch.to_be_bytes());
                    out.extend_from_slice(&r.gseq.to_be_bytes());
                    Entry::Newview(r.newview.clone()).encode(out)?;
                }
            }
            Message::Join { joiner } => {
                out.push(8);
                out.extend_from_slice(&joiner.to_be_bytes());
            }
            Message::Leave { member } => {
                out.push(9);
                out.extend_from_slice(&member.to_be_bytes());
            }
            Message::Replicate {
                epoch,
                gseq,
                open,
                entry,
            } => {
                u64s(out, if *open { 19 } else { 10 }, &[*epoch, *gseq]);
                entry.encode(out)?;
            }
            Message::Heartbeat(h) => {
                u64s(out, 11, &[h.epoch, h.base, h.committed, h.view]);
                put_u32s(&h.committee, out)?;
            }
            Message::ReplicaAck { epoch, next } => u64s(out, 12, &[*epoch, *next]),
            Message::RepairFor {
                requester,
                next,
                upto,
            } => {
                out.push(13);
                out.extend_from_slice(&requester.to_be_bytes());
                out.extend_from_slice(&next.to_be_bytes());
                out.extend_from_slice(&upto.to_be_bytes());
            }
            Message::Progress { next } => u64s(out, 14, &[*next]),
            Message::Accept {
                epoch,
                gseq,
                newview,
            } => {
                u64s(out, 15, &[*epoch, *gseq]);
                Entry::Newview(newview.clone()).encode(out)?;
            }
            Message::Accepted { view, epoch } => u64s(out, 16, &[*view, *epoch]),
            Message::Outranked { view, epoch } => u64s(out, 17, &[*view, *epoch]),
            Message::Prefreshview { view, epoch } => u64s(out, 18, &[*view, *epoch]),
            Message::PeerAck { epoch, next } => u64s(out, 20, &[*epoch, *next]),
        }
        Ok(())
    }

    pub fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

// ---- decoding -------------------------------------------------------------

/// Decodes one vsync control body.
pub fn decode(body: &[u8]) -> Result<Message<'_>, VsyncError> {
    let mut r = Reader { bytes: body };
    let tag = r.u8()?;
    let message = match tag {
        1 => Message::GseqReq {
            sender: r.u32()?,
            local_id: r.u64()?,
            oldest: r.u64()?,
            payload: r.rest(),
        },
        2 => Message::GseqAck {
            local_id: r.u64()?,
            gseq: r.u64()?,
            view: r.u64()?,
        },
        3 => Message::RepairReq {
            next: r.u64()?,
            upto: r.u64()?,
        },
        4 => Message::Entry {
            gseq: r.u64()?,
            entry: r.entry()?,
        },
        5 => Message::RepairDone {
            committed: r.u64()?,
            view: r.u64()?,
        },
        6 => Message::Removed { view: r.u64()? },
        7 => Message::AckPrefreshview {
            view: r.u64()?,
            epoch: r.u64()?,
            next: r.u64()?,
            report: if r.bytes.is_empty() {
                None
            } else {
                Some(Report {
                    epoch: r.u64()?,
                    gseq: r.u64()?,
                    newview: r.newview_entry()?,
                })
            },
        },
        8 => Message::Join { joiner: r.u32()? },
        9 => Message::Leave { member: r.u32()? },
        10 | 19 => Message::Replicate {
            epoch: r.u64()?,
            gseq: r.u64()?,
            open: tag == 19,
            entry: r.entry()?,
        },
        11 => Message::Heartbeat(r.heartbeat()?),
        12 => Message::ReplicaAck {
            epoch: r.u64()?,
            next: r.u64()?,
        },
        13 => Message::RepairFor {
            requester: r.u32()?,
            next: r.u64()?,
            upto: r.u64()?,
        },
        14 => Message::Progress { next: r.u64()? },
        15 => Message::Accept {
            epoch: r.u64()?,
            gseq: r.u64()?,
            newview: r.newview_entry()?,
        },
        16 => Message::Accepted {
            view: r.u64()?,
            epoch: r.u64()?,
        },
        17 => Message::Outranked {
            view: r.u64()?,
            epoch: r.u64()?,
        },
        18 => Message::Prefreshview {
            view: r.u64()?,
            epoch: r.u64()?,
        },
        20 => Message::PeerAck {
            epoch: r.u64()?,
            next: r.u64()?,
        },
        tag => return Err(VsyncError::UnknownTag(tag)),
    };
    r.finish()?;
    Ok(message)
}

/// Decodes a vsync record carried in a pbcast payload.
pub fn decode_carried(bytes: &[u8]) -> Result<Carried<'_>, VsyncError> {
    let mut r = Reader { bytes };
    let carried = match r.u8()? {
        1 => Carried::Sequenced {
            gseq: r.u64()?,
            entry: r.entry()?,
        },
        2 => Carried::Prefreshview {
            view: r.u64()?,
            epoch: r.u64()?,
            primary: r.u32()?,
        },
        3 => {
            let payload = r.bytes;
            r.bytes = &[];
            Carried::Unsequenced { payload }
        }
        tag => return Err(VsyncError::UnknownTag(tag)),
    };
    r.finish()?;
    Ok(carried)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], VsyncError> {
        let (head, tail) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(VsyncError::Truncated {
                needed: N,
                available: self.bytes.len(),
            })?;
        self.bytes = tail;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, VsyncError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, VsyncError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, VsyncError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    fn finish(&self) -> Result<(), VsyncError> {
        match self.bytes.len() {
            0 => Ok(()),
            extra => Err(VsyncError::TrailingBytes(extra)),
        }
    }

    /// A `count u16` list of `u32`, checked against the bytes present first.
    fn u32s(&mut self, what: &'static str) -> Result<Vec<u32>, VsyncError> {
        let count = usize::from(u16::from_be_bytes(self.take()?));
        if count.saturating_mul(4) > self.bytes.len() {
            return Err(VsyncError::CountTooLarge {
                what,
                count,
                available: self.bytes.len(),
            });
        }
        (0..count).map(|_| self.u32()).collect()
    }

    fn ascending(&mut self, what: &'static str) -> Result<Vec<u32>, VsyncError> {
        let list = self.u32s(what)?;
        if list.windows(2).any(|w| w[0] >= w[1]) {
            return Err(VsyncError::Unsorted);
        }
        Ok(list)
    }

    fn entry(&mut self) -> Result<Entry<'a>, VsyncError> {
        match self.u8()? {
            1 => Ok(Entry::Data {
                sender: self.u32()?,
                local_id: self.u64()?,
                payload: self.rest(),
            }),
            2 => Ok(Entry::Newview(self.newview()?)),
            tag => Err(VsyncError::UnknownEntry(tag)),
        }
    }

    /// An entry that must be a Newview.
    fn newview_entry(&mut self) -> Result<NewView, VsyncError> {
        match self.u8()? {
            2 => self.newview(),
            tag => Err(VsyncError::UnknownEntry(tag)),
        }
    }

    fn newview(&mut self) -> Result<NewView, VsyncError> {
        let (view, epoch, reasons) = (self.u64()?, self.u64()?, self.u8()?);
        let members = self.ascending("member")?;
        let committee = self.committee()?;
        if let Some(c) = committee.iter().find(|c| members.binary_search(c).is_err()) {
            return Err(VsyncError::CommitteeOutsideView(*c));
        }
        let left = self.ascending("left")?;
        Ok(NewView {
            view,
            epoch,
            members,
            committee,
            left,
            reasons,
        })
    }

    fn committee(&mut self) -> Result<Vec<u32>, VsyncError> {
        let committee = self.u32s("committee")?;
        if committee.is_empty() {
            return Err(VsyncError::EmptyCommittee);
        }
        for (i, c) in committee.iter().enumerate() {
            if committee[..i].contains(c) {
                return Err(VsyncError::DuplicateCommittee(*c));
            }
        }
        Ok(committee)
    }

    fn heartbeat(&mut self) -> Result<Heartbeat, VsyncError> {
        Ok(Heartbeat {
            epoch: self.u64()?,
            base: self.u64()?,
            committed: self.u64()?,
            view: self.u64()?,
            committee: self.committee()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn view() -> NewView {
        NewView {
            view: 3,
            epoch: 2,
            members: vec![1, 4, 9],
            committee: vec![4, 1],
            left: vec![7],
            reasons: REASON_PERIODIC | REASON_LEAVE,
        }
    }

    fn newview_body(members: &[u32], committee: &[u32]) -> Vec<u8> {
        let mut v = view();
        v.members = members.to_vec();
        v.committee = committee.to_vec();
        // Encode without validation, as a forger would.
        Message::Entry {
            gseq: 5,
            entry: Entry::Newview(v),
        }
        .to_vec()
        .unwrap()
    }

    #[test]
    fn every_message_round_trips() {
        let hb = Heartbeat {
            epoch: 4,
            committee: vec![2, 0, 5],
            base: 10,
            committed: 20,
            view: 3,
        };
        let data = Entry::Data {
            sender: 3,
            local_id: 8,
            payload: b"abc",
        };
        let messages = vec![
            Message::GseqReq {
                sender: 1,
                local_id: 2,
                oldest: 1,
                payload: b"hello",
            },
            Message::GseqAck {
                local_id: 1,
                gseq: 2,
                view: 3,
            },
            Message::RepairReq { next: 4, upto: 9 },
            Message::Entry {
                gseq: 7,
                entry: data.clone(),
            },
            Message::Entry {
                gseq: 7,
                entry: Entry::Newview(view()),
            },
            Message::RepairDone {
                committed: 1,
                view: 2,
            },
            Message::Removed { view: 6 },
            Message::AckPrefreshview {
                view: 1,
                epoch: 2,
                next: 3,
                report: None,
            },
            Message::AckPrefreshview {
                view: 3,
                epoch: 2,
                next: 3,
                report: Some(Report {
                    epoch: INSTALLED,
                    gseq: 40,
                    newview: view(),
                }),
            },
            Message::Accept {
                epoch: 9,
                gseq: 41,
                newview: view(),
            },
            Message::Accepted { view: 3, epoch: 9 },
            Message::Outranked { view: 3, epoch: 10 },
            Message::Prefreshview { view: 4, epoch: 11 },
            Message::Join { joiner: 7 },
            Message::Leave { member: 7 },
            Message::Replicate {
                epoch: 1,
                gseq: 2,
                open: false,
                entry: data.clone(),
            },
            Message::Replicate {
                epoch: 1,
                gseq: 2,
                open: true,
                entry: data,
            },
            Message::PeerAck { epoch: 1, next: 2 },
            Message::Heartbeat(hb),
            Message::ReplicaAck { epoch: 1, next: 2 },
            Message::RepairFor {
                requester: 5,
                next: 6,
                upto: 7,
            },
            Message::Progress { next: 11 },
        ];
        for m in messages {
            let bytes = m.to_vec().unwrap();
            assert_eq!(decode(&bytes), Ok(m.clone()), "{m:?}");
        }
        for c in [
            Carried::Prefreshview {
                view: 1,
                epoch: 2,
                primary: 3,
            },
            Carried::Sequenced {
                gseq: 9,
                entry: Entry::Newview(view()),
            },
            Carried::Unsequenced { payload: b"hello" },
            Carried::Unsequenced { payload: b"" },
        ] {
            assert_eq!(decode_carried(&c.to_vec().unwrap()), Ok(c.clone()));
        }
        let e = Entry::Newview(view());
        let mut out = Vec::new();
        e.encode(&mut out).unwrap();
        assert_eq!(out.len(), e.encoded_len());
    }

    #[test]
    fn malformed_bodies_are_refused_with_their_error() {
        let mut huge_count = vec![11];
        huge_count.extend_from_slice(&[0; 32]);
        huge_count.extend_from_slice(&0xFFFFu16.to_be_bytes());
        let mut empty_committee = vec![11];
        empty_committee.extend_from_slice(&[0; 32]);
        empty_committee.extend_from_slice(&0u16.to_be_bytes());
        let mut trailing = Message::Removed { view: 1 }.to_vec().unwrap();
        trailing.push(0);
        let mut bad_entry = vec![4];
        bad_entry.extend_from_slice(&[0; 8]);
        bad_entry.push(9);
        let cases: Vec<(&str, Vec<u8>, VsyncError)> = vec![
            (
                "empty",
                vec![],
                VsyncError::Truncated {
                    needed: 1,
                    available: 0,
                },
            ),
            ("unknown tag", vec![99], VsyncError::UnknownTag(99)),
            (
                "short ack",
                vec![2, 0, 0],
                VsyncError::Truncated {
                    needed: 8,
                    available: 2,
                },
            ),
            ("trailing", trailing, VsyncError::TrailingBytes(1)),
            ("bad entry", bad_entry, VsyncError::UnknownEntry(9)),
            (
                "huge committee count",
                huge_count,
                VsyncError::CountTooLarge {
                    what: "committee",
                    count: 0xFFFF,
                    available: 0,
                },
            ),
            (
                "empty committee",
                empty_committee,
                VsyncError::EmptyCommittee,
            ),
            (
                "unsorted members",
                newview_body(&[4, 1], &[4]),
                VsyncError::Unsorted,
            ),
            (
                "duplicate members",
                newview_body(&[1, 1], &[1]),
                VsyncError::Unsorted,
            ),
            (
                "committee outside view",
                newview_body(&[1, 2], &[3]),
                VsyncError::CommitteeOutsideView(3),
            ),
            (
                "duplicate committee",
                newview_body(&[1, 2], &[2, 2]),
                VsyncError::DuplicateCommittee(2),
            ),
        ];
        for (name, bytes, error) in cases {
            assert_eq!(decode(&bytes), Err(error), "{name}");
        }
        assert_eq!(decode_carried(&[4]), Err(VsyncError::UnknownTag(4)));
        // An Accept must carry a Newview, not a data entry.
        let mut accept_data = vec![15];
        accept_data.extend_from_slice(&[0; 16]);
        accept_data.push(1);
        assert_eq!(decode(&accept_data), Err(VsyncError::UnknownEntry(1)));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics_and_reencodes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(m) = decode(&bytes) {
                prop_assert_eq!(m.to_vec().unwrap(), bytes.clone());
            }
            if let Ok(c) = decode_carried(&bytes) {
                prop_assert_eq!(c.to_vec().unwrap(), bytes);
            }
        }

        #[test]
        fn data_round_trips(sender: u32, local_id: u64, gseq: u64, payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            let c = Carried::Sequenced { gseq, entry: Entry::Data { sender, local_id, payload: &payload } };
            let b = c.to_vec().unwrap();
            prop_assert_eq!(decode_carried(&b), Ok(c.clone()));
            let m = Message::GseqReq { sender, local_id, oldest: local_id / 2, payload: &payload };
            let b = m.to_vec().unwrap();
            prop_assert_eq!(decode(&b), Ok(m.clone()));
        }

        #[test]
        fn views_round_trip(view: u64, epoch: u64, reasons: u8, set in proptest::collection::btree_set(any::<u32>(), 1..20), left in proptest::collection::btree_set(any::<u32>(), 0..5)) {
            let members: Vec<u32> = set.into_iter().collect();
            let committee: Vec<u32> = members.iter().rev().take(3).copied().collect();
            let v = NewView { view, epoch, members, committee, left: left.into_iter().collect(), reasons };
            let m = Message::Replicate { epoch, gseq: view, open: reasons % 2 == 0, entry: Entry::Newview(v) };
            let b = m.to_vec().unwrap();
            prop_assert_eq!(decode(&b), Ok(m.clone()));
        }
    }
}
