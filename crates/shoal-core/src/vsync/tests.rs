//! Unit tests of the vsync engine, and the multi-seed guarantee tests
//! (`guarantees.rs` checker) in virtual time.

use std::time::Duration;

use super::harness::{Sim, MS};
use super::*;
use crate::time::Instant;

mod checker;

pub(super) fn fast_config(k: u32) -> Config {
    Config {
        committee_size: std::num::NonZeroU32::new(k).unwrap(),
        view_period: Duration::from_secs(3),
        ack_wait: Duration::from_millis(300),
        ack_defer_max: Duration::from_millis(60),
        ack_retry_after: Duration::from_millis(100),
        ack_retries: 2,
        committee_timeout: Duration::from_millis(300),
        committee_heartbeat: Duration::from_millis(30),
        ..Config::default()
    }
}

pub(super) fn group(n: usize, total: usize, seed: u64, config: &Config) -> Sim<Vsync> {
    let mut sim = Sim::new(total, seed);
    let members: Vec<NodeId> = (0..n as u32).map(NodeId).collect();
    for i in 0..n {
        let engine = Vsync::new(
            members[i],
            &members,
            config.clone(),
            seed * 1000 + i as u64,
            Instant::ZERO,
        )
        .unwrap();
        sim.start(i, engine);
    }
    sim.check = Some(|e: &Vsync| e.check_invariants());
    sim
}

fn deliveries(sim: &Sim<Vsync>, i: usize) -> Vec<(u64, NodeId, u64)> {
    sim.events[i]
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Deliver {
                sender,
                local_id,
                gseq,
                ..
            } => Some((*gseq, *sender, *local_id)),
            _ => None,
        })
        .collect()
}

#[test]
fn messages_are_delivered_everywhere_in_one_order() {
    let config = fast_config(1);
    let mut sim = group(4, 4, 1, &config);
    for round in 0..10u8 {
        for i in 0..4 {
            sim.multicast(i, &[i as u8, round]).unwrap();
        }
        sim.run_until(sim.now_ms() + 5);
    }
    sim.run_until(2_000);
    let first = deliveries(&sim, 0);
    assert_eq!(first.len(), 40);
    for i in 1..4 {
        assert_eq!(deliveries(&sim, i), first, "member {i}");
    }
    let gseqs: Vec<u64> = first.iter().map(|d| d.0).collect();
    assert_eq!(gseqs, (0..40).collect::<Vec<_>>());
}

/// Records the committee holds for a steady stream in a view that does not
/// change: with progress reports, only what some member has not yet
/// delivered; without (P000's rule), everything since the last view change.
#[test]
fn progress_reports_let_the_committee_collect_between_view_changes() {
    let held_after_stream = |progress_interval: Duration| {
        let config = Config {
            view_period: Duration::from_secs(60),
            progress_interval,
            ..fast_config(2)
        };
        let mut sim = group(4, 4, 3, &config);
        sim.loss = 0.02;
        let mut sent = 0;
        for _ in 0..400 {
            for i in 0..4 {
                if sim.multicast(i, &[i as u8]).is_ok() {
                    sent += 1;
                }
            }
            sim.run_until(sim.now_ms() + 5);
        }
        sim.run_until(sim.now_ms() + 1_000);
        for i in 0..4 {
            assert_eq!(deliveries(&sim, i).len(), sent, "member {i}");
        }
        let held: Vec<usize> = (0..2)
            .map(|i| sim.node(i).committee.as_ref().unwrap().store.len())
            .collect();
        (sent, held)
    };
    let (sent, held) = held_after_stream(Duration::ZERO);
    assert!(sent > 1_000, "{sent}");
    for h in held {
        assert!(h >= sent, "without reports the store keeps all {sent}: {h}");
    }
    let (sent, held) = held_after_stream(Duration::from_millis(50));
    for h in held {
        assert!(h < sent / 10, "{h} of {sent} records still held");
    }
}

/// Collection between view changes (`progress_interval`, which the daemon
/// uses) on seeds 3-5, 9-11, ...; P000's collection at view changes alone on
/// the others (every k either way). `VSYNC_PROGRESS=on` or `off` forces
/// one rule for every seed (to tell a fault of collection from a schedule
/// that merely changed with it).
fn progress_on_half_the_seeds(config: Config, seed: u64) -> Config {
    let on = forced("VSYNC_PROGRESS").unwrap_or((seed / 3) % 2 == 1);
    delivery_on_half_the_seeds(with_progress(config, on), seed)
}

/// A setting forced for every seed by an environment variable (`on` or
/// `off`), or `None`.
fn forced(var: &str) -> Option<bool> {
    match std::env::var(var).ok().as_deref() {
        Some("on") => Some(true),
        Some("off") => Some(false),
        _ => None,
    }
}

/// Committee members deliver from their stores (`committee_delivery`, which
/// the daemon uses) on seeds 6-11, 18-23, ...; the paper's path on the
/// others. `VSYNC_COMMITTEE_DELIVERY=on` or `off` forces one for every seed.
fn delivery_on_half_the_seeds(config: Config, seed: u64) -> Config {
    let committee_delivery = forced("VSYNC_COMMITTEE_DELIVERY").unwrap_or((seed / 6) % 2 == 1);
    Config {
        committee_delivery,
        ..config
    }
}

/// `config` with collection between views (every 50 ms) or without.
fn with_progress(config: Config, on: bool) -> Config {
    let progress_interval = if on {
        Duration::from_millis(50)
    } else {
        Duration::ZERO
    };
    Config {
        progress_interval,
        ..config
    }
}

/// One chaotic run: loss, jitter, sleeping members, a crash (the primary's,
/// on some seeds with k > 1), two joins and a leave, then a quiet phase.
fn chaos(seed: u64) -> Result<(), String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let k = 1 + (seed % 3) as u32;
    let (n, total) = (7usize, 9usize);
    let config = progress_on_half_the_seeds(fast_config(k), seed);
    let mut sim = group(n, total, seed, &config);
    sim.loss = rng.random_range(0.0..0.05);
    sim.jitter = MS / 2;
    let mut sent = vec![Vec::new(); total];
    let crash_primary = k > 1 && seed.is_multiple_of(2);
    let crash_at = rng.random_range(100..600u64) * 10;
    let crash_victim = if crash_primary {
        0
    } else {
        rng.random_range(k as usize..n)
    };
    let sleeps: Vec<(u64, usize, u64)> = (0..3)
        .map(|_| {
            (
                rng.random_range(500..8_000),
                rng.random_range(k as usize..n),
                rng.random_range(50..1_500),
            )
        })
        .collect();
    let joins = [
        (rng.random_range(500..5_000u64), 7usize),
        (rng.random_range(3_000..8_000), 8),
    ];
    let leave = (
        rng.random_range(2_000..7_000u64),
        rng.random_range(k as usize..n),
    );
    let mut counter = 0u32;
    for t in (0..10_000u64).step_by(10) {
        sim.run_until(t);
        if t == crash_at {
            sim.crash(crash_victim);
        }
        for &(at, who, len) in &sleeps {
            if t == at - at % 10 {
                sim.sleep(who, t + len);
            }
        }
        for &(at, j) in &joins {
            if t == at - at % 10 {
                let contacts: Vec<NodeId> = (0..k).map(NodeId).collect();
                let e = Vsync::joining(
                    NodeId(j as u32),
                    &contacts,
                    config.clone(),
                    seed * 1000 + j as u64,
                    sim.now(),
                )
                .unwrap();
                sim.start(j, e);
            }
        }
        if t == leave.0 - leave.0 % 10 && sim.alive(leave.1) {
            sim.with(leave.1, |e, now| e.leave(now));
        }
        multicast_from_two(&mut sim, &mut rng, &mut counter, &mut sent);
    }
    quiet_end(&mut sim, &sent);
    checker::check(&sim, &sent).map_err(|e| format!("seed {seed} (k={k}): {e}"))
}

