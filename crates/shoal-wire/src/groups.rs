//! What daemons tell each other about their clients: the payload
//! of each message a daemon multicasts to its peers through the daemons'
//! vsync group. Lightweight groups live here: a client's join or leave is
//! one item in the daemons' total order, not a daemon view change (Spread,
//! P-Spread §2).
//!
//! A payload is a batch: `count u16`, then that many items, each a tag byte
//! and big-endian fields. Strings are `u16` length + UTF-8; lists are `u16`
//! count + strings; byte fields are `u32` length + bytes.
//!
//! | tag | item | fields |
//! |---|---|---|
//! | 1 | JOIN | client, group |
//! | 2 | LEAVE | client, group |
//! | 3 | GONE | client, reason `u8` (the client protocol's membership reason) |
//! | 4 | MESSAGE | client, service `u8`, groups, payload |
//! | 5 | FRAGMENT | client, service `u8`, groups, message id `u64`, total length `u32`, offset `u32`, bytes |
//! | 6 | SNAPSHOT | epoch `u64`, `flags u8` (bit 0: first part, replaces what the receiver holds for the sender; bit 1: last part), `count u32` × (client, groups): the sending daemon's clients and their groups |
//! | 7 | GOODBYE | (none): the sending daemon is shutting down |
//! | 8 | RECEIVED | gseq `u64`: the sending daemon holds every batch up to this global sequence number (the acknowledgement behind service `safe`) |
//! | 9 | MESSAGE_EXT | client, service `u8`, flags `u8`, message type `u16`, groups, payload |
//! | 10 | FRAGMENT_EXT | client, service `u8`, flags `u8`, message type `u16`, groups, message id `u64`, total length `u32`, offset `u32`, bytes |
//! | 11 | TABLE | joiner `u32`, as-of gseq `u64`, as-of index `u32`, view-id counters (epoch `u64`, changes `u64`, owner slot `u32`), `flags u8` (bit 0 first part, bit 1 last part), settled daemons (`u16` count × `u32`), `count u32` × (daemon `u32`, client, groups): every group member as of a point of the order, for a daemon that joined |
//! | 13 | TABLE_PARTIAL | joiner `u32`, daemon `u32`, client, service `u8`, flags `u8`, message type `u16`, groups, message id `u64`, total length `u32`, offset `u32`, bytes: part of a message that `daemon` had begun to send in pieces and not finished as of the table's point, for `joiner` (which did not receive those pieces), sent before the table's last part |
//! | 12 | REGION_FLUSH | instance `u32`, `flags u8` (bit 0: a cut, not a change point's flush), sent `u64`, `count u16` × (source `u32`, delivered `u64`): the sending daemon's next sequence number in QSM region instance `instance` and the prefix it delivered of each other source (`docs/qsm.md`, "In the daemon") |
//!
//! A message or fragment whose flags and type are both zero is encoded with
//! the shorter tag (4 or 5), so batches without typed messages are what
//! daemons that predate tags 9 and 10 read. The flags are the client
//! protocol's multicast flags (`client::multicast_flags`): self-discard
//! matters only to the sending daemon, which delivers to its own clients.
//!
//! Decoding never panics and never allocates for a count the bytes cannot
//! hold; any irregularity refuses the whole batch.

use thiserror::Error;

const JOIN: u8 = 1;
const LEAVE: u8 = 2;
const GONE: u8 = 3;
const MESSAGE: u8 = 4;
const FRAGMENT: u8 = 5;
const SNAPSHOT: u8 = 6;
const GOODBYE: u8 = 7;
const RECEIVED: u8 = 8;
const MESSAGE_EXT: u8 = 9;
const FRAGMENT_EXT: u8 = 10;
const TABLE: u8 = 11;
const REGION_FLUSH: u8 = 12;
const TABLE_PARTIAL: u8 = 13;

