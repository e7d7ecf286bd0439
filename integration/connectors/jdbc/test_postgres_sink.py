"""PostgresSink against a real PostgreSQL, driven by the real Coordinator (no Spark).

The batch runner is in-process (support.ArrowRunner); crashes are simulated with
FaultPlan(simulate=True) and a "restart" is a new Coordinator over the same commit log.
"""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from integration.connectors.jdbc.support import (
    ArrowRunner,
    Names,
    coordinator,
    id_batch,
    ids_runner,
    marker_rows,
    memory_log,
    prepared_gids,
    sink_for,
    table_ids,
)
from sparkeos.connectors.jdbc import DataRejectedError, PostgresSink, upsert
from sparkeos.connectors.jdbc.connections import POOL
from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    ConfigurationError,
    DataLossError,
    RetriableError,
    SchemaMismatchError,
    TransactionAbortedError,
)
from sparkeos.core.faults import ALL_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.protocol import TxnState
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import run_uncommitted

BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], []], [[10], [11]]]
ALL_IDS = list(range(1, 12))


def run_query(sink: PostgresSink, log: Any, names: Names, faults: FaultPlan | None,
              spark_committed: list[int]) -> None:
    run_uncommitted(coordinator(sink, log, names, faults), BATCHES, spark_committed)


def test_happy_path_writes_every_row_exactly_once(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"])
    log = memory_log()
    run_query(sink, log, names, None, [])
    assert table_ids(admin, names.table) == ALL_IDS
    assert prepared_gids(admin, names) == []
    assert marker_rows(admin, names) == [(b, p) for b in range(4) for p in range(2)]
    assert [s.status for s in log.batches().values()] == ["finished"] * 4


@pytest.mark.parametrize("point", ALL_POINTS)
@pytest.mark.parametrize("crash_batch", [0, 2])
def test_crash_at_every_point_then_restart(pg_server, names, admin, point, crash_batch):
    sink = sink_for(pg_server, names)  # no key: a duplicate would show up as a row
    log, committed = memory_log(), []
    try:
        run_query(sink, log, names, FaultPlan(point, crash_batch, simulate=True), committed)
    except InjectedCrash:
        pass
    run_query(sink, log, names, None, committed)  # the restarted query
    assert table_ids(admin, names.table) == ALL_IDS, point
    assert prepared_gids(admin, names) == []


def test_nothing_visible_before_decided_and_decided_is_committed_on_restart(
        pg_server, names, admin):
    sink = sink_for(pg_server, names)
    log = memory_log()
    with pytest.raises(InjectedCrash):
        coordinator(sink, log, names, FaultPlan("after_all_prepared", 0, simulate=True)
                    ).run_batch(0, ids_runner([[1, 2], [3]]))
    assert table_ids(admin, names.table) == []
    assert len(prepared_gids(admin, names)) == 2
    with pytest.raises(InjectedCrash):
        coordinator(sink, log, names, FaultPlan("after_decided", 0, simulate=True)
                    ).run_batch(0, ids_runner([[1, 2], [3]]))
    assert table_ids(admin, names.table) == []
    # A re-run after the decision writes nothing new (different data is ignored).
    metrics = coordinator(sink, log, names).run_batch(0, ids_runner([[100], [200]]))
    assert metrics.outcome == "replayed"
    assert table_ids(admin, names.table) == [1, 2, 3]


def test_commit_is_idempotent_and_probe_tells_the_state(pg_server, names, admin):
    sink = sink_for(pg_server, names)
    sink.validate(id_batch([1]).schema)
    pool = TransactionPool(names.query_key, "pg")
    txn = pool.transaction(0, 0, 0, 0)
    assert sink.probe(txn) is TxnState.ABSENT
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1, 2]))
    receipt = sink.prepare(handle)
    assert receipt["gid"] == txn.txn_id and receipt["rows"] == 2
    assert sink.probe(txn) is TxnState.PREPARED
    sink.commit(txn, receipt)
    sink.commit(txn, receipt)  # a no-op
    sink.recover_commit(txn, receipt)
    assert sink.probe(txn) is TxnState.COMMITTED
    assert table_ids(admin, names.table) == [1, 2]
    sink.rollback(txn)  # nothing prepared under the ID any more: fine
    sink.rollback(pool.transaction(7, 3, 0, 0))  # an ID never used: fine
    assert table_ids(admin, names.table) == [1, 2]


