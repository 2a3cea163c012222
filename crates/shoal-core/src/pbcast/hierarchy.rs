//! Hierarchical gossip held per distance class (P001 §D): a member gossips
//! to a member at tree distance `d` with weight proportional to `1/k^d`,
//! `k` the tree's branching factor.
//!
//! [`super::Pbcast::set_gossip_weights`] holds one weight per member, so a
//! group of `n` holds `n²` weights (1.2 GB at 10^4 members). Here the tree
//! is held once for the whole group ([`GossipTree`], O(nodes), shared by
//! every member's engine through an `Arc`), and each member keeps only the
//! number of members at each distance and the cumulative weight of each
//! distance class ([`TreeTargets`], O(tree depth)). A target is chosen by
//! drawing a distance with the classes' weights (`count_d / k^d`), then a
//! member uniformly among those at that distance: the same distribution as
//! the per-member weights `1/k^d`, in two draws instead of one.
//!
//! The distance is the hop count in the tree between the members' nodes
//! (members may sit at inner nodes, as routers' hosts do in the papers'
//! topologies, or several at one node, at distance 0 from each other).

use std::sync::Arc;

use rand::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::ConfigError;
use crate::engine::NodeId;

/// A rooted tree of nodes, some of which host group members. Built once
/// and shared by every member's engine.
#[derive(Debug)]
pub struct GossipTree {
    /// Per node: its parent (`NO_PARENT` for the root).
    parent: Vec<u32>,
    /// Per node: levels below the root.
    depth: Vec<u32>,
    /// Per node: where its members-per-depth spans start in `spans`; its
    /// spans cover depths `depth..depth + (next start - start)`.
    span_start: Vec<u32>,
    /// Per node and per depth at or below it: the half-open range of
    /// `by_depth[depth]` holding the members in its subtree at that depth.
    spans: Vec<(u32, u32)>,
    /// Per depth: the members at nodes of that depth, ordered by their
    /// node's preorder position, then by id (so a subtree's members at one
    /// depth are one contiguous run): (preorder position, member).
    by_depth: Vec<Vec<(u32, NodeId)>>,
    /// Members and their nodes, sorted by member.
    members: Vec<(NodeId, u32)>,
}

const NO_PARENT: u32 = u32::MAX;

