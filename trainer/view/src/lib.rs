//! grove-view: `trainer view RUN_DIR`, a page on loopback that shows a run's rollout trees (where
//! they branched, what each turn searched and read, each leaf's reward and advantage, the
//! transcript up to any node) and its training curves, or an experiment's arms side by side with
//! their 95% bands. It reads the folder through grove-rundir on every request, so a run still
//! training is followed as it grows.
//!
//! - [`http`]: the HTTP/1.1 it speaks (GET / HEAD, one request per connection, size limits and
//!   deadlines, typed errors; no panic on any input);
//! - [`site`]: the routes and the JSON API (`/api/run`, `/api/trees?step=N`, `/api/experiment`;
//!   runs named by number, never by path);
//! - [`assets`]: the page (`assets/`: HTML, vanilla JS, CSS, drawn in SVG) inside the binary;
//! - `browser_check` (the `browser-check` feature, for tests): the page loaded in headless
//!   Chromium over the DevTools protocol and checked against a run folder.
//!
//! No tensors and no web framework: the trainer links it, and its tests build without libtorch.

pub mod assets;
#[cfg(feature = "browser-check")]
pub mod browser_check;
pub mod http;
pub mod site;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::{HEAD_TIMEOUT, RequestError, Response, WRITE_TIMEOUT, is_loopback_host, read_request};
pub use crate::site::{Kind, Site};

/// Where `trainer view` listens unless told otherwise (a free port instead when it is taken).
pub const DEFAULT_BIND: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8450);
/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{0}: not a folder (give a run folder or an experiment folder)")]
    NotAFolder(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the server's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A view server bound to its address, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    site: Arc<Site>,
    /// Bound to a loopback address: requests must name a loopback host.
    loopback: bool,
}

impl Server {
    /// Bind `addr` to serve the run or experiment folder `dir`.
    pub async fn bind(dir: impl Into<PathBuf>, addr: SocketAddr) -> Result<Self, ViewError> {
        let dir = dir.into();
        if !dir.is_dir() {
            return Err(ViewError::NotAFolder(dir.display().to_string()));
        }
        let listener = TcpListener::bind(addr).await.map_err(|source| ViewError::Bind { addr, source })?;
        Ok(Self { listener, site: Arc::new(Site::new(dir)), loopback: addr.ip().is_loopback() })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))
    }

    /// The page's address (a loopback one when bound to every interface).
    pub fn url(&self) -> String {
        let a = self.local_addr();
        match a {
            SocketAddr::V4(v4) if v4.ip().is_unspecified() => format!("http://127.0.0.1:{}/", a.port()),
            SocketAddr::V6(v6) if v6.ip().is_unspecified() => format!("http://[::1]:{}/", a.port()),
            _ => format!("http://{a}/"),
        }
    }

    pub fn kind(&self) -> Kind {
        self.site.kind()
    }

    /// Serve until `shutdown` completes.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => return,
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let stream = tokio::select! {
                () = &mut shutdown => return,
                r = self.listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => {
                        // Out of file descriptors and the like: wait, do not spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            tokio::spawn(connection(stream, self.site.clone(), self.loopback, permit));
        }
    }
}

/// One connection: one request, one response.
async fn connection(mut stream: TcpStream, site: Arc<Site>, loopback: bool, _permit: OwnedSemaphorePermit) {
    let request = match tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut stream)).await {
        Ok(r) => r,
        Err(_) => Err(RequestError::Timeout),
    };
    let (response, head_only) = match request {
        Ok(req) if loopback && req.host.as_deref().is_some_and(|h| !is_loopback_host(h)) => {
            let e = RequestError::Host(req.host.clone().unwrap_or_default());
            (Response::error(403, e), req.head_only)
        }
        Ok(req) => {
            let head_only = req.head_only;
            let response = tokio::task::spawn_blocking(move || site.handle(&req))
                .await
                .unwrap_or_else(|_| Response::error(500, "the request failed inside the server"));
            (response, head_only)
        }
        Err(e) => match e.status() {
            Some(status) => (Response::error(status, &e), false),
            None => return,
        },
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, response.write_to(&mut stream, head_only)).await;
    let _ = stream.shutdown().await;
    // Read what the client still sends (a refused oversize head) for a moment, so that closing
    // does not reset the connection before it has read the answer.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while let Ok(n) = stream.read(&mut buf).await {
            total += n;
            if n == 0 || total > 1 << 20 {
                break;
            }
        }
    })
    .await;
}

/// `trainer view`: serve `dir` on `bind` (default [`DEFAULT_BIND`], or a free loopback port when
/// that is taken), print the page's address, and serve until Ctrl-C.
pub fn run(dir: &Path, bind: Option<SocketAddr>) -> Result<(), ViewError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ViewError::Runtime)?;
    rt.block_on(async {
        let server = match bind {
            Some(addr) => Server::bind(dir, addr).await?,
            None => match Server::bind(dir, DEFAULT_BIND).await {
                Err(ViewError::Bind { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse => {
                    Server::bind(dir, SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)).await?
                }
                r => r?,
            },
        };
        if !server.local_addr().ip().is_loopback() {
            eprintln!(
                "note: listening on {}: anyone who can reach it can read this {}",
                server.local_addr(),
                server.kind().name()
            );
        }
        println!("serving the {} {} at {}", server.kind().name(), dir.display(), server.url());
        println!("(Ctrl-C stops)");
        server
            .serve(async {
                if let Err(e) = tokio::signal::ctrl_c().await {
                    eprintln!("cannot wait for Ctrl-C ({e}); stop the process another way");
                    std::future::pending::<()>().await;
                }
            })
            .await;
        Ok(())
    })
}
