//! Messages larger than one datagram at a site daemon: a client message
//! of up to `Config::max_payload` bytes (1 MiB by default) is carried as
//! one element of its site's stream, in parts where a datagram cannot
//! hold it. `docs/spread.md`, "Large messages", has the design.
//!
//! - **In the ring** ([`RingParts`]): a ring message longer than the ring's
//!   `max_payload` goes as consecutive [`RingMsg::Part`]s. The ring
//!   delivers a sender's messages in its sending order, so every daemon
//!   puts a sender's parts together in order and acts on the whole at the
//!   point of the order where its last part falls: the same point at
//!   every daemon. The parts in progress are part of the site state (a
//!   daemon joining takes them with the snapshot, because the rest of a
//!   message sent across a change of ring arrives after it); a sender
//!   that leaves the ring ends its message there, the same everywhere
//!   (Extended Virtual Synchrony: the members going on together delivered
//!   the same of its parts).
//! - **Across the WAN** ([`WanParts`]): an element longer than a link's
//!   largest message goes as [`WanMsg::Part`]s, each a message of its own
//!   on the Hop link (its own link sequence number, recovered on its own,
//!   forwarded on arrival). The receiving gateway holds the parts by
//!   element until it has them all; Hop delivers them in any order.
//!
//! [`RingMsg::Part`]: super::codec::RingMsg::Part
//! [`WanMsg::Part`]: super::codec::WanMsg::Part

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use super::codec::{Reader, Writer};
use super::{Malformed, SiteId};
use crate::NodeId;

/// Bytes a client message's element may carry besides its payload (the
/// client's name, the group names, the element's header): the bound on
/// what a part assembly may grow to is `max_payload` plus this.
pub const ELEMENT_ALLOWANCE: usize = 64 * 1024;

/// A gateway keeps at most this many bytes of elements whose WAN parts
/// have not all arrived; beyond it the oldest is dropped (the status
/// exchange resends what a site lacks).
pub const WAN_PARTS_MAX_BYTES: usize = 64 * 1024 * 1024;

/// `len` bytes cut into shares of at most `share` bytes: how many.
pub fn part_count(len: usize, share: usize) -> usize {
    len.div_ceil(share.max(1)).max(1)
}

/// A sender's ring message in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Partial {
    count: u32,
    next: u32,
    bytes: Vec<u8>,
}

/// Why a part was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not the part that follows this sender's last one (the start of its
    /// message was before this daemon's state began, or it ended).
    OutOfOrder,
    /// The message would grow past the largest one allowed.
    TooLong,
}

/// Ring messages in progress, by sender: part of the site state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RingParts {
    by_sender: BTreeMap<NodeId, Partial>,
}

impl RingParts {
    /// Takes part `index` of `count` from `sender`; the whole message
    /// when this was its last part. A first part starts the sender's
    /// message afresh; a part that does not follow the last is refused
    /// and ends the message in progress.
    pub fn push(
        &mut self,
        sender: NodeId,
        index: u32,
        count: u32,
        bytes: &[u8],
        max_len: usize,
    ) -> Result<Option<Vec<u8>>, Refused> {
        if index == 0 {
            self.by_sender.insert(
                sender,
                Partial {
                    count,
                    next: 0,
                    bytes: Vec::new(),
                },
            );
        }
        let Some(p) = self.by_sender.get_mut(&sender) else {
            return Err(Refused::OutOfOrder);
        };
        if p.next != index || p.count != count {
            self.by_sender.remove(&sender);
            return Err(Refused::OutOfOrder);
        }
        if p.bytes.len() + bytes.len() > max_len {
            self.by_sender.remove(&sender);
            return Err(Refused::TooLong);
        }
        p.bytes.extend_from_slice(bytes);
        p.next += 1;
        if p.next < p.count {
            return Ok(None);
        }
        Ok(self.by_sender.remove(&sender).map(|p| p.bytes))
    }

    /// Ends the messages of senders not in `members` (they left the ring).
    pub fn keep_senders(&mut self, members: &[NodeId]) {
        self.by_sender.retain(|n, _| members.contains(n));
    }

    pub fn clear(&mut self) {
        self.by_sender.clear();
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_sender.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_sender.len()
    }

