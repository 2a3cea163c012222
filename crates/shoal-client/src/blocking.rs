//! The blocking client, on `std` sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use shoal_wire::client::Frame;

use crate::{
    after_disconnect, connect_answer, received, ClientError, Encoder, Endpoint, Limits, ReadBuf,
    Received, Service, DISCONNECT_WAIT,
};

/// A connected socket of either kind.
#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn open(endpoint: &Endpoint) -> Result<Stream, ClientError> {
        let unreachable = |error| ClientError::Unreachable {
            endpoint: endpoint.to_string(),
            error,
        };
        match endpoint {
            Endpoint::Unix(path) => UnixStream::connect(path)
                .map(Stream::Unix)
                .map_err(unreachable),
            Endpoint::Tcp { addr, .. } => {
                let stream = TcpStream::connect(addr).map_err(unreachable)?;
                // Each request is one write; do not hold it back.
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
        }
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A blocking connection to the daemon.
///
/// Each request (`join`, `leave`, `multicast`) is encoded whole and
/// written with one `write` where the socket takes it, so there is nothing
/// to flush. Requests are not answered: the daemon reports a refusal with
/// an `Error` frame, which the next [`Client::receive`] returns as
/// [`ClientError::Daemon`].
#[derive(Debug)]
pub struct Client {
    send: SendHalf,
    recv: RecvHalf,
}

impl Client {
    /// Connects to the daemon's Unix socket at its default path
    /// ([`Endpoint::default`]) under the private `name` (unique on that
    /// daemon).
    pub fn connect(name: &str) -> Result<Client, ClientError> {
        Client::connect_to(&Endpoint::default(), name)
    }

    /// Connects to the daemon at `endpoint` under the private `name`.
    pub fn connect_to(endpoint: &Endpoint, name: &str) -> Result<Client, ClientError> {
        Client::connect_with_limits(endpoint, name, Limits::default())
    }

    /// As [`Client::connect_to`], decoding (and checking requests) with
    /// `limits` instead of the defaults: for a daemon configured with
    /// larger limits.
    pub fn connect_with_limits(
        endpoint: &Endpoint,
        name: &str,
        limits: Limits,
    ) -> Result<Client, ClientError> {
        let mut enc = Encoder::new(limits);
        enc.connect(name, endpoint.token())?;
        let stream = Stream::open(endpoint)?;
        let mut send = SendHalf {
            stream: stream.try_clone()?,
            enc,
            private_group: String::new(),
        };
        send.write_out()?;
        let mut recv = RecvHalf {
            stream,
            buf: ReadBuf::new(limits),
            timeout: None,
            private_group: String::new(),
        };
        let private_group =
            connect_answer(recv.next_frame(None)?.ok_or(ClientError::Disconnected)?)?;
        send.private_group.clone_from(&private_group);
        recv.private_group = private_group;
        Ok(Client { send, recv })
    }

    /// This client's private group: its address, which other members see
    /// as the sender of its messages and in membership lists.
    pub fn private_group(&self) -> &str {
        &self.recv.private_group
    }

    /// Joins `group`; a [`Membership`](crate::Membership) view including
    /// this client follows.
    pub fn join(&mut self, group: &str) -> Result<(), ClientError> {
        self.send.join(group)
    }

    /// Leaves `group`.
    pub fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        self.send.leave(group)
    }

    /// Sends `payload` to every member of `groups` (one message, delivered
    /// once to a member of several of them) with the guarantee `service`.
    /// The sender need not be a member.
    pub fn multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.send.multicast(service, groups, payload)
    }

    /// Sends each of `payloads` as one message, as [`Client::multicast`]
    /// would one after the other, but in a single write to the daemon:
    /// for a sender with many messages ready, far fewer system calls on
    /// both sides. The daemon orders them as consecutive messages of this
    /// client. All or nothing: if one payload is refused (say, over the
    /// size limit) none is sent and the error names it.
    pub fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        groups: &[G],
        payloads: &[P],
    ) -> Result<(), ClientError> {
        self.send.multicast_batch(service, groups, payloads)
    }

    /// Waits for the next message or view.
    pub fn receive(&mut self) -> Result<Received, ClientError> {
        self.recv.receive()
    }

    /// As [`Client::receive`], but gives up after `timeout`: `Ok(None)`.
    /// Bytes of a frame that has not fully arrived stay buffered for the
    /// next call.
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Received>, ClientError> {
        self.recv.receive_timeout(timeout)
    }

    /// Says goodbye and waits (at most [`DISCONNECT_WAIT`]) for the daemon
    /// to close the connection. Messages still arriving are dropped; an
    /// `Error` the daemon still had for this client (say, a refused
    /// multicast) is returned as [`ClientError::Daemon`].
    pub fn disconnect(self) -> Result<(), ClientError> {
        let Client { mut send, mut recv } = self;
        match send.send_disconnect() {
            Ok(()) => {}
            // Already closed: the daemon may still have said why.
            Err(ClientError::Disconnected) => {}
            Err(e) => return Err(e),
        }
        let deadline = Instant::now() + DISCONNECT_WAIT;
        loop {
            let frame = match recv.next_frame(Some(deadline)) {
                Ok(Some(frame)) => Ok(frame),
                Ok(None) => return Ok(()),
                Err(e) => Err(e),
            };
            if let Some(result) = after_disconnect(frame) {
                return result;
            }
        }
    }

    /// Splits the client so one thread can send while another receives.
    /// Both halves use the same connection.
    pub fn split(self) -> (SendHalf, RecvHalf) {
        (self.send, self.recv)
    }
}

