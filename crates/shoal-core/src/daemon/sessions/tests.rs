//! Several cores joined by a hand-driven total order: what the daemons'
//! vsync group gives them, without sockets or timing.

use crate::vsync::ViewReason;

use super::*;

const BATCH_MAX: usize = 1_000;

/// Daemons `0..n` (ids 10, 11, ...) and the order their batches take.
struct Cluster {
    cores: Vec<Sessions>,
    ids: Vec<NodeId>,
    gseq: u64,
    view_id: u64,
    /// Frames each (daemon, session) received, and the sessions closed.
    frames: BTreeMap<(usize, SessionId), Vec<Frame>>,
    closed: BTreeMap<(usize, SessionId), Option<Frame>>,
}

fn view(id: u64, members: &[NodeId], gseq: u64, joined: &[NodeId], first: bool) -> View {
    View {
        id,
        members: members.to_vec(),
        committee: members[..1].to_vec(),
        gseq,
        joined: joined.to_vec(),
        left: Vec::new(),
        failed: Vec::new(),
        reason: ViewReason::Join,
        first,
    }
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        let ids: Vec<NodeId> = (0..n as u32).map(|i| NodeId(10 + i)).collect();
        let mut c = Cluster {
            cores: (0..n)
                .map(|i| Sessions::new(&format!("n{i}"), Limits::default(), BATCH_MAX))
                .collect(),
            ids: ids.clone(),
            gseq: 1,
            view_id: 0,
            frames: BTreeMap::new(),
            closed: BTreeMap::new(),
        };
        for i in 0..n {
            let v = View {
                reason: ViewReason::Initial,
                ..view(0, &ids, 0, &ids, true)
            };
            c.cores[i].cluster_event(ids[i], Event::View(v));
        }
        // Each founding member's (empty) snapshot.
        c.settle();
        c
    }

    fn connect(&mut self, d: usize, session: SessionId, name: &str) {
        self.cores[d].connect(session, name, true);
        self.collect();
    }

    fn frame(&mut self, d: usize, session: SessionId, frame: Frame) {
        self.cores[d].frame(session, frame);
        self.collect();
    }

    /// Moves every pending batch through the total order, round-robin over
    /// the daemons, until none is left.
    fn settle(&mut self) {
        loop {
            let mut any = false;
            for d in 0..self.cores.len() {
                any |= self.order(d);
            }
            self.collect();
            if !any {
                return;
            }
        }
    }

    /// Hands daemon `d`'s unsequenced batches to every daemon, as pbcast
    /// alone would (no gseq, no order with the rest).
    fn spread_unsequenced(&mut self, d: usize) {
        while let Some(batch) = self.cores[d].take_unsequenced() {
            for c in 0..self.cores.len() {
                let me = self.ids[c];
                let event = Event::Unsequenced {
                    sender: self.ids[d],
                    payload: batch.clone(),
                };
                self.cores[c].cluster_event(me, event);
            }
        }
        self.collect();
    }

    /// Orders daemon `d`'s next batch, if it has one, and delivers it to
    /// every daemon.
    fn order(&mut self, d: usize) -> bool {
        let Some(batch) = self.cores[d].take_batch() else {
            return false;
        };
        assert!(batch.len() <= BATCH_MAX, "a batch of {} bytes", batch.len());
        let gseq = self.gseq;
        self.gseq += 1;
        for c in 0..self.cores.len() {
            let me = self.ids[c];
            self.cores[c].cluster_event(
                me,
                Event::Deliver {
                    sender: self.ids[d],
                    local_id: 0,
                    gseq,
                    payload: batch.clone(),
                },
            );
        }
        self.collect();
        true
    }

    /// Orders daemon `d`'s next batch, if it has one, and delivers it to
    /// daemons `to` only (the rest never get it: they are cut off).
    fn order_to(&mut self, d: usize, to: &[usize]) -> bool {
        let Some(batch) = self.cores[d].take_batch() else {
            return false;
        };
        let gseq = self.gseq;
        self.gseq += 1;
        for &c in to {
            let me = self.ids[c];
            let event = Event::Deliver {
                sender: self.ids[d],
                local_id: 0,
                gseq,
                payload: batch.clone(),
            };
            self.cores[c].cluster_event(me, event);
        }
        self.collect();
        true
    }

    fn collect(&mut self) {
        for d in 0..self.cores.len() {
            let outs = self.cores[d].take_outputs();
            for out in &outs.list {
                let out = out.clone();
                match out {
                    Output::Send(s, f) => self.frames.entry((d, s)).or_default().push(f),
                    Output::Close(s, f) => {
                        self.closed.insert((d, s), f);
                    }
                    Output::Deliver(sessions, range) => {
                        let bytes = outs.frame(&range);
                        let (frame, used) = shoal_wire::client::decode(bytes, &Default::default())
                            .unwrap()
                            .unwrap();
                        assert_eq!(used, bytes.len());
                        for s in sessions {
                            self.frames.entry((d, s)).or_default().push(frame.clone());
                        }
                    }
                }
            }
        }
    }

    fn take(&mut self, d: usize, s: SessionId) -> Vec<Frame> {
        self.frames.remove(&(d, s)).unwrap_or_default()
    }

    /// Daemon `d` is evicted with `in_flight` (batches and whether their
    /// gseq was heard), as the daemon engine reports it.
    fn evict(&mut self, d: usize, in_flight: Vec<(Bytes, bool)>) {
        let removed = Event::Removed {
            view: 3,
            reason: RemovedReason::Dropped,
        };
        let me = self.ids[d];
        self.cores[d].cluster_event(me, removed);
        self.cores[d].cut_off_in_flight(me, in_flight);
        self.collect();
    }

    /// Installs a view of `members` (indexes) at `at` only (the others
    /// never install it: cut off after they acknowledged the change).
    fn install_at(&mut self, members: &[usize], at: &[usize]) {
        self.view_id += 1;
        let ids: Vec<NodeId> = members.iter().map(|i| self.ids[*i]).collect();
        let gseq = self.gseq;
        self.gseq += 1;
        for &i in at {
            let v = view(self.view_id, &ids, gseq, &[], false);
            let me = self.ids[i];
            self.cores[i].cluster_event(me, Event::View(v));
        }
        self.collect();
    }

    /// Installs a view of `members` (indexes) at each of them.
    fn install(&mut self, members: &[usize], joined: &[usize]) {
        self.install_joined_at(members, joined, members);
    }

    /// Installs a view of `members`, `joined` new among them, at `at` only.
    fn install_joined_at(&mut self, members: &[usize], joined: &[usize], at: &[usize]) {
        self.view_id += 1;
        let ids: Vec<NodeId> = members.iter().map(|i| self.ids[*i]).collect();
        let joined_ids: Vec<NodeId> = joined.iter().map(|i| self.ids[*i]).collect();
        let gseq = self.gseq;
        self.gseq += 1;
        for &i in at {
            let v = view(self.view_id, &ids, gseq, &joined_ids, joined.contains(&i));
            let me = self.ids[i];
            self.cores[i].cluster_event(me, Event::View(v));
        }
        self.collect();
    }
}

fn memberships(frames: &[Frame]) -> Vec<(String, Reason, Vec<String>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Membership {
                group,
                reason,
                members,
                ..
            } => Some((group.clone(), *reason, members.clone())),
            _ => None,
        })
        .collect()
}

fn messages(frames: &[Frame]) -> Vec<(String, Vec<String>, Vec<u8>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Message {
                sender,
                groups,
                payload,
                ..
            } => Some((sender.clone(), groups.clone(), payload.clone())),
            _ => None,
        })
        .collect()
}

fn multicast(service: Service, groups: &[&str], payload: &[u8]) -> Frame {
    Frame::Multicast {
        service,
        groups: groups.iter().map(|g| g.to_string()).collect(),
        payload: payload.to_vec(),
    }
}

fn join(group: &str) -> Frame {
    Frame::Join {
        group: group.to_string(),
    }
}

fn s(x: &str) -> String {
    x.to_string()
}

/// Two daemons with one client each in "chat".
fn two_in_chat() -> Cluster {
    let mut c = Cluster::new(3);
    c.connect(0, 1, "alice");
    c.connect(1, 1, "bob");
    assert!(matches!(c.take(0, 1)[..], [Frame::ConnectOk { .. }]));
    c.take(1, 1);
    c.frame(0, 1, join("chat"));
    c.frame(1, 1, join("chat"));
    c.settle();
    c
}

