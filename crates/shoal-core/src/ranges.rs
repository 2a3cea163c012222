//! Helpers on ascending sequence-number ranges.
