//! The simulated network: nodes (routers, some hosting a member), full-duplex
//! links with bandwidth (serialisation delay and a drop-tail queue),
//! propagation delay and independent loss, shortest-path unicast routing and
//! IP multicast along the shortest-path tree from the sender.

use std::collections::{BTreeMap, VecDeque};

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    pub bandwidth_bps: f64,
    pub delay_ns: u64,
    /// Independent drop probability per packet.
    pub loss: f64,
    /// Packets waiting or in transmission, at most (drop-tail).
    pub queue_packets: usize,
}

impl LinkSpec {
    /// The papers' ns-2 links: 1.5 Mbit/s; 5 ms propagation (ours: the papers
    /// give none); 50-packet queues.
    pub fn paper(loss: f64) -> LinkSpec {
        LinkSpec {
            bandwidth_bps: 1.5e6,
            delay_ns: 5_000_000,
            loss,
            queue_packets: 50,
        }
    }
}

/// Nodes `0..nodes` and undirected links between them.
#[derive(Debug, Clone)]
pub struct Topology {
    pub nodes: usize,
    pub links: Vec<(usize, usize, LinkSpec)>,
}

impl Topology {
    /// Node 0 is the router; leaves are 1..=leaves.
    pub fn star(leaves: usize, spec: LinkSpec) -> Topology {
        Topology {
            nodes: leaves + 1,
            links: (1..=leaves).map(|leaf| (0, leaf, spec)).collect(),
        }
    }

    /// A balanced tree numbered breadth-first from the root (node 0):
    /// `depth` levels below the root, each node with `branching` children.
    pub fn tree(depth: u32, branching: usize, spec: LinkSpec) -> Topology {
        let mut links = Vec::new();
        let mut level = vec![0usize];
        let mut next_id = 1;
        for _ in 0..depth {
            let mut next = Vec::new();
            for parent in level {
                for _ in 0..branching {
                    links.push((parent, next_id, spec));
                    next.push(next_id);
                    next_id += 1;
                }
            }
            level = next;
        }
        Topology {
            nodes: next_id,
            links,
        }
    }

    /// A tree of exactly `nodes` nodes and exactly `depth` levels below the
    /// root (P001 Fig 1: "trees of 20-80 nodes, depth 4"). Level sizes grow
    /// geometrically, 1, r, r², ... with r chosen so they add up to `nodes`
    /// (rounded through their running sums, each level at least one node),
    /// and each level's nodes share out the next level's evenly, dealt
    /// round-robin so the extras spread across the root's subtrees (at
    /// n = 100: 38, 35 and 26 nodes under the root's three children).
    /// So the shape changes smoothly with `nodes`: a tree filled
    /// breadth-first with a whole branching factor instead jumps from
    /// branching 2 to 3 between 31 and 32 nodes, and at 40 nodes is only 3
    /// levels deep. Numbered breadth-first from the root (node 0).
    pub fn tree_of(nodes: usize, depth: u32, spec: LinkSpec) -> Topology {
        let depth = depth as usize;
        assert!(nodes > depth, "a tree {depth} levels deep needs more nodes");
        let sizes = graded_levels(nodes, depth);
        let mut links = Vec::with_capacity(nodes - 1);
        let mut first = 0; // first node of the level above
        for pair in sizes.windows(2) {
            let (above, level) = (pair[0], pair[1]);
            let start = first + above;
            for j in 0..level {
                links.push((first + j % above, start + j, spec));
            }
            first = start;
        }
        Topology { nodes, links }
    }

    /// A tree of `nodes` nodes filled breadth-first, every node with
    /// `branching` children until the nodes run out (node v's parent is
    /// (v - 1) / branching). Its depth is whatever the count gives.
    pub fn tree_breadth_first(nodes: usize, branching: usize, spec: LinkSpec) -> Topology {
        let branching = branching.max(1);
        let links = (1..nodes).map(|v| ((v - 1) / branching, v, spec)).collect();
        Topology { nodes, links }
    }