def test_decided_gid_gone_without_marker_is_data_loss(pg_server, names, admin):
    sink = sink_for(pg_server, names)
    log = memory_log()
    with pytest.raises(InjectedCrash):
        coordinator(sink, log, names, FaultPlan("after_decided", 0, simulate=True)
                    ).run_batch(0, ids_runner([[1, 2], [3]]))
    gids = prepared_gids(admin, names)
    assert len(gids) == 2
    with admin.cursor() as cur:  # an operator rolls one back behind the query's back
        cur.execute("ROLLBACK PREPARED %s", (gids[1],))
    with pytest.raises(DataLossError) as info:
        coordinator(sink, log, names).run_batch(0, ids_runner([[1, 2], [3]]))
    message = str(info.value)
    assert gids[1] in message and "batch 0" in message and "What to do" in message
    assert "re-process" in message


def test_concurrent_attempts_never_undo_each_other(pg_server, names, admin):
    """Bug 1 of the concurrency issue: a second attempt of the same task (speculation)
    once rolled back the first attempt's prepared transaction in its begin. Now each
    attempt has its own gid; the batch commits the decided one and sweeps the other."""
    from sparkeos.core.snapshot.txpool import AttemptRange

    sink = sink_for(pg_server, names)
    sink.validate(id_batch([1]).schema)
    pool = TransactionPool(names.query_key, "pg")
    first, copy = pool.transaction(0, 0, 0, 0), pool.transaction(0, 0, 0, 1)
    h1 = sink.begin(first)
    sink.write(h1, id_batch([1]))
    receipt = sink.prepare(h1)  # the attempt Spark will keep
    h2 = sink.begin(copy)  # the speculative copy starts after the first prepared
    sink.write(h2, id_batch([1]))
    sink.prepare(h2)
    assert prepared_gids(admin, names) == sorted([first.txn_id, copy.txn_id])
    sink.commit(first, receipt)
    sink.sweep([AttemptRange(names.query_key, "pg", 0, 0, 1, 4)], frozenset({first.txn_id}))
    assert table_ids(admin, names.table) == [1] and prepared_gids(admin, names) == []

    # An attempt that begins after its partition was committed writes nothing.
    late = pool.transaction(0, 0, 0, 2)
    h3 = sink.begin(late)
    sink.write(h3, id_batch([1]))
    assert sink.prepare(h3)["skipped"] is True
    sink.recover_commit(first, receipt)
    assert table_ids(admin, names.table) == [1] and prepared_gids(admin, names) == []


def test_sweep_ends_open_sessions_of_doomed_attempts(pg_server, names, admin):
    """A zombie still writing when its run is aborted: the sweep ends its session, so
    it can never prepare later (bug 2 of the concurrency issue)."""
    from sparkeos.core.snapshot.txpool import AttemptRange

    sink = sink_for(pg_server, names)
    sink.validate(id_batch([1]).schema)
    pool = TransactionPool(names.query_key, "pg")
    zombie = sink.begin(pool.transaction(1, 1, 0, 0))
    sink.write(zombie, id_batch([90]))
    other = sink.begin(pool.transaction(1, 1, 1, 0))  # another run: not swept
    sink.write(other, id_batch([91]))
    sink.sweep([AttemptRange(names.query_key, "pg", 1, 0, 2, 4)], frozenset())
    with pytest.raises(RetriableError):
        sink.write(zombie, id_batch([92]))
    sink.commit(pool.transaction(1, 1, 1, 0), sink.prepare(other))
    assert table_ids(admin, names.table) == [91] and prepared_gids(admin, names) == []


def test_task_retry_after_prepare_rolls_back_the_first_attempt(pg_server, names, admin):
    sink = sink_for(pg_server, names)
    log = memory_log()
    coord = coordinator(sink, log, names, FaultPlan("task_fail_after_prepare", 0,
                                                    simulate=True))
    coord.run_batch(0, ids_runner([[1, 2], [3]]))
    assert table_ids(admin, names.table) == [1, 2, 3]
    decided = log.batches()[0].decided
    assert decided is not None and decided["participants"][0]["attempt"] == "b0r0a1"
    assert prepared_gids(admin, names) == []  # the dead attempt's gid was swept


