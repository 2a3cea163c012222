//! The runtime over real loopback sockets, driving a toy engine: unicast
//! exchange, IP multicast on loopback, fault injection, timers, shutdown.
//! Every wait is bounded by a generous timeout; nothing asserts speed.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use bytes::Bytes;
use shoal_core::engine::SendError;
use shoal_core::{Destination, Engine, GroupChange, GroupTransmit, Instant, NodeId, Transmit};
use shoal_net::{
    AddressBook, Clock, Command, Endpoint, EventBatch, FaultConfig, MulticastGroup, Node,
    NodeConfig, SocketOptions,
};
use tokio::sync::mpsc::UnboundedReceiver;

/// A toy engine: a multicast is one datagram per other member (or one IP
/// multicast); every datagram received becomes an event; a timer ticks
/// every 10 ms.
struct Toy {
    me: NodeId,
    members: u32,
    ip_multicast: bool,
    outbox: Vec<Transmit>,
    events: Vec<ToyEvent>,
    next_tick: Instant,
    /// A group of the engine's own (as QSM's per-region addresses): its
    /// multicasts go there; joins and leaves wait in `changes`.
    own_group: Option<std::net::SocketAddr>,
    changes: Vec<GroupChange>,
    group_outbox: Vec<GroupTransmit>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ToyEvent {
    Received { from: NodeId, payload: Bytes },
    Tick,
}

const TICK: Duration = Duration::from_millis(10);

impl Toy {
    fn new(me: u32, members: u32, ip_multicast: bool, now: Instant) -> Toy {
        Toy {
            me: NodeId(me),
            members,
            ip_multicast,
            outbox: Vec::new(),
            events: Vec::new(),
            next_tick: now + TICK,
            own_group: None,
            changes: Vec::new(),
            group_outbox: Vec::new(),
        }
    }
}

impl Engine for Toy {
    type Event = ToyEvent;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, _now: Instant, from: NodeId, datagram: &[u8]) {
        self.events.push(ToyEvent::Received {
            from,
            payload: Bytes::copy_from_slice(datagram),
        });
    }

    fn handle_timeout(&mut self, now: Instant) {
        if now >= self.next_tick {
            self.events.push(ToyEvent::Tick);
            self.next_tick = now + TICK;
        }
    }

    fn multicast(&mut self, _now: Instant, payload: Bytes) -> Result<u64, SendError> {
        // A Shoal packet sent under another id: the toy takes that id from
        // now on, as a daemon does when it rejoins under a new incarnation.
        if let Ok(header) = shoal_wire::decode_header(&payload) {
            self.me = NodeId(header.sender);
        }
        if let Some(group) = self.own_group {
            self.group_outbox.push(GroupTransmit { group, payload });
        } else if self.ip_multicast {
            self.outbox.push(Transmit {
                destination: Destination::Multicast,
                payload,
            });
        } else {
            for to in (0..self.members).filter(|m| *m != self.me.0) {
                self.outbox.push(Transmit {
                    destination: Destination::Node(NodeId(to)),
                    payload: payload.clone(),
                });
            }
        }
        Ok(0)
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        (!self.outbox.is_empty()).then(|| self.outbox.remove(0))
    }

    fn poll_event(&mut self) -> Option<ToyEvent> {
        (!self.events.is_empty()).then(|| self.events.remove(0))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next_tick)
    }

    fn poll_group_change(&mut self) -> Option<GroupChange> {
        (!self.changes.is_empty()).then(|| self.changes.remove(0))
    }

    fn poll_group_transmit(&mut self, _now: Instant) -> Option<GroupTransmit> {
        (!self.group_outbox.is_empty()).then(|| self.group_outbox.remove(0))
    }
}

const PATIENCE: Duration = Duration::from_secs(30);

struct Cluster {
    nodes: Vec<Node<Toy>>,
    events: Vec<UnboundedReceiver<EventBatch<ToyEvent>>>,
    clock: Clock,
}

/// Stops `node` (off the async runtime: shutting down blocks) and returns
/// its runtime counters.
async fn stats_at_shutdown(node: Node<Toy>) -> shoal_net::RuntimeStats {
    tokio::task::spawn_blocking(|| node.shutdown())
        .await
        .unwrap()
        .unwrap()
        .1
}

fn cluster(n: u32, group: Option<MulticastGroup>, faults: FaultConfig) -> Cluster {
    cluster_with(n, group, faults, |_| {})
}