    /// Two LANs (each a switch with its hosts) joined by one link between
    /// the switches (P001 Fig 7). Nodes: switch A = 0, switch B = 1, then A's
    /// `a` hosts, then B's `b` hosts.
    pub fn two_clusters(a: usize, b: usize, lan: LinkSpec, bridge: LinkSpec) -> Topology {
        let mut links = vec![(0, 1, bridge)];
        links.extend((0..a).map(|i| (0, 2 + i, lan)));
        links.extend((0..b).map(|i| (1, 2 + a + i, lan)));
        Topology {
            nodes: 2 + a + b,
            links,
        }
    }

    /// Nodes 0..n in a line.
    pub fn chain(n: usize, spec: LinkSpec) -> Topology {
        Topology {
            nodes: n,
            links: (1..n).map(|i| (i - 1, i, spec)).collect(),
        }
    }

    /// Each node's parent when the topology, a tree, hangs from `root`
    /// (`None` for the root); `None` if the topology is not a tree
    /// (a cycle, a link twice, or a node cut off).
    pub fn tree_parents(&self, root: usize) -> Option<Vec<Option<usize>>> {
        if root >= self.nodes || self.links.len() + 1 != self.nodes {
            return None;
        }
        let mut adjacent: Vec<Vec<usize>> = vec![Vec::new(); self.nodes];
        for &(a, b, _) in &self.links {
            adjacent[a].push(b);
            adjacent[b].push(a);
        }
        let mut parent = vec![None; self.nodes];
        let mut seen = vec![false; self.nodes];
        seen[root] = true;
        let mut queue = VecDeque::from([root]);
        while let Some(v) = queue.pop_front() {
            for &w in &adjacent[v] {
                if !seen[w] {
                    seen[w] = true;
                    parent[w] = Some(v);
                    queue.push_back(w);
                }
            }
        }
        seen.iter().all(|s| *s).then_some(parent)
    }
}

/// The sizes of levels 0..=depth of [`Topology::tree_of`]: 1, r, r², ...
/// through rounded running sums, adding up to `nodes`, each at least 1.
fn graded_levels(nodes: usize, depth: usize) -> Vec<usize> {
    let total = |r: f64| (0..=depth).map(|k| r.powi(k as i32)).sum::<f64>();
    let (mut low, mut high) = (0.0_f64, nodes as f64);
    for _ in 0..100 {
        let mid = (low + high) / 2.0;
        if total(mid) < nodes as f64 {
            low = mid;
        } else {
            high = mid;
        }
    }
    let r = (low + high) / 2.0;
    let mut sizes = Vec::with_capacity(depth + 1);
    let (mut running, mut placed) = (0.0, 0);
    for k in 0..=depth {
        running += r.powi(k as i32);
        let upto = if k == depth {
            nodes
        } else {
            (running.round() as usize)
                .max(placed + 1)
                .min(nodes - (depth - k))
        };
        sizes.push(upto - placed);
        placed = upto;
    }
    sizes
}

/// One direction of a link, with its queue and counters. Every hop of
/// every packet reads and writes one link's record, and a 10^4-member run
/// has some 20,000 of them, mostly out of the core's cache: the record is
/// 128 bytes and aligned to that, so it takes one 128-byte pair of cache
/// lines (which the hardware fetches together) instead of up to three
/// lines; a watched link's packet counts per kind live in
/// [`Network::kinds`], not here.
#[derive(Debug)]
#[repr(align(128))]
pub struct Link {
    pub from: usize,
    pub to: usize,
    pub spec: LinkSpec,
    busy_until: u64,
    /// Departure times of packets queued or in transmission.
    queue: Departures,
    pub bytes: u64,
    pub packets: u64,
    pub dropped_loss: u64,
    pub dropped_queue: u64,
}

/// Departure times held in the link's own record.
const DEPARTURES_INLINE: usize = 2;