#[test]
fn joins_are_announced_in_the_same_order_everywhere() {
    let mut c = two_in_chat();
    let alice = memberships(&c.take(0, 1));
    let bob = memberships(&c.take(1, 1));
    assert_eq!(
        alice,
        vec![
            (s("chat"), Reason::Join, vec![s("#alice#n0")]),
            (s("chat"), Reason::Join, vec![s("#alice#n0"), s("#bob#n1")]),
        ]
    );
    assert_eq!(bob, alice[1..].to_vec());
}

#[test]
fn a_message_reaches_every_member_once_with_every_addressed_group() {
    let mut c = two_in_chat();
    c.frame(1, 1, join("log"));
    c.connect(2, 7, "carol");
    c.frame(2, 7, join("log"));
    c.settle();
    for (d, s_) in [(0, 1), (1, 1), (2, 7)] {
        c.take(d, s_);
    }
    c.frame(0, 1, multicast(Service::Agreed, &["chat", "log"], b"hi"));
    c.settle();
    let expect = vec![(s("#alice#n0"), vec![s("chat"), s("log")], b"hi".to_vec())];
    assert_eq!(messages(&c.take(0, 1)), expect);
    // Bob is in both groups: once.
    assert_eq!(messages(&c.take(1, 1)), expect);
    assert_eq!(messages(&c.take(2, 7)), expect);
}

#[test]
fn every_service_is_carried() {
    let mut c = two_in_chat();
    c.take(1, 1);
    for service in Service::ALL {
        c.frame(0, 1, multicast(service, &["chat"], b"y"));
    }
    c.spread_unsequenced(0);
    c.settle();
    assert_eq!(messages(&c.take(1, 1)).len(), Service::ALL.len());
}

#[test]
fn safe_waits_until_every_daemon_of_the_view_holds_it_and_nothing_overtakes_it() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    assert!(c.order(0));
    // Ordered, but not yet known to be held by every daemon: not delivered.
    assert!(messages(&c.take(0, 1)).is_empty());
    assert!(messages(&c.take(1, 1)).is_empty());
    // Alice's daemon still holds it for her (her flow-control query).
    assert_eq!(c.cores[0].held_for(1, []), Some((1, 4)));
    // Bob's agreed message is ordered after it and must not overtake it.
    c.frame(1, 1, multicast(Service::Agreed, &["chat"], b"after"));
    // Daemon 1's next batch holds its acknowledgement and bob's message.
    assert!(c.order(1));
    assert!(c.order(0));
    assert!(messages(&c.take(0, 1)).is_empty(), "daemon 2 has not said");
    assert!(messages(&c.take(1, 1)).is_empty());
    assert!(c.order(2));
    let expect = vec![
        (s("#alice#n0"), vec![s("chat")], b"safe".to_vec()),
        (s("#bob#n1"), vec![s("chat")], b"after".to_vec()),
    ];
    assert_eq!(messages(&c.take(0, 1)), expect);
    assert_eq!(messages(&c.take(1, 1)), expect);
    assert_eq!(c.cores[0].held_for(1, []), Some((0, 0)));
    assert!(c.cores[0].stats().batches_held >= 2);
    c.settle();
}

#[test]
fn a_view_without_a_silent_daemon_releases_what_it_never_acknowledged() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    assert!(c.order(0));
    assert!(c.order(0));
    assert!(c.order(1));
    // Daemon 2 fails before its acknowledgement is ordered.
    assert!(c.cores[2].take_batch().is_some());
    assert!(messages(&c.take(0, 1)).is_empty());
    // The daemons moving into the next view delivered the same messages of
    // this one (virtual synchrony): the held batch is stable among them.
    c.install(&[0, 1], &[]);
    let expect = vec![(s("#alice#n0"), vec![s("chat")], b"safe".to_vec())];
    assert_eq!(messages(&c.take(0, 1)), expect);
    assert_eq!(messages(&c.take(1, 1)), expect);
}

/// A view that drops nobody is no proof that its daemons hold what was
/// ordered before it: vsync keeps a committee member that did not
/// acknowledge the change, and one that did may lack batches before the
/// view and be cut off before they come. The long schedule across network
/// namespaces found it: with a killed daemon still in the committee, every
/// periodic view released the held `safe` batches, and a daemon cut off
/// just then never had them (its clients installed their next view without
/// them).
#[test]
fn a_view_that_drops_nobody_releases_no_safe_message_before_every_daemon_holds_it() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    assert!(c.order_to(0, &[0, 1]));
    // Daemons 0 and 1 say they hold it; daemon 2 never got it.
    assert!(c.order_to(0, &[0, 1]));
    assert!(c.order_to(1, &[0, 1]));
    c.install(&[0, 1, 2], &[]);
    assert!(messages(&c.take(0, 1)).is_empty());
    assert!(messages(&c.take(1, 1)).is_empty());
    // Daemon 2 is dropped at the next change: delivered then (in a
    // transitional view of the daemons moving on).
    c.install(&[0, 1], &[]);
    let expect = vec![(s("#alice#n0"), vec![s("chat")], b"safe".to_vec())];
    assert_eq!(messages(&c.take(0, 1)), expect);
    assert_eq!(messages(&c.take(1, 1)), expect);
}

/// Alice, bob and carol in "chat", on daemons 0, 1 and 2.
fn three_in_chat() -> Cluster {
    let mut c = two_in_chat();
    c.connect(2, 7, "carol");
    c.frame(2, 7, join("chat"));
    c.settle();
    for (d, session) in [(0, 1), (1, 1), (2, 7)] {
        c.take(d, session);
    }
    c
}

/// Each membership frame: transitional or not, and its members.
fn views(frames: &[Frame]) -> Vec<(bool, Vec<String>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Membership {
                transitional,
                members,
                ..
            } => Some((*transitional, members.clone())),
            _ => None,
        })
        .collect()
}

/// A view that drops a daemon is no proof either that the daemons it
/// keeps hold a held `safe` batch: one may never install it (cut off after
/// it acknowledged the change). The long schedule across network
/// namespaces found it (seed 20261128): a daemon delivered its client's
/// `safe` message in the transitional view of such a change, and a member
/// it listed there, cut off, never had it. The removal of the gone
/// daemon's clients now waits behind the held batches, which wait for the
/// daemons kept, or for a view that drops the silent ones.
#[test]
fn a_view_that_drops_a_daemon_waits_until_the_daemons_it_keeps_hold_the_safe_batches() {
    let mut c = three_in_chat();
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    // Only daemon 0 gets it, and says so.
    assert!(c.order_to(0, &[0]));
    assert!(c.order_to(0, &[0]));
    // Carol's daemon is dropped; bob's is kept but never installs the view.
    c.install_at(&[0, 1], &[0]);
    assert!(
        c.take(0, 1).is_empty(),
        "bob's daemon has not said it holds it"
    );
    // Bob's daemon is dropped at the next view: alice gets the message in a
    // transitional view without bob, then the regular views of the two
    // changes.
    c.install_at(&[0], &[0]);
    let frames = c.take(0, 1);
    let expect = vec![(s("#alice#n0"), vec![s("chat")], b"safe".to_vec())];
    assert_eq!(messages(&frames), expect);
    assert_eq!(
        views(&frames),
        vec![
            (true, vec![s("#alice#n0")]),
            (false, vec![s("#alice#n0"), s("#bob#n1")]),
            (false, vec![s("#alice#n0")]),
        ]
    );
    assert!(matches!(frames[0], Frame::Membership { .. }));
    assert_eq!(c.cores[0].stats().removals_deferred, 1);
}

/// The same change when the daemon kept does install the view: its
/// acknowledgement (its first was in a batch the change dropped) comes in
/// the new view, and both deliver in the transitional view of the two.
#[test]
fn a_view_that_drops_a_daemon_releases_the_safe_batches_once_the_daemons_it_keeps_say_so() {
    let mut c = three_in_chat();
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    assert!(c.order_to(0, &[0, 1]));
    // Daemon 1's acknowledgement is lost with the old view.
    assert!(c.cores[1].take_batch().is_some());
    assert!(c.order_to(0, &[0, 1]));
    c.install_at(&[0, 1], &[0, 1]);
    assert!(c.take(0, 1).is_empty());
    assert!(c.take(1, 1).is_empty());
    // Nothing else was sent meanwhile: the batches of the new view are
    // the acknowledgements the view made each daemon send again.
    assert!(c.order_to(0, &[0, 1]));
    assert!(c.take(0, 1).is_empty(), "bob's daemon has not said it yet");
    assert!(c.order_to(1, &[0, 1]));
    let expect = vec![(s("#alice#n0"), vec![s("chat")], b"safe".to_vec())];
    let pair = vec![s("#alice#n0"), s("#bob#n1")];
    for d in [0, 1] {
        let frames = c.take(d, 1);
        assert_eq!(messages(&frames), expect);
        assert_eq!(
            views(&frames),
            vec![(true, pair.clone()), (false, pair.clone())]
        );
    }
    c.settle();
}

