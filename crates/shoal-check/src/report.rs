//! What the checker found: violations by kind, and what it looked at.

use std::collections::BTreeMap;
use std::fmt;

/// A kind of violation. The precise definition of each is in the crate's
/// README (`crates/shoal-check/README.md`); one line each here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The history itself is ill-formed: a `Send` whose `client` is not
    /// `msg.sender`, a sequence number 0 or not above the sender's previous
    /// one, an empty or inverted `NotDelivered` range, records after `Ended`.
    Malformed,
    /// A delivery of a message nobody sent, or with another service or
    /// another set of groups than it was sent with.
    NotSent,
    /// A client delivered one message twice.
    Duplicate,
    /// A client delivered a message while a member of none of its groups
    /// (its latest view of each destination group lacks it, or it has none).
    NotMember,
    /// FIFO: a receiver delivered two fifo-or-stronger messages of one sender
    /// against their send order.
    Fifo,
    /// Causal: a receiver delivered m' before m although m causally precedes
    /// m' (both causal or stronger).
    Causal,
    /// Total order: the agreed/safe deliveries of the receivers admit no one
    /// order (a cycle in their union).
    TotalOrder,
    /// A safe message delivered in a view (regular, or transitional under
    /// EVS), and a member of that view that goes on to the group's next view
    /// (or never ends) never delivers it.
    Safe,
    /// A sender's own reliable-or-stronger message never delivered to it,
    /// though it was a member of a destination group when sending, never
    /// ended, and was not told `NotDelivered`.
    OwnDelivery,
    /// Two members that install the same view and then the same next view of
    /// a group delivered different sets of that group's messages in between.
    VirtualSynchrony,
    /// One (group, view id, transitional) named with two member lists.
    ViewMembership,
    /// A client's view ids of one group did not increase.
    ViewOrder,
    /// EVS transitional rules: a transitional view not after a regular one
    /// or not a subset of the regular views around it, or a delivery marked
    /// transitional outside a transitional view.
    Transitional,
    /// A reliable-or-stronger message, whose sender never ended and was not
    /// told `NotDelivered`, not delivered to a client that was in a
    /// destination group from the sender's view at the send to the end.
    SilentLoss,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 14] = [
        Kind::Malformed,
        Kind::NotSent,
        Kind::Duplicate,
        Kind::NotMember,
        Kind::Fifo,
        Kind::Causal,
        Kind::TotalOrder,
        Kind::Safe,
        Kind::OwnDelivery,
        Kind::VirtualSynchrony,
        Kind::ViewMembership,
        Kind::ViewOrder,
        Kind::Transitional,
        Kind::SilentLoss,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Malformed => "malformed",
            Kind::NotSent => "not-sent",
            Kind::Duplicate => "duplicate",
            Kind::NotMember => "not-member",
            Kind::Fifo => "fifo",
            Kind::Causal => "causal",
            Kind::TotalOrder => "total-order",
            Kind::Safe => "safe",
            Kind::OwnDelivery => "own-delivery",
            Kind::VirtualSynchrony => "virtual-synchrony",
            Kind::ViewMembership => "view-membership",
            Kind::ViewOrder => "view-order",
            Kind::Transitional => "transitional",
            Kind::SilentLoss => "silent-loss",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the checker looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records read.
    pub records: u64,
    /// Clients with at least one record.
    pub clients: u64,
    /// `Send` records.
    pub sends: u64,
    /// `Deliver` records.
    pub deliveries: u64,
    /// `View` records.
    pub views: u64,
    /// `NotDelivered` records.
    pub not_delivered: u64,
    /// Clients that `Ended`.
    pub ended: u64,
    /// Names listed as members in some view that have no records at all:
    /// nothing is expected of them (a history that leaves clients out is
    /// judged only on the clients it has).
    pub unrecorded_members: u64,
}

/// The verdict on one history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Per kind found: how many times, and the first example (first in the
    /// order of clients by name, then of each client's records).
    pub violations: BTreeMap<Kind, (u64, String)>,
    /// What was looked at.
    pub summary: Summary,
}

impl Report {
    /// No violation of any kind.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many violations of `kind`.
    pub fn count(&self, kind: Kind) -> u64 {
        self.violations.get(&kind).map_or(0, |(n, _)| *n)
    }

    /// The kinds found, in report order.
    pub fn kinds(&self) -> Vec<Kind> {
        self.violations.keys().copied().collect()
    }

    pub(crate) fn flag(&mut self, kind: Kind, example: impl FnOnce() -> String) {
        match self.violations.get_mut(&kind) {
            Some((n, _)) => *n += 1,
            None => {
                self.violations.insert(kind, (1, example()));
            }
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.summary;
        writeln!(
            f,
            "history: {} records from {} clients: {} sends, {} deliveries, {} views, \
             {} not-delivered notices, {} ended, {} unrecorded members",
            s.records,
            s.clients,
            s.sends,
            s.deliveries,
            s.views,
            s.not_delivered,
            s.ended,
            s.unrecorded_members
        )?;
        if self.is_clean() {
            return writeln!(f, "clean: no violations");
        }
        let total: u64 = self.violations.values().map(|(n, _)| n).sum();
        writeln!(f, "VIOLATIONS: {total} of {} kinds", self.violations.len())?;
        for (kind, (n, example)) in &self.violations {
            writeln!(f, "  {kind}: {n}")?;
            writeln!(f, "    first: {example}")?;
        }
        Ok(())
    }
}
