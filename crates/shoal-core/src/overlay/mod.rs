//! Spread's wide-area overlay (P-Spread §2.2, §2.5): sites joined by
//! point-to-point links with a weight per direction, all-pairs shortest
//! paths by Floyd-Warshall, and one source-based shortest-path multicast
//! tree per site. Every daemon that holds the same topology and membership
//! computes the same routes, so no routing protocol runs: a membership
//! change is the only input, and the routes are recomputed from scratch.
//!
//! The paper says the trees are identical everywhere because the inputs
//! are; it leaves the tie-break between equal-cost paths implicit. Ours,
//! fixed here: among paths of equal weight the one with fewer links wins,
//! and among those the parent with the smaller site index. Weights are at
//! least 1, so every parent is strictly closer to the source and the
//! parent links form a tree.
//!
//! A site is the daemons sharing one LAN; its *gateway* carries its WAN
//! traffic. The paper chooses it "based on the current membership of the
//! site" and gives no rule; ours is the live daemon with the smallest id,
//! so a gateway that fails is replaced by the next. A daemon joining or
//! leaving a site changes at most its gateway, never the WAN routes (§2.4);
//! a site losing its last daemon, or a link declared failed, does.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::NodeId;

#[cfg(test)]
mod tests;

/// A site: a dense index into [`Topology::sites`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SiteId(pub u16);

impl std::fmt::Display for SiteId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// A site of the configuration: its name and the daemons that may run in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub name: String,
    pub daemons: Vec<NodeId>,
}

/// A potential overlay link between two sites, with a weight per direction
/// (P-Spread §2.2: "one can set weights for every potential link in every
/// direction"). A weight of `None` leaves that direction out of the overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkWeights {
    pub a: SiteId,
    pub b: SiteId,
    /// Cost of sending from `a` to `b`; at least 1.
    pub a_to_b: Option<u32>,
    /// Cost of sending from `b` to `a`; at least 1.
    pub b_to_a: Option<u32>,
}

/// The static configuration every daemon holds: sites and potential links.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    pub sites: Vec<Site>,
    pub links: Vec<LinkWeights>,
}

/// Why a topology was refused. Nothing is computed from a refused topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("link names site {0}, but there are {1} sites")]
    UnknownSite(SiteId, usize),
    #[error("link from {0} to itself")]
    SelfLink(SiteId),
    #[error("link {0}-{1} has weight 0 (weights are at least 1)")]
    ZeroWeight(SiteId, SiteId),
    #[error("daemon {0} is configured in two sites")]
    DaemonInTwoSites(NodeId),
    #[error("more than {max} sites")]
    TooManySites { max: usize },
}

/// Sites at most: P-Spread §2.5 targets 1 to 100; the dense tables cost
/// `sites²` entries.
pub const MAX_SITES: usize = 1024;

impl Topology {
    /// Every site joined to every other with weight 1 both ways: the
    /// paper's fanout network (§4.2).
    pub fn full_mesh(sites: Vec<Site>) -> Topology {
        let n = sites.len() as u16;
        let mut links = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                links.push(LinkWeights {
                    a: SiteId(a),
                    b: SiteId(b),
                    a_to_b: Some(1),
                    b_to_a: Some(1),
                });
            }
        }
        Topology { sites, links }
    }

    /// Checks the topology once, before any route is computed.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let n = self.sites.len();
        if n > MAX_SITES {
            return Err(TopologyError::TooManySites { max: MAX_SITES });
        }
        for l in &self.links {
            for s in [l.a, l.b] {
                if usize::from(s.0) >= n {
                    return Err(TopologyError::UnknownSite(s, n));
                }
            }
            if l.a == l.b {
                return Err(TopologyError::SelfLink(l.a));
            }
            if l.a_to_b == Some(0) || l.b_to_a == Some(0) {
                return Err(TopologyError::ZeroWeight(l.a, l.b));
            }
        }
        let mut seen = BTreeSet::new();
        for d in self.sites.iter().flat_map(|s| &s.daemons) {
            if !seen.insert(*d) {
                return Err(TopologyError::DaemonInTwoSites(*d));
            }
        }
        Ok(())
    }

    /// The site `daemon` is configured in.
    pub fn site_of(&self, daemon: NodeId) -> Option<SiteId> {
        self.sites
            .iter()
            .position(|s| s.daemons.contains(&daemon))
            .map(|i| SiteId(i as u16))
    }
}

