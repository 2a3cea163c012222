//! The static member list: `NodeId` ↔ `SocketAddr`.
//!
//! Member `i` of the list is `NodeId(i)`. A *slotted* book
//! ([`AddressBook::slotted`]) is the daemons' variant: an id's low
//! `slot_bits` bits name the address and the rest is an incarnation
//! (`shoal_core::daemon::membership`), so a restarted daemon keeps its address under a
//! new id; the sender's full id is then read from each datagram's header
//! and must match the address it came from.
//!
//! A *learning* book ([`AddressBook::learning`]) is the slotted book of
//! daemons that find each other by IP multicast (`discovery`): it starts
//! with only its own slot bound, and [`AddressBook::learn`] binds a slot to
//! the address of the first datagram that claims it. The rule, and what it
//! trusts:
//!
//! - an unbound slot claimed from an unknown address is bound to it, for
//!   good (a daemon restarted at the same address keeps its slot);
//! - a slot already bound to another address, or a known address claiming
//!   another slot, is a *conflict*: the datagram is refused, the binding
//!   stays. Two daemons configured with one slot thus never displace each
//!   other; the one heard first keeps it.
//!
//! The runtime calls `learn` only for datagrams that opened with the
//! cluster key (when one is configured). The key proves that the sender
//! belongs to the cluster, not that it owns the slot it claims: any holder
//! of the key can take a slot nobody has claimed yet. Without a key, any
//! process on the host can.

use std::collections::HashMap;
use std::net::SocketAddr;

use shoal_core::NodeId;

use crate::NetError;

/// Unicast addresses of the members, indexed by `NodeId`.
#[derive(Debug, Clone)]
pub struct AddressBook {
    /// Index: `NodeId` (or slot). `None` only in a learning book, for a
    /// slot not heard from yet.
    addrs: Vec<Option<SocketAddr>>,
    // Lookup only, never iterated: order cannot leak into behaviour.
    ids: HashMap<SocketAddr, NodeId>,
    /// `Some(bits)` for a slotted book.
    slot_bits: Option<u32>,
    /// Slots are bound to addresses as datagrams arrive ([`AddressBook::learn`]).
    learning: bool,
}

/// What [`AddressBook::learn`] did with a datagram from an address the book
/// did not know as the claimed slot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// The claimed slot was free: it is now bound to the address, and this
    /// is the sender.
    Bound(NodeId),
    /// The claimed slot is bound to another address.
    SlotTaken { slot: usize, by: SocketAddr },
    /// The address is bound to another slot.
    AddressTaken { slot: usize, claimed: usize },
    /// Not a learning book, or the datagram names no sender.
    Refused,
}

