//! What a member has to send, and how it becomes datagrams.
//!
//! Control packets (digests, solicitations, flow-control status) go first,
//! then retransmissions, then new data: control packets are emergency
//! vehicles (DESIGN.md). Digests are built when the datagram is assembled,
//! from the buffer as it is at that moment (QSM's "act on fresh state").
//! Packets to the same destination are packed into one datagram up to
//! `max_datagram_size`; when only one packet is waiting it leaves alone, so
//! packing adds no delay at low rates.

use std::collections::VecDeque;

use bytes::Bytes;
use shoal_wire::{Packet, SourceRanges};

use super::Pbcast;
use crate::engine::{Destination, NodeId, Transmit};
use crate::time::Instant;

#[derive(Debug)]
pub(super) enum Control {
    Gossip {
        to: NodeId,
        /// Missing messages whose push this member invited recently.
        awaited: Vec<SourceRanges>,
    },
    Solicit {
        to: NodeId,
        wanted: Vec<SourceRanges>,
        again: Vec<SourceRanges>,
    },
    Status {
        to: NodeId,
        next: u64,
    },
}

impl Control {
    fn to(&self) -> NodeId {
        match self {
            Control::Gossip { to, .. }
            | Control::Solicit { to, .. }
            | Control::Status { to, .. } => *to,
        }
    }
}

#[derive(Debug)]
pub(super) struct Retransmit {
    /// Usually the solicitor or gossiper; IP multicast for pbcast-IPMC/grb.
    pub destination: Destination,
    /// Index of the source in the member list.
    pub source: u32,
    pub seq: u64,
    /// Sent unasked (a push), not answering a solicitation.
    pub pushed: bool,
}

/// A new message passed on to a child in its source's relay tree.
#[derive(Debug)]
pub(super) struct RelayCopy {
    pub to: NodeId,
    /// Index of the source in the member list.
    pub source: u32,
    pub seq: u64,
}

/// A data datagram being sent to each target in turn (no IP multicast):
/// every other member, or this member's children in its own relay tree.
#[derive(Debug)]
struct Fanout {
    payload: Bytes,
    targets: Vec<NodeId>,
    next: usize,
}

#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub control: VecDeque<Control>,
    pub retransmits: VecDeque<Retransmit>,
    /// First-phase messages to pass on down relay trees.
    pub relays: VecDeque<RelayCopy>,
    /// This member's own messages not yet sent in the first phase.
    pub fresh: VecDeque<u64>,
    fanout: Option<Fanout>,
}

/// The next datagram, or `None` when nothing is waiting.
pub(super) fn assemble(engine: &mut Pbcast, _now: Instant) -> Option<Transmit> {
    if let Some(transmit) = next_fanout_copy(engine) {
        return Some(transmit);
    }
    let outbox = &engine.outbox;
    let destination = outbox
        .control
        .front()
        .map(|c| Destination::Node(c.to()))
        .or_else(|| outbox.retransmits.front().map(|r| r.destination));
    if let Some(destination) = destination {
        return Some(pack_repairs(engine, destination));
    }
    if let Some(to) = engine.outbox.relays.front().map(|r| r.to) {
        return Some(pack_relays(engine, to));
    }
    if engine.outbox.fresh.is_empty() {
        return None;
    }
    pack_fresh(engine)
}

/// Control packets (always unicast) and retransmissions for one destination.
fn pack_repairs(engine: &mut Pbcast, destination: Destination) -> Transmit {
    let mut buf = Vec::with_capacity(engine.config.max_datagram_size.min(16 * 1024));
    if let Destination::Node(to) = destination {
        pack_control(engine, to, &mut buf);
    }
    pack_retransmits(engine, destination, &mut buf);
    Transmit {
        destination,
        payload: sized(buf),
    }
}

/// A datagram's bytes in an allocation of their own size. Control
/// datagrams (a digest, a solicitation) fill tens of bytes of the
/// datagram-sized buffer they are built in; handed over as it is, that
/// buffer and a shared header for it stay allocated until the last copy
/// of the datagram is dropped, and freeing a buffer that large, a while
/// later, costs the allocator cache misses at its neighbours (5% of a
/// 3,280-member simulation). Copied out, the build buffer is freed at
/// once, and the datagram is one small allocation.
fn sized(buf: Vec<u8>) -> Bytes {
    Bytes::copy_from_slice(&buf)
}

fn pack_control(engine: &mut Pbcast, to: NodeId, buf: &mut Vec<u8>) {
    while engine.outbox.control.front().is_some_and(|c| c.to() == to) {
        let control = engine.outbox.control.pop_front().expect("front exists");
        let packet = match control {
            Control::Gossip { awaited, .. } => engine.gossip_packet(awaited),
            Control::Solicit { wanted, again, .. } => Packet::Solicit { wanted, again },
            Control::Status { next, .. } => Packet::Status { source: to.0, next },
        };
        if !append(engine, &packet, buf) {
            // No room left: put it back for the next datagram.
            engine.outbox.control.push_front(unbuild(to, packet));
            return;
        }
    }
}