/// Nor is a view that adds a daemon: the daemons it keeps may include one
/// that never installs it (swarm seed 548: a stale incarnation listed
/// beside its successor). The held batches wait for the daemons kept (the
/// joiner never holds them: its snapshot and table come after them), or
/// for the view that drops the silent one.
#[test]
fn a_view_that_adds_a_daemon_waits_until_the_daemons_it_keeps_hold_the_safe_batches() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    c.install(&[0, 1], &[]);
    c.cores[2] = Sessions::new("n2", Limits::default(), BATCH_MAX);
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"safe"));
    // Only daemon 0 gets it, and says so; bob's daemon is cut off.
    assert!(c.order_to(0, &[0]));
    assert!(c.order_to(0, &[0]));
    // Daemon 2 joins; bob's daemon is kept but never installs the view.
    c.install_joined_at(&[0, 1, 2], &[2], &[0, 2]);
    assert!(
        c.take(0, 1).is_empty(),
        "bob's daemon has not said it holds it"
    );
    assert_eq!(c.cores[0].stats().join_releases_held, 1);
    // Daemon 2's snapshot waits behind the held batch.
    assert!(c.order_to(2, &[0, 2]));
    assert!(!c.cores[2].ready());
    // Bob's daemon is dropped: alice gets the message in a transitional
    // view without bob, then regular views without him.
    c.install_at(&[0, 2], &[0, 2]);
    let frames = c.take(0, 1);
    let expect = vec![(s("#alice#n0"), vec![s("chat")], b"safe".to_vec())];
    assert_eq!(messages(&frames), expect);
    assert!(
        matches!(&frames[0], Frame::Membership { transitional: true, members, .. } if *members == [s("#alice#n0")])
    );
    assert!(views(&frames)[1..]
        .iter()
        .all(|v| *v == (false, vec![s("#alice#n0")])));
    // The joiner gets its table after them, and serves.
    for _ in 0..8 {
        c.order_to(0, &[0, 2]);
        c.order_to(2, &[0, 2]);
    }
    assert!(c.cores[2].ready());
}

#[test]
fn safe_in_a_cluster_of_one_is_delivered_at_once() {
    let mut c = Cluster::new(1);
    c.connect(0, 1, "solo");
    c.frame(0, 1, join("g"));
    c.settle();
    c.take(0, 1);
    c.frame(0, 1, multicast(Service::Safe, &["g"], b"x"));
    assert!(c.order(0));
    assert_eq!(messages(&c.take(0, 1)).len(), 1);
    // Nobody else to tell.
    assert!(c.cores[0].take_batch().is_none());
}

#[test]
fn a_message_to_a_private_group_reaches_that_client_only() {
    let mut c = two_in_chat();
    c.connect(2, 7, "carol");
    c.frame(2, 7, join("chat"));
    c.settle();
    for (d, s_) in [(0, 1), (1, 1), (2, 7)] {
        c.take(d, s_);
    }
    c.frame(0, 1, multicast(Service::Fifo, &["#bob#n1"], b"psst"));
    // Addressed to bob privately and through a group he is in: once.
    c.frame(
        2,
        7,
        multicast(Service::Agreed, &["chat", "#bob#n1"], b"both"),
    );
    // A private name nobody has: delivered to nobody, no error.
    c.frame(0, 1, multicast(Service::Fifo, &["#nobody#n1"], b"lost"));
    c.settle();
    assert_eq!(
        messages(&c.take(1, 1)),
        vec![
            (s("#alice#n0"), vec![s("#bob#n1")], b"psst".to_vec()),
            (
                s("#carol#n2"),
                vec![s("chat"), s("#bob#n1")],
                b"both".to_vec()
            ),
        ]
    );
    let only_chat = vec![(
        s("#carol#n2"),
        vec![s("chat"), s("#bob#n1")],
        b"both".to_vec(),
    )];
    assert_eq!(messages(&c.take(0, 1)), only_chat);
    assert_eq!(messages(&c.take(2, 7)), only_chat);
}

#[test]
fn a_message_larger_than_a_batch_is_fragmented_and_put_back_together() {
    let mut c = two_in_chat();
    c.take(1, 1);
    let big: Vec<u8> = (0..3 * BATCH_MAX + 17).map(|i| (i % 251) as u8).collect();
    c.frame(0, 1, multicast(Service::Fifo, &["chat"], &big));
    c.frame(0, 1, multicast(Service::Fifo, &["chat"], b"after"));
    c.settle();
    assert!(c.cores[0].stats().fragments_sent >= 4);
    let got = messages(&c.take(1, 1));
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].2, big);
    assert_eq!(got[1].2, b"after");
}

#[test]
fn a_failed_daemon_takes_its_clients_out_of_every_group() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.install(&[0, 2], &[]);
    let alice = memberships(&c.take(0, 1));
    assert_eq!(
        alice,
        vec![(s("chat"), Reason::Network, vec![s("#alice#n0")])]
    );
}

#[test]
fn a_joining_daemon_learns_the_groups_from_snapshots_before_serving() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    // Daemon 2 restarts: a fresh core, joining a view of {0, 1, 2}.
    c.cores[2] = Sessions::new("n2", Limits::default(), BATCH_MAX);
    c.install(&[0, 1], &[]);
    c.install(&[0, 1, 2], &[2]);
    assert!(!c.cores[2].ready());
    c.connect(2, 9, "early");
    assert!(matches!(
        c.closed.get(&(2, 9)),
        Some(Some(Frame::Error { code, .. })) if *code == code::UNAVAILABLE
    ));
    c.settle();
    assert!(c.cores[2].ready());
    c.connect(2, 10, "dave");
    c.frame(2, 10, join("chat"));
    c.settle();
    let dave = memberships(&c.take(2, 10));
    assert_eq!(
        dave,
        vec![(
            s("chat"),
            Reason::Join,
            vec![s("#alice#n0"), s("#bob#n1"), s("#dave#n2")]
        )]
    );
    // Old members' tables did not change on the snapshots.
    assert_eq!(memberships(&c.take(0, 1)).len(), 1);
}

#[test]
fn a_disconnect_and_a_leave_are_announced_with_their_reason() {
    let mut c = two_in_chat();
    c.connect(2, 3, "carol");
    c.frame(2, 3, join("chat"));
    c.settle();
    c.take(0, 1);
    c.take(1, 1);
    c.take(2, 3);
    c.frame(1, 1, Frame::Leave { group: s("chat") });
    c.settle();
    // The leaver hears the view the others get, without itself.
    assert_eq!(
        memberships(&c.take(1, 1)),
        vec![(
            s("chat"),
            Reason::Leave,
            vec![s("#alice#n0"), s("#carol#n2")]
        )]
    );
    c.cores[2].closed(3, Reason::Disconnect);
    c.settle();
    let alice = memberships(&c.take(0, 1));
    assert_eq!(
        alice,
        vec![
            (
                s("chat"),
                Reason::Leave,
                vec![s("#alice#n0"), s("#carol#n2")]
            ),
            (s("chat"), Reason::Disconnect, vec![s("#alice#n0")]),
        ]
    );
}

#[test]
fn bad_requests_get_errors_and_limits_hold() {
    let mut c = Cluster::new(1);
    c.frame(0, 1, join("x"));
    assert!(matches!(
        c.closed.get(&(0, 1)),
        Some(Some(Frame::Error { code, .. })) if *code == code::PROTOCOL
    ));
    c.connect(0, 2, "a");
    c.connect(0, 3, "a");
    assert!(matches!(
        c.closed.get(&(0, 3)),
        Some(Some(Frame::Error { code, .. })) if *code == code::NAME_TAKEN
    ));
    c.take(0, 2);
    c.frame(0, 2, Frame::Leave { group: s("never") });
    c.frame(0, 2, join("#private"));
    let codes: Vec<u16> = c
        .take(0, 2)
        .iter()
        .filter_map(|f| match f {
            Frame::Error { code, .. } => Some(*code),
            _ => None,
        })
        .collect();
    assert_eq!(codes, vec![code::BAD_GROUP, code::BAD_GROUP]);

    let limits = Limits {
        clients: 1,
        groups_per_client: 2,
        ..Limits::default()
    };
    let mut core = Sessions::new("n", limits, BATCH_MAX);
    let v = view(0, &[NodeId(1)], 0, &[], true);
    core.cluster_event(NodeId(1), Event::View(v));
    core.connect(1, "a", true);
    core.connect(2, "b", true);
    core.connect(3, "c", false);
    for g in ["g1", "g2", "g3"] {
        core.frame(1, join(g));
    }
    let outs = core.take_outputs().list;
    let errors: Vec<(SessionId, u16)> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Send(s, Frame::Error { code, .. }) => Some((*s, *code)),
            Output::Close(s, Some(Frame::Error { code, .. })) => Some((*s, *code)),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        vec![(2, code::LIMIT), (3, code::AUTH), (1, code::LIMIT)]
    );
}