def test_constraint_violation_fails_the_whole_batch(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"])
    log = memory_log()
    coord = coordinator(sink, log, names)
    with pytest.raises(TransactionAbortedError, match="duplicate key") as info:
        coord.run_batch(0, ids_runner([[1, 2], [3, 3]]))  # partition 0 prepared, then 1 fails
    assert "rolled back" in str(info.value)
    assert isinstance(info.value.__cause__, DataRejectedError)
    assert table_ids(admin, names.table) == []
    assert prepared_gids(admin, names) == []
    coordinator(sink, log, names).run_batch(0, ids_runner([[1, 2], [3]]))
    assert table_ids(admin, names.table) == [1, 2, 3]


def test_same_key_in_two_partitions_fails_fast_not_forever(pg_server, names, admin):
    # Partition 1 would wait for partition 0's prepared row until the decision, which
    # waits for partition 1: the lock timeout turns that into a failed batch.
    sink = sink_for(pg_server, names, key=["id"], lock_timeout_s=0.5)
    log = memory_log()
    with pytest.raises(TransactionAbortedError, match="lock"):
        coordinator(sink, log, names).run_batch(0, ids_runner([[1, 2], [2]]))
    assert table_ids(admin, names.table) == []
    assert prepared_gids(admin, names) == []


def test_schema_mismatch_is_refused_before_any_write(pg_server, names, admin):
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id bigint, name text, '
                    'must integer NOT NULL)')
    sink = sink_for(pg_server, names, create_table=False)
    log = memory_log()
    runner = ArrowRunner([id_batch([1], name=[5], extra=["x"])])
    with pytest.raises(SchemaMismatchError) as info:
        coordinator(sink, log, names).run_batch(0, runner)
    message = str(info.value)
    assert "missing in the table: extra" in message
    assert "name: DataFrame type int64 does not fit column type text" in message
    assert "NOT NULL columns without a default not in the DataFrame: must" in message
    assert 0 not in log.batches()  # refused before the batch began
    assert table_ids(admin, names.table) == []
    with admin.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (names.marker,))
        assert cur.fetchone()[0] is None  # nothing created either

    missing = sink_for(pg_server, names, table=names.table + "_nope", create_table=False)
    with pytest.raises(ConfigurationError, match="does not exist") as refused:
        missing.validate(id_batch([1]).schema)
    assert "sparkeos.createTable=true" in str(refused.value)  # names the setting


def test_text_into_a_typed_column_is_refused_up_front(pg_server, names, admin):
    """Issue 15, defect 5: text into a bigint column once failed inside the tasks."""
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id bigint, amount bigint, day date, '
                    "note text, tag uuid)")
    sink = sink_for(pg_server, names, create_table=False)
    log = memory_log()
    runner = ArrowRunner([id_batch([1], amount=["12"], day=["2026-01-01"], note=["x"],
                                   tag=["5b9a7c2e-4b0d-4f55-9a53-0c4f1d3b7e10"])])
    with pytest.raises(SchemaMismatchError) as info:
        coordinator(sink, log, names).run_batch(0, runner)
    message = str(info.value)
    assert "amount: DataFrame type string does not fit column type bigint" in message
    assert "day: DataFrame type string does not fit column type date" in message
    assert "note" not in message.split("fit table")[1].split("What to do")[0].replace(
        "note:", "")  # text into text and uuid is fine
    assert "cast" in message and 0 not in log.batches()
    assert table_ids(admin, names.table) == []


def test_refused_connections_are_configuration_errors(pg_server, names):
    """Issue 15, defect 4: an unknown database or an unknown role will not clear on a
    retry: ConfigurationError naming the setting, not RetriableError."""
    from sparkeos.connectors.jdbc.dsn import parse

    params = parse(pg_server.dsn)
    base = " ".join(f"{k}={v}" for k, v in params.items() if k not in ("dbname", "user"))
    user, dbname = params.get("user", "postgres"), params.get("dbname", "postgres")
    for dsn, expected in ((f"{base} user={user} dbname=no_such_db_{names.query_key}",
                           "database name"),
                          (f"{base} user=no_such_role_{names.query_key} dbname={dbname}",
                           "user or password")):
        sink = PostgresSink(dsn=dsn, table="t", connect_timeout_s=5)
        with pytest.raises(ConfigurationError, match=expected) as info:
            sink.validate(id_batch([1]).schema)
        assert not isinstance(info.value, RetriableError)


