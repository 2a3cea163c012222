//! Byte formats of the sites layer: the elements of a site stream, what a
//! daemon multicasts in its ring, what gateways send each other inside Hop
//! packets, and the outer WAN datagram. Bounds-checked reads: a bad or
//! short buffer is an error, never a panic; counts are checked against the
//! bytes left before anything is allocated. Public so that the fuzz targets
//! (`fuzz/fuzz_targets/sites_decode.rs`) reach every decoder; a daemon's
//! driver needs none of it.

use bytes::Bytes;

use crate::overlay::SiteId;
use crate::ring::RingId;
use crate::NodeId;

use super::Service;

/// A buffer that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed sites datagram")]
pub struct Malformed;

type R<T> = Result<T, Malformed>;

/// Writes the formats below.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    pub fn u64s(&mut self, v: &[u64]) -> &mut Self {
        self.u16(v.len() as u16);
        for x in v {
            self.u64(*x);
        }
        self
    }
}

/// Reads the formats below.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if self.buf.len() < n {
            return Err(Malformed);
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    pub fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> R<u16> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    pub fn u32(&mut self) -> R<u32> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    pub fn u64(&mut self) -> R<u64> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    pub fn bytes(&mut self) -> R<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn str(&mut self) -> R<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| Malformed)
    }
    /// A count of items each at least `min_size` bytes long.
    pub fn count(&mut self, min_size: usize) -> R<usize> {
        let n = self.u16()? as usize;
        if n.saturating_mul(min_size) > self.buf.len() {
            return Err(Malformed);
        }
        Ok(n)
    }
    pub fn u64s(&mut self) -> R<Vec<u64>> {
        let n = self.count(8)?;
        (0..n).map(|_| self.u64()).collect()
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// A 32-bit count of items each at least `min_size` bytes long.
    pub fn count32(&mut self, min_size: usize) -> R<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size.max(1)) > self.buf.len() {
            return Err(Malformed);
        }
        Ok(n)
    }
    pub fn end(&self) -> R<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Malformed)
        }
    }
}

/// What one element of a site stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A client's message.
    Data {
        client: String,
        service: Service,
        groups: Vec<String>,
        payload: Bytes,
    },
    /// A client joins a group (one message: lightweight groups).
    Join { client: String, group: String },
    /// A client leaves a group.
    Leave { client: String, group: String },
    /// A daemon left its site's ring: its clients leave every group.
    Gone { node: NodeId },
    /// The site was heard from up to here, and (a ring SAFE message) every
    /// daemon of the site holds everything before it: `holds[i]` elements
    /// of the configuration's i-th site. Filled in when the ring delivers it.
    Marker { holds: Vec<u64> },
    /// The last element of the site in its configuration: the next
    /// configuration is `sites` with id `new_epoch`; `holds` as in a marker
    /// (without its guarantee: it is a ring AGREED message). `decided`:
    /// set when the site membership committed the configuration
    /// (`membership.rs`): the configuration it expects this site to come
    /// from, and the sites coming from that one with it (those that end
    /// it together). Without it (a driver's configuration) the sites that
    /// stay are those of both.
    Flush {
        new_epoch: u32,
        sites: Vec<SiteId>,
        holds: Vec<u64>,
        decided: Option<(u32, Vec<SiteId>)>,
    },
    /// The first element of a site in a configuration: its daemons'
    /// clients in each group, as (group, client, daemon).
    State {
        members: Vec<(String, String, NodeId)>,
    },
}

fn service_byte(s: Service) -> u8 {
    s as u8
}

fn service_of(b: u8) -> R<Service> {
    Service::ALL.get(usize::from(b)).copied().ok_or(Malformed)
}

