"""The Spark settings that change the bytes of Spark's Parquet files, by name.

Kept apart from ``parquet``, which imports pyarrow: the format's class reads them, and
Spark imports the format in processes that need its class only (``core/lazy.py``).
"""

from __future__ import annotations

TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"
LEGACY_FORMAT = "spark.sql.parquet.writeLegacyFormat"
CODEC = "spark.sql.parquet.compression.codec"
FIELD_IDS = "spark.sql.parquet.fieldId.write.enabled"
DATETIME_REBASE = "spark.sql.parquet.datetimeRebaseModeInWrite"
INT96_REBASE = "spark.sql.parquet.int96RebaseModeInWrite"
FOLLOWED = (TIMESTAMP_TYPE, LEGACY_FORMAT, CODEC, FIELD_IDS)
"""The Spark settings that change the bytes of Spark's Parquet files, by their names."""
SETTINGS = (*FOLLOWED, DATETIME_REBASE, INT96_REBASE)
"""Those and the calendar rebasing settings, whose LEGACY mode is refused (sparkeos
writes the proleptic Gregorian calendar, Spark's default CORRECTED)."""
