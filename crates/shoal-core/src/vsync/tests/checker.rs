//! Checks the virtual-synchrony guarantees over the event logs of a run
//! (the vsync guarantees): one total order; no duplicate; members that move
//! together from view V to V+1 delivered the same messages in V; removed
//! members are told; messages of members that stay are delivered to every
//! member that stays.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::super::harness::Sim;
use super::super::{Event, Vsync};
use crate::engine::NodeId;

type Msg = (NodeId, u64, Bytes);

/// How strictly one total order is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Every member, removed ones included, delivers the same message at a
    /// given gseq (uniform total order).
    Uniform,
    /// Members that stay in the group agree, and members that move
    /// together from V to V+1 delivered the same messages in V; a member
    /// later removed may have delivered, in its last view, messages the
    /// others never did (non-uniform, as Isis' ABCAST: a removed member
    /// counts as failed). This is what the daemons promise.
    NonUniform,
}

/// What a member delivered in one view: (gseq, message), in order.
type Delivered = Vec<(u64, Msg)>;

/// Per member: the views it installed with what it delivered in each.
struct Log {
    views: Vec<(u64, Delivered)>,
    first_gseq: Option<u64>,
    removed: bool,
    own: BTreeSet<u64>,
}

fn log_of(events: &[(u64, Event)], me: usize) -> Result<Log, String> {
    let mut log = Log {
        views: Vec::new(),
        first_gseq: None,
        removed: false,
        own: BTreeSet::new(),
    };
    let mut seen = BTreeSet::new();
    let mut last = None;
    for (_, event) in events {
        if log.removed {
            return Err(format!("member {me}: event after Removed: {event:?}"));
        }
        match event {
            Event::View(v) => {
                if log.first_gseq.is_none() {
                    log.first_gseq = Some(v.gseq);
                }
                if last.is_some_and(|l| v.gseq <= l) && v.id != 0 {
                    return Err(format!("member {me}: view {} out of order", v.id));
                }
                last = Some(v.gseq);
                log.views.push((v.id, Vec::new()));
            }
            Event::Deliver {
                sender,
                local_id,
                gseq,
                payload,
            } => {
                if last.is_some_and(|l| *gseq < l) || !seen.insert((*sender, *local_id)) {
                    return Err(format!("member {me}: gseq {gseq} out of order or twice"));
                }
                last = Some(*gseq);
                if sender.0 as usize == me {
                    log.own.insert(*local_id);
                }
                let Some(view) = log.views.last_mut() else {
                    return Err(format!("member {me}: delivery before any view"));
                };
                view.1.push((*gseq, (*sender, *local_id, payload.clone())));
            }
            Event::Removed { .. } => log.removed = true,
            // Outside the total order: nothing of it is checked here.
            Event::Unsequenced { .. } => {}
        }
    }
    Ok(log)
}

/// Adds member `me`'s deliveries to `order`, failing on a different message
/// at a gseq already taken.
fn agree(order: &mut BTreeMap<u64, Msg>, log: &Log, me: usize) -> Result<(), String> {
    for (gseq, msg) in log.views.iter().flat_map(|(_, d)| d) {
        if let Some(other) = order.insert(*gseq, msg.clone()) {
            if other != *msg {
                return Err(format!("gseq {gseq}: {other:?} vs {msg:?} at {me}"));
            }
        }
    }
    Ok(())
}

/// `sent[i]`: local ids member `i`'s multicast accepted. Uniform total order.
pub fn check(sim: &Sim<Vsync>, sent: &[Vec<u64>]) -> Result<(), String> {
    check_with(sim, sent, Order::Uniform)
}

pub fn check_with(sim: &Sim<Vsync>, sent: &[Vec<u64>], strictness: Order) -> Result<(), String> {
    let logs: Vec<Option<Log>> = (0..sim.nodes.len())
        .map(|i| match sim.nodes[i] {
            Some(_) => log_of(&sim.events[i], i).map(Some),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let survivors: Vec<usize> = (0..sim.nodes.len())
        .filter(|i| sim.alive(*i) && logs[*i].as_ref().is_some_and(|l| !l.removed))
        .collect();
    // One total order: among survivors first, then everyone if uniform.
    let mut order = BTreeMap::new();
    for &i in &survivors {
        agree(&mut order, logs[i].as_ref().unwrap(), i)?;
    }
    if strictness == Order::Uniform {
        for (i, log) in logs.iter().enumerate() {
            if let Some(log) = log.as_ref().filter(|_| !survivors.contains(&i)) {
                agree(&mut order, log, i)?;
            }
        }
    }
    // Same messages in V for members that moved together from V to V+1.
    let mut in_view: BTreeMap<(u64, u64), (usize, &Delivered)> = BTreeMap::new();
    for (i, log) in logs.iter().enumerate() {
        let Some(log) = log else { continue };
        for pair in log.views.windows(2) {
            let key = (pair[0].0, pair[1].0);
            match in_view.get(&key) {
                Some((j, delivered)) if *delivered != &pair[0].1 => {
                    return Err(format!(
                        "members {j} and {i} moved {key:?} with different deliveries"
                    ))
                }
                Some(_) => {}
                None => {
                    in_view.insert(key, (i, &pair[0].1));
                }
            }
        }
    }
    // Survivors agree on the view and were all admitted.
    let views: BTreeSet<u64> = survivors
        .iter()
        .map(|i| sim.nodes[*i].as_ref().unwrap().view_id())
        .collect();
    if views.len() > 1 {
        return Err(format!("survivors end in different views {views:?}"));
    }
    for &i in &survivors {
        let engine = sim.nodes[i].as_ref().unwrap();
        if !engine.members().contains(&NodeId(i as u32)) {
            return Err(format!("member {i} alive, never told it is out"));
        }
    }
    // Every message of a survivor reaches every survivor that was in the group then.
    let gseq_of: BTreeMap<(NodeId, u64), u64> =
        order.iter().map(|(g, (s, l, _))| ((*s, *l), *g)).collect();
    for &s in &survivors {
        let log = logs[s].as_ref().unwrap();
        for local in &sent[s] {
            if !log.own.contains(local) {
                return Err(format!("member {s}: own message {local} never delivered"));
            }
            let g = gseq_of[&(NodeId(s as u32), *local)];
            for &m in &survivors {
                let lm = logs[m].as_ref().unwrap();
                let delivered = lm.views.iter().any(|(_, d)| d.iter().any(|(x, _)| *x == g));
                if lm.first_gseq.is_some_and(|f| f < g) && !delivered {
                    return Err(format!("member {m} lacks gseq {g} from {s}"));
                }
            }
        }
    }
    Ok(())
}
