//! The writer thread: rows gathered into batches, multi-row inserts,
//! one transaction a batch, retention.

use super::schema::{REQUEST_TABLE, open, request_columns};
use super::*;

/// The writer thread's loop: opens the file (again later if it cannot),
/// gathers rows, commits them in batches, prunes by retention, and
/// counts what it wrote or dropped (a flush waits for that count).
#[expect(clippy::too_many_arguments, reason = "the writer thread's whole world, handed over once")]
pub(super) fn run(
    path: &Path,
    generations: &Generations,
    retention: &Retention,
    flush_after: Duration,
    rx: &Receiver<Record>,
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
        // Let a batch gather: senders never wake a sleeping writer, a busy
        // gateway commits a thousand rows or more at once, a quiet one
        // about once a second.
        let mut batch = vec![first];
        let mut waited = Duration::ZERO;
        loop {
            let mut connected = true;
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(row) => batch.push(row),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        connected = false;
                        break;
                    }
                }
            }
            if batch.len() >= GATHER || waited >= flush_after || !connected || hurry.load(Ordering::Acquire) > 0 {
                break;
            }
            std::thread::park_timeout(FLUSH_EVERY);
            waited += FLUSH_EVERY;
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
                    done.fetch_add(batch.len() as u64, Ordering::Release);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else {
            done.fetch_add(batch.len() as u64, Ordering::Release);
            continue;
        };
        // Requests end in a different order than they arrived; in key
        // order, the batch is appended at the B-tree's edge.
        batch.sort_unstable_by_key(|r| r.id.as_u64_pair().0);
        let names = generations.read().map(|g| g.clone()).unwrap_or_default();
        match insert(c, &names, &batch) {
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
        done.fetch_add(batch.len() as u64, Ordering::Release);
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
    // In the order of REQUEST_TABLE (the array's length is checked against it).
    let values: [&dyn rusqlite::ToSql; REQUEST_COLUMNS] = [
        &hi,
        &lo,
        &r.client,
        &r.model.as_deref(),
        &r.stream,
        &r.outcome.as_str(),
        &r.status,
        &r.class.map(Class::as_str),
        &detail.and_then(|d| d.error.as_deref()),
        &targets,
        &r.queue_us,
        &r.ttfb_us,
        &r.total_us,
        &r.tokens_in,
        &r.tokens_out,
        &detail.and_then(|d| d.partial.as_deref()),
        &r.n_attempts,
        &r.anomaly,
        &detail.and_then(|d| d.completion_from),
        &r.protocol.map(crate::protocol::Protocol::name),
        &detail.and_then(|d| d.dropped.as_deref()),
        &r.via.map(crate::protocol::Protocol::name),
    ];
    for (i, value) in values.into_iter().enumerate() {
        stmt.raw_bind_parameter(base + i + 1, value)?;
    }
    Ok(())
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
                for (k, r) in chunk.iter().enumerate() {
                    bind_request(stmt, k * REQUEST_COLUMNS, names(r), r)?;
                }
                stmt.raw_execute()?;
            } else {
                for r in chunk {
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
    Ok(conn.execute("DELETE FROM requests WHERE id < ?1", params![keep_from])? as u64)
}
