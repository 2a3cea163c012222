//! Any bytes from the network: decoding must never panic, and every packet it
//! accepts must encode back to the very bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut offset = 0;
    for item in shoal_wire::packets(data) {
        let Ok((header, packet)) = item else { break };
        let len = shoal_wire::HEADER_LEN + header.body_len;
        let encoded = packet.to_vec(header.sender).expect("decoded packets re-encode");
        assert_eq!(&encoded[..], &data[offset..offset + len]);
        offset += len;
    }
});
