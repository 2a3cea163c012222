//! The async client, on tokio sockets: the operations of the blocking
//! [`Client`](crate::Client) as `async fn`s.
//!
//! ```no_run
//! use shoal_client::{tokio::Client, Received, Service};
//!
//! # async fn run() -> Result<(), shoal_client::ClientError> {
//! let mut client = Client::connect("echo").await?;
//! client.join("chat").await?;
//! loop {
//!     let Received::Message(m) = client.receive().await? else { continue };
//!     if m.payload == b"bye" {
//!         break;
//!     }
//!     // Echo to the sender's private group.
//!     client.multicast(Service::Fifo, &[m.sender.as_str()], &m.payload).await?;
//! }
//! client.disconnect().await
//! # }
//! ```
//!
//! [`Client::receive`] is cancel-safe: used in `tokio::select!`, a branch
//! that loses loses no bytes. The `send` side is not (a request cut short
//! by cancellation may leave half a frame on the connection).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ::tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use ::tokio::net::{TcpStream, UnixStream};
use shoal_wire::client::Frame;

use crate::{
    after_disconnect, connect_answer, members_answer, split_private_group, stale_answer,
    ClientError, DaemonFlow, Encoder, Endpoint, FlowControl, FlowControlState, Limits, ReadBuf,
    Received, SendOptions, Service, Views, DISCONNECT_WAIT, FLOW_STEP,
};

type Reader = Box<dyn AsyncRead + Send + Sync + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Sync + Unpin>;

async fn open(endpoint: &Endpoint) -> Result<(Reader, Writer), ClientError> {
    let unreachable = |error| ClientError::Unreachable {
        endpoint: endpoint.to_string(),
        error,
    };
    Ok(match endpoint {
        Endpoint::Unix(path) => {
            let stream = UnixStream::connect(path).await.map_err(unreachable)?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Endpoint::Tcp { addr, .. } => {
            let stream = TcpStream::connect(addr).await.map_err(unreachable)?;
            stream.set_nodelay(true)?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
    })
}

/// An async connection to the daemon (see the blocking
/// [`Client`](crate::Client) for what each operation does).
pub struct Client {
    send: SendHalf,
    recv: RecvHalf,
    /// The last flow-control query's number.
    flow_nonce: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("private_group", &self.recv.private_group)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the daemon's Unix socket at its default path under the
    /// private `name`.
    pub async fn connect(name: &str) -> Result<Client, ClientError> {
        Client::connect_to(&Endpoint::default(), name).await
    }

    /// Connects to the daemon at `endpoint` under the private `name`.
    pub async fn connect_to(endpoint: &Endpoint, name: &str) -> Result<Client, ClientError> {
        Client::connect_with_limits(endpoint, name, Limits::default()).await
    }

    /// As [`Client::connect_to`], with other limits than the defaults.
    pub async fn connect_with_limits(
        endpoint: &Endpoint,
        name: &str,
        limits: Limits,
    ) -> Result<Client, ClientError> {
        let mut enc = Encoder::new(limits);
        enc.connect(name, endpoint.token())?;
        let (read, write) = open(endpoint).await?;
        let mut send = SendHalf {
            write,
            enc,
            private_group: String::new(),
            pending: Vec::new(),
            self_discard: false,
        };
        send.write_out().await?;
        let mut recv = RecvHalf {
            read,
            buf: ReadBuf::new(limits),
            private_group: String::new(),
            views: Views::default(),
            backlog: VecDeque::new(),
        };
        let private_group = connect_answer(recv.next_frame().await?)?;
        send.private_group.clone_from(&private_group);
        recv.private_group = private_group;
        Ok(Client {
            send,
            recv,
            flow_nonce: 0,
        })
    }

    /// This client's private group (its address).
    pub fn private_group(&self) -> &str {
        &self.recv.private_group
    }

    /// The private name this client connected under.
    pub fn name(&self) -> &str {
        split_private_group(&self.recv.private_group).map_or("", |(n, _)| n)
    }

    /// The name of the daemon this client is connected to.
    pub fn daemon(&self) -> &str {
        split_private_group(&self.recv.private_group).map_or("", |(_, d)| d)
    }

    /// Self-discard for every later `multicast` and `multicast_batch` of
    /// this connection; see [`crate::Client::set_self_discard`].
    pub fn set_self_discard(&mut self, on: bool) {
        self.send.self_discard = on;
    }

    /// As [`Client::multicast`], with per-message options.
    pub async fn multicast_with<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.send
            .multicast_with(service, groups, payload, opts)
            .await
    }

    /// A multicast that never waits (not `async`); see
    /// [`crate::Client::try_multicast`].
    pub fn try_multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.send.try_multicast(service, groups, payload, opts)
    }

    /// Whether the daemon is taking this client's sends; see
    /// [`crate::Client::flow_control`].
    pub fn flow_control(&mut self) -> Result<FlowControl, ClientError> {
        self.send.flow_control()
    }

    /// Writes what `try_multicast` left pending.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        self.send.flush().await
    }

    /// Joins `group`.
    pub async fn join(&mut self, group: &str) -> Result<(), ClientError> {
        self.send.join(group).await
    }

    /// Leaves `group`.
    pub async fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        self.send.leave(group).await
    }

    /// Sends `payload` to every member of `groups` with the guarantee
    /// `service`.
    pub async fn multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.send.multicast(service, groups, payload).await
    }

    /// Sends each of `payloads` as one message in a single write; see the
    /// blocking [`crate::blocking::Client::multicast_batch`].
    pub async fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        groups: &[G],
        payloads: &[P],
    ) -> Result<(), ClientError> {
        self.send.multicast_batch(service, groups, payloads).await
    }

    /// Waits for the next message or view. Cancel-safe.
    pub async fn receive(&mut self) -> Result<Received, ClientError> {
        self.recv.receive().await
    }

    /// As [`Client::receive`], giving up after `timeout`: `Ok(None)`.
    pub async fn receive_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Received>, ClientError> {
        self.recv.receive_timeout(timeout).await
    }

    /// Says goodbye and waits (at most [`DISCONNECT_WAIT`]) for the daemon
    /// to close; returns an `Error` it still had for this client.
    pub async fn disconnect(self) -> Result<(), ClientError> {
        let Client {
            mut send, mut recv, ..
        } = self;
        match send.send_disconnect().await {
            Ok(()) | Err(ClientError::Disconnected) => {}
            Err(e) => return Err(e),
        }
        let drain = async {
            loop {
                if let Some(result) = after_disconnect(recv.next_frame().await) {
                    return result;
                }
            }
        };
        ::tokio::time::timeout(DISCONNECT_WAIT, drain)
            .await
            .unwrap_or(Ok(()))
    }

    /// Splits the client into owned halves, for two tasks.
    pub fn split(self) -> (SendHalf, RecvHalf) {
        (self.send, self.recv)
    }

    /// What holds this client's traffic back, in the client and in the
    /// daemon; see [`crate::Client::flow_control_state`]. Events that
    /// arrive while it waits are kept for `receive`. Cancel-safe as
    /// `receive` is (the query, once queued, is written by the next send).
    pub async fn flow_control_state(
        &mut self,
        timeout: Duration,
    ) -> Result<FlowControlState, ClientError> {
        let nonce = self.next_nonce();
        self.send.enc.flow_query(nonce)?;
        self.send.pending.extend_from_slice(&self.send.enc.out);
        self.send.enc.written();
        let daemon = self
            .await_answer(nonce, timeout, DaemonFlow::from_frame)
            .await?;
        Ok(FlowControlState {
            client_pending_bytes: self.send.pending.len(),
            daemon,
        })
    }
}

