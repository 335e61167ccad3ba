//! Serving HTTP connections: the accept loop and the life of each connection.
//!
//! Every connection is bounded, so idle or half-sent sockets cannot pile up and starve real
//! clients of memory and file descriptors:
//!
//! - a request's head (and, on HTTPS, the TLS handshake before it) must arrive within the
//!   header read timeout, counted from the accept or, on a kept-alive connection, from the first
//!   byte of the next request;
//! - a connection on which nothing is read or written for the idle timeout is closed, unless one
//!   of its requests is being answered: a long poll waiting for work, its body read, is not idle,
//!   while a request body that stops arriving, or an answer the client stops reading, is;
//! - at most `max_connections` are open at once; further clients wait in the listen backlog.
//!
//! The bookkeeping is a few relaxed atomics per read, write and request, and one timer per
//! connection that wakes only at its next deadline.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

/// Default `--header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default `--max-connections` of a server built as a library; `starbridge server` derives its
/// own from the process's file-descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How long connections may take and how many may be open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest wait for a request's head (the TLS handshake included, on a new connection).
    pub header_read_timeout: Duration,
    /// Longest a connection may stay without reads or writes while none of its requests is
    /// being answered.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Accepts connections and serves `app` on each until `shutdown` resolves; then stops accepting,
/// lets open connections finish their requests (still under their timeouts) and returns once all
/// are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let slots = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(slots));
    let (closing, closing_seen) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait for some to be freed.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(
            stream,
            peer,
            acceptor.clone(),
            app.clone(),
            limits,
            closing_seen.clone(),
            permit,
        ));
    }
    drop(listener);
    let _ = closing.send(true);
    // Every open connection holds a permit: having them all back means all are closed.
    let all = u32::try_from(slots).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
}

async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    acceptor: Option<TlsAcceptor>,
    app: Router,
    limits: ConnectionLimits,
    closing: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    let head_by = activity.started + limits.header_read_timeout;
    // A silent client costs a socket and this task only: the HTTP connection and its buffers
    // are made once the first bytes arrive.
    match tokio::time::timeout_at(head_by, stream.readable()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return tracing::debug!(%peer, %error, "connection failed"),
        Err(_) => return tracing::debug!(%peer, "connection closed: it sent nothing"),
    }
    let io = TrackedIo {
        inner: stream,
        activity: activity.clone(),
    };
    match acceptor {
        None => drive(io, app, activity, limits, closing).await,
        Some(acceptor) => match tokio::time::timeout_at(head_by, acceptor.accept(io)).await {
            Ok(Ok(tls)) => drive(tls, app, activity, limits, closing).await,
            Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
        },
    }
}

