//! The journal: one row per request and one per attempt, in SQLite.
//!
//! Requests hand their finished [`Row`] to a bounded channel and move on;
//! a writer thread stores rows in batches (WAL, one transaction a batch), so
//! journaling adds no latency to a request. The writer wakes at most every
//! [`FLUSH_EVERY`], not per row: under load a wake-up and a commit per
//! request would cost more than the rows themselves. A full channel or a failing disk
//! never fails a request: the row is dropped and counted. Retention by age
//! and row count runs in the writer. Only client key *names* are stored.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};
use serde::Serialize;

/// Rows waiting to be written before new ones are dropped (≈0.5 s of a
/// saturated core's requests).
const CHANNEL: usize = 32_768;
/// How long the writer lets rows gather after the first one arrives.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Rows per transaction at most.
const BATCH: usize = 8192;

/// One request, as stored.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// Request id.
    pub id: String,
    /// Arrival, unix milliseconds.
    pub ts_ms: i64,
    /// Client key name.
    pub client: Option<String>,
    /// Model alias.
    pub model: Option<String>,
    /// SSE requested.
    pub stream: bool,
    /// completed, incomplete, failed, cancelled, rejected.
    pub outcome: String,
    /// Status sent to the client.
    pub status: u16,
    /// Class of the final failure.
    pub class: Option<String>,
    /// What the client was told.
    pub error: Option<String>,
    /// Upstreams tried, in order, comma-separated.
    pub targets: String,
    /// Queue wait.
    pub queue_ms: f64,
    /// Time to first byte.
    pub ttfb_ms: Option<f64>,
    /// Total time.
    pub total_ms: f64,
    /// Prompt tokens.
    pub tokens_in: Option<u64>,
    /// Completion tokens.
    pub tokens_out: Option<u64>,
    /// Text delivered before an incomplete stream broke.
    pub partial: Option<String>,
    /// Number of attempts.
    pub n_attempts: u32,
    /// The client's volume was far above its baseline.
    pub anomaly: bool,
    /// Attempts, in order (loaded for one request only).
    pub attempts: Vec<AttemptRow>,
}

/// One attempt, as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptRow {
    /// Upstream name.
    pub upstream: String,
    /// Its status.
    pub status: Option<u16>,
    /// Its class.
    pub class: Option<String>,
    /// What the provider said.
    pub summary: String,
    /// retry_same, next_target, requeue, resume, give_up, fatal, ok.
    pub verdict: String,
    /// Wait before the next attempt.
    pub wait_ms: Option<f64>,
}

/// A finished request on its way to the writer. Built on the request path
/// with as little allocation as possible — labels are `&'static str`,
/// upstream names are shared and looked up by index, strings the request
/// already owned are moved in — because every allocation here is paid on
/// the proxy's core and freed on the writer's.
#[derive(Debug, Clone)]
pub struct Record {
    /// Request id.
    pub id: uuid::Uuid,
    /// Arrival, unix milliseconds.
    pub ts_ms: i64,
    /// Client key name.
    pub client: Option<String>,
    /// Model alias (shared with the config when it is a configured one).
    pub model: Option<Arc<str>>,
    /// SSE requested.
    pub stream: bool,
    /// completed, incomplete, failed, cancelled, rejected.
    pub outcome: &'static str,
    /// Status sent to the client.
    pub status: u16,
    /// Class of the final failure.
    pub class: Option<&'static str>,
    /// What the client was told.
    pub error: Option<String>,
    /// Upstream names by index.
    pub names: Arc<[String]>,
    /// The one upstream tried, when `attempts` is empty because its single
    /// attempt is implied (see [`implied_attempt`]).
    pub upstream: Option<usize>,
    /// Queue wait.
    pub queue_ms: f64,
    /// Time to first byte.
    pub ttfb_ms: Option<f64>,
    /// Total time.
    pub total_ms: f64,
    /// Prompt tokens.
    pub tokens_in: Option<u64>,
    /// Completion tokens.
    pub tokens_out: Option<u64>,
    /// Text delivered before an incomplete stream broke.
    pub partial: Option<String>,
    /// Number of attempts.
    pub n_attempts: u32,
    /// The client's volume was far above its baseline.
    pub anomaly: bool,
    /// Attempts, unless the single one is implied by the request row.
    pub attempts: Vec<AttemptRecord>,
}

