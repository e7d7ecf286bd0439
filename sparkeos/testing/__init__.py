"""Test tools for connector authors: the streaming job runner and the conformance suite.

``sparkeos.testing.conformance.ConnectorConformance`` is the restart test every
connector runs: subclass it, say how to build your sink and how to read back what
is visible, and pytest runs the crash-point matrix against real Spark.
"""
