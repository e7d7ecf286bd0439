"""The ``sparkeos`` command: demo, status, recover."""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import time
from typing import Any

from sparkeos import cli_realtime
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError, QueryRunningError, SparkEOSError
from sparkeos.core.protocol import Transaction, TxnState
from sparkeos.core.snapshot.commitlog import BatchState, CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import load_recorded_sink
from sparkeos.core.snapshot.lease import lease_held
from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool
from sparkeos.core.storage.logstores import open_store


def _sink_logs(checkpoint: str, only: str | None, spark: Any) -> list[tuple[str, CommitLog]]:
    root = f"{checkpoint.rstrip('/')}/sparkeos"
    base = open_store(root, spark)
    names = sorted(n for n in base.list_names() if only is None or n == only)
    if not names:
        raise ConfigurationError(
            f"no sparkeos sinks under {root}" + (f" named {only!r}" if only else ""),
            fix="pass the query's checkpointLocation (the directory holding offsets/ and "
            "commits/), and the sink name given to exactly_once()",
        )
    return [(n, CommitLog(open_store(f"{root}/{n}", spark))) for n in names]


def _outstanding(pool: TransactionPool, state: BatchState) -> tuple[list[str],
                                                                   list[Transaction]]:
    """What recovery will act on: (how to show it, the transactions to probe)."""
    if state.needs_commit:
        decided = state.decided or {}
        txns = [pool.transaction(state.batch_id, int(p["partition"]), int(state.decided_run or 0),
                                 int(p["tag"])) for p in decided.get("participants", [])]
        return [t.txn_id for t in txns], txns
    shown: list[str] = []
    txns = []
    for run in state.open_runs:
        begun = state.begun[run]
        partitions, tags = int(begun.get("partitions", 0)), int(begun.get("tags", 1))
        slot = pool.slot_of(state.batch_id)
        shown += [f"{pool.participant_id(p, slot)}-b{state.batch_id}r{run}a<0-{tags - 1}>"
                  for p in range(partitions)]
        txns += list(AttemptRange(pool.query_key, pool.sink, state.batch_id, run, partitions,
                                  tags).transactions())
    return shown, txns


def _probe(meta: dict[str, Any], overrides: dict[str, str],
           txns: list[Transaction]) -> dict[str, str]:
    """What the external system holds for the outstanding IDs (absent ones left out)."""
    try:
        sink = load_recorded_sink(meta, overrides)
    except SparkEOSError as exc:
        return {"error": exc.problem}
    try:
        found = {t.txn_id: sink.probe(t) for t in txns}
        return {txn_id: held.value for txn_id, held in found.items()
                if held is not TxnState.ABSENT}
    except Exception as exc:  # status must still print the rest
        return {"error": f"probe failed: {exc}"}
    finally:
        sink.close()


def _status(args: argparse.Namespace, spark: Any) -> int:
    report: list[dict[str, Any]] = []
    realtime: list[dict[str, Any]] = []
    overrides = dict(item.split("=", 1) for item in args.set)
    for name, log in _sink_logs(args.checkpoint, args.sink, spark):
        unreadable: list[str] = []
        try:
            meta = log.read_meta() or {}
        except SparkEOSError as exc:
            meta, unreadable = {}, [exc.problem]
        if cli_realtime.is_realtime(meta):
            realtime.append(cli_realtime.status(args.checkpoint, name, log.store.list_names(),
                                                meta, overrides, args.probe))
            continue
        states, problems = log.scan()
        unreadable += problems
        pool = TransactionPool(str(meta.get("query_key", "?")), name) if meta else None
        batches = []
        for state in sorted(states.values(), key=lambda s: s.batch_id)[-args.last:]:
            entry: dict[str, Any] = {"batch": state.batch_id, "status": state.status,
                                     "attempts": len(state.begun)}
            if state.decided is not None:
                entry["rows"] = state.decided.get("rows")
                entry["participants"] = len(state.decided.get("participants", []))
            if state.unresolved and state.begun and pool is not None:
                shown, txns = _outstanding(pool, state)
                entry["outstanding_txn_ids"] = shown
                entry["will"] = "commit" if state.needs_commit else "roll back"
                if args.probe:
                    entry["probe"] = _probe(meta, overrides, txns)
            batches.append(entry)
        report.append({"sink": name, "type": meta.get("sink_type"),
                       "destination": meta.get("identity"), "query_key": meta.get("query_key"),
                       "log": log.location, "lease": _quietly(log.read_lease),
                       "batches": batches, "last_error": _quietly(log.last_error),
                       "unreadable": unreadable})
    if args.json:
        print(json.dumps(report + realtime, indent=2, default=str))
    else:
        for entry in realtime:
            cli_realtime.print_status(entry)
        _print_status(report)
    failed = any(s["unreadable"] for s in report) or any("probe_error" in r for r in realtime)
    return 2 if failed else 0