impl GossipTree {
    /// The tree whose node `v` has parent `parents[v]` (exactly one root,
    /// `None`), with member `m` at node `node` for each `(m, node)` of
    /// `members` (ids distinct; several members may share a node).
    pub fn new(
        parents: &[Option<usize>],
        members: &[(NodeId, usize)],
    ) -> Result<Self, ConfigError> {
        let bad = |why: &str| Err(ConfigError::BadTree(why.to_string()));
        let nodes = parents.len();
        if nodes == 0 || nodes >= NO_PARENT as usize {
            return bad("between 1 and 2^32 - 2 nodes");
        }
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); nodes];
        let mut root = None;
        for (v, p) in parents.iter().enumerate() {
            match *p {
                None if root.is_some() => return bad("more than one root"),
                None => root = Some(v),
                Some(p) if p >= nodes || p == v => return bad("a parent out of range or itself"),
                Some(p) => children[p].push(v as u32),
            }
        }
        let Some(root) = root else {
            return bad("no root");
        };
        // Preorder positions and depths, by an explicit stack.
        let mut pre = vec![u32::MAX; nodes];
        let mut depth = vec![0u32; nodes];
        let mut order = Vec::with_capacity(nodes);
        let mut stack = vec![root as u32];
        while let Some(v) = stack.pop() {
            pre[v as usize] = order.len() as u32;
            order.push(v);
            for &c in children[v as usize].iter().rev() {
                depth[c as usize] = depth[v as usize] + 1;
                stack.push(c);
            }
        }
        if order.len() != nodes {
            return bad("a cycle: not every node is below the root");
        }
        // Subtree ends (preorder) and heights, children before parents.
        let mut end = vec![0u32; nodes];
        let mut height = vec![0u32; nodes];
        for &v in order.iter().rev() {
            let v = v as usize;
            end[v] = pre[v] + 1;
            for &c in &children[v] {
                end[v] = end[v].max(end[c as usize]);
                height[v] = height[v].max(height[c as usize] + 1);
            }
        }
        let mut sorted: Vec<(NodeId, u32)> = Vec::with_capacity(members.len());
        for &(m, node) in members {
            if node >= nodes {
                return bad("a member's node out of range");
            }
            sorted.push((m, node as u32));
        }
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0].0 == w[1].0) {
            return bad("a member listed twice");
        }
        let max_depth = depth.iter().copied().max().unwrap_or(0) as usize;
        let mut by_depth: Vec<Vec<(u32, NodeId)>> = vec![Vec::new(); max_depth + 1];
        for &(m, node) in &sorted {
            by_depth[depth[node as usize] as usize].push((pre[node as usize], m));
        }
        for level in &mut by_depth {
            level.sort_unstable();
        }
        let mut span_start = Vec::with_capacity(nodes + 1);
        let mut spans = Vec::new();
        for v in 0..nodes {
            span_start.push(u32::try_from(spans.len()).map_err(|_| {
                ConfigError::BadTree("too deep for its size (spans past 2^32)".to_string())
            })?);
            for d in depth[v]..=depth[v] + height[v] {
                let level = &by_depth[d as usize];
                let lo = level.partition_point(|&(p, _)| p < pre[v]);
                let hi = level.partition_point(|&(p, _)| p < end[v]);
                spans.push((lo as u32, hi as u32));
            }
        }
        span_start.push(spans.len() as u32);
        let parent = parents
            .iter()
            .map(|p| p.map_or(NO_PARENT, |p| p as u32))
            .collect();
        Ok(GossipTree {
            parent,
            depth,
            span_start,
            spans,
            by_depth,
            members: sorted,
        })
    }

    /// Members in the tree.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The node member `m` sits at.
    pub fn node_of(&self, m: NodeId) -> Option<usize> {
        let i = self.members.binary_search_by_key(&m, |e| e.0).ok()?;
        Some(self.members[i].1 as usize)
    }

    /// The range of `by_depth[d]` holding node `v`'s subtree's members at
    /// depth `d` (empty if `d` is above `v` or below its subtree).
    fn span(&self, v: u32, d: u32) -> (u32, u32) {
        let v = v as usize;
        let below = d.wrapping_sub(self.depth[v]);
        let start = self.span_start[v];
        if below >= self.span_start[v + 1] - start {
            return (0, 0);
        }
        self.spans[(start + below) as usize]
    }

    /// The pieces of the class of members at distance `distance` from
    /// `me` (at `node`), calling `piece` with each piece's depth and its
    /// range of that depth's members minus a sub-range (which lies inside
    /// it), in a fixed order; `piece` returns `true` to stop.
    fn for_each_piece(
        &self,
        node: u32,
        distance: u32,
        mut piece: impl FnMut(u32, (u32, u32), (u32, u32)) -> bool,
    ) {
        // Going up `h` levels to ancestor `a`, then down `distance - h`
        // levels into `a`'s subtree, but not into the child `below` the
        // walk came from (those members are nearer).
        let mut a = node;
        let mut below = NO_PARENT;
        for h in 0..=distance {
            let d = self.depth[a as usize] + (distance - h);
            let whole = self.span(a, d);
            let inner = if below == NO_PARENT {
                (whole.0, whole.0)
            } else {
                self.span(below, d)
            };
            let inner = if inner.0 == inner.1 {
                (whole.0, whole.0)
            } else {
                inner
            };
            if whole.1 > whole.0 && piece(d, whole, inner) {
                return;
            }
            below = a;
            a = self.parent[a as usize];
            if a == NO_PARENT {
                return;
            }
        }
    }

    /// Members at each distance from member `me` at `node` (`me` itself
    /// not counted), up to the largest distance with any.
    fn class_sizes(&self, node: u32) -> Vec<u64> {
        let max_depth = (self.by_depth.len() - 1) as u32;
        let longest = self.depth[node as usize] + max_depth;
        let mut sizes: Vec<u64> = (0..=longest)
            .map(|distance| {
                let mut count = 0u64;
                self.for_each_piece(node, distance, |_, whole, inner| {
                    count += u64::from((whole.1 - whole.0) - (inner.1 - inner.0));
                    false
                });
                count
            })
            .collect();
        sizes[0] -= 1; // me
        while sizes.last() == Some(&0) {
            sizes.pop();
        }
        sizes
    }

    /// The `k`-th member (from 0) at `distance` from member `me` at `node`,
    /// `me` left out.
    fn member_at(&self, me: NodeId, node: u32, distance: u32, mut k: u64) -> Option<NodeId> {
        let mut found = None;
        self.for_each_piece(node, distance, |d, whole, inner| {
            let level = &self.by_depth[d as usize];
            // The piece as a list of indices: whole minus inner, minus me.
            let skip_me = if distance == 0 {
                let at = level.binary_search(&(level[whole.0 as usize].0, me)).ok();
                at.map(|i| i as u32)
            } else {
                None
            };
            let size =
                u64::from((whole.1 - whole.0) - (inner.1 - inner.0)) - u64::from(skip_me.is_some());
            if k >= size {
                k -= size;
                return false;
            }
            let mut i = whole.0 as u64 + k;
            if i >= u64::from(inner.0) {
                i += u64::from(inner.1 - inner.0);
            }
            if skip_me.is_some_and(|s| i >= u64::from(s)) {
                i += 1;
            }
            found = Some(level[i as usize].1);
            true
        });
        found
    }
}