impl Body {
    pub(crate) fn encode(&self, w: &mut Writer) {
        match self {
            Body::Data {
                client,
                service,
                groups,
                payload,
            } => {
                w.u8(0).str(client).u8(service_byte(*service));
                w.u16(groups.len() as u16);
                for g in groups {
                    w.str(g);
                }
                w.bytes(payload);
            }
            Body::Join { client, group } => {
                w.u8(1).str(client).str(group);
            }
            Body::Leave { client, group } => {
                w.u8(2).str(client).str(group);
            }
            Body::Gone { node } => {
                w.u8(3).u32(node.0);
            }
            Body::Marker { holds } => {
                w.u8(4).u64s(holds);
            }
            Body::Flush {
                new_epoch,
                sites,
                holds,
                decided,
            } => {
                w.u8(5).u32(*new_epoch);
                put_site_list(w, sites);
                w.u64s(holds);
                match decided {
                    Some((from, staying)) => {
                        w.u8(1).u32(*from);
                        put_site_list(w, staying);
                    }
                    None => {
                        w.u8(0);
                    }
                }
            }
            Body::State { members } => {
                w.u8(6).u16(members.len() as u16);
                for (g, c, d) in members {
                    w.str(g).str(c).u32(d.0);
                }
            }
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> R<Body> {
        Ok(match r.u8()? {
            0 => {
                let client = r.str()?;
                let service = service_of(r.u8()?)?;
                let n = r.count(4)?;
                let groups = (0..n).map(|_| r.str()).collect::<R<Vec<_>>>()?;
                let payload = Bytes::copy_from_slice(r.bytes()?);
                Body::Data {
                    client,
                    service,
                    groups,
                    payload,
                }
            }
            1 => Body::Join {
                client: r.str()?,
                group: r.str()?,
            },
            2 => Body::Leave {
                client: r.str()?,
                group: r.str()?,
            },
            3 => Body::Gone {
                node: NodeId(r.u32()?),
            },
            4 => Body::Marker { holds: r.u64s()? },
            5 => {
                let new_epoch = r.u32()?;
                let sites = get_site_list(r)?;
                let holds = r.u64s()?;
                let decided = match r.u8()? {
                    0 => None,
                    1 => Some((r.u32()?, get_site_list(r)?)),
                    _ => return Err(Malformed),
                };
                Body::Flush {
                    new_epoch,
                    sites,
                    holds,
                    decided,
                }
            }
            6 => {
                let n = r.count(12)?;
                let members = (0..n)
                    .map(|_| Ok((r.str()?, r.str()?, NodeId(r.u32()?))))
                    .collect::<R<Vec<_>>>()?;
                Body::State { members }
            }
            _ => return Err(Malformed),
        })
    }
}

/// One element of a site stream, numbered and stamped by its site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The site whose stream it is in.
    pub origin: SiteId,
    /// The configuration it belongs to.
    pub epoch: u32,
    /// Its place in the origin's stream of that configuration, from 1.
    pub seq: u64,
    /// Lamport timestamp: above every element its site had taken in.
    pub ts: u64,
    /// The daemon that multicast it in the origin's ring.
    pub sender: NodeId,
    pub body: Body,
}

impl Element {
    /// The element's bytes.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        w.u16(self.origin.0)
            .u32(self.epoch)
            .u64(self.seq)
            .u64(self.ts)
            .u32(self.sender.0);
        self.body.encode(&mut w);
        Bytes::from(w.0)
    }

    /// An element from `buf`, which it must fill exactly.
    pub fn decode(buf: &[u8]) -> R<Element> {
        let mut r = Reader::new(buf);
        let e = Element {
            origin: SiteId(r.u16()?),
            epoch: r.u32()?,
            seq: r.u64()?,
            ts: r.u64()?,
            sender: NodeId(r.u32()?),
            body: Body::decode(&mut r)?,
        };
        r.end()?;
        Ok(e)
    }

    /// The element's place in the total order of its configuration.
    pub(crate) fn key(&self) -> (u64, SiteId) {
        (self.ts, self.origin)
    }
}

/// What a daemon multicasts in its site's ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingMsg {
    /// An element of this site, numbered when the ring delivers it.
    Own(Body),
    /// Another site's element, taken in by the gateway.
    Foreign(Bytes),
    /// Every member's first message in a ring it installed: whether it
    /// holds its site's state, and which (`lineage`; `None`: none).
    Hello { ring: RingId, lineage: Option<u64> },
    /// Part `index` of `count` of the site's state as it stood when ring
    /// `ring` was installed, from the member chosen to hand it over.
    Snapshot {
        ring: RingId,
        index: u32,
        count: u32,
        bytes: Bytes,
    },
    /// Part `index` of `count` (at least 2) of a ring message too large
    /// for one ring datagram: the sender's parts are consecutive in its
    /// ring order, and every daemon puts them together before acting on
    /// the whole (`sites/parts.rs`).
    Part {
        index: u32,
        count: u32,
        bytes: Bytes,
    },
}

