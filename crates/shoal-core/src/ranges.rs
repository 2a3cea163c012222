//! Helpers on ascending, disjoint sequence-number ranges.

use shoal_wire::SeqRange;

/// Collects ascending sequence numbers into ranges, merging neighbours.
#[derive(Debug, Default)]
pub struct RangeBuilder {
    ranges: Vec<SeqRange>,
}

impl RangeBuilder {
    /// Adds `seq`, which must be greater than every seq added before.
    pub fn push(&mut self, seq: u64) {
        match self.ranges.last_mut() {
            Some(last) if last.last.checked_add(1) == Some(seq) => last.last = seq,
            _ => self.ranges.push(SeqRange::single(seq)),
        }
    }

    /// Ranges built so far.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The last range, if any.
    pub fn last(&self) -> Option<SeqRange> {
        self.ranges.last().copied()
    }

    pub fn finish(self) -> Vec<SeqRange> {
        self.ranges
    }
}

/// Whether ascending, disjoint `ranges` contain `seq` (binary search).
pub fn contains(ranges: &[SeqRange], seq: u64) -> bool {
    let after = ranges.partition_point(|r| r.last < seq);
    ranges.get(after).is_some_and(|r| r.first <= seq)
}

/// Keeps at most `max` ranges: the oldest `max - 1` and the newest, so the
/// receiver still learns the highest sequence number.
pub fn truncate_keep_last(ranges: &mut Vec<SeqRange>, max: usize) {
    if ranges.len() > max && max > 0 {
        let last = ranges[ranges.len() - 1];
        ranges.truncate(max - 1);
        ranges.push(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: u64, last: u64) -> SeqRange {
        SeqRange::new(first, last).unwrap()
    }

    #[test]
    fn builder_merges_neighbours_only() {
        let mut b = RangeBuilder::default();
        for s in [1, 2, 3, 5, 7, 8] {
            b.push(s);
        }
        assert_eq!(b.finish(), vec![r(1, 3), r(5, 5), r(7, 8)]);
    }

    #[test]
    fn contains_finds_members_and_rejects_holes() {
        let ranges = [r(1, 3), r(5, 5), r(7, 8)];
        let inside: Vec<u64> = (0..10).filter(|s| contains(&ranges, *s)).collect();
        assert_eq!(inside, vec![1, 2, 3, 5, 7, 8]);
    }

    #[test]
    fn truncation_keeps_the_newest_range() {
        let mut ranges = vec![r(1, 1), r(3, 3), r(5, 5), r(7, 7)];
        truncate_keep_last(&mut ranges, 2);
        assert_eq!(ranges, vec![r(1, 1), r(7, 7)]);
    }
}
