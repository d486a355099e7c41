"""The work behind each asset, as plain functions of a store: one module per asset.

Assets call these with their partition keys; the property tests call them directly, so the
logic is exercised on real Spark and Delta without the Dagster machinery in the loop.
"""