/// One attempt on its way to the writer.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Upstream index into [`Record::names`].
    pub upstream: usize,
    /// Its status.
    pub status: Option<u16>,
    /// Its class.
    pub class: Option<&'static str>,
    /// What the provider said.
    pub summary: String,
    /// The decision taken.
    pub verdict: &'static str,
    /// Wait before the next attempt.
    pub wait_ms: Option<f64>,
}

impl AttemptRecord {
    /// What a request with status 200 and this as its only attempt does
    /// not store, because its row implies it ([`implied_attempt`] is the
    /// inverse).
    pub fn is_plain_success(&self) -> bool {
        self.status == Some(200)
            && self.class.is_none()
            && self.summary.is_empty()
            && self.verdict == "ok"
            && self.wait_ms.is_none()
    }
}

impl Record {
    fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or("", String::as_str)
    }

    /// Upstreams tried, in order, each once, comma-separated.
    fn targets(&self) -> std::borrow::Cow<'_, str> {
        if self.attempts.is_empty() {
            return self.upstream.map_or("", |i| self.name(i)).into();
        }
        let mut seen: Vec<usize> = Vec::with_capacity(self.attempts.len());
        for a in &self.attempts {
            if !seen.contains(&a.upstream) {
                seen.push(a.upstream);
            }
        }
        seen.iter().map(|i| self.name(*i)).collect::<Vec<_>>().join(",").into()
    }
}

/// Retention settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    /// Rows older than this are deleted.
    pub max_age: Duration,
    /// At most this many request rows are kept.
    pub max_rows: u64,
}

