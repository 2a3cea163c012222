//! Cover sets for irregular overlap ([B] §2). With groups joined at random
//! (a Zipf-like popularity), almost every node has its own group set, so
//! regions computed over *all* groups would be single nodes and a group
//! would span hundreds of them. QSM instead splits the groups into *cover
//! sets*, each overlapping regularly enough to decompose into a few
//! regions; one QSM instance runs per cover set and a node is in at most one
//! region of each. [B] cites its own algorithm ([5]) without describing it;
//! this is Shoal's.
//!
//! ## The algorithm: greedy first fit by traffic, with bounded fragmentation
//!
//! 1. Groups are taken in decreasing order of traffic (ties: lower id).
//! 2. Each cover set keeps its partition of the nodes into regions (nodes
//!    with the same groups *of that cover set*), and for each of its groups
//!    how many regions it spans.
//! 3. A group `g` joins the first cover set, in creation order, where adding
//!    it keeps every group of the set within [`CoverConfig::regions_per_group_max`]
//!    regions and the set within [`CoverConfig::regions_per_cover_max`]
//!    regions. Adding `g` splits each region that `g` cuts (some members in,
//!    some out), adds the members of `g` in no region of the set as one new
//!    region, and widens every group containing a split region by one.
//! 4. When no cover set takes `g`, it opens a new one (one region: its
//!    members).
//! 5. First of all, the least busy groups carrying together at most
//!    [`CoverConfig::tail_traffic_share`] of the traffic are set aside into
//!    one last cover set of single-node regions: each costs its sender one
//!    send per member, and each node is in one region of it however many
//!    idle groups it joined (without it, the idle tail of randomly
//!    overlapping groups opens hundreds of nearly idle cover sets).
//!
//! Creation order is traffic order, so the busiest groups fill the first
//! cover sets and a node's traffic concentrates in few of its regions; the
//! fragmentation bound keeps each group's cost (one multicast per region it
//! spans, [A] §2.1) small. The default bound of 5 is what [B] §4 observed
//! in its deployments ("no group spanned more than 5 regions").
//!
//! Cost: for each group, each cover set tried costs one pass over the
//! group's members, stopped as soon as a bound is broken.

use serde::{Deserialize, Serialize};

/// Bounds of the cover-set construction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoverConfig {
    /// Regions one group may span within its cover set: each costs the
    /// sender one IP multicast per message. [B] §4 observed at most 5.
    pub regions_per_group_max: usize,
    /// Regions one cover set may hold (IP multicast addresses, token rings).
    /// Not in the papers; 64 keeps a cover set's regions few.
    pub regions_per_cover_max: usize,
    /// The least busy groups, carrying together at most this share of all
    /// traffic (a group's rate times its members), go into one last cover
    /// set whose regions are single nodes: a message to such a group costs
    /// one send per member, which matters little for idle groups, and every
    /// node is in one region of it however many idle groups it joined. 0
    /// turns it off. Not in the papers; 5% echoes [B] §2's "95% of the
    /// traffic in just a few cover sets".
    pub tail_traffic_share: f64,
}

impl Default for CoverConfig {
    fn default() -> Self {
        CoverConfig {
            regions_per_group_max: 5,
            regions_per_cover_max: 64,
            tail_traffic_share: 0.05,
        }
    }
}

/// One cover set: its groups and its regions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoverSet {
    /// Group indices, in the order they joined.
    pub groups: Vec<u32>,
    /// Per region: its member count.
    pub region_sizes: Vec<u32>,
    /// Per node: its region in this set, or `u32::MAX` when in none of its groups.
    pub region_of: Vec<u32>,
    /// Per group of `groups`: regions it spans.
    pub spans: Vec<u32>,
    /// Per region: indices into `groups` of the groups containing it.
    region_groups: Vec<Vec<u32>>,
    /// The tail set: every member is its own region.
    pub singletons: bool,
}

const OUTSIDE: u32 = u32::MAX;

impl CoverSet {
    fn new(nodes: usize) -> CoverSet {
        CoverSet {
            region_of: vec![OUTSIDE; nodes],
            ..CoverSet::default()
        }
    }

    /// Adds group `g` with `members` if the bounds allow it; `hits` is
    /// scratch space. Returns whether it was added.
    fn try_add(
        &mut self,
        g: u32,
        members: &[u32],
        config: &CoverConfig,
        hits: &mut Vec<u32>,
    ) -> bool {
        hits.clear();
        hits.resize(self.region_sizes.len(), 0);
        let mut touched = Vec::new();
        let mut outside = 0usize;
        for &n in members {
            match self.region_of[n as usize] {
                OUTSIDE => outside += 1,
                r => {
                    if hits[r as usize] == 0 {
                        touched.push(r);
                        if touched.len() + usize::from(outside > 0) > config.regions_per_group_max {
                            return false;
                        }
                    }
                    hits[r as usize] += 1;
                }
            }
        }
        if touched.len() + usize::from(outside > 0) > config.regions_per_group_max {
            return false;
        }
        let splits: Vec<u32> = touched
            .iter()
            .copied()
            .filter(|&r| hits[r as usize] < self.region_sizes[r as usize])
            .collect();
        let regions_after = self.region_sizes.len() + splits.len() + usize::from(outside > 0);
        if regions_after > config.regions_per_cover_max {
            return false;
        }
        let mut widen = vec![0u32; self.groups.len()];
        for &r in &splits {
            for &h in &self.region_groups[r as usize] {
                widen[h as usize] += 1;
            }
        }
        let too_wide = self
            .spans
            .iter()
            .zip(&widen)
            .any(|(s, w)| (s + w) as usize > config.regions_per_group_max);
        if too_wide {
            return false;
        }
        self.apply(g, members, &touched, &splits, outside > 0, &widen);
        true
    }