/// What membership says: the live daemons and the links declared failed
/// (a Hop link past `max_nacks`, or a partition). Directed links are named
/// `(from, to)`; a failed link is out in both directions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    pub live: BTreeSet<NodeId>,
    pub failed_links: BTreeSet<(SiteId, SiteId)>,
}

const INF: u64 = u64::MAX;

/// The routes of one membership: identical on every daemon that computes
/// them from the same topology and membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    n: usize,
    /// `dist[s * n + v]`: weight of the shortest path s→v (INF: unreachable).
    dist: Vec<u64>,
    /// Links on that path (the first tie-break).
    hops: Vec<u32>,
    /// `parent[s * n + v]`: v's parent in s's tree (v itself for v = s;
    /// u16::MAX when unreachable).
    parent: Vec<u16>,
    /// `children[s][v]`: v's children in s's tree, ascending.
    children: Vec<Vec<Vec<SiteId>>>,
    gateways: Vec<Option<NodeId>>,
}

const NO_PARENT: u16 = u16::MAX;

impl Routes {
    /// Computes every route for `membership` over `topology`, which must
    /// have passed [`Topology::validate`].
    pub fn compute(topology: &Topology, membership: &Membership) -> Routes {
        let n = topology.sites.len();
        let gateways: Vec<Option<NodeId>> = topology
            .sites
            .iter()
            .map(|s| {
                let live = s.daemons.iter().filter(|d| membership.live.contains(d));
                live.copied().min()
            })
            .collect();
        let weight = direct_weights(topology, membership, &gateways);
        let live: Vec<bool> = gateways.iter().map(Option::is_some).collect();
        let (dist, hops) = floyd_warshall(n, &weight, &live);
        let parent = parents(n, &weight, &dist, &hops);
        let mut children = vec![vec![Vec::new(); n]; n];
        for s in 0..n {
            for v in 0..n {
                let p = parent[s * n + v];
                if p != NO_PARENT && usize::from(p) != v {
                    children[s][usize::from(p)].push(SiteId(v as u16));
                }
            }
        }
        Routes {
            n,
            dist,
            hops,
            parent,
            children,
            gateways,
        }
    }

    /// Sites in the topology.
    pub fn sites(&self) -> usize {
        self.n
    }

    /// The weight of the shortest path `from`→`to`, if `to` is reachable.
    pub fn distance(&self, from: SiteId, to: SiteId) -> Option<u64> {
        let d = self.dist[self.at(from, to)];
        (d != INF).then_some(d)
    }

    /// Links on the chosen path `from`→`to`, if reachable.
    pub fn hop_count(&self, from: SiteId, to: SiteId) -> Option<u32> {
        self.distance(from, to)
            .map(|_| self.hops[self.at(from, to)])
    }

    /// `at`'s parent in `source`'s tree: the site it receives `source`'s
    /// messages from. `None` for the source itself and unreachable sites.
    pub fn parent(&self, source: SiteId, at: SiteId) -> Option<SiteId> {
        let p = self.parent[self.at(source, at)];
        (p != NO_PARENT && p != at.0).then_some(SiteId(p))
    }

    /// The sites `at` forwards `source`'s messages to, ascending.
    pub fn children(&self, source: SiteId, at: SiteId) -> &[SiteId] {
        &self.children[usize::from(source.0)][usize::from(at.0)]
    }

    /// The next site on the path `from`→`to` (unicast routing).
    pub fn next_hop(&self, from: SiteId, to: SiteId) -> Option<SiteId> {
        if from == to {
            return None;
        }
        let mut v = to;
        loop {
            let p = self.parent(from, v)?;
            if p == from {
                return Some(v);
            }
            v = p;
        }
    }

