//! The Redis store of the web cache: one entry per key under a prefix, shareable between hosts;
//! Redis expires keys itself (`SET … EX`). One multiplexed connection, remade after it breaks;
//! every command under a timeout; passwords scrubbed from messages; `SCAN` + `MGET` export and
//! pipelined import.

use std::collections::HashSet;
use std::fmt;
use std::io::{BufRead, Write};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{CacheEntry, CacheError, CacheKey, ImportReport, Line, for_each_line, write_entry};

/// How long one Redis command (or connecting) may take before it fails.
pub(super) const REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys asked for per `SCAN` step and per `MGET`.
const REDIS_BATCH: usize = 500;
/// Commands per pipeline during an import.
const REDIS_IMPORT_BATCH: usize = 256;

pub(super) struct RedisStore {
    client: redis::Client,
    /// The live connection; `None` after it broke, so the next command reconnects.
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    prefix: String,
    /// `host:port/db`, for messages.
    pub(super) location: String,
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
    pub(super) async fn open(url: &str, prefix: &str, timeout: Duration) -> Result<RedisStore, CacheError> {
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

    pub(super) async fn get(&self, key: &CacheKey, now: u64) -> Result<Option<serde_json::Value>, CacheError> {
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

    pub(super) async fn put(&self, entry: &CacheEntry, now: u64) -> Result<(), CacheError> {
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

    pub(super) async fn len(&self, now: u64) -> Result<u64, CacheError> {
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

    pub(super) async fn export<W: Write + Send + 'static>(&self, out: W, now: u64) -> Result<usize, CacheError> {
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

    pub(super) async fn import<R: BufRead + Send + 'static>(
        &self,
        input: R,
        now: u64,
    ) -> Result<ImportReport, CacheError> {
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
    use super::super::test_support::*;
    use super::super::{CacheConfig, CacheStoreKind, WebCache, now_secs};
    use super::*;
    use crate::testkit::RedisServer;
    use serde_json::json;

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
