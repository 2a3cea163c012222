//! Hand-built histories: each violation kind raised alone, and correct
//! histories (joins and leaves, several groups, transitional views) clean.

use super::*;
use Service::*;

fn s(c: &str, seq: u64, svc: Service, groups: &[&str]) -> Record {
    Record::send(c, seq, svc, groups)
}
fn d(c: &str, from: &str, seq: u64, svc: Service, groups: &[&str]) -> Record {
    Record::deliver(c, from, seq, svc, groups)
}
fn v(c: &str, g: &str, id: u64, members: &[&str]) -> Record {
    Record::view(c, g, id, members)
}

/// The history raises exactly these kinds.
#[track_caller]
fn expect(records: Vec<Record>, kinds: &[Kind]) -> Report {
    let report = check(records);
    assert_eq!(report.kinds(), kinds, "{report}");
    report
}

fn view_all(g: &str, id: u64, members: &[&str]) -> Vec<Record> {
    members.iter().map(|m| v(m, g, id, members)).collect()
}

#[test]
fn a_correct_history_is_clean() {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Agreed, &["g"]));
    h.push(s("a", 2, Safe, &["g"]));
    h.push(s("b", 1, Fifo, &["g"]));
    h.push(s("c", 1, Unreliable, &["g"]));
    for r in ["a", "b", "c"] {
        h.push(d(r, "a", 1, Agreed, &["g"]));
        h.push(d(r, "b", 1, Fifo, &["g"]));
        h.push(d(r, "a", 2, Safe, &["g"]));
    }
    // The unreliable message reaches only one receiver: allowed.
    h.push(d("b", "c", 1, Unreliable, &["g"]));
    let report = expect(h, &[]);
    assert_eq!(report.summary.clients, 3);
    assert_eq!(report.summary.sends, 4);
    assert_eq!(report.summary.deliveries, 10);
    assert_eq!(report.summary.views, 3);
}

#[test]
fn joins_and_leaves_mid_stream_are_clean() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Agreed, &["g"]));
    h.extend([
        d("a", "a", 1, Agreed, &["g"]),
        d("b", "a", 1, Agreed, &["g"]),
    ]);
    // c joins: it does not get a/1.
    h.extend(view_all("g", 2, &["a", "b", "c"]));
    h.push(s("c", 1, Reliable, &["g"]));
    for r in ["a", "b", "c"] {
        h.push(d(r, "c", 1, Reliable, &["g"]));
    }
    // b leaves and is told (Spread's self-leave); a/2 is after it.
    h.extend(view_all("g", 3, &["a", "c"]));
    h.push(v("b", "g", 3, &["a", "c"]));
    h.push(s("a", 2, Safe, &["g"]));
    h.extend([d("a", "a", 2, Safe, &["g"]), d("c", "a", 2, Safe, &["g"])]);
    // c leaves without being told (its stream just stops).
    h.push(v("a", "g", 4, &["a"]));
    h.push(s("a", 3, Fifo, &["g"]));
    h.push(d("a", "a", 3, Fifo, &["g"]));
    // b crashes: it ends, nothing more is expected of it.
    h.push(Record::ended("b", "daemon crashed"));
    expect(h, &[]);
}

#[test]
fn a_message_to_several_groups_is_clean() {
    // a in g and h, b in g, c in h: one delivery each.
    let mut h = vec![
        v("a", "g", 1, &["a", "b"]),
        v("b", "g", 1, &["a", "b"]),
        v("a", "h", 1, &["a", "c"]),
        v("c", "h", 1, &["a", "c"]),
    ];
    h.push(s("a", 1, Agreed, &["g", "h"]));
    h.push(s("b", 1, Agreed, &["g"]));
    h.extend([
        d("a", "a", 1, Agreed, &["h", "g"]),
        d("a", "b", 1, Agreed, &["g"]),
        d("b", "a", 1, Agreed, &["g", "h"]),
        d("b", "b", 1, Agreed, &["g"]),
        d("c", "a", 1, Agreed, &["g", "h"]),
    ]);
    // Everyone moves on in both groups; the sets between views agree per group.
    h.extend([v("a", "g", 2, &["a", "b"]), v("b", "g", 2, &["a", "b"])]);
    h.extend([v("a", "h", 2, &["a", "c"]), v("c", "h", 2, &["a", "c"])]);
    expect(h, &[]);
}

