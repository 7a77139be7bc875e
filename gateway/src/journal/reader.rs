//! Reading requests back (the admin API, the dashboard, `tidegate log`)
//! through read-only connections.

use super::schema::request_columns;
use super::*;

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

/// A reader's connection. It waits (briefly) for the writer's lock instead
/// of failing: while the writer creates the tables or checkpoints, a read
/// would otherwise answer "database is locked" to the dashboard.
pub(super) fn read_only(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    Ok(conn)
}

/// Whether the writer has made the tables yet: it creates the file when
/// the first row arrives, and a reader that opens it in between finds an
/// empty database (nothing journaled yet, not an unreadable journal).
fn has_tables(conn: &Connection) -> rusqlite::Result<bool> {
    conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'requests'")?.exists([])
}

/// Stored microseconds as the milliseconds rows are read as.
pub(super) fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

/// A `requests` row read by column name (the SELECT lists [`REQUEST_TABLE`]).
pub(super) fn row_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let (hi, lo): (i64, i64) = (r.get("id")?, r.get("id_lo")?);
    let id = uuid::Uuid::from_u64_pair(hi as u64, lo as u64);
    Ok(Row {
        id: id.to_string(),
        ts_ms: crate::request_id::millis(&id),
        client: r.get("client")?,
        model: r.get("model")?,
        stream: r.get("stream")?,
        outcome: r.get("outcome")?,
        status: r.get("status")?,
        class: r.get("class")?,
        error: r.get("error")?,
        targets: r.get("targets")?,
        queue_ms: ms(r.get("queue_us")?),
        ttfb_ms: r.get::<_, Option<i64>>("ttfb_us")?.map(ms),
        total_ms: ms(r.get("total_us")?),
        tokens_in: r.get::<_, Option<i64>>("tokens_in")?.map(|n| n as u64),
        tokens_out: r.get::<_, Option<i64>>("tokens_out")?.map(|n| n as u64),
        tokens_cached: r.get::<_, Option<i64>>("tokens_cached")?.map(|n| n as u64),
        tokens_cache_written: r.get::<_, Option<i64>>("tokens_cache_written")?.map(|n| n as u64),
        tokens_reasoning: r.get::<_, Option<i64>>("tokens_reasoning")?.map(|n| n as u64),
        partial: r.get("partial")?,
        n_attempts: r.get("n_attempts")?,
        anomaly: r.get("anomaly")?,
        completion_from: r.get("completion_from")?,
        protocol: r.get("protocol")?,
        dropped: r.get("dropped")?,
        via: r.get("via")?,
        attempts: Vec::new(),
    })
}

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
    if !has_tables(&conn)? {
        return Ok(Vec::new());
    }
    let mut sql = format!("SELECT {} FROM requests WHERE id >= ?1", request_columns());
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
    let from = q.since_ms.map_or(0, crate::request_id::high_at);
    let mut stmt = conn.prepare(&sql)?;
    let mut bind = stmt.raw_bind_parameter(1, from).and(stmt.raw_bind_parameter(4, q.limit));
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

/// One request with its attempts (`None` for an id that is not a UUID
/// or not in the journal).
pub fn get(path: &Path, id: &str) -> rusqlite::Result<Option<Row>> {
    let Ok(id) = uuid::Uuid::parse_str(id) else { return Ok(None) };
    if !path.exists() {
        return Ok(None);
    }
    let (hi, lo) = key(&id);
    let conn = read_only(path)?;
    if !has_tables(&conn)? {
        return Ok(None);
    }
    let mut stmt = conn.prepare(&format!("SELECT {} FROM requests WHERE id = ?1 AND id_lo = ?2", request_columns()))?;
    let mut rows = stmt.query_map(params![hi, lo], row_from)?;
    let Some(row) = rows.next() else { return Ok(None) };
    let mut row = row?;
    let mut att = conn.prepare(
        "SELECT upstream, status, class, summary, verdict, wait_us, protocol FROM attempts WHERE request_id = ?1 \
         ORDER BY n",
    )?;
    row.attempts = att
        .query_map(params![hi], |r| {
            Ok(AttemptRow {
                upstream: r.get(0)?,
                status: r.get(1)?,
                class: r.get(2)?,
                summary: r.get(3)?,
                verdict: r.get(4)?,
                wait_ms: r.get::<_, Option<i64>>(5)?.map(ms),
                protocol: r.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    if row.attempts.is_empty() {
        row.attempts.extend(implied_attempt(&row));
    }
    Ok(Some(row))
}

/// The attempt a request row implies by itself: a single plain success
/// (see [`AttemptLog::is_plain_success`]) on the one upstream it names.
/// Such an attempt (most requests) is not stored as its own row, which
/// halves the writer's inserts; [`get`] gives it back, identical.
pub(super) fn implied_attempt(r: &Row) -> Option<AttemptRow> {
    (r.n_attempts == 1 && r.status == 200 && !r.targets.contains(',')).then(|| AttemptRow {
        upstream: r.targets.clone(),
        status: Some(200),
        class: None,
        summary: String::new(),
        verdict: "ok".into(),
        wait_ms: None,
        protocol: r.via.clone(),
    })
}

/// The newest row's key in an existing journal (0 when there is none or
/// it cannot be read): request ids made from now on sort after it.
pub(super) fn newest_key(path: &Path) -> u64 {
    if !path.exists() {
        return 0;
    }
    read_only(path)
        .and_then(|c| c.query_row("SELECT max(id) FROM requests", [], |r| r.get::<_, Option<i64>>(0)))
        .ok()
        .flatten()
        .map_or(0, |k| k as u64)
}
