//! The blocking client, on `std` sockets.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use shoal_wire::client::Frame;

use crate::{
    after_disconnect, connect_answer, members_answer, split_private_group, stale_answer,
    ClientError, DaemonFlow, Encoder, Endpoint, FlowControl, FlowControlState, Limits, ReadBuf,
    Received, SendOptions, Service, Views, DISCONNECT_WAIT, FLOW_STEP,
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

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }

    /// Writes what the socket takes now without waiting (`MSG_DONTWAIT`,
    /// for this call only: the other half's reads stay blocking).
    fn send_now(&self, bytes: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(&self.fd())
            .send_with_flags(bytes, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
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
    /// The last flow-control query's number.
    flow_nonce: u32,
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
            pending: Vec::new(),
            self_discard: false,
        };
        send.write_out()?;
        let mut recv = RecvHalf {
            stream,
            buf: ReadBuf::new(limits),
            timeout: None,
            private_group: String::new(),
            views: Views::default(),
            backlog: VecDeque::new(),
        };
        let private_group =
            connect_answer(recv.next_frame(None)?.ok_or(ClientError::Disconnected)?)?;
        send.private_group.clone_from(&private_group);
        recv.private_group = private_group;
        Ok(Client {
            send,
            recv,
            flow_nonce: 0,
        })
    }

    /// This client's private group: its address, which other members see
    /// as the sender of its messages and in membership lists.
    pub fn private_group(&self) -> &str {
        &self.recv.private_group
    }

    /// The private name this client connected under.
    pub fn name(&self) -> &str {
        split_private_group(&self.recv.private_group).map_or("", |(n, _)| n)
    }

    /// The name of the daemon this client is connected to (the last part
    /// of its private group; `shoal status` shows it).
    pub fn daemon(&self) -> &str {
        split_private_group(&self.recv.private_group).map_or("", |(_, d)| d)
    }

    /// Self-discard for every later [`Client::multicast`] and
    /// [`Client::multicast_batch`] of this connection (Spread's
    /// SELF_DISCARD): the daemon does not deliver them back to it.
    /// [`Client::multicast_with`] says it per message instead.
    pub fn set_self_discard(&mut self, on: bool) {
        self.send.self_discard = on;
    }

    /// As [`Client::multicast`], with per-message options (self-discard,
    /// a message type).
    pub fn multicast_with<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.send.multicast_with(service, groups, payload, opts)
    }

    /// A multicast that never waits: if the daemon's end of the connection
    /// is full (what was accepted before is not all written yet) it sends
    /// nothing and returns [`ClientError::WouldBlock`]. Otherwise the
    /// message is accepted: written now, or, when the socket takes only
    /// part of it, the rest kept in the client and written first by the
    /// next send of any kind (or by [`Client::flush`]).
    pub fn try_multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.send.try_multicast(service, groups, payload, opts)
    }

    /// Whether the daemon is taking this client's sends (after trying,
    /// without waiting, to write what `try_multicast` left pending).
    pub fn flow_control(&mut self) -> Result<FlowControl, ClientError> {
        self.send.flow_control()
    }

    /// Writes what `try_multicast` left pending, waiting as needed.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.send.flush()
    }

    /// As [`Client::receive`], but never waits: `Ok(None)` unless a whole
    /// message or view is already here. With the descriptor
    /// ([`AsRawFd`]) in an event loop: when it is readable, call this
    /// until it returns `Ok(None)` (frames already read into the client's
    /// buffer do not make the descriptor readable again).
    pub fn try_receive(&mut self) -> Result<Option<Received>, ClientError> {
        self.recv.try_receive()
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
        let Client {
            mut send, mut recv, ..
        } = self;
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

    /// What holds this client's traffic back, in the client and in the
    /// daemon: a `FlowQuery` to the daemon, and its answer. The query goes
    /// after what this client already sent (the daemon answers when it
    /// reads that far), and is written without blocking; waiting for the
    /// answer (at most `timeout`), this keeps writing what is pending.
    /// Messages and views that arrive meanwhile are kept, in order, for
    /// `receive`. No answer in time gives [`FlowControlState::daemon`]
    /// `None`: the daemon is not reading this client (back-pressure); a
    /// late answer is dropped.
    pub fn flow_control_state(
        &mut self,
        timeout: Duration,
    ) -> Result<FlowControlState, ClientError> {
        let nonce = self.next_nonce();
        self.send.enc.flow_query(nonce)?;
        self.send.pending.extend_from_slice(&self.send.enc.out);
        self.send.enc.written();
        let daemon = self.await_answer(nonce, timeout, DaemonFlow::from_frame)?;
        Ok(FlowControlState {
            client_pending_bytes: self.send.pending.len(),
            daemon,
        })
    }
}