/// One item of a batch; strings and bytes borrow from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<'a> {
    Join {
        client: &'a str,
        group: &'a str,
    },
    Leave {
        client: &'a str,
        group: &'a str,
    },
    /// The client is gone: it leaves every group it was in.
    Gone {
        client: &'a str,
        reason: u8,
    },
    Message {
        client: &'a str,
        service: u8,
        /// The client's multicast flags (self-discard).
        flags: u8,
        /// The application's message type.
        mess_type: u16,
        groups: Vec<&'a str>,
        payload: &'a [u8],
    },
    /// A piece of a message too large for one batch; the pieces of one
    /// message come from one daemon in order.
    Fragment {
        client: &'a str,
        service: u8,
        flags: u8,
        mess_type: u16,
        groups: Vec<&'a str>,
        id: u64,
        total: u32,
        offset: u32,
        bytes: &'a [u8],
    },
    /// Every client of the sending daemon with its groups (sent when a
    /// daemon joins, so that it learns the groups), in one or more parts:
    /// the first replaces what the receiver holds for the sender.
    /// `epoch` is the sender's view-id epoch (the daemon engine's
    /// `Sessions`), which a joining daemon's snapshot raises.
    Snapshot {
        epoch: u64,
        first: bool,
        last: bool,
        clients: Vec<(&'a str, Vec<&'a str>)>,
    },
    Goodbye,
    /// The sending daemon has received every batch of the total order up to
    /// global sequence number `gseq`: what makes a `safe` message stable.
    Received {
        gseq: u64,
    },
    /// Every group member (daemon, client, groups) as of the item or view
    /// at `as_of` (global sequence number, item index; a view's index is
    /// 0, an item's its index plus one), sent by one member for `joiner`,
    /// a daemon that joined, with the daemons that hold the whole table
    /// (`settled`). In one or more parts.
    /// `view_ids` are the view-id counters as of that point (epoch,
    /// changes, owner slot). `release` is `Some((transitional, gseq))`
    /// when the table's point fell while its sender applied, at the view
    /// change of global sequence number `gseq`, the batches it had held
    /// back for `safe`: the rest of the old view's batches after the point
    /// went out in that release, in a transitional configuration when
    /// `transitional`, and the joiner applies them so too at that view
    /// (which need not be the first after the point: the batches may stay
    /// held across views that add daemons).
    Table {
        joiner: u32,
        as_of: (u64, u32),
        view_ids: (u64, u64, u32),
        first: bool,
        last: bool,
        release: Option<(bool, u64)>,
        settled: Vec<u32>,
        entries: Vec<(u32, &'a str, Vec<&'a str>)>,
    },
    /// For `joiner`, with the table: the pieces that `daemon`'s message
    /// `id` had got to as of the table's point (from `offset`), which a
    /// daemon that joined since did not receive; without them it could
    /// not complete the message the others deliver.
    TablePartial {
        joiner: u32,
        daemon: u32,
        client: &'a str,
        service: u8,
        flags: u8,
        mess_type: u16,
        groups: Vec<&'a str>,
        id: u64,
        total: u32,
        offset: u32,
        bytes: &'a [u8],
    },
    /// Where the sending daemon stopped in QSM region instance `instance`:
    /// `sent` is its next sequence number there, `delivered` the prefix it
    /// delivered of each other source (ascending by source). With `cut`,
    /// only a marker before its next total-order message (FIFO across the
    /// two paths); without, its flush at a change point.
    RegionFlush {
        instance: u32,
        cut: bool,
        sent: u64,
        delivered: Vec<(u32, u64)>,
    },
}

/// A batch that cannot be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GroupsError {
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("unknown item tag {0}")]
    UnknownTag(u8),
    #[error("{0} is not UTF-8")]
    BadUtf8(&'static str),
    #[error("{what} count {count} exceeds the bytes left")]
    CountTooLarge { what: &'static str, count: usize },
    #[error("{0} bytes left over after the batch")]
    TrailingBytes(usize),
    #[error("{what} of {len} does not fit its length field")]
    TooLong { what: &'static str, len: usize },
    #[error("snapshot flags {0:#x} has unknown bits")]
    BadFlags(u8),
    #[error("a batch holds at most 65535 items")]
    TooManyItems,
    /// A MESSAGE_EXT or FRAGMENT_EXT with no flags and type 0: the short
    /// tag is the only encoding of that.
    #[error("an extended message item with no flags and type 0")]
    EmptyExtension,
}

/// Decodes a batch.
pub fn decode(bytes: &[u8]) -> Result<Vec<Item<'_>>, GroupsError> {
    let mut r = Reader { rest: bytes };
    let count = usize::from(r.u16("item count")?);
    // Every item takes at least one byte.
    if count > r.rest.len() {
        return Err(GroupsError::CountTooLarge {
            what: "item",
            count,
        });
    }
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        items.push(r.item()?);
    }
    if !r.rest.is_empty() {
        return Err(GroupsError::TrailingBytes(r.rest.len()));
    }
    Ok(items)
}

