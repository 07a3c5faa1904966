//! The persistent cache in front of every web provider call and page fetch.
//!
//! Entries are keyed by a [`CacheKey`]: a namespace (`search`, `page`, …), the provider, the
//! normalised query and the call's parameters as canonical JSON. The store is a SQLite file
//! (default; several processes may share it) or a Redis server (several hosts may share it).
//! A successful [`WebCache::put`] is durable against a crash of this process: SQLite has
//! committed the row, Redis has acknowledged the `SET`.
//!
//! Entries can be exported to and imported from JSON Lines (one [`CacheEntry`] per line), e.g.
//! to seed a replay run on another machine.

use std::collections::HashSet;
use std::fmt;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// How long one Redis command (or connecting) may take before it fails.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys asked for per `SCAN` step and per `MGET`.
const REDIS_BATCH: usize = 500;
/// Commands per pipeline during an import.
const REDIS_IMPORT_BATCH: usize = 256;

/// The `[cache]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// `sqlite` (default), `redis` or `none`.
    pub store: CacheStoreKind,
    /// The SQLite file; the caller supplies a default.
    pub path: Option<PathBuf>,
    /// e.g. `redis://127.0.0.1:6379/0` (a password may be given in the URL; it is never logged).
    pub redis_url: Option<String>,
    /// Prepended to every Redis key.
    pub redis_prefix: String,
    /// Entries expire this many seconds after they are written; `None`: never.
    pub ttl_secs: Option<u64>,
    /// `read_write` (default) or `replay` (serve cached entries only; enforced by the caller).
    pub mode: CacheMode,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            store: CacheStoreKind::Sqlite,
            path: None,
            redis_url: None,
            redis_prefix: "grove:cache:".to_string(),
            ttl_secs: None,
            mode: CacheMode::ReadWrite,
        }
    }
}

/// Where cached entries live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CacheStoreKind {
    /// A SQLite file (WAL), shareable between processes on one host.
    #[default]
    Sqlite,
    /// A Redis server, shareable between hosts.
    Redis,
    /// No cache.
    None,
}

/// How the cache is used by the wrappers around providers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Look up first; on a miss call the provider and store its answer.
    #[default]
    ReadWrite,
    /// Serve cached entries only; a miss is an error and the network is never used.
    Replay,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("sqlite cache: {0}")]
    Sqlite(String),
    #[error("redis cache: {0}")]
    Redis(String),
    #[error("cache I/O: {0}")]
    Io(String),
    #[error("cache configuration: {0}")]
    Config(String),
}

/// Trim, collapse runs of whitespace into one space, lowercase (Unicode).
pub fn normalize_query(q: &str) -> String {
    q.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// JSON without whitespace, object keys sorted at every depth.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// What identifies one cached call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    /// What kind of call, e.g. `search` or `page`.
    pub namespace: String,
    pub provider: String,
    /// Normalised with [`normalize_query`].
    pub query: String,
    /// Canonical JSON of the call's parameters.
    pub params: String,
}

impl CacheKey {
    pub fn new(namespace: &str, provider: &str, query: &str, params: &serde_json::Value) -> CacheKey {
        CacheKey {
            namespace: namespace.to_string(),
            provider: provider.to_string(),
            query: normalize_query(query),
            params: canonical_json(params),
        }
    }

    /// Hex SHA-256 of `namespace \0 provider \0 query \0 params`.
    pub fn digest(&self) -> String {
        digest_of(&self.namespace, &self.provider, &self.query, &self.params)
    }
}

fn digest_of(namespace: &str, provider: &str, query: &str, params: &str) -> String {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0u8]);
    h.update(provider.as_bytes());
    h.update([0u8]);
    h.update(query.as_bytes());
    h.update([0u8]);
    h.update(params.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// One stored entry, as exported (one JSON object per line) and as stored in Redis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// [`CacheKey::digest`] of the four fields below.
    pub key: String,
    pub namespace: String,
    pub provider: String,
    pub query: String,
    pub params: String,
    pub value: serde_json::Value,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds; the entry is live while `now < expires_at`.
    #[serde(default)]
    pub expires_at: Option<u64>,
}

impl CacheEntry {
    fn new(key: &CacheKey, value: serde_json::Value, now: u64, ttl: Option<u64>) -> CacheEntry {
        CacheEntry {
            key: key.digest(),
            namespace: key.namespace.clone(),
            provider: key.provider.clone(),
            query: key.query.clone(),
            params: key.params.clone(),
            value,
            created_at: now,
            expires_at: ttl.map(|t| now.saturating_add(t)),
        }
    }

    fn is_live(&self, now: u64) -> bool {
        is_live(self.expires_at, now)
    }
}

fn is_live(expires_at: Option<u64>, now: u64) -> bool {
    expires_at.is_none_or(|e| now < e)
}

/// The outcome of [`WebCache::import_jsonl`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// Entries written.
    pub imported: usize,
    /// Well-formed entries skipped because they had already expired.
    pub expired: usize,
    /// `(1-based line number, reason)` of every line that could not be used.
    pub bad_lines: Vec<(usize, String)>,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The cache. Cheap to clone; all clones share one store connection.
#[derive(Debug, Clone)]
pub struct WebCache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    ttl: Option<u64>,
}

#[derive(Debug)]
enum Store {
    Sqlite(SqliteStore),
    Redis(Box<RedisStore>),
}

impl WebCache {
    /// Open the configured store: `None` for `store = "none"`. SQLite needs `path`, Redis needs
    /// `redis_url`; Redis is connected to here, so an unreachable server is an error now.
    pub async fn open(cfg: &CacheConfig) -> Result<Option<WebCache>, CacheError> {
        if cfg.ttl_secs == Some(0) {
            return Err(CacheError::Config("ttl_secs must be positive (leave it out for no expiry)".into()));
        }
        let store = match cfg.store {
            CacheStoreKind::None => return Ok(None),
            CacheStoreKind::Sqlite => {
                let path =
                    cfg.path.clone().ok_or_else(|| CacheError::Config("the sqlite cache needs a `path`".into()))?;
                Store::Sqlite(SqliteStore::open(path).await?)
            }
            CacheStoreKind::Redis => {
                let url = cfg
                    .redis_url
                    .as_deref()
                    .ok_or_else(|| CacheError::Config("the redis cache needs a `redis_url`".into()))?;
                Store::Redis(Box::new(RedisStore::open(url, &cfg.redis_prefix, REDIS_TIMEOUT).await?))
            }
        };
        Ok(Some(WebCache { inner: Arc::new(Inner { store, ttl: cfg.ttl_secs }) }))
    }

