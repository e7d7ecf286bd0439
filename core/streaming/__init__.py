"""Spark's entry points: ``foreachBatch`` (``adapter``, ``queryrun``), the formats
(``streamformat``, ``formatbatch``), Spark and Connect sessions (``spark``), the start
hook (``onstart``), the version gate (``sparkversion``), the query's identity
(``identity``) and how a query ends (``ending``). May import every other room.
"""
