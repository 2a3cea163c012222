//! State transfer over a hand-driven total order: every ordered item goes
//! to every member in the same order, as the daemons deliver a group's
//! views and agreed messages; what a member sends joins the order's end.

use std::collections::BTreeMap;

use super::*;
use crate::Reason;

/// A replicated log of numbers: the state is their list, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Log {
    entries: Vec<u32>,
    views: usize,
}

impl Replica for Log {
    fn apply(&mut self, m: &Message) {
        self.entries
            .push(u32::from_be_bytes(m.payload[..4].try_into().unwrap()));
    }
    fn view(&mut self, _v: &Membership) {
        self.views += 1;
    }
    fn snapshot(&self) -> Vec<u8> {
        self.entries.iter().flat_map(|e| e.to_be_bytes()).collect()
    }
    fn restore(&mut self, s: &[u8]) {
        self.entries = s
            .chunks(4)
            .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
            .collect();
    }
}

const G: &str = "g";

fn pg(name: &str) -> String {
    format!("#{name}#d")
}

enum Item {
    View(Vec<String>),
    Msg {
        from: String,
        to: String,
        mess_type: u16,
        payload: Vec<u8>,
    },
}

struct Member {
    st: StateTransfer,
    log: Log,
    /// Crashed: receives nothing, sends nothing.
    dead: bool,
}

#[derive(Default)]
struct Bus {
    members: BTreeMap<String, Member>,
    /// The members as scheduled (the next view's list).
    group: Vec<String>,
    /// The members as of the last view delivered: who gets a message.
    current: Vec<String>,
    order: std::collections::VecDeque<Item>,
    view_id: u64,
}

impl Bus {
    fn join(&mut self, name: &str) {
        let p = pg(name);
        self.members.insert(
            p.clone(),
            Member {
                st: StateTransfer::new(G, &p),
                log: Log::default(),
                dead: false,
            },
        );
        let mut members = self.group.clone();
        members.push(p);
        members.sort();
        self.group.clone_from(&members);
        self.order.push_back(Item::View(members));
    }

    fn leave(&mut self, name: &str) {
        let p = pg(name);
        self.group.retain(|m| *m != p);
        self.members.get_mut(&p).unwrap().dead = true;
        self.order.push_back(Item::View(self.group.clone()));
    }

    /// An application update from `name` (agreed, to the group).
    fn update(&mut self, name: &str, value: u32) {
        self.order.push_back(Item::Msg {
            from: pg(name),
            to: G.into(),
            mess_type: 0,
            payload: value.to_be_bytes().to_vec(),
        });
    }

    /// Delivers the next ordered item to every live recipient.
    fn step(&mut self) -> bool {
        let Some(item) = self.order.pop_front() else {
            return false;
        };
        let (event, recipients) = match item {
            Item::View(members) => {
                self.view_id += 1;
                self.current.clone_from(&members);
                let event = Received::Membership(Membership::new(
                    G,
                    self.view_id,
                    Reason::Join,
                    false,
                    true,
                    members.clone(),
                ));
                (event, members)
            }
            Item::Msg {
                from,
                to,
                mess_type,
                payload,
            } => {
                let recipients = if to == G {
                    self.current.clone()
                } else {
                    vec![to.clone()]
                };
                let event = Received::Message(Message {
                    sender: from,
                    service: Service::Agreed,
                    groups: vec![to],
                    mess_type,
                    payload,
                });
                (event, recipients)
            }
        };
        for r in recipients {
            let m = self.members.get_mut(&r).unwrap();
            if m.dead {
                continue;
            }
            assert!(m.st.handle(&mut m.log, event.clone()).is_none());
            while let Some(o) = m.st.poll_send() {
                for to in o.groups {
                    self.order.push_back(Item::Msg {
                        from: r.clone(),
                        to,
                        mess_type: o.mess_type,
                        payload: o.payload.clone(),
                    });
                }
            }
        }
        true
    }

    fn settle(&mut self) {
        while self.step() {}
    }

    fn log(&self, name: &str) -> &Log {
        &self.members[&pg(name)].log
    }

    fn ready(&self, name: &str) -> bool {
        self.members[&pg(name)].st.is_ready()
    }
}

#[test]
fn joiners_during_updates_end_with_the_founders_state() {
    let mut bus = Bus::default();
    bus.join("a");
    for i in 0..5 {
        bus.update("a", i);
    }
    bus.settle();
    assert!(bus.ready("a"));
    // b and c join at once while a keeps updating; b updates as soon as
    // it may (its updates are ordered like any other).
    bus.join("b");
    bus.update("a", 5);
    bus.join("c");
    for i in 6..30 {
        bus.update("a", i);
        if i % 5 == 0 {
            bus.step();
            bus.step();
        }
    }
    bus.update("b", 100);
    bus.settle();
    let want: Vec<u32> = (0..30).chain([100]).collect();
    for n in ["a", "b", "c"] {
        assert!(bus.ready(n), "{n} ready");
        assert_eq!(bus.log(n).entries, want, "{n}");
    }
    // One answer per joiner (a provided both, as the first ready member).
    assert_eq!(bus.members[&pg("a")].st.provided(), 2);
}

