//! The sites layer's byte formats (`shoal_core::sites::codec`) fed
//! arbitrary bytes: the site-stream element, the ring message, the gateway
//! message inside Hop, the outer WAN header and the site membership's
//! `Alive`. The first byte picks the
//! decoder. No panic, no allocation beyond what the bytes hold, and
//! whatever decodes re-encodes to the very bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::sites::codec::{parse_wan, wan_header, Element, RingMsg, WanMsg};
use shoal_core::sites::membership::Alive;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => {
            if let Ok(e) = Element::decode(bytes) {
                assert_eq!(&e.encode()[..], bytes, "canonical element");
            }
        }
        1 => {
            if let Ok(m) = RingMsg::decode(bytes) {
                assert_eq!(&m.encode()[..], bytes, "canonical ring message");
            }
        }
        2 => {
            if let Ok(m) = WanMsg::decode(bytes) {
                assert_eq!(&m.encode()[..], bytes, "canonical gateway message");
            }
        }
        3 => {
            if let Ok(a) = Alive::decode(bytes) {
                assert_eq!(a.encode(), bytes, "canonical alive");
            }
        }
        _ => {
            if let Ok((kind, epoch, site, rest)) = parse_wan(bytes) {
                let mut again = wan_header(kind, epoch, site);
                again.extend_from_slice(rest);
                assert_eq!(again.as_slice(), bytes, "canonical WAN header");
            }
        }
    }
});
