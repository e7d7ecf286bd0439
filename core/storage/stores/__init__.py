"""One module per file system behind the ``core.storage.files.Files`` contract.

* ``local``: POSIX paths (a local disk, a shared mount);
* ``webhdfs``: HDFS through the NameNode's REST API;
* ``writeonce``: what every object store shares: conditional creates that know their
  own writes (a writer token read back settles a ``412``), the probe that refuses a
  store ignoring its preconditions, large objects, publishing by a conditional copy;
* ``s3``, ``gcs``, ``azure``: each object store's own calls and errors.

``core.storage.registry.split_uri`` picks the module from a location's scheme
(``core.storage.locations`` parses it as Hadoop does); nothing outside this package but
the registry names a store class, except tests.
"""