fn cluster_with(
    n: u32,
    group: Option<MulticastGroup>,
    faults: FaultConfig,
    tweak: impl Fn(&mut NodeConfig),
) -> Cluster {
    let options = SocketOptions::default();
    let mut endpoints: Vec<Endpoint> = (0..n)
        .map(|_| Endpoint::bind_loopback(&options).unwrap())
        .collect();
    if let Some(group) = group {
        for endpoint in &mut endpoints {
            endpoint.join(group, &options).unwrap();
        }
    }
    let book = AddressBook::new(endpoints.iter().map(Endpoint::local_addr).collect()).unwrap();
    let clock = Clock::new();
    let mut nodes = Vec::new();
    let mut events = Vec::new();
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let engine = Toy::new(i as u32, n, group.is_some(), clock.now());
        let mut config = NodeConfig::new(book.clone());
        config.faults = FaultConfig {
            seed: i as u64,
            ..faults
        };
        tweak(&mut config);
        let mut node = Node::spawn(engine, endpoint, config, clock).unwrap();
        events.push(node.take_events().unwrap());
        nodes.push(node);
    }
    Cluster {
        nodes,
        events,
        clock,
    }
}

/// Received payloads, until `count` arrived or the patience ran out.
async fn receive(
    events: &mut UnboundedReceiver<EventBatch<ToyEvent>>,
    count: usize,
) -> Vec<(NodeId, Bytes)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while got.len() < count {
        let Ok(Some(batch)) = tokio::time::timeout_at(deadline, events.recv()).await else {
            break;
        };
        for event in batch.events {
            if let ToyEvent::Received { from, payload } = event {
                got.push((from, payload));
            }
        }
    }
    got
}

/// Received payloads in the next batch that has any.
async fn received(events: &mut UnboundedReceiver<EventBatch<ToyEvent>>) -> usize {
    loop {
        let Some(batch) = events.recv().await else {
            return 0;
        };
        let n = batch
            .events
            .iter()
            .filter(|e| matches!(e, ToyEvent::Received { .. }))
            .count();
        if n > 0 {
            return n;
        }
    }
}

fn payload(i: u32) -> Bytes {
    Bytes::from(i.to_be_bytes().to_vec())
}

#[tokio::test]
async fn two_nodes_exchange_over_unicast() {
    let mut c = cluster(2, None, FaultConfig::default());
    for i in 0..100 {
        for node in &c.nodes {
            node.commands()
                .send(Command::Multicast(payload(i)))
                .await
                .unwrap();
        }
    }
    for (me, events) in c.events.iter_mut().enumerate() {
        let got = receive(events, 100).await;
        assert_eq!(got.len(), 100, "node {me}");
        let other = NodeId(1 - me as u32);
        assert!(got.iter().all(|(from, _)| *from == other));
        // One socket to one socket on loopback keeps order.
        let expected: Vec<Bytes> = (0..100).map(payload).collect();
        let payloads: Vec<Bytes> = got.into_iter().map(|(_, p)| p).collect();
        assert_eq!(payloads, expected);
    }
    for node in c.nodes {
        let stats = stats_at_shutdown(node).await;
        assert_eq!(stats.datagrams_sent, 100);
        assert_eq!(stats.datagrams_received, 100);
        assert_eq!(stats.unknown_source, 0);
    }
}

#[tokio::test]
async fn timer_fires() {
    let mut c = cluster(2, None, FaultConfig::default());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut ticks = 0;
    while ticks < 3 {
        let batch = tokio::time::timeout_at(deadline, c.events[0].recv())
            .await
            .expect("ticks within the patience")
            .unwrap();
        ticks += batch
            .events
            .iter()
            .filter(|e| **e == ToyEvent::Tick)
            .count();
    }
    drop(c.nodes);
}

#[tokio::test]
async fn ip_multicast_on_loopback_reaches_others_not_self() {
    // A group unlikely to collide with a concurrent run.
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let group =
        MulticastGroup::new(SocketAddrV4::new(Ipv4Addr::new(239, 255, 77, 1), port)).unwrap();
    let mut c = cluster(3, Some(group), FaultConfig::default());
    for i in 0..20 {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    for events in &mut c.events[1..] {
        let got = receive(events, 20).await;
        assert_eq!(got.len(), 20);
        assert!(got.iter().all(|(from, _)| *from == NodeId(0)));
    }
    let sender = c.nodes.remove(0);
    let stats = stats_at_shutdown(sender).await;
    // One datagram per multicast; looped-back copies (if read before the
    // shutdown) were filtered, never handed to the engine.
    assert_eq!(stats.datagrams_sent, 20);
    assert!(stats.own_filtered <= 20);
    // Nothing of its own reached node 0's application.
    assert!(c.events[0]
        .try_recv()
        .map_or(true, |b| b.events.iter().all(|e| *e == ToyEvent::Tick)));
}

#[tokio::test]
async fn injected_delay_holds_datagrams_back() {
    let delay = Duration::from_millis(100);
    let faults = FaultConfig {
        delay,
        ..FaultConfig::default()
    };
    let mut c = cluster(2, None, faults);
    let sent_at = c.clock.now();
    c.nodes[0]
        .commands()
        .send(Command::Multicast(payload(1)))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let batch = tokio::time::timeout_at(deadline, c.events[1].recv())
            .await
            .expect("delivered within the patience")
            .unwrap();
        if batch
            .events
            .iter()
            .any(|e| matches!(e, ToyEvent::Received { .. }))
        {
            // A lower bound only: never a claim about how fast the machine is.
            assert!(batch.at - sent_at >= delay);
            break;
        }
    }
}