impl AddressBook {
    /// Member `i` lives at `addrs[i]`. Addresses must be distinct.
    pub fn new(addrs: Vec<SocketAddr>) -> Result<AddressBook, NetError> {
        let mut ids = HashMap::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
            let id = NodeId(u32::try_from(i).map_err(|_| too_many(addrs.len()))?);
            if ids.insert(*addr, id).is_some() {
                return Err(NetError::AddressBook(format!("{addr} listed twice")));
            }
        }
        Ok(AddressBook {
            addrs: addrs.into_iter().map(Some).collect(),
            ids,
            slot_bits: None,
            learning: false,
        })
    }

    /// A slotted book of `2^slot_bits` slots with only `slot` bound (to
    /// `addr`, this daemon's own); the others are learned from datagrams.
    pub fn learning(
        slot_bits: u32,
        slot: usize,
        addr: SocketAddr,
    ) -> Result<AddressBook, NetError> {
        let slots = 1usize << slot_bits;
        if slot >= slots {
            return Err(NetError::AddressBook(format!(
                "slot {slot} does not fit in {slot_bits} slot bits"
            )));
        }
        let mut addrs = vec![None; slots];
        addrs[slot] = Some(addr);
        let id = NodeId(u32::try_from(slot).map_err(|_| too_many(slots))?);
        Ok(AddressBook {
            addrs,
            ids: HashMap::from([(addr, id)]),
            slot_bits: Some(slot_bits),
            learning: true,
        })
    }

    /// Whether slots are learned from datagrams.
    pub fn is_learning(&self) -> bool {
        self.learning
    }

    /// Binds the slot `sender` claims to `addr` when both are free (see the
    /// module's rule). Call it only for a datagram that `sender` refused and
    /// that passed authentication.
    pub fn learn(&mut self, addr: SocketAddr, sender: Option<u32>) -> Learned {
        let Some(claimed) = sender.filter(|_| self.learning) else {
            return Learned::Refused;
        };
        let slot = self.slot(NodeId(claimed));
        if let Some(listed) = self.ids.get(&addr) {
            return Learned::AddressTaken {
                slot: listed.0 as usize,
                claimed: slot,
            };
        }
        match self.addrs[slot] {
            Some(by) => Learned::SlotTaken { slot, by },
            None => {
                self.addrs[slot] = Some(addr);
                self.ids.insert(addr, NodeId(slot as u32));
                Learned::Bound(NodeId(claimed))
            }
        }
    }

    /// A book whose ids carry the address index in their low `slot_bits`.
    pub fn slotted(addrs: Vec<SocketAddr>, slot_bits: u32) -> Result<AddressBook, NetError> {
        if addrs.len() > 1usize << slot_bits {
            return Err(NetError::AddressBook(format!(
                "{} addresses do not fit in {slot_bits} slot bits",
                addrs.len()
            )));
        }
        let mut book = AddressBook::new(addrs)?;
        book.slot_bits = Some(slot_bits);
        Ok(book)
    }

    /// The address index of `node`.
    pub fn slot(&self, node: NodeId) -> usize {
        match self.slot_bits {
            Some(bits) => (node.0 & ((1u32 << bits) - 1)) as usize,
            None => node.0 as usize,
        }
    }

    /// Whether ids carry an incarnation above the slot.
    pub fn is_slotted(&self) -> bool {
        self.slot_bits.is_some()
    }

    /// Where `node` receives unicast datagrams (`None` also for a slot a
    /// learning book has not heard from).
    pub fn addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.addrs.get(self.slot(node)).copied().flatten()
    }

    /// The sender of a datagram from `addr` whose header names `sender`:
    /// in a plain book the id listed at `addr` (the header is not
    /// consulted); in a slotted book `sender` itself, if its slot is `addr`'s.
    pub fn sender(&self, addr: SocketAddr, sender: Option<u32>) -> Option<NodeId> {
        let listed = self.node(addr)?;
        if !self.is_slotted() {
            return Some(listed);
        }
        let claimed = NodeId(sender?);
        (self.slot(claimed) == listed.0 as usize).then_some(claimed)
    }

    /// The member sending from `addr`, if it is one.
    pub fn node(&self, addr: SocketAddr) -> Option<NodeId> {
        self.ids.get(&addr).copied()
    }

    /// Every member (in a learning book, every bound slot), in `NodeId` order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.bound().map(|(i, _)| NodeId(i as u32))
    }

    /// Every bound index (`NodeId` or slot) with its address, in order.
    pub fn bound(&self) -> impl Iterator<Item = (usize, SocketAddr)> + '_ {
        self.addrs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((i, (*a)?)))
    }

    /// Addresses bound.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