#[test]
fn a_slow_client_is_disconnected_and_its_groups_are_told() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.cores[1].slow(1);
    c.collect();
    assert!(matches!(
        c.closed.get(&(1, 1)),
        Some(Some(Frame::Error { code, .. })) if *code == code::SLOW_CLIENT
    ));
    c.settle();
    assert_eq!(
        memberships(&c.take(0, 1)),
        vec![(s("chat"), Reason::Disconnect, vec![s("#alice#n0")])]
    );
}

#[test]
fn a_daemon_shutting_down_says_goodbye_in_the_total_order() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.cores[1].begin_shutdown();
    c.connect(1, 5, "late");
    assert!(matches!(
        c.closed.get(&(1, 5)),
        Some(Some(Frame::Error { code, .. })) if *code == code::SHUTDOWN
    ));
    c.settle();
    assert!(c.cores[1].goodbye_delivered());
    assert_eq!(
        memberships(&c.take(0, 1)),
        vec![(s("chat"), Reason::Disconnect, vec![s("#alice#n0")])]
    );
    c.cores[1].close_all();
    c.collect();
    assert!(matches!(
        c.closed.get(&(1, 1)),
        Some(Some(Frame::Error { code, .. })) if *code == code::SHUTDOWN
    ));
}

/// A join whose batch a view change dropped goes again (the daemon engine
/// hands it back, `requeue`) and is announced once, reason join. (Members
/// used to send snapshots at every join, which carried it; now only the
/// joining daemon sends one, and gets the whole table back.)
#[test]
fn a_join_whose_batch_a_view_change_dropped_is_announced_when_sent_again() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.frame(0, 1, join("news"));
    // Its batch leaves and is dropped in the view change that follows.
    let dropped = c.cores[0].take_batch().expect("the join's batch");
    c.cores[2] = Sessions::new("n2", Limits::default(), BATCH_MAX);
    c.install(&[0, 1], &[]);
    c.install(&[0, 1, 2], &[2]);
    c.cores[0].requeue(vec![dropped], false);
    c.settle();
    assert_eq!(
        memberships(&c.take(0, 1)),
        vec![(s("news"), Reason::Join, vec![s("#alice#n0")])]
    );
}

/// Snapshots in several parts may interleave in the total order: each is
/// compared with what its own daemon had, so an unchanged one announces
/// nothing and a new daemon's clients are announced once.
#[test]
fn interleaved_snapshot_parts_are_told_apart() {
    let mut c = two_in_chat();
    c.take(0, 1);
    let part = |first, last, clients: Vec<(&str, Vec<&str>)>| {
        let mut b = Batches::default();
        b.push(
            &Item::Snapshot {
                epoch: 0,
                first,
                last,
                clients,
            },
            BATCH_MAX,
        );
        b.take().expect("one batch")
    };
    let (known, new) = (c.ids[1], NodeId(30));
    let parts = [
        (known, part(true, false, vec![("#bob#n1", vec!["chat"])])),
        (new, part(true, false, vec![("#xena#n3", vec!["chat"])])),
        (known, part(false, true, vec![])),
        (new, part(false, true, vec![])),
    ];
    for (sender, payload) in parts {
        let gseq = c.gseq;
        c.gseq += 1;
        let event = Event::Deliver {
            sender,
            local_id: 0,
            gseq,
            payload,
        };
        c.cores[0].cluster_event(c.ids[0], event);
    }
    c.collect();
    assert_eq!(
        memberships(&c.take(0, 1)),
        vec![(
            s("chat"),
            Reason::Network,
            vec![s("#alice#n0"), s("#bob#n1"), s("#xena#n3")]
        )]
    );
}

/// Evicted (or merging into another cluster), a daemon keeps its clients:
/// what they send meanwhile waits for the rejoin, and once the daemon is
/// back (a new incarnation) its clients hear a transitional view (those of
/// them that move on together) and then the merged membership, which
/// everyone hears, and the waiting message is delivered.
#[test]
fn an_evicted_daemon_keeps_its_clients_and_rejoins_with_them() {
    let mut c = two_in_chat();
    c.connect(0, 2, "ann");
    c.frame(0, 2, join("chat"));
    c.settle();
    for (d, session) in [(0, 1), (0, 2), (1, 1)] {
        c.take(d, session);
    }
    let removed = Event::Removed {
        view: 3,
        reason: RemovedReason::Dropped,
    };
    c.cores[0].cluster_event(NodeId(10), removed);
    c.collect();
    c.install(&[1, 2], &[]);
    // Nothing yet: the transitional view goes with the next regular one.
    assert_eq!(memberships(&c.take(0, 1)), vec![]);
    assert_eq!(memberships(&c.take(0, 2)), vec![]);
    assert!(c.closed.is_empty(), "{:?}", c.closed);
    assert_eq!(
        memberships(&c.take(1, 1)),
        vec![(s("chat"), Reason::Network, vec![s("#bob#n1")])]
    );
    assert!(!c.cores[0].ready());
    assert_eq!(c.cores[0].clients(), 2);
    c.connect(0, 3, "late");
    assert!(matches!(
        c.closed.remove(&(0, 3)),
        Some(Some(Frame::Error { code, .. })) if code == code::UNAVAILABLE
    ));
    // Alice speaks while her daemon is out: the message waits.
    c.frame(0, 1, multicast(Service::Agreed, &["chat"], b"meanwhile"));
    assert!(c.cores[0].take_batch().is_none());
    // The daemon rejoins under its next incarnation.
    c.ids[0] = NodeId(20);
    c.install(&[0, 1, 2], &[0]);
    c.settle();
    assert!(c.cores[0].ready());
    let merged = (
        s("chat"),
        Reason::Network,
        vec![s("#alice#n0"), s("#ann#n0"), s("#bob#n1")],
    );
    let bob = c.take(1, 1);
    assert_eq!(memberships(&bob), vec![merged.clone()]);
    assert_eq!(
        messages(&bob),
        vec![(s("#alice#n0"), vec![s("chat")], b"meanwhile".to_vec())]
    );
    // At the rejoined daemon: the transitional view (alice and ann move
    // on together), then the merged view, as bob hears it.
    let alice_frames = c.take(0, 1);
    let alice = memberships(&alice_frames);
    let transitional = (
        s("chat"),
        Reason::Network,
        vec![s("#alice#n0"), s("#ann#n0")],
    );
    assert_eq!(alice, vec![transitional, merged.clone()], "{alice:?}");
    let flags: Vec<bool> = alice_frames
        .iter()
        .filter_map(|f| match f {
            Frame::Membership { transitional, .. } => Some(*transitional),
            _ => None,
        })
        .collect();
    assert_eq!(flags, vec![true, false]);
    // Her groups went into the order before her message: she is a member
    // again when it is delivered, and gets it too.
    assert_eq!(messages(&alice_frames), messages(&bob));
    assert!(alice.iter().all(|m| m.1 == Reason::Network), "{alice:?}");
    assert!(c.closed.is_empty(), "{:?}", c.closed);
}