/// Serves HTTP/1.1 on one connection until it ends, outlives its timeouts, or (after the server
/// began to shut down) has answered its requests.
async fn drive<S>(
    io: S,
    app: Router,
    activity: Arc<Activity>,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let exchanges = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let exchange = Exchange::begin(&exchanges);
        let request = request.map(|body| Body::new(RequestBody::new(body, exchange.clone())));
        let app = app.clone();
        async move {
            let response = match app.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            exchange.answered();
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(ResponseBody {
                    inner: body,
                    _exchange: exchange,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The head's deadline is kept here (hyper's would also cut kept-alive connections that are
    // merely idle). The parser keeps its default bounds (100 header fields, about 400 KiB): a
    // larger bound costs every request a heap allocation of that many slots, and the API refuses
    // header sections over 64 KiB itself, with a problem document (`guard`).
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut shutting_down = *closing.borrow();
    if shutting_down {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        let check_at = activity.deadline(&limits).unwrap_or_else(|| {
            activity
                .elapsed_ms()
                .saturating_add(millis(limits.idle_timeout))
        });
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(activity.instant(check_at)) => {
                if activity
                    .deadline(&limits)
                    .is_some_and(|deadline| deadline <= activity.elapsed_ms())
                {
                    tracing::debug!("closing a connection that outlived its timeout");
                    return;
                }
            }
            _ = closing.changed(), if !shutting_down => {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// No request head is due.
const NO_HEAD: u64 = u64::MAX;

/// What one connection has been doing, in milliseconds since it was accepted.
struct Activity {
    started: Instant,
    /// Last read or write of at least one byte.
    last_io: AtomicU64,
    /// When the head of the next request began to arrive (the accept, for the first), or
    /// `NO_HEAD` while requests are in flight or the connection merely idles between them.
    head_since: AtomicU64,
    /// Requests received and not yet fully answered.
    in_flight: AtomicUsize,
    /// Requests whose body is read and whose answer the server is still working out.
    serving: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            last_io: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            serving: AtomicUsize::new(0),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        millis(self.started.elapsed())
    }

    fn instant(&self, elapsed_ms: u64) -> Instant {
        self.started + Duration::from_millis(elapsed_ms)
    }

    fn moved(&self, read: bool) {
        let now = self.elapsed_ms();
        self.last_io.store(now, Ordering::Relaxed);
        if read && self.in_flight.load(Ordering::Relaxed) == 0 {
            // The first byte of a new request: its head is now due.
            let _ = self.head_since.compare_exchange(
                NO_HEAD,
                now,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// When the connection is to be closed unless something happens first; `None` while one of
    /// its requests is being answered.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<u64> {
        if self.serving.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let idle = self
            .last_io
            .load(Ordering::Relaxed)
            .saturating_add(millis(limits.idle_timeout));
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Some(idle);
        }
        match self.head_since.load(Ordering::Relaxed) {
            NO_HEAD => Some(idle),
            since => Some(idle.min(since.saturating_add(millis(limits.header_read_timeout)))),
        }
    }
}

/// Where a request is: its body still arriving, being answered, or answered.
const READING: u8 = 0;
const SERVING: u8 = 1;
const ANSWERED: u8 = 2;

/// One request and its answer on a connection; the request counts as in flight until the last
/// of its body, its handler and its answer's body is gone.
struct Exchange {
    activity: Arc<Activity>,
    stage: AtomicU8,
}

impl Exchange {
    fn begin(activity: &Arc<Activity>) -> Arc<Exchange> {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.head_since.store(NO_HEAD, Ordering::Relaxed);
        Arc::new(Exchange {
            activity: activity.clone(),
            stage: AtomicU8::new(READING),
        })
    }

    fn body_read(&self) {
        if self
            .stage
            .compare_exchange(READING, SERVING, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.activity.serving.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn answered(&self) {
        if self.stage.swap(ANSWERED, Ordering::Relaxed) == SERVING {
            self.activity.serving.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.answered();
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that tells its exchange when it has been read to the end.
struct RequestBody {
    inner: Incoming,
    exchange: Arc<Exchange>,
}

impl RequestBody {
    fn new(inner: Incoming, exchange: Arc<Exchange>) -> RequestBody {
        if hyper::body::Body::is_end_stream(&inner) {
            exchange.body_read();
        }
        RequestBody { inner, exchange }
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            this.exchange.body_read();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body, which keeps its exchange in flight until it is written or dropped.
struct ResponseBody {
    inner: Body,
    _exchange: Arc<Exchange>,
}

impl hyper::body::Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that records when bytes move through it.
struct TrackedIo<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.moved(true);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            this.activity.moved(false);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            this.activity.moved(false);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
            max_connections: 10,
        }
    }

    #[test]
    fn a_new_connection_must_send_its_head_within_the_header_timeout() {
        let activity = Activity::new();
        assert_eq!(activity.deadline(&limits()), Some(10_000));
    }

    #[test]
    fn a_kept_alive_connection_idles_until_the_idle_timeout() {
        let activity = Arc::new(Activity::new());
        // A request came and was answered.
        drop(Exchange::begin(&activity));
        activity.last_io.store(5_000, Ordering::Relaxed);
        assert_eq!(activity.deadline(&limits()), Some(80_000));
        // The first byte of the next request makes its head due within the header timeout.
        activity.moved(true);
        let since = activity.head_since.load(Ordering::Relaxed);
        assert_ne!(since, NO_HEAD);
        assert_eq!(activity.deadline(&limits()), Some(since + 10_000));
    }

    #[test]
    fn a_request_being_answered_has_no_deadline_but_a_stalled_body_has() {
        let activity = Arc::new(Activity::new());
        let exchange = Exchange::begin(&activity);
        activity.last_io.store(1_000, Ordering::Relaxed);
        // The body has not all arrived: the idle timeout runs.
        assert_eq!(activity.deadline(&limits()), Some(76_000));
        exchange.body_read();
        assert_eq!(activity.deadline(&limits()), None);
        exchange.answered();
        // The answer is being written: the idle timeout runs again.
        assert_eq!(activity.deadline(&limits()), Some(76_000));
        drop(exchange);
        assert_eq!(activity.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(activity.serving.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_handler_dropped_mid_answer_leaves_nothing_counted() {
        let activity = Arc::new(Activity::new());
        let exchange = Exchange::begin(&activity);
        exchange.body_read();
        drop(exchange);
        assert_eq!(activity.serving.load(Ordering::Relaxed), 0);
        assert_eq!(activity.in_flight.load(Ordering::Relaxed), 0);
    }
}