/// Bytes a [`RingMsg::Part`] adds to its share of the message.
pub const RING_PART_HEADER: usize = 9;

impl RingMsg {
    /// The message's bytes.
    pub fn encode(&self) -> Bytes {
        // Sized once for what it carries (a client's message, an element,
        // a part), so a large message is not grown step by step.
        let carried = match self {
            RingMsg::Own(Body::Data { payload, .. }) => payload.len(),
            RingMsg::Foreign(b)
            | RingMsg::Snapshot { bytes: b, .. }
            | RingMsg::Part { bytes: b, .. } => b.len(),
            _ => 0,
        };
        let mut w = Writer(Vec::with_capacity(carried + 128));
        match self {
            RingMsg::Own(b) => {
                w.u8(0);
                b.encode(&mut w);
            }
            RingMsg::Foreign(e) => {
                w.u8(1);
                w.0.extend_from_slice(e);
            }
            RingMsg::Hello { ring, lineage } => {
                w.u8(2).u64(ring.seq).u32(ring.rep);
                match lineage {
                    Some(l) => w.u8(1).u64(*l),
                    None => w.u8(0).u64(0),
                };
            }
            RingMsg::Snapshot {
                ring,
                index,
                count,
                bytes,
            } => {
                w.u8(3).u64(ring.seq).u32(ring.rep).u32(*index).u32(*count);
                w.0.extend_from_slice(bytes);
            }
            RingMsg::Part {
                index,
                count,
                bytes,
            } => {
                w.u8(4).u32(*index).u32(*count);
                w.0.extend_from_slice(bytes);
            }
        }
        Bytes::from(w.0)
    }

    /// A ring message from `buf` (an own body must fill it exactly; a
    /// foreign element is decoded later, by [`Element::decode`]).
    pub fn decode(buf: &[u8]) -> R<RingMsg> {
        let mut r = Reader::new(buf);
        match r.u8()? {
            0 => {
                let b = Body::decode(&mut r)?;
                r.end()?;
                Ok(RingMsg::Own(b))
            }
            1 => Ok(RingMsg::Foreign(Bytes::copy_from_slice(r.rest()))),
            2 => {
                let ring = RingId {
                    seq: r.u64()?,
                    rep: r.u32()?,
                };
                let lineage = match (r.u8()?, r.u64()?) {
                    (1, l) => Some(l),
                    (0, 0) => None,
                    _ => return Err(Malformed),
                };
                r.end()?;
                Ok(RingMsg::Hello { ring, lineage })
            }
            3 => {
                let ring = RingId {
                    seq: r.u64()?,
                    rep: r.u32()?,
                };
                let (index, count) = (r.u32()?, r.u32()?);
                if index >= count {
                    return Err(Malformed);
                }
                Ok(RingMsg::Snapshot {
                    ring,
                    index,
                    count,
                    bytes: Bytes::copy_from_slice(r.rest()),
                })
            }
            4 => {
                let (index, count) = (r.u32()?, r.u32()?);
                if index >= count || count < 2 {
                    return Err(Malformed);
                }
                Ok(RingMsg::Part {
                    index,
                    count,
                    bytes: Bytes::copy_from_slice(r.rest()),
                })
            }
            _ => Err(Malformed),
        }
    }
}

/// A list of sites: a 16-bit count, then each site.
pub(crate) fn put_site_list(w: &mut Writer, sites: &[SiteId]) {
    w.u16(sites.len() as u16);
    for s in sites {
        w.u16(s.0);
    }
}

pub(crate) fn get_site_list(r: &mut Reader<'_>) -> R<Vec<SiteId>> {
    let n = r.count(2)?;
    (0..n).map(|_| r.u16().map(SiteId)).collect()
}

/// `dest` of a WAN message sent down the source's tree.
pub const TREE: u16 = u16::MAX;