/// Batches a daemon handed to the old order and never heard sequenced
/// when it is cut off (the old order may have sequenced them, the notice
/// lost): their messages go to its own clients in their transitional
/// views, as EVS has it, and are not sent again after the rejoin, where a
/// copy the old order had delivered was delivered twice. A message begun
/// in pieces in them is finished from what still waited and delivered
/// whole.
#[test]
fn messages_in_flight_at_an_eviction_come_back_in_the_transitional_views_and_not_again() {
    let mut c = two_in_chat();
    c.connect(0, 2, "ann");
    c.frame(0, 2, join("chat"));
    c.settle();
    for (d, session) in [(0, 1), (0, 2), (1, 1)] {
        c.take(d, session);
    }
    c.frame(0, 1, multicast(Service::Agreed, &["chat"], b"in flight"));
    let big: Vec<u8> = (0..3 * BATCH_MAX + 17).map(|i| (i % 251) as u8).collect();
    c.frame(0, 2, multicast(Service::Fifo, &["chat"], &big));
    // The first two batches left (the small message and the first pieces
    // of the large one); the rest still waits.
    let in_flight = vec![
        (c.cores[0].take_batch().expect("a batch"), false),
        (c.cores[0].take_batch().expect("a batch"), true),
    ];
    c.evict(0, in_flight);
    c.install(&[1, 2], &[]);
    c.take(1, 1);
    c.ids[0] = NodeId(20);
    c.install(&[0, 1, 2], &[0]);
    c.settle();
    assert!(c.cores[0].ready());
    let expected = vec![
        (s("#alice#n0"), vec![s("chat")], b"in flight".to_vec()),
        (s("#ann#n0"), vec![s("chat")], big),
    ];
    for session in [1, 2] {
        let frames = c.take(0, session);
        // Transitional view, both messages, then the merged view.
        let kinds: Vec<&str> = frames
            .iter()
            .map(|f| match f {
                Frame::Membership {
                    transitional: true, ..
                } => "transitional",
                Frame::Membership { .. } => "regular",
                Frame::Message { .. } => "message",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            ["transitional", "message", "message", "regular"],
            "{frames:?}"
        );
        assert_eq!(messages(&frames), expected);
    }
    // Bob's daemon never ordered them, and nothing went again.
    assert_eq!(messages(&c.take(1, 1)), vec![]);
    assert!(c.cores[0].take_batch().is_none());
}

/// Joins in flight with messages when their daemon was cut off: nothing
/// local tells whether the old order sequenced them. Each joiner (one that
/// had been a member, left and joined again; one never a member) is shown
/// the view its join makes under an id of its daemon's own, then, once the
/// daemon is back, a transitional view of its own with what was in flight
/// after its join, its own message among them; the group's other local
/// member gets both in its transitional view. Nothing goes again: where the
/// old order had delivered a copy, a second one was a duplicate.
#[test]
fn a_join_in_flight_at_a_cut_off_is_applied_there_and_its_message_not_sent_again() {
    let mut c = two_in_chat();
    c.connect(0, 2, "cat");
    c.connect(0, 3, "dan");
    c.frame(0, 2, join("chat"));
    c.settle();
    c.frame(0, 2, Frame::Leave { group: s("chat") });
    c.settle();
    c.frame(0, 2, join("chat"));
    c.frame(0, 2, multicast(Service::Agreed, &["chat"], b"hello"));
    c.frame(0, 3, join("chat"));
    c.frame(0, 3, multicast(Service::Agreed, &["chat"], b"hi"));
    let in_flight = vec![(c.cores[0].take_batch().expect("a batch"), false)];
    for (d, session) in [(0, 1), (0, 2), (0, 3), (1, 1)] {
        c.take(d, session);
    }
    c.evict(0, in_flight);
    // At the cut: each joiner is shown the view its join makes.
    let (alice, bob, cat, dan) = (s("#alice#n0"), s("#bob#n1"), s("#cat#n0"), s("#dan#n0"));
    let shown = |frames: &[Frame]| -> Vec<(Vec<String>, bool, u64)> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::Membership {
                    members,
                    transitional,
                    view_id,
                    ..
                } => Some((members.clone(), *transitional, *view_id)),
                _ => None,
            })
            .collect()
    };
    let cat_at_cut = shown(&c.take(0, 2));
    let dan_at_cut = shown(&c.take(0, 3));
    let with_cat = vec![alice.clone(), bob.clone(), cat.clone()];
    let with_dan = vec![alice.clone(), bob.clone(), cat.clone(), dan.clone()];
    assert_eq!(
        cat_at_cut
            .iter()
            .map(|v| (v.0.clone(), v.1))
            .collect::<Vec<_>>(),
        vec![(with_cat, false)]
    );
    assert_eq!(
        dan_at_cut
            .iter()
            .map(|v| (v.0.clone(), v.1))
            .collect::<Vec<_>>(),
        vec![(with_dan, false)]
    );
    assert_ne!(cat_at_cut[0].2, dan_at_cut[0].2);
    assert!(c.take(0, 1).is_empty());
    c.install(&[1, 2], &[]);
    c.ids[0] = NodeId(20);
    c.install(&[0, 1, 2], &[0]);
    c.settle();
    assert!(c.cores[0].ready());
    let hello = (cat.clone(), vec![s("chat")], b"hello".to_vec());
    let hi = (dan.clone(), vec![s("chat")], b"hi".to_vec());
    let alice_frames = c.take(0, 1);
    let cat_frames = c.take(0, 2);
    let dan_frames = c.take(0, 3);
    assert_eq!(messages(&alice_frames), vec![hello.clone(), hi.clone()]);
    assert_eq!(messages(&cat_frames), vec![hello, hi.clone()]);
    assert_eq!(messages(&dan_frames), vec![hi]);
    // Each joiner's transitional view follows its own view, under its id,
    // and lists it alone; then the merged view.
    for (frames, at_cut, me) in [
        (&cat_frames, &cat_at_cut, &cat),
        (&dan_frames, &dan_at_cut, &dan),
    ] {
        let views = shown(frames);
        assert_eq!(views.len(), 2, "{frames:?}");
        assert_eq!(views[0], (vec![me.clone()], true, at_cut[0].2));
        assert!(!views[1].1 && views[1].2 > at_cut[0].2, "{views:?}");
        assert!(views[1].0.contains(me));
    }
    // Bob's daemon never ordered them, and nothing went again.
    assert_eq!(messages(&c.take(1, 1)), vec![]);
    while let Some(batch) = c.cores[0].take_batch() {
        let items = groups::decode(&batch).expect("a batch");
        assert!(
            !items.iter().any(|i| matches!(i, Item::Message { .. })),
            "{items:?}"
        );
    }
}

#[test]
fn unreliable_and_probabilistic_go_by_pbcast_alone_and_arrive_at_once() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    c.frame(0, 1, multicast(Service::Agreed, &["chat"], b"ordered"));
    c.frame(0, 1, multicast(Service::Unreliable, &["chat"], b"u"));
    c.frame(0, 1, multicast(Service::Probabilistic, &["chat"], b"p"));
    // The unsequenced pair is not in the total order's batch: it arrives
    // first, before the agreed message sent ahead of it is ordered.
    c.spread_unsequenced(0);
    let first = vec![
        (s("#alice#n0"), vec![s("chat")], b"u".to_vec()),
        (s("#alice#n0"), vec![s("chat")], b"p".to_vec()),
    ];
    assert_eq!(messages(&c.take(1, 1)), first);
    assert_eq!(messages(&c.take(0, 1)), first);
    c.settle();
    let ordered = vec![(s("#alice#n0"), vec![s("chat")], b"ordered".to_vec())];
    assert_eq!(messages(&c.take(1, 1)), ordered);
    assert_eq!(c.cores[0].stats().unsequenced_batches_sent, 1);
    assert_eq!(c.cores[1].stats().unsequenced_batches_received, 1);
}

#[test]
fn a_sequenced_item_in_an_unsequenced_batch_is_refused() {
    let mut c = two_in_chat();
    c.take(1, 1);
    let mut batch = Vec::new();
    groups::encode(
        &[
            Item::Message {
                client: "#alice#n0",
                service: Service::Agreed as u8,
                flags: 0,
                mess_type: 0,
                groups: vec!["chat"],
                payload: b"sneaky",
            },
            Item::Join {
                client: "#alice#n0",
                group: "other",
            },
        ],
        &mut batch,
    )
    .unwrap();
    let event = Event::Unsequenced {
        sender: c.ids[0],
        payload: Bytes::from(batch),
    };
    let me = c.ids[1];
    c.cores[1].cluster_event(me, event);
    c.collect();
    assert!(messages(&c.take(1, 1)).is_empty());
    assert_eq!(c.cores[1].stats().malformed_batches, 2);
    assert_eq!(c.cores[1].groups(), 1);
}

fn multicast_ext(service: Service, flags: u8, mess_type: u16, payload: &[u8]) -> Frame {
    Frame::MulticastExt {
        service,
        flags,
        mess_type,
        groups: vec![s("chat")],
        payload: payload.to_vec(),
    }
}

