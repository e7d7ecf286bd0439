"""The protocol: Jet's two-phase snapshot commit, knowing nothing of Spark or of any
store.

The coordinator decides a batch (``coordinator``, ``batch``, ``checks``), the durable
commit log records it (``commitlog``, through its ``Store`` contract), tasks prepare
and commit (``tasks``) with IDs of the two-ID pool (``txpool``), recovery commits or
rolls back by known IDs (``recovery``), and a replay is told from other rows by its
fingerprint (``replay``, ``fingerprint``). Imports the top of ``core`` only.
"""