impl Client {
    /// The members of `group` as this client's daemon knows them now,
    /// without joining it; see [`crate::Client::members`]. Events that
    /// arrive while it waits are kept for `receive`. Cancel-safe as
    /// `receive` is.
    pub async fn members(
        &mut self,
        group: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<String>>, ClientError> {
        let nonce = self.next_nonce();
        self.send.enc.group_query(nonce, group)?;
        self.send.pending.extend_from_slice(&self.send.enc.out);
        self.send.enc.written();
        self.await_answer(nonce, timeout, members_answer).await
    }

    fn next_nonce(&mut self) -> u32 {
        self.flow_nonce = self.flow_nonce.wrapping_add(1);
        self.flow_nonce
    }

    /// Waits (at most `timeout`) for the answer numbered `nonce` to a
    /// query already queued, writing what is pending meanwhile; other
    /// frames are kept, in order, for `receive`, and late answers to
    /// earlier queries dropped. `None`: no answer in time.
    async fn await_answer<T>(
        &mut self,
        nonce: u32,
        timeout: Duration,
        answer: fn(&Frame) -> Option<(u32, T)>,
    ) -> Result<Option<T>, ClientError> {
        let start = ::tokio::time::Instant::now();
        loop {
            self.send.flow_control()?;
            let waited = start.elapsed();
            let step = FLOW_STEP.min(timeout.saturating_sub(waited));
            let frame = match ::tokio::time::timeout(step, self.recv.next_frame()).await {
                Ok(frame) => Some(frame?),
                Err(_elapsed) => None,
            };
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

/// The sending half of an async [`Client`].
pub struct SendHalf {
    write: Writer,
    enc: Encoder,
    private_group: String,
    /// Bytes `try_multicast` accepted that the socket has not taken yet;
    /// every send writes them first.
    pending: Vec<u8>,
    self_discard: bool,
}

impl std::fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHalf")
            .field("private_group", &self.private_group)
            .finish_non_exhaustive()
    }
}

impl SendHalf {
    /// This client's private group.
    pub fn private_group(&self) -> &str {
        &self.private_group
    }

    /// See [`Client::join`].
    pub async fn join(&mut self, group: &str) -> Result<(), ClientError> {
        self.enc.join(group)?;
        self.write_out().await
    }

    /// See [`Client::leave`].
    pub async fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        self.enc.leave(group)?;
        self.write_out().await
    }

    /// See [`Client::multicast`].
    pub async fn multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        let opts = SendOptions {
            self_discard: self.self_discard,
            mess_type: 0,
        };
        self.multicast_with(service, groups, payload, opts).await
    }