def _print_status(report: list[dict[str, Any]]) -> None:
    for sink in report:
        print(f"sink {sink['sink']}  ({sink['type']})  query {sink['query_key']}")
        print(f"  destination: {json.dumps(sink['destination'])}")
        print(f"  commit log:  {sink['log']}")
        if sink["lease"]:
            lease = sink["lease"]
            lease_text = (f"unreadable ({lease['unreadable']})" if "unreadable" in lease
                          else _describe_lease(lease))
            print(f"  lease:       {lease_text}")
        print(f"  {'batch':>8}  {'status':<9} {'attempts':>8} {'rows':>8} {'participants':>12}")
        for b in sink["batches"]:
            print(f"  {b['batch']:>8}  {b['status']:<9} {b['attempts']:>8} "
                  f"{b.get('rows', '-')!s:>8} {b.get('participants', '-')!s:>12}")
            probed = dict(b.get("probe", {}))
            error = probed.pop("error", None)
            for txn in b.get("outstanding_txn_ids", []):
                held = f", destination holds: {probed.pop(txn)}" if txn in probed else ""
                print(f"            outstanding {txn} (recovery will {b['will']}{held})")
            for txn, held in probed.items():
                print(f"            destination holds: {held} {txn}")
            if error:
                print(f"            probe: {error}")
        unresolved = [b for b in sink["batches"] if "outstanding_txn_ids" in b]
        print(f"  unresolved batches: {len(unresolved)}"
              + ("  -> run `sparkeos recover`" if unresolved else ""))
        for problem in sink["unreadable"]:
            print(f"  UNREADABLE: {problem}")
        if sink["unreadable"]:
            print("  the batches above are what the other records say; restore the "
                  "unreadable records from a backup of the checkpoint before `recover`")
        if sink["last_error"]:
            err = sink["last_error"]
            print(f"  last error (batch {err.get('batch_id')}, {err.get('type')}): "
                  f"{str(err.get('message', '')).splitlines()[0]}")


def _quietly(read: Any) -> Any:
    """A side file (lease, last error) that cannot be read does not hide the rest."""
    try:
        return read()
    except SparkEOSError as exc:
        return {"unreadable": exc.problem}


def _describe_lease(lease: dict[str, Any]) -> str:
    if lease.get("released"):
        if lease.get("batch") is not None:
            return (f"released by query {lease.get('query_id')} after batch "
                    f"{lease.get('batch')} (a query writing through a sparkeos format "
                    "holds it only while a batch runs; it stopped, or waits for its next)")
        return f"released by query {lease.get('query_id')} (it stopped)"
    age = time.time() - float(lease.get("renewed", 0))
    return (f"query {lease.get('query_id')} on {lease.get('host')} (pid {lease.get('pid')}) "
            f"renewed it {age:.0f} s ago, for {float(lease.get('ttl_s', 0)):.0f} s")


