//! Engine cost on the data path, without sockets: a sender packs 1 KB
//! messages into 64 KB datagrams; a receiver decodes, buffers and delivers
//! them. Figures go to bench/RESULTS.md ("pbcast engine").

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shoal_core::pbcast::{Config, Pbcast};
use shoal_core::{Engine, Instant, NodeId};

const BATCH: u64 = 10_000;

fn config() -> Config {
    Config {
        ip_multicast: true,
        max_datagram_size: 65_507,
        send_window: None,
        ..Config::default()
    }
}

/// Datagrams carrying `BATCH` messages of `size` bytes from member 0.
fn datagrams(size: usize) -> Vec<Bytes> {
    let members = [NodeId(0), NodeId(1)];
    let mut sender = Pbcast::new(NodeId(0), &members, config(), 1, Instant::ZERO).unwrap();
    let payload = Bytes::from(vec![7u8; size]);
    let mut out = Vec::new();
    for _ in 0..BATCH {
        sender.multicast(Instant::ZERO, payload.clone()).unwrap();
    }
    while let Some(t) = sender.poll_transmit(Instant::ZERO) {
        out.push(t.payload);
    }
    out
}

fn receive(c: &mut Criterion) {
    let mut group = c.benchmark_group("pbcast");
    group.throughput(Throughput::Elements(BATCH));
    for size in [64usize, 1024] {
        let input = datagrams(size);
        group.bench_function(format!("receive_{size}B"), |b| {
            b.iter(|| {
                let members = [NodeId(0), NodeId(1)];
                let mut rx = Pbcast::new(NodeId(1), &members, config(), 2, Instant::ZERO).unwrap();
                for d in &input {
                    rx.handle_datagram(Instant::ZERO, NodeId(0), d);
                    while let Some(ev) = rx.poll_event() {
                        black_box(ev);
                    }
                }
            })
        });
        group.bench_function(format!("send_{size}B"), |b| {
            let payload = Bytes::from(vec![7u8; size]);
            b.iter(|| {
                let members = [NodeId(0), NodeId(1)];
                let mut tx = Pbcast::new(NodeId(0), &members, config(), 1, Instant::ZERO).unwrap();
                for _ in 0..BATCH {
                    tx.multicast(Instant::ZERO, payload.clone()).unwrap();
                    while let Some(t) = tx.poll_transmit(Instant::ZERO) {
                        black_box(t);
                    }
                    while let Some(ev) = tx.poll_event() {
                        black_box(ev);
                    }
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, receive);
criterion_main!(benches);