def test_column_mapping_and_types_round_trip(pg_server, names, admin):
    utc = dt.timezone.utc
    texts = ["plain", "", None, 'quote " comma , newline \n end', "\\.", "unicode é ✓"]
    n = len(texts)
    batch = pa.RecordBatch.from_pydict({
        "order_id": pa.array(range(n), pa.int64()),
        "text": pa.array(texts, pa.string()),
        "small": pa.array([1, None, -3, 4, 5, 6], pa.int16()),
        "f": pa.array([0.1 + 0.2, float("nan"), float("inf"), None, -1e300, 1 / 3]),
        "ok": pa.array([True, False, None, True, False, True]),
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=utc)] * (n - 1)
                       + [None], pa.timestamp("us", tz="UTC")),
        "ts_ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)] * n, pa.timestamp("us")),
        "day": pa.array([dt.date(2024, 2, 29)] * n, pa.date32()),
        "amount": pa.array([Decimal("12.34")] * (n - 1) + [None], pa.decimal128(10, 2)),
        "blob": pa.array([b"\x00\x01\xff", b"", None, b"abc", b"\\x", b"\n"], pa.binary()),
        "tags": pa.array([["a", "b"], [], None, ["c"], ["d"], ["e"]], pa.list_(pa.string())),
        "took": pa.array([1_500_000, None, 0, 1, 2, 3], pa.duration("us")),
    })
    sink = sink_for(pg_server, names, key=["id"], columns={"order_id": "id"})
    coordinator(sink, memory_log(), names).run_batch(0, ArrowRunner([batch]))
    with admin.cursor() as cur:
        cur.execute(f'SELECT id, text, small, f, ok, ts, ts_ntz, day, amount, blob, tags, took '
                    f'FROM "{names.table}" ORDER BY id')
        rows = cur.fetchall()
    assert [r[1] for r in rows] == texts
    assert [r[2] for r in rows] == [1, None, -3, 4, 5, 6]
    floats = [r[3] for r in rows]
    assert floats[0] == 0.1 + 0.2 and floats[1] != floats[1] and floats[2] == float("inf")
    assert floats[3] is None and floats[4] == -1e300 and floats[5] == 1 / 3
    assert [r[4] for r in rows] == [True, False, None, True, False, True]
    assert rows[0][5] == dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=utc)
    assert rows[-1][5] is None
    assert rows[0][6] == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert rows[0][7] == dt.date(2024, 2, 29)
    assert rows[0][8] == Decimal("12.34") and rows[-1][8] is None
    assert [None if r[9] is None else bytes(r[9]) for r in rows] == [
        b"\x00\x01\xff", b"", None, b"abc", b"\\x", b"\n"]
    assert [r[10] for r in rows] == [["a", "b"], [], None, ["c"], ["d"], ["e"]]
    assert rows[0][11] == dt.timedelta(seconds=1.5) and rows[1][11] is None


def test_upsert_at_least_once_commits_plainly_and_is_idempotent(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"], mode="upsert")
    coord = coordinator(sink, None, names, guarantee=Guarantee.AT_LEAST_ONCE)
    assert coord.sink.commit_in_task is True  # at-least-once: no prepared transactions
    first = ArrowRunner([id_batch([1, 2], v=["a", "b"]), id_batch([3], v=["c"])])
    coord.run_batch(0, first)
    coord.run_batch(0, first)  # a replay overwrites the same rows
    coord.run_batch(1, ArrowRunner([id_batch([3, 4], v=["c2", "d"])]))
    with admin.cursor() as cur:
        cur.execute(f'SELECT id, v FROM "{names.table}" ORDER BY id')
        assert cur.fetchall() == [(1, "a"), (2, "b"), (3, "c2"), (4, "d")]
        cur.execute("SELECT to_regclass(%s)", (f'"{names.marker}"',))
        assert cur.fetchone()[0] is None  # no marker rows either
    assert prepared_gids(admin, names) == []
    never = sink_for(pg_server, names, key=["id"], mode="upsert", commit_in_task=True)
    with pytest.raises(ConfigurationError, match="cannot give the exactly_once guarantee"):
        coordinator(never, memory_log(), names)


def counts(admin: Any, table: str) -> dict[str, int]:
    with admin.cursor() as cur:
        cur.execute(f'SELECT word, n FROM "{table}"')
        return dict(cur.fetchall())


def word_batch(**counts: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"word": pa.array(list(counts), pa.string()),
                                       "n": pa.array(list(counts.values()), pa.int64())})


# Update-mode output of a running count: each batch carries the new totals of the
# words it saw, one partition per key range.
COUNT_BATCHES = [[word_batch(a=1, b=1), word_batch(c=1)], [word_batch(b=2), word_batch()],
                 [word_batch(a=2), word_batch(c=3, d=1)]]