/// a, b, c in g; c is cut off. a and b go through a transitional view to a
/// regular view of two, c through its own to a view of one (EVS).
fn partition() -> Vec<Record> {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    for r in ["a", "b", "c"] {
        h.push(d(r, "a", 1, Safe, &["g"]));
    }
    h.push(s("a", 2, Safe, &["g"]));
    h.push(s("c", 1, Agreed, &["g"]));
    h.push(v("a", "g", 1, &["a", "b"]).transitional());
    h.push(v("b", "g", 1, &["a", "b"]).transitional());
    h.push(v("c", "g", 2, &["c"]).transitional());
    // a/2 reached a and b only: delivered marked transitional.
    h.push(d("a", "a", 2, Safe, &["g"]).transitional());
    h.push(d("b", "a", 2, Safe, &["g"]).transitional());
    h.push(d("c", "c", 1, Agreed, &["g"]));
    h.extend(view_all("g", 3, &["a", "b"]));
    h.push(v("c", "g", 4, &["c"]));
    h
}

#[test]
fn a_partition_through_transitional_views_is_clean() {
    expect(partition(), &[]);
}

#[test]
fn safe_reaches_no_one_who_ends_before_the_next_view() {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    h.extend([d("a", "a", 1, Safe, &["g"]), d("b", "a", 1, Safe, &["g"])]);
    h.push(Record::ended("c", "connection broke"));
    expect(h, &[]);
}

#[test]
fn not_delivered_and_an_ended_sender_excuse_loss() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.push(s("a", 2, Reliable, &["g"]));
    h.push(Record::not_delivered("a", 1, 2));
    h.push(s("b", 1, Agreed, &["g"]));
    h.push(Record::ended("b", "disconnected"));
    expect(h, &[]);
}

#[test]
fn interleaving_does_not_change_the_report() {
    let h = partition();
    let mut rev: Vec<Record> = Vec::new();
    // Another interleaving: clients' records in reverse client order.
    for c in ["c", "b", "a"] {
        rev.extend(h.iter().filter(|r| r.client() == c).cloned());
    }
    let mut bad = h.clone();
    bad.push(d("c", "b", 9, Fifo, &["g"]));
    let mut bad_rev = rev.clone();
    bad_rev.push(d("c", "b", 9, Fifo, &["g"]));
    assert_eq!(check(h), check(rev));
    assert_eq!(check(bad), check(bad_rev));
}

#[test]
fn malformed() {
    let r = expect(
        vec![
            s("a", 1, Reliable, &["g"]),
            s("a", 1, Reliable, &["g"]),
            Record::ended("a", "bye"),
            s("a", 3, Reliable, &["g"]),
            Record::not_delivered("b", 3, 2),
        ],
        &[Kind::Malformed],
    );
    assert_eq!(r.count(Kind::Malformed), 3, "{r}");
}

#[test]
fn not_sent() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Agreed, &["g"]));
    h.push(d("a", "a", 1, Agreed, &["g"]));
    // Another service than sent.
    h.push(d("b", "a", 1, Fifo, &["g"]));
    // Never sent.
    h.push(d("b", "a", 7, Reliable, &["g"]));
    let r = expect(h, &[Kind::NotSent]);
    assert_eq!(r.count(Kind::NotSent), 2, "{r}");
}

#[test]
fn duplicate() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Unreliable, &["g"]));
    h.push(d("b", "a", 1, Unreliable, &["g"]));
    h.push(d("b", "a", 1, Unreliable, &["g"]));
    expect(h, &[Kind::Duplicate]);
}

#[test]
fn not_member() {
    let mut h = vec![v("a", "g", 1, &["a"])];
    h.push(s("a", 1, Reliable, &["g"]));
    h.push(d("a", "a", 1, Reliable, &["g"]));
    h.push(d("b", "a", 1, Reliable, &["g"]));
    expect(h, &[Kind::NotMember]);
}

#[test]
fn a_client_is_a_member_of_its_private_group() {
    let mut h = vec![v("a", "g", 1, &["a"])];
    h.push(s("a", 1, Fifo, &["b"]));
    h.push(d("b", "a", 1, Fifo, &["b"]));
    expect(h, &[]);
}

