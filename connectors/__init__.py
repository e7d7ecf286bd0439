"""sparkeos connectors; each lives in its own subpackage and depends only on sparkeos.core."""