FINAL_COUNTS = {"a": 2, "b": 2, "c": 3, "d": 1}


def run_counts(sink: PostgresSink, log: Any, names: Names, faults: FaultPlan | None,
               spark_committed: list[int]) -> None:
    coord = coordinator(sink, log, names, faults)
    for batch_id, partitions in enumerate(COUNT_BATCHES):
        if batch_id not in spark_committed:
            coord.run_batch(batch_id, ArrowRunner(partitions))
            spark_committed.append(batch_id)


@pytest.mark.parametrize("point", ALL_POINTS)
def test_upsert_exactly_once_under_a_crash_at_every_point(pg_server, names, admin, point):
    sink = sink_for(pg_server, names, key=["word"], mode="upsert")
    assert Guarantee.EXACTLY_ONCE in sink.guarantees
    log, committed = memory_log(), []
    try:
        run_counts(sink, log, names, FaultPlan(point, 1, simulate=True), committed)
    except InjectedCrash:
        pass
    undecided = ("after_begun", "after_all_prepared", "kill_driver_after_first_prepare")
    if 1 not in committed and point in undecided:
        # Not decided: batch 1 is invisible as a whole (atomic per batch).
        assert counts(admin, names.table) == {"a": 1, "b": 1, "c": 1}
    run_counts(sink, log, names, None, committed)  # the restarted query
    assert counts(admin, names.table) == FINAL_COUNTS
    # One marker per non-empty partition of every batch: each applied exactly once.
    assert marker_rows(admin, names) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    assert prepared_gids(admin, names) == []
    assert stage_tables(admin, names) == []


def stage_tables(admin: Any, names: Names) -> list[str]:
    """Stage tables of this test's attempts (their names hash the transaction IDs)."""
    pool = TransactionPool(names.query_key, "pg")
    candidates = [upsert.stage_name(pool.transaction(b, p, r, t).txn_id)
                  for b in range(4) for p in range(2) for r in range(4) for t in range(8)]
    with admin.cursor() as cur:
        cur.execute("SELECT relname::text FROM pg_class WHERE relname = ANY(%s)",
                    (candidates,))
        return [r[0] for r in cur.fetchall()]


def test_upsert_exactly_once_replay_of_a_decided_batch_writes_nothing(pg_server, names,
                                                                      admin):
    sink = sink_for(pg_server, names, key=["word"], mode="upsert")
    log = memory_log()
    coordinator(sink, log, names).run_batch(0, ArrowRunner([word_batch(a=1)]))
    with admin.cursor() as cur:
        cur.execute(f'UPDATE "{names.table}" SET n = 100')  # someone else's later update
    coordinator(sink, log, names).run_batch(0, ArrowRunner([word_batch(a=1)]))
    assert counts(admin, names.table) == {"a": 100}


