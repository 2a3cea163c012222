//! Site-level membership: which sites form the configuration, decided by
//! the sites' gateways themselves (P-Spread §2.1: "the membership
//! protocol" that the paper names and does not describe; Spread's is
//! daemon-level Totem membership over the overlay).
//!
//! Each gateway floods an [`Alive`] over the topology's links every
//! `heartbeat_interval`: its site, the configuration its site is in, the
//! latest configuration handed to its stream, whether it is still
//! closing its stream for a change, and the sites it hears (an `Alive`
//! from a site within `site_timeout`). A gateway forwards each new
//! `Alive` to its other neighbours, so a site hears every site it has a
//! path of live links to.
//!
//! The *leader* of a set of sites is its lowest site. When every site the
//! leader hears reports hearing exactly the same set, and that set is not
//! already one settled configuration, the leader commits a configuration
//! ([`Commit`]): a new epoch and, for every site, the configuration it is
//! coming from. It repeats the commit in its `Alive`s. A gateway hands a
//! commit to its site (a flush in its stream) when it hears the same set,
//! and the commit says it comes from the configuration it is in. The
//! sites coming from the same old configuration end it together (the
//! transitional configuration is theirs); a site that moved on meanwhile
//! ignores the commit, its next `Alive` says so, and the leader commits
//! again. A site still closing its stream for a commit that can no longer
//! complete (a site of it failed before flushing) closes it again for the
//! newer one (`SiteDaemon`'s *superseding* flush).
//!
//! Epochs are unique without coordination: the high 22 bits count up past
//! every epoch any heard site reports, the low 10 bits are the leader's
//! site (sites are below [`crate::overlay::MAX_SITES`], 1,024).
//!
//! Assumed, said plainly: reachability is symmetric (a link that carries
//! one direction only keeps the sites from agreeing, and no configuration
//! is committed until it heals or times out both ways).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::codec::{get_site_list, put_site_list, Malformed, Reader, Writer};
use crate::overlay::SiteId;
use crate::{Instant, NodeId};

/// Bits of an epoch that name the committing leader's site.
const SITE_BITS: u32 = 10;

/// The epoch of the configuration a site starts in, alone: the lowest
/// count (1) with the site in the low bits.
pub fn first_epoch(site: SiteId) -> u32 {
    (1 << SITE_BITS) | u32::from(site.0)
}

/// The site membership's settings (`sites::Config::membership`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipConfig {
    /// Whether the gateways decide the configuration of sites themselves
    /// (on by default here; `sites::Config`'s default turns it off).
    /// Off, the configuration is the driver's input
    /// (`SiteDaemon::handle_site_view`; the simulator's partitions).
    pub enabled: bool,
    /// How often a gateway floods its `Alive`.
    #[serde(with = "crate::serde_ms")]
    pub heartbeat_interval: Duration,
    /// A site not heard from for this long is out of the next
    /// configuration. Above the time a site's ring takes to re-form
    /// after its gateway crashed (the ring's `token_timeout` plus
    /// `consensus_timeout`, 2.2 s, then a new gateway): a gateway's crash
    /// must not look like its site's (`SiteDaemon::new` refuses less).
    /// 5 s: twenty heartbeats, so a site is dropped only after twenty
    /// floods in a row failed to arrive.
    #[serde(with = "crate::serde_ms")]
    pub site_timeout: Duration,
}

impl Default for MembershipConfig {
    fn default() -> MembershipConfig {
        MembershipConfig {
            enabled: true,
            heartbeat_interval: Duration::from_millis(250),
            site_timeout: Duration::from_millis(5_000),
        }
    }
}

/// A configuration of sites committed by its leader: its epoch, and each
/// site with the configuration it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub epoch: u32,
    pub sites: Vec<(SiteId, u32)>,
}

impl Commit {
    /// The configuration `site` comes from, if it is in this one.
    pub fn from_of(&self, site: SiteId) -> Option<u32> {
        self.sites.iter().find(|(s, _)| *s == site).map(|(_, f)| *f)
    }