/// A link's departure times, oldest first: a first-in first-out queue
/// whose oldest [`DEPARTURES_INLINE`] entries live in the link's record
/// and only the rest in a heap buffer. A link's queue is short but for
/// bursts, and writing a departure into a separate buffer last touched
/// long ago was a cache miss per packet and hop (about 10% of a
/// 9,841-member run).
#[derive(Debug, Default)]
struct Departures {
    /// `ring[(start + i) % DEPARTURES_INLINE]` for `i < len`.
    ring: [u64; DEPARTURES_INLINE],
    start: u8,
    len: u8,
    /// Newer than every entry of `ring`; empty unless `ring` is full.
    /// Boxed, so that a link that never queues more than `ring` holds
    /// costs 8 bytes of its record, not a deque's 32.
    #[allow(clippy::box_collection)] // the box is the point: 8 bytes, not 32
    more: Option<Box<VecDeque<u64>>>,
}

impl Departures {
    fn len(&self) -> usize {
        usize::from(self.len) + self.more.as_ref().map_or(0, |more| more.len())
    }

    fn front(&self) -> Option<&u64> {
        (self.len > 0).then(|| &self.ring[usize::from(self.start)])
    }

    fn push_back(&mut self, departure: u64) {
        let more_empty = self.more.as_ref().is_none_or(|more| more.is_empty());
        if usize::from(self.len) < DEPARTURES_INLINE && more_empty {
            let at = (usize::from(self.start) + usize::from(self.len)) % DEPARTURES_INLINE;
            self.ring[at] = departure;
            self.len += 1;
        } else {
            self.more.get_or_insert_default().push_back(departure);
        }
    }

    fn pop_front(&mut self) -> Option<u64> {
        let first = *self.front()?;
        self.start = ((usize::from(self.start) + 1) % DEPARTURES_INLINE) as u8;
        self.len -= 1;
        if let Some(next) = self.more.as_mut().and_then(|more| more.pop_front()) {
            let at = (usize::from(self.start) + usize::from(self.len)) % DEPARTURES_INLINE;
            self.ring[at] = next;
            self.len += 1;
        }
        Some(first)
    }

    fn clear(&mut self) {
        self.start = 0;
        self.len = 0;
        // Reads only the deque's own fields when it holds nothing.
        if let Some(more) = &mut self.more {
            more.clear();
        }
    }
}

/// What happened to a packet offered to a link.
pub enum Offer {
    /// It arrives at the far end at this time.
    Arrives(u64),
    Lost,
}

impl Link {
    /// Queues a packet of `len` bytes at `now`; `roll` is a uniform [0, 1).
    pub fn offer(&mut self, now: u64, len: usize, roll: f64) -> Offer {
        self.offer_with(now, len, roll, true)
    }

    /// The earliest time from `at` when the queue has room for a packet (a
    /// sender's blocking socket waits until then).
    pub fn room_at(&mut self, mut at: u64) -> u64 {
        self.forget_departed(at);
        while self.queue.len() >= self.spec.queue_packets.max(1) {
            at = at.max(*self.queue.front().expect("non-empty"));
            self.forget_departed(at);
        }
        at
    }

    fn forget_departed(&mut self, now: u64) {
        // An idle link has sent everything: no need to read the queue (at
        // 10^5 links, each read is a cache miss).
        if self.busy_until <= now {
            self.queue.clear();
            return;
        }
        while self.queue.front().is_some_and(|d| *d <= now) {
            self.queue.pop_front();
        }
    }

    /// As [`Link::offer`]; with `bounded` false the queue takes the packet
    /// whatever its length (the caller waited for room, [`Link::room_at`]).
    pub fn offer_with(&mut self, now: u64, len: usize, roll: f64, bounded: bool) -> Offer {
        self.forget_departed(now);
        if bounded && self.queue.len() >= self.spec.queue_packets {
            self.dropped_queue += 1;
            return Offer::Lost;
        }
        let serialisation = (len as f64 * 8.0 / self.spec.bandwidth_bps * 1e9) as u64;
        let depart = self.busy_until.max(now) + serialisation;
        self.busy_until = depart;
        self.queue.push_back(depart);
        self.bytes += len as u64;
        self.packets += 1;
        // Loss after the queue: the packet used the link, then was corrupted.
        if roll < self.spec.loss {
            self.dropped_loss += 1;
            return Offer::Lost;
        }
        Offer::Arrives(depart + self.spec.delay_ns)
    }
}

