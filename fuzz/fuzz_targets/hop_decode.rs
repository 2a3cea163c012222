//! The Hop link's wire decoder (`shoal_wire::hop`) fed arbitrary bytes: no
//! panic, no allocation beyond what the bytes hold (NACK counts are checked
//! first), and whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::hop::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok((link, items)) = decode(data) {
        let again = encode(link, &items).expect("a decoded datagram encodes");
        assert_eq!(again.as_slice(), data, "canonical encoding");
    }
});