    pub fn site_ids(&self) -> Vec<SiteId> {
        self.sites.iter().map(|(s, _)| *s).collect()
    }
}

/// What a gateway floods every `heartbeat_interval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alive {
    pub site: SiteId,
    pub node: NodeId,
    /// Rises with each `Alive` of this node.
    pub seq: u64,
    /// The configuration the site is in.
    pub from: u32,
    /// The latest configuration handed to the site's stream.
    pub latest: u32,
    /// Not closing its stream for a change, and its regular views given.
    pub settled: bool,
    /// The sites it hears, itself among them, in order.
    pub view: Vec<SiteId>,
    /// A configuration it committed as leader, repeated until settled.
    pub commit: Option<Commit>,
}

impl Alive {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u16(self.site.0).u32(self.node.0).u64(self.seq);
        w.u32(self.from).u32(self.latest).u8(u8::from(self.settled));
        put_site_list(&mut w, &self.view);
        match &self.commit {
            Some(c) => {
                w.u8(1).u32(c.epoch).u16(c.sites.len() as u16);
                for (s, f) in &c.sites {
                    w.u16(s.0).u32(*f);
                }
            }
            None => {
                w.u8(0);
            }
        }
        w.0
    }

    pub fn decode(buf: &[u8]) -> Result<Alive, Malformed> {
        let mut r = Reader::new(buf);
        let site = SiteId(r.u16()?);
        let node = NodeId(r.u32()?);
        let seq = r.u64()?;
        let from = r.u32()?;
        let latest = r.u32()?;
        let settled = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(Malformed),
        };
        let view = get_site_list(&mut r)?;
        let commit = match r.u8()? {
            0 => None,
            1 => {
                let epoch = r.u32()?;
                let n = r.count(6)?;
                let sites = (0..n)
                    .map(|_| Ok((SiteId(r.u16()?), r.u32()?)))
                    .collect::<Result<Vec<_>, Malformed>>()?;
                Some(Commit { epoch, sites })
            }
            _ => return Err(Malformed),
        };
        if r.remaining() != 0 {
            return Err(Malformed);
        }
        Ok(Alive {
            site,
            node,
            seq,
            from,
            latest,
            settled,
            view,
            commit,
        })
    }
}

/// Where this gateway's site stands, as its `Alive` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Local {
    pub from: u32,
    pub latest: u32,
    pub settled: bool,
    /// The sites of the configuration it is in.
    pub conf_sites: Vec<SiteId>,
}

#[derive(Debug)]
struct Heard {
    alive: Alive,
    at: Instant,
}

/// One gateway's part of the site membership.
#[derive(Debug)]
pub(crate) struct SiteMembership {
    config: MembershipConfig,
    site: SiteId,
    node: NodeId,
    seq: u64,
    /// The latest `Alive` of each other site, and when it came.
    heard: BTreeMap<SiteId, Heard>,
    /// The highest `seq` passed on per originating node (the flood's
    /// duplicate check).
    forwarded: BTreeMap<NodeId, u64>,
    /// This gateway's commit as leader, and when it was made.
    committed: Option<(Commit, Instant)>,
    /// The highest epoch this gateway has seen anywhere.
    max_epoch: u32,
    pub next_beat: Instant,
}

impl SiteMembership {
    pub fn new(config: MembershipConfig, site: SiteId, node: NodeId, now: Instant) -> Self {
        SiteMembership {
            config,
            site,
            node,
            seq: 0,
            heard: BTreeMap::new(),
            forwarded: BTreeMap::new(),
            committed: None,
            max_epoch: 0,
            next_beat: now,
        }
    }

    /// The sites heard within `site_timeout`, this one among them.
    pub fn view(&self, now: Instant) -> Vec<SiteId> {
        let mut v: Vec<SiteId> = self
            .heard
            .iter()
            .filter(|(_, h)| now.saturating_duration_since(h.at) < self.config.site_timeout)
            .map(|(s, _)| *s)
            .collect();
        v.push(self.site);
        v.sort_unstable();
        v
    }