/// What gateways send each other inside Hop packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WanMsg {
    /// An element, down its origin's tree (`dest == TREE`) or to one site.
    Elem { dest: u16, element: Bytes },
    /// What site `site` holds of configuration `epoch`: `holds[i]`
    /// elements of its i-th site.
    Status {
        dest: u16,
        site: SiteId,
        epoch: u32,
        holds: Vec<u64>,
    },
    /// Part `index` of `count` (at least 2) of element (`epoch`, `origin`,
    /// `seq`)'s bytes, for an element too large for one link message.
    /// Each part is routed as the whole element would be (`dest`), and
    /// forwarded on arrival: a gateway passes parts on before it has them
    /// all (P-Spread §3.2's non-blocking forwarding, per packet).
    Part {
        dest: u16,
        origin: SiteId,
        epoch: u32,
        seq: u64,
        index: u32,
        count: u32,
        bytes: Bytes,
    },
}

/// Bytes a [`WanMsg::Elem`] adds to its element (kind, destination).
pub const WAN_ELEM_HEADER: usize = 3;

/// Bytes a [`WanMsg::Part`] adds to its share of the element.
pub const WAN_PART_HEADER: usize = 25;

impl WanMsg {
    /// The message's bytes.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        match self {
            WanMsg::Elem { dest, element } => {
                w.u8(0).u16(*dest);
                w.0.extend_from_slice(element);
            }
            WanMsg::Status {
                dest,
                site,
                epoch,
                holds,
            } => {
                w.u8(1).u16(*dest).u16(site.0).u32(*epoch).u64s(holds);
            }
            WanMsg::Part {
                dest,
                origin,
                epoch,
                seq,
                index,
                count,
                bytes,
            } => {
                w.u8(2).u16(*dest).u16(origin.0).u32(*epoch).u64(*seq);
                w.u32(*index).u32(*count);
                w.0.extend_from_slice(bytes);
            }
        }
        Bytes::from(w.0)
    }

    /// A gateway message from `buf` (an element's bytes are decoded
    /// later, by [`Element::decode`]).
    pub fn decode(buf: &[u8]) -> R<WanMsg> {
        let mut r = Reader::new(buf);
        match r.u8()? {
            0 => Ok(WanMsg::Elem {
                dest: r.u16()?,
                element: Bytes::copy_from_slice(r.rest()),
            }),
            1 => {
                let m = WanMsg::Status {
                    dest: r.u16()?,
                    site: SiteId(r.u16()?),
                    epoch: r.u32()?,
                    holds: r.u64s()?,
                };
                r.end()?;
                Ok(m)
            }
            2 => {
                let (dest, origin, epoch, seq) = (r.u16()?, SiteId(r.u16()?), r.u32()?, r.u64()?);
                let (index, count) = (r.u32()?, r.u32()?);
                if index >= count || count < 2 {
                    return Err(Malformed);
                }
                Ok(WanMsg::Part {
                    dest,
                    origin,
                    epoch,
                    seq,
                    index,
                    count,
                    bytes: Bytes::copy_from_slice(r.rest()),
                })
            }
            _ => Err(Malformed),
        }
    }
}

/// Outer WAN datagram kinds: a Hop datagram of the link, or a beacon
/// naming the sender as its site's gateway.
pub const WAN_HOP: u8 = 0;
/// Outer WAN datagram kind: a beacon (nothing follows the header).
pub const WAN_BEACON: u8 = 1;
/// Outer WAN datagram kind: a status to a neighbouring site's gateway,
/// outside the link's Hop queue (a `WanMsg::Status` follows the header).
/// Not reliable: statuses repeat every `status_interval`.
pub const WAN_STATUS: u8 = 2;
/// Outer WAN datagram kind: a gateway's `membership::Alive`, flooded over
/// the topology's links whatever the configuration (the header's epoch is
/// 0). Not reliable: it repeats every `heartbeat_interval`.
pub const WAN_ALIVE: u8 = 3;

/// Bytes of the outer WAN header.
pub const WAN_HEADER_LEN: usize = 7;

/// The outer WAN header: kind, the link's epoch, the sender's site.
pub fn wan_header(kind: u8, epoch: u32, site: SiteId) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(kind).u32(epoch).u16(site.0);
    w.0
}

/// Splits a WAN datagram into its header's kind, epoch and site, and
/// the rest (the Hop datagram). Any kind is returned; the caller acts on
/// the ones it knows.
pub fn parse_wan(buf: &[u8]) -> R<(u8, u32, SiteId, &[u8])> {
    let mut r = Reader::new(buf);
    let kind = r.u8()?;
    let epoch = r.u32()?;
    let site = SiteId(r.u16()?);
    Ok((kind, epoch, site, r.rest()))
}
