//! A ring member fed arbitrary datagrams (tokens, data, joins, merge
//! detects, commit tokens): no panic; what it delivers stays in each
//! ring's sequence order and no message is delivered twice.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use shoal_core::ring::{Config, Event, Ring, RingId};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let ring_id = RingId { seq: 7, rep: 0 };
    let mut ring = Ring::new(Config::default(), NodeId(1), &members, ring_id, Instant::ZERO)
        .expect("valid ring");
    let _ = ring.multicast(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    let mut now = Instant::ZERO;
    let mut last: BTreeMap<RingId, u64> = BTreeMap::new();
    for datagram in data.split(|b| *b == 0xFF) {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        ring.handle_datagram(now, NodeId(0), datagram);
        if ring.poll_timeout().is_some_and(|t| t <= now) {
            ring.handle_timeout(now);
        }
        while ring.poll_transmit(now).is_some() {}
        while let Some(event) = ring.poll_event() {
            if let Event::Deliver { ring_id, seq, .. } = event {
                let l = last.entry(ring_id).or_insert(0);
                assert!(seq > *l, "delivery in sequence order");
                *l = seq;
            }
        }
    }
});
