"""The bench floor: measure every method side by side, honestly.

`run` (rows interleaved per prompt), `summary` (speedups and the cost model's predictions),
`report` (table, JSON, CSV, Markdown, plot), `suites` (the shipped prompts), `environment`
(the report's header: versions, device, BLAS, weights, bandwidth), `overhead`
(specmlx's own host time and syncs per step) and `syncs` (counting them). It sits above the
API and beside the server; only the CLI imports it.
"""