/// Two random members (of all started or not) multicast, if alive and awake.
fn multicast_from_two(
    sim: &mut Sim<Vsync>,
    rng: &mut rand_xoshiro::Xoshiro256PlusPlus,
    counter: &mut u32,
    sent: &mut [Vec<u64>],
) {
    use rand::Rng;
    for _ in 0..2 {
        let i = rng.random_range(0..sent.len());
        if sim.alive(i) && !sim.asleep(i) {
            *counter += 1;
            if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                sent[i].push(id);
            }
        }
    }
}

/// The end of a chaotic run: no more loss, run to 22 s, and on while a view
/// change is under way (seed 241 with `committee_delivery`: view 8 was
/// decided 2 ms before 22 s).
fn quiet_end(sim: &mut Sim<Vsync>, sent: &[Vec<u64>]) {
    sim.loss = 0.0;
    sim.run_until(22_000);
    settle(sim, 22_000);
    if std::env::var("VSYNC_DEBUG").is_ok() {
        debug_dump(sim, sent);
    }
}

/// Every member's views, committee state and counters (`VSYNC_DEBUG=1`).
fn debug_dump(sim: &Sim<Vsync>, sent: &[Vec<u64>]) {
    for (i, sent_i) in sent.iter().enumerate() {
        let Some(e) = sim.nodes[i].as_ref() else {
            continue;
        };
        let views: Vec<String> = sim.events[i]
            .iter()
            .filter_map(|(t, ev)| match ev {
                Event::View(v) => Some(format!(
                    "{}@{}ms:{:?}{:?}",
                    v.id,
                    t / MS,
                    v.members.iter().map(|m| m.0).collect::<Vec<_>>(),
                    v.reason
                )),
                Event::Removed { view, reason } => Some(format!("REMOVED {view} {reason:?}")),
                _ => None,
            })
            .collect();
        if let Some(c) = e.committee.as_ref() {
            let role = match &c.role {
                super::committee::Role::Primary(p) => format!(
                    "PRIMARY next_gseq={} vc={:?} backups={:?} joins={:?} next_view_at={:?} change_at={:?}",
                    p.next_gseq,
                    p.vc.as_ref().map(|v| {
                        let acks: Vec<u32> = v.acks.keys().map(|n| n.0).collect();
                        let reports: Vec<(u32, u64, u64)> = v
                            .reports
                            .iter()
                            .map(|(n, r)| (n.0, r.epoch, r.newview.view))
                            .collect();
                        let accepts: Vec<u32> = v.accepts.iter().map(|n| n.0).collect();
                        format!(
                            "(view {} decided {} deadline {:?} acks {acks:?} reports {reports:?} accepting {} accepts {accepts:?} outranked {:?} fence {:?})",
                            v.view, v.decided, v.deadline, v.accepting, v.outranked, p.fence
                        )
                    }),
                    p.backups.iter().map(|(k, r)| (k.0, r.acked, r.sent)).collect::<Vec<_>>(),
                    p.joins,
                    p.next_view_at,
                    p.change_at
                ),
                super::committee::Role::Backup(b) => format!("backup confirmed={}", b.confirmed),
            };
            eprintln!(
                "n{i} committee epoch={} list={:?} base={} committed={} store={:?} {role}",
                c.epoch,
                c.list,
                c.base,
                c.committed,
                (
                    c.store.keys().next(),
                    c.store.keys().next_back(),
                    c.store.len()
                )
            );
        }
        eprintln!(
            "n{i} alive={} next={} pending={:?} committed_known={} view={} committee={:?} status={:?} sent={} stats={:?}\n   {}",
            sim.alive(i),
            e.next_gseq(),
            (e.member.pending.keys().next(), e.member.pending.len()),
            e.member.committed_known,
            e.view.id,
            e.view.committee,
            e.status,
            sent_i.len(),
            e.stats(),
            views.join(" ")
        );
    }
}

/// A chaotic run with a network cut: loss, jitter, one backup asleep on
/// some seeds, and for 0.2–1.5 s one to three members (committee members
/// included) cut off from the rest, so that live members are falsely
/// suspected (docs/vsync.md, failure assumptions). The minority side must
/// not decide views or deliver messages the majority side does not, and
/// once the cut heals every member ends in the majority's view or is told
/// it was removed.
fn partition_chaos(seed: u64, k: u32, order: checker::Order) -> Result<(), String> {
    let config = progress_on_half_the_seeds(fast_config(k), seed);
    cut_run(seed, &config, order)
}

/// `partition_chaos` with the settings given.
fn cut_run(seed: u64, config: &Config, order: checker::Order) -> Result<(), String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x05EE_DCA7);
    let n = 7usize;
    let k = config.committee_size.get();
    let mut sim = group(n, n, seed, config);
    sim.loss = rng.random_range(0.0..0.03);
    sim.jitter = MS / 2;
    let cut_at = rng.random_range(100..600u64) * 10;
    let cut_len = rng.random_range(20..150u64) * 10;
    let mut minority = [false; 7];
    for _ in 0..rng.random_range(1..=3) {
        minority[rng.random_range(0..n)] = true;
    }
    let sleep = (k > 1 && rng.random_bool(0.5)).then(|| {
        (
            rng.random_range(100..600u64) * 10,
            rng.random_range(1..k as usize),
            rng.random_range(50..1_000u64),
        )
    });
    sim.drop_if = Some(Box::new(move |now, from, to, _| {
        (cut_at * MS..(cut_at + cut_len) * MS).contains(&now) && minority[from] != minority[to]
    }));
    let mut sent = vec![Vec::new(); n];
    let mut counter = 0u32;
    for t in (0..8_000u64).step_by(10) {
        sim.run_until(t);
        if let Some((at, who, len)) = sleep {
            if t == at {
                sim.sleep(who, t + len);
            }
        }
        for _ in 0..2 {
            let i = rng.random_range(0..n);
            if sim.alive(i) && !sim.asleep(i) {
                counter += 1;
                if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                    sent[i].push(id);
                }
            }
        }
    }
    sim.loss = 0.0;
    sim.run_until(25_000);
    settle(&mut sim, 25_000);
    if std::env::var("VSYNC_DEBUG").is_ok() {
        debug_dump(&sim, &sent);
    }
    checker::check_with(&sim, &sent, order).map_err(|e| {
        format!("partition seed {seed} (k={k}, cut {cut_at}+{cut_len} ms {minority:?}, sleep {sleep:?}): {e}")
    })
}

/// The runs end at a fixed time, and a periodic view change may be under
/// way then (cut seed 2313: view 8 had reached two of five members at
/// 25 s). Runs on, 100 ms at a time for at most 2 s (twice the view
/// change's ack wait), while the members that were not removed are in
/// different views; a group that is stuck stays stuck and fails the check.
fn settle(sim: &mut Sim<Vsync>, mut t: u64) {
    for _ in 0..20 {
        let views: std::collections::BTreeSet<u64> = (0..sim.nodes.len())
            .filter(|&i| sim.alive(i))
            .filter(|&i| {
                !sim.events[i]
                    .iter()
                    .any(|(_, e)| matches!(e, Event::Removed { .. }))
            })
            .filter_map(|i| sim.nodes[i].as_ref().map(Vsync::view_id))
            .collect();
        if views.len() <= 1 {
            return;
        }
        t += 100;
        sim.run_until(t);
    }
}

/// Runs `partition_chaos` over seeds for committee sizes `ks`.
/// `VSYNC_CUT_ONLY=S` runs seed S alone (with `VSYNC_DEBUG=1`, its dump).
fn cut_failures(seeds: u64, ks: &[u32], order: checker::Order) -> Vec<String> {
    let only: Option<u64> = std::env::var("VSYNC_CUT_ONLY")
        .ok()
        .map(|s| s.parse().unwrap());
    (0..seeds)
        .filter(|seed| only.is_none_or(|o| o == *seed))
        .flat_map(|seed| {
            ks.iter()
                .map(move |&k| partition_chaos(seed, k, order).err())
        })
        .flatten()
        .collect()
}