fn too_many(n: usize) -> NetError {
    NetError::AddressBook(format!("{n} members do not fit in a u32 NodeId"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn maps_both_ways() {
        let book = AddressBook::new(vec![addr(7000), addr(7001), addr(7002)]).unwrap();
        assert_eq!(book.len(), 3);
        for (i, node) in book.members().enumerate() {
            assert_eq!(node, NodeId(i as u32));
            assert_eq!(book.node(book.addr(node).unwrap()), Some(node));
        }
        assert_eq!(book.node(addr(7001)), Some(NodeId(1)));
    }

    #[test]
    fn unknown_is_none() {
        let book = AddressBook::new(vec![addr(7000)]).unwrap();
        assert_eq!(book.node(addr(7999)), None);
        assert_eq!(book.node(SocketAddr::from(([127, 0, 0, 2], 7000))), None);
        assert_eq!(book.addr(NodeId(1)), None);
    }

    #[test]
    fn slotted_book_routes_by_slot_and_checks_the_claimed_sender() {
        let book = AddressBook::slotted(vec![addr(7000), addr(7001)], 8).unwrap();
        let id = NodeId((42 << 8) | 1);
        assert_eq!(book.addr(id), Some(addr(7001)));
        assert_eq!(book.sender(addr(7001), Some(id.0)), Some(id));
        // Claims another slot's id, or names none: refused.
        assert_eq!(book.sender(addr(7000), Some(id.0)), None);
        assert_eq!(book.sender(addr(7001), None), None);
        assert_eq!(book.sender(addr(7999), Some(id.0)), None);
        assert!(AddressBook::slotted(vec![addr(1), addr(2), addr(3)], 1).is_err());
    }

    #[test]
    fn a_learning_book_binds_a_free_slot_to_the_first_address_that_claims_it() {
        let mut book = AddressBook::learning(8, 3, addr(7003)).unwrap();
        assert!(book.is_learning());
        assert_eq!(book.addr(NodeId((9 << 8) | 3)), Some(addr(7003)));
        assert_eq!(book.len(), 1);
        let a = NodeId((42 << 8) | 1);
        assert_eq!(book.addr(a), None);
        assert_eq!(book.sender(addr(7001), Some(a.0)), None);
        assert_eq!(book.learn(addr(7001), Some(a.0)), Learned::Bound(a));
        assert_eq!(book.sender(addr(7001), Some(a.0)), Some(a));
        assert_eq!(book.addr(a), Some(addr(7001)));
        // A new incarnation at the same address is that slot's sender.
        let restarted = NodeId((43 << 8) | 1);
        assert_eq!(book.sender(addr(7001), Some(restarted.0)), Some(restarted));
        assert_eq!(
            book.members().collect::<Vec<_>>(),
            vec![NodeId(1), NodeId(3)]
        );
        assert_eq!(book.bound().count(), 2);
    }

    #[test]
    fn a_learning_book_refuses_a_taken_slot_and_a_second_slot_for_an_address() {
        let mut book = AddressBook::learning(8, 0, addr(7000)).unwrap();
        let a = NodeId((1 << 8) | 1);
        assert_eq!(book.learn(addr(7001), Some(a.0)), Learned::Bound(a));
        // Slot 1 from elsewhere: refused, binding kept.
        assert_eq!(
            book.learn(addr(7999), Some(a.0)),
            Learned::SlotTaken {
                slot: 1,
                by: addr(7001)
            }
        );
        // This daemon's own slot claimed by another address.
        assert_eq!(
            book.learn(addr(7999), Some(5 << 8)),
            Learned::SlotTaken {
                slot: 0,
                by: addr(7000)
            }
        );
        // A known address claiming a second slot.
        assert_eq!(
            book.learn(addr(7001), Some((1 << 8) | 2)),
            Learned::AddressTaken {
                slot: 1,
                claimed: 2
            }
        );
        assert_eq!(book.addr(a), Some(addr(7001)));
        assert_eq!(book.learn(addr(7002), None), Learned::Refused);
        assert!(AddressBook::learning(8, 256, addr(7000)).is_err());
        // A static book never learns.
        let mut fixed = AddressBook::slotted(vec![addr(7000)], 8).unwrap();
        assert_eq!(fixed.learn(addr(7001), Some(1)), Learned::Refused);
        assert!(!fixed.is_learning());
    }

    #[test]
    fn duplicate_rejected() {
        let err = AddressBook::new(vec![addr(7000), addr(7000)]).unwrap_err();
        assert!(matches!(err, NetError::AddressBook(_)));
    }
}
