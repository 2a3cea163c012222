//! UDP generic receive offload (Linux `UDP_GRO`): a run of datagrams of
//! one size from one sender, received in one system call.
//!
//! The sending runtime hands the fragments of a large engine datagram to
//! the kernel as one segmented send (`gso.rs`). Across a veth pair and a
//! bridge, or over loopback, that run stays one packet all the way to the
//! receiving socket; a socket without `UDP_GRO` makes the kernel cut it
//! into its datagrams there, and the runtime then paid one `recvfrom`, one
//! pass through the socket layer and one wake-up check per fragment (the
//! largest share of a receiving daemon's system calls). With `UDP_GRO` on,
//! the kernel hands the run over whole, with the segment size in a control
//! message; on a NIC with GRO, datagrams of one flow that arrive together
//! are merged the same way. [`Receiver::receive`] gives the datagrams back
//! one by one, exactly as separate `recvfrom`s would have.
//!
//! Where the option is refused (an older kernel, another system) nothing
//! changes: the socket delivers one datagram per call, and so does
//! [`Receiver::receive`]. A socket with `UDP_GRO` on must only be read
//! through a [`Receiver`], since a plain `recv_from` would return a whole
//! run as one datagram.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;

use tokio::io::Interest;
use tokio::net::UdpSocket;

/// The largest run the kernel hands over at once: a UDP datagram's length
/// field bounds a coalesced packet as it bounds a plain one.
pub const RUN_MAX: usize = 65_536;

/// Turns `UDP_GRO` on; returns whether the kernel took it.
#[cfg(target_os = "linux")]
pub fn enable(socket: &UdpSocket) -> bool {
    use nix::sys::socket::{setsockopt, sockopt::UdpGroSegment};
    setsockopt(socket, UdpGroSegment, &true).is_ok()
}

#[cfg(not(target_os = "linux"))]
pub fn enable(_socket: &UdpSocket) -> bool {
    false
}

/// One receive: `len` bytes from `from`, which are datagrams of `segment`
/// bytes each (the last may be shorter) when `segment` is not zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub len: usize,
    pub from: SocketAddr,
    /// 0: one datagram.
    pub segment: usize,
}

impl Run {
    /// The datagrams of the run, as ranges of the receive buffer (an
    /// empty datagram is one empty range, handled as any other).
    pub fn datagrams(&self) -> impl Iterator<Item = std::ops::Range<usize>> {
        let (len, step) = (self.len, self.step());
        (0..self.count()).map(move |i| i * step..((i + 1) * step).min(len))
    }

    /// How many datagrams the run holds.
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.step()).max(1)
    }

    fn step(&self) -> usize {
        match self.segment {
            0 => self.len.max(1),
            s => s,
        }
    }
}

/// A receive buffer with room for one run and its control message. The
/// default is empty (no buffer, for lending one out); [`Receiver::new`]
/// has room.
#[derive(Default)]
pub struct Receiver {
    buf: Vec<u8>,
    cmsg: Vec<u8>,
    /// Receives whose run was cut short by a full buffer (never expected:
    /// the buffer holds the largest run).
    pub truncated: u64,
}

impl Receiver {
    pub fn new() -> Receiver {
        Receiver {
            buf: vec![0; RUN_MAX],
            cmsg: control_space(),
            truncated: 0,
        }
    }

    /// The bytes of the last receive (valid up to its `len`).
    #[cfg(test)]
    pub fn buf(&self) -> &[u8] {
        &self.buf
    }

    pub fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Receives one datagram or run without blocking (`WouldBlock` when
    /// there is none, which also clears tokio's readiness).
    #[cfg(target_os = "linux")]
    pub fn receive(&mut self, socket: &UdpSocket) -> io::Result<Run> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        let (buf, cmsg) = (&mut self.buf, &mut self.cmsg);
        let (len, from, segment, truncated) = socket.try_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(buf)];
            let msg = recvmsg::<SockaddrStorage>(
                fd,
                &mut iov,
                Some(cmsg.as_mut_slice()),
                MsgFlags::MSG_DONTWAIT,
            )
            .map_err(io::Error::from)?;
            let mut segment = 0;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::UdpGroSegments(size) = c {
                        segment = usize::try_from(size).unwrap_or(0);
                    }
                }
            }
            let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
            let from = msg.address.and_then(|a| socket_addr(&a)).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "datagram without a source")
            })?;
            Ok((msg.bytes, from, segment, truncated))
        })?;
        self.truncated += u64::from(truncated);
        // A run of one datagram, or a segment size the run does not
        // exceed, is one datagram.
        let segment = if segment > 0 && len > segment {
            segment
        } else {
            0
        };
        Ok(Run { len, from, segment })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn receive(&mut self, socket: &UdpSocket) -> io::Result<Run> {
        let (len, from) = socket.try_recv_from(&mut self.buf)?;
        Ok(Run {
            len,
            from,
            segment: 0,
        })
    }
}