    /// This gateway's next `Alive` (and the time of the one after).
    pub fn beat(&mut self, now: Instant, local: &Local) -> Alive {
        self.next_beat = now + self.config.heartbeat_interval;
        self.seq += 1;
        self.max_epoch = self.max_epoch.max(local.from).max(local.latest);
        Alive {
            site: self.site,
            node: self.node,
            seq: self.seq,
            from: local.from,
            latest: local.latest,
            settled: local.settled,
            view: self.view(now),
            commit: self.committed.as_ref().map(|(c, _)| c.clone()),
        }
    }

    /// An `Alive` arrived. Returns whether it is new (to be passed on).
    pub fn on_alive(&mut self, now: Instant, alive: Alive) -> bool {
        if alive.site == self.site || alive.node == self.node {
            return false;
        }
        let last = self.forwarded.entry(alive.node).or_insert(0);
        if alive.seq <= *last {
            return false;
        }
        *last = alive.seq;
        self.max_epoch = self
            .max_epoch
            .max(alive.from)
            .max(alive.latest)
            .max(alive.commit.as_ref().map_or(0, |c| c.epoch));
        self.heard.insert(alive.site, Heard { alive, at: now });
        true
    }

    /// As the leader of the sites it hears: the configuration to commit,
    /// if they all agree on the set and are not already one settled
    /// configuration of it (it is then repeated in this gateway's
    /// `Alive`s).
    pub fn decide(&mut self, now: Instant, local: &Local) -> Option<Commit> {
        let view = self.view(now);
        if view[0] != self.site {
            self.committed = None;
            return None;
        }
        let reports: Vec<(SiteId, u32, u32, bool)> = view
            .iter()
            .map(|s| {
                if *s == self.site {
                    Some((*s, local.from, local.latest, local.settled))
                } else {
                    self.heard
                        .get(s)
                        .filter(|h| h.alive.view == view)
                        .map(|h| (*s, h.alive.from, h.alive.latest, h.alive.settled))
                }
            })
            .collect::<Option<Vec<_>>>()?;
        let settled = local.conf_sites == view
            && reports.iter().all(|(_, from, latest, settled)| {
                *settled && *from == local.from && *latest == local.from
            });
        if settled {
            self.committed = None;
            return None;
        }
        if let Some((c, at)) = &self.committed {
            let still = c.site_ids() == view
                && reports
                    .iter()
                    .all(|(s, from, _, _)| *from == c.epoch || c.from_of(*s) == Some(*from));
            // A commit stands until it is out of date; a new one is not
            // made more often than every heartbeat.
            if still || now.saturating_duration_since(*at) < self.config.heartbeat_interval {
                return None;
            }
        }
        let counter = (self.max_epoch >> SITE_BITS) + 1;
        let epoch = (counter << SITE_BITS) | u32::from(self.site.0);
        self.max_epoch = epoch;
        let c = Commit {
            epoch,
            sites: reports.iter().map(|(s, from, _, _)| (*s, *from)).collect(),
        };
        self.committed = Some((c.clone(), now));
        Some(c)
    }

    /// The commit this site should act on now, if any: its leader's (or
    /// its own as leader), naming the set this gateway hears and the
    /// configuration its site is in.
    pub fn commit_for_me(&self, now: Instant, local: &Local) -> Option<Commit> {
        let view = self.view(now);
        let leader = view[0];
        let c = if leader == self.site {
            self.committed.as_ref().map(|(c, _)| c)?
        } else {
            self.heard.get(&leader)?.alive.commit.as_ref()?
        };
        (c.epoch > local.latest && c.site_ids() == view && c.from_of(self.site) == Some(local.from))
            .then(|| c.clone())
    }