def test_upsert_refuses_a_key_repeated_in_a_batch_without_order_by(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"], mode="upsert")
    log = memory_log()
    runner = ArrowRunner([id_batch([1, 2, 2], v=["a", "b", "b2"]), id_batch([3], v=["c"])])
    with pytest.raises((DataRejectedError, TransactionAbortedError)) as info:
        coordinator(sink, log, names).run_batch(0, runner)
    message = str(info.value)
    assert "key (id=2) appears 2 times in batch 0" in message and "order_by=" in message
    assert table_ids(admin, names.table) == []
    assert prepared_gids(admin, names) == [] and stage_tables(admin, names) == []


def test_upsert_order_by_writes_the_latest_row_of_a_key(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"], mode="upsert", order_by="version")
    log = memory_log()
    coordinator(sink, log, names).run_batch(0, ArrowRunner([
        id_batch([1, 2, 2, 2], v=["a", "b3", "b1", "b2"], version=[1, 3, 1, 2])]))
    coordinator(sink, log, names).run_batch(1, ArrowRunner([
        id_batch([1, 1], v=["a9", "a5"], version=[9, 5])]))
    with admin.cursor() as cur:
        cur.execute(f'SELECT id, v, version FROM "{names.table}" ORDER BY id')
        assert cur.fetchall() == [(1, "a9", 9), (2, "b3", 3)]


def test_upsert_settings_are_checked_at_construction(pg_server, names):
    with pytest.raises(ConfigurationError, match="needs mode='upsert'"):
        sink_for(pg_server, names, order_by="version")
    with pytest.raises(ConfigurationError, match="repeats a key column"):
        sink_for(pg_server, names, key=["id"], mode="upsert", order_by=["id"])
    mapped = sink_for(pg_server, names, key=["order_id"], mode="upsert",
                      columns={"id": "order_id"})
    assert mapped.cluster_by() == ("id",)  # DataFrame names: the batch is split by key
    assert sink_for(pg_server, names).cluster_by() == ()


def test_upsert_needs_a_unique_key(pg_server, names, admin):
    with pytest.raises(ConfigurationError, match="needs key columns"):
        PostgresSink(dsn=pg_server.dsn, table=names.table, mode="upsert")
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id bigint, v text)')
    sink = sink_for(pg_server, names, key=["id"], mode="upsert")
    with pytest.raises(SchemaMismatchError, match="unique index or primary key on"):
        sink.validate(id_batch([1], v=["a"]).schema)


def test_postgres_restart_between_prepare_and_commit(tiny_server, names):
    # A private server: the session's is shared with the other pytest worker's tests.
    dsn = tiny_server(8)
    sink = PostgresSink(dsn=dsn, table=names.table, marker_table=names.marker,
                        create_table=True)
    log = memory_log()
    coordinator(sink, log, names).run_batch(0, ids_runner([[1], [2]]))  # pools connections
    with pytest.raises(InjectedCrash):
        coordinator(sink, log, names, FaultPlan("after_decided", 1, simulate=True)
                    ).run_batch(1, ids_runner([[3], [4]]))
    tiny_server.stop()
    try:
        # Server down: the commit is retriable, the message names the server, the batch
        # stays decided.
        with pytest.raises(RetriableError) as info:
            coordinator(sink, log, names).run_batch(1, ids_runner([[3], [4]]))
        assert "127.0.0.1" in str(info.value) or "localhost" in str(info.value)
        assert log.batches()[1].needs_commit
    finally:
        tiny_server.start()
    import psycopg2

    check = psycopg2.connect(dsn)
    check.autocommit = True
    try:
        assert len(prepared_gids(check, names)) == 2  # prepared transactions survived
        # The pooled connections are dead: the commit reconnects by itself.
        metrics = coordinator(sink, log, names).run_batch(1, ids_runner([[3], [4]]))
        assert metrics.outcome == "replayed"
        assert table_ids(check, names.table) == [1, 2, 3, 4]
        assert prepared_gids(check, names) == []
    finally:
        check.close()


def test_lost_connection_mid_write_fails_the_batch_then_rerun_works(pg_server, names, admin):
    sink = sink_for(pg_server, names)
    log = memory_log()

    # This test's sink sessions only: the server is shared with other tests' sinks.
    ours = f"{names.gid_prefix()}%"

    def kill_writer(partition: int, attempt: int) -> None:
        if partition == 1:  # partition 0 prepared; now cut this test's other sessions
            with admin.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "application_name LIKE %s AND pid <> pg_backend_pid()", (ours,))

    sink.validate(id_batch([1]).schema)
    pool = TransactionPool(names.query_key, "pg")
    handle = sink.begin(pool.transaction(5, 0, 0, 0))
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name LIKE %s AND pid <> pg_backend_pid()", (ours,))
    with pytest.raises(RetriableError, match="writing 1 rows failed") as info:
        sink.write(handle, id_batch([1]))
    assert "restarting the query re-runs it" in str(info.value)
    sink.abort(handle, pool.transaction(5, 0, 0, 0))

    coordinator(sink, log, names).run_batch(0, ArrowRunner(
        [id_batch([1]), id_batch([2])], before_attempt=kill_writer))
    assert table_ids(admin, names.table) == [1, 2]


def test_unreachable_server_is_retriable_and_hides_the_password(names):
    sink = PostgresSink(dsn="postgresql://someone:s3cret-pw@127.0.0.1:1/db", table="t",
                        connect_timeout_s=2)
    with pytest.raises(RetriableError) as info:
        sink.validate(id_batch([1]).schema)
    assert "127.0.0.1:1/db" in str(info.value)
    assert "s3cret-pw" not in str(info.value)
    assert "s3cret-pw" not in repr(sink) and "s3cret-pw" not in str(sink.describe())