/// Links and routes.
pub struct Network {
    pub links: Vec<Link>,
    /// Packets per kind offered to each watched link, by link index.
    watched: BTreeMap<usize, Box<[u64; shoal_wire::KIND_COUNT]>>,
    /// Per node: (neighbour, directed link index).
    adjacency: Vec<Vec<(usize, usize)>>,
    /// Nodes hosting a member.
    is_host: Vec<bool>,
    routes: Routes,
}

/// How routes are found. In a tree (every topology but the overlays is one)
/// the one path between two nodes follows from the tree's shape, held in
/// O(nodes); in any other graph they are computed lazily by breadth-first
/// search and cached, per destination for unicast and per source for
/// multicast, which costs O(nodes) per destination or source used.
enum Routes {
    Tree(TreeRoutes),
    Graph {
        /// Per destination: per node, the link to take next.
        next_hop: Vec<Option<Vec<u32>>>,
        /// Per source: per node, the links to forward a multicast on.
        tree: Vec<Option<Vec<Vec<u32>>>>,
    },
}

/// A tree's shape, rooted at node 0: a subtree is a range of preorder
/// numbers, so whether a destination lies below a node, and below which
/// child, takes a comparison and a binary search.
struct TreeRoutes {
    /// Per node: its parent (the root: itself) and the link up to it.
    parent: Vec<u32>,
    up: Vec<u32>,
    /// Per node: its preorder number, and one past its subtree's last.
    enter: Vec<u32>,
    exit: Vec<u32>,
    /// Node v's children are `children[child_start[v]..child_start[v + 1]]`,
    /// each (preorder number, link down to it), ascending.
    child_start: Vec<u32>,
    children: Vec<(u32, u32)>,
    /// Per node: members hosted in its subtree.
    hosts_below: Vec<u32>,
    hosts: u32,
}

impl TreeRoutes {
    /// The routes of the graph, if it is a tree (connected, nodes - 1 links).
    fn new(
        adjacency: &[Vec<(usize, usize)>],
        is_host: &[bool],
        links: usize,
    ) -> Option<TreeRoutes> {
        let n = adjacency.len();
        if n == 0 || links != 2 * (n - 1) {
            return None;
        }
        let mut parent = vec![NONE; n];
        let mut up = vec![NONE; n];
        let mut order = Vec::with_capacity(n);
        let mut queue = VecDeque::from([0usize]);
        parent[0] = 0;
        while let Some(v) = queue.pop_front() {
            order.push(v);
            for &(u, link) in &adjacency[v] {
                if parent[u] == NONE {
                    parent[u] = v as u32;
                    // Links come in pairs: 2k and 2k + 1 are the two ways.
                    up[u] = (link ^ 1) as u32;
                    queue.push_back(u);
                }
            }
        }
        if order.len() != n {
            return None;
        }
        let mut hosts_below: Vec<u32> = is_host.iter().map(|&h| u32::from(h)).collect();
        for &v in order.iter().rev().filter(|&&v| v != 0) {
            hosts_below[parent[v] as usize] += hosts_below[v];
        }
        // Preorder numbers by an explicit depth-first walk.
        let mut enter = vec![0; n];
        let mut exit = vec![0; n];
        let mut next = 0u32;
        let mut stack = vec![(0usize, false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                exit[v] = next;
                continue;
            }
            enter[v] = next;
            next += 1;
            stack.push((v, true));
            for &(u, _) in adjacency[v].iter().rev() {
                if u != 0 && parent[u] as usize == v {
                    stack.push((u, false));
                }
            }
        }
        let mut child_start = Vec::with_capacity(n + 1);
        let mut children = Vec::with_capacity(n - 1);
        for (v, neighbours) in adjacency.iter().enumerate() {
            child_start.push(children.len() as u32);
            let first = children.len();
            for &(u, link) in neighbours {
                if u != 0 && parent[u] as usize == v {
                    children.push((enter[u], link as u32));
                }
            }
            children[first..].sort_unstable();
        }
        child_start.push(children.len() as u32);
        let hosts = hosts_below[0];
        Some(TreeRoutes {
            parent,
            up,
            enter,
            exit,
            child_start,
            children,
            hosts_below,
            hosts,
        })
    }