    pub(super) fn encode(&self, w: &mut Writer) {
        w.u32(self.by_sender.len() as u32);
        for (n, p) in &self.by_sender {
            w.u32(n.0).u32(p.count).u32(p.next).bytes(&p.bytes);
        }
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<RingParts, Malformed> {
        let mut by_sender = BTreeMap::new();
        for _ in 0..r.count32(16)? {
            let node = NodeId(r.u32()?);
            let (count, next) = (r.u32()?, r.u32()?);
            let bytes = r.bytes()?.to_vec();
            if next == 0 || next >= count {
                return Err(Malformed);
            }
            by_sender.insert(node, Partial { count, next, bytes });
        }
        Ok(RingParts { by_sender })
    }
}

/// An element of another site: (epoch, origin, seq).
pub type ElementKey = (u32, SiteId, u64);

/// An element's WAN parts received so far.
#[derive(Debug)]
struct Pieces {
    parts: Vec<Option<Bytes>>,
    have: usize,
    bytes: usize,
}

/// Elements whose WAN parts are arriving, at a gateway.
#[derive(Debug, Default)]
pub struct WanParts {
    pieces: BTreeMap<ElementKey, Pieces>,
    /// Keys in the order their first part came, for dropping the oldest.
    arrival: VecDeque<ElementKey>,
    bytes: usize,
}

impl WanParts {
    /// Takes part `index` of `count` of element `key`; the element's
    /// bytes once every part is in. A duplicate is ignored; a part whose
    /// count disagrees with the element's first is refused.
    pub fn push(
        &mut self,
        key: ElementKey,
        index: u32,
        count: u32,
        bytes: Bytes,
        max_len: usize,
    ) -> Result<Option<Bytes>, Refused> {
        let (index, count) = (index as usize, count as usize);
        if count.saturating_sub(1).saturating_mul(bytes.len().max(1)) > max_len {
            return Err(Refused::TooLong);
        }
        match self.pieces.get(&key) {
            Some(p) if p.parts.len() != count => return Err(Refused::OutOfOrder),
            Some(p) if p.parts[index].is_some() => return Ok(None),
            Some(p) if p.bytes + bytes.len() > max_len => {
                self.drop_element(key);
                return Err(Refused::TooLong);
            }
            Some(_) => {}
            None => {
                self.pieces.insert(
                    key,
                    Pieces {
                        parts: vec![None; count],
                        have: 0,
                        bytes: 0,
                    },
                );
                self.arrival.push_back(key);
            }
        }
        let p = self.pieces.get_mut(&key).expect("present");
        p.have += 1;
        p.bytes += bytes.len();
        self.bytes += bytes.len();
        p.parts[index] = Some(bytes);
        if p.have < count {
            self.trim();
            return Ok(None);
        }
        let p = self.pieces.remove(&key).expect("present");
        self.bytes -= p.bytes;
        self.arrival.retain(|k| *k != key);
        let mut whole = Vec::with_capacity(p.bytes);
        for b in p.parts.into_iter().flatten() {
            whole.extend_from_slice(&b);
        }
        Ok(Some(Bytes::from(whole)))
    }

    /// Drops the oldest elements in progress while above the bound.
    fn trim(&mut self) {
        while self.bytes > WAN_PARTS_MAX_BYTES {
            let Some(key) = self.arrival.pop_front() else {
                break;
            };
            if let Some(p) = self.pieces.remove(&key) {
                self.bytes -= p.bytes;
            }
        }
    }

    fn drop_element(&mut self, key: ElementKey) {
        if let Some(p) = self.pieces.remove(&key) {
            self.bytes -= p.bytes;
        }
        self.arrival.retain(|k| *k != key);
    }

    /// Forgets elements of configurations before `epoch`.
    pub fn forget_before(&mut self, epoch: u32) {
        let old: Vec<ElementKey> = self
            .pieces
            .keys()
            .filter(|k| k.0 < epoch)
            .copied()
            .collect();
        for key in old {
            if let Some(p) = self.pieces.remove(&key) {
                self.bytes -= p.bytes;
            }
        }
        self.arrival.retain(|k| k.0 >= epoch);
    }

    pub fn clear(&mut self) {
        *self = WanParts::default();
    }

    /// Elements in progress.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pieces.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_parts_join_in_order_and_refuse_strays() {
        let mut r = RingParts::default();
        let a = NodeId(1);
        assert_eq!(r.push(a, 1, 3, b"x", 100), Err(Refused::OutOfOrder));
        assert_eq!(r.push(a, 0, 3, b"ab", 100), Ok(None));
        assert_eq!(r.push(NodeId(2), 0, 2, b"zz", 100), Ok(None));
        assert_eq!(r.push(a, 1, 3, b"cd", 100), Ok(None));
        assert_eq!(r.push(a, 2, 3, b"e", 100), Ok(Some(b"abcde".to_vec())));
        assert_eq!(r.push(a, 2, 3, b"e", 100), Err(Refused::OutOfOrder));
        // A skipped part ends the message.
        assert_eq!(r.push(a, 0, 3, b"ab", 100), Ok(None));
        assert_eq!(r.push(a, 2, 3, b"e", 100), Err(Refused::OutOfOrder));
        assert_eq!(r.push(a, 1, 3, b"cd", 100), Err(Refused::OutOfOrder));
        // Too long.
        assert_eq!(r.push(a, 0, 3, b"abcd", 5), Ok(None));
        assert_eq!(r.push(a, 1, 3, b"ef", 5), Err(Refused::TooLong));
        // A departed sender's message ends; the state round-trips.
        r.keep_senders(&[a]);
        assert!(r.is_empty());
        assert_eq!(r.push(NodeId(2), 0, 2, b"zz", 100), Ok(None));
        let mut w = Writer::default();
        r.encode(&mut w);
        let back = RingParts::decode(&mut Reader::new(&w.0)).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn wan_parts_join_in_any_order() {
        let mut w = WanParts::default();
        let key = (1, SiteId(2), 7);
        let part = |s: &'static [u8]| Bytes::from_static(s);
        assert_eq!(w.push(key, 2, 3, part(b"e"), 100), Ok(None));
        assert_eq!(w.push(key, 0, 3, part(b"ab"), 100), Ok(None));
        assert_eq!(w.push(key, 0, 3, part(b"ab"), 100), Ok(None));
        assert_eq!(
            w.push(key, 1, 4, part(b"cd"), 100),
            Err(Refused::OutOfOrder)
        );
        assert_eq!(w.len(), 1);
        assert_eq!(
            w.push(key, 1, 3, part(b"cd"), 100),
            Ok(Some(Bytes::from_static(b"abcde")))
        );
        assert_eq!(w.len(), 0);
        assert_eq!(
            w.push(key, 0, 1000, part(b"ab"), 100),
            Err(Refused::TooLong)
        );
        assert_eq!(w.push((1, SiteId(2), 8), 0, 2, part(b"ab"), 100), Ok(None));
        w.forget_before(2);
        assert_eq!(w.len(), 0);
        assert_eq!(w.bytes, 0);
    }
}
