//! Counters, gauges and latency histograms, rendered in the Prometheus text format for
//! `GET /metrics`. Updated from the sim thread and the net layer without locks.

use std::fmt::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grove_protocol::ErrorCode;

/// Live heap bytes of this process, when the binary counts them (the `env-server` binary wraps
/// the system allocator with a counter); `None` in a library user that does not.
static HEAP_BYTES: OnceLock<fn() -> usize> = OnceLock::new();

/// Report the process's live heap bytes in `/metrics` as `grove_heap_live_bytes`: set once by a
/// binary whose global allocator counts them. Against RSS it tells a leak (heap grows) from
/// allocator fragmentation (heap flat, RSS creeping).
pub fn report_heap_bytes(live: fn() -> usize) {
    let _ = HEAP_BYTES.set(live);
}

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub episodes_live: AtomicU64,
    pub episodes_created: AtomicU64,
    pub steps: AtomicU64,
    pub forks: AtomicU64,
    pub searches: AtomicU64,
    pub search_errors: AtomicU64,
    pub connections: AtomicU64,
    /// Every accepted TCP connection holding a slot of the connection budget (HTTP and
    /// WebSocket alike).
    pub tcp_connections: AtomicU64,
    /// Connections closed at accept because the budget and its refusal overflow were full.
    pub connections_refused: AtomicU64,
    /// Sessions whose connection dropped and that wait for a reattach.
    pub sessions_detached: AtomicU64,
    pub reattaches: AtomicU64,
    /// Sessions whose grace period ran out; their episodes were closed.
    pub sessions_expired: AtomicU64,
    pub retrieve_requests: AtomicU64,
    /// Bytes of encoded replies all sessions keep for replay (`max_replay_bytes_total` bounds it).
    pub replay_bytes: AtomicU64,
    /// Replies pushed out of a session's replay buffer by the server-wide bound, not its own.
    pub replay_pushed_out_for_memory: AtomicU64,
    pub search_latency: Histogram,
    pub step_latency: Histogram,
    errors: [AtomicU64; ErrorCode::ALL.len()],
}

impl Metrics {
    pub fn error(&self, code: ErrorCode) {
        if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == code) {
            self.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn errors_of(&self, code: ErrorCode) -> u64 {
        ErrorCode::ALL.iter().position(|c| *c == code).map(|i| self.errors[i].load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, kind: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}", v.load(Ordering::Relaxed));
        };
        gauge("grove_episodes_live", "gauge", "Episodes currently held by the server.", &self.episodes_live);
        gauge("grove_episodes_created_total", "counter", "Episodes created, forks included.", &self.episodes_created);
        gauge("grove_steps_total", "counter", "Completed agent steps.", &self.steps);
        gauge("grove_forks_total", "counter", "Episodes created by forking.", &self.forks);
        gauge("grove_searches_total", "counter", "Search queries answered by backends.", &self.searches);
        gauge("grove_search_errors_total", "counter", "Search batches that failed.", &self.search_errors);
        gauge("grove_connections", "gauge", "Open WebSocket connections.", &self.connections);
        gauge(
            "grove_tcp_connections",
            "gauge",
            "TCP connections holding a slot of the connection budget.",
            &self.tcp_connections,
        );
        gauge(
            "grove_connections_refused_total",
            "counter",
            "Connections closed at accept: budget full.",
            &self.connections_refused,
        );
        gauge(
            "grove_sessions_detached",
            "gauge",
            "Sessions waiting for a reattach after a drop.",
            &self.sessions_detached,
        );
        gauge("grove_reattaches_total", "counter", "Sessions reattached by a new connection.", &self.reattaches);
        gauge(
            "grove_sessions_expired_total",
            "counter",
            "Detached sessions closed at the end of their grace period.",
            &self.sessions_expired,
        );
        gauge("grove_retrieve_requests_total", "counter", "HTTP /retrieve requests.", &self.retrieve_requests);
        gauge(
            "grove_replay_bytes",
            "gauge",
            "Bytes of replies kept for replay after a drop, all sessions together.",
            &self.replay_bytes,
        );
        gauge(
            "grove_replay_pushed_out_for_memory_total",
            "counter",
            "Replies pushed out of a replay buffer by max_replay_bytes_total.",
            &self.replay_pushed_out_for_memory,
        );
        let _ = writeln!(out, "# HELP grove_errors_total Error replies by code.\n# TYPE grove_errors_total counter");
        for (code, n) in ErrorCode::ALL.iter().zip(&self.errors) {
            let _ = writeln!(out, "grove_errors_total{{code=\"{code}\"}} {}", n.load(Ordering::Relaxed));
        }
        self.search_latency.render(
            &mut out,
            "grove_search_latency_seconds",
            "Latency of one search batch at its backend.",
        );
        self.step_latency.render(&mut out, "grove_step_latency_seconds", "Time a Step request spends in the server.");
        if let Some(live) = HEAP_BYTES.get() {
            let _ = writeln!(
                out,
                "# HELP grove_heap_live_bytes Heap bytes allocated and not yet freed by this process.\n\
                 # TYPE grove_heap_live_bytes gauge\ngrove_heap_live_bytes {}",
                live()
            );
        }
        out
    }
}

/// Per-provider cost accounting (web providers, the page fetcher, cached retrievers) in the
/// Prometheus text format, one labelled series per provider.
pub fn render_providers(out: &mut String, usage: &std::collections::BTreeMap<String, grove_protocol::ProviderUsage>) {
    if usage.is_empty() {
        return;
    }
    type Field = fn(&grove_protocol::ProviderUsage) -> u64;
    let series: [(&str, &str, Field); 6] = [
        ("grove_provider_calls_total", "HTTP requests sent to the provider, retries included.", |u| u.calls),
        ("grove_provider_errors_total", "Tool calls that failed after retries.", |u| u.errors),
        ("grove_provider_retries_total", "Retries after 429, 5xx or connection errors.", |u| u.retries),
        ("grove_provider_throttled_total", "Calls that waited for the rate limiter.", |u| u.throttled),
        ("grove_cache_hits_total", "Tool calls answered by the persistent cache.", |u| u.cache_hits),
        ("grove_cache_misses_total", "Tool calls the cache did not hold.", |u| u.cache_misses),
    ];
    for (name, help, field) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (provider, u) in usage {
            let _ = writeln!(out, "{name}{{provider=\"{provider}\"}} {}", field(u));
        }
    }
}
