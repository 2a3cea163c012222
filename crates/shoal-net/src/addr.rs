//! The static member list: `NodeId` ↔ `SocketAddr`.
//!
//! Member `i` of the list is `NodeId(i)`. A *slotted* book
//! ([`AddressBook::slotted`]) is the daemons' variant: an id's low
//! `slot_bits` bits name the address and the rest is an incarnation
//! (`shoal_core::cluster`), so a restarted daemon keeps its address under a
//! new id; the sender's full id is then read from each datagram's header
//! and must match the address it came from.

use std::collections::HashMap;
use std::net::SocketAddr;

use shoal_core::NodeId;

use crate::NetError;

/// Unicast addresses of the members, indexed by `NodeId`.
#[derive(Debug, Clone)]
pub struct AddressBook {
    addrs: Vec<SocketAddr>,
    // Lookup only, never iterated: order cannot leak into behaviour.
    ids: HashMap<SocketAddr, NodeId>,
    /// `Some(bits)` for a slotted book.
    slot_bits: Option<u32>,
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
            addrs,
            ids,
            slot_bits: None,
        })
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

    /// Where `node` receives unicast datagrams.
    pub fn addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.addrs.get(self.slot(node)).copied()
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

    /// Every member, in `NodeId` order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.addrs.len()).map(|i| NodeId(i as u32))
    }

    /// Every member's address, in `NodeId` order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
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
    fn duplicate_rejected() {
        let err = AddressBook::new(vec![addr(7000), addr(7000)]).unwrap_err();
        assert!(matches!(err, NetError::AddressBook(_)));
    }
}