    /// The cached value, if there is a live entry. Expired or unreadable entries are misses.
    pub async fn get(&self, key: &CacheKey) -> Result<Option<serde_json::Value>, CacheError> {
        self.get_at(key, now_secs()).await
    }

    /// Store `value` under `key` (replacing any entry). Durable once this returns `Ok`.
    pub async fn put(&self, key: &CacheKey, value: serde_json::Value) -> Result<(), CacheError> {
        self.put_at(key, value, now_secs()).await
    }

    async fn get_at(&self, key: &CacheKey, now: u64) -> Result<Option<serde_json::Value>, CacheError> {
        match &self.inner.store {
            Store::Sqlite(s) => s.get(key.digest(), now).await,
            Store::Redis(r) => r.get(key, now).await,
        }
    }

    async fn put_at(&self, key: &CacheKey, value: serde_json::Value, now: u64) -> Result<(), CacheError> {
        let entry = CacheEntry::new(key, value, now, self.inner.ttl);
        match &self.inner.store {
            Store::Sqlite(s) => s.put(entry).await,
            Store::Redis(r) => r.put(&entry, now).await,
        }
    }

    /// Write every live entry to `out`, one [`CacheEntry`] JSON per line; the number written.
    pub async fn export_jsonl<W: Write + Send + 'static>(&self, out: W) -> Result<usize, CacheError> {
        self.export_at(out, now_secs()).await
    }

    async fn export_at<W: Write + Send + 'static>(&self, out: W, now: u64) -> Result<usize, CacheError> {
        match &self.inner.store {
            Store::Sqlite(s) => s.export(out, now).await,
            Store::Redis(r) => r.export(out, now).await,
        }
    }

    /// Read [`CacheEntry`] lines (as written by [`export_jsonl`](Self::export_jsonl)); later
    /// lines replace earlier and existing entries. Blank lines are skipped; malformed lines and
    /// lines whose `key` does not match their fields are reported and skipped; expired entries
    /// are counted and skipped. Only a failure to read `input` or to write the store aborts.
    pub async fn import_jsonl<R: BufRead + Send + 'static>(&self, input: R) -> Result<ImportReport, CacheError> {
        self.import_at(input, now_secs()).await
    }

    async fn import_at<R: BufRead + Send + 'static>(&self, input: R, now: u64) -> Result<ImportReport, CacheError> {
        match &self.inner.store {
            Store::Sqlite(s) => s.import(input, now).await,
            Store::Redis(r) => r.import(input, now).await,
        }
    }

    /// The number of live entries.
    pub async fn len(&self) -> Result<u64, CacheError> {
        self.len_at(now_secs()).await
    }

    async fn len_at(&self, now: u64) -> Result<u64, CacheError> {
        match &self.inner.store {
            Store::Sqlite(s) => s.len(now).await,
            Store::Redis(r) => r.len(now).await,
        }
    }

    /// Whether there are no live entries.
    pub async fn is_empty(&self) -> Result<bool, CacheError> {
        Ok(self.len().await? == 0)
    }

    /// Delete expired entries now (SQLite; Redis expires keys itself). The number deleted.
    pub async fn purge_expired(&self) -> Result<u64, CacheError> {
        match &self.inner.store {
            Store::Sqlite(s) => s.purge(now_secs()).await,
            Store::Redis(_) => Ok(0),
        }
    }

    /// `sqlite /path/file.db` or `redis host:port/db`; never a password.
    pub fn describe(&self) -> String {
        match &self.inner.store {
            Store::Sqlite(s) => format!("sqlite {}", s.path.display()),
            Store::Redis(r) => format!("redis {}", r.location),
        }
    }

    /// The configured time to live of new entries.
    pub fn ttl_secs(&self) -> Option<u64> {
        self.inner.ttl
    }
}

/// What one line of an import file holds.
enum Line {
    Blank,
    Entry(CacheEntry),
    Expired,
    Bad(String),
}

fn parse_line(bytes: &[u8], now: u64) -> Line {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Line::Bad("not UTF-8".into());
    };
    let text = text.trim();
    if text.is_empty() {
        return Line::Blank;
    }
    let entry: CacheEntry = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(e) => return Line::Bad(format!("not a cache entry: {e}")),
    };
    let digest = digest_of(&entry.namespace, &entry.provider, &entry.query, &entry.params);
    if entry.key != digest {
        return Line::Bad(format!("key {} does not match the entry's fields (expected {digest})", entry.key));
    }
    if entry.is_live(now) { Line::Entry(entry) } else { Line::Expired }
}

/// Read `input` line by line (bytes, so one bad encoding does not stop the rest), calling `f`
/// with each 1-based line number and its parse. Stops when `f` says so.
fn for_each_line<R: BufRead>(
    mut input: R,
    now: u64,
    mut f: impl FnMut(usize, Line) -> Result<bool, CacheError>,
) -> Result<(), CacheError> {
    let mut buf = Vec::new();
    let mut n = 0usize;
    loop {
        buf.clear();
        let read =
            input.read_until(b'\n', &mut buf).map_err(|e| CacheError::Io(format!("reading line {}: {e}", n + 1)))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        if !f(n, parse_line(&buf, now))? {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite

struct SqliteStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).finish_non_exhaustive()
    }
}

impl From<rusqlite::Error> for CacheError {
    fn from(e: rusqlite::Error) -> Self {
        CacheError::Sqlite(e.to_string())
    }
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    provider TEXT NOT NULL,
    query TEXT NOT NULL,
    params TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
)";