/// One member's view of a [`GossipTree`]: the cumulative weight of each
/// distance class and its size. O(tree depth) memory.
#[derive(Debug, Clone)]
pub struct TreeTargets {
    tree: Arc<GossipTree>,
    me: NodeId,
    node: u32,
    /// Per distance: members at that distance.
    sizes: Vec<u64>,
    /// Per distance: the sum of the classes' weights up to it.
    cumulative: Vec<f64>,
}

impl TreeTargets {
    /// Member `me`'s classes in `tree`, a member at distance `d` weighing
    /// `base^-d` (P001: `base` is the tree's branching factor).
    pub fn new(tree: Arc<GossipTree>, me: NodeId, base: f64) -> Result<TreeTargets, ConfigError> {
        if !(base.is_finite() && base > 0.0) {
            return Err(ConfigError::BadTree(format!(
                "the weights' base must be positive and finite, got {base}"
            )));
        }
        let node = tree.node_of(me).ok_or(ConfigError::NotAMember(me.0))? as u32;
        let sizes = tree.class_sizes(node);
        let mut total = 0.0;
        let cumulative = sizes
            .iter()
            .enumerate()
            .map(|(d, &count)| {
                total += count as f64 * base.powi(-(d as i32));
                total
            })
            .collect();
        if !total.is_finite() {
            return Err(ConfigError::BadTree(format!(
                "the weights overflow with base {base}"
            )));
        }
        Ok(TreeTargets {
            tree,
            me,
            node,
            sizes,
            cumulative,
        })
    }