    /// The gateway each neighbouring site had when it last sent here.
    pub fn sender_of(&self, site: SiteId, now: Instant) -> Option<NodeId> {
        self.heard
            .get(&site)
            .filter(|h| now.saturating_duration_since(h.at) < self.config.site_timeout)
            .map(|h| h.alive.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(from: u32, sites: &[u16]) -> Local {
        Local {
            from,
            latest: from,
            settled: true,
            conf_sites: sites.iter().map(|s| SiteId(*s)).collect(),
        }
    }

    #[test]
    fn alive_round_trips_and_refuses_garbage() {
        let a = Alive {
            site: SiteId(3),
            node: NodeId(7),
            seq: 9,
            from: 1025,
            latest: 2049,
            settled: false,
            view: vec![SiteId(0), SiteId(3)],
            commit: Some(Commit {
                epoch: 2049,
                sites: vec![(SiteId(0), 1025), (SiteId(3), 1)],
            }),
        };
        let b = a.encode();
        assert_eq!(Alive::decode(&b).unwrap(), a);
        for n in 0..b.len() {
            assert!(Alive::decode(&b[..n]).is_err());
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Alive::decode(&long).is_err());
    }

    /// Two sites that hear each other, in one settled configuration of
    /// both: nothing to commit. One goes silent: the other, leader of
    /// itself alone, commits a configuration of itself, coming from the
    /// old one, with an epoch above it and its site in the low bits.
    #[test]
    fn a_silent_site_is_left_out_after_the_timeout() {
        let cfg = MembershipConfig::default();
        let t0 = Instant::ZERO;
        let mut m0 = SiteMembership::new(cfg.clone(), SiteId(0), NodeId(0), t0);
        let mut m1 = SiteMembership::new(cfg.clone(), SiteId(1), NodeId(3), t0);
        let l = local(1, &[0, 1]);
        for k in 0..3u64 {
            let now = t0 + Duration::from_millis(200 * k);
            let a1 = m1.beat(now, &l);
            m0.on_alive(now, a1);
            let a0 = m0.beat(now, &l);
            m1.on_alive(now, a0);
        }
        let now = t0 + Duration::from_millis(400);
        assert_eq!(m0.view(now), vec![SiteId(0), SiteId(1)]);
        assert_eq!(m0.decide(now, &l), None);
        let later = now + cfg.site_timeout;
        assert_eq!(m0.view(later), vec![SiteId(0)]);
        let c = m0.decide(later, &l).expect("a commit");
        assert_eq!(c.sites, vec![(SiteId(0), 1)]);
        assert_eq!(c.epoch, 1 << SITE_BITS);
        assert_eq!(m0.commit_for_me(later, &l), Some(c.clone()));
        // Repeated, not remade.
        assert_eq!(m0.decide(later + Duration::from_secs(1), &l), None);
        assert_eq!(m0.beat(later, &l).commit, Some(c));
    }

    /// A commit is acted on only by a site that hears the same set and is
    /// in the configuration the commit says it comes from.
    #[test]
    fn a_commit_is_taken_only_by_a_site_it_describes() {
        let cfg = MembershipConfig::default();
        let t0 = Instant::ZERO;
        let mut m0 = SiteMembership::new(cfg.clone(), SiteId(0), NodeId(0), t0);
        let mut m1 = SiteMembership::new(cfg, SiteId(1), NodeId(3), t0);
        // Site 1 is alone in configuration 5; site 0 alone in 1024.
        let l1 = local(5, &[1]);
        let l0 = local(1024, &[0]);
        for k in 0..2u64 {
            let now = t0 + Duration::from_millis(200 * k);
            m0.on_alive(now, m1.beat(now, &l1));
            m1.on_alive(now, m0.beat(now, &l0));
        }
        let now = t0 + Duration::from_millis(400);
        let c = m0.decide(now, &l0).expect("a merge");
        assert_eq!(c.sites, vec![(SiteId(0), 1024), (SiteId(1), 5)]);
        assert_eq!(c.epoch, (2 << SITE_BITS));
        m1.on_alive(now, m0.beat(now, &l0));
        assert_eq!(m1.commit_for_me(now, &l1), Some(c.clone()));
        // Site 1 moved on to another configuration meanwhile: not for it.
        assert_eq!(m1.commit_for_me(now, &local(6, &[1])), None);
        // Handed over already.
        let mut handed = l1.clone();
        handed.latest = c.epoch;
        assert_eq!(m1.commit_for_me(now, &handed), None);
    }
}
