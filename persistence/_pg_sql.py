"""The PostgreSQL store's statements (``persistence._postgres``), in psycopg's ``%s`` style.

The same reads and writes as the SQLite store's (``_writes``), in PostgreSQL's dialect, plus the
lease statements: the take (one conditional update bumping the epoch, judged by the database's
``now()``), the fence (the holder's epoch, read ``FOR KEY SHARE`` so no take lands before the
writing transaction ends), the batched renewal, the claim of expired leases (``FOR UPDATE SKIP
LOCKED``) and the release. Every read returns the column tuples ``_decode`` reads.
"""

from __future__ import annotations

from persistence.records import CutState

#: The lease length, from a parameter in seconds (a float).
_LEASE = "now() + make_interval(secs => %(lease)s)"

# -- schema ---------------------------------------------------------------------------------

SELECT_TABLES = (
    "SELECT table_name FROM information_schema.tables "
    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
)
SELECT_VERSION = "SELECT version, application FROM schema_version"
INSERT_VERSION = "INSERT INTO schema_version (version) VALUES (%s)"
UPDATE_VERSION = "UPDATE schema_version SET version = %s"
#: One migrating process at a time (a transaction-scoped advisory lock; any key will do that
#: no other application is likely to take: "turnkeeper" as eight bytes).
LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock(8390604010745046386)"

# -- leases ---------------------------------------------------------------------------------

#: The fence of a session this process holds: its epoch when the lease is still ours, read
#: ``FOR KEY SHARE``. A take locks ``FOR UPDATE``, which waits for it, so no row of the old
#: epoch lands after the new epoch's first; a renewal (a plain update of a non-key column,
#: ``FOR NO KEY UPDATE``) does not, so the holder's own renewer never deadlocks with its
#: writer.
FENCE = "SELECT epoch FROM sessions WHERE id = %(id)s AND owner = %(owner)s FOR KEY SHARE"
#: A session row a take may take: unowned, or its owner's lease ran out (by the database's
#: clock). A malformed row (a negative epoch, an owner this code never mints, an owner without
#: an expiry) is never taken: ``MALFORMED`` reports it.
TAKEABLE = "epoch >= 0 AND (owner IS NULL OR (owner ~ %(pattern)s AND lease_expires <= now()))"
#: Take a session that is unowned or whose lease ran out: the epoch goes up by one. The row
#: is locked ``FOR UPDATE`` first, so the take waits for a holder's write in flight (its
#: fence's ``FOR KEY SHARE``) and then judges the lease again.
TAKE = (
    f"WITH t AS (SELECT id FROM sessions WHERE id = %(id)s AND {TAKEABLE} FOR UPDATE) "
    "UPDATE sessions s SET owner = %(owner)s, epoch = s.epoch + 1, "
    f"lease_expires = {_LEASE} FROM t WHERE s.id = t.id RETURNING s.epoch"
)
#: Sessions whose lease columns are malformed (never taken), by id.
MALFORMED = (
    "SELECT id, owner, epoch, lease_expires IS NULL FROM sessions WHERE epoch < 0 "
    "OR (owner IS NOT NULL AND (owner !~ %(pattern)s OR lease_expires IS NULL)) ORDER BY id"
)
#: Who holds a session (when a take or a fence failed), for ``LeaseLost``'s message.
HOLDER = "SELECT owner, epoch, lease_expires <= now() FROM sessions WHERE id = %(id)s"
#: Create a session, taken by its creator at epoch 1.
CREATE_SESSION = (
    "INSERT INTO sessions (id, record, owner, epoch, lease_expires) "
    f"VALUES (%(id)s, %(record)s, %(owner)s, 1, {_LEASE}) ON CONFLICT (id) DO NOTHING "
    "RETURNING epoch"
)
#: Every lease of one owner renewed at once (one statement per process, whatever it holds).
RENEW = f"UPDATE sessions SET lease_expires = {_LEASE} WHERE owner = %(owner)s RETURNING id, epoch"
#: Tell the peers listening that leases went back (delivered when the transaction commits).
NOTIFY_RELEASED = "SELECT pg_notify('turnkeeper', 'released')"
#: Give every lease of one owner back (a clean shutdown): a peer may take them at once.
RELEASE_ALL = (
    "UPDATE sessions SET owner = NULL, lease_expires = NULL WHERE owner = %(owner)s RETURNING id"
)
RELEASE = (
    "UPDATE sessions SET owner = NULL, lease_expires = NULL "
    "WHERE owner = %(owner)s AND id = ANY(%(ids)s) RETURNING id"
)
#: Each session's lease facts, for ``inspect``.
LEASES = "SELECT id, owner, epoch, lease_expires, lease_expires <= now() FROM sessions ORDER BY id"