    /// See [`Client::set_self_discard`].
    pub fn set_self_discard(&mut self, on: bool) {
        self.self_discard = on;
    }

    /// See [`Client::multicast_with`].
    pub async fn multicast_with<G: AsRef<str>>(
        &mut self,
        service: Service,
        groups: &[G],
        payload: &[u8],
        opts: SendOptions,
    ) -> Result<(), ClientError> {
        self.enc.multicast(service, opts, groups, payload)?;
        self.write_out().await
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
        let out = std::mem::take(&mut self.enc.out);
        let result = self.write_now(&out);
        if let Ok(n) = result {
            self.pending.extend_from_slice(&out[n..]);
        }
        self.enc.out = out;
        self.enc.written();
        result.map(drop)
    }

    /// See [`Client::flow_control`].
    pub fn flow_control(&mut self) -> Result<FlowControl, ClientError> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            let result = self.write_now(&pending);
            self.pending = pending;
            let n = result?;
            self.pending.drain(..n);
        }
        Ok(match self.pending.len() {
            0 => FlowControl::Clear,
            pending_bytes => FlowControl::Blocked { pending_bytes },
        })
    }

    /// See [`Client::flush`].
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        let result = self.write.write_all(&self.pending).await;
        self.pending.clear();
        result.map_err(ClientError::from)
    }

    /// Writes what the socket takes of `bytes` without waiting: the
    /// writer polled with a waker that nobody waits on.
    fn write_now(&mut self, bytes: &[u8]) -> Result<usize, ClientError> {
        let waker = Waker::from(std::sync::Arc::new(NoWake));
        let mut cx = Context::from_waker(&waker);
        let mut done = 0;
        while done < bytes.len() {
            match Pin::new(&mut self.write).poll_write(&mut cx, &bytes[done..]) {
                Poll::Ready(Ok(0)) => return Err(ClientError::Disconnected),
                Poll::Ready(Ok(n)) => done += n,
                Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Err(e.into()),
                Poll::Pending => break,
            }
        }
        Ok(done)
    }

    /// See [`Client::multicast_batch`].
    pub async fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        groups: &[G],
        payloads: &[P],
    ) -> Result<(), ClientError> {
        let opts = SendOptions {
            self_discard: self.self_discard,
            mess_type: 0,
        };
        self.enc.multicast_batch(service, opts, groups, payloads)?;
        self.write_out().await
    }

    /// Says goodbye and stops sending; the [`RecvHalf`] then receives what
    /// was still on its way, then [`ClientError::Disconnected`].
    pub async fn disconnect(mut self) -> Result<(), ClientError> {
        self.send_disconnect().await
    }

    async fn send_disconnect(&mut self) -> Result<(), ClientError> {
        self.enc.disconnect()?;
        self.write_out().await?;
        let _ = self.write.shutdown().await;
        Ok(())
    }

    async fn write_out(&mut self) -> Result<(), ClientError> {
        if !self.pending.is_empty() {
            if let Err(e) = self.flush().await {
                self.enc.written();
                return Err(e);
            }
        }
        let result = self.write.write_all(&self.enc.out).await;
        self.enc.written();
        result.map_err(ClientError::from)
    }
}

/// A waker nobody waits on (`Waker::noop` is newer than this crate's MSRV).
struct NoWake;

impl std::task::Wake for NoWake {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// The receiving half of an async [`Client`].
pub struct RecvHalf {
    read: Reader,
    buf: ReadBuf,
    private_group: String,
    /// The last view of each group, for the joined and left lists.
    views: Views,
    /// Frames read while waiting for a flow-control answer, for `receive`.
    backlog: VecDeque<Frame>,
}

impl std::fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvHalf")
            .field("private_group", &self.private_group)
            .field("buf", &self.buf)
            .finish_non_exhaustive()
    }
}

impl RecvHalf {
    /// This client's private group.
    pub fn private_group(&self) -> &str {
        &self.private_group
    }

    /// See [`Client::receive`]. Cancel-safe.
    pub async fn receive(&mut self) -> Result<Received, ClientError> {
        loop {
            // Frames a flow-control query read ahead come first; answers to
            // queries nobody waits for any more are dropped.
            let frame = match self.backlog.pop_front() {
                Some(frame) => frame,
                None => self.next_frame().await?,
            };
            if !stale_answer(&frame) {
                return self.views.received(&self.private_group, frame);
            }
        }
    }

    /// See [`Client::receive_timeout`].
    pub async fn receive_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Received>, ClientError> {
        match ::tokio::time::timeout(timeout, self.receive()).await {
            Ok(result) => result.map(Some),
            Err(_elapsed) => Ok(None),
        }
    }

    /// The next frame. Cancel-safe: the buffer changes only after a read
    /// completed.
    async fn next_frame(&mut self) -> Result<Frame, ClientError> {
        loop {
            if let Some(frame) = self.buf.frame()? {
                return Ok(frame);
            }
            match self.read.read(self.buf.spare()).await {
                Ok(0) => return Err(ClientError::Disconnected),
                Ok(n) => self.buf.filled(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}