/// Where requests send their rows; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: SyncSender<Record>,
    dropped: Arc<AtomicU64>,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Journal {
    /// Starts the writer for the file at `path`. The file is opened by the
    /// writer; if it cannot be, rows are counted as dropped and the writer
    /// tries again a little later.
    pub fn start(path: &Path, retention: Retention) -> Journal {
        let (tx, rx) = sync_channel::<Record>(CHANNEL);
        let dropped = Arc::new(AtomicU64::new(0));
        let (file, counter) = (path.to_path_buf(), dropped.clone());
        let spawned = std::thread::Builder::new()
            .name("tidegate-journal".into())
            .spawn(move || writer(&file, &retention, &rx, &counter));
        if let Err(err) = spawned {
            tracing::error!(error = %err, "cannot start the journal writer; requests will not be journaled");
        }
        Journal { tx, dropped, path: Arc::new(path.to_path_buf()) }
    }

    /// Hands a record to the writer; never blocks.
    pub fn record(&self, row: Record) {
        match self.tx.try_send(row) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Rows dropped so far (channel full, disk failing).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Both tables are keyed by the request id, a UUIDv7 whose text sorts in
/// time order: one B-tree each, rows appended at its end, and "newest
/// first" or "older than" are key ranges, so no second index is needed.
const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
PRAGMA wal_autocheckpoint = 4000;
PRAGMA journal_size_limit = 67108864;
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY, ts_ms INTEGER NOT NULL, client TEXT, model TEXT, stream INTEGER NOT NULL,
    outcome TEXT NOT NULL, status INTEGER NOT NULL, class TEXT, error TEXT, targets TEXT NOT NULL,
    queue_ms REAL NOT NULL, ttfb_ms REAL, total_ms REAL NOT NULL, tokens_in INTEGER, tokens_out INTEGER,
    partial TEXT, n_attempts INTEGER NOT NULL, anomaly INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attempts (
    request_id TEXT NOT NULL, n INTEGER NOT NULL,
    upstream TEXT NOT NULL, status INTEGER, class TEXT, summary TEXT NOT NULL, verdict TEXT NOT NULL,
    wait_ms REAL, PRIMARY KEY (request_id, n)) WITHOUT ROWID;
-- The requests worth looking for (not completed) by outcome, newest first;
-- partial, so the common completed row costs this index nothing.
CREATE INDEX IF NOT EXISTS requests_by_outcome ON requests (outcome, id) WHERE outcome <> 'completed';
";

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

fn writer(path: &Path, retention: &Retention, rx: &Receiver<Record>, dropped: &AtomicU64) {
    let mut conn: Option<Connection> = None;
    let mut warned = false;
    // Rows in the table (counted once at open, then tracked), and rows
    // written since retention last ran.
    let mut rows: u64 = 0;
    let mut written: u64 = 0;
    loop {
        let first = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(row) => row,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // Let a batch gather: senders never wake a sleeping writer, and a
        // busy gateway commits a few thousand rows at once.
        std::thread::sleep(FLUSH_EVERY);
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(row) => batch.push(row),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            match open(path) {
                Ok(c) => {
                    rows = c.query_row("SELECT count(*) FROM requests", [], |r| r.get::<_, i64>(0)).unwrap_or(0) as u64;
                    conn = Some(c);
                }
                Err(err) => {
                    if !warned {
                        tracing::warn!(path = %path.display(), error = %err, "journal unavailable: requests go on, rows are dropped");
                        warned = true;
                    }
                    dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match insert(c, &batch) {
            Ok(()) => {
                written += batch.len() as u64;
                rows += batch.len() as u64;
            }
            Err(err) => {
                tracing::warn!(error = %err, rows = batch.len(), "journal write failed: rows dropped");
                dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                conn = None;
            }
        }
        if written >= 10_000 {
            written = 0;
            if let Some(c) = conn.as_ref() {
                match prune(c, retention, rows) {
                    Ok(deleted) => rows = rows.saturating_sub(deleted),
                    Err(err) => tracing::warn!(error = %err, "journal retention failed"),
                }
            }
        }
    }
}

/// The smallest request id of time `ms`: ids are UUIDv7, whose text
/// starts with the millisecond timestamp in hex, so time bounds are key
/// ranges.
fn id_at(ms: i64) -> String {
    let ms = ms.max(0) as u64;
    format!("{:08x}-{:04x}-0000-0000-000000000000", ms >> 16, ms & 0xffff)
}

/// Rows per multi-row INSERT: one statement execution per 32 requests
/// instead of one per request (statement setup and teardown dominate a
/// small row's insert).
const ROWS_PER_INSERT: usize = 32;
const REQUEST_COLUMNS: usize = 18;

fn insert_sql(rows: usize) -> String {
    let one = format!("({})", (0..REQUEST_COLUMNS).map(|_| "?").collect::<Vec<_>>().join(","));
    format!(
        "INSERT OR REPLACE INTO requests (id, ts_ms, client, model, stream, outcome, status, class, error, targets,
         queue_ms, ttfb_ms, total_ms, tokens_in, tokens_out, partial, n_attempts, anomaly) VALUES {}",
        vec![one; rows].join(",")
    )
}

fn bind_request(stmt: &mut rusqlite::Statement<'_>, base: usize, r: &Record) -> rusqlite::Result<()> {
    let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
    stmt.raw_bind_parameter(base + 1, &*r.id.hyphenated().encode_lower(&mut id))?;
    stmt.raw_bind_parameter(base + 2, r.ts_ms)?;
    stmt.raw_bind_parameter(base + 3, &r.client)?;
    stmt.raw_bind_parameter(base + 4, r.model.as_deref())?;
    stmt.raw_bind_parameter(base + 5, r.stream)?;
    stmt.raw_bind_parameter(base + 6, r.outcome)?;
    stmt.raw_bind_parameter(base + 7, r.status)?;
    stmt.raw_bind_parameter(base + 8, r.class)?;
    stmt.raw_bind_parameter(base + 9, &r.error)?;
    stmt.raw_bind_parameter(base + 10, &*r.targets())?;
    stmt.raw_bind_parameter(base + 11, r.queue_ms)?;
    stmt.raw_bind_parameter(base + 12, r.ttfb_ms)?;
    stmt.raw_bind_parameter(base + 13, r.total_ms)?;
    stmt.raw_bind_parameter(base + 14, r.tokens_in.map(|n| n as i64))?;
    stmt.raw_bind_parameter(base + 15, r.tokens_out.map(|n| n as i64))?;
    stmt.raw_bind_parameter(base + 16, &r.partial)?;
    stmt.raw_bind_parameter(base + 17, r.n_attempts)?;
    stmt.raw_bind_parameter(base + 18, r.anomaly)
}

fn insert(conn: &mut Connection, batch: &[Record]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut many = tx.prepare_cached(&insert_sql(ROWS_PER_INSERT))?;
        let mut one = tx.prepare_cached(&insert_sql(1))?;
        for chunk in batch.chunks(ROWS_PER_INSERT) {
            let stmt = if chunk.len() == ROWS_PER_INSERT { &mut many } else { &mut one };
            if chunk.len() == ROWS_PER_INSERT {
                for (k, r) in chunk.iter().enumerate() {
                    bind_request(stmt, k * REQUEST_COLUMNS, r)?;
                }
                stmt.raw_execute()?;
            } else {
                for r in chunk {
                    bind_request(stmt, 0, r)?;
                    stmt.raw_execute()?;
                }
            }
        }
        let mut att = tx.prepare_cached(
            "INSERT OR REPLACE INTO attempts (request_id, n, upstream, status, class, summary, verdict, wait_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for r in batch.iter().filter(|r| !r.attempts.is_empty()) {
            let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
            let id = &*r.id.hyphenated().encode_lower(&mut id);
            for (n, a) in r.attempts.iter().enumerate() {
                att.execute(params![
                    id,
                    n as i64 + 1,
                    r.name(a.upstream),
                    a.status,
                    a.class,
                    a.summary,
                    a.verdict,
                    a.wait_ms
                ])?;
            }
        }
    }
    tx.commit()
}

/// The attempt a request row implies by itself: a single plain success
/// (see [`AttemptRecord::is_plain_success`]) on the one upstream it names.
/// Such an attempt (most requests) is not stored as its own row, which
/// halves the writer's inserts; [`get`] gives it back, identical.
fn implied_attempt(r: &Row) -> Option<AttemptRow> {
    (r.n_attempts == 1 && r.status == 200 && !r.targets.contains(',')).then(|| AttemptRow {
        upstream: r.targets.clone(),
        status: Some(200),
        class: None,
        summary: String::new(),
        verdict: "ok".into(),
        wait_ms: None,
    })
}

/// Deletes requests older than `max_age` and beyond `max_rows` (`rows`:
/// how many the table holds), with their attempts; returns how many
/// requests it deleted. Both bounds are key ranges on the time-ordered
/// id, so no pass over the whole table.
fn prune(conn: &Connection, retention: &Retention, rows: u64) -> rusqlite::Result<u64> {
    let now_ms = jiff::Timestamp::now().as_millisecond();
    let mut keep_from = id_at(now_ms - retention.max_age.as_millis() as i64);
    if rows > retention.max_rows {
        let excess = rows - retention.max_rows;
        let by_count: Option<String> = conn
            .query_row("SELECT id FROM requests ORDER BY id LIMIT 1 OFFSET ?1", params![excess as i64], |r| r.get(0))
            .ok();
        if let Some(id) = by_count {
            keep_from = keep_from.max(id);
        }
    }
    conn.execute("DELETE FROM attempts WHERE request_id < ?1", params![keep_from])?;
    Ok(conn.execute("DELETE FROM requests WHERE id < ?1", params![keep_from])? as u64)
}

/// Filters for reading requests back.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this outcome.
    pub outcome: Option<String>,
    /// Only this alias.
    pub model: Option<String>,
    /// Only requests at or after this unix millisecond.
    pub since_ms: Option<i64>,
    /// At most this many, newest first.
    pub limit: u32,
}

fn read_only(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
}

fn row_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        ts_ms: r.get(1)?,
        client: r.get(2)?,
        model: r.get(3)?,
        stream: r.get(4)?,
        outcome: r.get(5)?,
        status: r.get(6)?,
        class: r.get(7)?,
        error: r.get(8)?,
        targets: r.get(9)?,
        queue_ms: r.get(10)?,
        ttfb_ms: r.get(11)?,
        total_ms: r.get(12)?,
        tokens_in: r.get::<_, Option<i64>>(13)?.map(|n| n as u64),
        tokens_out: r.get::<_, Option<i64>>(14)?.map(|n| n as u64),
        partial: r.get(15)?,
        n_attempts: r.get(16)?,
        anomaly: r.get(17)?,
        attempts: Vec::new(),
    })
}

