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
  without them. Here it follows the same rule, and gives up on a request after
  ``RETRY_S`` as sparkeos' client does, not after Arrow's 15 minutes.

Scans, deletes and writes still go through ``new_input`` / ``new_output`` of this class:
pyiceberg's readers take any ``PyArrowFileIO``.
"""

from __future__ import annotations

import datetime
import urllib.parse
from typing import Any

from pyiceberg.io import (
    GCS_DEFAULT_LOCATION,
    GCS_SERVICE_HOST,
    GCS_TOKEN,
    GCS_TOKEN_EXPIRES_AT_MS,
)
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties
from pyiceberg.utils.datetime import millis_to_datetime

from sparkeos.core.storage.files import AZURE_SCHEMES
from sparkeos.core.storage.stores.gcs import GcsFiles, signs_nothing

RETRY_S = GcsFiles.retry_s
"""How long Arrow's GCS client retries one request: sparkeos' own client's limit."""


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
        """pyiceberg's ``GcsFileSystem`` (its token, expiry, bucket location and
        endpoint properties), unsigned by ``signs_nothing``'s rule, and retrying a
        request for ``RETRY_S`` (Arrow's own limit is 15 minutes: a process without
        credentials or a store out of reach would wait that long on every call)."""
        from pyarrow.fs import GcsFileSystem

        properties = self.properties
        endpoint = properties.get(GCS_SERVICE_HOST)
        options: dict[str, Any] = {"retry_time_limit": datetime.timedelta(seconds=RETRY_S)}
        if token := properties.get(GCS_TOKEN):
            options["access_token"] = token
            if expiry := properties.get(GCS_TOKEN_EXPIRES_AT_MS):
                options["credential_token_expiration"] = millis_to_datetime(int(expiry))
        elif signs_nothing(endpoint):
            options["anonymous"] = True
        if location := properties.get(GCS_DEFAULT_LOCATION):
            options["default_bucket_location"] = location
        if endpoint:
            url = urllib.parse.urlsplit(str(endpoint))
            options.update(scheme=url.scheme or "https", endpoint_override=url.netloc)
        return GcsFileSystem(**options)


__all__ = ["SparkeosFileIO"]
