//! Serving connections: HTTP/1.1 by hyper, with a deadline on reading a
//! request's headers (which also ends keep-alive connections left idle), a
//! bound on open connections, and a drain on shutdown that ends within its
//! deadline whatever clients do.
//!
//! Slow clients (slowloris: headers sent a byte at a time, or never ended;
//! or an answer never read) each hold a connection for at most the header
//! deadline (for an answer, since it last took any of it), and at most
//! `max_connections` are open at once, so they cannot use up the process's
//! file descriptors and starve the clients that buy; past the bound, new
//! connections wait in the listen backlog until one closes.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

/// Most bytes of a request's start line and headers; past it the answer
/// is `431` and the connection is closed. A token is at most 8 KiB, and a
/// path of tens of KiB is still read and answered `400` in JSON; without
/// this bound hyper buffered about 400 KiB of an unfinished header per
/// connection for the whole header deadline.
pub const MAX_HEADER_BYTES: usize = 128 * 1024;

/// How connections are served.
#[derive(Debug, Clone, Copy)]
pub struct ServeSettings {
    /// Longest time to read one request's headers, counted from when the
    /// connection is ready for them (so also the longest idle keep-alive).
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the
/// requests in flight finish for at most `drain` and closes whatever is
/// still open after it. Returns when shutdown began, and how it ended.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ServeSettings,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> (Instant, DrainOutcome) {
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    // Closed (dropped) when shutdown begins: every connection then finishes
    // the request it is serving and closes.
    let (draining, drain_signal) = watch::channel(());
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let Some((permit, stream, peer)) =
            next_connection(&listener, &permits, shutdown.as_mut()).await
        else {
            break;
        };
        let _ = stream.set_nodelay(true);
        // Every request knows its connection's peer (the rate limits'
        // client address, unless a trusted proxy names another).
        let service = TowerToHyperService::new(router.clone().map_request(
            move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            },
        ));
        let mut drain_signal = drain_signal.clone();
        connections.spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(settings.header_timeout)
                .max_header_size(MAX_HEADER_BYTES);
            let stream = Stalls::new(stream, settings.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = drain_signal.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(permit);
        });
    }
    let began = Instant::now();
    drop(listener);
    drop(draining);
    let open = connections.len();
    let outcome = match tokio::time::timeout_at(began + drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    {
        Ok(()) => DrainOutcome::Drained,
        Err(_) => {
            let left = connections.len();
            connections.shutdown().await;
            DrainOutcome::CutOff { left }
        }
    };
    tracing::info!(open_at_shutdown = open, ?outcome, "connections drained");
    (began, outcome)
}

/// A connection whose writes fail once the client has taken none of the
/// answer for `limit`: a client that stops reading (or a peer gone without
/// a word) would otherwise hold its connection, and one of the
/// `max_connections`, for as long as the kernel keeps the socket, since
/// hyper's own deadline covers only reading the headers. Any progress
/// restarts the wait.
struct Stalls<S> {
    inner: S,
    limit: Duration,
    /// Running while the last write could not go out.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Stalls<S> {
    fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// A write's outcome, or the error that ends a connection whose writes
    /// made no progress for `limit`.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took none of the answer for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Stalls<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stalls<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every connection finished by itself.
    Drained,
    /// The deadline came first: these connections were closed mid-way.
    CutOff { left: usize },
}

/// The next connection on `listener` once one of `permits` is free, with
/// its permit and its peer; `None` once `shutdown` completes first.
pub(super) async fn next_connection(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
    let permit = tokio::select! {
        permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        () = shutdown.as_mut() => return None,
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => return Some((permit, stream, peer)),
                Err(error) => accept_failed(&error).await,
            },
            () = shutdown.as_mut() => return None,
        }
    }
}

/// An accept error: a connection that died in the backlog is nothing; out
/// of file descriptors (or another resource) is worth a pause, or the loop
/// would spin on it.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind as K;
    if matches!(
        error.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed; pausing");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
