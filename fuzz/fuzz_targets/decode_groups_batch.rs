//! The daemons' groups-batch decoder (`shoal_wire::groups`) fed arbitrary
//! bytes, as a daemon reads a peer's delivered message: no panic, no
//! allocation beyond what the bytes hold, and whatever decodes re-encodes
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::groups::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(items) = decode(data) {
        let mut again = Vec::new();
        encode(&items, &mut again).expect("a decoded batch encodes");
        assert_eq!(again.as_slice(), data, "canonical encoding");
    }
});