def pid_alive(pid: int) -> bool:
    """Is a process with this PID running on this host?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_lease(name: str, log: CommitLog) -> None:
    """Refuse to act while the query that writes this log is running."""
    lease = log.read_lease()
    if not lease_held(lease):
        return
    assert lease is not None
    if lease.get("host") == socket.gethostname() and not pid_alive(int(lease.get("pid", 0))):
        return  # the driver that renewed it is gone
    raise QueryRunningError(
        f"the query holds the lease of this commit log: {_describe_lease(lease)}; "
        "recovering beside a running query would abort the batch it is writing",
        sink=name,
        fix="stop the query first (a restart recovers by itself), or wait until the lease "
        "expires; if you are sure the query is not running (its driver died on another "
        "host), pass --force. Even then nothing is lost: a batch recover aborts is written "
        "again by the query",
    )


def _recover(args: argparse.Namespace, spark: Any) -> int:
    overrides = dict(item.split("=", 1) for item in args.set)
    for name, log in _sink_logs(args.checkpoint, args.sink, spark):
        meta = log.read_meta()
        if not meta:
            print(f"sink {name}: no metadata recorded; nothing to recover")
            continue
        if cli_realtime.is_realtime(meta):
            for line in cli_realtime.recover(args.checkpoint, name, log.store.list_names(),
                                             meta, overrides, args.force, args.dry_run):
                print(line)
            continue
        unresolved = [s for s in log.batches().values() if s.unresolved]
        if args.dry_run:
            for s in unresolved:
                print(f"sink {name}: batch {s.batch_id} would be "
                      f"{'committed' if s.needs_commit else 'rolled back'}")
            if not unresolved:
                print(f"sink {name}: nothing to recover")
            continue
        if not args.force:
            check_lease(name, log)
        try:
            sink = load_recorded_sink(meta, overrides)
        except SparkEOSError:
            if unresolved:
                raise
            # Nothing to commit or roll back; the leftover sweep needs the sink.
            print(f"sink {name}: nothing to recover")
            continue
        coordinator = Coordinator(sink, CoordinatorConfig(name=name), log,
                                  str(meta["query_key"]))
        try:
            # Also sweeps what late task attempts left behind in finished batches.
            # The lease is read again once the log is: a run begun by a live query was
            # begun after its lease was written (core/snapshot/lease.py), so it is refused here.
            actions = coordinator.recover(
                full=True, guard=None if args.force else functools.partial(check_lease, name, log))
        finally:
            sink.close()
        for action in actions:
            print(f"sink {name}: batch {action['batch_id']} {action['action']}")
        if not actions:
            print(f"sink {name}: nothing to recover")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkeos",
                                     description="Exactly-once connectors for Spark.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="exactly-once demo on local Spark and files", add_help=False)
    for name, helptext in (("status", "show each sink's batches and open transactions"),
                           ("recover", "finish or roll back what a crashed query left")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("checkpoint", help="the query's checkpointLocation")
        p.add_argument("--sink", help="only this sink name")
        p.add_argument("--spark", action="store_true",
                       help="start a local SparkSession to reach a Hadoop-compatible URI")
    for name in ("status", "recover"):
        sub.choices[name].add_argument(
            "--set", action="append", default=[], metavar="KEY=VALUE",
            help="sink setting not recorded in the log (e.g. a secret DSN)")
    status = sub.choices["status"]
    status.add_argument("--probe", action="store_true",
                        help="ask the destination what it holds for outstanding IDs")
    status.add_argument("--json", action="store_true")
    status.add_argument("--last", type=int, default=20, help="show the last N batches")
    recover = sub.choices["recover"]
    recover.add_argument("--dry-run", action="store_true")
    recover.add_argument("--force", action="store_true",
                         help="act even though the query's lease is fresh (only when you "
                         "know its driver is gone)")

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from sparkeos.demo import main as demo

        return demo(argv[1:])
    args = parser.parse_args(argv)
    spark = None
    if args.spark:
        from sparkeos.core.streaming.spark import local_session

        spark = local_session("sparkeos-cli")
    try:
        checkpoint = args.checkpoint
        if "://" not in checkpoint:
            checkpoint = os.path.abspath(checkpoint)
        args.checkpoint = checkpoint
        return _status(args, spark) if args.command == "status" else _recover(args, spark)
    except SparkEOSError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "problem": exc.problem,
                              "fix": exc.fix}, indent=2))
        else:
            print(f"sparkeos {args.command}: {exc}", file=sys.stderr)
        return 2
    finally:
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