    fn children(&self, v: usize) -> &[(u32, u32)] {
        &self.children[self.child_start[v] as usize..self.child_start[v + 1] as usize]
    }

    fn route(&self, at: usize, dst: usize) -> Option<usize> {
        if at == dst {
            return None;
        }
        let target = self.enter[dst];
        if self.enter[at] < target && target < self.exit[at] {
            let children = self.children(at);
            let i = children.partition_point(|&(enter, _)| enter <= target);
            return Some(children[i - 1].1 as usize);
        }
        Some(self.up[at] as usize)
    }

    /// The links on which `at` forwards a multicast from `source`: every
    /// link but the one towards the source whose far side hosts a member,
    /// ordered by the node at the far end; into `out` (emptied first).
    fn multicast_links(&self, links: &[Link], source: usize, at: usize, out: &mut Vec<u32>) {
        out.clear();
        let toward_source = self.route(at, source).map(|l| links[l].to);
        if at != 0 {
            let p = self.parent[at] as usize;
            if Some(p) != toward_source && self.hosts > self.hosts_below[at] {
                out.push(self.up[at]);
            }
        }
        for &(_, link) in self.children(at) {
            let c = links[link as usize].to;
            if Some(c) != toward_source && self.hosts_below[c] > 0 {
                out.push(link);
            }
        }
        out.sort_unstable_by_key(|&link| links[link as usize].to);
    }
}

const NONE: u32 = u32::MAX;

impl Network {
    pub fn new(topology: &Topology, hosts: &[usize]) -> Network {
        let mut links = Vec::new();
        let mut adjacency = vec![Vec::new(); topology.nodes];
        for &(a, b, spec) in &topology.links {
            for (from, to) in [(a, b), (b, a)] {
                adjacency[from].push((to, links.len()));
                links.push(Link {
                    from,
                    to,
                    spec,
                    busy_until: 0,
                    queue: Departures::default(),
                    bytes: 0,
                    packets: 0,
                    dropped_loss: 0,
                    dropped_queue: 0,
                });
            }
        }
        let mut is_host = vec![false; topology.nodes];
        for &h in hosts {
            is_host[h] = true;
        }
        let routes = match TreeRoutes::new(&adjacency, &is_host, links.len()) {
            Some(tree) => Routes::Tree(tree),
            None => Routes::Graph {
                next_hop: vec![None; topology.nodes],
                tree: vec![None; topology.nodes],
            },
        };
        Network {
            links,
            watched: BTreeMap::new(),
            adjacency,
            is_host,
            routes,
        }
    }

    /// As [`Network::new`], routing by breadth-first search whatever the
    /// shape (to check the tree routes against).
    #[cfg(test)]
    fn with_graph_routes(topology: &Topology, hosts: &[usize]) -> Network {
        let mut network = Network::new(topology, hosts);
        network.routes = Routes::Graph {
            next_hop: vec![None; topology.nodes],
            tree: vec![None; topology.nodes],
        };
        network
    }

    /// Starts counting packets per kind on the links from `from` to `to`.
    pub fn watch(&mut self, from: usize, to: usize) {
        for (i, l) in self.links.iter().enumerate() {
            if l.from == from && l.to == to {
                self.watched
                    .insert(i, Box::new([0; shoal_wire::KIND_COUNT]));
            }
        }
    }

    /// Packets per kind offered to link `link` so far, if it is watched
    /// ([`Network::watch`]).
    pub fn kinds(&self, link: usize) -> Option<&[u64; shoal_wire::KIND_COUNT]> {
        self.watched.get(&link).map(|kinds| &**kinds)
    }

