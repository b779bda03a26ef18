//! What the instance answers while it starts: its address is bound before
//! it waits for Postgres, and until the service takes the address over,
//! `/healthz` says the process runs (a supervisor or a load balancer sees
//! it alive, not a refused port) and every other request, `/readyz` too,
//! is `503 unavailable` with `Retry-After`, on a connection closed after
//! it.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

use super::error::ApiError;
use super::serve::next_connection;
use crate::seckill::SeckillError;

/// Most connections served at once while starting (more wait in the
/// listen backlog): each is one short answer.
const MOST_CONNECTIONS: usize = 256;

/// The answers of a starting instance, served on its listener until
/// [`Starting::stop`] gives the listener back (or until dropped).
pub struct Starting {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<TcpListener>>,
}

impl Starting {
    /// Answers on `listener`, each connection's headers read within
    /// `header_timeout`. Must run inside a tokio runtime.
    pub fn serve(listener: TcpListener, header_timeout: Duration) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, header_timeout, stopped));
        Self {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops answering and gives the listener back; connections already
    /// accepted finish their one answer on their own.
    pub async fn stop(mut self) -> std::io::Result<TcpListener> {
        drop(self.stop.take());
        let task = self.task.take().expect("stopped once");
        task.await.map_err(std::io::Error::other)
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn accept(
    listener: TcpListener,
    header_timeout: Duration,
    stopped: oneshot::Receiver<()>,
) -> TcpListener {
    let permits = Arc::new(Semaphore::new(MOST_CONNECTIONS));
    let service = TowerToHyperService::new(router());
    let stopped = async {
        let _ = stopped.await;
    };
    tokio::pin!(stopped);
    while let Some((permit, stream, _)) =
        next_connection(&listener, &permits, stopped.as_mut()).await
    {
        let service = service.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_header_size(super::serve::MAX_HEADER_BYTES)
                .keep_alive(false);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
    listener
}

fn router() -> Router {
    Router::new()
        .route("/healthz", get(|| async { StatusCode::OK }))
        .fallback(|| async { starting() })
}

fn starting() -> Response {
    let mut response = ApiError::Seckill(SeckillError::unavailable(
        "the service",
        "it is starting (waiting for Postgres); retry shortly",
    ))
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