# -- writes ---------------------------------------------------------------------------------

SELECT_SESSION = "SELECT id, record FROM sessions WHERE id = %s"
SELECT_SESSION_ID = "SELECT 1 FROM sessions WHERE id = %s"
INSERT_ROW = (
    "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body, epoch) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE_ROWS = "DELETE FROM history_rows WHERE session = %s AND row_id = ANY(%s)"
#: A cut record's state, in its column and in the record (re-encoded by ``jsonb``: the keys
#: may move, which no decoder minds; bodies are never touched).
SET_CUT_STATE = (
    "UPDATE history_rows SET cut_state = %(state)s, cut = convert_to(jsonb_set("
    "convert_from(cut, 'UTF8')::jsonb, '{state}', to_jsonb(%(state)s::text))::text, 'UTF8') "
    "WHERE session = %(session)s AND row_id = %(row_id)s AND cut IS NOT NULL"
)
SELECT_ROW_SHAPE = "SELECT seq FROM history_rows WHERE session = %s AND row_id = %s"
SELECT_SEQ_HOLDER = "SELECT row_id FROM history_rows WHERE session = %s AND seq = %s"
PUT_ENVELOPE = (
    "INSERT INTO turn_envelopes (session, stream, record) VALUES (%s, %s, %s) "
    "ON CONFLICT (session, stream) DO UPDATE SET record = excluded.record"
)
PUT_OPERATION = (
    "INSERT INTO operations "
    "(op_id, session, state, capability, target, resolved_by, resolved_at, record, epoch) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (op_id) DO UPDATE SET "
    "session = excluded.session, state = excluded.state, capability = excluded.capability, "
    "target = excluded.target, resolved_by = excluded.resolved_by, "
    "resolved_at = excluded.resolved_at, record = excluded.record, epoch = excluded.epoch"
)
PUT_HANDLE = (
    "INSERT INTO handles (handle_id, owner, target, status, record) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (handle_id) DO UPDATE SET owner = excluded.owner, target = excluded.target, "
    "status = excluded.status, record = excluded.record"
)
PUT_QUEUE_VERSION = (
    "INSERT INTO queue_versions AS v (session, version) VALUES (%s, %s) ON CONFLICT (session) "
    "DO UPDATE SET version = excluded.version WHERE excluded.version > v.version"
)
DROP_QUEUED = "DELETE FROM queued_entries WHERE session = %s AND NOT (entry_id = ANY(%s))"
PUT_QUEUED = (
    "INSERT INTO queued_entries (session, entry_id, position, kind, body) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session, entry_id) DO UPDATE SET "
    "position = excluded.position, kind = excluded.kind, body = excluded.body"
)
PUT_ABANDON = (
    "INSERT INTO abandon_markers (session, reason, user_row) VALUES (%s, %s, %s) "
    "ON CONFLICT (session) DO UPDATE SET reason = excluded.reason, user_row = excluded.user_row"
)
DROP_ABANDON = "DELETE FROM abandon_markers WHERE session = %s"
PUT_RETRY_OFF = (
    "INSERT INTO retry_settings (session, auto_retry) VALUES (%s, 0) "
    "ON CONFLICT (session) DO UPDATE SET auto_retry = excluded.auto_retry"
)
DROP_RETRY = "DELETE FROM retry_settings WHERE session = %s"
PUT_PART = (
    "INSERT INTO partial_parts (session, stream, position, body) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (session, stream, position) DO UPDATE SET body = excluded.body"
)
DROP_PARTS = "DELETE FROM partial_parts WHERE session = %s AND stream = %s"

# -- a fast batch's statements (``_pg_fast``): one per table for many sessions ------------
# One array per column (``unnest``), sent in binary (no text escaping of every element).
# ``WITH ORDINALITY ... ORDER BY`` keeps the arrays' order, so an identity column
# (``written``) numbers the rows as one insert after another would. A check that fails
# (``turnkeeper_check``) fails the transaction before its COMMIT.

#: The SQLSTATE of ``turnkeeper_check`` (migration 0003): a fast batch's check failed.
CHECK_FAILED = "TK001"
#: Every session of a batch held by this owner at the epoch it holds (or the batch fails).
FENCE_MANY = (
    "SELECT turnkeeper_check(count(*) = %(n)s, 'a lease of the batch did not hold') "
    "FROM (SELECT 1 FROM sessions s JOIN unnest(%(ids)b::text[], %(epochs)b::bigint[]) "
    "AS h(id, epoch) ON s.id = h.id AND s.epoch = h.epoch WHERE s.owner = %(owner)s "
    "ORDER BY s.id FOR KEY SHARE OF s) f"
)
DELETE_ROWS_MANY = (
    "DELETE FROM history_rows h USING unnest(%b::text[], %b::text[]) AS d(session, row_id) "
    "WHERE h.session = d.session AND h.row_id = d.row_id RETURNING h.session"
)
INSERT_ROWS = (
    "INSERT INTO history_rows (session, seq, row_id, kind, stream, cut_state, cut, body, epoch) "
    "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
    "%b::text[], %b::bytea[], %b::bytea[], %b::bigint[])"
)
#: Every cut state of a wave moved its row (or the batch fails).
SET_CUT_STATES = (
    "WITH moved AS (UPDATE history_rows h SET cut_state = u.state, cut = convert_to(jsonb_set("
    "convert_from(h.cut, 'UTF8')::jsonb, '{state}', to_jsonb(u.state))::text, 'UTF8') "
    "FROM unnest(%(sessions)b::text[], %(rows)b::text[], %(states)b::text[]) "
    "AS u(session, row_id, state) "
    "WHERE h.session = u.session AND h.row_id = u.row_id AND h.cut IS NOT NULL RETURNING 1) "
    "SELECT turnkeeper_check(count(*) = %(n)s, 'a cut state of the batch moved no row') "
    "FROM moved"
)
PUT_ENVELOPES = (
    "INSERT INTO turn_envelopes (session, stream, record) SELECT u.s, u.t, u.r "
    "FROM unnest(%b::text[], %b::text[], %b::bytea[]) WITH ORDINALITY AS u(s, t, r, n) "
    "ORDER BY u.n ON CONFLICT (session, stream) DO UPDATE SET record = excluded.record"
)
PUT_OPERATIONS = (
    "INSERT INTO operations "
    "(op_id, session, state, capability, target, resolved_by, resolved_at, record, epoch) "
    "SELECT u.a, u.b, u.c, u.d, u.e, u.f, u.g, u.h, u.i FROM unnest(%b::text[], %b::text[], "
    "%b::text[], %b::text[], %b::text[], %b::text[], %b::float8[], %b::bytea[], %b::bigint[]) "
    "WITH ORDINALITY AS u(a, b, c, d, e, f, g, h, i, n) ORDER BY u.n "
    "ON CONFLICT (op_id) DO UPDATE SET "
    "session = excluded.session, state = excluded.state, capability = excluded.capability, "
    "target = excluded.target, resolved_by = excluded.resolved_by, "
    "resolved_at = excluded.resolved_at, record = excluded.record, epoch = excluded.epoch"
)
PUT_HANDLES = (
    "INSERT INTO handles (handle_id, owner, target, status, record) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::bytea[]) "
    "ON CONFLICT (handle_id) DO UPDATE SET owner = excluded.owner, target = excluded.target, "
    "status = excluded.status, record = excluded.record"
)
DROP_PARTS_MANY = (
    "DELETE FROM partial_parts p USING unnest(%b::text[], %b::text[]) AS d(session, stream) "
    "WHERE p.session = d.session AND p.stream = d.stream"
)
PUT_PARTS = (
    "INSERT INTO partial_parts (session, stream, position, body) SELECT u.s, u.t, u.p, u.b "
    "FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bytea[]) WITH ORDINALITY "
    "AS u(s, t, p, b, n) ORDER BY u.n "
    "ON CONFLICT (session, stream, position) DO UPDATE SET body = excluded.body"
)

# -- reads ----------------------------------------------------------------------------------

COLUMNS = "session, seq, row_id, kind, stream, cut_state, cut, body"
H_COLUMNS = "h.session, h.seq, h.row_id, h.kind, h.stream, h.cut_state, h.cut, h.body"
SELECT_SESSIONS = "SELECT id, record FROM sessions ORDER BY id"
SELECT_HISTORY = f"SELECT {COLUMNS} FROM history_rows WHERE session = %s ORDER BY seq"
SELECT_ENVELOPES = (
    "SELECT session, stream, record FROM turn_envelopes WHERE session = %s ORDER BY written"
)
_QUEUED_COLUMNS = "SELECT session, entry_id, position, kind, body FROM queued_entries"
SELECT_QUEUED = f"{_QUEUED_COLUMNS} WHERE session = %s ORDER BY position, entry_id"
SELECT_ALL_QUEUED = f"{_QUEUED_COLUMNS} ORDER BY session, position, entry_id"
SELECT_QUEUE_VERSION = "SELECT session, version FROM queue_versions WHERE session = %s"
SELECT_QUEUE_VERSIONS = "SELECT session, version FROM queue_versions ORDER BY session"
SELECT_ABANDON = "SELECT session, reason, user_row FROM abandon_markers WHERE session = %s"
SELECT_ALL_ABANDON = "SELECT session, reason, user_row FROM abandon_markers ORDER BY session"
SELECT_RETRY = "SELECT session, auto_retry FROM retry_settings WHERE session = %s"
SELECT_PARTS = (
    "SELECT stream, position, body FROM partial_parts WHERE session = %s ORDER BY written"
)
_OPERATION_COLUMNS = "SELECT op_id, state, record FROM operations"
SELECT_OPERATION = f"{_OPERATION_COLUMNS} WHERE op_id = %s"
SELECT_OPERATIONS = f"{_OPERATION_COLUMNS} ORDER BY written"
SELECT_OPERATIONS_IN_SESSION = f"{_OPERATION_COLUMNS} WHERE session = %s ORDER BY written"
_OPEN = "('requested', 'running', 'indeterminate')"
_OPEN_COLUMNS = "SELECT op_id, state, record, session, target FROM operations"
SELECT_OPEN = f"{_OPEN_COLUMNS} WHERE state IN {_OPEN} ORDER BY written"
SELECT_OPEN_IN_SESSION = f"{_OPEN_COLUMNS} WHERE state IN {_OPEN} AND session = %s ORDER BY written"
_HANDLE_COLUMNS = "SELECT handle_id, owner, target, status, record FROM handles"
#: The handles query, by which filters it has: ``(owner given, target given)``.
SELECT_HANDLES = {
    (False, False): f"{_HANDLE_COLUMNS} ORDER BY handle_id",
    (True, False): f"{_HANDLE_COLUMNS} WHERE owner = %s ORDER BY handle_id",
    (False, True): f"{_HANDLE_COLUMNS} WHERE target = %s ORDER BY handle_id",
    (True, True): f"{_HANDLE_COLUMNS} WHERE owner = %s AND target = %s ORDER BY handle_id",
}

#: The handles of turns delegated into any of ``%s`` (a claim's sessions, LS-11).
SELECT_HANDLES_INTO = f"{_HANDLE_COLUMNS} WHERE target = ANY(%s) ORDER BY handle_id"
#: A new handle (LS-11's start): never over one that exists (a handle id is never reused).
INSERT_HANDLE = (
    "INSERT INTO handles (handle_id, owner, target, status, record) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (handle_id) DO NOTHING RETURNING handle_id"
)
#: Tell the owner's engine that a handle of ``owner`` was written in another process.
NOTIFY_HANDLE = "SELECT pg_notify('turnkeeper', 'handle:' || %s)"

# -- the startup scan -----------------------------------------------------------------------

_SETTLED = ", ".join(f"'{state.value}'" for state in CutState if state is not CutState.OWED)
#: A row whose cut is owed, or whose state is none of the settled ones (damage: reported,
#: never an owed cut made invisible). The partial index ``history_rows_live`` serves it.
LIVE = f"cut_state IS NOT NULL AND cut_state NOT IN ({_SETTLED})"
_LIVE_SESSIONS = f"SELECT DISTINCT session FROM history_rows WHERE {LIVE}"
SCAN_OWED = f"SELECT {COLUMNS} FROM history_rows WHERE {LIVE} ORDER BY session, seq"
SCAN_TRAILING = (
    f"SELECT {H_COLUMNS} FROM history_rows h JOIN (SELECT session, max(seq) AS seq "
    f"FROM history_rows WHERE {LIVE} GROUP BY session) o "
    "ON h.session = o.session AND h.seq > o.seq ORDER BY h.session, h.seq"
)
SCAN_SESSIONS = f"SELECT id, record FROM sessions WHERE id IN ({_LIVE_SESSIONS})"
SCAN_STREAMS = (
    f"SELECT session, stream FROM turn_envelopes WHERE session IN ({_LIVE_SESSIONS}) "
    "ORDER BY written"
)
SCAN_QUEUED = "SELECT DISTINCT session FROM queued_entries ORDER BY session"
#: Every session that owes nothing whose last row that is not a system row is not an
#: assistant row, with the seq of its last user row (NULL: none); then its rows from there.
SCAN_TAIL_ROWS = (
    "WITH tail AS MATERIALIZED (SELECT s.id AS session, "
    "(SELECT h.seq FROM history_rows h WHERE h.session = s.id AND h.kind = 'user' "
    "ORDER BY h.seq DESC LIMIT 1) AS start FROM sessions s "
    f"WHERE NOT EXISTS (SELECT 1 FROM history_rows l WHERE l.session = s.id AND {LIVE}) "
    "AND (SELECT h.kind FROM history_rows h WHERE h.session = s.id AND h.kind <> 'system' "
    "ORDER BY h.seq DESC LIMIT 1) <> 'assistant') "
    f"SELECT {H_COLUMNS} FROM tail JOIN history_rows h ON h.session = tail.session "
    "AND h.seq >= coalesce(tail.start, -9223372036854775808) ORDER BY h.session, h.seq"
)
SCAN_TAIL_SESSIONS = "SELECT id, record FROM sessions WHERE id = ANY(%s)"
SCAN_TAIL_STREAMS = (
    "SELECT session, stream FROM turn_envelopes WHERE session = ANY(%s) ORDER BY written"
)
SCAN_LAST_ENVELOPES = (
    "SELECT DISTINCT ON (e.session) e.session, e.stream, e.record, (SELECT 1 FROM history_rows h "
    "WHERE h.session = e.session AND h.stream = e.stream LIMIT 1) FROM turn_envelopes e "
    "WHERE e.session = ANY(%s) ORDER BY e.session, e.written DESC"
)
SCAN_VERSIONS = "SELECT session, version FROM queue_versions WHERE session = ANY(%s)"
SCAN_ABANDON = "SELECT session, reason, user_row FROM abandon_markers WHERE session = ANY(%s)"
SCAN_RETRY = "SELECT session, auto_retry FROM retry_settings WHERE session = ANY(%s)"

# -- recovery by claiming -------------------------------------------------------------------

#: Up to ``limit`` takeable sessions that have something to recover (an owed cut, a receipt
#: left requested or running, a queued entry, or a history ending unanswered), oldest expiry
#: first, each taken at the next epoch. ``SKIP LOCKED``: a session a peer is claiming (or a
#: holder is writing) is left to it, so processes starting together split the work and none
#: is claimed twice.
CLAIM = (
    "WITH claimable AS (SELECT s.id FROM sessions s WHERE "
    "s.epoch >= 0 AND (s.owner IS NULL OR (s.owner ~ %(pattern)s AND s.lease_expires <= now())) "
    f"AND (EXISTS (SELECT 1 FROM history_rows h WHERE h.session = s.id AND {LIVE}) "
    "OR EXISTS (SELECT 1 FROM operations o WHERE o.session = s.id "
    "AND o.state IN ('requested', 'running')) "
    "OR EXISTS (SELECT 1 FROM queued_entries q WHERE q.session = s.id) "
    "OR EXISTS (SELECT 1 FROM inbox i WHERE i.session = s.id) "
    "OR EXISTS (SELECT 1 FROM requests r WHERE r.session = s.id AND r.begun IS NULL) "
    "OR (SELECT h.kind FROM history_rows h WHERE h.session = s.id AND h.kind <> 'system' "
    "ORDER BY h.seq DESC LIMIT 1) <> 'assistant') "
    "ORDER BY s.lease_expires NULLS FIRST, s.id LIMIT %(limit)s FOR UPDATE OF s SKIP LOCKED) "
    "UPDATE sessions t SET owner = %(owner)s, epoch = t.epoch + 1, "
    f"lease_expires = {_LEASE} FROM claimable c WHERE t.id = c.id RETURNING t.id, t.epoch"
)

# -- the inbox (LS-9) -----------------------------------------------------------------------

POST = "INSERT INTO inbox (session, body) VALUES (%s, %s) RETURNING id"
#: Tell the listeners a session has mail (delivered when the posting transaction commits).
NOTIFY_INBOX = "SELECT pg_notify('turnkeeper', 'inbox:' || %s)"
SELECT_INBOX = "SELECT id, body, handle FROM inbox WHERE session = %s ORDER BY id"
#: A delegated turn's prompt (LS-11): posted in the transaction that writes its handle.
POST_PROMPT = "INSERT INTO inbox (session, body, handle) VALUES (%s, %s, %s) RETURNING id"
#: A prompt whose turn settled before it was taken: dropped, never queued.
DROP_INBOX = "DELETE FROM inbox WHERE session = %s AND id = %s RETURNING id"
#: The sessions among ``%s`` (a list of ids) that have mail.
SELECT_MAIL_FOR = "SELECT DISTINCT session FROM inbox WHERE session = ANY(%s)"
#: A queue write's inbox rows: taken off the inbox in the transaction that queues them.
TAKE_INBOX = "DELETE FROM inbox WHERE session = %s AND id = ANY(%s)"

# -- the startup scan of some sessions only (a claim's: LS-8) -------------------------------

_OF = "session = ANY(%(only)s)"
SCAN_OWED_OF = f"SELECT {COLUMNS} FROM history_rows WHERE {LIVE} AND {_OF} ORDER BY session, seq"
SCAN_TRAILING_OF = (
    f"SELECT {H_COLUMNS} FROM history_rows h JOIN (SELECT session, max(seq) AS seq "
    f"FROM history_rows WHERE {LIVE} AND {_OF} GROUP BY session) o "
    "ON h.session = o.session AND h.seq > o.seq ORDER BY h.session, h.seq"
)
SCAN_SESSIONS_OF = (
    "SELECT id, record FROM sessions WHERE id = ANY(%(only)s) AND id IN "
    f"(SELECT DISTINCT session FROM history_rows WHERE {LIVE} AND {_OF})"
)
SCAN_STREAMS_OF = (
    "SELECT session, stream FROM turn_envelopes WHERE session IN "
    f"(SELECT DISTINCT session FROM history_rows WHERE {LIVE} AND {_OF}) ORDER BY written"
)
SCAN_QUEUED_OF = f"SELECT DISTINCT session FROM queued_entries WHERE {_OF} ORDER BY session"
SCAN_TAIL_ROWS_OF = SCAN_TAIL_ROWS.replace(
    "FROM sessions s WHERE NOT EXISTS", "FROM sessions s WHERE s.id = ANY(%(only)s) AND NOT EXISTS"
)

# -- requests to a session's holder (LS-10) -------------------------------------------------------

ASK = "INSERT INTO requests (session, kind, body) VALUES (%s, %s, %s) RETURNING id"
NOTIFY_REQUEST = "SELECT pg_notify('turnkeeper', 'request:' || %s)"
#: The requests a holder has to carry out: not begun (one begun is its beginner's).
SELECT_REQUESTS = (
    "SELECT id, session, kind, body FROM requests WHERE session = %s AND begun IS NULL ORDER BY id"
)
SELECT_ASKED_FOR = "SELECT DISTINCT session FROM requests WHERE session = ANY(%s) AND begun IS NULL"
#: The holder takes a request on before it carries it out (only one its asker still asks).
BEGIN_REQUEST = "UPDATE requests SET begun = now() WHERE id = %s AND begun IS NULL RETURNING id"
#: The holder's answer, only to a request it began and its asker has not withdrawn.
ANSWER = (
    "UPDATE requests SET answer = %s WHERE id = %s AND begun IS NOT NULL AND answer IS NULL "
    "RETURNING id"
)
NOTIFY_ANSWER = "SELECT pg_notify('turnkeeper', 'answer:' || %s)"
#: The asker takes the answer (the row goes once it is read: a damaged one stays), or
#: withdraws the unanswered request, learning whether the holder had begun it.
SELECT_ANSWER = "SELECT answer FROM requests WHERE id = %s AND answer IS NOT NULL FOR UPDATE"
DELETE_REQUEST = "DELETE FROM requests WHERE id = %s"
WITHDRAW = "DELETE FROM requests WHERE id = %s AND answer IS NULL RETURNING begun IS NOT NULL"
