"""Storage: the ``Files`` contract (``files``), the file systems behind it (``stores``,
picked by ``registry``), the commit log's stores (``logstores``), locations parsed as
Hadoop parses them (``locations``), staging (``staging``, ``fsutil``). Imports the top
of ``core`` and ``snapshot``, never ``streaming``.
"""
