//! Grove's environment server: QA and web-search episodes as entities of a `bevy_ecs` world,
//! forkable at any completed step, served over WebSocket (MessagePack) with a Search-R1
//! compatible HTTP side door.
//!
//! Layout: [`sim`] is the ECS core (no I/O); [`search`] holds the backends behind one trait;
//! [`net`] is the tokio layer (WebSocket, HTTP, the thread that drives the sim); [`config`] the
//! TOML/CLI configuration; [`metrics`] the Prometheus counters; [`cache`] the persistent cache in
//! front of web providers and page fetches; [`backends`] the registry of a server's backends and
//! their construction from a configuration; `testkit` (feature `testkit`, for tests only) scripted
//! loopback servers, redis-server, a cutting proxy, and env-servers in-process or as processes.
//!
//! Architecture invariants: without the `dense` feature this crate never links libtorch; the
//! library needs none of the binary's dependencies (clap, progress bars, the protocol client:
//! the default `cli` feature); the ECS core does no I/O (sockets and HTTP live in the net layer,
//! search backends sit behind a trait and are called outside the systems).

pub mod backends;
pub mod cache;
pub mod config;
pub mod metrics;
pub mod net;
pub mod search;
pub mod sim;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use backends::Backends;
pub use net::run;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`): the one logging set-up of this crate's
/// programs (`env-server`, `env-server-soak`).
#[cfg(feature = "cli")]
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
}
