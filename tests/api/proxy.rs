//! A TCP proxy a test can cut and restore, to take a dependency away from
//! one app without disturbing the other tests that share it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seckill::config::Settings;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::helpers::{pg_server, spawn_app_with, TestApp};

/// [`spawn_app_behind_pg_proxy`] with this dependency deadline.
pub async fn spawn_app_behind_pg_proxy_timing_out(timeout_ms: u64) -> (TestApp, Proxy) {
    spawn_app_behind_pg_proxy(|mut s| {
        s.dependency_timeout = Duration::from_millis(timeout_ms);
        s
    })
    .await
}

/// An app whose Postgres connections all pass through a proxy the test can
/// cut (the test's own checks still reach Postgres directly).
pub async fn spawn_app_behind_pg_proxy(
    adjust: impl FnOnce(Settings) -> Settings,
) -> (TestApp, Proxy) {
    let (proxy, via_proxy) = pg_proxy().await;
    let app = spawn_app_with(|mut s| {
        let database = s.database_url.rsplit('/').next().unwrap().to_owned();
        s.database_url = format!("{via_proxy}/{database}");
        adjust(s)
    })
    .await;
    (app, proxy)
}

/// A proxy to the tests' Postgres server, and the server's URL through it
/// (without a database name).
pub async fn pg_proxy() -> (Proxy, String) {
    let server = pg_server();
    let hostport = server
        .rsplit('@')
        .next()
        .unwrap_or(&server)
        .trim_start_matches("postgres://");
    let target = tokio::net::lookup_host(hostport)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .expect("the Postgres server's address resolves");
    let proxy = Proxy::start(target).await;
    let user = server
        .split("://")
        .nth(1)
        .and_then(|r| r.split_once('@'))
        .map(|(user, _)| user.to_owned());
    let credentials = user.map(|u| format!("{u}@")).unwrap_or_default();
    let via_proxy = format!("postgres://{credentials}{}", proxy.addr);
    (proxy, via_proxy)
}

pub struct Proxy {
    pub addr: SocketAddr,
    /// Where new connections go (open ones stay where they went).
    target: Arc<Mutex<SocketAddr>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// While true, no byte crosses: the server looks frozen (SIGSTOP)
    /// to the app, its connections open but silent.
    frozen: watch::Sender<bool>,
    /// While true, new connections are accepted and held, reaching no
    /// server, as haproxy queues them while none of its servers is up.
    holding: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let port = super::helpers::free_port();
        let proxy = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            target: Arc::new(Mutex::new(target)),
            accept: Mutex::new(None),
            links: Arc::new(Mutex::new(Vec::new())),
            frozen: watch::channel(false).0,
            holding: watch::channel(false).0,
        };
        proxy.restore();
        proxy
    }

    /// Closes every open connection and refuses new ones.
    pub fn cut(&self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    /// Sends new connections to `target` from now on; open ones stay, as
    /// behind a load balancer or a managed endpoint after a failover.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = target;
    }

    /// Holds every byte in both directions until [`Proxy::thaw`].
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Holds new connections (accepted, silent) until [`Proxy::release`],
    /// then sends them to the target of that moment.
    pub fn hold_new(&self) {
        self.holding.send_replace(true);
    }

    pub fn release(&self) {
        self.holding.send_replace(false);
    }

    /// Listens again on the same port.
    pub fn restore(&self) {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(self.addr)
            .expect("the proxy's port is free again");
        let listener = socket.listen(1024).unwrap();
        let (target, links) = (self.target.clone(), self.links.clone());
        let frozen = self.frozen.subscribe();
        let holding = self.holding.subscribe();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let frozen = frozen.clone();
                let mut holding = holding.clone();
                let target = target.clone();
                let link = tokio::spawn(async move {
                    if holding.wait_for(|held| !held).await.is_err() {
                        return;
                    }
                    let target = *target.lock().unwrap();
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = outbound.into_split();
                        tokio::join!(
                            pump(in_read, out_write, frozen.clone()),
                            pump(out_read, in_write, frozen),
                        );
                    }
                });
                links.lock().unwrap().push(link);
            }
        });
        *self.accept.lock().unwrap() = Some(accept);
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is frozen.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}