/// The sending half of a [`Client`].
///
/// One thread at a time: to share it, put it in a `Mutex` (each request is
/// one frame, so requests from several threads do not interleave inside
/// the lock).
#[derive(Debug)]
pub struct SendHalf {
    stream: Stream,
    enc: Encoder,
    private_group: String,
}

impl SendHalf {
    /// See [`Client::private_group`].
    pub fn private_group(&self) -> &str {
        &self.private_group
    }

    /// See [`Client::join`].
    pub fn join(&mut self, group: &str) -> Result<(), ClientError> {
        self.enc.join(group)?;
        self.write_out()
    }

    /// See [`Client::leave`].
    pub fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        self.enc.leave(group)?;
        self.write_out()
    }

    /// See [`Client::multicast`].
    pub fn multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.enc.multicast(service, groups, payload)?;
        self.write_out()
    }

    /// See [`Client::multicast_batch`].
    pub fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        groups: &[G],
        payloads: &[P],
    ) -> Result<(), ClientError> {
        self.enc.multicast_batch(service, groups, payloads)?;
        self.write_out()
    }

    /// Says goodbye and stops sending. The daemon then closes the
    /// connection: the [`RecvHalf`] receives what was still on its way,
    /// then [`ClientError::Disconnected`].
    pub fn disconnect(mut self) -> Result<(), ClientError> {
        self.send_disconnect()
    }

    fn send_disconnect(&mut self) -> Result<(), ClientError> {
        self.enc.disconnect()?;
        self.write_out()?;
        // Ignore the error of a socket already closed by the daemon.
        let _ = self.stream.shutdown(Shutdown::Write);
        Ok(())
    }

    /// Writes the encoded frame: one `write` unless the socket takes less.
    fn write_out(&mut self) -> Result<(), ClientError> {
        let result = self.stream.write_all(&self.enc.out);
        self.enc.written();
        result.map_err(ClientError::from)
    }
}

/// The receiving half of a [`Client`].
#[derive(Debug)]
pub struct RecvHalf {
    stream: Stream,
    buf: ReadBuf,
    /// The socket's read timeout as last set.
    timeout: Option<Duration>,
    private_group: String,
}

impl RecvHalf {
    /// See [`Client::private_group`].
    pub fn private_group(&self) -> &str {
        &self.private_group
    }

    /// See [`Client::receive`].
    pub fn receive(&mut self) -> Result<Received, ClientError> {
        let frame = self.next_frame(None)?.ok_or(ClientError::Disconnected)?;
        received(frame)
    }

    /// See [`Client::receive_timeout`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Received>, ClientError> {
        // An unrepresentable deadline is as good as none.
        let deadline = Instant::now().checked_add(timeout);
        match deadline {
            Some(_) => self.next_frame(deadline)?.map(received).transpose(),
            None => self.receive().map(Some),
        }
    }

    /// The next frame, or `None` once `deadline` passed.
    fn next_frame(&mut self, deadline: Option<Instant>) -> Result<Option<Frame>, ClientError> {
        loop {
            if let Some(frame) = self.buf.frame()? {
                return Ok(Some(frame));
            }
            // A zero timeout means "none" to the socket: poll with the
            // shortest instead.
            let timeout = deadline.map(|d| {
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(1))
            });
            if timeout != self.timeout {
                self.stream.set_read_timeout(timeout)?;
                self.timeout = timeout;
            }
            match self.stream.read(self.buf.spare()) {
                Ok(0) => return Err(ClientError::Disconnected),
                Ok(n) => self.buf.filled(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