#[cfg(target_os = "linux")]
fn control_space() -> Vec<u8> {
    nix::cmsg_space!(i32)
}

#[cfg(not(target_os = "linux"))]
fn control_space() -> Vec<u8> {
    Vec::new()
}

#[cfg(target_os = "linux")]
fn socket_addr(addr: &nix::sys::socket::SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_run_is_cut_at_its_segment_size() {
        let from = SocketAddr::from(([127, 0, 0, 1], 1));
        let run = Run {
            len: 3_000,
            from,
            segment: 1_200,
        };
        let ranges: Vec<_> = run.datagrams().collect();
        assert_eq!(ranges, [0..1_200, 1_200..2_400, 2_400..3_000]);
        assert_eq!(run.count(), 3);
        let one = Run {
            len: 500,
            from,
            segment: 0,
        };
        let ranges: Vec<_> = one.datagrams().map(|r| (r.start, r.end)).collect();
        assert_eq!(ranges, [(0, 500)]);
        assert_eq!(one.count(), 1);
        let empty = Run {
            len: 0,
            from,
            segment: 0,
        };
        let ranges: Vec<_> = empty.datagrams().map(|r| (r.start, r.end)).collect();
        assert_eq!(ranges, [(0, 0)], "an empty datagram is still handled");
    }

    async fn receive_within(rx: &mut Receiver, socket: &UdpSocket) -> Run {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                socket.readable().await.unwrap();
                match rx.receive(socket) {
                    Ok(run) => return run,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .unwrap()
    }

    /// A segmented send arrives at a socket with `UDP_GRO` as one run of
    /// the same datagrams (on Linux; a kernel that refuses either option
    /// gives separate datagrams, which must be the same bytes).
    #[tokio::test]
    async fn a_segmented_send_is_received_as_one_run_of_the_same_datagrams() {
        let rx_socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let gro = enable(&rx_socket);
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let payload: Vec<u8> = (0..3_000u32).map(|i| (i % 251) as u8).collect();
        tx.writable().await.unwrap();
        let segmented = crate::gso::supported()
            && crate::gso::send(
                &tx,
                rx_socket.local_addr().unwrap(),
                &[std::io::IoSlice::new(&payload)],
                1_200,
            )
            .is_ok();
        if !segmented {
            for chunk in payload.chunks(1_200) {
                tx.send_to(chunk, rx_socket.local_addr().unwrap())
                    .await
                    .unwrap();
            }
        }
        let mut rx = Receiver::new();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut runs = 0;
        while got.len() < 3 {
            let run = receive_within(&mut rx, &rx_socket).await;
            assert_eq!(run.from, tx.local_addr().unwrap());
            runs += 1;
            for range in run.datagrams() {
                got.push(rx.buf()[range].to_vec());
            }
        }
        let lens: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(lens, [1_200, 1_200, 600]);
        assert_eq!(got.concat(), payload);
        if gro && segmented {
            assert_eq!(runs, 1, "the run should arrive whole");
        }
        assert_eq!(rx.truncated, 0);
    }

    /// Plain datagrams of different sizes stay separate.
    #[tokio::test]
    async fn separate_datagrams_stay_separate_with_gro_on() {
        let rx_socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        enable(&rx_socket);
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx_socket.local_addr().unwrap();
        for size in [10usize, 1_000, 7] {
            tx.send_to(&vec![size as u8; size], to).await.unwrap();
        }
        let mut rx = Receiver::new();
        for size in [10usize, 1_000, 7] {
            let run = receive_within(&mut rx, &rx_socket).await;
            assert_eq!((run.len, run.segment), (size, 0));
            assert!(rx.buf()[..size].iter().all(|&b| b == size as u8));
        }
    }
}