const UPSERT: &str = "INSERT OR REPLACE INTO entries
    (key, namespace, provider, query, params, value, created_at, expires_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// SQLite stores signed 64-bit integers; clamp rather than wrap.
fn to_sql_time(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

fn from_sql_time(t: i64) -> u64 {
    u64::try_from(t).unwrap_or(0)
}

fn upsert(stmt: &mut rusqlite::Statement<'_>, e: &CacheEntry) -> Result<(), CacheError> {
    stmt.execute(params![
        e.key,
        e.namespace,
        e.provider,
        e.query,
        e.params,
        e.value.to_string(),
        to_sql_time(e.created_at),
        e.expires_at.map(to_sql_time),
    ])
    .map(|_| ())
    .map_err(CacheError::from)
}

fn open_sqlite(path: &Path) -> Result<Connection, CacheError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| CacheError::Io(format!("creating cache directory {}: {e}", dir.display())))?;
    }
    let conn = Connection::open(path).map_err(|e| CacheError::Sqlite(format!("opening {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_millis(5000)).map_err(CacheError::from)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(CacheError::from)?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %path.display(), mode, "the cache file could not be put in WAL mode");
    }
    conn.execute_batch("PRAGMA synchronous=NORMAL;").map_err(CacheError::from)?;
    conn.execute_batch(SCHEMA).map_err(CacheError::from)?;
    Ok(conn)
}

/// A stored value, or `None` (with a warning) when it is not JSON.
fn parse_stored(text: &str, what: &str) -> Option<serde_json::Value> {
    match serde_json::from_str(text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(entry = what, error = %e, "corrupt cache entry ignored");
            None
        }
    }
}

impl SqliteStore {
    async fn open(path: PathBuf) -> Result<SqliteStore, CacheError> {
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || open_sqlite(&p))
            .await
            .map_err(|e| CacheError::Sqlite(format!("cache task failed: {e}")))??;
        Ok(SqliteStore { path, conn: Arc::new(Mutex::new(conn)) })
    }

    /// Run `f` with the connection on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, CacheError> + Send + 'static,
    ) -> Result<T, CacheError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic elsewhere while holding the lock leaves SQLite itself consistent.
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| CacheError::Sqlite(format!("cache task failed: {e}")))?
    }

    async fn get(&self, digest: String, now: u64) -> Result<Option<serde_json::Value>, CacheError> {
        self.with(move |c| {
            let row: Option<(String, Option<i64>)> = c
                .query_row("SELECT value, expires_at FROM entries WHERE key = ?1", [&digest], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(CacheError::from)?;
            let Some((text, expires_at)) = row else { return Ok(None) };
            if !is_live(expires_at.map(from_sql_time), now) {
                c.execute(
                    "DELETE FROM entries WHERE key = ?1 AND expires_at IS NOT NULL AND expires_at <= ?2",
                    params![digest, to_sql_time(now)],
                )
                .map_err(CacheError::from)?;
                return Ok(None);
            }
            Ok(parse_stored(&text, &digest))
        })
        .await
    }

    async fn put(&self, entry: CacheEntry) -> Result<(), CacheError> {
        self.with(move |c| {
            let mut stmt = c.prepare_cached(UPSERT).map_err(CacheError::from)?;
            upsert(&mut stmt, &entry)
        })
        .await
    }

    async fn len(&self, now: u64) -> Result<u64, CacheError> {
        self.with(move |c| {
            let n: i64 = c
                .query_row(
                    "SELECT COUNT(*) FROM entries WHERE expires_at IS NULL OR expires_at > ?1",
                    [to_sql_time(now)],
                    |r| r.get(0),
                )
                .map_err(CacheError::from)?;
            Ok(from_sql_time(n))
        })
        .await
    }

    async fn purge(&self, now: u64) -> Result<u64, CacheError> {
        self.with(move |c| {
            let n = c
                .execute("DELETE FROM entries WHERE expires_at IS NOT NULL AND expires_at <= ?1", [to_sql_time(now)])
                .map_err(CacheError::from)?;
            Ok(n as u64)
        })
        .await
    }

    async fn export<W: Write + Send + 'static>(&self, out: W, now: u64) -> Result<usize, CacheError> {
        self.with(move |c| {
            let mut out = std::io::BufWriter::new(out);
            let mut stmt = c
                .prepare(
                    "SELECT key, namespace, provider, query, params, value, created_at, expires_at FROM entries
                     WHERE expires_at IS NULL OR expires_at > ?1 ORDER BY created_at, key",
                )
                .map_err(CacheError::from)?;
            let mut rows = stmt.query([to_sql_time(now)]).map_err(CacheError::from)?;
            let mut n = 0usize;
            while let Some(r) = rows.next().map_err(CacheError::from)? {
                let key: String = r.get(0).map_err(CacheError::from)?;
                let text: String = r.get(5).map_err(CacheError::from)?;
                let Some(value) = parse_stored(&text, &key) else { continue };
                let entry = CacheEntry {
                    key,
                    namespace: r.get(1).map_err(CacheError::from)?,
                    provider: r.get(2).map_err(CacheError::from)?,
                    query: r.get(3).map_err(CacheError::from)?,
                    params: r.get(4).map_err(CacheError::from)?,
                    value,
                    created_at: from_sql_time(r.get(6).map_err(CacheError::from)?),
                    expires_at: r.get::<_, Option<i64>>(7).map_err(CacheError::from)?.map(from_sql_time),
                };
                write_entry(&mut out, &entry)?;
                n += 1;
            }
            out.flush().map_err(|e| CacheError::Io(format!("writing the export: {e}")))?;
            Ok(n)
        })
        .await
    }

    async fn import<R: BufRead + Send + 'static>(&self, input: R, now: u64) -> Result<ImportReport, CacheError> {
        self.with(move |c| {
            let mut report = ImportReport::default();
            let tx = c.transaction().map_err(CacheError::from)?;
            {
                let mut stmt = tx.prepare(UPSERT).map_err(CacheError::from)?;
                for_each_line(input, now, |n, line| {
                    match line {
                        Line::Blank => {}
                        Line::Expired => report.expired += 1,
                        Line::Bad(why) => report.bad_lines.push((n, why)),
                        Line::Entry(e) => {
                            upsert(&mut stmt, &e)?;
                            report.imported += 1;
                        }
                    }
                    Ok(true)
                })?;
            }
            tx.commit().map_err(CacheError::from)?;
            Ok(report)
        })
        .await
    }
}

