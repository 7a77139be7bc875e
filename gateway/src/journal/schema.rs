//! The journal's tables, its format version, and opening a file for
//! writing (migrating an older format in place).

use super::*;

/// The journal's format; a file of an older one is set aside (see
/// [`open`]).
pub(super) const VERSION: i64 = 6;

/// Requests are keyed by the first half of their id (time and a sequence,
/// unique and growing: see [`crate::request_id`]) as SQLite's integer
/// rowid, so a new row is an append at the B-tree's right edge, the
/// cheapest insert SQLite has; "newest first" and "older than" are key
/// ranges. Durations are integer microseconds (3–4 bytes, where a REAL
/// takes 8) and the arrival time is the id's own timestamp: every byte a
/// row does not have is a byte the writer does not write twice (WAL, then
/// checkpoint). `requests_view` shows the same rows with the id as text,
/// a readable time and milliseconds, for `sqlite3` users.
///
/// The `requests` columns are listed once, in [`REQUEST_TABLE`]: the
/// table, the INSERT, the SELECT and the binding follow that list.
pub(super) const REQUEST_TABLE: [(&str, &str); 25] = [
    ("id", "INTEGER PRIMARY KEY"),
    ("id_lo", "INTEGER NOT NULL"),
    ("client", "TEXT"),
    ("model", "TEXT"),
    ("stream", "INTEGER NOT NULL"),
    ("outcome", "TEXT NOT NULL"),
    ("status", "INTEGER NOT NULL"),
    ("class", "TEXT"),
    ("error", "TEXT"),
    ("targets", "TEXT NOT NULL"),
    ("queue_us", "INTEGER NOT NULL"),
    ("ttfb_us", "INTEGER"),
    ("total_us", "INTEGER NOT NULL"),
    ("tokens_in", "INTEGER"),
    ("tokens_out", "INTEGER"),
    ("partial", "TEXT"),
    ("n_attempts", "INTEGER NOT NULL"),
    ("anomaly", "INTEGER NOT NULL DEFAULT 0"),
    ("completion_from", "TEXT"),
    ("protocol", "TEXT"),
    ("dropped", "TEXT"),
    ("via", "TEXT"),
    ("tokens_cached", "INTEGER"),
    ("tokens_cache_written", "INTEGER"),
    ("tokens_reasoning", "INTEGER"),
];

/// The column names of [`REQUEST_TABLE`], comma-separated, in order.
pub(super) fn request_columns() -> String {
    REQUEST_TABLE.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
}

/// `CREATE TABLE requests` from [`REQUEST_TABLE`], then the rest of the schema.
pub(super) fn schema() -> String {
    let columns: Vec<String> = REQUEST_TABLE.iter().map(|(name, ty)| format!("{name} {ty}")).collect();
    format!("CREATE TABLE IF NOT EXISTS requests ({});\n{SCHEMA}", columns.join(", "))
}

pub(super) const SCHEMA: &str = "
-- What the gateway itself did that no request row says (the shared
-- store's breaker tripping and closing), by time.
CREATE TABLE IF NOT EXISTS events (ts_ms INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    request_id INTEGER NOT NULL, n INTEGER NOT NULL,
    upstream TEXT NOT NULL, status INTEGER, class TEXT, summary TEXT NOT NULL, verdict TEXT NOT NULL,
    wait_us INTEGER, protocol TEXT, PRIMARY KEY (request_id, n)) WITHOUT ROWID;
-- The requests worth looking for (not completed) by outcome, newest first
-- (an index holds the rowid); partial, so a completed row costs it nothing.
CREATE INDEX IF NOT EXISTS requests_by_outcome ON requests (outcome) WHERE outcome <> 'completed';
CREATE VIEW IF NOT EXISTS requests_view AS SELECT
    printf('%08x-%04x-%04x-%04x-%012x', (id >> 32) & 0xffffffff, (id >> 16) & 0xffff, id & 0xffff,
           (id_lo >> 48) & 0xffff, id_lo & 0xffffffffffff) AS request_id,
    strftime('%Y-%m-%d %H:%M:%f', (id >> 16) / 1000.0, 'unixepoch') AS time_utc,
    client, model, stream, outcome, status, class, error, targets, queue_us / 1000.0 AS queue_ms,
    ttfb_us / 1000.0 AS ttfb_ms, total_us / 1000.0 AS total_ms, tokens_in, tokens_out, partial, n_attempts,
    anomaly, completion_from, protocol, dropped, via, tokens_cached, tokens_cache_written, tokens_reasoning,
    id AS key
    FROM requests;
";

pub(super) const PRAGMAS: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
PRAGMA wal_autocheckpoint = 4000;
PRAGMA journal_size_limit = 67108864;
";

/// Opens the journal for writing, creating its tables. A file written in
/// the first format (text ids, before 0.2) keeps its rows in the same
/// file as `requests_v1` and `attempts_v1` — readable with `sqlite3`, not
/// shown by `/admin` or `tidegate log` — and a warning says so; its ids
/// cannot become row keys without collisions, so they are not converted.
pub(super) fn open(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch(PRAGMAS)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version < VERSION {
        let tx = conn.transaction()?;
        let first_format = tx.prepare("SELECT 1 FROM pragma_table_info('requests') WHERE name = 'ts_ms'")?.exists([])?;
        if first_format {
            tx.execute_batch(
                "DROP INDEX IF EXISTS requests_by_outcome;
                 ALTER TABLE requests RENAME TO requests_v1;
                 ALTER TABLE attempts RENAME TO attempts_v1;",
            )?;
            tracing::warn!(path = %path.display(), "journal written by an older tidegate: its rows stay in tables requests_v1 and attempts_v1 of this file (not shown by /admin); new rows go to the new format");
        }
        // Version 2 lacks `completion_from`: added (NULL in old rows), and
        // the view that lists it made anew.
        let second_format = version == 2
            && !tx.prepare("SELECT 1 FROM pragma_table_info('requests') WHERE name = 'completion_from'")?.exists([])?;
        if second_format {
            tx.execute_batch(
                "ALTER TABLE requests ADD COLUMN completion_from TEXT; DROP VIEW IF EXISTS requests_view;",
            )?;
        }
        // Version 4 lacks the events table: `schema()` below adds it.
        // Version 3 (or 2) lacks the protocols and what translation
        // dropped: added (NULL in old rows), the view made anew.
        let has = |table: &str, column: &str| {
            tx.prepare(&format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = '{column}'"))
                .and_then(|mut s| s.exists([]))
        };
        if (2..4).contains(&version) && !first_format {
            for (table, column) in
                [("requests", "protocol"), ("requests", "dropped"), ("requests", "via"), ("attempts", "protocol")]
            {
                if !has(table, column)? {
                    tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} TEXT;"))?;
                }
            }
            tx.execute_batch("DROP VIEW IF EXISTS requests_view;")?;
        }
        // Version 5 (or older) lacks the cache's and reasoning's token
        // counts: added (NULL in old rows), the view made anew.
        if (2..6).contains(&version) && !first_format {
            for column in ["tokens_cached", "tokens_cache_written", "tokens_reasoning"] {
                if !has("requests", column)? {
                    tx.execute_batch(&format!("ALTER TABLE requests ADD COLUMN {column} INTEGER;"))?;
                }
            }
            tx.execute_batch("DROP VIEW IF EXISTS requests_view;")?;
        }
        tx.execute_batch(&schema())?;
        tx.pragma_update(None, "user_version", VERSION)?;
        tx.commit()?;
    }
    Ok(conn)
}
