//! Any bytes from the network offered to an `Opener`: opening must never
//! panic, must refuse them (they carry no valid tag), and must count each
//! refusal exactly once. The same bytes sealed with the cluster key must open
//! to themselves, once, and not with any single byte changed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_net::{AuthError, ClusterKey, Mode, Opener, OpenerConfig, Sealer};

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([0x5A; 32]);
    let config = OpenerConfig {
        window: 64,
        max_senders: 4,
    };
    let mut opener = Opener::new(&key, config);
    let mut out = Vec::new();
    assert!(opener.open(data, &mut out).is_err());
    let stats = opener.stats();
    assert_eq!(stats.bad_format + stats.bad_tag, 1);

    let mode = if data.first().is_some_and(|b| b & 1 == 1) {
        Mode::Encrypt
    } else {
        Mode::Authenticate
    };
    let mut sealer = Sealer::new(&key, mode, 7, 1_700_000_000_000).expect("epoch in range");
    let mut envelope = Vec::new();
    sealer.seal(data, &mut envelope).expect("counter not exhausted");
    let opened = opener.open(&envelope, &mut out).expect("own envelope opens");
    assert_eq!(opened.sender, 7);
    assert_eq!(opened.datagram, data);
    assert_eq!(opener.open(&envelope, &mut out), Err(AuthError::Replay));

    // Change one byte chosen by the input: always refused.
    let at = data.iter().map(|&b| b as usize).sum::<usize>() % envelope.len();
    envelope[at] ^= data.last().copied().unwrap_or(1).max(1);
    assert!(opener.open(&envelope, &mut out).is_err());
    assert_eq!(opener.stats().accepted, 1);
});