#[test]
fn fifo() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.extend([s("a", 1, Fifo, &["g"]), s("a", 2, Fifo, &["g"])]);
    h.extend([d("a", "a", 1, Fifo, &["g"]), d("a", "a", 2, Fifo, &["g"])]);
    h.extend([d("b", "a", 2, Fifo, &["g"]), d("b", "a", 1, Fifo, &["g"])]);
    expect(h, &[Kind::Fifo]);
}

#[test]
fn reliable_messages_have_no_order() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.extend([s("a", 1, Reliable, &["g"]), s("a", 2, Reliable, &["g"])]);
    h.extend([
        d("a", "a", 1, Reliable, &["g"]),
        d("a", "a", 2, Reliable, &["g"]),
    ]);
    h.extend([
        d("b", "a", 2, Reliable, &["g"]),
        d("b", "a", 1, Reliable, &["g"]),
    ]);
    expect(h, &[]);
}

#[test]
fn causal() {
    // b delivers a/1 and then sends b/1; c delivers b/1 before a/1.
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Causal, &["g"]));
    h.extend([
        d("a", "a", 1, Causal, &["g"]),
        d("b", "a", 1, Causal, &["g"]),
    ]);
    h.push(s("b", 1, Causal, &["g"]));
    h.extend([
        d("a", "b", 1, Causal, &["g"]),
        d("b", "b", 1, Causal, &["g"]),
    ]);
    h.extend([
        d("c", "b", 1, Causal, &["g"]),
        d("c", "a", 1, Causal, &["g"]),
    ]);
    let r = expect(h, &[Kind::Causal]);
    assert!(r.violations[&Kind::Causal].1.contains("c[2]"), "{r}");
}

#[test]
fn causal_through_a_third_client() {
    // a/1 -> (b delivers, sends b/1) -> (c delivers b/1, sends c/1); d
    // delivers c/1 before a/1: the dependency is transitive.
    let mut h = view_all("g", 1, &["a", "b", "c", "d"]);
    h.push(s("a", 1, Causal, &["g"]));
    h.push(d("b", "a", 1, Causal, &["g"]));
    h.push(s("b", 1, Causal, &["g"]));
    h.push(d("c", "b", 1, Causal, &["g"]));
    h.push(s("c", 1, Causal, &["g"]));
    h.extend([
        d("d", "c", 1, Causal, &["g"]),
        d("d", "a", 1, Causal, &["g"]),
    ]);
    // Everyone delivers everything (so no loss), in causal order except d.
    h.extend([
        d("a", "a", 1, Causal, &["g"]),
        d("a", "b", 1, Causal, &["g"]),
        d("a", "c", 1, Causal, &["g"]),
    ]);
    h.extend([
        d("b", "b", 1, Causal, &["g"]),
        d("b", "c", 1, Causal, &["g"]),
    ]);
    h.extend([
        d("c", "a", 1, Causal, &["g"]),
        d("c", "c", 1, Causal, &["g"]),
    ]);
    h.push(d("d", "b", 1, Causal, &["g"]));
    let r = expect(h, &[Kind::Causal]);
    // c delivered a/1 after b/1 too, which also depends on it.
    assert_eq!(r.count(Kind::Causal), 3, "{r}");
}

#[test]
fn total_order() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.extend([s("a", 1, Agreed, &["g"]), s("b", 1, Safe, &["g"])]);
    h.extend([d("a", "a", 1, Agreed, &["g"]), d("a", "b", 1, Safe, &["g"])]);
    h.extend([d("b", "b", 1, Safe, &["g"]), d("b", "a", 1, Agreed, &["g"])]);
    let r = expect(h, &[Kind::TotalOrder]);
    assert_eq!(r.count(Kind::TotalOrder), 1);
    let e = &r.violations[&Kind::TotalOrder].1;
    assert!(
        e.contains("a delivered") && e.contains("b delivered"),
        "{e}"
    );
}

#[test]
fn total_order_across_groups_and_three_receivers() {
    // A three-cycle no two receivers show alone: x<y at a, y<z at b, z<x at c.
    let mut h = vec![];
    for r in ["a", "b", "c"] {
        h.push(v(r, "g", 1, &["a", "b", "c"]));
        h.push(v(r, "h", 1, &["a", "b", "c"]));
    }
    h.extend([
        s("a", 1, Agreed, &["g"]),
        s("b", 1, Agreed, &["h"]),
        s("c", 1, Agreed, &["g"]),
    ]);
    let (x, y, z) = (("a", &["g"]), ("b", &["h"]), ("c", &["g"]));
    for (r, first, second, third) in [("a", x, y, z), ("b", y, z, x), ("c", z, x, y)] {
        for (from, g) in [first, second, third] {
            h.push(d(r, from, 1, Agreed, g));
        }
    }
    let r = expect(h, &[Kind::TotalOrder]);
    assert_eq!(r.count(Kind::TotalOrder), 1, "{r}");
}

