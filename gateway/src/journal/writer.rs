//! The writer thread: rows gathered into batches, multi-row inserts,
//! one transaction a batch, retention.

use super::schema::{REQUEST_TABLE, open, request_columns};
use super::*;
use tokio::time::Instant;

/// The writer thread's loop: opens the file (again later if it cannot),
/// gathers rows, commits them in batches, prunes by retention, and
/// counts what it wrote or dropped (a flush waits for that count).
#[expect(clippy::too_many_arguments, reason = "the writer thread's whole world, handed over once")]
pub(super) fn run(
    path: &Path,
    generations: &Generations,
    retention: &Retention,
    flush_after: Duration,
    rx: &Receiver<Entry>,
    dropped: &AtomicU64,
    done: &AtomicU64,
    hurry: &AtomicUsize,
) {
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
        // Let a batch gather: the writer sleeps until the first row has
        // waited `flush_after`, unless the sender of the GATHER-th waiting
        // row (or a flush) wakes it. A busy gateway commits a thousand rows
        // or more at once, a quiet one about once a second, and the writer
        // wakes once a commit, not every few milliseconds to look.
        let (mut batch, mut events) = (Vec::new(), Vec::new());
        take(first, &mut batch, &mut events);
        let gathering = Instant::now();
        loop {
            let mut connected = true;
            while batch.len() + events.len() < BATCH {
                match rx.try_recv() {
                    Ok(entry) => take(entry, &mut batch, &mut events),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        connected = false;
                        break;
                    }
                }
            }
            let waited = gathering.elapsed();
            // An event is rare and worth seeing at once.
            let now = batch.len() >= GATHER || !events.is_empty();
            if now || waited >= flush_after || !connected || hurry.load(Ordering::Acquire) > 0 {
                break;
            }
            std::thread::park_timeout(flush_after - waited);
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
                    let entries = (batch.len() + events.len()) as u64;
                    dropped.fetch_add(entries, Ordering::Relaxed);
                    done.fetch_add(entries, Ordering::Release);
                    continue;
                }
            }
        }
        let entries = (batch.len() + events.len()) as u64;
        let Some(c) = conn.as_mut() else {
            done.fetch_add(entries, Ordering::Release);
            continue;
        };
        // Requests end in a different order than they arrived; in key
        // order, the batch is appended at the B-tree's edge.
        batch.sort_unstable_by_key(|r| r.id.as_u64_pair().0);
        let names = generations.read().map(|g| g.clone()).unwrap_or_default();
        match insert(c, &names, &batch).and_then(|()| insert_events(c, &events)) {
            Ok(()) => {
                written += batch.len() as u64;
                rows += batch.len() as u64;
            }
            Err(err) => {
                tracing::warn!(error = %err, rows = entries, "journal write failed: rows dropped");
                dropped.fetch_add(entries, Ordering::Relaxed);
                conn = None;
            }
        }
        done.fetch_add(entries, Ordering::Release);
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

/// Sorts an entry into its batch.
fn take(entry: Entry, batch: &mut Vec<Record>, events: &mut Vec<Event>) {
    match entry {
        Entry::Request(row) => batch.push(row),
        Entry::Event(event) => events.push(event),
    }
}

/// Stores the gateway's events (see [`Journal::event`]).
fn insert_events(conn: &mut Connection, events: &[Event]) -> rusqlite::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare_cached("INSERT INTO events (ts_ms, kind, detail) VALUES (?1, ?2, ?3)")?;
        for e in events {
            stmt.execute(params![e.at_ms, e.kind, e.detail])?;
        }
    }
    tx.commit()
}

/// Rows per multi-row INSERT: one statement execution per 32 requests
/// instead of one per request (statement setup and teardown dominate a
/// small row's insert; one row per statement measured 1.5× the writer's
/// CPU). The inserts say `OR IGNORE`: with `OR REPLACE` (or a plain
/// `INSERT`) a multi-row statement may abort half-way, so SQLite keeps a
/// statement journal, copying every page the statement touches. Ids are
/// unique by construction ([`crate::request_id`]); were one ever
/// repeated, the row already stored is kept.
pub(super) const ROWS_PER_INSERT: usize = 32;
const REQUEST_COLUMNS: usize = REQUEST_TABLE.len();

pub(super) fn insert_sql(rows: usize) -> String {
    let one = format!("({})", (0..REQUEST_COLUMNS).map(|_| "?").collect::<Vec<_>>().join(","));
    format!("INSERT OR IGNORE INTO requests ({}) VALUES {}", request_columns(), vec![one; rows].join(","))
}