    /// The daemon that carries `site`'s WAN traffic: its live daemon with
    /// the smallest id. `None` when no daemon of the site is live.
    pub fn gateway(&self, site: SiteId) -> Option<NodeId> {
        self.gateways[usize::from(site.0)]
    }

    /// The sites reachable from `source`, in the order its tree reaches
    /// them (breadth first, children ascending), `source` first.
    pub fn tree_order(&self, source: SiteId) -> Vec<SiteId> {
        if self.gateway(source).is_none() {
            return Vec::new();
        }
        let mut order = vec![source];
        let mut i = 0;
        while i < order.len() {
            order.extend_from_slice(self.children(source, order[i]));
            i += 1;
        }
        order
    }

    fn at(&self, a: SiteId, b: SiteId) -> usize {
        usize::from(a.0) * self.n + usize::from(b.0)
    }
}

/// The direct weight matrix of the live overlay: a direction is present
/// when configured, both its sites have a live daemon and the link has not
/// been declared failed.
fn direct_weights(
    topology: &Topology,
    membership: &Membership,
    gateways: &[Option<NodeId>],
) -> Vec<u64> {
    let n = topology.sites.len();
    let mut weight = vec![INF; n * n];
    for l in &topology.links {
        let (a, b) = (usize::from(l.a.0), usize::from(l.b.0));
        let failed = membership.failed_links.contains(&(l.a, l.b))
            || membership.failed_links.contains(&(l.b, l.a));
        if failed || gateways[a].is_none() || gateways[b].is_none() {
            continue;
        }
        // A link configured twice keeps its cheaper weight.
        for (from, to, w) in [(a, b, l.a_to_b), (b, a, l.b_to_a)] {
            if let Some(w) = w {
                let cell = &mut weight[from * n + to];
                *cell = (*cell).min(u64::from(w));
            }
        }
    }
    weight
}

/// All-pairs shortest paths, ordered by (weight, links).
/// A site without a live daemon reaches nothing, not even itself.
fn floyd_warshall(n: usize, weight: &[u64], live: &[bool]) -> (Vec<u64>, Vec<u32>) {
    let mut dist = weight.to_vec();
    let mut hops: Vec<u32> = weight.iter().map(|&w| u32::from(w != INF)).collect();
    for v in (0..n).filter(|&v| live[v]) {
        dist[v * n + v] = 0;
        hops[v * n + v] = 0;
    }
    for k in 0..n {
        for i in 0..n {
            let ik = dist[i * n + k];
            if ik == INF {
                continue;
            }
            for j in 0..n {
                let kj = dist[k * n + j];
                if kj == INF {
                    continue;
                }
                let through = (ik + kj, hops[i * n + k] + hops[k * n + j]);
                if through < (dist[i * n + j], hops[i * n + j]) {
                    dist[i * n + j] = through.0;
                    hops[i * n + j] = through.1;
                }
            }
        }
    }
    (dist, hops)
}

/// Each site's parent in each source's tree: the smallest-indexed
/// neighbour `p` on a best path (weight, links) to it.
fn parents(n: usize, weight: &[u64], dist: &[u64], hops: &[u32]) -> Vec<u16> {
    let mut parent = vec![NO_PARENT; n * n];
    for s in 0..n {
        for v in 0..n {
            if dist[s * n + v] == INF {
                continue;
            }
            if v == s {
                parent[s * n + v] = v as u16;
                continue;
            }
            parent[s * n + v] = (0..n)
                .find(|&p| {
                    let (sp, pv) = (dist[s * n + p], weight[p * n + v]);
                    p != v
                        && sp != INF
                        && pv != INF
                        && (sp + pv, hops[s * n + p] + 1) == (dist[s * n + v], hops[s * n + v])
                })
                .map_or(NO_PARENT, |p| p as u16);
        }
    }
    parent
}