/// Turns a packet that did not fit back into its queued form.
fn unbuild(to: NodeId, packet: Packet<'_>) -> Control {
    match packet {
        Packet::Solicit { wanted, again } => Control::Solicit { to, wanted, again },
        Packet::Status { next, .. } => Control::Status { to, next },
        Packet::Gossip { awaited, .. } => Control::Gossip { to, awaited },
        _ => unreachable!("only gossip, solicit and status are control packets"),
    }
}

fn pack_retransmits(engine: &mut Pbcast, destination: Destination, buf: &mut Vec<u8>) {
    while let Some(front) = engine.outbox.retransmits.front() {
        if front.destination != destination {
            return;
        }
        let (source, seq, pushed) = (front.source as usize, front.seq, front.pushed);
        // Collected since it was queued: nothing to send.
        let Some(payload) = engine.logs.get(source).payload(seq).cloned() else {
            engine.outbox.retransmits.pop_front();
            continue;
        };
        let (source, payload) = (engine.members[source].0, &payload[..]);
        let packet = if pushed {
            Packet::Push {
                source,
                seq,
                payload,
            }
        } else {
            Packet::Retransmit {
                source,
                seq,
                payload,
            }
        };
        if !append(engine, &packet, buf) {
            return;
        }
        if destination == Destination::Multicast {
            engine.stats.retransmits_multicast += 1;
        }
        engine.outbox.retransmits.pop_front();
    }
}

/// Relayed messages for one child, packed.
fn pack_relays(engine: &mut Pbcast, to: NodeId) -> Transmit {
    let mut buf = Vec::with_capacity(engine.config.max_datagram_size.min(64 * 1024));
    while let Some(front) = engine.outbox.relays.front() {
        if front.to != to {
            break;
        }
        let (source, seq) = (front.source as usize, front.seq);
        let Some(payload) = engine.logs.get(source).payload(seq).cloned() else {
            engine.outbox.relays.pop_front();
            continue;
        };
        let packet = Packet::Relay {
            source: engine.members[source].0,
            seq,
            payload: &payload,
        };
        if !append(engine, &packet, &mut buf) {
            break;
        }
        engine.outbox.relays.pop_front();
    }
    Transmit {
        destination: Destination::Node(to),
        payload: Bytes::from(buf),
    }
}

/// Encodes `packet` into `buf` if it fits (an empty buffer always takes one
/// packet). Returns whether it was appended.
fn append(engine: &mut Pbcast, packet: &Packet<'_>, buf: &mut Vec<u8>) -> bool {
    let fits = buf.len() + packet.encoded_len() <= engine.config.max_datagram_size;
    if !fits && !buf.is_empty() {
        return false;
    }
    if packet.encode(engine.me.0, buf).is_err() {
        // Larger than any datagram: cannot happen for packets this engine
        // builds from validated settings; drop it rather than wedge the queue.
        return true;
    }
    engine.stats.packets_sent[packet.kind().index()] += 1;
    true
}

/// Packs this member's new messages and starts their first phase.
fn pack_fresh(engine: &mut Pbcast) -> Option<Transmit> {
    let mut buf = Vec::with_capacity(engine.config.max_datagram_size.min(64 * 1024));
    let me = engine.my_index;
    let mut packets = 0u64;
    while let Some(&seq) = engine.outbox.fresh.front() {
        let Some(payload) = engine.logs.get(me).payload(seq).cloned() else {
            engine.outbox.fresh.pop_front();
            continue;
        };
        let packet = Packet::Data {
            seq,
            payload: &payload,
        };
        let fits = buf.len() + packet.encoded_len() <= engine.config.max_datagram_size;
        if !fits && !buf.is_empty() {
            break;
        }
        packet
            .encode(engine.me.0, &mut buf)
            .expect("payload size checked in multicast");
        packets += 1;
        engine.outbox.fresh.pop_front();
    }
    if buf.is_empty() {
        return None;
    }
    let payload = Bytes::from(buf);
    let data = shoal_wire::Kind::Data.index();
    if engine.config.ip_multicast {
        engine.stats.packets_sent[data] += packets;
        return Some(Transmit {
            destination: Destination::Multicast,
            payload,
        });
    }
    let targets: Vec<NodeId> = if engine.relaying() {
        engine.relay_children(me)
    } else {
        let others = engine.members.iter().enumerate().filter(|(i, _)| *i != me);
        others.map(|(_, m)| *m).collect()
    };
    engine.stats.packets_sent[data] += packets * targets.len() as u64;
    engine.outbox.fanout = Some(Fanout {
        payload,
        targets,
        next: 0,
    });
    next_fanout_copy(engine)
}

fn next_fanout_copy(engine: &mut Pbcast) -> Option<Transmit> {
    let fanout = engine.outbox.fanout.as_mut()?;
    let Some(&to) = fanout.targets.get(fanout.next) else {
        engine.outbox.fanout = None;
        return None;
    };
    fanout.next += 1;
    let payload = fanout.payload.clone();
    if fanout.next >= fanout.targets.len() {
        engine.outbox.fanout = None;
    }
    Some(Transmit {
        destination: Destination::Node(to),
        payload,
    })
}
