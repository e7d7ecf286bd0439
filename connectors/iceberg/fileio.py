"""pyiceberg's Arrow FileIO as the Iceberg sink hands it a warehouse on Google Cloud
Storage or Azure Blob Storage (``py-io-impl`` of the catalog's properties, set by
``stores.io_properties``): pyiceberg 0.12's own, with two corrections.

- **Azure**: pyiceberg passes Arrow's ``AzureFileSystem`` the path of
  ``abfss://container@account.dfs.core.windows.net/wh/t`` as
  ``container@account.dfs.core.windows.net/wh/t``; Arrow reads the part before the
  first ``/`` as the container's name and the service refuses it. Here it is
  ``container/wh/t``.
- **GCS**: with an emulator endpoint and no credentials file, sparkeos' own client sends
  its requests unsigned (``core.storage.stores.gcs.signs_nothing``); pyiceberg's Arrow
  ``GcsFileSystem`` would look for Google's credentials instead and fail on a machine
  without them. Here it follows the same rule.

Scans, deletes and writes still go through ``new_input`` / ``new_output`` of this class:
pyiceberg's readers take any ``PyArrowFileIO``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from pyiceberg.io import GCS_SERVICE_HOST, GCS_TOKEN
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from sparkeos.core.storage.stores.gcs import signs_nothing

AZURE_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})


class SparkeosFileIO(PyArrowFileIO):
    @staticmethod
    def parse_location(location: str, properties: Properties = EMPTY_DICT
                       ) -> tuple[str, str, str]:
        scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
        if scheme in AZURE_SCHEMES and "@" in netloc and path.startswith(netloc):
            container = netloc.split("@", 1)[0]
            return scheme, netloc, container + path[len(netloc):]
        return scheme, netloc, path

    def _initialize_gcs_fs(self) -> Any:
        endpoint = self.properties.get(GCS_SERVICE_HOST)
        if self.properties.get(GCS_TOKEN) or not signs_nothing(endpoint):
            return super()._initialize_gcs_fs()
        from pyarrow.fs import GcsFileSystem

        url = urllib.parse.urlsplit(str(endpoint))
        return GcsFileSystem(anonymous=True, scheme=url.scheme or "https",
                             endpoint_override=url.netloc)


__all__ = ["SparkeosFileIO"]
