"""`sparkeos status --probe` and `sparkeos recover` resolve in-doubt gids."""

from __future__ import annotations

from typing import Any

import pytest

from integration.connectors.jdbc.support import PgServer
from sparkeos.cli import main
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.streaming.adapter import ForeachBatchAdapter
from sparkeos.testing.inprocess import ListRunner


def ids(admin: Any, table: str) -> list[int]:
    with admin.cursor() as cur:
        cur.execute(f'SELECT id FROM "{table}" ORDER BY id')
        return [r[0] for r in cur.fetchall()]


@pytest.mark.parametrize("point,expected", [("after_decided", [1, 2, 3, 4]),
                                            ("after_all_prepared", [1, 2])])
def test_status_and_recover(tmp_path, capsys, pg_server: PgServer, names, admin, point,
                            expected):
    ckpt = str(tmp_path / "ckpt")
    sink = PostgresSink(dsn=pg_server.dsn, table=names.table, marker_table=names.marker,
                        create_table=True)
    config = CoordinatorConfig(name="pg")
    log = CommitLog(open_store(sink_log_location(ckpt, "pg")))
    key = ForeachBatchAdapter(sink, config)._claim_log(log, "query-" + names.query_key)
    Coordinator(sink, config, log, key).run_batch(0, ListRunner([[1], [2]]))
    with pytest.raises(InjectedCrash):
        Coordinator(sink, config, log, key, FaultPlan(point, 1, simulate=True)).run_batch(
            1, ListRunner([[3], [4]]))
    sink.close()
    assert ids(admin, names.table) == [1, 2]

    assert main(["status", ckpt, "--probe", "--set", f"dsn={pg_server.dsn}"]) == 0
    out = capsys.readouterr().out
    assert out.count("destination holds: prepared") == 2, out
    assert pg_server.dsn.split("password=")[-1] not in out or "password" not in pg_server.dsn

    assert main(["recover", ckpt, "--set", f"dsn={pg_server.dsn}"]) == 0
    assert ids(admin, names.table) == expected
    with admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
                    (f"seos-{key}-%",))
        assert cur.fetchone()[0] == 0