#[tokio::test]
async fn injected_loss_drops_about_the_configured_share() {
    let faults = FaultConfig {
        drop_probability: 0.5,
        ..FaultConfig::default()
    };
    let mut c = cluster(2, None, faults);
    for i in 0..400 {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    // Count at the receiver once deliveries have gone quiet for a second.
    let mut events = c.events.remove(1);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut delivered = 0;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), received(&mut events)).await {
            Ok(n) => delivered += n,
            Err(_) if delivered > 0 => break,
            Err(_) => {}
        }
    }
    let mut nodes = c.nodes;
    let receiver = nodes.remove(1);
    let stats = stats_at_shutdown(receiver).await;
    // Seeded: the exact count is fixed for a given arrival count; bounds are
    // wide in case the kernel itself dropped some.
    assert!(stats.datagrams_received <= 400);
    assert_eq!(
        delivered as u64,
        stats.datagrams_received - stats.fault_drops
    );
    let drop_share = stats.fault_drops as f64 / stats.datagrams_received.max(1) as f64;
    assert!((0.35..=0.65).contains(&drop_share), "{stats:?}");
}

#[tokio::test]
async fn injected_duplication_hands_some_datagrams_over_twice() {
    let faults = FaultConfig {
        duplicate_probability: 0.3,
        ..FaultConfig::default()
    };
    let mut c = cluster(2, None, faults);
    for i in 0..200 {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    let mut events = c.events.remove(1);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut delivered = 0;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), received(&mut events)).await {
            Ok(n) => delivered += n,
            Err(_) if delivered > 0 => break,
            Err(_) => {}
        }
    }
    let mut nodes = c.nodes;
    let receiver = nodes.remove(1);
    let stats = stats_at_shutdown(receiver).await;
    // Every datagram received reached the engine once, plus one more time
    // per duplicate; about 30% were duplicated (seeded; wide bounds).
    assert_eq!(
        delivered as u64,
        stats.datagrams_received + stats.fault_duplicates
    );
    let share = stats.fault_duplicates as f64 / stats.datagrams_received.max(1) as f64;
    assert!((0.15..=0.45).contains(&share), "{stats:?}");
}

#[tokio::test]
async fn injected_send_loss_drops_at_the_sender() {
    let faults = FaultConfig {
        send_drop_probability: 0.5,
        ..FaultConfig::default()
    };
    let mut c = cluster(2, None, faults);
    for i in 0..400 {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    let mut events = c.events.remove(1);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut delivered = 0;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), received(&mut events)).await {
            Ok(n) => delivered += n,
            Err(_) if delivered > 0 => break,
            Err(_) => {}
        }
    }
    let mut nodes = c.nodes;
    let sender = nodes.remove(0);
    let stats = stats_at_shutdown(sender).await;
    // The sender dropped about half of its 400 datagrams before the
    // socket; the receiver got at most the rest (seeded; wide bounds).
    let share = stats.fault_send_drops as f64 / 400.0;
    assert!((0.35..=0.65).contains(&share), "{stats:?}");
    assert_eq!(
        stats.datagrams_sent + stats.fault_send_drops,
        400,
        "{stats:?}"
    );
    assert!(delivered as u64 <= stats.datagrams_sent);
    assert!(delivered > 0);
}

/// A payload of `len` bytes that says which it is.
fn sized(i: u32, len: usize) -> Bytes {
    (0..len)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect::<Vec<u8>>()
        .into()
}

const SIZES: [usize; 6] = [1_000, 1_472, 1_473, 5_000, 16_384, 65_000];