const COLUMNS: &str = "id, ts_ms, client, model, stream, outcome, status, class, error, targets, queue_ms, ttfb_ms, \
                       total_ms, tokens_in, tokens_out, partial, n_attempts, anomaly";

/// Requests matching `q`, newest first (attempts not loaded). Every
/// filter narrows a key range or an index, so a dashboard polling a
/// journal of millions of rows reads only what it shows: `since` is an id
/// range (ids are time-ordered), an outcome other than `completed` uses
/// the partial outcome index.
pub fn list(path: &Path, q: &Query) -> rusqlite::Result<Vec<Row>> {
    if !path.exists() {
        return Ok(Vec::new()); // nothing journaled yet
    }
    let conn = read_only(path)?;
    let mut sql = format!("SELECT {COLUMNS} FROM requests WHERE id >= ?1");
    if q.outcome.is_some() {
        sql.push_str(" AND outcome = ?2");
        if q.outcome.as_deref() != Some("completed") {
            sql.push_str(" AND outcome <> 'completed'");
        }
    }
    if q.model.is_some() {
        sql.push_str(" AND model = ?3");
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?4");
    let from = q.since_ms.map_or_else(String::new, id_at);
    let mut stmt = conn.prepare(&sql)?;
    let mut bind = stmt.raw_bind_parameter(1, &from).and(stmt.raw_bind_parameter(4, q.limit));
    if let Some(outcome) = &q.outcome {
        bind = bind.and(stmt.raw_bind_parameter(2, outcome));
    }
    if let Some(model) = &q.model {
        bind = bind.and(stmt.raw_bind_parameter(3, model));
    }
    bind?;
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(row_from(r)?);
    }
    Ok(out)
}

