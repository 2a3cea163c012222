//! The client-protocol decoder fed arbitrary bytes, as a daemon reads them
//! from a client's socket: no panic, no allocation beyond what the bytes
//! hold, and whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_wire::client::{decode, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    while let Ok(Some((frame, used))) = decode(rest, &limits) {
        let again = frame.to_vec().expect("a decoded frame encodes");
        assert_eq!(again.as_slice(), &rest[..used], "canonical encoding");
        rest = &rest[used..];
    }
});