#[tokio::test]
async fn datagrams_larger_than_the_path_arrive_whole_and_in_order() {
    let mut c = cluster_with(2, None, FaultConfig::default(), |config| {
        config.path_datagram = Some(1_472);
    });
    let sent: Vec<Bytes> = (0..60u32)
        .map(|i| sized(i, SIZES[i as usize % SIZES.len()]))
        .collect();
    for payload in &sent {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload.clone()))
            .await
            .unwrap();
    }
    let got = receive(&mut c.events[1], sent.len()).await;
    let payloads: Vec<Bytes> = got.into_iter().map(|(_, p)| p).collect();
    assert_eq!(payloads, sent);
    let receiver = c.nodes.pop().unwrap();
    let sender = c.nodes.pop().unwrap();
    let stats = stats_at_shutdown(sender).await;
    // 1,000 and 1,472 bytes fit; the other four sizes do not.
    assert_eq!(stats.datagrams_split, 40);
    let fragments: usize = sent
        .iter()
        .filter(|p| p.len() > 1_472)
        .map(|p| p.len().div_ceil(1_472 - 20))
        .sum();
    assert_eq!(stats.fragments_sent, fragments as u64);
    assert_eq!(stats.datagrams_sent, 20 + fragments as u64);
    let stats = stats_at_shutdown(receiver).await;
    assert_eq!(stats.datagrams_joined, 40);
    assert_eq!(stats.fragments_received, fragments as u64);
    assert_eq!(stats.fragments_refused + stats.partial_dropped, 0);
}

/// Datagrams to one peer pulled from the engine together leave in
/// segmented sends (UDP GSO) where the kernel takes them: a run of one
/// size, a shorter one closing it, then a longer one starting the next.
/// The receiver gets every datagram whole, in order, as sent one by one.
#[tokio::test]
async fn datagrams_to_one_peer_leave_together_and_arrive_in_order() {
    let mut c = cluster(2, None, FaultConfig::default());
    let mut sent: Vec<Bytes> = (0..150u32).map(|i| sized(i, 1_000)).collect();
    sent.push(sized(150, 40));
    sent.extend((151..200u32).map(|i| sized(i, 1_200)));
    // Handed to the engine in one control: the runtime pulls them as one
    // burst.
    let burst = sent.clone();
    c.nodes[0].control(move |engine: &mut Toy, now, _| {
        for payload in burst {
            engine.multicast(now, payload).unwrap();
        }
    });
    let got = receive(&mut c.events[1], sent.len()).await;
    let payloads: Vec<Bytes> = got.into_iter().map(|(_, p)| p).collect();
    assert_eq!(payloads, sent);
    let receiver = c.nodes.pop().unwrap();
    let sender = c.nodes.pop().unwrap();
    let stats = stats_at_shutdown(sender).await;
    assert_eq!(stats.datagrams_sent, sent.len() as u64);
    if cfg!(all(target_os = "linux", target_pointer_width = "64")) {
        // At most 64 datagrams a send: at least 150/64 + 49/54 sends.
        assert!(
            (4..=10).contains(&stats.segmented_sends),
            "{} segmented sends",
            stats.segmented_sends
        );
    }
    let stats = stats_at_shutdown(receiver).await;
    assert_eq!(stats.datagrams_received, sent.len() as u64);
}

/// A daemon rejoins under a new incarnation (a new id in the same slot)
/// while its runtime runs on. Its large datagrams' fragments claimed the id
/// it started with, so the receiver took the joined datagram for the old
/// incarnation's and the engine refused every one (the long schedule across
/// namespaces stalled on it after the first rejoin).
#[tokio::test]
async fn fragments_claim_the_id_the_datagram_was_sent_under() {
    let options = SocketOptions::default();
    let endpoints: Vec<Endpoint> = (0..2)
        .map(|_| Endpoint::bind_loopback(&options).unwrap())
        .collect();
    let book =
        AddressBook::slotted(endpoints.iter().map(Endpoint::local_addr).collect(), 8).unwrap();
    let clock = Clock::new();
    let mut nodes = Vec::new();
    let mut events = Vec::new();
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let engine = Toy::new(i as u32, 2, false, clock.now());
        let mut config = NodeConfig::new(book.clone());
        config.path_datagram = Some(1_472);
        let mut node = Node::spawn(engine, endpoint, config, clock).unwrap();
        events.push(node.take_events().unwrap());
        nodes.push(node);
    }
    // Slot 0, incarnation 1.
    let rejoined = 1 << 8;
    let body = sized(7, 16_384);
    let packet = shoal_wire::Packet::Data {
        seq: 1,
        payload: &body,
    };
    let mut datagram = Vec::new();
    packet.encode(rejoined, &mut datagram).unwrap();
    nodes[0]
        .commands()
        .send(Command::Multicast(datagram.clone().into()))
        .await
        .unwrap();
    let got = receive(&mut events[1], 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0,
        NodeId(rejoined),
        "the sender as the receiver took it"
    );
    assert!(got[0].1 == datagram, "the datagram arrived whole");
}