/// k = 1 under network cuts: one sequencer, no takeover.
#[test]
fn guarantees_hold_across_network_cuts() {
    let seeds = std::env::var("VSYNC_CUT_SEEDS").map_or(100, |s| s.parse().unwrap());
    let failures = cut_failures(seeds, &[1], checker::Order::Uniform);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// k = 2, 3 under cuts: a backup takes over across the cut while the live
/// primary drops it, and both propose the next view. Until Newviews were
/// chosen by a majority (docs/vsync.md) this broke agreement: 7 of 600 runs
/// at 300 seeds gave one gseq to two messages, delivered a message twice or
/// let movers from V to V+1 deliver different messages. Checked for issue
/// 4's guarantees (`Order::NonUniform`: a member that ends removed may have
/// delivered, in its last view, what the group did not). The long run:
/// `VSYNC_CUT_SEEDS=1000 cargo test --release -p shoal-core guarantees_hold_across_network_cuts_k2_k3`.
#[test]
fn guarantees_hold_across_network_cuts_k2_k3() {
    let seeds = std::env::var("VSYNC_CUT_SEEDS").map_or(100, |s| s.parse().unwrap());
    // `VSYNC_UNIFORM=1`: the stronger check (removed members too).
    let order = match std::env::var("VSYNC_UNIFORM") {
        Ok(_) => checker::Order::Uniform,
        Err(_) => checker::Order::NonUniform,
    };
    let failures = cut_failures(seeds, &[2, 3], order);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn chaos_single_seed() {
    if let Ok(seed) = std::env::var("VSYNC_SEED") {
        chaos(seed.parse().unwrap()).unwrap();
    }
    chaos(1).unwrap();
    chaos(2).unwrap();
}

/// One cut seed: `VSYNC_CUT_SEED=153 VSYNC_K=2` (with `VSYNC_DEBUG=1` for
/// the dump); the daemons' guarantees (`Order::NonUniform`).
#[test]
fn cut_single_seed() {
    if let Ok(seed) = std::env::var("VSYNC_CUT_SEED") {
        let k = std::env::var("VSYNC_K").map_or(1, |k| k.parse().unwrap());
        partition_chaos(seed.parse().unwrap(), k, checker::Order::NonUniform).unwrap();
    }
}

/// Cut seeds (k = 3) where a primary the majority had removed, its epoch
/// grown while it dropped the backups it could not reach, recruited a
/// backup of the real committee with its heartbeats once the cut healed;
/// the two committees then sequenced the same gseqs. Members now ignore
/// heartbeats from a primary outside their view. Each failed before
/// (seed 31 with collection between views, 142 and 239 without; all three
/// non-uniform violations: one gseq given to two messages, or a message
/// delivered twice).
#[test]
fn a_primary_removed_by_the_view_cannot_recruit_its_backups() {
    for (seed, progress) in [(31, true), (142, false), (239, false)] {
        let config = with_progress(fast_config(3), progress);
        cut_run(seed, &config, checker::Order::NonUniform).unwrap();
    }
}

/// Seeds that once failed, each for a bug now fixed (docs/vsync.md, "Bugs"):
/// 232, a decided Newview never committed after the primary dropped its
/// last silent backup; 262, a backup re-admitted with an empty store never
/// got back the records it once acknowledged; 1498, a backup dropped while
/// asleep took over alone and formed a second primary component; 152
/// (k = 3), the same split after a lost drop notice. Since the pbcast changes
/// of b00b5f0 the chaos schedule of 152 no longer reaches that state, so the
/// `seed_152_*` tests above replay it deterministically.
#[test]
fn regression_seeds() {
    for seed in [152, 232, 262, 1498] {
        chaos(seed).unwrap();
    }
}

/// Cut seeds that broke agreement or liveness with k = 2, 3 at some point,
/// replayed under both collection rules (the default test runs seeds below
/// 100 only). Before Newviews were chosen by a majority, 134 (k = 3, a
/// message delivered twice), 153 (k = 2, two Newviews for view 1 installed
/// by four members), 211 and 262 (movers from V to V+1 with different
/// deliveries) and 239 (two survivors at odds on a gseq) failed; 670, 674
/// and 818 are liveness failures met while building the fix (a rival
/// primary that yielded to an epoch whose owner then abandoned; collection
/// past a member kept without an ack), and 1282, 2445 and 2700 liveness
/// failures of the 3000-seed run (stale proposers that never learned the
/// group had moved on).
#[test]
fn cut_regression_seeds() {
    let mut failures = Vec::new();
    for seed in [
        134, 142, 149, 153, 211, 239, 262, 670, 674, 818, 1282, 2445, 2700,
    ] {
        for k in [2, 3] {
            for progress in [false, true] {
                let config = with_progress(fast_config(k), progress);
                if let Err(e) = cut_run(seed, &config, checker::Order::NonUniform) {
                    failures.push(format!("{e} (progress {progress})"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// True for a committee heartbeat that no longer lists `victim`: the notice
/// a primary sends a backup it dropped.
fn is_drop_notice(bytes: &[u8], victim: usize) -> bool {
    shoal_wire::packets(bytes).any(|p| match p {
        Ok((_, shoal_wire::Packet::Vsync { body })) => matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::Heartbeat(hb)) if !hb.committee.contains(&(victim as u32))
        ),
        _ => false,
    })
}

/// Chaos seed 152 (k = 3), replayed on purpose. The failure: a backup slept
/// longer than `committee_timeout`; the primary dropped it and sent it the
/// one drop notice, which was lost. On waking the backup first read the
/// heartbeats queued before the drop (they reset its silence timer, so the
/// "my own timer fired late" guard never engaged); then the primary, which
/// had dropped it, sent it nothing more. One takeover timeout later it took
/// over alone, formed a view of its own and gave gseqs already used by the
/// real primary to its own messages (docs/vsync.md, "Bugs").
///
/// `drops` notices are lost: 1 is seed 152's loss (the primary repeats the
/// notice when the dropped backup acknowledges an old epoch); `usize::MAX`
/// loses them all, leaving only the primary-partition quorum to stop it.
fn lost_drop_notice(drops: usize) -> Result<(Sim<Vsync>, usize), String> {
    use std::cell::Cell;
    use std::rc::Rc;
    let config = fast_config(3);
    let (n, victim) = (6usize, 2usize);
    let mut sim = group(n, n, 152, &config);
    let lost = Rc::new(Cell::new(0usize));
    let counted = lost.clone();
    sim.drop_if = Some(Box::new(move |_, from, to, bytes| {
        let drop =
            from == 0 && to == victim && counted.get() < drops && is_drop_notice(bytes, victim);
        counted.set(counted.get() + usize::from(drop));
        drop
    }));
    let mut sent = vec![Vec::new(); n];
    let mut counter = 0u32;
    for t in (0..6_000u64).step_by(10) {
        sim.run_until(t);
        if t == 1_000 {
            // Three committee timeouts: long enough to be dropped.
            sim.sleep(victim, 1_900);
        }
        for i in [victim, 3, 4, 5] {
            if sim.alive(i) && !sim.asleep(i) {
                counter += 1;
                if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                    sent[i].push(id);
                }
            }
        }
    }
    sim.run_until(12_000);
    checker::check(&sim, &sent)?;
    let lost = lost.get();
    Ok((sim, lost))
}

/// Whether member `i` was told it is out of the group.
fn removed(sim: &Sim<Vsync>, i: usize) -> bool {
    sim.events[i]
        .iter()
        .any(|(_, e)| matches!(e, Event::Removed { .. }))
}

#[test]
fn seed_152_dropped_backup_with_a_lost_drop_notice_stays_out() {
    let (sim, lost) = lost_drop_notice(1).unwrap();
    assert_eq!(lost, 1, "the scenario lost no drop notice");
    let victim = sim.nodes[2].as_ref().unwrap();
    assert_eq!(victim.stats().takeovers, 0, "the dropped backup took over");
    assert!(removed(&sim, 2), "the dropped backup was never removed");
}

#[test]
fn seed_152_dropped_backup_never_told_cannot_form_a_second_primary() {
    let (sim, lost) = lost_drop_notice(usize::MAX).unwrap();
    assert!(lost >= 2, "the primary repeated its drop notice");
    let victim = sim.nodes[2].as_ref().unwrap();
    // It takes over (it hears nothing), but with no majority of the view
    // behind it decides no view of its own; the real Newview removes it.
    assert_eq!(victim.stats().takeovers, 1);
    let own_view = sim.events[2]
        .iter()
        .any(|(_, e)| matches!(e, Event::View(v) if !v.members.contains(&NodeId(0))));
    assert!(!own_view, "the dropped backup formed a view of its own");
    assert!(removed(&sim, 2), "the dropped backup was never removed");
}

/// Two majorities overlapping in members that acknowledged two primaries'
/// Prefreshviews for the same view (the hazard docs/vsync.md names after
/// seed 152). n2, a backup, sleeps and is dropped; it hears nothing from the
/// primary's side again. The primary's Prefreshview for V+1 is acknowledged
/// by everyone awake; then {0, 1} and {2, 3, 4, 5} are cut apart before the
/// Newview reaches {3, 4, 5}. n2 wakes, takes over and proposes V+1 too:
/// {3, 4, 5} must not acknowledge it, or n2 holds a majority of V's six
/// members and both sides decide V+1. The cut heals at 4 s.
#[test]
fn a_dropped_backup_cannot_win_acks_for_a_view_the_primary_proposed() {
    let (takeovers, result) = dropped_backup_during_a_cut(7);
    assert_eq!(takeovers, 1);
    result.unwrap();
}

fn dropped_backup_during_a_cut(seed: u64) -> (u64, Result<(), String>) {
    let config = fast_config(3);
    let n = 6usize;
    let mut sim = group(n, n, seed, &config);
    let side = |i: usize| i < 2;
    sim.drop_if = Some(Box::new(move |now, from, to, _| {
        let cut = (1_450 * MS..4_000 * MS).contains(&now) && side(from) != side(to);
        let to_sleeper = (1_000 * MS..4_000 * MS).contains(&now) && side(from) && to == 2;
        cut || to_sleeper
    }));
    let mut sent = vec![Vec::new(); n];
    let mut counter = 0u32;
    for t in (0..6_000u64).step_by(10) {
        sim.run_until(t);
        if t == 1_000 {
            sim.sleep(2, 1_900);
        }
        for (i, sent_i) in sent.iter_mut().enumerate() {
            if sim.alive(i) && !sim.asleep(i) {
                counter += 1;
                if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                    sent_i.push(id);
                }
            }
        }
    }
    sim.run_until(15_000);
    let sleeper = sim.nodes[2].as_ref().unwrap().stats().clone();
    (sleeper.takeovers, checker::check(&sim, &sent))
}

/// The scenario above with other seeds: the group converges once the cut
/// heals. Members 0 and 1 install V1 (committee [0, 1, 3]) during the cut;
/// 3, 4 and 5 never learn it. Until 2026-11-23 both 0 and 1 gave up the
/// primary role after three view changes without a majority, so no committee
/// member of V1 was left to answer repairs or change the view: 55 of 60
/// seeds never converged (seed 7, the test above, was one of the few that
/// did). A primary now keeps asking (`retry_without_quorum`).
#[test]
fn a_cut_during_a_view_change_converges_for_every_seed() {
    let wedged: Vec<u64> = (0..20)
        .filter(|seed| dropped_backup_during_a_cut(*seed).1.is_err())
        .collect();
    assert!(wedged.is_empty(), "seeds that never converge: {wedged:?}");
}

/// True for a primary's replica of the Newview for `view`.
fn is_newview_replica(bytes: &[u8], view: u64) -> bool {
    shoal_wire::packets(bytes).any(|p| match p {
        Ok((_, shoal_wire::Packet::Vsync { body })) => matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::Replicate {
                entry: shoal_wire::vsync::Entry::Newview(v),
                ..
            }) if v.view == view
        ),
        _ => false,
    })
}

/// Swarm seed 131 (`--qsm --qsm-hybrid`), replayed in vsync alone. Member
/// 3 joins a group of three (k = 3). The primary, n0, decides view 1 and
/// replicates its Newview; the moment n1 has it, {0, 2} and {1, 3} are cut
/// apart for 2 s. n0 completes view 1 with n2 and sequences after it
/// (nothing of it commits: view 2 needs three of the four members). n1
/// takes over with the Newview as its candidate, and once the cut heals
/// completes it too (n0 and n2 report it installed). It used to sequence
/// after it at once, alone in its committee, the same gseqs n0 had given
/// its own records, and commit them: members delivered a mix of the two
/// logs, messages twice. The adopter now sequences nothing until its next
/// view is chosen by a majority.
#[test]
fn a_takeover_completing_a_view_installed_elsewhere_does_not_sequence_beside_its_primary() {
    use std::cell::Cell;
    use std::rc::Rc;
    let config = fast_config(3);
    let n = 4usize;
    let mut sim = group(3, n, 131, &config);
    let cut_since = Rc::new(Cell::new(None::<u64>));
    let cut = cut_since.clone();
    let side = |i: usize| i == 0 || i == 2;
    sim.drop_if = Some(Box::new(move |now, from, to, bytes| {
        if let Some(since) = cut.get() {
            return since <= now && now < 2_800 * MS && side(from) != side(to);
        }
        if from == 0 && to == 1 && is_newview_replica(bytes, 1) {
            cut.set(Some(now));
        }
        false
    }));
    let mut sent = vec![Vec::new(); n];
    let mut counter = 0u32;
    for t in (0..6_000u64).step_by(10) {
        sim.run_until(t);
        if t == 500 {
            let contacts: Vec<NodeId> = (0..3).map(NodeId).collect();
            let e =
                Vsync::joining(NodeId(3), &contacts, config.clone(), 131_003, sim.now()).unwrap();
            sim.start(3, e);
        }
        for (i, sent_i) in sent.iter_mut().enumerate() {
            if sim.alive(i) {
                counter += 1;
                if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                    sent_i.push(id);
                }
            }
        }
    }
    sim.run_until(15_000);
    if std::env::var("VSYNC_DEBUG").is_ok() {
        eprintln!("cut at {:?} ms", cut_since.get().map(|t| t / MS));
        debug_dump(&sim, &sent);
    }
    assert!(cut_since.get().is_some(), "the Newview never went to n1");
    assert!(
        sim.nodes[1].as_ref().unwrap().stats().takeovers >= 1,
        "n1 never took over"
    );
    checker::check(&sim, &sent).unwrap();
}

/// A backup told by the primary's heartbeat that records up to `committed`
/// are committed, holding none of them (a backup re-admitted with an empty
/// store before the primary resent them), hears nothing more. Returns its
/// stats one takeover timeout later.
fn silent_primary_after_heartbeat(committed: u64) -> Stats {
    let config = fast_config(2);
    let timeout = config.committee_timeout;
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let mut backup = Vsync::new(NodeId(1), &members, config, 7, Instant::ZERO).unwrap();
    let epoch = backup.committee.as_ref().unwrap().epoch;
    let heartbeat = Message::Heartbeat(shoal_wire::vsync::Heartbeat {
        epoch,
        committee: vec![0, 1],
        base: 0,
        committed,
        view: 0,
    });
    let body = heartbeat.to_vec().unwrap();
    let datagram = shoal_wire::Packet::Vsync { body: &body }.to_vec(0).unwrap();
    let t0 = Instant::ZERO + Duration::from_millis(10);
    backup.handle_datagram(t0, NodeId(0), &datagram);
    assert_eq!(backup.stats().malformed, 0);
    // On time (not late, so not mistaken for this backup's own sleep).
    backup.handle_timeout(t0 + timeout + Duration::from_millis(1));
    backup.stats().clone()
}

/// The hazard docs/vsync.md named after the seed-262 fix: a backup lacking
/// committed records would take over, cut its store below them and give
/// their gseqs to other messages. It declines; with nothing committed it
/// takes over as before (the control).
#[test]
fn a_backup_lacking_committed_records_does_not_take_over() {
    let lacking = silent_primary_after_heartbeat(50);
    assert_eq!(lacking.takeovers, 0);
    assert_eq!(lacking.takeovers_refused, 1);
    let holding = silent_primary_after_heartbeat(0);
    assert_eq!(holding.takeovers, 1);
    assert_eq!(holding.takeovers_refused, 0);
}

#[test]
fn guarantees_hold_across_seeds() {
    // 300 seeds: 100 for each committee size k = 1, 2, 3 (about 10 s in a
    // debug build; `VSYNC_SEEDS=1000` for a longer run).
    let seeds = std::env::var("VSYNC_SEEDS").map_or(300, |s| s.parse().unwrap());
    let failures: Vec<String> = (0..seeds).filter_map(|seed| chaos(seed).err()).collect();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The primary leaves by request (k = 1, 2, 3; 20 seeds, 2% loss): the
/// others install a view with it in `left` and no failure, the first backup
/// takes over at once (no committee timeout), and every message of the
/// members that stay is delivered to all of them in one order. With k = 1
/// the primary first takes a backup into the committee.
#[test]
fn the_primary_leaves_by_request_and_its_backup_takes_over() {
    for k in [1, 2, 3] {
        for seed in 0..20 {
            let config = fast_config(k);
            let n = 5usize;
            let mut sim = group(n, n, seed, &config);
            sim.loss = 0.02;
            let mut sent = vec![Vec::new(); n];
            let mut counter = 0u32;
            let (mut saw_leave_at, mut primary_at) = (None, None);
            for t in (0..4_000u64).step_by(10) {
                sim.run_until(t);
                if t == 1_000 {
                    sim.with(0, |e, now| e.leave(now));
                }
                let leave_seen = sim.events[1]
                    .iter()
                    .any(|(_, e)| matches!(e, Event::View(v) if v.left.contains(&NodeId(0))));
                if leave_seen && saw_leave_at.is_none() {
                    saw_leave_at = Some(t);
                }
                if sim.nodes[1].as_ref().unwrap().is_primary() && primary_at.is_none() {
                    primary_at = Some(t);
                }
                for (i, sent_i) in sent.iter_mut().enumerate().skip(1) {
                    counter += 1;
                    if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                        sent_i.push(id);
                    }
                }
            }
            sim.loss = 0.0;
            sim.run_until(10_000);
            if std::env::var("VSYNC_DEBUG").is_ok() {
                debug_dump(&sim, &sent);
            }
            let case = format!("k={k} seed={seed}");
            let left = sim.events[0].iter().any(|(_, e)| {
                matches!(
                    e,
                    Event::Removed {
                        reason: RemovedReason::Left,
                        ..
                    }
                )
            });
            assert!(left, "{case}: the primary was not told it left");
            for i in 1..n {
                // A member whose ack came too late (2% loss, 300 ms
                // `ack_wait`) is dropped like any silent member: that is not
                // what this test is about, but the leaver must be a leave.
                let dropped = sim.events[i]
                    .iter()
                    .any(|(_, e)| matches!(e, Event::Removed { .. }));
                if dropped {
                    continue;
                }
                let views: Vec<&View> = sim.events[i]
                    .iter()
                    .filter_map(|(_, e)| match e {
                        Event::View(v) => Some(v),
                        _ => None,
                    })
                    .collect();
                let leave = views.iter().find(|v| v.left.contains(&NodeId(0)));
                let leave = leave.unwrap_or_else(|| panic!("{case}: member {i} saw no leave"));
                assert!(
                    leave.failed.is_empty() || leave.reason == ViewReason::Failure,
                    "{case}: member {i}"
                );
                if leave.failed.is_empty() {
                    assert_eq!(leave.reason, ViewReason::Leave, "{case}: member {i}");
                }
                assert!(
                    views.iter().all(|v| !v.failed.contains(&NodeId(0))),
                    "{case}: member {i} saw the leaver fail"
                );
            }
            let successor = sim.nodes[1].as_ref().unwrap();
            assert!(successor.is_primary(), "{case}: member 1 is not primary");
            // At once, not `committee_timeout` (300 ms) after the view. (With
            // loss it can come earlier: a backup that missed the Newview
            // takes over after the silence and learns the view from its store.)
            assert!(
                primary_at.is_some() && primary_at <= saw_leave_at,
                "{case}: primary at {primary_at:?}, leave view at {saw_leave_at:?}"
            );
            assert_eq!(successor.stats().takeovers, 1, "{case}");
            checker::check(&sim, &sent).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
    }
}

/// Cut seed 121, k = 2 (docs/vsync.md): the cut isolates {0, 5} with 0 the
/// primary, the majority drops both, then backup 1 sleeps and is dropped
/// too. Member 5's view still names the committee [0, 1], now out of the
/// group: its repair requests went nowhere and it never learned it was
/// removed. After four unanswered requests it asks other members, who pass
/// the request on to their primary (`RepairFor`), which answers `Removed`.
#[test]
fn a_member_whose_committee_is_gone_still_learns_it_was_removed() {
    partition_chaos(121, 2, checker::Order::Uniform).unwrap();
}

/// `multicast_unsequenced`: pbcast alone carries it to every member, the
/// sender included, once each (5% loss, repaired by gossip); the committee
/// assigns no gseq for it.
#[test]
fn an_unsequenced_multicast_reaches_every_member_by_pbcast_alone() {
    let config = fast_config(1);
    let n = 5;
    let mut sim = group(n, n, 3, &config);
    sim.loss = 0.05;
    sim.run_until(100);
    for k in 0..20u8 {
        sim.with(2, |e, now| e.multicast_unsequenced(now, &[k; 8]).unwrap());
        sim.run_until(100 + 10 * u64::from(k + 1));
    }
    sim.loss = 0.0;
    sim.run_until(3_000);
    for i in 0..n {
        let mut got: Vec<u8> = sim.events[i]
            .iter()
            .filter_map(|(_, e)| match e {
                Event::Unsequenced { sender, payload } => {
                    assert_eq!(*sender, NodeId(2));
                    Some(payload[0])
                }
                Event::Deliver { .. } => panic!("member {i}: a sequenced delivery"),
                _ => None,
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..20).collect::<Vec<u8>>(), "member {i}");
    }
    let too_big = vec![0; config.max_payload() + 1];
    sim.with(2, |e, now| {
        assert!(matches!(
            e.multicast_unsequenced(now, &too_big),
            Err(SendError::TooLarge { .. })
        ));
    });
}

/// A backup that entered the committee after a sender's records were
/// collected never held them. When it took over, it did not know where that
/// sender's local ids stood and held the sender's next Gseq Reqs forever
/// waiting for local id 0 (found in the daemons' integration test: after
/// SIGKILL of the primary, nothing more was delivered). Each Gseq Req now
/// carries the sender's lowest unacknowledged local id.
#[test]
fn a_late_backup_that_takes_over_sequences_a_quiet_sender_again() {
    for seed in 0..10 {
        let config = fast_config(2);
        let n = 5;
        let mut sim = group(n, n, seed, &config);
        let mut sent = vec![Vec::new(); n];
        let send_burst = |sim: &mut Sim<Vsync>, from_ms: u64, sent: &mut Vec<Vec<u64>>| {
            for k in 0..10u64 {
                sim.run_until(from_ms + 20 * k);
                if let Ok(id) = sim.multicast(3, &k.to_be_bytes()) {
                    sent[3].push(id);
                }
            }
        };
        send_burst(&mut sim, 100, &mut sent);
        // The backup dies; member 2 joins the committee after member 3's
        // records are collected.
        sim.run_until(1_000);
        sim.crash(1);
        sim.run_until(2_500);
        // Then the primary dies: member 2 takes over.
        sim.crash(0);
        sim.run_until(4_000);
        send_burst(&mut sim, 4_000, &mut sent);
        sim.run_until(10_000);
        let case = format!("seed {seed}");
        assert!(sim.nodes[2].as_ref().unwrap().is_primary(), "{case}");
        for i in 2..n {
            let from_3 = deliveries(&sim, i)
                .iter()
                .filter(|(_, s, _)| *s == NodeId(3))
                .count();
            assert_eq!(from_3, sent[3].len(), "{case}: member {i}");
        }
        checker::check(&sim, &sent).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

/// When a backup (member 1) sends, when does the other backup (member 2)
/// deliver, in link delays (1 ms each, no jitter)? And how many messages did
/// pbcast originate anywhere (data, Prefreshviews, Newviews)?
fn backup_to_backup(committee_delivery: bool) -> (u64, u64) {
    let config = Config {
        committee_delivery,
        ..fast_config(3)
    };
    let mut sim = group(3, 3, 11, &config);
    sim.run_until(100);
    let sent_at = sim.now_ms();
    let id = sim.multicast(1, b"hop").unwrap();
    sim.run_until(sent_at + 50);
    let delivered_at = sim.events[2].iter().find_map(|(t, e)| match e {
        Event::Deliver {
            sender, local_id, ..
        } if *sender == NodeId(1) && *local_id == id => Some(t / MS),
        _ => None,
    });
    let originated = (0..3)
        .map(|i| {
            sim.nodes[i]
                .as_ref()
                .unwrap()
                .pbcast_stats()
                .unwrap()
                .originated
        })
        .sum();
    (delivered_at.expect("delivered") - sent_at, originated)
}

/// `committee_delivery`: with the whole view on the committee, a message
/// reaches a backup in 3 link delays (Gseq Req to the primary, Replicate,
/// PeerAck from the other backup) instead of 5 (then ReplicaAck, Gseq Ack,
/// the sender's pbcast), and nobody pbcasts it.
#[test]
fn committee_delivery_reaches_a_backup_in_three_hops_without_pbcast() {
    let (paper_hops, paper_pbcasts) = backup_to_backup(false);
    let (hops, pbcasts) = backup_to_backup(true);
    assert_eq!(paper_hops, 5);
    assert_eq!(hops, 3);
    assert_eq!(paper_pbcasts, 1, "the sender pbcasts its message");
    assert_eq!(pbcasts, 0, "every member holds it already");
}

/// A group that is all committee (n = k = 3) with `committee_delivery`:
/// loss, jitter, on even seeds the primary's crash and on odd seeds a backup
/// asleep (not both: a sleeper dropped from the view and then the primary's
/// crash leave one of a two-member view, which blocks by design, lacking a
/// majority), and a joiner, after which the view is no longer all committee
/// and senders pbcast again. Every guarantee the checker knows must hold.
fn chaos_committee_only(seed: u64) -> Result<(), String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xC0_3317);
    let (n, total, k) = (3usize, 4usize, 3u32);
    let config = Config {
        committee_delivery: forced("VSYNC_COMMITTEE_DELIVERY").unwrap_or(true),
        ..with_progress(fast_config(k), seed % 2 == 1)
    };
    let mut sim = group(n, total, seed, &config);
    sim.loss = rng.random_range(0.0..0.05);
    sim.jitter = MS / 2;
    let crash_at = seed
        .is_multiple_of(2)
        .then(|| rng.random_range(100..600u64) * 10);
    let sleep = (
        rng.random_range(50..700u64) * 10,
        rng.random_range(1..n),
        rng.random_range(50..1_000u64),
    );
    let join_at = rng.random_range(100..700u64) * 10;
    let mut sent = vec![Vec::new(); total];
    let mut counter = 0u32;
    for t in (0..8_000u64).step_by(10) {
        sim.run_until(t);
        if crash_at == Some(t) {
            sim.crash(0);
        }
        if crash_at.is_none() && t == sleep.0 {
            sim.sleep(sleep.1, t + sleep.2);
        }
        if t == join_at {
            let contacts: Vec<NodeId> = (0..k).map(NodeId).collect();
            let e = Vsync::joining(
                NodeId(3),
                &contacts,
                config.clone(),
                seed * 1000 + 3,
                sim.now(),
            )
            .unwrap();
            sim.start(3, e);
        }
        multicast_from_two(&mut sim, &mut rng, &mut counter, &mut sent);
    }
    quiet_end(&mut sim, &sent);
    checker::check(&sim, &sent).map_err(|e| {
        format!(
            "committee-only seed {seed} (crash {crash_at:?}, sleep {sleep:?}, join {join_at}): {e}"
        )
    })
}

#[test]
fn committee_only_single_seed() {
    let Ok(seed) = std::env::var("VSYNC_SEED") else {
        return;
    };
    chaos_committee_only(seed.parse().unwrap()).unwrap();
}

#[test]
fn guarantees_hold_when_the_whole_group_is_the_committee() {
    let seeds = std::env::var("VSYNC_SEEDS").map_or(60, |s| s.parse::<u64>().unwrap() / 5);
    let failures: Vec<String> = (0..seeds)
        .filter_map(|seed| chaos_committee_only(seed).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A decided Newview that nobody accepted is decided again at the new
/// epoch (swarm seed 3125, reduced). View 0 is {0, 1, 2}, committee
/// [0, 1, 2]. Member 1 sleeps; the primary drops it from the committee and
/// changes the view: 0 and 2 acknowledge, and before the decision both
/// promise a rival's higher epoch for that view (a backup that took over
/// across a cut, here a forged Prefreshview). The primary decides {0, 2}
/// from its round's acks, but neither accepts: its own member side
/// promised the rival, and 2 answers OUTRANKED. Then 2 crashes. The primary
/// outranks the rival and asks again; only the sleeper, once awake, can
/// complete its majority. Without setting the unaccepted decision aside
/// (`set_aside_unchosen`), that majority accepted {0, 2}: the live member
/// was dropped and the primary was left in a view of two with a dead
/// member, whose majority (both) it could never gather again. Paxos allows
/// the fresh decision: nobody of the new majority accepted the old one.
#[test]
fn a_decided_newview_nobody_accepted_is_decided_again_at_the_new_epoch() {
    let config = fast_config(3);
    let mut sim = group(3, 3, 11, &config);
    sim.run_until(500);
    sim.sleep(1, 3_000);
    // A rival proposer's Prefreshview for view 1 at an epoch above any the
    // primary takes before it is outranked.
    let rival = |view: u64, from: u32| {
        let epoch = (40 << 20) | u64::from(from);
        let body = Message::Prefreshview { view, epoch }.to_vec().unwrap();
        shoal_wire::Packet::Vsync { body: &body }
            .to_vec(from)
            .unwrap()
    };
    let mut injected = false;
    let mut crashed = false;
    for t in 501..2_500u64 {
        sim.run_until(t);
        let primary = sim.nodes[0].as_ref().unwrap();
        let vc = primary.committee.as_ref().and_then(|c| c.view_change());
        if !injected {
            // Both acknowledged, not decided yet.
            if let Some(vc) = vc.filter(|vc| vc.acks.len() == 2 && !vc.decided) {
                assert!(vc.acks.contains_key(&NodeId(2)));
                let view = vc.view;
                let to_0 = rival(view, 2);
                let to_2 = rival(view, 0);
                sim.with(0, |e, now| e.handle_datagram(now, NodeId(2), &to_0));
                sim.with(2, |e, now| e.handle_datagram(now, NodeId(0), &to_2));
                injected = true;
            }
        } else if !crashed && vc.is_some_and(|vc| vc.outranked.is_some()) {
            // The decision was refused by both; 2 goes.
            let vc = vc.unwrap();
            assert!(vc.accepts.is_empty(), "accepted by {:?}", vc.accepts);
            assert_eq!(primary.view.members.len(), 3);
            sim.crash(2);
            crashed = true;
        }
    }
    assert!(
        injected && crashed,
        "the scenario ran: {injected} {crashed}"
    );
    sim.run_until(8_000);
    let views: Vec<Vec<NodeId>> = sim.events[0]
        .iter()
        .filter_map(|(_, e)| match e {
            Event::View(v) => Some(v.members.clone()),
            _ => None,
        })
        .collect();
    assert!(
        !views.iter().any(|m| m.contains(&NodeId(2)) && m.len() == 2),
        "a view of two named the crashed member: {views:?}"
    );
    let removed = sim.events[1]
        .iter()
        .any(|(_, e)| matches!(e, Event::Removed { .. }));
    assert!(!removed, "the live member was dropped: {views:?}");
    assert_eq!(
        sim.nodes[1].as_ref().unwrap().members(),
        &[NodeId(0), NodeId(1)],
        "views at 0: {views:?}"
    );
    assert_eq!(
        sim.nodes[0].as_ref().unwrap().members(),
        &[NodeId(0), NodeId(1)]
    );
}

/// Hands member 1 one datagram from node 2 carrying `messages`.
fn send_from_node_2(sim: &mut Sim<Vsync>, messages: &[Message<'_>]) {
    let mut datagram = Vec::new();
    for message in messages {
        let body = message.to_vec().unwrap();
        shoal_wire::Packet::Vsync { body: &body }
            .encode(2, &mut datagram)
            .unwrap();
    }
    sim.with(1, |e, now| e.handle_datagram(now, NodeId(2), &datagram));
}

/// The payloads member `i` delivered, in order.
fn payloads_at(sim: &Sim<Vsync>, i: usize) -> Vec<&[u8]> {
    sim.events[i]
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Deliver { payload, .. } => Some(payload.as_ref()),
            _ => None,
        })
        .collect()
}

/// Repair answers from outside the view that the member never asked for
/// are another group's: ignored (swarm seed 3350, where a restarted daemon
/// took the answers to its previous process's requests, delivered 42 of
/// another group's records in its own gseqs, and so dropped its own group's
/// records at those gseqs). A member of {0, 1} gets entries at its next
/// gseqs, the frontier and `Removed` from node 2, outside its view: it
/// delivers none, stays a member, and goes on delivering its own group's
/// messages (this test fails without `Vsync::foreign_answer`).
#[test]
fn repair_answers_from_outside_the_view_nobody_asked_for_are_ignored() {
    let config = fast_config(2);
    let mut sim = group(2, 3, 5, &config);
    sim.run_until(200);
    sim.multicast(0, b"before").unwrap();
    sim.run_until(400);
    let next = sim.nodes[1].as_ref().unwrap().next_gseq();
    assert!(next > 0);
    let foreign = [
        Message::Entry {
            gseq: next,
            entry: shoal_wire::vsync::Entry::Data {
                sender: 2,
                local_id: 0,
                payload: b"another group's",
            },
        },
        Message::Entry {
            gseq: next + 1,
            entry: shoal_wire::vsync::Entry::Data {
                sender: 2,
                local_id: 1,
                payload: b"another group's",
            },
        },
        Message::RepairDone {
            committed: next + 2,
            view: 0,
        },
        Message::Removed { view: 0 },
    ];
    send_from_node_2(&mut sim, &foreign);
    sim.run_until(600);
    let member = sim.nodes[1].as_ref().unwrap();
    assert_eq!(member.members(), &[NodeId(0), NodeId(1)]);
    assert!(
        !sim.events[1].iter().any(|(_, e)| matches!(
            e,
            Event::Deliver { sender, .. } if *sender == NodeId(2)
        ) || matches!(e, Event::Removed { .. })),
        "{:?}",
        sim.events[1]
    );
    // Its own group's next messages take those gseqs, and are delivered.
    sim.multicast(0, b"after").unwrap();
    sim.run_until(1_000);
    assert_eq!(
        payloads_at(&sim, 1),
        [b"before".as_slice(), b"after".as_slice()]
    );
    let ignored = sim.nodes[1]
        .as_ref()
        .unwrap()
        .stats()
        .foreign_answers_ignored;
    assert_eq!(ignored, 4);
}

/// Two groups formed apart may each list a daemon of the other (a joiner
/// both admitted; swarm seeds 3972 and 6514): that daemon's own group's
/// records, proposals and removals then come from a member of the view.
/// Numbered from a base of each group's own (`group_base`), they are told
/// apart: a member of {0, 1, 2} (node 2 listed, living in another group)
/// gets from node 2 an entry at its next global sequence number in the
/// other group's numbering, a frontier, a Prefreshview for the other
/// group's next view and a `Removed`: it delivers none, promises nothing,
/// stays a member, goes on delivering its own group's messages, and
/// installs the view that drops node 2 (without the checks, the
/// Prefreshview outranks its own primary's and the `Removed` ends it).
#[test]
fn another_groups_messages_from_a_listed_daemon_are_ignored() {
    let config = fast_config(2);
    let mut sim: Sim<Vsync> = Sim::new(3, 7);
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let ours = group_base(NodeId(0), 1);
    let theirs = group_base(NodeId(2), 2);
    assert!(ours.abs_diff(theirs) >= FOREIGN);
    for (i, me) in members.iter().enumerate().take(2) {
        let seed = 7000 + i as u64;
        let engine =
            Vsync::new_at(*me, &members, config.clone(), seed, Instant::ZERO, ours).unwrap();
        sim.start(i, engine);
    }
    sim.check = Some(|e: &Vsync| e.check_invariants());
    sim.run_until(200);
    sim.multicast(0, b"before").unwrap();
    sim.run_until(400);
    let next = sim.nodes[1].as_ref().unwrap().next_gseq();
    assert!(next > ours, "numbered from the base: {next} against {ours}");
    let foreign = [
        Message::Entry {
            gseq: theirs + (next - ours),
            entry: shoal_wire::vsync::Entry::Data {
                sender: 2,
                local_id: 0,
                payload: b"another group's",
            },
        },
        Message::RepairDone {
            committed: theirs + (next - ours) + 10,
            view: theirs,
        },
        Message::Prefreshview {
            view: theirs + 1,
            epoch: 1 << 40,
        },
        Message::Removed { view: theirs + 1 },
    ];
    send_from_node_2(&mut sim, &foreign);
    sim.run_until(600);
    sim.multicast(0, b"after").unwrap();
    sim.run_until(8_000);
    assert_eq!(
        payloads_at(&sim, 1),
        [b"before".as_slice(), b"after".as_slice()]
    );
    let removed = sim.events[1]
        .iter()
        .any(|(_, e)| matches!(e, Event::Removed { .. }));
    assert!(!removed, "{:?}", sim.events[1]);
    let member = sim.nodes[1].as_ref().unwrap();
    assert_eq!(member.members(), &[NodeId(0), NodeId(1)]);
    assert_eq!(member.stats().foreign_group_ignored, 4);
}

/// With `repair_done_apart`, a repair answer's REPAIR_DONE comes in a
/// datagram of its own, so that losing the answer's last (large, in a
/// daemon fragmented) datagram does not also lose the member's cue to ask
/// for the rest at once; without it, it is packed after the entries.
#[test]
fn a_repair_answers_end_goes_alone_when_set_apart() {
    use std::cell::RefCell;
    use std::rc::Rc;
    for apart in [false, true] {
        let config = Config {
            repair_done_apart: apart,
            ..fast_config(1)
        };
        let mut sim = group(2, 2, 5, &config);
        sim.run_until(200);
        for i in 0..3u8 {
            sim.multicast(0, &[i; 100]).unwrap();
        }
        sim.run_until(400);
        // Per datagram from the primary to the member: the kinds it carries.
        let seen: Rc<RefCell<Vec<Vec<&'static str>>>> = Rc::default();
        let record = seen.clone();
        sim.drop_if = Some(Box::new(move |_, from, to, bytes| {
            if from == 0 && to == 1 {
                let kinds = shoal_wire::packets(bytes)
                    .filter_map(|p| match p {
                        Ok((_, shoal_wire::Packet::Vsync { body })) => {
                            match shoal_wire::vsync::decode(body) {
                                Ok(Message::RepairDone { .. }) => Some("done"),
                                Ok(Message::Entry { .. }) => Some("entry"),
                                _ => Some("other"),
                            }
                        }
                        _ => None,
                    })
                    .collect();
                record.borrow_mut().push(kinds);
            }
            false
        }));
        let request = Message::RepairReq { next: 0, upto: 100 }.to_vec().unwrap();
        let mut datagram = Vec::new();
        shoal_wire::Packet::Vsync { body: &request }
            .encode(1, &mut datagram)
            .unwrap();
        sim.with(0, |e, now| e.handle_datagram(now, NodeId(1), &datagram));
        let seen = seen.borrow();
        let with_done = seen
            .iter()
            .find(|d| d.contains(&"done"))
            .expect("the answer ends with REPAIR_DONE");
        let entries = seen.iter().flatten().filter(|k| **k == "entry").count();
        assert!(entries >= 3, "apart {apart}: {entries} entries");
        assert_eq!(with_done.len() == 1, apart, "apart {apart}: {with_done:?}");
    }
}

/// True for a phase 2 Accept of a Newview for `view`.
fn is_accept(bytes: &[u8], view: u64) -> bool {
    shoal_wire::packets(bytes).any(|p| match p {
        Ok((_, shoal_wire::Packet::Vsync { body })) => matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::Accept { newview, .. }) if newview.view == view
        ),
        _ => false,
    })
}

/// Swarm seed 655 (harshest shape), replayed in vsync alone. Five members,
/// committee {0, 1}. The primary's periodic Newview for view 1 is accepted
/// by 0, 1 and 2 (a majority: chosen), but its Accepts to 3 and 4 and its
/// replica to the backup are lost; 0 crashes and 2 sleeps. Backup 1 takes
/// over and asks 1, 3 and 4 (a majority of view 0) for view 1: 3 and 4
/// accepted nothing, and 1's own acceptance of 0's Newview is the only
/// report of it. It used to be left out of the phase 1 reports, so 1 chose
/// a second Newview for view 1, and view 1 had two member lists. Now 1
/// counts its own report, lacks that Newview's log, and steps aside: no
/// member installs a view 1 other than 0's.
#[test]
fn a_takeover_counts_the_newview_its_own_member_accepted() {
    let config = fast_config(2);
    let n = 5usize;
    let mut sim = group(n, n, 655, &config);
    sim.run_until(2_000);
    let view = sim.nodes[0].as_ref().unwrap().view.id + 1;
    sim.drop_if = Some(Box::new(move |_, from, to, bytes| {
        from == 0
            && ((to >= 3 && is_accept(bytes, view)) || (to == 1 && is_newview_replica(bytes, view)))
    }));
    let mut chosen = None;
    for t in 2_001..6_000u64 {
        sim.run_until(t);
        let primary = sim.nodes[0].as_ref().unwrap();
        let accepted = primary
            .committee
            .as_ref()
            .and_then(|c| c.view_change())
            .is_some_and(|vc| vc.view == view && vc.accepts.len() >= 3);
        if accepted {
            let p = primary.committee.as_ref().and_then(|c| match &c.role {
                committee::Role::Primary(p) => Some(p.cview.members.clone()),
                _ => None,
            });
            chosen = p;
            sim.crash(0);
            sim.sleep(2, t + 4_000);
            break;
        }
    }
    let chosen = chosen.expect("0's Newview was never accepted by a majority");
    sim.run_until(12_000);
    assert!(
        sim.nodes[1].as_ref().unwrap().stats().takeovers >= 1,
        "1 never took over"
    );
    for i in 1..n {
        for (_, e) in &sim.events[i] {
            if let Event::View(v) = e {
                if v.id == view {
                    let members: Vec<u32> = v.members.iter().map(|m| m.0).collect();
                    assert_eq!(members, chosen, "member {i} installed a second view {view}");
                }
            }
        }
    }
}

/// True for an AckPrefreshview.
fn is_ack_prefreshview(bytes: &[u8]) -> bool {
    shoal_wire::packets(bytes).any(|p| match p {
        Ok((_, shoal_wire::Packet::Vsync { body })) => matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::AckPrefreshview { .. })
        ),
        _ => false,
    })
}

