//! The persistent cache in front of every web provider call and page fetch: the [`WebCache`]
//! front, its configuration (`[cache]`), keys, entries and errors, and the JSONL import/export
//! format. The stores behind it are `sqlite.rs` (a local file) and `redis.rs` (a shared server).
//!
//! Entries are keyed by a [`CacheKey`]: a namespace (`search`, `page`, …), the provider, the
//! normalised query and the call's parameters as canonical JSON. The store is a SQLite file
//! (default; several processes may share it) or a Redis server (several hosts may share it).
//! A successful [`WebCache::put`] is durable against a crash of this process: SQLite has
//! committed the row, Redis has acknowledged the `SET`.
//!
//! Entries can be exported to and imported from JSON Lines (one [`CacheEntry`] per line), e.g.
//! to seed a replay run on another machine.

mod redis;
mod sqlite;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use self::redis::{REDIS_TIMEOUT, RedisStore};
use self::sqlite::SqliteStore;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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

fn write_entry(out: &mut impl Write, entry: &CacheEntry) -> Result<(), CacheError> {
    let line = serde_json::to_string(entry).map_err(|e| CacheError::Io(format!("encoding an entry: {e}")))?;
    writeln!(out, "{line}").map_err(|e| CacheError::Io(format!("writing the export: {e}")))
}

/// Helpers shared by the tests of this module and of both stores.
#[cfg(test)]
mod test_support {
    use std::path::Path;
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    pub(super) fn sqlite_cfg(path: &Path, ttl: Option<u64>) -> CacheConfig {
        CacheConfig { path: Some(path.to_path_buf()), ttl_secs: ttl, ..CacheConfig::default() }
    }

    pub(super) async fn open_sqlite_cache(path: &Path, ttl: Option<u64>) -> WebCache {
        WebCache::open(&sqlite_cfg(path, ttl)).await.unwrap().unwrap()
    }

    pub(super) fn key(q: &str) -> CacheKey {
        CacheKey::new("search", "serper", q, &json!({"topk": 5, "gl": "us"}))
    }

    pub(super) fn export_to_vec(lines: &[u8]) -> Vec<CacheEntry> {
        let mut out: Vec<CacheEntry> =
            String::from_utf8_lossy(lines).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// A `Write` whose bytes can be read after the cache has consumed it.
    #[derive(Debug, Clone, Default)]
    pub(super) struct SharedBuf(Arc<Mutex<Vec<u8>>>);

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
        pub(super) fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    pub(super) fn entry_line(q: &str, value: serde_json::Value, expires_at: Option<u64>) -> String {
        let mut e = CacheEntry::new(&key(q), value, 100, None);
        e.expires_at = expires_at;
        serde_json::to_string(&e).unwrap()
    }

    pub(super) fn messy_import() -> Vec<u8> {
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

    pub(super) fn check_messy_report(report: &ImportReport) {
        assert_eq!(report.imported, 4, "{report:?}");
        assert_eq!(report.expired, 1, "{report:?}");
        let lines: Vec<usize> = report.bad_lines.iter().map(|(n, _)| *n).collect();
        assert_eq!(lines, vec![2, 5, 6, 9], "{report:?}");
        assert!(report.bad_lines[2].1.contains("does not match"), "{report:?}");
    }

    pub(super) async fn check_messy_contents(cache: &WebCache) {
        assert_eq!(cache.get(&key("a")).await.unwrap(), Some(json!("later wins")));
        assert_eq!(cache.get(&key("b")).await.unwrap(), Some(json!(2)));
        assert_eq!(cache.get(&key("c")).await.unwrap(), Some(json!(3)));
        assert_eq!(cache.get(&key("old")).await.unwrap(), None);
        assert_eq!(cache.len().await.unwrap(), 3);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use serde_json::json;

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
}