#[test]
fn safe() {
    // c never ends and stays in view 1 but never delivers a/1; the sender
    // ended, so this is not a silent loss, but safe promised it to all.
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    h.extend([d("a", "a", 1, Safe, &["g"]), d("b", "a", 1, Safe, &["g"])]);
    h.push(Record::ended("a", "daemon crashed"));
    expect(h, &[Kind::Safe]);
}

#[test]
fn safe_in_a_transitional_view_promises_less() {
    // Delivered in the transitional view of a and b: c, in the regular
    // view before it but not in the transitional one, is owed nothing.
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    h.extend(
        view_all("g", 1, &["a", "b"])
            .into_iter()
            .map(Record::transitional),
    );
    h.push(d("a", "a", 1, Safe, &["g"]).transitional());
    h.push(d("b", "a", 1, Safe, &["g"]).transitional());
    h.push(Record::ended("a", "daemon crashed"));
    expect(h, &[]);
}

#[test]
fn safe_in_a_transitional_view_binds_its_members() {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    h.extend(
        view_all("g", 1, &["a", "b"])
            .into_iter()
            .map(Record::transitional),
    );
    h.push(d("a", "a", 1, Safe, &["g"]).transitional());
    h.push(Record::ended("a", "daemon crashed"));
    let r = expect(h, &[Kind::Safe]);
    assert!(r.violations[&Kind::Safe].1.contains("member b"), "{r}");
}

#[test]
fn own_delivery() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.push(d("b", "a", 1, Reliable, &["g"]));
    expect(h, &[Kind::OwnDelivery]);
}

#[test]
fn virtual_synchrony() {
    // c leaves after view 1 (and is told), so nothing more is owed to it
    // after; but it moved from view 1 to view 2 with a and b and missed a/1.
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.extend([
        d("a", "a", 1, Reliable, &["g"]),
        d("b", "a", 1, Reliable, &["g"]),
    ]);
    h.extend(view_all("g", 2, &["a", "b"]));
    h.push(v("c", "g", 2, &["a", "b"]));
    let r = expect(h, &[Kind::VirtualSynchrony]);
    assert!(
        r.violations[&Kind::VirtualSynchrony].1.contains("a/1"),
        "{r}"
    );
}

#[test]
fn virtual_synchrony_per_group_with_a_message_to_two() {
    // a/1 goes to g and h; b (in g) delivers it, c (in g and h) does not;
    // c's h-peer a did. Both groups' segments disagree.
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.extend(view_all("h", 1, &["a", "c"]));
    h.push(s("a", 1, Reliable, &["g", "h"]));
    h.extend([
        d("a", "a", 1, Reliable, &["g", "h"]),
        d("b", "a", 1, Reliable, &["g", "h"]),
    ]);
    h.extend(view_all("g", 2, &["a", "b"]));
    h.push(v("c", "g", 2, &["a", "b"]));
    h.extend(view_all("h", 2, &["a"]));
    h.push(v("c", "h", 2, &["a"]));
    let r = expect(h, &[Kind::VirtualSynchrony]);
    assert_eq!(r.count(Kind::VirtualSynchrony), 2, "{r}");
}

#[test]
fn view_membership() {
    expect(
        vec![
            v("a", "g", 1, &["a", "b"]),
            v("b", "g", 1, &["b", "a", "c"]),
        ],
        &[Kind::ViewMembership],
    );
}

#[test]
fn a_view_named_two_ways_is_reported_once_and_judged_as_each_client_saw_it() {
    // Two clusters that cannot hear each other reuse one view id: each
    // client is a member of the view it saw, so nothing else cascades.
    let mut h = vec![v("a", "g", 1, &["a", "b"]), v("b", "g", 1, &["a", "b"])];
    h.push(v("c", "g", 1, &["c"]));
    h.push(s("c", 1, Agreed, &["g"]));
    h.push(d("c", "c", 1, Agreed, &["g"]));
    let r = expect(h, &[Kind::ViewMembership]);
    assert_eq!(r.count(Kind::ViewMembership), 1, "{r}");
}