/// Swarm seed 209 (harshest shape): a live member's AckPrefreshview and its
/// one retry were both lost at a periodic view change, and the primary
/// dropped it. With `ask_heard_again` the primary, which heard the member
/// (its multicasts) during the change, asks it once more and keeps it;
/// without it (P000's rule) the member is dropped, as the seed showed.
#[test]
fn a_member_heard_during_a_view_change_is_asked_again_not_dropped() {
    for ask in [true, false] {
        let config = Config {
            ack_retries: 1,
            ask_heard_again: ask,
            ..fast_config(1)
        };
        let mut sim = group(4, 4, 7, &config);
        // The first two acknowledgements member 3 sends after 2.9 s (the
        // first periodic change starts at 3 s): the ack and its retry.
        let lost = std::rc::Rc::new(std::cell::Cell::new(0));
        let counted = lost.clone();
        sim.drop_if = Some(Box::new(move |now, from, to, bytes| {
            let drop = now >= 2_900 * MS
                && from == 3
                && to == 0
                && counted.get() < 2
                && is_ack_prefreshview(bytes);
            counted.set(counted.get() + usize::from(drop));
            drop
        }));
        let mut sent = vec![Vec::new(); 4];
        let mut counter = 0u32;
        for t in (0..5_000u64).step_by(10) {
            sim.run_until(t);
            for (i, sent_i) in sent.iter_mut().enumerate() {
                counter += 1;
                if let Ok(id) = sim.multicast(i, &counter.to_be_bytes()) {
                    sent_i.push(id);
                }
            }
        }
        sim.run_until(7_000);
        assert_eq!(lost.get(), 2, "ask {ask}: both acks lost");
        let removed = sim.events[3]
            .iter()
            .any(|(_, e)| matches!(e, Event::Removed { .. }));
        let last_view = sim.events[0]
            .iter()
            .filter_map(|(_, e)| match e {
                Event::View(v) => Some(v.members.clone()),
                _ => None,
            })
            .last()
            .expect("views");
        let asked = sim.nodes[0].as_ref().unwrap().stats().view_acks_asked_again;
        if ask {
            assert!(!removed, "asked again: member 3 stays");
            assert_eq!(last_view, (0..4).map(NodeId).collect::<Vec<_>>());
            assert_eq!(asked, 1);
            checker::check(&sim, &sent).unwrap();
        } else {
            assert!(removed, "P000's rule: member 3 is dropped");
            assert_eq!(asked, 0);
        }
    }
}
