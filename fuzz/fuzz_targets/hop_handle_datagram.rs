//! A Hop link end and a TCP-model link end fed arbitrary datagrams from
//! the peer: no panic, and forged sequence numbers or NACK ranges cannot
//! make either allocate without bound or loop.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::hop::tcp::{TcpConfig, TcpLink};
use shoal_core::hop::{Config, Hop, LinkProtocol};
use shoal_core::Instant;

fuzz_target!(|data: &[u8]| {
    let mut hop = Hop::new(Config::default(), 0, Instant::ZERO).expect("valid config");
    let mut tcp = TcpLink::new(TcpConfig::default(), Instant::ZERO);
    for _ in 0..3 {
        let _ = hop.send(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
        let _ = tcp.send(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    }
    let mut now = Instant::ZERO;
    for datagram in data.split(|b| *b == 0xFF) {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        let links: [&mut dyn LinkProtocol; 2] = [&mut hop, &mut tcp];
        for link in links {
            link.handle_datagram(now, datagram);
            if link.poll_timeout().is_some_and(|t| t <= now) {
                link.handle_timeout(now);
            }
            while link.poll_transmit(now).is_some() {}
            while link.poll_event().is_some() {}
        }
    }
    assert!(hop.missing() <= 4 * 1024 + 64);
});
