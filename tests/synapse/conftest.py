"""The harness's own tests take its fixtures as tests/channels/matrix does: by name, assigned
(an import would read to ruff as an unused name that each test's parameter shadows)."""

from tests.synapse import fixtures

synapse_session = fixtures.synapse_session
synapse = fixtures.synapse
matrix_localpart = fixtures.matrix_localpart