def test_sqlalchemy_url_and_pickling(pg_server, names, admin):
    from sqlalchemy.engine import make_url

    url = make_url(pg_server.dsn).set(drivername="postgresql+psycopg2")
    sink = sink_for(pg_server, names, dsn=url)
    assert isinstance(sink.dsn, str) and sink.dsn.startswith("postgresql://")
    string_sink = sink_for(pg_server, names, dsn=url.render_as_string(hide_password=False))
    assert string_sink.dsn == sink.dsn
    coord = coordinator(sink, memory_log(), names)
    coord.run_batch(0, ids_runner([[1], [2]]))
    clone = pickle.loads(pickle.dumps(sink))  # no connection travels with the sink
    assert clone == sink
    coordinator(clone, coord.log, names).run_batch(1, ids_runner([[3]]))
    assert table_ids(admin, names.table) == [1, 2, 3]
    rebuilt = PostgresSink.from_description({**sink.describe()})
    assert rebuilt.table == sink.table and rebuilt.marker_table == sink.marker_table


def test_prepared_transactions_disabled_or_used_up(tiny_server, names):
    dsn = tiny_server(0)
    sink = PostgresSink(dsn=dsn, table=names.table, marker_table=names.marker,
                        create_table=True)
    with pytest.raises(ConfigurationError) as info:
        sink.validate(id_batch([1]).schema)
    message = str(info.value)
    assert "max_prepared_transactions = 0" in message
    assert "ALTER SYSTEM SET max_prepared_transactions" in message and "restart" in message

    # Without the up-front check, PREPARE itself fails with the same advice.
    upsert = PostgresSink(dsn=dsn, table=names.table, key=["id"], mode="upsert",
                          create_table=True, marker_table=names.marker, commit_in_task=True)
    upsert.validate(id_batch([1]).schema)  # creates the table; upsert prepares nothing
    pool = TransactionPool(names.query_key, "pg")
    txn = pool.transaction(0, 0, 0, 0)
    with pytest.raises(ConfigurationError, match="ALTER SYSTEM SET max_prepared"):
        _prepare_without_validate(sink, txn)

    # Up front: a batch needs 2 slots per participant (an attempt and its retry).
    dsn = tiny_server(2)
    sink = PostgresSink(dsn=dsn, table=names.table, marker_table=names.marker)
    log = memory_log()
    with pytest.raises(ConfigurationError, match="at least 4 are needed") as info:
        coordinator(sink, log, names).run_batch(0, ids_runner([[1], [2]]))
    assert "writers=1" in str(info.value) and log.batches() == {}

    # The slots are held by another tool: PREPARE fails and says who holds them.
    import psycopg2

    other = psycopg2.connect(dsn)
    other.autocommit = True
    try:
        with other.cursor() as cur:
            for gid in ("other-tool-1", "other-tool-2"):
                cur.execute("BEGIN")
                cur.execute("SELECT 1")
                cur.execute(f"PREPARE TRANSACTION '{gid}'")
        with pytest.raises(ConfigurationError, match="no free prepared-transaction slot") as info:
            coordinator(sink, log, names).run_batch(0, ids_runner([[1, 2]]))
        # Issue 15, defect 6: who holds the slots, and how to free orphans.
        message = str(info.value)
        assert "2 of max_prepared_transactions = 2 are in use: 0 by this sink" in message
        assert "other-tool-1" in message
        assert "sparkeos recover" in message and "pg_prepared_xacts" in message
    finally:
        with other.cursor() as cur:
            for gid in ("other-tool-1", "other-tool-2"):
                cur.execute(f"ROLLBACK PREPARED '{gid}'")
        other.close()


def _prepare_without_validate(sink: PostgresSink, txn: Any) -> None:
    import psycopg2

    conn = psycopg2.connect(sink.dsn)
    conn.autocommit = True
    with conn.cursor() as cur:  # the marker table validate would have created
        cur.execute(f'CREATE TABLE IF NOT EXISTS "{sink.marker_table}" (query_key text, '
                    'sink text, batch_id bigint, "partition" integer, txn_id text, '
                    "attempt text, committed_at timestamptz, rows bigint, fingerprint text, "
                    'PRIMARY KEY (query_key, sink, batch_id, "partition", txn_id))')
    conn.close()
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1]))
    try:
        sink.prepare(handle)
    finally:
        POOL.close_dsn(sink.dsn)


def test_many_partitions_commit_in_parallel(pg_server, names, admin):
    sink = sink_for(pg_server, names, key=["id"])
    coord = coordinator(sink, memory_log(), names)
    for batch_id in range(3):
        base = batch_id * 100
        coord.run_batch(batch_id, ids_runner([[base + p] for p in range(8)]))
    assert table_ids(admin, names.table) == [b * 100 + p for b in range(3) for p in range(8)]
    assert prepared_gids(admin, names) == []


