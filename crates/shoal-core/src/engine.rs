//! What every engine shares: node identities, datagrams to send, and the
//! [`Engine`] trait that drivers (runtime, simulator) are generic over.

use bytes::Bytes;

use crate::time::Instant;

/// A member's identity: a dense index the driver maps to an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub u32);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A member list in canonical form (ascending, no repeats) and `me`'s index
/// in it; `None` when `me` is not in the list. Engines index per-member state
/// by this position.
pub fn member_list(me: NodeId, members: &[NodeId]) -> Option<(Vec<NodeId>, usize)> {
    let mut members = members.to_vec();
    members.sort_unstable();
    members.dedup();
    let index = members.binary_search(&me).ok()?;
    Some((members, index))
}

/// A member list in canonical form (ascending, no repeats), shared rather
/// than copied: the engines of one view that only read the list hold one
/// allocation between them (a simulated group of n members would otherwise
/// hold n copies of n ids). Cloning is a reference-count increment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberList(std::sync::Arc<[NodeId]>);

impl MemberList {
    /// The canonical form of `members` (sorted, repeats removed).
    pub fn new(members: &[NodeId]) -> MemberList {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        MemberList(members.into())
    }

    /// Members `NodeId(0)..NodeId(n)`, the dense ids drivers hand out.
    pub fn dense(n: u32) -> MemberList {
        MemberList((0..n).map(NodeId).collect())
    }

    /// `node`'s position in the list. Dense ids (member i is `NodeId(i)`)
    /// are the common case: one probe, then a binary search.
    pub fn index_of(&self, node: NodeId) -> Option<usize> {
        let dense = node.0 as usize;
        if self.0.get(dense) == Some(&node) {
            return Some(dense);
        }
        self.0.binary_search(&node).ok()
    }

    pub fn as_slice(&self) -> &[NodeId] {
        &self.0
    }
}

impl std::ops::Deref for MemberList {
    type Target = [NodeId];
    fn deref(&self) -> &[NodeId] {
        &self.0
    }
}

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// One member, by unicast.
    Node(NodeId),
    /// Every member of the group, by IP multicast. Engines only emit this when
    /// their configuration says the transport offers multicast; the sender
    /// does not receive its own multicast back (drivers filter loopback).
    Multicast,
}

/// A change of the IP multicast groups an engine receives on, beside the
/// driver's one configured group of [`Destination::Multicast`] (QSM's
/// per-region addresses): the driver joins or leaves the group on its
/// configured multicast interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupChange {
    Join(std::net::SocketAddr),
    Leave(std::net::SocketAddr),
}

/// A datagram for an IP multicast group the engine names itself
/// ([`GroupChange`]); the sender does not receive it back (drivers filter
/// their own datagrams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTransmit {
    pub group: std::net::SocketAddr,
    pub payload: Bytes,
}

/// A datagram to send: one or more packets packed together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub destination: Destination,
    pub payload: Bytes,
}

/// The sans-IO contract shared by the protocol engines.
///
/// After any `handle_*` call, the driver drains `poll_transmit` and
/// `poll_event` completely, then asks `poll_timeout` when to wake the engine.
/// Time passed in never runs backwards from the engine's point of view: an
/// earlier `now` than one already seen is treated as the latest seen.
pub trait Engine {
    /// What the application is told (deliveries, losses, views).
    type Event;

    /// This engine's member identity.
    fn node_id(&self) -> NodeId;
    /// A datagram arrived from `from`. Bad bytes are counted and dropped.
    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]);
    /// As [`Engine::handle_datagram`], for a driver that holds the datagram as
    /// [`Bytes`] sized to the datagram: the engine may keep slices of it
    /// (payloads in its log) instead of copying. The simulator uses this, as
    /// one multicast datagram reaches hundreds of engines. A driver that
    /// receives into a large reusable buffer should call `handle_datagram`,
    /// or a kept slice would pin the whole buffer.
    fn handle_datagram_bytes(&mut self, now: Instant, from: NodeId, datagram: &Bytes) {
        self.handle_datagram(now, from, datagram)
    }
    /// The deadline returned by `poll_timeout` has passed (spurious calls are harmless).
    fn handle_timeout(&mut self, now: Instant);
    /// Originates a multicast of `payload`; errors leave the engine unchanged.
    fn multicast(&mut self, now: Instant, payload: bytes::Bytes) -> Result<u64, SendError>;
    /// The next datagram to send, built from fresh state.
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit>;
    /// The next event for the application.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// When `handle_timeout` should next be called.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Whether the engine takes application input now (the daemon engine
    /// stops taking client frames while too much waits for the total
    /// order); a driver holds input back, and so back-pressures its
    /// sources, while this is false.
    fn accepts_input(&self) -> bool {
        true
    }
    /// The next change of the IP multicast groups the engine receives on
    /// (none by default). A driver drains it with `poll_transmit`, and
    /// joins a group before it sends the engine's next datagrams.
    fn poll_group_change(&mut self) -> Option<GroupChange> {
        None
    }
    /// The next datagram for a group of [`Engine::poll_group_change`]
    /// (none by default), drained after `poll_transmit`.
    fn poll_group_transmit(&mut self, _now: Instant) -> Option<GroupTransmit> {
        None
    }
}

/// Why a multicast was refused. The engine's state is unchanged in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Flow control: too many of this member's messages are not yet known to
    /// have reached every live member. Retry after more datagrams arrive
    /// (`can_send` tells when).
    #[error("send window full: retry once receivers catch up")]
    WindowFull,
    /// The payload does not fit in one datagram.
    #[error("payload of {len} bytes exceeds the maximum {max}")]
    TooLarge { len: usize, max: usize },
}