    fn apply(
        &mut self,
        g: u32,
        members: &[u32],
        touched: &[u32],
        splits: &[u32],
        outside: bool,
        widen: &[u32],
    ) {
        let local = self.groups.len() as u32;
        self.groups.push(g);
        for (s, w) in self.spans.iter_mut().zip(widen) {
            *s += w;
        }
        self.spans
            .push((touched.len() + usize::from(outside)) as u32);
        // Regions `g` covers whole gain `g`; split regions give the members
        // of `g` to a new region with the old groups and `g`.
        let mut new_of: Vec<(u32, u32)> = Vec::with_capacity(splits.len());
        for &r in touched {
            if splits.contains(&r) {
                let fresh = self.region_sizes.len() as u32;
                let mut groups = self.region_groups[r as usize].clone();
                groups.push(local);
                self.region_groups.push(groups);
                self.region_sizes.push(0);
                new_of.push((r, fresh));
            } else {
                self.region_groups[r as usize].push(local);
            }
        }
        let outside_region = outside.then(|| {
            self.region_groups.push(vec![local]);
            self.region_sizes.push(0);
            (self.region_sizes.len() - 1) as u32
        });
        for &n in members {
            let old = self.region_of[n as usize];
            let target = if old == OUTSIDE {
                outside_region.expect("an outside member makes the region")
            } else if let Some(&(_, fresh)) = new_of.iter().find(|(r, _)| *r == old) {
                self.region_sizes[old as usize] -= 1;
                fresh
            } else {
                continue;
            };
            self.region_of[n as usize] = target;
            self.region_sizes[target as usize] += 1;
        }
    }
}

/// Splits groups into cover sets. `members[g]` lists the nodes (dense
/// indices below `nodes`) of group `g`, each at most once; `traffic[g]` is
/// its message rate (any unit). Every group with members lands in exactly
/// one cover set; empty groups in none.
pub fn cover_sets(
    nodes: usize,
    members: &[Vec<u32>],
    traffic: &[f64],
    config: &CoverConfig,
) -> Vec<CoverSet> {
    let mut order: Vec<u32> = (0..members.len() as u32)
        .filter(|&g| !members[g as usize].is_empty())
        .collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (traffic[a as usize], traffic[b as usize]);
        tb.total_cmp(&ta).then(a.cmp(&b))
    });
    let tail = split_tail(&mut order, members, traffic, config.tail_traffic_share);
    let mut sets: Vec<CoverSet> = Vec::new();
    let mut hits = Vec::new();
    for g in order {
        let m = &members[g as usize];
        let placed = sets.iter_mut().any(|s| s.try_add(g, m, config, &mut hits));
        if !placed {
            let mut set = CoverSet::new(nodes);
            let fits = set.try_add(g, m, config, &mut hits);
            debug_assert!(fits, "a group alone is one region");
            sets.push(set);
        }
    }
    if !tail.is_empty() {
        sets.push(singleton_set(nodes, tail, members));
    }
    sets
}

/// Takes off the end of `order` (busiest first) the groups that together
/// carry at most `share` of all traffic.
fn split_tail(order: &mut Vec<u32>, members: &[Vec<u32>], traffic: &[f64], share: f64) -> Vec<u32> {
    let load = |g: u32| traffic[g as usize] * members[g as usize].len() as f64;
    let total: f64 = order.iter().map(|&g| load(g)).sum();
    let mut tail_load = 0.0;
    let mut cut = order.len();
    while cut > 0 {
        let next = tail_load + load(order[cut - 1]);
        if next > share * total {
            break;
        }
        tail_load = next;
        cut -= 1;
    }
    order.split_off(cut)
}

/// The tail cover set: one region per node in any of `groups`.
fn singleton_set(nodes: usize, groups: Vec<u32>, members: &[Vec<u32>]) -> CoverSet {
    let mut set = CoverSet::new(nodes);
    set.singletons = true;
    for &g in &groups {
        for &n in &members[g as usize] {
            if set.region_of[n as usize] == OUTSIDE {
                set.region_of[n as usize] = set.region_sizes.len() as u32;
                set.region_sizes.push(1);
            }
        }
        set.spans.push(members[g as usize].len() as u32);
    }
    set.groups = groups;
    set
}

