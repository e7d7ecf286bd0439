"""Service fixtures shared by every integration test (each starts its service lazily,
once per session, only when a test asks for it)."""

pytest_plugins = ["integration.fixtures.services", "integration.fixtures.postgres",
                  "integration.fixtures.kafka", "integration.fixtures.stomp",
                  "integration.fixtures.hdfs", "integration.fixtures.s3",
                  "integration.fixtures.clouds"]