    /// Counts `datagram`'s packets on link `link` if it is watched.
    pub(crate) fn count_kinds(&mut self, link: usize, datagram: &[u8]) {
        if self.watched.is_empty() {
            return;
        }
        if let Some(kinds) = self.watched.get_mut(&link) {
            crate::metrics::count_kinds(datagram, kinds);
        }
    }

    /// Hops from `root` to every node (`u32::MAX` if unreachable).
    pub fn hops_from(&self, root: usize) -> Vec<u32> {
        let (parent, _) = bfs(&self.adjacency, root);
        (0..parent.len())
            .map(|v| {
                if parent[v] == usize::MAX {
                    NONE
                } else {
                    depth(&parent, v) as u32
                }
            })
            .collect()
    }

    /// The link `at` takes towards `dst`, if `dst` is reachable.
    pub fn route(&mut self, at: usize, dst: usize) -> Option<usize> {
        match &mut self.routes {
            Routes::Tree(tree) => tree.route(at, dst),
            Routes::Graph { next_hop, .. } => {
                let hops = next_hop[dst].get_or_insert_with(|| {
                    // BFS from the destination: each node's parent link, reversed.
                    let (_, via) = bfs(&self.adjacency, dst);
                    via.iter()
                        .map(|&l| if l == NONE { NONE } else { l ^ 1 })
                        .collect()
                });
                let hop = hops[at];
                (hop != NONE).then_some(hop as usize)
            }
        }
    }

    /// Links on which `at` forwards a multicast from `source`: the
    /// shortest-path tree's child links whose subtree holds a member, in
    /// the order of the nodes they lead to.
    pub fn multicast_links(&mut self, source: usize, at: usize) -> Vec<u32> {
        let mut out = Vec::new();
        self.multicast_links_into(source, at, &mut out);
        out
    }

    /// As [`Network::multicast_links`], into `out` (emptied first), so a
    /// caller forwarding millions of packets reuses one vector.
    pub fn multicast_links_into(&mut self, source: usize, at: usize, out: &mut Vec<u32>) {
        match &mut self.routes {
            Routes::Tree(tree) => tree.multicast_links(&self.links, source, at, out),
            Routes::Graph { tree, .. } => {
                let links = &tree[source]
                    .get_or_insert_with(|| build_tree(&self.adjacency, &self.is_host, source))[at];
                out.clear();
                out.extend_from_slice(links);
            }
        }
    }
}

/// BFS parents from `root`: (parent node, link from parent to node).
fn bfs(adjacency: &[Vec<(usize, usize)>], root: usize) -> (Vec<usize>, Vec<u32>) {
    let n = adjacency.len();
    let mut parent = vec![usize::MAX; n];
    let mut via = vec![NONE; n];
    let mut queue = VecDeque::from([root]);
    parent[root] = root;
    while let Some(v) = queue.pop_front() {
        for &(u, link) in &adjacency[v] {
            if parent[u] == usize::MAX {
                parent[u] = v;
                via[u] = link as u32;
                queue.push_back(u);
            }
        }
    }
    (parent, via)
}

/// Per node, the links on which it forwards a multicast from `source`.
fn build_tree(adjacency: &[Vec<(usize, usize)>], is_host: &[bool], source: usize) -> Vec<Vec<u32>> {
    let n = adjacency.len();
    let (parent, via) = bfs(adjacency, source);
    let mut order: Vec<usize> = (0..n).filter(|v| parent[*v] != usize::MAX).collect();
    order.sort_by_key(|v| depth(&parent, *v));
    let mut useful = is_host.to_vec();
    for &v in order.iter().rev() {
        if v != source && useful[v] {
            useful[parent[v]] = true;
        }
    }
    let mut children = vec![Vec::new(); n];
    for &v in &order {
        if v != source && useful[v] {
            children[parent[v]].push(via[v]);
        }
    }
    children
}