/// `(sender, type, payload)` of the messages, plain ones as type 0.
fn typed(frames: &[Frame]) -> Vec<(String, u16, Vec<u8>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Message {
                sender, payload, ..
            } => Some((sender.clone(), 0, payload.clone())),
            Frame::MessageExt {
                sender,
                mess_type,
                payload,
                ..
            } => Some((sender.clone(), *mess_type, payload.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn self_discard_skips_only_the_sending_connection_and_the_type_goes_everywhere() {
    let mut c = two_in_chat();
    // A second connection at alice's daemon, in the same group.
    c.connect(0, 2, "alice2");
    c.frame(0, 2, join("chat"));
    c.settle();
    for (d, s_) in [(0, 1), (0, 2), (1, 1)] {
        c.take(d, s_);
    }
    let big = vec![5u8; 3 * BATCH_MAX];
    for service in [Service::Agreed, Service::Unreliable] {
        c.frame(
            0,
            1,
            multicast_ext(service, multicast_flags::SELF_DISCARD, 7, b"x"),
        );
        c.frame(0, 1, multicast_ext(service, 0, 9, b"y"));
        c.frame(
            0,
            1,
            multicast_ext(service, multicast_flags::SELF_DISCARD, 0, b"z"),
        );
        c.spread_unsequenced(0);
        c.settle();
    }
    // Too large for one batch: fragments carry the flags and the type.
    c.frame(
        0,
        1,
        multicast_ext(Service::Fifo, multicast_flags::SELF_DISCARD, 3, &big),
    );
    c.settle();
    let a = s("#alice#n0");
    let all = vec![
        (a.clone(), 7, b"x".to_vec()),
        (a.clone(), 9, b"y".to_vec()),
        (a.clone(), 0, b"z".to_vec()),
        (a.clone(), 7, b"x".to_vec()),
        (a.clone(), 9, b"y".to_vec()),
        (a.clone(), 0, b"z".to_vec()),
        (a.clone(), 3, big.clone()),
    ];
    assert_eq!(typed(&c.take(1, 1)), all);
    assert_eq!(typed(&c.take(0, 2)), all);
    // The sender gets back only what it did not discard.
    assert_eq!(
        typed(&c.take(0, 1)),
        vec![(a.clone(), 9, b"y".to_vec()), (a, 9, b"y".to_vec())]
    );
}

/// A joining daemon gets the whole table in parts that each fit a batch
/// (the harness refuses a larger batch), however many members there are.
#[test]
fn a_rejoining_daemon_completes_a_message_whose_first_pieces_preceded_its_table() {
    let mut c = two_in_chat();
    c.take(0, 1);
    c.take(1, 1);
    // Bob's daemon is evicted and rejoins under its next incarnation.
    let removed = Event::Removed {
        view: 3,
        reason: RemovedReason::Dropped,
    };
    c.cores[1].cluster_event(NodeId(11), removed);
    c.collect();
    c.install(&[0, 2], &[]);
    c.ids[1] = NodeId(21);
    c.install(&[0, 1, 2], &[1]);
    // Alice sends a message in pieces; its first piece is ordered before
    // the rejoined daemon's snapshot, so before the point its table is as
    // of, and the rest after.
    let big: Vec<u8> = (0..3 * BATCH_MAX + 17).map(|i| (i % 251) as u8).collect();
    c.frame(0, 1, multicast(Service::Fifo, &["chat"], &big));
    assert!(c.order(0));
    assert!(c.order(1));
    c.settle();
    assert!(c.cores[1].ready());
    assert!(c.cores[0].stats().fragments_sent >= 4);
    // Bob moved on with alice into the merged view: he gets it as she does.
    let alice = messages(&c.take(0, 1));
    assert_eq!(alice, vec![(s("#alice#n0"), vec![s("chat")], big)]);
    assert_eq!(messages(&c.take(1, 1)), alice);
}

#[test]
fn a_large_table_reaches_a_joining_daemon_in_parts_that_fit_a_batch() {
    let mut c = Cluster::new(3);
    for i in 0..60 {
        let session = 100 + i;
        c.connect(0, session, &format!("client-with-a-long-name-{i:03}"));
        c.frame(0, session, join(&format!("group-{}", i % 7)));
    }
    c.settle();
    c.cores[2] = Sessions::new("n2", Limits::default(), BATCH_MAX);
    c.install(&[0, 1], &[]);
    c.install(&[0, 1, 2], &[2]);
    c.settle();
    assert!(c.cores[2].ready());
    assert_eq!(c.cores[2].groups(), 7);
    assert_eq!(c.cores[2].table, c.cores[0].table);
}

#[test]
fn held_for_counts_a_clients_messages_until_the_order_delivers_them() {
    let mut c = Cluster::new(2);
    c.connect(0, 1, "a");
    c.connect(0, 2, "b");
    c.frame(0, 1, join("chat"));
    c.settle();
    assert_eq!(c.cores[0].held_for(1, []), Some((0, 0)));
    for _ in 0..5 {
        c.frame(0, 1, multicast(Service::Agreed, &["chat"], &[1; 100]));
    }
    // Larger than a batch: fragments, counted as one message.
    c.frame(0, 1, multicast(Service::Fifo, &["chat"], &[2; 2_500]));
    c.frame(0, 1, multicast(Service::Unreliable, &["chat"], &[3; 10]));
    // Another client's message is not this one's.
    c.frame(0, 2, multicast(Service::Agreed, &["chat"], &[4; 50]));
    let want = Some((7, 5 * 100 + 2_500 + 10));
    assert_eq!(c.cores[0].held_for(1, []), want);
    assert_eq!(c.cores[0].held_for(2, []), Some((1, 50)));
    assert_eq!(c.cores[0].held_for(3, []), None, "not connected");
    // A batch taken for the total order still counts, as in flight.
    let batch = c.cores[0].take_batch().expect("a batch");
    let in_flight = c.cores[0].held_for(1, [&batch[..]]);
    assert_eq!(in_flight, want);
    let left = c.cores[0].held_for(1, []).unwrap();
    assert!(left.0 < 7, "the taken batch is no longer waiting: {left:?}");
    c.cores[0].requeue(vec![batch], false);
    c.settle();
    c.spread_unsequenced(0);
    assert_eq!(c.cores[0].held_for(1, []), Some((0, 0)));
    // Its own seven and b's one.
    assert_eq!(messages(&c.take(0, 1)).len(), 8);
}

/// Cut off with its clients, a daemon that finds nobody founds a group of
/// its own (the minority side of a partition, or the survivor of two): its
/// clients hear a transitional view (those of them that move on), then the
/// regular view of the new group, as a daemon that rejoins others does;
/// what alice sent meanwhile is delivered after both.
#[test]
fn a_cut_off_daemon_that_founds_a_group_alone_gives_its_clients_a_transitional_view_first() {
    let mut c = two_in_chat();
    c.connect(0, 2, "ann");
    c.frame(0, 2, join("chat"));
    c.settle();
    for (d, session) in [(0, 1), (0, 2), (1, 1)] {
        c.take(d, session);
    }
    let removed = Event::Removed {
        view: 3,
        reason: RemovedReason::Dropped,
    };
    c.cores[0].cluster_event(NodeId(10), removed);
    c.collect();
    c.frame(0, 1, multicast(Service::Agreed, &["chat"], b"meanwhile"));
    // It founds a group alone under its next incarnation, and orders its
    // own batches (nobody else is in its group).
    c.ids[0] = NodeId(20);
    // One daemon of three: the engine sets the quorum flag down.
    c.cores[0].set_quorum(false);
    c.install(&[0], &[0]);
    let mut gseq = 100;
    while let Some(batch) = c.cores[0].take_batch() {
        gseq += 1;
        let event = Event::Deliver {
            sender: NodeId(20),
            local_id: 0,
            gseq,
            payload: batch,
        };
        c.cores[0].cluster_event(NodeId(20), event);
        c.collect();
    }
    assert!(c.cores[0].ready());
    let ours = vec![s("#alice#n0"), s("#ann#n0")];
    for session in [1, 2] {
        let frames = c.take(0, session);
        let views: Vec<(bool, bool, Vec<String>)> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::Membership {
                    transitional,
                    quorum,
                    members,
                    ..
                } => Some((*transitional, *quorum, members.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            views,
            vec![(true, false, ours.clone()), (false, false, ours.clone())],
            "session {session}"
        );
        assert!(memberships(&frames).iter().all(|m| m.1 == Reason::Network));
        assert_eq!(
            messages(&frames),
            vec![(s("#alice#n0"), vec![s("chat")], b"meanwhile".to_vec())],
            "session {session}"
        );
        // The transitional view comes first, the message after the regular one.
        let message_at = frames
            .iter()
            .position(|f| matches!(f, Frame::Message { .. }))
            .unwrap();
        let regular_at = frames
            .iter()
            .position(|f| {
                matches!(
                    f,
                    Frame::Membership {
                        transitional: false,
                        ..
                    }
                )
            })
            .unwrap();
        assert!(regular_at < message_at, "session {session}: {frames:?}");
    }
}

/// A client's join and then its `safe` message, held behind an unstable
/// `safe` message when its daemon was cut off: the others applied the join
/// and delivered both messages, the second in the view the join made. The
/// joiner is shown that view (the same id and list as the others), then a
/// transitional view of its own and its message; the group's other local
/// member gets both messages in its transitional view and is never shown
/// the join's view, since it delivered the first message after its last
/// regular view.
#[test]
fn a_join_held_at_a_cut_off_is_shown_to_its_client_with_what_followed_it() {
    let mut c = two_in_chat();
    c.connect(0, 2, "cat");
    for (d, session) in [(0, 1), (0, 2), (1, 1)] {
        c.take(d, session);
    }
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"first"));
    assert!(c.order(0));
    c.frame(0, 2, join("chat"));
    c.frame(0, 2, multicast(Service::Safe, &["chat"], b"hello"));
    // Daemon 0's batches (the join and hello, its acknowledgements) reach
    // everyone; daemon 2's acknowledgements reach daemons 1 and 2 only.
    while c.order(0) {}
    while c.order(1) {}
    while c.order_to(2, &[1, 2]) || c.order_to(1, &[1, 2]) {}
    let first = (s("#alice#n0"), vec![s("chat")], b"first".to_vec());
    let hello = (s("#cat#n0"), vec![s("chat")], b"hello".to_vec());
    let bob = c.take(1, 1);
    assert_eq!(messages(&bob), vec![first.clone(), hello.clone()]);
    let joined = bob
        .iter()
        .find_map(|f| match f {
            Frame::Membership {
                view_id, members, ..
            } if members.contains(&s("#cat#n0")) => Some((*view_id, members.clone())),
            _ => None,
        })
        .expect("bob is shown cat's join");
    assert!(messages(&c.take(0, 1)).is_empty(), "held at daemon 0");
    c.evict(0, Vec::new());
    c.install(&[1, 2], &[]);
    c.ids[0] = NodeId(20);
    c.install(&[0, 1, 2], &[0]);
    c.settle();
    assert!(c.cores[0].ready());
    let kinds = |frames: &[Frame]| -> Vec<String> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::Membership {
                    group,
                    transitional,
                    ..
                } if group == "chat" => Some(if *transitional {
                    "transitional"
                } else {
                    "regular"
                }),
                Frame::Message { payload, .. } => Some(if payload == b"first" {
                    "first"
                } else {
                    "hello"
                }),
                _ => None,
            })
            .map(str::to_string)
            .collect()
    };
    let cat = c.take(0, 2);
    assert_eq!(
        kinds(&cat),
        ["regular", "transitional", "hello", "regular"],
        "{cat:?}"
    );
    let Frame::Membership {
        view_id, members, ..
    } = &cat[0]
    else {
        panic!("{cat:?}")
    };
    assert_eq!((*view_id, members.clone()), joined);
    let Frame::Membership {
        view_id: transitional_id,
        members: transitional_members,
        ..
    } = &cat[1]
    else {
        panic!("{cat:?}")
    };
    assert!(*transitional_id > joined.0);
    assert_eq!(transitional_members, &vec![s("#cat#n0")]);
    let alice = c.take(0, 1);
    assert_eq!(
        kinds(&alice),
        ["transitional", "first", "hello", "regular"],
        "{alice:?}"
    );
    assert!(memberships(&alice)[0].2 == vec![s("#alice#n0")]);
}

