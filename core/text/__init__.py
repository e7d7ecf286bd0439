"""Spark's text and records: values spelled as Spark casts them (``sparktext``, its
time zones in ``sparkzones``), JSON as Spark's writer writes it (``sparkjson``), and the
record layouts of message sinks (``records``). Imports the top of ``core`` only.
"""