fn write_entry(out: &mut impl Write, entry: &CacheEntry) -> Result<(), CacheError> {
    let line = serde_json::to_string(entry).map_err(|e| CacheError::Io(format!("encoding an entry: {e}")))?;
    writeln!(out, "{line}").map_err(|e| CacheError::Io(format!("writing the export: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Redis

struct RedisStore {
    client: redis::Client,
    /// The live connection; `None` after it broke, so the next command reconnects.
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    prefix: String,
    /// `host:port/db`, for messages.
    location: String,
    /// Strings that must never appear in a message (the password, raw and decoded).
    secrets: Vec<String>,
    timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("location", &self.location)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn scrub(mut msg: String, secrets: &[String]) -> String {
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        msg = msg.replace(s.as_str(), "***");
    }
    msg
}

/// Escape glob metacharacters so the prefix matches itself in `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// Whether the connection should be dropped and made again after this error.
fn breaks_connection(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
}

impl RedisStore {
    async fn open(url: &str, prefix: &str, timeout: Duration) -> Result<RedisStore, CacheError> {
        let mut secrets = Vec::new();
        if let Ok(u) = url::Url::parse(url)
            && let Some(p) = u.password()
        {
            secrets.push(p.to_string());
        }
        let client = redis::Client::open(url)
            .map_err(|e| CacheError::Redis(scrub(format!("invalid redis_url: {e}"), &secrets)))?;
        let info = client.get_connection_info();
        if let Some(p) = info.redis_settings().password() {
            secrets.push(p.to_string());
        }
        let location = format!("{}/{}", info.addr(), info.redis_settings().db());
        let store = RedisStore {
            client,
            conn: tokio::sync::Mutex::new(None),
            prefix: prefix.to_string(),
            location,
            secrets,
            timeout,
        };
        store.connection().await?;
        Ok(store)
    }

    fn error(&self, what: &str, e: impl fmt::Display) -> CacheError {
        CacheError::Redis(scrub(format!("{what} ({}): {e}", self.location), &self.secrets))
    }

    /// The shared connection, made (again) if needed.
    async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, CacheError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connect = self.client.get_multiplexed_async_connection_with_config(&config);
        let conn = match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.error("cannot connect to redis", e)),
            Err(_) => {
                return Err(self.error("cannot connect to redis", format!("no answer within {:?}", self.timeout)));
            }
        };
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Run one command (or pipeline) with the timeout; a broken connection is forgotten.
    async fn query<T: redis::FromRedisValue>(&self, what: &str, req: Req<'_>) -> Result<T, CacheError> {
        let mut conn = self.connection().await?;
        let run = async {
            match req {
                Req::Cmd(c) => c.query_async::<T>(&mut conn).await,
                Req::Pipe(p) => p.query_async::<T>(&mut conn).await,
            }
        };
        let outcome = tokio::time::timeout(self.timeout, run).await;
        match outcome {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    *self.conn.lock().await = None;
                }
                Err(self.error(what, e))
            }
            Err(_) => {
                *self.conn.lock().await = None;
                Err(self.error(what, format!("no answer within {:?}", self.timeout)))
            }
        }
    }

    fn key(&self, digest: &str) -> String {
        format!("{}{digest}", self.prefix)
    }

    /// `SET key entry [EX secs]`; `None` when the entry has already expired.
    fn set_cmd(&self, entry: &CacheEntry, now: u64) -> Result<Option<redis::Cmd>, CacheError> {
        let json = serde_json::to_string(entry).map_err(|e| CacheError::Io(format!("encoding an entry: {e}")))?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(&entry.key)).arg(json);
        if let Some(exp) = entry.expires_at {
            if exp <= now {
                return Ok(None);
            }
            cmd.arg("EX").arg(exp - now);
        }
        Ok(Some(cmd))
    }

    async fn get(&self, key: &CacheKey, now: u64) -> Result<Option<serde_json::Value>, CacheError> {
        let digest = key.digest();
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.key(&digest));
        let raw: Option<Vec<u8>> = self.query("GET", Req::Cmd(&cmd)).await?;
        let Some(raw) = raw else { return Ok(None) };
        let Some(entry) = self.decode(&raw, &digest) else { return Ok(None) };
        if entry.key != digest {
            tracing::warn!(entry = %digest, stored = %entry.key, "cache entry under the wrong key ignored");
            return Ok(None);
        }
        Ok(entry.is_live(now).then_some(entry.value))
    }

    fn decode(&self, raw: &[u8], what: &str) -> Option<CacheEntry> {
        match serde_json::from_slice::<CacheEntry>(raw) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(entry = what, store = %self.location, error = %e, "corrupt cache entry ignored");
                None
            }
        }
    }

    async fn put(&self, entry: &CacheEntry, now: u64) -> Result<(), CacheError> {
        let Some(cmd) = self.set_cmd(entry, now)? else { return Ok(()) };
        self.query::<()>("SET", Req::Cmd(&cmd)).await
    }

    /// One `SCAN` step over the prefix: the next cursor (0 at the end) and the live entries of
    /// keys not seen before (`SCAN` may return a key more than once).
    async fn scan_step(
        &self,
        cursor: u64,
        seen: &mut HashSet<String>,
        now: u64,
    ) -> Result<(u64, Vec<CacheEntry>), CacheError> {
        let pattern = format!("{}*", glob_escape(&self.prefix));
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(REDIS_BATCH);
        let (next, keys): (u64, Vec<String>) = self.query("SCAN", Req::Cmd(&cmd)).await?;
        let fresh: Vec<String> = keys.into_iter().filter(|k| seen.insert(k.clone())).collect();
        if fresh.is_empty() {
            return Ok((next, Vec::new()));
        }
        let mut mget = redis::cmd("MGET");
        mget.arg(&fresh);
        let values: Vec<Option<Vec<u8>>> = self.query("MGET", Req::Cmd(&mget)).await?;
        let batch =
            fresh.iter().zip(values).filter_map(|(k, v)| self.decode(&v?, k)).filter(|e| e.is_live(now)).collect();
        Ok((next, batch))
    }

    async fn len(&self, now: u64) -> Result<u64, CacheError> {
        let (mut n, mut cursor, mut seen) = (0u64, 0u64, HashSet::new());
        loop {
            let (next, batch) = self.scan_step(cursor, &mut seen, now).await?;
            n += batch.len() as u64;
            if next == 0 {
                return Ok(n);
            }
            cursor = next;
        }
    }

    async fn export<W: Write + Send + 'static>(&self, out: W, now: u64) -> Result<usize, CacheError> {
        // Writing is blocking I/O: a thread of the blocking pool does it, fed batch by batch.
        let (tx, mut rx) = mpsc::channel::<Vec<CacheEntry>>(4);
        let writer = tokio::task::spawn_blocking(move || {
            let mut out = std::io::BufWriter::new(out);
            let mut n = 0usize;
            while let Some(batch) = rx.blocking_recv() {
                for e in &batch {
                    write_entry(&mut out, e)?;
                    n += 1;
                }
            }
            out.flush().map_err(|e| CacheError::Io(format!("writing the export: {e}")))?;
            Ok::<usize, CacheError>(n)
        });
        let scanned = async {
            let (mut cursor, mut seen) = (0u64, HashSet::new());
            loop {
                let (next, batch) = self.scan_step(cursor, &mut seen, now).await?;
                // A failed writer drops its receiver; its error is reported below.
                if !batch.is_empty() && tx.send(batch).await.is_err() {
                    return Ok(());
                }
                if next == 0 {
                    return Ok::<(), CacheError>(());
                }
                cursor = next;
            }
        }
        .await;
        drop(tx);
        let written = writer.await.map_err(|e| CacheError::Io(format!("export task failed: {e}")))?;
        scanned?;
        written
    }

    async fn import<R: BufRead + Send + 'static>(&self, input: R, now: u64) -> Result<ImportReport, CacheError> {
        // Reading is blocking I/O: a thread of the blocking pool reads and parses, this task
        // writes to Redis in pipelines, in file order (so later lines win).
        let (tx, mut rx) = mpsc::channel::<(usize, Line)>(REDIS_IMPORT_BATCH * 2);
        let reader = tokio::task::spawn_blocking(move || {
            for_each_line(input, now, |n, line| Ok(tx.blocking_send((n, line)).is_ok()))
        });
        let mut report = ImportReport::default();
        let mut pipe = redis::pipe();
        let mut pending = 0usize;
        let mut failure = None;
        while let Some((n, line)) = rx.recv().await {
            match line {
                Line::Blank => {}
                Line::Expired => report.expired += 1,
                Line::Bad(why) => report.bad_lines.push((n, why)),
                Line::Entry(e) => match self.set_cmd(&e, now) {
                    Ok(Some(cmd)) => {
                        pipe.add_command(cmd).ignore();
                        pending += 1;
                    }
                    Ok(None) => report.expired += 1,
                    Err(err) => report.bad_lines.push((n, err.to_string())),
                },
            }
            if pending >= REDIS_IMPORT_BATCH {
                if let Err(e) = self.query::<()>("import", Req::Pipe(&pipe)).await {
                    failure = Some(e);
                    break;
                }
                report.imported += pending;
                pending = 0;
                pipe = redis::pipe();
            }
        }
        drop(rx);
        let read = reader.await.map_err(|e| CacheError::Io(format!("import task failed: {e}")))?;
        if let Some(e) = failure {
            return Err(e);
        }
        read?;
        if pending > 0 {
            self.query::<()>("import", Req::Pipe(&pipe)).await?;
            report.imported += pending;
        }
        Ok(report)
    }
}

