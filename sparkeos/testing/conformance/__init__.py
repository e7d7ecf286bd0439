"""The connector conformance suite: the restart test every sink must pass.

Subclass ``ConnectorConformance`` in a test module and implement:

* ``sink_spec(workdir)``: ``{"factory": "module:callable", "kwargs": {...}}`` building
  your sink in the job's process (it must be importable there);
* ``visible_ids(workdir)``: every ``id`` a reader of your destination sees now,
  duplicates included;
* optionally ``sink_factory(workdir)`` (an in-process sink for the fast protocol
  tests), ``plain_spec(workdir)`` (a plain foreachBatch writer, to show that the
  same crash duplicates without sparkeos) and ``leftovers(workdir)`` (what the
  destination still holds of this test's attempts that never committed: prepared
  transactions, staged files; checked empty after every recovery).

Each crash-point test writes input for several batches, runs the streaming job in a
child process with a crash injected at one protocol point of one batch, checks the
crash happened and what is visible at that moment, restarts the job from its
checkpoint until the input is consumed, and asserts every id exactly once.
Cases a connector cannot support are marked ``pytest.mark.xfail(strict=True)`` in the
subclass, so an unexpected pass is reported too.

The suite is a package: ``support`` (the crash points, the replay rule's message,
``assert_exactly_once``) under the case modules ``races`` (beside a commit), ``replays``
(replays partitioned otherwise), ``cases`` (``ConnectorConformance``) and ``variants``
(``ConnectConformance``, ``FormatConformance``...). Import from the package.
"""

from __future__ import annotations

# The names after "X as X" were imports of the single module this package replaced:
# still importable from here, not part of its interface (not in __all__).
import contextlib as contextlib
import dataclasses as dataclasses
import hashlib as hashlib
import os as os
import subprocess as subprocess
import sys as sys
import threading as threading
import time as time
from collections import Counter as Counter
from collections.abc import Callable as Callable
from typing import Any as Any

import pytest as pytest

from sparkeos.core.config import CoordinatorConfig as CoordinatorConfig
from sparkeos.core.config import Guarantee as Guarantee
from sparkeos.core.errors import ConfigurationError as ConfigurationError
from sparkeos.core.errors import DataLossError as DataLossError
from sparkeos.core.errors import TransactionAbortedError as TransactionAbortedError
from sparkeos.core.faults import AFTER_FIRST_COMMIT_SIGNAL as AFTER_FIRST_COMMIT_SIGNAL
from sparkeos.core.faults import ALL_POINTS as ALL_POINTS
from sparkeos.core.faults import BARRIER_ENV as BARRIER_ENV
from sparkeos.core.faults import COUNTED_POINT as COUNTED_POINT
from sparkeos.core.faults import DRIVER_POINTS as DRIVER_POINTS
from sparkeos.core.faults import FaultPlan as FaultPlan
from sparkeos.core.faults import InjectedCrash as InjectedCrash
from sparkeos.core.faults import InjectedTaskFailure as InjectedTaskFailure
from sparkeos.core.protocol import CommitLocation as CommitLocation
from sparkeos.core.protocol import Transaction as Transaction
from sparkeos.core.protocol import TransactionalSink as TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog as CommitLog
from sparkeos.core.snapshot.commitlog import Store as Store
from sparkeos.core.snapshot.commitlog import sink_log_location as sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator as Coordinator
from sparkeos.core.storage.logstores import LocalStore as LocalStore
from sparkeos.core.storage.logstores import open_store as open_store

from ..inprocess import ID_SCHEMA as ID_SCHEMA
from ..inprocess import ArrowRunner as ArrowRunner
from ..inprocess import ListRunner as ListRunner
from ..inprocess import id_batch as id_batch
from ..inprocess import run_uncommitted as run_uncommitted
from ..job import JobResult as JobResult
from ..job import JobSpec as JobSpec
from ..job import load_factory as load_factory
from ..job import run_job as run_job
from ..job import run_job_process as run_job_process
from ..job import write_input as write_input
from .cases import ConnectorConformance
from .races import RaceCases
from .replays import ReplayCases
from .support import (
    AFTER_ALL_COMMITS,
    BEFORE_DECISION,
    CRASH_BATCH,
    OVERLAP_POINTS,
    REPLAY_RULE,
    SPECULATION_CONF,
    assert_exactly_once,
)
from .variants import (
    AT_LEAST_ONCE_CASES,
    COMMIT_CASES,
    CONNECT_CASES,
    FORMAT_CASES,
    FORMAT_SAMPLED_POINTS,
    MERGED_DRIVER_POINTS,
    REPLAY_CASES,
    SAMPLED_DRIVER_POINTS,
    SPARK_CASES,
    AtLeastOnceConformance,
    ClusterConformance,
    CommitCasesOnly,
    ConnectConformance,
    FormatConformance,
    InProcessConformance,
    SampledConformance,
    SampledDriverKills,
    SampledFormatConformance,
    SampledSparkAttempts,
    TaskCommitClusterConformance,
    plain_replay_control,
    speculation_won_by,
)

__all__ = ["AFTER_ALL_COMMITS", "AT_LEAST_ONCE_CASES", "BEFORE_DECISION", "COMMIT_CASES",
           "CONNECT_CASES", "CRASH_BATCH", "FORMAT_CASES", "FORMAT_SAMPLED_POINTS",
           "MERGED_DRIVER_POINTS",
           "OVERLAP_POINTS", "REPLAY_CASES",
           "REPLAY_RULE", "SAMPLED_DRIVER_POINTS", "SPARK_CASES", "SPECULATION_CONF",
           "AtLeastOnceConformance", "ClusterConformance", "CommitCasesOnly", "ConnectConformance",
           "ConnectorConformance", "FormatConformance", "InProcessConformance", "RaceCases",
           "ReplayCases", "SampledConformance", "SampledDriverKills", "SampledFormatConformance",
           "SampledSparkAttempts", "TaskCommitClusterConformance", "assert_exactly_once",
           "plain_replay_control", "speculation_won_by"]
