//! A traditional-stack member fed arbitrary datagrams from peers (data,
//! status, retransmissions and flush messages): no panic, and forged
//! sequence numbers or statuses cannot make it allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::traditional::{Config, Traditional};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let mut engine =
        Traditional::new(NodeId(0), &members, Config::default(), Instant::ZERO).expect("valid");
    let _ = engine.multicast(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    let mut now = Instant::ZERO;
    for (i, datagram) in data.split(|b| *b == 0xFF).enumerate() {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        engine.handle_datagram(now, NodeId(1 + (i % 2) as u32), datagram);
        if let Some(deadline) = engine.poll_timeout() {
            if deadline <= now {
                engine.handle_timeout(now);
            }
        }
        while engine.poll_transmit(now).is_some() {}
        while engine.poll_event().is_some() {}
    }
});