/// Encodes `items` as one batch, appended to `out`.
pub fn encode(items: &[Item<'_>], out: &mut Vec<u8>) -> Result<(), GroupsError> {
    let count = u16::try_from(items.len()).map_err(|_| GroupsError::TooManyItems)?;
    out.extend_from_slice(&count.to_be_bytes());
    for item in items {
        item.encode(out)?;
    }
    Ok(())
}

/// Bytes the flags and message type take: none when both are zero (the
/// short tag).
fn ext_len(flags: u8, mess_type: u16) -> usize {
    if flags == 0 && mess_type == 0 {
        0
    } else {
        3
    }
}

impl Item<'_> {
    /// Bytes this item takes when encoded.
    pub fn encoded_len(&self) -> usize {
        let s = |x: &str| 2 + x.len();
        let list = |l: &[&str]| 2 + l.iter().map(|x| s(x)).sum::<usize>();
        1 + match self {
            Item::Join { client, group } | Item::Leave { client, group } => s(client) + s(group),
            Item::Gone { client, .. } => s(client) + 1,
            Item::Message {
                client,
                groups,
                payload,
                flags,
                mess_type,
                ..
            } => s(client) + 1 + ext_len(*flags, *mess_type) + list(groups) + 4 + payload.len(),
            Item::Fragment {
                client,
                groups,
                bytes,
                flags,
                mess_type,
                ..
            } => {
                s(client)
                    + 1
                    + ext_len(*flags, *mess_type)
                    + list(groups)
                    + 8
                    + 4
                    + 4
                    + 4
                    + bytes.len()
            }
            Item::TablePartial {
                client,
                groups,
                bytes,
                ..
            } => 4 + 4 + s(client) + 1 + 3 + list(groups) + 8 + 4 + 4 + 4 + bytes.len(),
            Item::Snapshot { clients, .. } => {
                8 + 1 + 4 + clients.iter().map(|(c, g)| s(c) + list(g)).sum::<usize>()
            }
            Item::Goodbye => 0,
            Item::Received { .. } => 8,
            Item::RegionFlush { delivered, .. } => 4 + 1 + 8 + 2 + 12 * delivered.len(),
            Item::Table {
                release,
                settled,
                entries,
                ..
            } => {
                4 + 8
                    + 4
                    + 20
                    + 1
                    + if release.is_some() { 8 } else { 0 }
                    + 2
                    + 4 * settled.len()
                    + 4
                    + entries
                        .iter()
                        .map(|(_, c, g)| 4 + s(c) + list(g))
                        .sum::<usize>()
            }
        }
    }

    /// Appends the item to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), GroupsError> {
        let mut w = Writer { out };
        match self {
            Item::Join { client, group } => {
                w.u8(JOIN);
                w.str(client)?;
                w.str(group)?;
            }
            Item::Leave { client, group } => {
                w.u8(LEAVE);
                w.str(client)?;
                w.str(group)?;
            }
            Item::Gone { client, reason } => {
                w.u8(GONE);
                w.str(client)?;
                w.u8(*reason);
            }
            Item::Message {
                client,
                service,
                flags,
                mess_type,
                groups,
                payload,
            } => {
                let ext = ext_len(*flags, *mess_type) > 0;
                w.u8(if ext { MESSAGE_EXT } else { MESSAGE });
                w.str(client)?;
                w.u8(*service);
                if ext {
                    w.u8(*flags);
                    w.out.extend_from_slice(&mess_type.to_be_bytes());
                }
                w.list(groups)?;
                w.bytes(payload)?;
            }
            Item::Fragment {
                client,
                service,
                flags,
                mess_type,
                groups,
                id,
                total,
                offset,
                bytes,
            } => {
                let ext = ext_len(*flags, *mess_type) > 0;
                w.u8(if ext { FRAGMENT_EXT } else { FRAGMENT });
                w.str(client)?;
                w.u8(*service);
                if ext {
                    w.u8(*flags);
                    w.out.extend_from_slice(&mess_type.to_be_bytes());
                }
                w.list(groups)?;
                w.out.extend_from_slice(&id.to_be_bytes());
                w.out.extend_from_slice(&total.to_be_bytes());
                w.out.extend_from_slice(&offset.to_be_bytes());
                w.bytes(bytes)?;
            }
            Item::TablePartial {
                joiner,
                daemon,
                client,
                service,
                flags,
                mess_type,
                groups,
                id,
                total,
                offset,
                bytes,
            } => {
                w.u8(TABLE_PARTIAL);
                w.out.extend_from_slice(&joiner.to_be_bytes());
                w.out.extend_from_slice(&daemon.to_be_bytes());
                w.str(client)?;
                w.u8(*service);
                w.u8(*flags);
                w.out.extend_from_slice(&mess_type.to_be_bytes());
                w.list(groups)?;
                w.out.extend_from_slice(&id.to_be_bytes());
                w.out.extend_from_slice(&total.to_be_bytes());
                w.out.extend_from_slice(&offset.to_be_bytes());
                w.bytes(bytes)?;
            }
            Item::Snapshot {
                epoch,
                first,
                last,
                clients,
            } => {
                w.u8(SNAPSHOT);
                w.out.extend_from_slice(&epoch.to_be_bytes());
                w.u8(u8::from(*first) | u8::from(*last) << 1);
                let count = u32::try_from(clients.len()).map_err(|_| GroupsError::TooLong {
                    what: "snapshot",
                    len: clients.len(),
                })?;
                w.out.extend_from_slice(&count.to_be_bytes());
                for (client, groups) in clients {
                    w.str(client)?;
                    w.list(groups)?;
                }
            }
            Item::Goodbye => w.u8(GOODBYE),
            Item::Received { gseq } => {
                w.u8(RECEIVED);
                w.out.extend_from_slice(&gseq.to_be_bytes());
            }
            Item::RegionFlush {
                instance,
                cut,
                sent,
                delivered,
            } => {
                w.u8(REGION_FLUSH);
                w.out.extend_from_slice(&instance.to_be_bytes());
                w.u8(u8::from(*cut));
                w.out.extend_from_slice(&sent.to_be_bytes());
                let n = u16::try_from(delivered.len()).map_err(|_| GroupsError::TooLong {
                    what: "region flush",
                    len: delivered.len(),
                })?;
                w.out.extend_from_slice(&n.to_be_bytes());
                for (source, upto) in delivered {
                    w.out.extend_from_slice(&source.to_be_bytes());
                    w.out.extend_from_slice(&upto.to_be_bytes());
                }
            }
            Item::Table {
                joiner,
                as_of,
                view_ids,
                first,
                last,
                release,
                settled,
                entries,
            } => {
                w.u8(TABLE);
                w.out.extend_from_slice(&joiner.to_be_bytes());
                w.out.extend_from_slice(&as_of.0.to_be_bytes());
                w.out.extend_from_slice(&as_of.1.to_be_bytes());
                w.out.extend_from_slice(&view_ids.0.to_be_bytes());
                w.out.extend_from_slice(&view_ids.1.to_be_bytes());
                w.out.extend_from_slice(&view_ids.2.to_be_bytes());
                let flags = match release {
                    None => 0,
                    Some((false, _)) => 4,
                    Some((true, _)) => 4 | 8,
                };
                w.u8(u8::from(*first) | u8::from(*last) << 1 | flags);
                if let Some((_, at)) = release {
                    w.out.extend_from_slice(&at.to_be_bytes());
                }
                let too_long = |len| GroupsError::TooLong { what: "table", len };
                let n = u16::try_from(settled.len()).map_err(|_| too_long(settled.len()))?;
                w.out.extend_from_slice(&n.to_be_bytes());
                for d in settled {
                    w.out.extend_from_slice(&d.to_be_bytes());
                }
                let n = u32::try_from(entries.len()).map_err(|_| too_long(entries.len()))?;
                w.out.extend_from_slice(&n.to_be_bytes());
                for (daemon, client, groups) in entries {
                    w.out.extend_from_slice(&daemon.to_be_bytes());
                    w.str(client)?;
                    w.list(groups)?;
                }
            }
        }
        Ok(())
    }
}