/// Sends per message, weighted by traffic: the mean over messages of the
/// regions its group spans.
pub fn sends_per_message(sets: &[CoverSet], traffic: &[f64]) -> f64 {
    let (mut weighted, mut total) = (0.0, 0.0);
    for set in sets {
        for (i, &g) in set.groups.iter().enumerate() {
            weighted += traffic[g as usize] * f64::from(set.spans[i]);
            total += traffic[g as usize];
        }
    }
    weighted / total.max(f64::MIN_POSITIVE)
}

/// Per node: (regions it is in, the share of its traffic carried by its two
/// busiest regions). A node's traffic is the sum of its groups' traffic; a
/// region carries the traffic of the node's groups in that cover set.
pub fn node_concentration(
    sets: &[CoverSet],
    members: &[Vec<u32>],
    traffic: &[f64],
    nodes: usize,
) -> Vec<(usize, f64)> {
    let mut per_node: Vec<Vec<f64>> = vec![Vec::new(); nodes];
    for set in sets {
        let mut load = vec![0.0f64; nodes];
        for &g in &set.groups {
            for &n in &members[g as usize] {
                load[n as usize] += traffic[g as usize];
            }
        }
        for (n, l) in load.into_iter().enumerate() {
            if set.region_of[n] != OUTSIDE {
                per_node[n].push(l);
            }
        }
    }
    per_node
        .into_iter()
        .map(|mut loads| {
            loads.sort_by(|a, b| b.total_cmp(a));
            let total: f64 = loads.iter().sum();
            let top: f64 = loads.iter().take(2).sum();
            let share = if total > 0.0 { top / total } else { 1.0 };
            (loads.len(), share)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the invariants: every group in one set; within a set, the
    /// regions are exactly the classes of nodes with equal group sets (of
    /// that set), and every group spans at most the bound.
    fn check(nodes: usize, members: &[Vec<u32>], sets: &[CoverSet], config: &CoverConfig) {
        let mut placed = vec![0; members.len()];
        for set in sets {
            for &g in &set.groups {
                placed[g as usize] += usize::from(set.singletons);
            }
            if set.singletons {
                continue;
            }
            assert!(set.region_sizes.len() <= config.regions_per_cover_max);
            let mut sig: Vec<Vec<u32>> = vec![Vec::new(); nodes];
            for &g in &set.groups {
                placed[g as usize] += 1;
                for &n in &members[g as usize] {
                    sig[n as usize].push(g);
                }
            }
            for a in 0..nodes {
                assert_eq!(sig[a].is_empty(), set.region_of[a] == OUTSIDE);
                for b in 0..nodes {
                    let same_region = set.region_of[a] == set.region_of[b];
                    assert_eq!(same_region, sig[a] == sig[b], "nodes {a} {b}");
                }
            }
            for &g in &set.groups {
                let mut rs: Vec<u32> = members[g as usize]
                    .iter()
                    .map(|&n| set.region_of[n as usize])
                    .collect();
                rs.sort();
                rs.dedup();
                assert!(rs.len() <= config.regions_per_group_max);
            }
            for (r, &size) in set.region_sizes.iter().enumerate() {
                let count = set.region_of.iter().filter(|&&x| x == r as u32).count();
                assert_eq!(count, size as usize);
            }
        }
        for (g, m) in members.iter().enumerate() {
            assert_eq!(placed[g], usize::from(!m.is_empty()), "group {g}");
        }
    }

    #[test]
    fn nested_groups_share_one_cover_set() {
        let members = vec![(0..8).collect(), (0..4).collect(), (0..2).collect()];
        let config = CoverConfig {
            tail_traffic_share: 0.0,
            ..CoverConfig::default()
        };
        let sets = cover_sets(8, &members, &[3.0, 2.0, 1.0], &config);
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].region_sizes.len(), 3);
        check(8, &members, &sets, &config);
    }

    #[test]
    fn too_fragmenting_a_group_opens_a_new_cover_set() {
        // Group 1 takes one node of each of group 0's... a set with bound 2:
        // evens and odds cut {0..8} into two, then {0,1,2,3} cuts both.
        let config = CoverConfig {
            regions_per_group_max: 2,
            regions_per_cover_max: 64,
            tail_traffic_share: 0.0,
        };
        let members = vec![(0..8).collect(), vec![0, 2, 4, 6], vec![0, 1, 2, 3]];
        let sets = cover_sets(8, &members, &[3.0, 2.0, 1.0], &config);
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].groups, vec![0, 1]);
        assert_eq!(sets[1].groups, vec![2]);
        check(8, &members, &sets, &config);
    }

    #[test]
    fn random_overlap_keeps_the_invariants() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        let nodes = 40;
        let members: Vec<Vec<u32>> = (0..60)
            .map(|_| {
                let p = rng.random::<f64>();
                (0..nodes as u32)
                    .filter(|_| rng.random::<f64>() < p)
                    .collect()
            })
            .collect();
        let traffic: Vec<f64> = (0..60).map(|g| 1.0 / (g as f64 + 1.0)).collect();
        let config = CoverConfig::default();
        let sets = cover_sets(nodes, &members, &traffic, &config);
        check(nodes, &members, &sets, &config);
        let per_node = node_concentration(&sets, &members, &traffic, nodes);
        assert!(per_node
            .iter()
            .all(|&(_, share)| share > 0.0 && share <= 1.0));
    }
}