#[tokio::test]
async fn a_lost_fragment_loses_its_datagram_and_nothing_else() {
    // Every sent datagram, fragments included, is dropped with
    // probability 0.1: a 16 KB datagram (12 fragments) then arrives whole
    // about 28% of the time, and never in part.
    let faults = FaultConfig {
        send_drop_probability: 0.1,
        ..FaultConfig::default()
    };
    let mut c = cluster_with(2, None, faults, |config| {
        config.path_datagram = Some(1_472);
    });
    let sent: Vec<Bytes> = (0..200u32).map(|i| sized(i, 16_384)).collect();
    for payload in &sent {
        c.nodes[0]
            .commands()
            .send(Command::Multicast(payload.clone()))
            .await
            .unwrap();
    }
    // Whatever arrives comes within a second of the last send on loopback.
    let got = receive_until_quiet(&mut c.events[1]).await;
    assert!(
        !got.is_empty() && got.len() < sent.len(),
        "{} arrived",
        got.len()
    );
    // In order, each one of those sent, whole.
    let mut next = 0;
    for (_, payload) in &got {
        let at = sent[next..].iter().position(|p| p == payload);
        let at = at.expect("a datagram arrived that was not sent whole");
        next += at + 1;
    }
}

/// Received payloads until a second passes without any (for runs where
/// loss makes a count unreachable).
async fn receive_until_quiet(
    events: &mut UnboundedReceiver<EventBatch<ToyEvent>>,
) -> Vec<(NodeId, Bytes)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut quiet = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        // Timer ticks keep coming; only a received payload resets the wait.
        let Ok(Some(batch)) = tokio::time::timeout_at(quiet.min(deadline), events.recv()).await
        else {
            return got;
        };
        for event in batch.events {
            if let ToyEvent::Received { from, payload } = event {
                got.push((from, payload));
                quiet = tokio::time::Instant::now() + Duration::from_secs(1);
            }
        }
    }
}

/// An engine's own IP multicast groups (`poll_group_change`, as QSM's
/// per-region addresses), on loopback with TTL 0: the nodes that joined
/// get what one sends there; one that left gets nothing more.
#[tokio::test]
async fn engine_groups_are_joined_sent_to_and_left() {
    let port = 22_000 + (std::process::id() % 20_000) as u16;
    let group: std::net::SocketAddr =
        SocketAddrV4::new(Ipv4Addr::new(239, 255, 79, 2), port).into();
    let options = SocketOptions::default();
    let endpoints: Vec<Endpoint> = (0..3)
        .map(|_| Endpoint::bind_loopback(&options).unwrap())
        .collect();
    let book = AddressBook::new(endpoints.iter().map(Endpoint::local_addr).collect()).unwrap();
    let clock = Clock::new();
    let mut nodes = Vec::new();
    let mut events = Vec::new();
    for (i, endpoint) in endpoints.into_iter().enumerate() {
        let mut engine = Toy::new(i as u32, 3, false, clock.now());
        engine.own_group = Some(group);
        engine.changes.push(GroupChange::Join(group));
        let mut node = Node::spawn(engine, endpoint, NodeConfig::new(book.clone()), clock).unwrap();
        events.push(node.take_events().unwrap());
        nodes.push(node);
    }
    // Each node joins in its first turn; a tick later it has.
    for e in &mut events {
        while !e.recv().await.unwrap().events.contains(&ToyEvent::Tick) {}
    }
    for i in 0..10 {
        nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    for e in &mut events[1..] {
        let got = receive(e, 10).await;
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|(from, _)| *from == NodeId(0)));
    }
    // Node 2 leaves; node 1 still gets the group's datagrams.
    let (tx, rx) = tokio::sync::oneshot::channel();
    assert!(nodes[2].control(move |e: &mut Toy, _, _| {
        e.changes.push(GroupChange::Leave(group));
        let _ = tx.send(());
    }));
    rx.await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 10..15 {
        nodes[0]
            .commands()
            .send(Command::Multicast(payload(i)))
            .await
            .unwrap();
    }
    assert_eq!(receive(&mut events[1], 5).await.len(), 5);
    // Whatever node 2 receives now comes by some other way: nothing does.
    let late = tokio::time::timeout(Duration::from_millis(300), received(&mut events[2])).await;
    assert!(late.is_err(), "node 2 received after leaving");
    for node in nodes {
        let stats = stats_at_shutdown(node).await;
        assert_eq!(stats.group_change_errors, 0);
    }
}
