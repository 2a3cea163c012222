use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn sites(n: u16) -> Vec<Site> {
    (0..n)
        .map(|i| Site {
            name: format!("site{i}"),
            daemons: vec![NodeId(u32::from(i) * 10), NodeId(u32::from(i) * 10 + 1)],
        })
        .collect()
}

fn all_live(t: &Topology) -> Membership {
    Membership {
        live: t.sites.iter().flat_map(|s| s.daemons.clone()).collect(),
        failed_links: BTreeSet::new(),
    }
}

fn link(a: u16, b: u16, ab: u32, ba: u32) -> LinkWeights {
    LinkWeights {
        a: SiteId(a),
        b: SiteId(b),
        a_to_b: Some(ab),
        b_to_a: Some(ba),
    }
}

#[test]
fn a_chain_routes_along_the_chain() {
    let t = Topology {
        sites: sites(4),
        links: vec![link(0, 1, 1, 1), link(1, 2, 1, 1), link(2, 3, 1, 1)],
    };
    t.validate().unwrap();
    let r = Routes::compute(&t, &all_live(&t));
    assert_eq!(r.distance(SiteId(0), SiteId(3)), Some(3));
    assert_eq!(r.next_hop(SiteId(0), SiteId(3)), Some(SiteId(1)));
    assert_eq!(r.children(SiteId(0), SiteId(1)), &[SiteId(2)]);
    assert_eq!(r.parent(SiteId(3), SiteId(0)), Some(SiteId(1)));
    assert_eq!(r.tree_order(SiteId(2)).len(), 4);
}

#[test]
fn weights_differ_per_direction() {
    // 0→1 direct is expensive, 1→0 direct is cheap; 0→2→1 is cheap.
    let t = Topology {
        sites: sites(3),
        links: vec![link(0, 1, 10, 1), link(0, 2, 1, 1), link(2, 1, 1, 1)],
    };
    let r = Routes::compute(&t, &all_live(&t));
    assert_eq!(r.next_hop(SiteId(0), SiteId(1)), Some(SiteId(2)));
    assert_eq!(r.next_hop(SiteId(1), SiteId(0)), Some(SiteId(0)));
    assert_eq!(r.distance(SiteId(0), SiteId(1)), Some(2));
}

#[test]
fn equal_weights_prefer_fewer_links_then_the_smaller_parent() {
    // 0-1-3 and 0-2-3 both weigh 2; 0-3 direct weighs 2 as well.
    let t = Topology {
        sites: sites(4),
        links: vec![
            link(0, 1, 1, 1),
            link(0, 2, 1, 1),
            link(1, 3, 1, 1),
            link(2, 3, 1, 1),
            link(0, 3, 2, 2),
        ],
    };
    let r = Routes::compute(&t, &all_live(&t));
    assert_eq!(r.parent(SiteId(0), SiteId(3)), Some(SiteId(0)), "one link");
    let mut t2 = t.clone();
    t2.links.pop();
    let r2 = Routes::compute(&t2, &all_live(&t2));
    assert_eq!(r2.parent(SiteId(0), SiteId(3)), Some(SiteId(1)), "smaller");
}

#[test]
fn a_daemon_leaving_changes_the_gateway_not_the_routes() {
    let t = Topology {
        sites: sites(3),
        links: vec![link(0, 1, 1, 1), link(1, 2, 1, 1)],
    };
    let before = Routes::compute(&t, &all_live(&t));
    let mut m = all_live(&t);
    m.live.remove(&NodeId(10)); // site 1's gateway
    let after = Routes::compute(&t, &m);
    assert_eq!(before.gateway(SiteId(1)), Some(NodeId(10)));
    assert_eq!(after.gateway(SiteId(1)), Some(NodeId(11)));
    assert_eq!(before.dist, after.dist);
    assert_eq!(before.children, after.children);
}

#[test]
fn a_site_partition_or_a_failed_link_reroutes() {
    let t = Topology {
        sites: sites(3),
        links: vec![link(0, 1, 1, 1), link(1, 2, 1, 1), link(0, 2, 5, 5)],
    };
    let mut m = all_live(&t);
    assert_eq!(
        Routes::compute(&t, &m).next_hop(SiteId(0), SiteId(2)),
        Some(SiteId(1))
    );
    m.failed_links.insert((SiteId(1), SiteId(2)));
    let r = Routes::compute(&t, &m);
    assert_eq!(r.next_hop(SiteId(0), SiteId(2)), Some(SiteId(2)));
    let mut m = all_live(&t);
    m.live.remove(&NodeId(10));
    m.live.remove(&NodeId(11));
    let r = Routes::compute(&t, &m);
    assert_eq!(r.gateway(SiteId(1)), None);
    assert_eq!(r.distance(SiteId(0), SiteId(1)), None);
    assert_eq!(r.distance(SiteId(0), SiteId(2)), Some(5));
}

