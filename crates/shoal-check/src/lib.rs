//! Shoal's history checker: the one judge of a group-communication history.
//!
//! A history is every client's own record stream ([`Record`]): what it sent,
//! what it delivered, which views it installed, what its daemon said was not
//! delivered, and when its session ended. There is no clock across clients;
//! within one client, records are in the order that client saw them. The
//! checker judges the properties of virtual synchrony (Birman), Spread's
//! service types (Amir, Danilov, Stanton) and, designed in from the start,
//! extended virtual synchrony (Moser, Amir, Melliar-Smith, Agarwal): see
//! [`Kind`] and the precise definitions in `README.md` beside this crate.
//!
//! ```
//! use shoal_check::{Checker, Record, Service};
//! let mut ch = Checker::new();
//! ch.add(Record::view("#a", "g", 1, &["#a"]));
//! ch.add(Record::send("#a", 1, Service::Agreed, &["g"]));
//! ch.add(Record::deliver("#a", "#a", 1, Service::Agreed, &["g"]));
//! assert!(ch.finish().is_clean());
//! ```

mod check;
mod record;
mod report;

pub use check::Checker;
pub use record::{read_jsonl, read_jsonl_file, MsgId, ReadError, Record, Service};
pub use report::{Kind, Report, Summary};

/// Checks a whole history at once.
pub fn check(records: impl IntoIterator<Item = Record>) -> Report {
    let mut c = Checker::new();
    c.extend(records);
    c.finish()
}

#[cfg(test)]
mod tests;
