//! QSM regions ([A] §2.1, [B] §4): every node whose set of groups is the
//! same as another's is in the same *region*, and each region has its own IP
//! multicast address. A group view maps onto a set of region views ([A]
//! fn 3), so a sender reaches a group with one IP multicast per region the
//! group spans and no receiver filters out traffic of groups it did not
//! join. Sequence numbers, recovery and rate control are per region, shared
//! by every group mapped to it.
//!
//! [`RegionMap::derive`] computes the regions from the group views (what the
//! membership service does in QSM) and keeps region identifiers and view
//! numbers stable across successive derivations: a region whose group set
//! survives keeps its id, and its view number advances only when its member
//! set changed.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::engine::NodeId;

/// A group's name as the engines see it (the daemon maps names to ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GroupId(pub u32);

/// A region's identifier, stable while its group set exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RegionId(pub u32);

/// One region view: the nodes that share exactly the group set `groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub id: RegionId,
    /// Bumped each time the member set changes.
    pub view: u64,
    /// Ascending, non-empty.
    pub groups: Vec<GroupId>,
    /// Ascending, non-empty.
    pub members: Vec<NodeId>,
}

/// Group views mapped onto region views.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionMap {
    /// Ascending by id.
    regions: Vec<Region>,
    region_of_node: BTreeMap<NodeId, RegionId>,
    regions_of_group: BTreeMap<GroupId, Vec<RegionId>>,
}

impl RegionMap {
    /// The regions of `views` (group to members). `previous`, the map
    /// derived before this change, lends its ids and view numbers to regions
    /// with the same group set, so a join elsewhere leaves a region's address
    /// and view untouched. New regions take ids after the largest in use.
    pub fn derive(views: &BTreeMap<GroupId, Vec<NodeId>>, previous: Option<&RegionMap>) -> Self {
        let mut groups_of: BTreeMap<NodeId, Vec<GroupId>> = BTreeMap::new();
        for (&group, members) in views {
            for &node in members {
                groups_of.entry(node).or_default().push(group);
            }
        }
        let mut by_set: BTreeMap<Vec<GroupId>, Vec<NodeId>> = BTreeMap::new();
        for (node, mut groups) in groups_of {
            groups.sort_unstable();
            groups.dedup();
            by_set.entry(groups).or_default().push(node);
        }
        let old: BTreeMap<&[GroupId], &Region> = previous
            .map(|p| p.regions.iter().map(|r| (r.groups.as_slice(), r)).collect())
            .unwrap_or_default();
        let mut next_id = previous
            .and_then(|p| p.regions.iter().map(|r| r.id.0 + 1).max())
            .unwrap_or(0);
        let mut regions = Vec::with_capacity(by_set.len());
        for (groups, members) in by_set {
            let (id, view) = match old.get(groups.as_slice()) {
                Some(r) if r.members == members => (r.id, r.view),
                Some(r) => (r.id, r.view + 1),
                None => {
                    next_id += 1;
                    (RegionId(next_id - 1), 1)
                }
            };
            regions.push(Region {
                id,
                view,
                groups,
                members,
            });
        }
        regions.sort_by_key(|r| r.id);
        let mut region_of_node = BTreeMap::new();
        let mut regions_of_group: BTreeMap<GroupId, Vec<RegionId>> = BTreeMap::new();
        for r in &regions {
            for &node in &r.members {
                region_of_node.insert(node, r.id);
            }
            for &g in &r.groups {
                regions_of_group.entry(g).or_default().push(r.id);
            }
        }
        RegionMap {
            regions,
            region_of_node,
            regions_of_group,
        }
    }

    /// Every region, ascending by id.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The region with this id.
    pub fn region(&self, id: RegionId) -> Option<&Region> {
        self.regions
            .binary_search_by_key(&id, |r| r.id)
            .ok()
            .map(|i| &self.regions[i])
    }