/// A command or a pipeline.
#[derive(Clone, Copy)]
enum Req<'a> {
    Cmd(&'a redis::Cmd),
    Pipe(&'a redis::Pipeline),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::RedisServer;
    use serde_json::json;

    fn sqlite_cfg(path: &Path, ttl: Option<u64>) -> CacheConfig {
        CacheConfig { path: Some(path.to_path_buf()), ttl_secs: ttl, ..CacheConfig::default() }
    }

    async fn open_sqlite_cache(path: &Path, ttl: Option<u64>) -> WebCache {
        WebCache::open(&sqlite_cfg(path, ttl)).await.unwrap().unwrap()
    }

    fn redis_server() -> RedisServer {
        RedisServer::start().unwrap_or_else(|e| panic!("the Redis cache tests need redis-server: {e}"))
    }

    async fn open_redis(url: &str, prefix: &str, ttl: Option<u64>) -> WebCache {
        let cfg = CacheConfig {
            store: CacheStoreKind::Redis,
            redis_url: Some(url.to_string()),
            redis_prefix: prefix.to_string(),
            ttl_secs: ttl,
            ..CacheConfig::default()
        };
        WebCache::open(&cfg).await.unwrap().unwrap()
    }

    fn key(q: &str) -> CacheKey {
        CacheKey::new("search", "serper", q, &json!({"topk": 5, "gl": "us"}))
    }

    fn export_to_vec(lines: &[u8]) -> Vec<CacheEntry> {
        let mut out: Vec<CacheEntry> =
            String::from_utf8_lossy(lines).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// A `Write` whose bytes can be read after the cache has consumed it.
    #[derive(Debug, Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl SharedBuf {
        fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    #[test]
    fn normalisation_and_digests() {
        assert_eq!(normalize_query("  Who  wrote\tHamlet \n"), "who wrote hamlet");
        assert_eq!(normalize_query("ÉCOLE\u{3000}Straße"), "école straße");
        let p = json!({"topk": 5});
        assert_eq!(
            CacheKey::new("search", "serper", "  Who  wrote\tHamlet ", &p).digest(),
            CacheKey::new("search", "serper", "who wrote hamlet", &p).digest()
        );
        let base = CacheKey::new("search", "serper", "q", &p).digest();
        assert_eq!(base.len(), 64);
        assert!(base.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(base, CacheKey::new("search", "serper", "q", &json!({"topk": 6})).digest());
        assert_ne!(base, CacheKey::new("search", "brave", "q", &p).digest());
        assert_ne!(base, CacheKey::new("page", "serper", "q", &p).digest());
        assert_ne!(base, CacheKey::new("search", "serper", "q2", &p).digest());
        // The separators keep field boundaries apart.
        assert_ne!(CacheKey::new("ab", "c", "q", &p).digest(), CacheKey::new("a", "bc", "q", &p).digest());
        // Key order, at every depth, does not matter.
        let a = CacheKey::new("search", "x", "q", &json!({"b": 1, "a": {"y": [1, {"n": 2, "m": 3}], "x": null}}));
        let b = CacheKey::new("search", "x", "q", &json!({"a": {"x": null, "y": [1, {"m": 3, "n": 2}]}, "b": 1}));
        assert_eq!(a, b);
        assert_eq!(a.params, r#"{"a":{"x":null,"y":[1,{"m":3,"n":2}]},"b":1}"#);
        assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn config_from_toml() {
        let cfg: CacheConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, CacheConfig::default());
        assert_eq!(cfg.redis_prefix, "grove:cache:");
        let cfg: CacheConfig =
            toml::from_str("store = \"redis\"\nredis_url = \"redis://h:1/2\"\nttl_secs = 60\nmode = \"replay\"")
                .unwrap();
        assert_eq!(cfg.store, CacheStoreKind::Redis);
        assert_eq!(cfg.mode, CacheMode::Replay);
        assert_eq!(cfg.ttl_secs, Some(60));
        assert!(toml::from_str::<CacheConfig>("stroe = \"none\"").is_err());
        let cfg: CacheConfig = toml::from_str("store = \"none\"").unwrap();
        assert_eq!(cfg.store, CacheStoreKind::None);
    }

    #[tokio::test]
    async fn open_checks_the_config() {
        assert!(
            WebCache::open(&CacheConfig { store: CacheStoreKind::None, ..CacheConfig::default() })
                .await
                .unwrap()
                .is_none()
        );
        let e = WebCache::open(&CacheConfig::default()).await.unwrap_err();
        assert!(matches!(e, CacheError::Config(_)), "{e}");
        let e =
            WebCache::open(&CacheConfig { store: CacheStoreKind::Redis, ..CacheConfig::default() }).await.unwrap_err();
        assert!(matches!(e, CacheError::Config(_)), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = WebCache::open(&sqlite_cfg(&dir.path().join("c.db"), Some(0))).await.unwrap_err();
        assert!(matches!(e, CacheError::Config(_)), "{e}");
    }

    #[tokio::test]
    async fn sqlite_round_trip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dirs/cache.db");
        let cache = open_sqlite_cache(&path, None).await;
        assert_eq!(cache.describe(), format!("sqlite {}", path.display()));
        assert_eq!(cache.get(&key("q")).await.unwrap(), None);
        cache.put(&key("q"), json!({"hits": [1, 2]})).await.unwrap();
        assert_eq!(cache.get(&key("  Q ")).await.unwrap(), Some(json!({"hits": [1, 2]})));
        cache.put(&key("q"), json!("replaced")).await.unwrap();
        assert_eq!(cache.get(&key("q")).await.unwrap(), Some(json!("replaced")));
        assert_eq!(cache.len().await.unwrap(), 1);

        // A second handle on the same file (as another process would) sees it, and vice versa.
        let other = open_sqlite_cache(&path, None).await;
        assert_eq!(other.get(&key("q")).await.unwrap(), Some(json!("replaced")));
        other.put(&key("other"), json!(2)).await.unwrap();
        assert_eq!(cache.get(&key("other")).await.unwrap(), Some(json!(2)));
        drop((cache, other));

        let reopened = open_sqlite_cache(&path, None).await;
        assert_eq!(reopened.get(&key("q")).await.unwrap(), Some(json!("replaced")));
        assert_eq!(reopened.len().await.unwrap(), 2);
    }

    #[tokio::test]
    async fn sqlite_ttl_expires_entries() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open_sqlite_cache(&dir.path().join("c.db"), Some(100)).await;
        let now = 1_000_000;
        cache.put_at(&key("q"), json!(1), now).await.unwrap();
        assert_eq!(cache.get_at(&key("q"), now + 99).await.unwrap(), Some(json!(1)));
        assert_eq!(cache.len_at(now + 99).await.unwrap(), 1);
        assert_eq!(cache.get_at(&key("q"), now + 100).await.unwrap(), None);
        assert_eq!(cache.len_at(now + 100).await.unwrap(), 0);
        // The expired row was deleted lazily: even the earlier clock misses now.
        assert_eq!(cache.get_at(&key("q"), now).await.unwrap(), None);

        // Real clock: an entry written now is live.
        cache.put(&key("live"), json!(2)).await.unwrap();
        assert_eq!(cache.get(&key("live")).await.unwrap(), Some(json!(2)));
        cache.put_at(&key("old"), json!(3), 10).await.unwrap();
        assert_eq!(cache.purge_expired().await.unwrap(), 1);

        // Without a ttl, nothing expires.
        let forever = open_sqlite_cache(&dir.path().join("d.db"), None).await;
        forever.put_at(&key("q"), json!(1), 5).await.unwrap();
        assert_eq!(forever.get_at(&key("q"), u64::MAX).await.unwrap(), Some(json!(1)));
    }

    #[tokio::test]
    async fn sqlite_corrupt_value_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let cache = open_sqlite_cache(&path, None).await;
        cache.put(&key("q"), json!(1)).await.unwrap();
        cache.put(&key("ok"), json!(2)).await.unwrap();
        let conn = Connection::open(&path).unwrap();
        conn.execute("UPDATE entries SET value = '{not json' WHERE key = ?1", [key("q").digest()]).unwrap();
        assert_eq!(cache.get(&key("q")).await.unwrap(), None);
        let buf = SharedBuf::default();
        assert_eq!(cache.export_jsonl(buf.clone()).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn sqlite_export_import() {
        let dir = tempfile::tempdir().unwrap();
        let src = open_sqlite_cache(&dir.path().join("a.db"), Some(1000)).await;
        let now = now_secs();
        for i in 0..20 {
            src.put_at(&key(&format!("q{i}")), json!({"i": i, "text": "line\nbreak"}), now).await.unwrap();
        }
        // Expired: not exported.
        src.put_at(&key("gone"), json!(0), now - 2000).await.unwrap();
        let buf = SharedBuf::default();
        assert_eq!(src.export_jsonl(buf.clone()).await.unwrap(), 20);
        let exported = export_to_vec(&buf.bytes());
        assert_eq!(exported.len(), 20);
        assert!(exported.iter().all(|e| e.expires_at == Some(now + 1000) && e.created_at == now));

        let dst = open_sqlite_cache(&dir.path().join("b.db"), None).await;
        dst.put(&key("q3"), json!("stale")).await.unwrap();
        let report = dst.import_jsonl(std::io::Cursor::new(buf.bytes())).await.unwrap();
        assert_eq!(report, ImportReport { imported: 20, expired: 0, bad_lines: vec![] });
        assert_eq!(dst.len().await.unwrap(), 20);
        assert_eq!(dst.get(&key("q3")).await.unwrap(), Some(json!({"i": 3, "text": "line\nbreak"})));
        let again = SharedBuf::default();
        dst.export_jsonl(again.clone()).await.unwrap();
        assert_eq!(export_to_vec(&again.bytes()), exported);
    }

    fn entry_line(q: &str, value: serde_json::Value, expires_at: Option<u64>) -> String {
        let mut e = CacheEntry::new(&key(q), value, 100, None);
        e.expires_at = expires_at;
        serde_json::to_string(&e).unwrap()
    }

    fn messy_import() -> Vec<u8> {
        let mut tampered: CacheEntry = serde_json::from_str(&entry_line("t", json!(0), None)).unwrap();
        tampered.query = "something else".into();
        let lines = [
            entry_line("a", json!(1), None),                   // 1
            "{not json".to_string(),                           // 2
            String::new(),                                     // 3: blank, skipped quietly
            entry_line("a", json!("later wins"), None),        // 4
            r#"{"key": "x"}"#.to_string(),                     // 5: missing fields
            serde_json::to_string(&tampered).unwrap(),         // 6: key does not match
            entry_line("old", json!(1), Some(150)),            // 7: expired
            entry_line("b", json!(2), Some(now_secs() + 500)), // 8
        ];
        let mut bytes = lines.join("\n").into_bytes();
        bytes.extend_from_slice(b"\n\xff\xfe\n"); // 9: not UTF-8
        bytes.extend_from_slice(entry_line("c", json!(3), None).as_bytes()); // 10, no final newline
        bytes
    }

    fn check_messy_report(report: &ImportReport) {
        assert_eq!(report.imported, 4, "{report:?}");
        assert_eq!(report.expired, 1, "{report:?}");
        let lines: Vec<usize> = report.bad_lines.iter().map(|(n, _)| *n).collect();
        assert_eq!(lines, vec![2, 5, 6, 9], "{report:?}");
        assert!(report.bad_lines[2].1.contains("does not match"), "{report:?}");
    }

    async fn check_messy_contents(cache: &WebCache) {
        assert_eq!(cache.get(&key("a")).await.unwrap(), Some(json!("later wins")));
        assert_eq!(cache.get(&key("b")).await.unwrap(), Some(json!(2)));
        assert_eq!(cache.get(&key("c")).await.unwrap(), Some(json!(3)));
        assert_eq!(cache.get(&key("old")).await.unwrap(), None);
        assert_eq!(cache.len().await.unwrap(), 3);
    }

    #[tokio::test]
    async fn sqlite_import_reports_bad_lines_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open_sqlite_cache(&dir.path().join("c.db"), None).await;
        let report = cache.import_jsonl(std::io::Cursor::new(messy_import())).await.unwrap();
        check_messy_report(&report);
        check_messy_contents(&cache).await;
    }

    #[tokio::test]
    async fn sqlite_concurrent_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let a = open_sqlite_cache(&path, None).await;
        let b = open_sqlite_cache(&path, None).await;
        let mut tasks = Vec::new();
        for i in 0..40 {
            let c = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move { c.put(&key(&format!("k{i}")), json!(i)).await }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(a.len().await.unwrap(), 40);
        assert_eq!(b.get(&key("k7")).await.unwrap(), Some(json!(7)));
    }

    #[tokio::test]
    async fn redis_round_trip_and_shared_between_handles() {
        let server = redis_server();
        let a = open_redis(&server.url(), "t:", None).await;
        assert_eq!(a.describe(), format!("redis 127.0.0.1:{}/0", server.port()));
        assert_eq!(a.get(&key("q")).await.unwrap(), None);
        a.put(&key("q"), json!({"hits": ["x"]})).await.unwrap();
        assert_eq!(a.get(&key(" Q")).await.unwrap(), Some(json!({"hits": ["x"]})));

        // Another server process's handle on the same Redis.
        let b = open_redis(&server.url(), "t:", None).await;
        assert_eq!(b.get(&key("q")).await.unwrap(), Some(json!({"hits": ["x"]})));
        b.put(&key("from b"), json!(2)).await.unwrap();
        assert_eq!(a.get(&key("from b")).await.unwrap(), Some(json!(2)));
        assert_eq!(a.len().await.unwrap(), 2);

        // Another prefix is another cache.
        let c = open_redis(&server.url(), "other:", None).await;
        assert_eq!(c.get(&key("q")).await.unwrap(), None);
        assert_eq!(c.len().await.unwrap(), 0);

        // A corrupt stored value is a miss.
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let () =
            redis::cmd("SET").arg(format!("t:{}", key("q").digest())).arg("{oops").query_async(&mut raw).await.unwrap();
        assert_eq!(a.get(&key("q")).await.unwrap(), None);
        assert_eq!(a.len().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn redis_ttl_is_set() {
        let server = redis_server();
        let cache = open_redis(&server.url(), "grove:cache:", Some(100)).await;
        cache.put(&key("q"), json!(1)).await.unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let ttl: i64 =
            redis::cmd("TTL").arg(format!("grove:cache:{}", key("q").digest())).query_async(&mut raw).await.unwrap();
        assert!((90..=100).contains(&ttl), "TTL {ttl}");
        // The entry's own expiry is honoured too.
        let now = now_secs();
        assert_eq!(cache.get_at(&key("q"), now + 200).await.unwrap(), None);

        // Redis drops the key itself when the ttl runs out.
        let short = open_redis(&server.url(), "short:", Some(1)).await;
        short.put(&key("q"), json!(1)).await.unwrap();
        assert_eq!(short.get(&key("q")).await.unwrap(), Some(json!(1)));
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert_eq!(short.get(&key("q")).await.unwrap(), None);
        let exists: i64 =
            redis::cmd("EXISTS").arg(format!("short:{}", key("q").digest())).query_async(&mut raw).await.unwrap();
        assert_eq!(exists, 0);

        // Without a ttl, no expiry.
        let forever = open_redis(&server.url(), "forever:", None).await;
        forever.put(&key("q"), json!(1)).await.unwrap();
        let ttl: i64 =
            redis::cmd("TTL").arg(format!("forever:{}", key("q").digest())).query_async(&mut raw).await.unwrap();
        assert_eq!(ttl, -1);
    }

    #[tokio::test]
    async fn redis_export_import() {
        let server = redis_server();
        let src = open_redis(&server.url(), "src:", Some(1000)).await;
        // More than one SCAN step and one import pipeline.
        for i in 0..600 {
            src.put(&key(&format!("q{i}")), json!({"i": i})).await.unwrap();
        }
        let buf = SharedBuf::default();
        assert_eq!(src.export_jsonl(buf.clone()).await.unwrap(), 600);
        let exported = export_to_vec(&buf.bytes());
        assert_eq!(exported.len(), 600);

        let dst = open_redis(&server.url(), "dst:", None).await;
        let report = dst.import_jsonl(std::io::Cursor::new(buf.bytes())).await.unwrap();
        assert_eq!(report, ImportReport { imported: 600, expired: 0, bad_lines: vec![] });
        assert_eq!(dst.len().await.unwrap(), 600);
        assert_eq!(dst.get(&key("q42")).await.unwrap(), Some(json!({"i": 42})));
        let again = SharedBuf::default();
        assert_eq!(dst.export_jsonl(again.clone()).await.unwrap(), 600);
        assert_eq!(export_to_vec(&again.bytes()), exported);

        // Imported entries keep their expiry.
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let ttl: i64 =
            redis::cmd("TTL").arg(format!("dst:{}", key("q1").digest())).query_async(&mut raw).await.unwrap();
        assert!((900..=1000).contains(&ttl), "TTL {ttl}");

        // Bad lines are reported, the rest imported; SQLite and Redis agree.
        let messy = open_redis(&server.url(), "messy:", None).await;
        let report = messy.import_jsonl(std::io::Cursor::new(messy_import())).await.unwrap();
        check_messy_report(&report);
        check_messy_contents(&messy).await;

        // Across stores: SQLite to Redis.
        let dir = tempfile::tempdir().unwrap();
        let lite = open_sqlite_cache(&dir.path().join("c.db"), None).await;
        lite.import_jsonl(std::io::Cursor::new(buf.bytes())).await.unwrap();
        let from_lite = SharedBuf::default();
        lite.export_jsonl(from_lite.clone()).await.unwrap();
        assert_eq!(export_to_vec(&from_lite.bytes()), exported);
    }

    #[tokio::test]
    async fn redis_unreachable_is_an_error_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cfg = CacheConfig {
            store: CacheStoreKind::Redis,
            redis_url: Some(format!("redis://:hunter2secret@127.0.0.1:{port}/0")),
            ..CacheConfig::default()
        };
        let started = std::time::Instant::now();
        let e = WebCache::open(&cfg).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        assert!(matches!(e, CacheError::Redis(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
        assert!(!msg.contains("hunter2secret"), "{msg}");
    }

    #[tokio::test]
    async fn redis_that_never_answers_times_out() {
        // Accepts connections, never replies.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let url = format!("redis://127.0.0.1:{port}/0");
        let started = std::time::Instant::now();
        let e = RedisStore::open(&url, "p:", Duration::from_millis(300)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        assert!(matches!(e, CacheError::Redis(_)), "{e}");
    }

    #[tokio::test]
    async fn redis_reconnects_after_the_connection_is_dropped() {
        let server = redis_server();
        let cache = open_redis(&server.url(), "p:", None).await;
        cache.put(&key("q"), json!(1)).await.unwrap();
        // The server closes every other client connection, the cache's among them.
        let client = redis::Client::open(server.url()).unwrap();
        let mut raw = client.get_multiplexed_async_connection().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(killed >= 1);
        // At most one call fails with the broken connection; then the cache has reconnected.
        let mut got = None;
        for _ in 0..3 {
            match cache.get(&key("q")).await {
                Ok(v) => {
                    got = v;
                    break;
                }
                Err(e) => assert!(matches!(e, CacheError::Redis(_)), "{e}"),
            }
        }
        assert_eq!(got, Some(json!(1)));

        // With the server gone, calls fail fast.
        drop(server);
        let started = std::time::Instant::now();
        assert!(matches!(cache.put(&key("q"), json!(1)).await, Err(CacheError::Redis(_))));
        assert!(matches!(cache.put(&key("q"), json!(1)).await, Err(CacheError::Redis(_))));
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn scrub_and_glob() {
        assert_eq!(scrub("auth p@ss failed".into(), &["p@ss".into(), String::new()]), "auth *** failed");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
