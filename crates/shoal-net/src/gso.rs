//! UDP generic segmentation offload (Linux `UDP_SEGMENT`): several
//! datagrams of one size to one address handed to the kernel in one
//! `sendmsg`, which cuts them apart as late as it can (on a veth or a NIC
//! with the offload, after the whole stack was crossed once).
//!
//! The fragments of a large engine datagram (`shoal_core::fragments`) are
//! such a run: every one but the last has the path's size. Sending them
//! one `sendto` each cost a system call, a pass through the UDP and IP
//! layers and often a reschedule per fragment, the largest share of the
//! sending daemon's CPU. So are an engine's datagrams to one address
//! pulled together, while they have one size (a ring's messages to each
//! peer, then its token): the runtime joins them into runs (`node.rs`,
//! `Outgoing::takes`), handed over as one buffer per datagram.
//!
//! The control message is built as bytes (no `unsafe`): on 64-bit Linux a
//! `cmsghdr` is `{ size_t len; int level; int type; }` followed by the data,
//! padded to 8 bytes. Elsewhere [`Gso::supported`] is false and the runtime
//! sends one datagram per call.

use std::io::{self, IoSlice};
use std::net::SocketAddr;

use tokio::io::Interest;
use tokio::net::UdpSocket;

/// `SOL_UDP`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
const SOL_UDP: i32 = 17;
/// `UDP_SEGMENT` (Linux 4.18).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
const UDP_SEGMENT: i32 = 103;
/// Segments one send may carry at most (the kernel's `UDP_MAX_SEGMENTS`
/// is 64 on older kernels, 128 on newer).
pub const MAX_SEGMENTS: usize = 64;
/// Bytes one send may carry at most: a UDP datagram's length field.
pub const MAX_BYTES: usize = 65_507;

/// Whether segmented sends are built on this platform.
pub fn supported() -> bool {
    cfg!(all(target_os = "linux", target_pointer_width = "64"))
}

/// Segments of `segment` bytes that one send may carry.
pub fn segments_per_send(segment: usize) -> usize {
    (MAX_BYTES / segment.max(1)).clamp(1, MAX_SEGMENTS)
}

/// The `UDP_SEGMENT` control message for segments of `segment` bytes.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn control(segment: u16) -> [u8; 24] {
    let mut cmsg = [0u8; 24];
    // CMSG_LEN(2): the 16-byte header and the data.
    cmsg[0..8].copy_from_slice(&18u64.to_ne_bytes());
    cmsg[8..12].copy_from_slice(&SOL_UDP.to_ne_bytes());
    cmsg[12..16].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
    cmsg[16..18].copy_from_slice(&segment.to_ne_bytes());
    cmsg
}

/// Sends `payload` (its buffers back to back) to `to` as datagrams of
/// `segment` bytes (the last may be shorter) in one system call. An
/// error other than `WouldBlock` may mean that the path does not take
/// segmented sends (`EIO` without checksum offload): the caller sends
/// the datagrams one by one instead.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub fn send(
    socket: &UdpSocket,
    to: SocketAddr,
    payload: &[IoSlice<'_>],
    segment: usize,
) -> io::Result<()> {
    let Ok(size) = u16::try_from(segment) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "segment too large",
        ));
    };
    let cmsg = control(size);
    let addr = socket2::SockAddr::from(to);
    let msg = socket2::MsgHdr::new()
        .with_addr(&addr)
        .with_buffers(payload)
        .with_control(&cmsg);
    socket.try_io(Interest::WRITABLE, || {
        socket2::SockRef::from(socket).sendmsg(&msg, 0).map(|_| ())
    })
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub fn send(
    _socket: &UdpSocket,
    _to: SocketAddr,
    _payload: &[IoSlice<'_>],
    _segment: usize,
) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no UDP GSO here",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_per_send_stay_within_the_datagram_and_the_kernel_limit() {
        assert_eq!(segments_per_send(1_472), 44);
        assert_eq!(segments_per_send(100), MAX_SEGMENTS);
        assert_eq!(segments_per_send(65_507), 1);
        assert!(segments_per_send(1_472) * 1_472 <= MAX_BYTES);
    }

    /// One segmented send on loopback arrives as separate datagrams of the
    /// segment size (Linux 4.18 and later; elsewhere nothing to test).
    #[tokio::test]
    async fn a_segmented_send_arrives_as_separate_datagrams() {
        if !supported() {
            return;
        }
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let payload: Vec<u8> = (0..3_000u32).map(|i| i as u8).collect();
        tx.writable().await.unwrap();
        // In three buffers, cut elsewhere than the segments.
        let bufs = [
            IoSlice::new(&payload[..700]),
            IoSlice::new(&payload[700..2_500]),
            IoSlice::new(&payload[2_500..]),
        ];
        send(&tx, rx.local_addr().unwrap(), &bufs, 1_200).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4_096];
        for _ in 0..3 {
            let (n, _) =
                tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv_from(&mut buf))
                    .await
                    .unwrap()
                    .unwrap();
            got.push(buf[..n].to_vec());
        }
        let lens: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(lens, [1_200, 1_200, 600]);
        assert_eq!(got.concat(), payload);
    }
}