#[test]
fn view_order() {
    expect(
        vec![v("a", "g", 2, &["a"]), v("a", "g", 1, &["a"])],
        &[Kind::ViewOrder],
    );
}

#[test]
fn transitional() {
    // A transitional view with a member the regular view before it lacked.
    expect(
        vec![
            v("a", "g", 1, &["a", "b"]),
            v("a", "g", 1, &["a", "c"]).transitional(),
        ],
        &[Kind::Transitional],
    );
    // A delivery marked transitional in a regular view.
    let mut h = vec![v("a", "g", 1, &["a"]), s("a", 1, Safe, &["g"])];
    h.push(d("a", "a", 1, Safe, &["g"]).transitional());
    expect(h, &[Kind::Transitional]);
    // A regular view dropping a member of the transitional view before it.
    expect(
        vec![
            v("a", "g", 1, &["a", "b", "c"]),
            v("a", "g", 1, &["a", "b"]).transitional(),
            v("a", "g", 2, &["a"]),
        ],
        &[Kind::Transitional],
    );
}

/// a and b were cut off from c; b left the group meanwhile. Each goes
/// through its own transitional view, gets there what the old view still
/// held for it (a's message, which c never saw), and b then hears that it
/// left: a view without itself, which may follow a transitional view.
#[test]
fn a_client_may_leave_right_after_its_transitional_view() {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Safe, &["g"]));
    h.push(v("a", "g", 2, &["a"]).transitional());
    h.push(v("b", "g", 3, &["b"]).transitional());
    h.push(d("a", "a", 1, Safe, &["g"]));
    h.push(d("b", "a", 1, Safe, &["g"]));
    h.push(v("c", "g", 4, &["c"]));
    h.extend(view_all("g", 5, &["a", "c"]));
    h.push(v("b", "g", 5, &["a", "c"]));
    expect(h, &[]);
}

#[test]
fn silent_loss() {
    let mut h = view_all("g", 1, &["a", "b", "c"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.extend([
        d("a", "a", 1, Reliable, &["g"]),
        d("b", "a", 1, Reliable, &["g"]),
    ]);
    let r = expect(h, &[Kind::SilentLoss]);
    assert!(
        r.violations[&Kind::SilentLoss].1.contains("c installed"),
        "{r}"
    );
}

#[test]
fn no_loss_is_claimed_for_one_who_joined_after_the_send() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.extend([
        d("a", "a", 1, Reliable, &["g"]),
        d("b", "a", 1, Reliable, &["g"]),
    ]);
    h.extend(view_all("g", 2, &["a", "b", "c"]));
    expect(h, &[]);
}

#[test]
fn jsonl_round_trip_and_errors() {
    let h = partition();
    let text: String = h.iter().map(|r| r.to_json() + "\n").collect();
    assert!(text.contains(r#""type":"deliver""#), "{text}");
    let back = read_jsonl(std::io::Cursor::new(format!("{text}\n"))).unwrap();
    assert_eq!(back, h);
    // Optional fields may be left out.
    let one = r#"{"type":"view","client":"a","group":"g","view_id":3,"members":["a"],"quorum":true,"at_ns":5}"#;
    let r = read_jsonl(std::io::Cursor::new(one)).unwrap();
    assert!(matches!(
        &r[0],
        Record::View {
            transitional: false,
            quorum: Some(true),
            at_ns: Some(5),
            ..
        }
    ));
    let err = read_jsonl(std::io::Cursor::new(format!(
        "{one}\n{{\"type\":\"bogus\"}}\n"
    )))
    .unwrap_err();
    assert!(matches!(err, ReadError::Json { line: 2, .. }), "{err}");
}

#[test]
fn the_report_prints_counts_and_examples() {
    let mut h = view_all("g", 1, &["a", "b"]);
    h.push(s("a", 1, Reliable, &["g"]));
    h.push(d("b", "a", 1, Reliable, &["g"]));
    h.push(d("b", "a", 1, Reliable, &["g"]));
    let text = check(h).to_string();
    assert!(text.contains("VIOLATIONS: 2 of 2 kinds"), "{text}");
    assert!(
        text.contains("duplicate: 1") && text.contains("own-delivery: 1"),
        "{text}"
    );
}
