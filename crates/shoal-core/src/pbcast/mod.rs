//! Bimodal Multicast (pbcast): P001 §B (Ozkasap, Xiao, Birman), P000 §3
//! (Gupta, Birman, van Renesse). STUB: the implementation lands next.

mod config;

pub use config::{Config, ConfigError, Delivery, GossipMode};

use bytes::Bytes;
use shoal_wire::SeqRange;

use crate::engine::{Engine, NodeId, SendError, Transmit};
use crate::time::Instant;

/// What a pbcast member tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message, delivered once.
    Deliver {
        source: NodeId,
        seq: u64,
        payload: Bytes,
        /// It came by a retransmission (gossip repair), not the first phase.
        recovered: bool,
    },
    /// These messages of `source` can no longer be repaired: they were
    /// collected everywhere this member asked. Never silence.
    Lost { source: NodeId, range: SeqRange },
}

/// Counters of one member. Packet counters are indexed by `Kind::index()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub packets_sent: [u64; 5],
    pub packets_received: [u64; 5],
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub bytes_sent: u64,
    pub malformed: u64,
    pub originated: u64,
    pub delivered: u64,
    pub recovered: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub retransmits_suppressed: u64,
}

/// One pbcast member.
pub struct Pbcast {
    me: NodeId,
}

impl Pbcast {
    /// A member `me` of the static group `members` (which must contain `me`).
    /// `seed` drives every random choice; `now` is the creation time.
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Pbcast, ConfigError> {
        let _ = (members, seed, now);
        config.validate()?;
        Ok(Pbcast { me })
    }

    pub fn config(&self) -> &Config {
        todo!()
    }

    pub fn stats(&self) -> &Stats {
        todo!()
    }

    /// Flow control allows a multicast now.
    pub fn can_send(&self, now: Instant) -> bool {
        let _ = now;
        todo!()
    }

    /// Messages held in the buffer (all sources), for memory metrics.
    pub fn buffered(&self) -> usize {
        todo!()
    }
}

impl Engine for Pbcast {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        let _ = (now, from, datagram);
        todo!()
    }

    fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let _ = (now, payload);
        todo!()
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let _ = now;
        todo!()
    }

    fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
}