def test_transactional_mode_under_at_least_once_commits_in_tasks(pg_server, names, admin):
    sink = sink_for(pg_server, names)
    coord = coordinator(sink, None, names, guarantee=Guarantee.AT_LEAST_ONCE)
    coord.run_batch(0, ids_runner([[1], [2]]))
    assert table_ids(admin, names.table) == [1, 2] and prepared_gids(admin, names) == []
    # A replay of the same partitions finds their markers and writes nothing; with other
    # partitioning it would write again (at-least-once).
    coord.run_batch(0, ids_runner([[1], [2]]))
    coord.run_batch(0, ids_runner([[1], [2], [3]]))
    assert table_ids(admin, names.table) == [1, 2, 3]
    assert prepared_gids(admin, names) == []


def test_at_least_once_tasks_killed_after_prepare_leave_nothing_prepared(pg_server, names,
                                                                         admin):
    """Issue 48: in every batch of one run, partition 0's first attempt dies after the
    sink's prepare step, before its commit (``task_fail_after_prepare`` on a direct
    task), and its retry runs. No prepared transaction is left to pile up towards
    ``max_prepared_transactions`` within the run, and every row arrives (here once: the
    retry finds its marker with the same rows)."""
    sink = sink_for(pg_server, names)
    coord = coordinator(sink, None, names, FaultPlan("task_fail_after_prepare", None,
                                                     simulate=True),
                        guarantee=Guarantee.AT_LEAST_ONCE)
    for batch_id, partitions in enumerate(BATCHES):
        coord.run_batch(batch_id, ids_runner(partitions))
        assert prepared_gids(admin, names) == [], f"left prepared after batch {batch_id}"
    assert table_ids(admin, names.table) == ALL_IDS


def test_appends_committed_in_tasks_are_at_least_once_only(pg_server, names):
    """At-least-once appends commit in the task (no prepared transaction); asked for
    explicitly, ``commit_in_task=True`` refuses exactly-once."""
    sink = sink_for(pg_server, names)
    direct = coordinator(sink, None, names, guarantee=Guarantee.AT_LEAST_ONCE).sink
    assert isinstance(direct, PostgresSink) and direct.direct_appends
    assert not direct.prepared_appends
    forced = sink_for(pg_server, names, commit_in_task=True)
    with pytest.raises(ConfigurationError, match="cannot give the exactly_once guarantee"):
        coordinator(forced, memory_log(), names)


def test_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, sparkeos, sparkeos.connectors.jdbc; "
            "print('psycopg2' in sys.modules, 'sqlalchemy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_a_marker_table_from_before_fingerprints_is_upgraded_and_never_skips(
        pg_server, names, admin):
    """A marker table made by an earlier version has no ``rows``/``fingerprint``: the
    sink's validation adds them (only when missing), and an old marker row of the
    replayed (batch, partition) never counts as the same rows: the replay writes."""
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.marker}" (query_key text NOT NULL, sink text '
                    'NOT NULL, batch_id bigint NOT NULL, "partition" integer NOT NULL, '
                    "txn_id text NOT NULL, attempt text NOT NULL DEFAULT '', committed_at "
                    "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (query_key, sink, "
                    'batch_id, "partition", txn_id))')
        cur.execute(f'INSERT INTO "{names.marker}" (query_key, sink, batch_id, "partition", '
                    "txn_id) VALUES (%s, 'pg', 0, 0, 'seos-old-pg-p0-s0-b0r1000001a0')",
                    (names.query_key,))
    sink = sink_for(pg_server, names)
    coordinator(sink, None, names, guarantee=Guarantee.AT_LEAST_ONCE).run_batch(
        0, ids_runner([[1, 2]]))
    assert table_ids(admin, names.table) == [1, 2], "an old marker hid the replay's rows"
    with admin.cursor() as cur:
        cur.execute(f'SELECT rows, fingerprint FROM "{names.marker}" WHERE rows IS NOT NULL')
        assert [(rows, len(fp)) for rows, fp in cur.fetchall()] == [(2, 32)]
    # The same rows again (a replay partitioned as before): written nothing twice.
    coordinator(sink, None, names, guarantee=Guarantee.AT_LEAST_ONCE).run_batch(
        0, ids_runner([[1, 2]]))
    assert table_ids(admin, names.table) == [1, 2]