/// A daemon rejoins; the member designated to send it the table (the
/// lowest slot) fails before its table is ordered, and another member sends
/// it. That one's table is as of the joiner's snapshot, as the first one's
/// was, not as of the view without the failed member: the joiner then
/// applies what was ordered after its snapshot, and its client gets the
/// message it sent meanwhile, as the others' clients did.
#[test]
fn a_table_sent_again_for_a_failed_member_is_as_of_the_joiners_snapshot() {
    let mut c = two_in_chat();
    c.connect(2, 1, "cat");
    c.frame(2, 1, join("chat"));
    c.settle();
    for (d, session) in [(0, 1), (1, 1), (2, 1)] {
        c.take(d, session);
    }
    c.evict(2, Vec::new());
    c.install(&[0, 1], &[]);
    c.ids[2] = NodeId(22);
    c.install(&[0, 1, 2], &[2]);
    // Its snapshot, then its client's message, are ordered.
    assert!(c.order(2));
    c.frame(
        2,
        1,
        multicast(Service::Agreed, &["chat"], b"while joining"),
    );
    assert!(c.order(2));
    let expected = vec![(s("#cat#n2"), vec![s("chat")], b"while joining".to_vec())];
    assert_eq!(messages(&c.take(1, 1)), expected);
    assert!(!c.cores[2].ready(), "waits for its table");
    // Daemon 0 (to send the table) fails before its batch is ordered.
    assert!(c.cores[0].take_batch().is_some());
    c.install(&[1, 2], &[]);
    while c.order_to(1, &[1, 2]) || c.order_to(2, &[1, 2]) {}
    assert!(c.cores[2].ready());
    assert_eq!(messages(&c.take(2, 1)), expected);
}

/// Three daemons; 1 and 2 restart (fresh cores) and are out of the view.
fn daemons_1_and_2_restarted() -> Cluster {
    let mut c = Cluster::new(3);
    for d in [1, 2] {
        c.cores[d] = Sessions::new(&format!("n{d}"), Limits::default(), BATCH_MAX);
    }
    c.install(&[0], &[]);
    c
}

/// Daemon 0 restarts and joins; daemon 1 owes it the table, but daemon 0
/// leaves before that table is ordered. The table, ordered afterwards,
/// must not settle a daemon that left: settled, with the lowest slot, it
/// would be the designated sender of later joiners' tables, and they
/// would wait for ever (fix 36; swarm seed 234 with `--view-period-ms
/// 2000`). Here daemon 0 comes back and gets its table from daemon 1.
#[test]
fn a_table_ordered_after_its_joiner_left_does_not_settle_it() {
    let mut c = Cluster::new(3);
    c.cores[0] = Sessions::new("n0", Limits::default(), BATCH_MAX);
    c.install(&[1, 2], &[]);
    c.install(&[0, 1, 2], &[0]);
    assert!(c.order(0), "daemon 0's snapshot");
    c.install(&[1, 2], &[]);
    c.settle();
    for d in [1, 2] {
        assert!(
            !c.cores[d].settled_daemons().contains(&c.ids[0]),
            "daemon {d} counts the departed joiner settled"
        );
    }
    c.cores[0] = Sessions::new("n0", Limits::default(), BATCH_MAX);
    c.install(&[0, 1, 2], &[0]);
    c.settle();
    assert!(c.cores[0].ready(), "daemon 1 sent the table");
}

/// Daemons 1 and 2 restart and join daemon 0's view; daemon 0 applies their
/// snapshots but is cut off before the tables it owes them are ordered.
/// The view of 1 and 2 alone has no settled daemon to send a table, and
/// neither can settle: each knows its table will never come (the daemon
/// engine then starts it over). Before, they waited for ever, delivering
/// nothing (swarm seed 3911 with fix 32's first version).
#[test]
fn joiners_left_without_a_settled_daemon_know_their_table_will_never_come() {
    let mut c = daemons_1_and_2_restarted();
    c.install(&[0, 1, 2], &[1, 2]);
    while c.order(1) || c.order(2) {}
    assert!(!c.cores[1].ready() && !c.cores[2].ready());
    assert!(!c.cores[1].take_table_lost(), "daemon 0 is still there");
    c.install(&[1, 2], &[]);
    assert!(c.cores[1].take_table_lost());
    assert!(c.cores[2].take_table_lost());
    assert!(!c.cores[1].take_table_lost(), "reading clears it");
}