struct Writer<'o> {
    out: &'o mut Vec<u8>,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    fn str(&mut self, s: &str) -> Result<(), GroupsError> {
        let len = u16::try_from(s.len()).map_err(|_| GroupsError::TooLong {
            what: "string",
            len: s.len(),
        })?;
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn list(&mut self, l: &[&str]) -> Result<(), GroupsError> {
        let count = u16::try_from(l.len()).map_err(|_| GroupsError::TooLong {
            what: "list",
            len: l.len(),
        })?;
        self.out.extend_from_slice(&count.to_be_bytes());
        l.iter().try_for_each(|s| self.str(s))
    }

    fn bytes(&mut self, b: &[u8]) -> Result<(), GroupsError> {
        let len = u32::try_from(b.len()).map_err(|_| GroupsError::TooLong {
            what: "bytes",
            len: b.len(),
        })?;
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(b);
        Ok(())
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GroupsError> {
        if self.rest.len() < n {
            return Err(GroupsError::Truncated(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GroupsError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, GroupsError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GroupsError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GroupsError> {
        let b = self.take(8, what)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str, GroupsError> {
        let len = usize::from(self.u16(what)?);
        let b = self.take(len, what)?;
        std::str::from_utf8(b).map_err(|_| GroupsError::BadUtf8(what))
    }

    fn list(&mut self, what: &'static str) -> Result<Vec<&'a str>, GroupsError> {
        let count = usize::from(self.u16(what)?);
        // Each string takes at least its 2-byte length.
        if count > self.rest.len() / 2 {
            return Err(GroupsError::CountTooLarge { what, count });
        }
        (0..count).map(|_| self.str(what)).collect()
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], GroupsError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// The flags and message type of an `_EXT` tag; zeros for the short one.
    fn ext(&mut self, ext: bool) -> Result<(u8, u16), GroupsError> {
        if !ext {
            return Ok((0, 0));
        }
        let flags = self.u8("flags")?;
        let mess_type = self.u16("message type")?;
        if flags == 0 && mess_type == 0 {
            return Err(GroupsError::EmptyExtension);
        }
        Ok((flags, mess_type))
    }

    fn item(&mut self) -> Result<Item<'a>, GroupsError> {
        Ok(match self.u8("tag")? {
            JOIN => Item::Join {
                client: self.str("client")?,
                group: self.str("group")?,
            },
            LEAVE => Item::Leave {
                client: self.str("client")?,
                group: self.str("group")?,
            },
            GONE => Item::Gone {
                client: self.str("client")?,
                reason: self.u8("reason")?,
            },
            tag @ (MESSAGE | MESSAGE_EXT) => {
                let client = self.str("client")?;
                let service = self.u8("service")?;
                let (flags, mess_type) = self.ext(tag == MESSAGE_EXT)?;
                Item::Message {
                    client,
                    service,
                    flags,
                    mess_type,
                    groups: self.list("groups")?,
                    payload: self.bytes("payload")?,
                }
            }
            tag @ (FRAGMENT | FRAGMENT_EXT) => {
                let client = self.str("client")?;
                let service = self.u8("service")?;
                let (flags, mess_type) = self.ext(tag == FRAGMENT_EXT)?;
                Item::Fragment {
                    client,
                    service,
                    flags,
                    mess_type,
                    groups: self.list("groups")?,
                    id: self.u64("message id")?,
                    total: self.u32("total length")?,
                    offset: self.u32("offset")?,
                    bytes: self.bytes("fragment")?,
                }
            }
            TABLE_PARTIAL => Item::TablePartial {
                joiner: self.u32("partial joiner")?,
                daemon: self.u32("partial daemon")?,
                client: self.str("client")?,
                service: self.u8("service")?,
                flags: self.u8("flags")?,
                mess_type: self.u16("message type")?,
                groups: self.list("groups")?,
                id: self.u64("message id")?,
                total: self.u32("total length")?,
                offset: self.u32("offset")?,
                bytes: self.bytes("partial")?,
            },
            SNAPSHOT => {
                let epoch = self.u64("snapshot epoch")?;
                let flags = self.u8("snapshot flags")?;
                if flags > 3 {
                    return Err(GroupsError::BadFlags(flags));
                }
                let count = self.u32("snapshot count")? as usize;
                // Each entry takes at least 4 bytes.
                if count > self.rest.len() / 4 {
                    return Err(GroupsError::CountTooLarge {
                        what: "snapshot",
                        count,
                    });
                }
                let mut clients = Vec::with_capacity(count);
                for _ in 0..count {
                    clients.push((self.str("client")?, self.list("groups")?));
                }
                Item::Snapshot {
                    epoch,
                    first: flags & 1 != 0,
                    last: flags & 2 != 0,
                    clients,
                }
            }
            GOODBYE => Item::Goodbye,
            RECEIVED => Item::Received {
                gseq: self.u64("received gseq")?,
            },
            TABLE => {
                let joiner = self.u32("table joiner")?;
                let as_of = (self.u64("table gseq")?, self.u32("table index")?);
                let view_ids = (
                    self.u64("table epoch")?,
                    self.u64("table changes")?,
                    self.u32("table owner")?,
                );
                let flags = self.u8("table flags")?;
                // Bit 8 (transitional) only with bit 4 (a release).
                if flags > 15 || flags & 12 == 8 {
                    return Err(GroupsError::BadFlags(flags));
                }
                let release = if flags & 4 != 0 {
                    Some((flags & 8 != 0, self.u64("table release view")?))
                } else {
                    None
                };
                let n = usize::from(self.u16("table settled")?);
                if n > self.rest.len() / 4 {
                    return Err(GroupsError::CountTooLarge {
                        what: "table settled",
                        count: n,
                    });
                }
                let settled = (0..n)
                    .map(|_| self.u32("table settled"))
                    .collect::<Result<_, _>>()?;
                let count = self.u32("table count")? as usize;
                // Each entry takes at least 8 bytes.
                if count > self.rest.len() / 8 {
                    return Err(GroupsError::CountTooLarge {
                        what: "table",
                        count,
                    });
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let daemon = self.u32("table daemon")?;
                    entries.push((daemon, self.str("client")?, self.list("groups")?));
                }
                Item::Table {
                    joiner,
                    as_of,
                    view_ids,
                    first: flags & 1 != 0,
                    last: flags & 2 != 0,
                    release,
                    settled,
                    entries,
                }
            }
            REGION_FLUSH => {
                let instance = self.u32("flush instance")?;
                let flags = self.u8("flush flags")?;
                if flags > 1 {
                    return Err(GroupsError::BadFlags(flags));
                }
                let sent = self.u64("flush sent")?;
                let n = usize::from(self.u16("flush count")?);
                if n > self.rest.len() / 12 {
                    return Err(GroupsError::CountTooLarge {
                        what: "region flush",
                        count: n,
                    });
                }
                let delivered = (0..n)
                    .map(|_| Ok((self.u32("flush source")?, self.u64("flush delivered")?)))
                    .collect::<Result<_, GroupsError>>()?;
                Item::RegionFlush {
                    instance,
                    cut: flags == 1,
                    sent,
                    delivered,
                }
            }
            other => return Err(GroupsError::UnknownTag(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn roundtrip(items: &[Item<'_>]) {
        let mut out = Vec::new();
        encode(items, &mut out).unwrap();
        let len: usize = 2 + items.iter().map(Item::encoded_len).sum::<usize>();
        assert_eq!(out.len(), len);
        assert_eq!(decode(&out).unwrap(), items);
    }

    #[test]
    fn every_item_round_trips() {
        roundtrip(&[
            Item::Join {
                client: "#a#n1",
                group: "chat",
            },
            Item::Leave {
                client: "#a#n1",
                group: "chat",
            },
            Item::Gone {
                client: "#b#n1",
                reason: 2,
            },
            Item::Message {
                client: "#a#n1",
                service: 5,
                flags: 0,
                mess_type: 0,
                groups: vec!["chat", "log"],
                payload: b"hello",
            },
            Item::Message {
                client: "#a#n1",
                service: 5,
                flags: 1,
                mess_type: 0,
                groups: vec!["chat"],
                payload: b"typed",
            },
            Item::Message {
                client: "#a#n1",
                service: 2,
                flags: 0,
                mess_type: 40_000,
                groups: vec!["chat"],
                payload: b"",
            },
            Item::Fragment {
                client: "#a#n1",
                service: 3,
                flags: 0,
                mess_type: 0,
                groups: vec!["big"],
                id: 9,
                total: 100_000,
                offset: 60_000,
                bytes: &[7; 300],
            },
            Item::Fragment {
                client: "#a#n1",
                service: 6,
                flags: 1,
                mess_type: 7,
                groups: vec!["big"],
                id: 10,
                total: 100_000,
                offset: 0,
                bytes: &[8; 30],
            },
            Item::TablePartial {
                joiner: 513,
                daemon: 258,
                client: "#a#n2",
                service: 3,
                flags: 0,
                mess_type: 0,
                groups: vec!["big", "log"],
                id: 11,
                total: 100_000,
                offset: 16_000,
                bytes: &[9; 400],
            },
            Item::Snapshot {
                epoch: 7,
                first: true,
                last: false,
                clients: vec![("#a#n1", vec!["chat", "log"]), ("#c#n1", vec![])],
            },
            Item::Goodbye,
            Item::Received { gseq: 1 << 40 },
            Item::RegionFlush {
                instance: 0xDEAD_BEEF,
                cut: true,
                sent: 7,
                delivered: vec![(0x100, 3), (0x201, 1 << 33)],
            },
            Item::RegionFlush {
                instance: 1,
                cut: false,
                sent: 0,
                delivered: vec![],
            },
            Item::Table {
                joiner: 0x201,
                as_of: (77, 3),
                view_ids: (5, 9, 1),
                first: true,
                last: true,
                release: Some((true, 77)),
                settled: vec![0x100, 0x102],
                entries: vec![(0x100, "#a#n0", vec!["chat"]), (0x102, "#b#n2", vec![])],
            },
            Item::Table {
                joiner: 0x201,
                as_of: (78, 0),
                view_ids: (5, 10, 1),
                first: false,
                last: true,
                release: Some((false, 1 << 40)),
                settled: vec![],
                entries: vec![],
            },
            Item::Table {
                joiner: 0x201,
                as_of: (78, 0),
                view_ids: (5, 10, 1),
                first: true,
                last: false,
                release: None,
                settled: vec![0x100],
                entries: vec![],
            },
        ]);
        roundtrip(&[]);
    }

    #[test]
    fn malformed_batches_are_refused() {
        let mut good = Vec::new();
        encode(
            &[Item::Join {
                client: "a",
                group: "g",
            }],
            &mut good,
        )
        .unwrap();
        let mut trailing = good.clone();
        trailing.push(0);
        let cases: Vec<(Vec<u8>, GroupsError)> = vec![
            (vec![], GroupsError::Truncated("item count")),
            (
                vec![0xFF, 0xFF, 1],
                GroupsError::CountTooLarge {
                    what: "item",
                    count: 0xFFFF,
                },
            ),
            (vec![0, 1, 99], GroupsError::UnknownTag(99)),
            (
                good[..good.len() - 1].to_vec(),
                GroupsError::Truncated("group"),
            ),
            (trailing, GroupsError::TrailingBytes(1)),
            (
                vec![0, 1, JOIN, 0, 1, 0xFF, 0, 0],
                GroupsError::BadUtf8("client"),
            ),
            (
                vec![
                    0, 1, SNAPSHOT, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0xFF, 0xFF, 0xFF, 0xFF,
                ],
                GroupsError::CountTooLarge {
                    what: "snapshot",
                    count: u32::MAX as usize,
                },
            ),
            (
                vec![0, 1, MESSAGE, 0, 1, b'a', 5, 0xFF, 0xFF],
                GroupsError::CountTooLarge {
                    what: "groups",
                    count: 0xFFFF,
                },
            ),
            (
                vec![0, 1, SNAPSHOT, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0],
                GroupsError::BadFlags(4),
            ),
            (
                // A transitional release bit without the release bit.
                [&[0, 1, TABLE][..], &[0; 36], &[8]].concat(),
                GroupsError::BadFlags(8),
            ),
            (
                vec![0, 1, RECEIVED, 0, 0, 0],
                GroupsError::Truncated("received gseq"),
            ),
            (
                vec![0, 1, MESSAGE_EXT, 0, 1, b'a', 5, 0, 0, 0],
                GroupsError::EmptyExtension,
            ),
            (
                vec![0, 1, FRAGMENT_EXT, 0, 1, b'a', 5, 1],
                GroupsError::Truncated("message type"),
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(decode(&bytes), Err(expected), "{bytes:?}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn messages_round_trip(
            client in "[a-z#]{1,12}",
            groups in proptest::collection::vec("[a-z]{1,8}", 1..4),
            payload in proptest::collection::vec(any::<u8>(), 0..100),
            flags in 0u8..2,
            mess_type in any::<u16>(),
        ) {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            roundtrip(&[Item::Message {
                client: &client,
                service: 5,
                flags,
                mess_type,
                groups,
                payload: &payload,
            }]);
        }
    }
}