#[test]
fn a_provider_gone_before_answering_is_replaced() {
    let mut bus = Bus::default();
    bus.join("a");
    bus.update("a", 1);
    bus.settle();
    bus.join("b");
    bus.settle();
    assert!(bus.ready("b"));
    bus.update("a", 2);
    bus.join("j");
    // Deliver up to j's request at a (the provider), then a crashes
    // before its answer is ordered.
    while !matches!(
        bus.order.front(),
        Some(Item::Msg {
            mess_type: REQUEST,
            ..
        })
    ) {
        assert!(bus.step());
    }
    bus.step();
    bus.order
        .retain(|i| !matches!(i, Item::Msg { from, .. } if *from == pg("a")));
    bus.leave("a");
    bus.update("b", 3);
    bus.settle();
    assert!(bus.ready("j"));
    assert_eq!(bus.log("j").entries, vec![1, 2, 3]);
    assert_eq!(bus.log("b").entries, vec![1, 2, 3]);
    assert_eq!(bus.members[&pg("b")].st.provided(), 1);
}

#[test]
fn the_first_member_founds_and_a_later_lone_member_too() {
    let mut bus = Bus::default();
    bus.join("a");
    bus.settle();
    assert!(bus.ready("a"));
    assert_eq!(bus.members[&pg("a")].st.provided(), 0);
    // Events of other groups are given back.
    let other = Received::Membership(Membership::new(
        "other",
        1,
        Reason::Join,
        false,
        true,
        vec![],
    ));
    let a = bus.members.get_mut(&pg("a")).unwrap();
    assert_eq!(a.st.handle(&mut a.log, other.clone()), Some(other));
}

#[test]
fn replies_round_trip_and_garbage_is_refused() {
    let reply = Reply {
        group: "g",
        nonce: 7,
        ready: vec!["#a#d", "#b#d"],
        snapshot: b"state",
    };
    let bytes = reply.encode();
    // The layout the Python client writes and reads (python/tests/test_state.py).
    let mut want = b"\x00\x01g".to_vec();
    want.extend_from_slice(&7u64.to_be_bytes());
    want.extend_from_slice(&2u16.to_be_bytes());
    want.extend_from_slice(b"\x00\x04#a#d\x00\x04#b#d");
    want.extend_from_slice(b"state");
    assert_eq!(bytes, want);
    let back = Reply::decode(&bytes).unwrap();
    assert_eq!(
        (back.group, back.nonce, back.ready, back.snapshot),
        ("g", 7, vec!["#a#d", "#b#d"], &b"state"[..])
    );
    for cut in 0..11 {
        assert!(Reply::decode(&bytes[..cut]).is_none(), "{cut}");
    }
    assert_eq!(nonce_of(&[0; 7]), None);
    assert_eq!(nonce_of(&[0, 0, 0, 0, 0, 0, 0, 9]), Some(9));
}

/// Seeded runs: members join, update and leave (also while waiting for
/// the state, and while providing it) in random interleavings; at the end
/// every live member holds the state, and all hold the same log.
#[test]
fn random_joins_leaves_and_updates_agree() {
    for seed in 1..200u64 {
        let mut rng = seed;
        let mut next = move |n: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let mut bus = Bus::default();
        bus.join("m0");
        let mut live = vec!["m0".to_string()];
        let mut joined = 1;
        let mut value = 0;
        for _ in 0..300 {
            match next(10) {
                0 if live.len() < 6 => {
                    let name = format!("m{joined}");
                    joined += 1;
                    bus.join(&name);
                    live.push(name);
                }
                // m0 stays, so that someone holds the state.
                1 if live.len() > 1 => {
                    let i = 1 + next(live.len() as u64 - 1) as usize;
                    let name = live.remove(i);
                    bus.leave(&name);
                }
                2..=5 => {
                    let who = &live[next(live.len() as u64) as usize];
                    if bus.ready(who) {
                        bus.update(who, value);
                        value += 1;
                    }
                }
                _ => {
                    for _ in 0..next(4) {
                        bus.step();
                    }
                }
            }
        }
        bus.settle();
        let want = bus.log("m0").entries.clone();
        for name in &live {
            assert!(bus.ready(name), "seed {seed}: {name} not ready");
            assert_eq!(bus.log(name).entries, want, "seed {seed}: {name}");
        }
    }
}