/// Daemons 1 and 2 join daemon 0's view and are ordered their snapshots,
/// then daemon 0 is gone in the view daemon 3 joins (restarted). Daemon 3's
/// snapshot is not yet ordered at that view, so daemons 1 and 2 do not yet
/// know it waits too. When it is ordered, they know at once that no table
/// will come, without waiting for the next view (fix 52; swarm seed 895:
/// a group of joiners stalled until the periodic view 20 s later).
#[test]
fn joiners_know_their_table_is_lost_when_the_last_fellow_joiners_snapshot_comes() {
    let mut c = Cluster::new(4);
    for d in [1, 2, 3] {
        c.cores[d] = Sessions::new(&format!("n{d}"), Limits::default(), BATCH_MAX);
    }
    c.install(&[0], &[]);
    c.install(&[0, 1, 2], &[1, 2]);
    while c.order(1) || c.order(2) {}
    c.install(&[1, 2, 3], &[3]);
    for d in [1, 2] {
        assert!(
            !c.cores[d].take_table_lost(),
            "daemon 3 is not known to wait"
        );
    }
    assert!(c.order(3), "daemon 3's snapshot");
    for d in [1, 2] {
        assert!(c.cores[d].take_table_lost(), "daemon {d}");
    }
    // Daemon 3 cannot know: the others' snapshots came before its first
    // view. It is left alone when they start over, and holds the table.
    assert!(!c.cores[3].take_table_lost());
    c.install(&[3], &[]);
    assert!(c.cores[3].ready());
}

/// The same, but daemon 0's tables are ordered first: the joiners settle,
/// and a view without daemon 0 loses nothing. And a joiner whose fellow
/// joiner did get its table (the only settled daemon left) waits for it.
#[test]
fn a_joiner_with_a_settled_daemon_left_waits_for_its_table() {
    let mut c = daemons_1_and_2_restarted();
    c.install(&[0, 1, 2], &[1, 2]);
    c.settle();
    assert!(c.cores[1].ready() && c.cores[2].ready());
    c.install(&[1, 2], &[]);
    assert!(!c.cores[1].take_table_lost() && !c.cores[2].take_table_lost());

    let mut c = daemons_1_and_2_restarted();
    c.install(&[0, 1], &[1]);
    c.settle();
    assert!(c.cores[1].ready());
    c.install(&[0, 1, 2], &[2]);
    assert!(c.order(2), "daemon 2's snapshot");
    c.install(&[1, 2], &[]);
    assert!(!c.cores[2].ready());
    assert!(
        !c.cores[2].take_table_lost(),
        "daemon 1 holds a table and owes daemon 2 one"
    );
    c.settle();
    assert!(c.cores[2].ready(), "daemon 1 sent it");
}

/// A rejoining daemon's client spoke while the daemon waited for its
/// table; the message was ordered (the others may have delivered it) but
/// never applied here, and the table never came. When the daemon engine
/// starts it over, the message reaches its sender in the transitional view
/// and is not sent again.
#[test]
fn a_message_ordered_while_the_table_never_came_reaches_its_sender() {
    let mut c = Cluster::new(4);
    c.connect(0, 1, "alice");
    c.take(0, 1);
    c.frame(0, 1, join("chat"));
    c.settle();
    c.take(0, 1);
    // Daemons 0 and 3 are cut off; alice speaks meanwhile.
    for d in [0, 3] {
        c.evict(d, Vec::new());
    }
    c.install(&[1, 2], &[]);
    c.frame(0, 1, multicast(Service::Agreed, &["chat"], b"meanwhile"));
    c.ids[0] = NodeId(20);
    c.ids[3] = NodeId(23);
    c.install(&[0, 1, 2, 3], &[0, 3]);
    // Both snapshots and alice's message are ordered; daemons 1 and 2 are
    // cut off before the tables they owe go.
    while c.order(0) || c.order(3) {}
    assert!(!c.cores[0].ready());
    c.install(&[0, 3], &[]);
    assert!(c.cores[0].take_table_lost() && c.cores[3].take_table_lost());
    for d in [0, 3] {
        c.evict(d, Vec::new());
    }
    // Daemon 0 starts over and founds a group alone.
    c.ids[0] = NodeId(30);
    c.install(&[0], &[0]);
    c.settle();
    assert!(c.cores[0].ready());
    let frames = c.take(0, 1);
    assert_eq!(
        messages(&frames),
        vec![(s("#alice#n0"), vec![s("chat")], b"meanwhile".to_vec())],
        "{frames:?}"
    );
    assert!(
        frames.iter().any(|f| matches!(
            f,
            Frame::Membership {
                transitional: true,
                ..
            }
        )),
        "{frames:?}"
    );
    assert!(c.cores[0].take_batch().is_none(), "nothing goes again");
}

/// A daemon cut off while its client is in the transitional view of a
/// deferred removal, holding a `safe` message the others may still find
/// stable and deliver in that view: the client stays in it until its
/// daemon is back (swarm seed 454: shown the regular view that ends it at
/// the cut, the client had moved on without a message the others
/// delivered there, and it was gone before its daemon came back).
#[test]
fn a_client_cut_off_in_a_transitional_view_stays_there_until_its_daemon_is_back() {
    let mut c = three_in_chat();
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"first"));
    assert!(c.order_to(0, &[0, 1]));
    // Both daemons kept say they hold it; carol's never does.
    assert!(c.order_to(0, &[0, 1]));
    assert!(c.order_to(1, &[0, 1]));
    c.frame(0, 1, multicast(Service::Safe, &["chat"], b"second"));
    assert!(c.order_to(0, &[0, 1]));
    c.install_at(&[0, 1], &[0, 1]);
    assert!(c.take(1, 1).is_empty());
    // Daemon 0 says again that it holds both; daemon 1's word is lost.
    assert!(c.order_to(0, &[0, 1]));
    let pair = vec![s("#alice#n0"), s("#bob#n1")];
    let said = |text: &[u8]| vec![(s("#alice#n0"), vec![s("chat")], text.to_vec())];
    let frames = c.take(1, 1);
    assert_eq!(views(&frames), vec![(true, pair.clone())]);
    assert_eq!(messages(&frames), said(b"first"));
    // Cut off: bob stays in the transitional view, where the others may
    // still deliver "second" (daemon 1 acknowledged it before the view).
    c.evict(1, Vec::new());
    assert!(c.take(1, 1).is_empty(), "no view until daemon 1 is back");
    c.install_at(&[0], &[0]);
    assert_eq!(
        messages(&c.take(0, 1)),
        [said(b"first"), said(b"second")].concat()
    );
    // Back: the regular view that ends it (an id of its own), then its
    // transitional view of the cut with what it held, then the merge.
    c.ids[1] = NodeId(21);
    c.install(&[0, 1], &[1]);
    c.settle();
    let frames = c.take(1, 1);
    assert_eq!(
        views(&frames),
        vec![
            (false, pair.clone()),
            (true, vec![s("#bob#n1")]),
            (false, pair.clone())
        ]
    );
    assert_eq!(messages(&frames), said(b"second"));
}

/// Daemon 2 joins; its snapshot is ordered, then bob's `safe` message
/// (held at 0 and 1 until every daemon says it holds it), then the table
/// daemon 0 owes it. Daemons 0 and 1 apply the table item only once the
/// held batch goes; daemon 2 installs the table as it arrives. Whether a
/// daemon waits for its table decides how a view change releases held
/// batches, so daemon 2 must count itself settled where the others do: at
/// its table item in the order, not on arrival (fix 48; swarm seed 811,
/// harshest shape: at the next view change the others released at once
/// and the joiner deferred, and one transitional view id had two member
/// lists).
#[test]
fn a_joiner_counts_itself_settled_where_the_others_apply_its_table() {
    let mut c = two_in_chat();
    c.install(&[0, 1], &[]);
    c.cores[2] = Sessions::new("n2", Limits::default(), BATCH_MAX);
    c.install(&[0, 1, 2], &[2]);
    assert!(c.order(2), "daemon 2's snapshot");
    c.frame(1, 1, multicast(Service::Safe, &["chat"], b"safe"));
    assert!(c.order(1), "bob's safe message");
    assert!(
        c.cores[0].held_batches() > 0,
        "held until every daemon has it"
    );
    assert!(c.order(0), "the table daemon 0 owes daemon 2");
    assert!(c.cores[2].ready(), "daemon 2 installed its table");
    let settled = |c: &Cluster, d: usize| c.cores[d].settled_daemons().clone();
    assert!(!settled(&c, 0).contains(&c.ids[2]));
    for d in [1, 2] {
        assert_eq!(settled(&c, d), settled(&c, 0), "daemon {d}");
    }
    c.settle();
    for d in 0..3 {
        assert!(settled(&c, d).contains(&c.ids[2]), "daemon {d}");
    }
}
