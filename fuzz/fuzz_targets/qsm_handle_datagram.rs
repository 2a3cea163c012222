//! A QSM member fed arbitrary datagrams from peers: no panic, timers keep
//! working, and forged sources or sequence numbers cannot make it allocate
//! without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::qsm::{Config, GroupId, Qsm, RegionId, RegionView};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let view = RegionView {
        id: RegionId(1),
        view: 1,
        members: (0..12).map(NodeId).collect(),
        groups: vec![GroupId(0), GroupId(1)],
    };
    let mut engine = Qsm::new(NodeId(0), &view, Config::default(), 1, Instant::ZERO)
        .expect("valid config");
    let _ = engine.multicast(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    let mut now = Instant::ZERO;
    for (i, datagram) in data.split(|b| *b == 0xFF).enumerate() {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        engine.handle_datagram(now, NodeId(1 + (i % 11) as u32), datagram);
        if let Some(deadline) = engine.poll_timeout() {
            if deadline <= now {
                engine.handle_timeout(now);
            }
        }
        while engine.poll_transmit(now).is_some() {}
        while engine.poll_event().is_some() {}
    }
});