    /// Members at each distance (index), this member left out.
    pub fn class_sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// A target: a distance drawn with the classes' weights, then a member
    /// uniformly among those at that distance. `None` if no other member
    /// has any weight.
    pub fn pick(&self, rng: &mut Xoshiro256PlusPlus) -> Option<NodeId> {
        let total = *self.cumulative.last()?;
        if total <= 0.0 {
            return None;
        }
        let x = rng.random::<f64>() * total;
        let last = self.cumulative.len() - 1;
        let distance = self.cumulative.partition_point(|c| *c <= x).min(last);
        let size = self.sizes[distance];
        // A class of weight 0 cannot be drawn but by rounding at the end.
        let distance = if size == 0 {
            (0..=last).rev().find(|&d| self.sizes[d] > 0)?
        } else {
            distance
        };
        let k = rng.random_range(0..self.sizes[distance]);
        self.tree.member_at(self.me, self.node, distance as u32, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Hop distances between every pair of nodes, by walking up to the
    /// common ancestor (the slow way, to check against).
    fn hops(parents: &[Option<usize>], a: usize, b: usize) -> u32 {
        let up = |mut v: usize| {
            let mut path = vec![v];
            while let Some(p) = parents[v] {
                path.push(p);
                v = p;
            }
            path
        };
        let (pa, pb) = (up(a), up(b));
        let common = pa.iter().position(|v| pb.contains(v)).unwrap();
        let in_b = pb.iter().position(|v| *v == pa[common]).unwrap();
        (common + in_b) as u32
    }

    /// A tree of `nodes` nodes, each node's parent drawn among the earlier
    /// ones, and members at random nodes (some shared, some nodes empty).
    fn random_tree(
        seed: u64,
        nodes: usize,
        members: usize,
    ) -> (Vec<Option<usize>>, Vec<(NodeId, usize)>) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let parents: Vec<Option<usize>> = (0..nodes)
            .map(|v| (v > 0).then(|| rng.random_range(0..v)))
            .collect();
        let members = (0..members)
            .map(|m| (NodeId(m as u32 * 3 + 1), rng.random_range(0..nodes)))
            .collect();
        (parents, members)
    }

    #[test]
    fn classes_hold_exactly_the_members_at_each_distance() {
        for seed in 0..30 {
            let (parents, members) =
                random_tree(seed, 1 + seed as usize * 3, 1 + seed as usize * 2);
            let tree = Arc::new(GossipTree::new(&parents, &members).unwrap());
            for &(me, node) in &members {
                let targets = TreeTargets::new(tree.clone(), me, 3.0).unwrap();
                // The slow way: every other member by its hop distance.
                let mut expected: Vec<Vec<NodeId>> = Vec::new();
                for &(other, at) in &members {
                    if other == me {
                        continue;
                    }
                    let d = hops(&parents, node, at) as usize;
                    if expected.len() <= d {
                        expected.resize(d + 1, Vec::new());
                    }
                    expected[d].push(other);
                }
                let sizes: Vec<u64> = expected.iter().map(|c| c.len() as u64).collect();
                assert_eq!(
                    targets.class_sizes(),
                    &sizes[..],
                    "seed {seed} member {me:?}"
                );
                for (d, class) in expected.iter().enumerate() {
                    let mut listed: Vec<NodeId> = (0..class.len() as u64)
                        .map(|k| tree.member_at(me, node as u32, d as u32, k).unwrap())
                        .collect();
                    assert_eq!(
                        tree.member_at(me, node as u32, d as u32, class.len() as u64),
                        None
                    );
                    listed.sort();
                    let mut class = class.clone();
                    class.sort();
                    assert_eq!(listed, class, "seed {seed} member {me:?} distance {d}");
                }
            }
        }
    }

    /// Drawn targets follow the per-member weights `base^-hops`: the
    /// frequency of each member within a few standard deviations of its
    /// share, in a balanced ternary tree of depth 3 with a member at every
    /// node.
    #[test]
    fn picks_follow_the_per_member_weights() {
        let nodes = 1 + 3 + 9 + 27;
        let parents: Vec<Option<usize>> =
            (0..nodes).map(|v| (v > 0).then(|| (v - 1) / 3)).collect();
        let members: Vec<(NodeId, usize)> = (0..nodes).map(|v| (NodeId(v as u32), v)).collect();
        let tree = Arc::new(GossipTree::new(&parents, &members).unwrap());
        for me in [0usize, 5, 39] {
            let targets = TreeTargets::new(tree.clone(), NodeId(me as u32), 3.0).unwrap();
            let weight = |v: usize| 3f64.powi(-(hops(&parents, me, v) as i32));
            let total: f64 = (0..nodes).filter(|&v| v != me).map(weight).sum();
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(me as u64);
            let draws = 200_000;
            let mut seen = vec![0u32; nodes];
            for _ in 0..draws {
                seen[targets.pick(&mut rng).unwrap().0 as usize] += 1;
            }
            assert_eq!(seen[me], 0);
            for v in (0..nodes).filter(|&v| v != me) {
                let p = weight(v) / total;
                let mean = p * draws as f64;
                let sd = (mean * (1.0 - p)).sqrt();
                let got = f64::from(seen[v]);
                assert!(
                    (got - mean).abs() < 5.0 * sd + 1.0,
                    "member {me}: target {v} drawn {got} times, expected {mean:.0} ± {sd:.0}"
                );
            }
        }
    }

    #[test]
    fn bad_trees_are_refused() {
        let m = [(NodeId(1), 0)];
        assert!(GossipTree::new(&[], &m).is_err());
        assert!(GossipTree::new(&[None, None], &m).is_err());
        assert!(GossipTree::new(&[Some(1), Some(0)], &m).is_err());
        assert!(GossipTree::new(&[None, Some(2), Some(1)], &m).is_err());
        assert!(GossipTree::new(&[None, Some(0)], &[(NodeId(1), 2)]).is_err());
        assert!(GossipTree::new(&[None, Some(0)], &[(NodeId(1), 0), (NodeId(1), 1)]).is_err());
        let tree = Arc::new(GossipTree::new(&[None, Some(0)], &m).unwrap());
        assert_eq!(
            TreeTargets::new(tree.clone(), NodeId(7), 3.0).err(),
            Some(ConfigError::NotAMember(7))
        );
        assert!(TreeTargets::new(tree, NodeId(1), 0.0).is_err());
    }

    /// A member alone in its tree has no one to gossip to.
    #[test]
    fn a_lone_member_picks_no_one() {
        let tree = Arc::new(GossipTree::new(&[None, Some(0)], &[(NodeId(4), 1)]).unwrap());
        let targets = TreeTargets::new(tree, NodeId(4), 3.0).unwrap();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        assert_eq!(targets.pick(&mut rng), None);
    }
}