impl Client {
    /// The members of `group` as this client's daemon knows them now,
    /// without joining it (as corosync's `cpg_membership_get`): a
    /// `GroupQuery` to the daemon, and its answer, the private groups
    /// (`#name#daemon`) of the members in the order of a view's list; none
    /// for a group nobody joined. `None` when the daemon did not answer
    /// within `timeout` (it is not reading this client). Like
    /// [`Client::flow_control_state`], it keeps writing what is pending
    /// while it waits, and keeps messages and views arriving meanwhile, in
    /// order, for `receive`; a late answer is dropped.
    pub fn members(
        &mut self,
        group: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<String>>, ClientError> {
        let nonce = self.next_nonce();
        self.send.enc.group_query(nonce, group)?;
        self.send.pending.extend_from_slice(&self.send.enc.out);
        self.send.enc.written();
        self.await_answer(nonce, timeout, members_answer)
    }

    fn next_nonce(&mut self) -> u32 {
        self.flow_nonce = self.flow_nonce.wrapping_add(1);
        self.flow_nonce
    }

    /// Waits (at most `timeout`) for the answer numbered `nonce` to a
    /// query already queued, writing what is pending meanwhile; other
    /// frames are kept, in order, for `receive`, and late answers to
    /// earlier queries dropped. `None`: no answer in time.
    fn await_answer<T>(
        &mut self,
        nonce: u32,
        timeout: Duration,
        answer: fn(&Frame) -> Option<(u32, T)>,
    ) -> Result<Option<T>, ClientError> {
        let start = Instant::now();
        loop {
            self.send.flow_control()?;
            let waited = start.elapsed();
            let step = FLOW_STEP.min(timeout.saturating_sub(waited));
            let frame = self.recv.next_frame(Some(Instant::now() + step))?;
            match frame.as_ref().map(answer) {
                Some(Some((n, value))) if n == nonce => return Ok(Some(value)),
                // A late answer to an earlier query.
                Some(Some(_)) => {}
                Some(None) => self.recv.backlog.extend(frame),
                None if waited >= timeout => return Ok(None),
                None => {}
            }
        }
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
    /// Bytes of frames `try_multicast` accepted that the socket has not
    /// taken yet; every send writes them first.
    pending: Vec<u8>,
    self_discard: bool,
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
        let opts = self.default_options();
        self.multicast_with(service, groups, payload, opts)
    }

    /// See [`Client::set_self_discard`].
    pub fn set_self_discard(&mut self, on: bool) {
        self.self_discard = on;
    }

    fn default_options(&self) -> SendOptions {
        SendOptions {
            self_discard: self.self_discard,
            mess_type: 0,
        }
    }

    /// See [`Client::multicast_with`].
    pub fn multicast_with<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.enc.multicast(service, opts, groups, payload)?;
        self.write_out()
    }

    /// Sends what `state` wants sent (see [`Client::send_pending`]).
    pub fn send_pending(
        &mut self,
        state: &mut crate::state::StateTransfer,
    ) -> Result<(), ClientError> {
        while let Some(o) = state.poll_send() {
            self.multicast_with(
                crate::state::Outgoing::SERVICE,
                &o.groups,
                &o.payload,
                o.options(),
            )?;
        }
        Ok(())
    }

