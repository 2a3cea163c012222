//! A gateway of the sites layer (`shoal_core::sites::SiteDaemon`) fed
//! arbitrary datagrams from its ring peer and from the other site's
//! gateway: no panic, and forged counts, sequence numbers, epochs or sites
//! cannot make it hold elements or requests without bound.
//!
//! Two sites (0 | 1, 2), one link; the fuzzed daemon is 0, its site's
//! only daemon (so its gateway from the start: a daemon of a larger site
//! is live only once its ring formed), with a local client in group "g"
//! that sent a message. Input: chunks `[mode, advance_ms, len_hi, len_lo, bytes…]`.
//! The mode says how the bytes arrive, so that the fuzzer reaches the
//! decoders behind the Ring and Hop framing too:
//! - 0: a LAN datagram from daemon 1 (handed to the ring as is);
//! - 1: a WAN datagram from daemon 2, as is;
//! - 2: a ring message (`RingMsg` bytes) in a Ring DATA packet of the
//!   daemon's ring from daemon 1, numbered after the daemon's own;
//! - 3: a gateway message (`WanMsg` bytes) in a Hop DATA item from the
//!   other gateway, with the next link sequence number.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use shoal_core::overlay::{LinkWeights, Site, SiteId, Topology};
use shoal_core::sites::codec::{wan_header, WAN_HOP};
use shoal_core::sites::{Config, SiteDaemon};
use shoal_core::{Instant, NodeId};
use shoal_wire::hop::{encode, Item};
use shoal_wire::ring::{Data, RingId, RingPacket};

fuzz_target!(|data: &[u8]| {
    let topo = Topology {
        sites: vec![
            Site {
                name: "a".into(),
                daemons: vec![NodeId(0)],
            },
            Site {
                name: "b".into(),
                daemons: vec![NodeId(1), NodeId(2)],
            },
        ],
        links: vec![LinkWeights {
            a: SiteId(0),
            b: SiteId(1),
            a_to_b: Some(1),
            b_to_a: Some(1),
        }],
    };
    let config = Config::default();
    let queue_max = config.send_queue_max;
    let window_max = config.global_window + 1;
    let mut d = SiteDaemon::new(config, Arc::new(topo), NodeId(0), 1, Instant::ZERO)
        .expect("valid daemon");
    let mut now = Instant::ZERO;
    d.connect("#c0#d0");
    let _ = d.join(now, "#c0#d0", "g");
    let _ = d.send(
        now,
        "#c0#d0",
        shoal_core::sites::Service::Safe,
        &["g".to_string()],
        bytes::Bytes::from_static(b"hello"),
    );
    let (mut ring_seq, mut link_seq) = (0u64, 0u64);
    let mut inputs = 0usize;
    let mut rest = data;
    while rest.len() >= 4 {
        inputs += 1;
        let mode = rest[0] % 4;
        let advance = u64::from(rest[1]) * 1_000_000;
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]])).min(rest.len() - 4);
        let bytes = &rest[4..4 + len];
        rest = &rest[4 + len..];
        now = Instant::from_nanos(now.as_nanos() + advance);
        match mode {
            0 => d.handle_lan(now, NodeId(1), bytes),
            1 => d.handle_wan(now, NodeId(2), bytes),
            2 => {
                ring_seq = ring_seq.max(d.ring_stats().multicasts) + 1;
                let packet = RingPacket::Data(Data {
                    ring_id: RingId { seq: 1, rep: 0 },
                    seq: ring_seq,
                    sender: 1,
                    safe: false,
                    recovered: None,
                    payload: bytes,
                });
                d.handle_lan(now, NodeId(1), &packet.encode());
            }
            _ => {
                link_seq += 1;
                let (epoch, ..) = d.configuration();
                let mut datagram = wan_header(WAN_HOP, epoch, SiteId(1));
                let items = [Item::Data {
                    seq: link_seq,
                    payload: bytes,
                }];
                let Ok(hop) = encode(0, &items) else { continue };
                datagram.extend_from_slice(&hop);
                d.handle_wan(now, NodeId(2), &datagram);
            }
        }
        if d.poll_timeout().is_some_and(|t| t <= now) {
            d.handle_timeout(now);
        }
        while d.poll_transmit().is_some() {}
        while d.poll_event().is_some() {}
        assert!(d.waiting() <= queue_max);
        // An input brings at most one element, and the daemon adds at
        // most one of its own (a marker) per element taken in.
        assert!(d.stored() <= 2 * inputs + 16, "stored {}", d.stored());
        assert!(d.outstanding() <= window_max);
    }
});