    /// The region `node` is in (within one cover set a node is in one region).
    pub fn region_of(&self, node: NodeId) -> Option<&Region> {
        self.region(*self.region_of_node.get(&node)?)
    }

    /// The regions a group spans: a sender multicasts once to each.
    pub fn regions_of_group(&self, group: GroupId) -> &[RegionId] {
        self.regions_of_group
            .get(&group)
            .map_or(&[], |v| v.as_slice())
    }
}

/// The IP multicast address of region `id`: `base` plus the id, within the
/// administratively scoped block 239.0.0.0/8 (RFC 2365). Ids wrap after
/// 2^24 regions, far beyond QSM's limits ([B] §6: about 10,000 groups).
pub fn multicast_address(base: Ipv4Addr, id: RegionId) -> Ipv4Addr {
    let offset = u32::from(base) & 0x00FF_FFFF;
    let host = offset.wrapping_add(id.0) & 0x00FF_FFFF;
    Ipv4Addr::from(0xEF00_0000 | host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views(spec: &[(u32, &[u32])]) -> BTreeMap<GroupId, Vec<NodeId>> {
        spec.iter()
            .map(|(g, ms)| (GroupId(*g), ms.iter().map(|m| NodeId(*m)).collect()))
            .collect()
    }

    #[test]
    fn nodes_with_identical_group_sets_share_a_region() {
        // A = {0..4}, B = {2..6}: regions {0,1} (A), {2,3} (A,B), {4,5} (B).
        let map = RegionMap::derive(&views(&[(1, &[0, 1, 2, 3]), (2, &[2, 3, 4, 5])]), None);
        assert_eq!(map.regions().len(), 3);
        let of = |n| map.region_of(NodeId(n)).unwrap().groups.clone();
        assert_eq!(of(0), vec![GroupId(1)]);
        assert_eq!(of(3), vec![GroupId(1), GroupId(2)]);
        assert_eq!(of(5), vec![GroupId(2)]);
        assert_eq!(map.regions_of_group(GroupId(1)).len(), 2);
        assert_eq!(map.regions_of_group(GroupId(2)).len(), 2);
        // The group view is exactly the union of its region views.
        let mut union: Vec<NodeId> = map
            .regions_of_group(GroupId(2))
            .iter()
            .flat_map(|id| map.region(*id).unwrap().members.clone())
            .collect();
        union.sort();
        assert_eq!(union, views(&[(2, &[2, 3, 4, 5])])[&GroupId(2)]);
    }

    #[test]
    fn ids_and_views_survive_unrelated_changes() {
        let first = RegionMap::derive(&views(&[(1, &[0, 1]), (2, &[2, 3])]), None);
        // Node 4 joins group 2: group 1's region is untouched, group 2's
        // region keeps its id with a new view, nothing new is created.
        let second = RegionMap::derive(&views(&[(1, &[0, 1]), (2, &[2, 3, 4])]), Some(&first));
        let r1 = first.region_of(NodeId(0)).unwrap();
        assert_eq!(second.region_of(NodeId(0)).unwrap(), r1);
        let (a, b) = (
            first.region_of(NodeId(2)).unwrap(),
            second.region_of(NodeId(2)).unwrap(),
        );
        assert_eq!((a.id, a.view + 1), (b.id, b.view));
        // Node 5 joins both groups: a new region, a fresh id.
        let third = RegionMap::derive(
            &views(&[(1, &[0, 1, 5]), (2, &[2, 3, 4, 5])]),
            Some(&second),
        );
        let fresh = third.region_of(NodeId(5)).unwrap().id;
        assert!(second.regions().iter().all(|r| r.id != fresh));
    }

    #[test]
    fn addresses_stay_in_the_scoped_block() {
        let base = Ipv4Addr::new(239, 255, 0, 0);
        assert_eq!(
            multicast_address(base, RegionId(5)),
            Ipv4Addr::new(239, 255, 0, 5)
        );
        assert_eq!(multicast_address(base, RegionId(0x1_0000)).octets()[0], 239);
    }
}
