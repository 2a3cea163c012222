//! The static member list: `NodeId` ↔ `SocketAddr`.
//!
//! Member `i` of the list is `NodeId(i)`. The membership issue replaces this
//! with views; until then every node of a group is handed the same book.

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
        Ok(AddressBook { addrs, ids })
    }

    /// Where `node` receives unicast datagrams.
    pub fn addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.addrs.get(node.0 as usize).copied()
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
    fn duplicate_rejected() {
        let err = AddressBook::new(vec![addr(7000), addr(7000)]).unwrap_err();
        assert!(matches!(err, NetError::AddressBook(_)));
    }
}