/// Binds one request's values at parameters `base + 1 ..` of `stmt`, in
/// the order of [`REQUEST_TABLE`]. A NULL is not bound: the statement's
/// parameters were cleared before (binding a NULL takes as long as binding
/// a value, and most of a plain success's columns are NULL). Each value is
/// bound with its own type (no `dyn ToSql` per column): this runs 22
/// times per request, a third of the writer's work.
pub(super) fn bind_request(
    stmt: &mut rusqlite::Statement<'_>,
    base: usize,
    names: &[String],
    r: &Record,
) -> rusqlite::Result<()> {
    let (hi, lo) = key(&r.id);
    let detail = r.detail.as_deref();
    let targets = r.targets(names);
    let targets: &str = &targets;
    let mut b = Binder { stmt, at: base };
    b.put(hi)?;
    b.put(lo)?;
    b.opt(r.client.as_deref())?;
    b.opt(r.model.as_deref())?;
    b.put(r.stream)?;
    b.put(r.outcome.as_str())?;
    b.put(r.status)?;
    b.opt(r.class.map(Class::as_str))?;
    b.opt(detail.and_then(|d| d.error.as_deref()))?;
    b.put(targets)?;
    b.put(r.queue_us)?;
    b.opt(r.ttfb_us.map(std::num::NonZeroI64::get))?;
    b.put(r.total_us)?;
    b.opt(r.tokens.input())?;
    b.opt(r.tokens.output())?;
    b.opt(detail.and_then(|d| d.partial.as_deref()))?;
    b.put(r.n_attempts)?;
    b.put(r.anomaly)?;
    b.opt(detail.and_then(|d| d.completion_from))?;
    b.opt(r.protocol.map(crate::protocol::Protocol::name))?;
    b.opt(detail.and_then(|d| d.dropped.as_deref()))?;
    b.opt(r.via.map(crate::protocol::Protocol::name))?;
    b.opt(r.tokens.cached())?;
    b.opt(r.tokens.cache_written())?;
    b.opt(r.tokens.reasoning())?;
    debug_assert_eq!(b.at - base, REQUEST_COLUMNS, "bind_request binds every column of REQUEST_TABLE");
    Ok(())
}

/// The next parameter of a statement whose parameters start cleared.
struct Binder<'s, 'c> {
    stmt: &'s mut rusqlite::Statement<'c>,
    at: usize,
}

impl Binder<'_, '_> {
    fn put<T: rusqlite::ToSql>(&mut self, value: T) -> rusqlite::Result<()> {
        self.at += 1;
        self.stmt.raw_bind_parameter(self.at, value)
    }

    /// A value, or a NULL left as cleared.
    fn opt<T: rusqlite::ToSql>(&mut self, value: Option<T>) -> rusqlite::Result<()> {
        self.at += 1;
        match value {
            Some(value) => self.stmt.raw_bind_parameter(self.at, value),
            None => Ok(()),
        }
    }
}

/// Writes a batch; `generations` are the upstream names by generation.
pub(super) fn insert(conn: &mut Connection, generations: &[Arc<[String]>], batch: &[Record]) -> rusqlite::Result<()> {
    let names = |r: &Record| generations.get(usize::from(r.generation)).map_or(&[][..], |n| &n[..]);
    let tx = conn.transaction()?;
    {
        let mut many = tx.prepare_cached(&insert_sql(ROWS_PER_INSERT))?;
        let mut one = tx.prepare_cached(&insert_sql(1))?;
        for chunk in batch.chunks(ROWS_PER_INSERT) {
            let stmt = if chunk.len() == ROWS_PER_INSERT { &mut many } else { &mut one };
            if chunk.len() == ROWS_PER_INSERT {
                // Every parameter NULL again: `bind_request` binds only values.
                stmt.clear_bindings();
                for (k, r) in chunk.iter().enumerate() {
                    bind_request(stmt, k * REQUEST_COLUMNS, names(r), r)?;
                }
                stmt.raw_execute()?;
            } else {
                for r in chunk {
                    stmt.clear_bindings();
                    bind_request(stmt, 0, names(r), r)?;
                    stmt.raw_execute()?;
                }
            }
        }
        let mut att = tx.prepare_cached(
            "INSERT OR IGNORE INTO attempts (request_id, n, upstream, status, class, summary, verdict, wait_us,
             protocol) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for r in batch.iter().filter(|r| !r.attempts().is_empty()) {
            let (id, _) = key(&r.id);
            for (n, a) in r.attempts().iter().enumerate() {
                att.execute(params![
                    id,
                    n as i64 + 1,
                    names(r).get(a.upstream.index()).map_or("", String::as_str),
                    a.status,
                    a.class.map(Class::as_str),
                    a.summary,
                    a.verdict.as_str(),
                    a.wait.map(micros),
                    a.protocol
                ])?;
            }
        }
    }
    tx.commit()
}

/// Deletes requests older than `max_age` and beyond `max_rows` (`rows`:
/// how many the table holds), with their attempts; returns how many
/// requests it deleted. Both bounds are key ranges on the time-ordered
/// id, so no pass over the whole table.
pub(super) fn prune(conn: &Connection, retention: &Retention, rows: u64) -> rusqlite::Result<u64> {
    let now_ms = jiff::Timestamp::now().as_millisecond();
    let mut keep_from = crate::request_id::high_at(now_ms - retention.max_age.as_millis() as i64);
    if rows > retention.max_rows {
        let excess = rows - retention.max_rows;
        let by_count: Option<i64> = conn
            .query_row("SELECT id FROM requests ORDER BY id LIMIT 1 OFFSET ?1", params![excess as i64], |r| r.get(0))
            .ok();
        if let Some(id) = by_count {
            keep_from = keep_from.max(id);
        }
    }
    conn.execute("DELETE FROM attempts WHERE request_id < ?1", params![keep_from])?;
    let events_from = now_ms - retention.max_age.as_millis() as i64;
    conn.execute("DELETE FROM events WHERE ts_ms < ?1", params![events_from])?;
    Ok(conn.execute("DELETE FROM requests WHERE id < ?1", params![keep_from])? as u64)
}
