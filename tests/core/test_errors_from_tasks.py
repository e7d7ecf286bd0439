"""How an error raised in a Spark task reads on the driver, where it arrives as the text
of Spark's own exception (a Python traceback inside a JVM trace)."""

from __future__ import annotations

from sparkeos.core.errors import ConfigurationError, describe_cause
from sparkeos.core.snapshot.batch import phase1_error

TASK_TRACE = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/work/core/objectstore.py", line 120, in exists
    self._call("head_object", path, Key=_key(path))
FileNotFoundError: s3a://bucket/staging/records.arrow

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/connectors/file/publish.py", line 37, in publish
    except FileNotFoundError:
sparkeos.core.errors.ConfigurationError: no credentials for s3a://bucket at Amazon S3
  What to do: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in every executor's environment
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_a_source_line_of_the_trace_is_not_taken_for_the_exception() -> None:
    assert describe_cause(Exception("    except FileNotFoundError:\nFileNotFoundError: x")) == (
        "FileNotFoundError: x")


def test_a_configuration_error_a_task_raised_while_handling_another_is_found() -> None:
    error = phase1_error(Exception(TASK_TRACE), "orders", 7)
    assert isinstance(error, ConfigurationError)
    assert "no credentials for s3a://bucket at Amazon S3" in str(error)
    assert "except FileNotFoundError" not in str(error)
