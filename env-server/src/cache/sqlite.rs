//! The SQLite store of the web cache: one WAL-mode file that several processes on a host may
//! share, driven on tokio's blocking pool; lazy expiry on read, `purge`, and JSONL
//! export/import in one transaction.

use std::fmt;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{CacheEntry, CacheError, ImportReport, Line, for_each_line, is_live, write_entry};

pub(super) struct SqliteStore {
    pub(super) path: PathBuf,
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
    pub(super) async fn open(path: PathBuf) -> Result<SqliteStore, CacheError> {
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

    pub(super) async fn get(&self, digest: String, now: u64) -> Result<Option<serde_json::Value>, CacheError> {
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

    pub(super) async fn put(&self, entry: CacheEntry) -> Result<(), CacheError> {
        self.with(move |c| {
            let mut stmt = c.prepare_cached(UPSERT).map_err(CacheError::from)?;
            upsert(&mut stmt, &entry)
        })
        .await
    }

    pub(super) async fn len(&self, now: u64) -> Result<u64, CacheError> {
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

    pub(super) async fn purge(&self, now: u64) -> Result<u64, CacheError> {
        self.with(move |c| {
            let n = c
                .execute("DELETE FROM entries WHERE expires_at IS NOT NULL AND expires_at <= ?1", [to_sql_time(now)])
                .map_err(CacheError::from)?;
            Ok(n as u64)
        })
        .await
    }

    pub(super) async fn export<W: Write + Send + 'static>(&self, out: W, now: u64) -> Result<usize, CacheError> {
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

    pub(super) async fn import<R: BufRead + Send + 'static>(
        &self,
        input: R,
        now: u64,
    ) -> Result<ImportReport, CacheError> {
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;
    use serde_json::json;

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
}