fn depth(parent: &[usize], mut v: usize) -> usize {
    let mut d = 0;
    while parent[v] != v {
        v = parent[v];
        d += 1;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline departure queue behaves as a `VecDeque` under random
    /// pushes, pops and clears, across its spill into the heap buffer.
    #[test]
    fn departures_are_a_fifo_queue() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(3);
        let mut ours = Departures::default();
        let mut model = VecDeque::new();
        for step in 0..200_000u64 {
            match rng.random_range(0..100) {
                0 => {
                    ours.clear();
                    model.clear();
                }
                1..=50 => {
                    ours.push_back(step);
                    model.push_back(step);
                }
                _ => assert_eq!(ours.pop_front(), model.pop_front()),
            }
            assert_eq!(ours.len(), model.len());
            assert_eq!(ours.front(), model.front());
        }
    }

    #[test]
    fn a_link_record_is_one_aligned_pair_of_cache_lines() {
        assert_eq!(std::mem::size_of::<Link>(), 128);
        assert_eq!(std::mem::align_of::<Link>(), 128);
    }

    #[test]
    fn tree_sizes_match_depth_and_branching() {
        let t = Topology::tree(6, 3, LinkSpec::paper(0.0));
        assert_eq!(t.nodes, 1093);
        assert_eq!(t.links.len(), 1092);
    }

    #[test]
    fn tree_of_has_the_size_and_depth_asked() {
        for n in [5, 20, 30, 40, 80, 100, 500] {
            for depth in [4, 6] {
                if n <= depth {
                    continue;
                }
                let t = Topology::tree_of(n, depth as u32, LinkSpec::paper(0.0));
                assert_eq!((t.nodes, t.links.len()), (n, n - 1));
                let hops = Network::new(&t, &[0]).hops_from(0);
                assert_eq!(hops.iter().max(), Some(&(depth as u32)), "n={n}");
                let mut per_level = vec![0; depth + 1];
                for &h in &hops {
                    per_level[h as usize] += 1;
                }
                assert!(per_level.windows(2).all(|w| w[0] <= w[1]), "{per_level:?}");
            }
        }
    }

    /// The dense trees of P001 Figs 1, 3 and 8 (20-100 nodes, depth 4) get
    /// deeper on average as they grow, with no dip where a whole branching
    /// factor would jump (a breadth-first tree with branching 3 has 40
    /// nodes in 3 levels, shallower than 30 nodes with branching 2).
    #[test]
    fn dense_trees_deepen_smoothly_with_size() {
        let mean_depth = |n: usize| {
            let t = Topology::tree_of(n, 4, LinkSpec::paper(0.0));
            let hops = Network::new(&t, &[0]).hops_from(0);
            hops.iter().sum::<u32>() as f64 / n as f64
        };
        let sizes: Vec<usize> = (20..=100).step_by(10).collect();
        for w in sizes.windows(2) {
            assert!(mean_depth(w[1]) > mean_depth(w[0]), "{w:?}");
        }
        let breadth_first = |n: usize| {
            let t =
                Topology::tree_breadth_first(n, if n < 32 { 2 } else { 3 }, LinkSpec::paper(0.0));
            let hops = Network::new(&t, &[0]).hops_from(0);
            hops.iter().sum::<u32>() as f64 / n as f64
        };
        assert!(breadth_first(40) < breadth_first(30), "the dip this avoids");
    }

    #[test]
    fn two_clusters_cross_one_bridge() {
        let t = Topology::two_clusters(3, 2, LinkSpec::paper(0.0), LinkSpec::paper(0.0));
        let net = Network::new(&t, &[]);
        let hops = net.hops_from(2);
        assert_eq!(hops[3], 2, "same LAN: host-switch-host");
        assert_eq!(hops[5], 3, "other LAN: host-switch-switch-host");
    }

    #[test]
    fn serialisation_delay_and_queue_drops() {
        let spec = LinkSpec {
            bandwidth_bps: 8e6, // 1 byte per µs
            delay_ns: 1_000,
            loss: 0.0,
            queue_packets: 2,
        };
        let t = Topology::chain(2, spec);
        let mut net = Network::new(&t, &[0, 1]);
        let link = net.route(0, 1).unwrap();
        let l = &mut net.links[link];
        assert!(matches!(l.offer(0, 1000, 0.5), Offer::Arrives(1_001_000)));
        assert!(matches!(l.offer(0, 1000, 0.5), Offer::Arrives(2_001_000)));
        assert!(matches!(l.offer(0, 1000, 0.5), Offer::Lost));
        assert_eq!(l.dropped_queue, 1);
        // After the first departs there is room again.
        assert!(matches!(
            l.offer(1_000_000, 1000, 0.5),
            Offer::Arrives(3_001_000)
        ));
    }

    #[test]
    fn loss_uses_the_roll() {
        let t = Topology::chain(2, LinkSpec::paper(0.1));
        let mut net = Network::new(&t, &[0, 1]);
        let l = &mut net.links[0];
        assert!(matches!(l.offer(0, 10, 0.05), Offer::Lost));
        assert!(matches!(l.offer(0, 10, 0.5), Offer::Arrives(_)));
    }

    #[test]
    fn multicast_tree_reaches_each_member_once_and_prunes_empty_branches() {
        let t = Topology::tree(2, 2, LinkSpec::paper(0.0)); // 7 nodes
                                                            // Members: root and the two leaves under node 1 only.
        let mut net = Network::new(&t, &[0, 3, 4]);
        let mut reached = vec![0; t.nodes];
        let mut frontier = vec![0usize];
        while let Some(v) = frontier.pop() {
            for &l in net.multicast_links(0, v).iter() {
                let to = net.links[l as usize].to;
                reached[to] += 1;
                frontier.push(to);
            }
        }
        assert_eq!(reached, vec![0, 1, 0, 1, 1, 0, 0]);
    }

    /// Tree routes (from the tree's shape) are the routes breadth-first
    /// search finds, unicast and multicast, link for link and in order.
    #[test]
    fn tree_routes_are_the_breadth_first_routes() {
        let spec = LinkSpec::paper(0.0);
        let topologies = [
            Topology::tree(3, 3, spec),
            Topology::tree_of(40, 4, spec),
            Topology::star(6, spec),
            Topology::chain(5, spec),
            Topology::two_clusters(3, 4, spec, spec),
        ];
        for t in &topologies {
            let all: Vec<usize> = (0..t.nodes).collect();
            let some: Vec<usize> = (0..t.nodes).filter(|v| v % 3 == 1).collect();
            for hosts in [&all, &some] {
                let mut tree = Network::new(t, hosts);
                assert!(matches!(tree.routes, Routes::Tree(_)));
                let mut graph = Network::with_graph_routes(t, hosts);
                for a in 0..t.nodes {
                    for b in 0..t.nodes {
                        assert_eq!(tree.route(a, b), graph.route(a, b), "route {a}->{b}");
                        assert_eq!(
                            tree.multicast_links(a, b),
                            graph.multicast_links(a, b),
                            "multicast from {a} at {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_graph_with_a_cycle_is_routed_by_search() {
        let spec = LinkSpec::paper(0.0);
        let ring = Topology {
            nodes: 4,
            links: vec![(0, 1, spec), (1, 2, spec), (2, 3, spec), (3, 0, spec)],
        };
        let mut net = Network::new(&ring, &[0, 1, 2, 3]);
        assert!(matches!(net.routes, Routes::Graph { .. }));
        let link = net.route(0, 3).unwrap();
        assert_eq!((net.links[link].from, net.links[link].to), (0, 3));
    }

    #[test]
    fn unicast_follows_the_tree_path() {
        let t = Topology::tree(2, 2, LinkSpec::paper(0.0));
        let mut net = Network::new(&t, &[3, 6]);
        let mut at = 3;
        let mut path = vec![3];
        while at != 6 {
            let link = net.route(at, 6).unwrap();
            at = net.links[link].to;
            path.push(at);
        }
        assert_eq!(path, vec![3, 1, 0, 2, 6]);
    }
}