    /// See [`Client::try_multicast`].
    pub fn try_multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        if matches!(self.flow_control()?, FlowControl::Blocked { .. }) {
            return Err(ClientError::WouldBlock);
        }
        self.enc.multicast(service, opts, groups, payload)?;
        let result = self.send_now(0);
        if let Ok(n) = result {
            self.pending.extend_from_slice(&self.enc.out[n..]);
        }
        self.enc.written();
        result.map(drop)
    }

    /// See [`Client::flow_control`].
    pub fn flow_control(&mut self) -> Result<FlowControl, ClientError> {
        if !self.pending.is_empty() {
            let n = self.send_now(1)?;
            self.pending.drain(..n);
        }
        Ok(match self.pending.len() {
            0 => FlowControl::Clear,
            pending_bytes => FlowControl::Blocked { pending_bytes },
        })
    }

    /// See [`Client::flush`].
    pub fn flush(&mut self) -> Result<(), ClientError> {
        let result = self.stream.write_all(&self.pending);
        self.pending.clear();
        result.map_err(ClientError::from)
    }

    /// Writes what the socket takes now of the encoder's frame (`from` 0)
    /// or of the pending bytes (`from` 1).
    fn send_now(&mut self, from: u8) -> Result<usize, ClientError> {
        let bytes = if from == 0 {
            &self.enc.out
        } else {
            &self.pending
        };
        let mut done = 0;
        while done < bytes.len() {
            match self.stream.send_now(&bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(done)
    }

    /// See [`Client::multicast_batch`].
    pub fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        groups: &[G],
        payloads: &[P],
    ) -> Result<(), ClientError> {
        let opts = self.default_options();
        self.enc.multicast_batch(service, opts, groups, payloads)?;
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
        if !self.pending.is_empty() {
            if let Err(e) = self.flush() {
                self.enc.written();
                return Err(e);
            }
        }
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
    /// The last view of each group, for the joined and left lists.
    views: Views,
    /// Frames read while waiting for a flow-control answer, for `receive`.
    backlog: VecDeque<Frame>,
}

impl RecvHalf {
    /// See [`Client::private_group`].
    pub fn private_group(&self) -> &str {
        &self.private_group
    }

    /// See [`Client::try_receive`].
    pub fn try_receive(&mut self) -> Result<Option<Received>, ClientError> {
        // A deadline already passed: what is there, without waiting.
        match self.next_event_frame(Some(Instant::now()))? {
            Some(frame) => self.event(frame).map(Some),
            None => Ok(None),
        }
    }

    /// See [`Client::receive`].
    pub fn receive(&mut self) -> Result<Received, ClientError> {
        let frame = self
            .next_event_frame(None)?
            .ok_or(ClientError::Disconnected)?;
        self.event(frame)
    }

    /// The next frame for `receive`: first those a flow-control query read
    /// ahead; answers to queries nobody waits for any more are dropped.
    fn next_event_frame(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Frame>, ClientError> {
        loop {
            let frame = match self.backlog.pop_front() {
                Some(frame) => frame,
                None => match self.next_frame(deadline)? {
                    Some(frame) => frame,
                    None => return Ok(None),
                },
            };
            if !stale_answer(&frame) {
                return Ok(Some(frame));
            }
        }
    }

    /// A frame after the handshake as the event `receive` returns.
    fn event(&mut self, frame: Frame) -> Result<Received, ClientError> {
        self.views.received(&self.private_group, frame)
    }

    /// See [`Client::receive_timeout`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Received>, ClientError> {
        // An unrepresentable deadline is as good as none.
        let deadline = Instant::now().checked_add(timeout);
        match deadline {
            Some(_) => match self.next_event_frame(deadline)? {
                Some(frame) => self.event(frame).map(Some),
                None => Ok(None),
            },
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

/// The connection's socket, for an event loop (`poll`, `epoll`, mio): it
/// is readable when the daemon sent something. Read with
/// [`Client::try_receive`]; do not read or write the descriptor directly.
impl AsRawFd for Client {
    fn as_raw_fd(&self) -> RawFd {
        self.recv.stream.fd().as_raw_fd()
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.recv.stream.fd()
    }
}

/// As for [`Client`]: readable when the daemon sent something.
impl AsRawFd for RecvHalf {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.fd().as_raw_fd()
    }
}

impl AsFd for RecvHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.fd()
    }
}

/// The daemon's state as `shoal status` prints it (view, peers, clients,
/// groups, counters; one item per line): a `Status` frame, which needs no
/// `Connect`, and its `StatusReply`. Gives up after `timeout` with
/// [`ClientError::Disconnected`].
pub fn status(endpoint: &Endpoint, timeout: Duration) -> Result<String, ClientError> {
    let stream = Stream::open(endpoint)?;
    let mut send = stream.try_clone()?;
    send.write_all(&Frame::Status.to_vec()?)?;
    let mut recv = RecvHalf {
        stream,
        buf: ReadBuf::new(Limits::default()),
        timeout: None,
        private_group: String::new(),
        views: Views::default(),
        backlog: VecDeque::new(),
    };
    let deadline = Instant::now().checked_add(timeout);
    match recv.next_frame(deadline)? {
        Some(Frame::StatusReply { text }) => Ok(text),
        Some(other) => Err(crate::unwanted(other)),
        None => Err(ClientError::Disconnected),
    }
}