#[test]
fn validation_refuses_bad_topologies() {
    let mut t = Topology {
        sites: sites(2),
        links: vec![link(0, 1, 0, 1)],
    };
    assert!(matches!(t.validate(), Err(TopologyError::ZeroWeight(..))));
    t.links = vec![link(0, 2, 1, 1)];
    assert!(matches!(t.validate(), Err(TopologyError::UnknownSite(..))));
    t.links = vec![link(1, 1, 1, 1)];
    assert!(matches!(t.validate(), Err(TopologyError::SelfLink(_))));
    t.links.clear();
    t.sites[1].daemons.push(NodeId(0));
    assert!(matches!(
        t.validate(),
        Err(TopologyError::DaemonInTwoSites(_))
    ));
}

/// Dijkstra from `s` over the direct weights: the reference distances.
fn dijkstra(n: usize, w: &[u64], s: usize) -> Vec<u64> {
    let mut dist = vec![INF; n];
    let mut done = vec![false; n];
    dist[s] = 0;
    for _ in 0..n {
        let Some(u) = (0..n)
            .filter(|&v| !done[v] && dist[v] != INF)
            .min_by_key(|&v| dist[v])
        else {
            break;
        };
        done[u] = true;
        for v in 0..n {
            if w[u * n + v] != INF {
                dist[v] = dist[v].min(dist[u] + w[u * n + v]);
            }
        }
    }
    dist
}

fn arb_topology() -> impl Strategy<Value = Topology> {
    (2u16..9).prop_flat_map(|n| {
        let link = (
            0..n,
            0..n,
            prop::option::of(1u32..6),
            prop::option::of(1u32..6),
        )
            .prop_filter("no self link", |(a, b, _, _)| a != b)
            .prop_map(|(a, b, ab, ba)| LinkWeights {
                a: SiteId(a),
                b: SiteId(b),
                a_to_b: ab,
                b_to_a: ba,
            });
        prop::collection::vec(link, 0..20).prop_map(move |links| Topology {
            sites: sites(n),
            links,
        })
    })
}

proptest! {
    /// Floyd-Warshall agrees with Dijkstra; every source's parent links form
    /// a tree spanning exactly the reachable sites, whose path weights are
    /// the shortest distances.
    #[test]
    fn trees_are_shortest_path_trees(t in arb_topology(), dead in prop::collection::btree_set(0u16..9, 0..3)) {
        t.validate().unwrap();
        let mut m = all_live(&t);
        for s in &dead {
            m.live.remove(&NodeId(u32::from(*s) * 10));
            m.live.remove(&NodeId(u32::from(*s) * 10 + 1));
        }
        let r = Routes::compute(&t, &m);
        let n = t.sites.len();
        let w = direct_weights(&t, &m, &r.gateways);
        for s in 0..n {
            let src = SiteId(s as u16);
            let reference = if r.gateway(src).is_some() { dijkstra(n, &w, s) } else { vec![INF; n] };
            let order = r.tree_order(src);
            let in_tree: BTreeSet<u16> = order.iter().map(|x| x.0).collect();
            prop_assert_eq!(in_tree.len(), order.len(), "a site reached twice");
            for v in 0..n {
                let site = SiteId(v as u16);
                let reachable = reference[v] != INF;
                prop_assert_eq!(in_tree.contains(&site.0), reachable);
                prop_assert_eq!(r.distance(src, site), reachable.then_some(reference[v]));
                if reachable && v != s {
                    let p = r.parent(src, site).unwrap();
                    let pw = w[usize::from(p.0) * n + v];
                    prop_assert_eq!(r.distance(src, p).unwrap() + pw, reference[v]);
                }
            }
        }
    }

    /// Routes do not depend on the order links are listed in.
    #[test]
    fn routes_ignore_link_order(t in arb_topology(), rotate in 0usize..20) {
        let m = all_live(&t);
        let a = Routes::compute(&t, &m);
        let mut shuffled = t.clone();
        let k = if t.links.is_empty() { 0 } else { rotate % t.links.len() };
        shuffled.links.rotate_left(k);
        shuffled.links.reverse();
        prop_assert_eq!(a, Routes::compute(&shuffled, &m));
    }
}