/// One request with its attempts.
pub fn get(path: &Path, id: &str) -> rusqlite::Result<Option<Row>> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = read_only(path)?;
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM requests WHERE id = ?1"))?;
    let mut rows = stmt.query_map(params![id], row_from)?;
    let Some(row) = rows.next() else { return Ok(None) };
    let mut row = row?;
    let mut att = conn.prepare(
        "SELECT upstream, status, class, summary, verdict, wait_ms FROM attempts WHERE request_id = ?1 ORDER BY n",
    )?;
    row.attempts = att
        .query_map(params![id], |r| {
            Ok(AttemptRow {
                upstream: r.get(0)?,
                status: r.get(1)?,
                class: r.get(2)?,
                summary: r.get(3)?,
                verdict: r.get(4)?,
                wait_ms: r.get(5)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    if row.attempts.is_empty() {
        row.attempts.extend(implied_attempt(&row));
    }
    Ok(Some(row))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: String, ts_ms: i64) -> Row {
        Row { id, ts_ms, outcome: "completed".into(), status: 200, n_attempts: 1, ..Default::default() }
    }

    fn v7(ms: i64) -> String {
        let ts = uuid::Timestamp::from_unix(uuid::NoContext, (ms / 1000) as u64, ((ms % 1000) * 1_000_000) as u32);
        uuid::Uuid::new_v7(ts).to_string()
    }

    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_owned().into_boxed_str())
    }

    /// The record the request path would have built for `r`.
    fn record(r: &Row) -> Record {
        let mut names: Vec<String> = Vec::new();
        for n in r.targets.split(',').filter(|n| !n.is_empty()).chain(r.attempts.iter().map(|a| a.upstream.as_str())) {
            if !names.iter().any(|x| x == n) {
                names.push(n.to_owned());
            }
        }
        let index = |n: &str| names.iter().position(|x| x == n).unwrap_or(0);
        let implied = implied_attempt(r).is_some_and(|i| r.attempts == [i]);
        Record {
            id: uuid::Uuid::parse_str(&r.id).unwrap(),
            ts_ms: r.ts_ms,
            client: r.client.clone(),
            model: r.model.as_deref().map(Arc::from),
            stream: r.stream,
            outcome: leak(&r.outcome),
            status: r.status,
            class: r.class.as_deref().map(leak),
            error: r.error.clone(),
            upstream: r.targets.split(',').next().filter(|n| !n.is_empty()).map(index),
            queue_ms: r.queue_ms,
            ttfb_ms: r.ttfb_ms,
            total_ms: r.total_ms,
            tokens_in: r.tokens_in,
            tokens_out: r.tokens_out,
            partial: r.partial.clone(),
            n_attempts: r.n_attempts,
            anomaly: r.anomaly,
            attempts: if implied {
                Vec::new()
            } else {
                r.attempts
                    .iter()
                    .map(|a| AttemptRecord {
                        upstream: index(&a.upstream),
                        status: a.status,
                        class: a.class.as_deref().map(leak),
                        summary: a.summary.clone(),
                        verdict: leak(&a.verdict),
                        wait_ms: a.wait_ms,
                    })
                    .collect()
            },
            names: names.clone().into(),
        }
    }

    fn records(rows: &[Row]) -> Vec<Record> {
        rows.iter().map(record).collect()
    }

    #[test]
    fn retention_keeps_the_newest_rows_within_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let now = jiff::Timestamp::now().as_millisecond();
        let day = 24 * 3600 * 1000;
        let rows: Vec<Row> = (0..10).map(|i| row(v7(now - (10 - i) * day), now - (10 - i) * day)).collect();
        assert!(rows.windows(2).all(|w| w[0].id < w[1].id), "UUIDv7 text sorts like time");
        insert(&mut conn, &records(&rows)).unwrap();
        let count = |c: &Connection| c.query_row("SELECT count(*) FROM requests", [], |r| r.get::<_, i64>(0)).unwrap();
        let deleted =
            prune(&conn, &Retention { max_age: Duration::from_secs(5 * 24 * 3600 + 60), max_rows: 100 }, 10).unwrap();
        assert_eq!((deleted, count(&conn)), (5, 5), "older than 5 days are gone");
        prune(&conn, &Retention { max_age: Duration::from_secs(100 * 24 * 3600), max_rows: 3 }, 5).unwrap();
        assert_eq!(count(&conn), 3);
        let newest = list(&path, &Query { limit: 10, ..Default::default() }).unwrap();
        let ids: Vec<&str> = newest.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, [rows[9].id.as_str(), rows[8].id.as_str(), rows[7].id.as_str()]);
    }

    #[test]
    fn a_plain_success_is_stored_once_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let ok = AttemptRow { upstream: "u".into(), status: Some(200), verdict: "ok".into(), ..Default::default() };
        let (a, b) = (v7(1), v7(2));
        let plain = Row { targets: "u".into(), attempts: vec![ok.clone()], ..row(a.clone(), 1) };
        let retried = AttemptRow {
            status: Some(429),
            class: Some("capacity".into()),
            verdict: "retry_same".into(),
            ..ok.clone()
        };
        let twice = Row { targets: "u".into(), n_attempts: 2, attempts: vec![retried, ok], ..row(b.clone(), 2) };
        insert(&mut conn, &records(&[plain.clone(), twice.clone()])).unwrap();
        let stored: i64 = conn.query_row("SELECT count(*) FROM attempts", [], |r| r.get(0)).unwrap();
        assert_eq!(stored, 2, "only the retried request's attempts are rows");
        assert_eq!(get(&path, &a).unwrap().unwrap().attempts, plain.attempts);
        assert_eq!(get(&path, &b).unwrap().unwrap().attempts, twice.attempts);
    }

    #[test]
    fn list_filters_use_key_ranges_and_the_outcome_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        assert!(list(&path, &Query { limit: 5, ..Default::default() }).unwrap().is_empty(), "no file yet: empty");
        let mut conn = open(&path).unwrap();
        let now = jiff::Timestamp::now().as_millisecond();
        let rows: Vec<Row> = (0..20)
            .map(|i| {
                let ts = now - (20 - i) * 60_000;
                let outcome = if i % 5 == 0 { "failed" } else { "completed" };
                Row {
                    outcome: outcome.into(),
                    model: Some(if i % 2 == 0 { "a" } else { "b" }.into()),
                    ..row(v7(ts), ts)
                }
            })
            .collect();
        insert(&mut conn, &records(&rows)).unwrap();
        let ids = |q: Query| list(&path, &q).unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
        let want = |pick: &dyn Fn(usize) -> bool| {
            rows.iter().enumerate().rev().filter(|(i, _)| pick(*i)).map(|(_, r)| r.id.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            ids(Query { outcome: Some("failed".into()), limit: 10, ..Default::default() }),
            want(&|i| i % 5 == 0)
        );
        assert_eq!(
            ids(Query { outcome: Some("completed".into()), model: Some("a".into()), limit: 3, ..Default::default() }),
            want(&|i| i % 5 != 0 && i % 2 == 0)[..3].to_vec()
        );
        assert_eq!(
            ids(Query { since_ms: Some(now - 5 * 60_000 - 1), limit: 50, ..Default::default() }),
            want(&|i| i >= 15)
        );
        let plan: String = conn
            .prepare("EXPLAIN QUERY PLAN SELECT id FROM requests WHERE id >= '' AND outcome = 'failed' AND outcome <> 'completed' ORDER BY id DESC LIMIT 5")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap()
            .join(" / ");
        assert!(plan.contains("requests_by_outcome"), "{plan}");
    }

    #[test]
    fn batches_larger_than_one_statement_keep_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = open(&path).unwrap();
        let rows: Vec<Row> = (0..70)
            .map(|i| Row {
                client: Some(format!("c{i}")),
                model: Some("m".into()),
                stream: i % 2 == 0,
                class: (i % 3 == 0).then(|| "capacity".into()),
                error: (i % 3 == 0).then(|| format!("e{i}")),
                targets: "u".into(),
                queue_ms: i as f64,
                ttfb_ms: Some(1.5),
                total_ms: 2.5,
                tokens_in: Some(i as u64),
                tokens_out: None,
                partial: (i == 69).then(|| "part".into()),
                anomaly: i == 5,
                ..row(v7(1_000 + i as i64), 1_000 + i as i64)
            })
            .collect();
        insert(&mut conn, &records(&rows)).unwrap();
        let back = list(&path, &Query { limit: 100, ..Default::default() }).unwrap();
        assert_eq!(back.len(), 70, "two 32-row statements and six single rows");
        for (got, want) in back.iter().rev().zip(&rows) {
            let (g, w) = (serde_json::to_value(got).unwrap(), serde_json::to_value(want).unwrap());
            assert_eq!(g, w);
        }
    }
}
