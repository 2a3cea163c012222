//! The Ring's wire decoder (`shoal_wire::ring`) fed arbitrary bytes
//! (tokens, data, joins, merge detects, commit tokens): no panic, no
//! allocation beyond what the bytes hold, and whatever decodes re-encodes
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::ring::decode;

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = decode(data) {
        assert_eq!(packet.encode().as_slice(), data, "canonical encoding");
    }
});
