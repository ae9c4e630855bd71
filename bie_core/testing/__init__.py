"""The bie conformance kit (``pytest --bie-backend=NAME``) and its oracles."""
